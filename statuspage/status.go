// Package statuspage is the cluster's status page, one self-contained HTML page an agent
// serves (gangrun agent --http-addr): the nodes and their GPUs as a grid coloured by
// state and utilisation, the queue, and each job's attempts on a time line with the
// cause of each restart. It has no script and no external asset (a cluster without
// internet shows it whole) and refreshes itself (meta refresh).
package statuspage

import (
	"context"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
)

// Refresh is how often the page reloads itself.
const Refresh = 5 * time.Second

// maxEnded bounds the ended jobs the page lists (the newest).
const maxEnded = 20

// readTimeout bounds the Consul reads of one page.
const readTimeout = 5 * time.Second

// Config configures the page.
type Config struct {
	// Store is the cluster's coordination store.
	Store store.Store
	// Node is the serving agent's node; Utilization, when set, reads its GPUs'
	// utilisation in % by NVML index (ok false: none, as on a recorded inventory).
	// Other nodes' GPUs are coloured by state alone: their utilisation is not in Consul.
	Node        string
	Utilization func(ctx context.Context) (map[int]float64, bool)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Handler serves the page on "/".
func Handler(cfg Config) http.Handler {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	tmpl := template.Must(template.New("page").Funcs(template.FuncMap{"pct": pct}).Parse(pageHTML))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
		defer cancel()
		p, err := build(ctx, cfg)
		if err != nil {
			http.Error(w, "gangrun status: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := tmpl.Execute(w, p); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
}

// page is what the template shows.
type page struct {
	Now       string
	Refresh   int
	Leader    string
	Nodes     []nodeView
	Queue     []job.Entry
	Jobs      []jobView
	Served    string
	UtilKnown bool
}

type nodeView struct {
	// Auth is how the node's agent knows who submits jobs (agent --auth).
	Name, State, Reason, Model, Auth string
	GPUs                             []gpuView
	Free, Total                      int
}

type gpuView struct {
	Label, Class, Title string
	Util                float64 // -1: unknown
}

type jobView struct {
	ID, Name, User, State string
	Attempts              []attemptView
}

type attemptView struct {
	Number         int
	Left, Width    float64 // % of the job's time line
	Nodes          string
	Started, Ended string
	Cause, Class   string
	ResumeFrom     string
}

// pct formats a share for a CSS width.
func pct(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) + "%" }

// build reads the cluster and the jobs.
func build(ctx context.Context, cfg Config) (*page, error) {
	c, err := allocator.Snapshot(ctx, cfg.Store)
	if err != nil {
		return nil, err
	}
	st, err := allocator.ReadStatus(ctx, cfg.Store)
	if err != nil {
		return nil, err
	}
	jobs, err := job.List(ctx, cfg.Store)
	if err != nil {
		return nil, err
	}
	now := cfg.Now()
	q := job.QueueOf(jobs, st, c, false, now)
	p := &page{Now: now.UTC().Format(time.RFC3339), Refresh: int(Refresh / time.Second), Leader: st.Leader, Queue: q, Served: cfg.Node}
	var util map[int]float64
	if cfg.Utilization != nil {
		util, p.UtilKnown = cfg.Utilization(ctx)
	}
	for _, ns := range c.NodeList() {
		n := c.Nodes[ns.Name]
		v := nodeView{Name: ns.Name, State: string(ns.State), Reason: ns.Reason, Model: ns.Model, Auth: ns.Auth, Free: ns.GPUsFree, Total: ns.GPUsTotal}
		have := map[int]bool{}
		for _, d := range n.Record.Devices {
			have[d.GPU] = true
			g := gpuView{Label: d.ID, Util: -1, Class: "free", Title: fmt.Sprintf("GPU %s %s: free", d.ID, d.Model)}
			grant, held := n.Held[d.ID]
			switch {
			case held:
				g.Class, g.Title = "held", fmt.Sprintf("GPU %s %s: held by %s", d.ID, d.Model, grant)
			case ns.State != allocator.NodeUp:
				g.Class, g.Title = "off", fmt.Sprintf("GPU %s %s: not grantable (node %s)", d.ID, d.Model, ns.State)
			}
			if d.Health == "degraded" {
				g.Class += " degraded"
				g.Title += " (degraded)"
			}
			if u, ok := util[d.GPU]; ok && ns.Name == cfg.Node {
				g.Util = u
				g.Title += fmt.Sprintf(", %.0f%% busy", u)
			}
			v.GPUs = append(v.GPUs, g)
		}
		for i := 0; i < n.Record.GPUs; i++ {
			if !have[i] {
				v.GPUs = append(v.GPUs, gpuView{Label: strconv.Itoa(i), Util: -1, Class: "failed", Title: fmt.Sprintf("GPU %d: failed (not allocatable)", i)})
			}
		}
		p.Nodes = append(p.Nodes, v)
	}
	// Jobs with attempts: the active ones, then the newest ended.
	var ended []job.Job
	for _, j := range jobs {
		if j.State.Status.Final() {
			ended = append(ended, j)
			continue
		}
		if len(j.State.Attempts) > 0 {
			p.Jobs = append(p.Jobs, jobOf(j, now))
		}
	}
	slices.Reverse(ended)
	for _, j := range ended[:min(len(ended), maxEnded)] {
		if len(j.State.Attempts) > 0 {
			p.Jobs = append(p.Jobs, jobOf(j, now))
		}
	}
	return p, nil
}

// jobOf lays job j's attempts on a time line from its first attempt to its end (or now).
func jobOf(j job.Job, now time.Time) jobView {
	v := jobView{ID: j.Spec.ID, Name: j.Spec.Name, User: j.Spec.User, State: string(j.State.Status)}
	start := j.State.Attempts[0].Started
	end := now
	if !j.State.Ended.IsZero() {
		end = j.State.Ended
	}
	for _, a := range j.State.Attempts {
		if !a.Ended.IsZero() && a.Ended.After(end) {
			end = a.Ended
		}
	}
	span := end.Sub(start).Seconds()
	if span <= 0 {
		span = 1
	}
	for _, a := range j.State.Attempts {
		e := a.Ended
		if e.IsZero() {
			e = end
		}
		av := attemptView{Number: a.Number, Nodes: strings.Join(a.Nodes, ","), Started: stamp(a.Started), Ended: stamp(a.Ended),
			Cause: a.Cause, ResumeFrom: a.ResumeFrom,
			Left: 100 * a.Started.Sub(start).Seconds() / span, Width: max(100*e.Sub(a.Started).Seconds()/span, 0.5)}
		switch {
		case a.Ended.IsZero():
			av.Class, av.Cause = "running", "running"
		case a.Cause == "succeeded":
			av.Class = "ok"
		default:
			av.Class = "bad"
		}
		v.Attempts = append(v.Attempts, av)
	}
	return v
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("15:04:05")
}
