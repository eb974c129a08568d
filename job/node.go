package job

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/internal/store"
)

// LauncherConfig configures a node's launcher of job steps.
type LauncherConfig struct {
	// Store is the cluster's Consul; Node this node's name.
	Store store.Store
	Node  string
	// Spawn starts job's step on this node as a process of its own, which must outlive
	// the caller (the agent): `gangrun __step`, in a session of its own (setsid).
	Spawn func(job string) error
	// Log receives the launcher's messages; nil discards them.
	Log *zap.Logger
}

// RunLauncher starts, on its node, the step of every job that runs there, as the
// node's agent (slurmd starting slurmstepd), until ctx ends. It starts each job's step
// once per placement: a step that dies is not started again by it (the controller
// handles the node as lost); a restarted agent finds the steps that outlived it by
// their keys and leaves them be.
func RunLauncher(ctx context.Context, cfg LauncherConfig) error {
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	w := store.NewWatcher(cfg.Store, jobsPrefix)
	launched := map[string]int{} // job → the placement its step was started for
	for {
		entries, err := w.Next(ctx)
		if err != nil {
			return nil
		}
		type view struct {
			state   *State
			running bool // this node's step key is held
		}
		jobs := map[string]*view{}
		get := func(id string) *view {
			if jobs[id] == nil {
				jobs[id] = &view{}
			}
			return jobs[id]
		}
		for _, e := range entries {
			rest := strings.TrimPrefix(e.Key, jobsPrefix)
			id, sub, ok := strings.Cut(rest, "/")
			if !ok {
				continue
			}
			switch {
			case sub == "state":
				var st State
				if json.Unmarshal(e.Value, &st) == nil {
					get(id).state = &st
				}
			case sub == "steps/"+cfg.Node && e.Session != "":
				get(id).running = true
			}
		}
		for id, v := range jobs {
			st := v.state
			if st == nil || st.Status != Running || !slices.Contains(st.Nodes, cfg.Node) {
				continue
			}
			if launched[id] == st.Placement {
				continue
			}
			launched[id] = st.Placement
			if v.running {
				continue // a step outlived this agent's restart, or started already
			}
			log.Info("starting the job's step", zap.String("job", id), zap.Int("placement", st.Placement))
			if err := cfg.Spawn(id); err != nil {
				log.Error("start the job's step", zap.String("job", id), zap.Error(err))
			}
		}
		for id := range launched {
			if v, ok := jobs[id]; !ok || v.state == nil || v.state.Status.Final() {
				delete(launched, id)
			}
		}
	}
}
