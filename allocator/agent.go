package allocator

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/failure"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/internal/userfile"
	"github.com/gangrun/gangrun/topology"
)

// The backoff between registration attempts while Consul is unreachable or a previous
// agent's session for the same node still lives: registerRetryMin doubling up to
// registerRetryMax; and how long a stopping agent waits to destroy its session.
const (
	registerRetryMin = 100 * time.Millisecond
	registerRetryMax = 5 * time.Second
	// leaderTaskRetry is how long the elected agent waits before it starts again a
	// leader's task that stopped while the agent still leads.
	leaderTaskRetry = time.Second
	// electRetry is how soon an agent tries again for the scheduler's key when it found
	// the key free but in its last holder's lock-delay.
	electRetry     = 250 * time.Millisecond
	deregisterWait = 5 * time.Second
)

// AgentConfig configures a node's agent.
type AgentConfig struct {
	// Node is the node's name, unique in the cluster.
	Node string
	// Addr is the address other nodes reach it at.
	Addr string
	// Labels are the node's labels (partition, switch, spine, anything else).
	Labels map[string]string
	// Auth is how the agent knows who submits jobs (NodeRecord.Auth), shown by `gangrun
	// nodes` and the status page.
	Auth string
	// Release is the agent's gangrun release (NodeRecord.Release), shown by `gangrun
	// nodes` while a rolling upgrade has two releases in the cluster.
	Release string
	// Inventory is the node's topology.
	Inventory *topology.Inventory
	// NoScheduler keeps this agent out of the scheduler election.
	NoScheduler bool
	// Log receives the agent's messages; nil discards them.
	Log *zap.Logger
	// Events receives what the scheduler reports while this agent's is the elected one
	// (SchedulerConfig.Events); nil discards it.
	Events event.Sink
	// Health, when set, reports the node's GPU health changes while the agent runs; the
	// agent republishes its inventory with each (a failed GPU is no longer allocatable).
	Health HealthSource
	// Leader lists what else runs while this agent is the elected scheduler (the job
	// controller), each until ctx ends; one that returns while the agent still leads is
	// started again after leaderTaskRetry. session is the leader's, for a LeaderFence on
	// its writes (LostLeadership tells its failing from other refusals).
	Leader []func(ctx context.Context, s store.Store, session string) error
}

// LeaderFence is the transaction operation that makes a write of the elected
// scheduler's (or of what runs beside it, AgentConfig.Leader) fail once session no
// longer leads: a deposed leader changes nothing.
func LeaderFence(session string) store.Op {
	return store.Op{Verb: store.CheckSession, Key: schedulerKey, Session: session}
}

// LostLeadership reports whether err is a transaction refused because its LeaderFence
// failed: the session no longer holds the scheduler's key, so another agent leads (or
// none yet). Any other refusal, a GPU's or a step's key not held by the session a
// transaction expects among them, is not: the leader carries on.
func LostLeadership(err error) bool {
	return store.NotHolding(err, schedulerKey)
}

// Periodic returns a task for AgentConfig.Leader that runs once on taking the lead and
// then every interval, its writes fenced by the leader's session (fence holds the
// LeaderFence, to put first in each transaction), until ctx ends or leadership is lost
// (its error: the agent starts the task again should it lead again). An error of once
// is logged as a warning with failed ("audit: purge the days past the retention") and
// tried again at the next interval; once logs what it did itself.
func Periodic(log *zap.Logger, interval time.Duration, failed string, once func(ctx context.Context, s store.Store, fence []store.Op) error) func(ctx context.Context, s store.Store, session string) error {
	if log == nil {
		log = zap.NewNop()
	}
	return func(ctx context.Context, s store.Store, session string) error {
		fence := []store.Op{LeaderFence(session)}
		for {
			err := once(ctx, s, fence)
			switch {
			case ctx.Err() != nil:
				return nil
			case LostLeadership(err):
				return err
			case err != nil:
				log.Warn(failed, zap.Error(err))
			}
			if !store.Sleep(ctx, interval) {
				return nil
			}
		}
	}
}

// HealthSource reports changes of a node's GPU health, as they happen, until ctx ends
// or it can watch no more (its error says why): NVMLHealth on a machine with NVIDIA's
// driver, a recorded stream of changes in tests.
type HealthSource func(ctx context.Context, inv *topology.Inventory, report func(topology.GPUHealthChange)) error

// RecordedHealth returns a HealthSource that replays the GPU health changes appended to
// file, one topology.GPUHealthChange as JSON per line, as they are written (it polls
// the file every 200 ms): a drill or a test stands in for NVML's events with it. A line
// that is not such a change of one of the node's GPUs (not JSON, a GPU index the
// inventory lacks, a state other than healthy, degraded or failed) is skipped and told
// to bad (nil: nobody), naming the line.
func RecordedHealth(file string, bad func(line string, err error)) HealthSource {
	if bad == nil {
		bad = func(string, error) {}
	}
	return func(ctx context.Context, inv *topology.Inventory, report func(topology.GPUHealthChange)) error {
		var off int64
		var partial []byte
		for {
			f, err := userfile.OpenFile(file) // a FIFO or a device is refused, never waited on
			if err == nil {
				if _, err = f.Seek(off, io.SeekStart); err == nil {
					var data []byte
					data, err = io.ReadAll(io.LimitReader(f, 1<<20))
					off += int64(len(data))
					partial = append(partial, data...)
					for {
						i := bytes.IndexByte(partial, '\n')
						if i < 0 {
							break
						}
						var ch topology.GPUHealthChange
						line := string(partial[:i])
						switch err := json.Unmarshal(partial[:i], &ch); {
						case err != nil:
							bad(line, err)
						case ch.Index < 0 || ch.Index >= len(inv.GPUs):
							bad(line, fmt.Errorf("GPU index %d: the node has GPUs 0..%d", ch.Index, len(inv.GPUs)-1))
						case ch.Health.State != topology.Healthy && ch.Health.State != topology.Degraded && ch.Health.State != topology.Failed:
							bad(line, fmt.Errorf("health state %q: want healthy, degraded or failed", ch.Health.State))
						default:
							report(ch)
						}
						partial = partial[i+1:]
					}
				}
				f.Close()
			}
			if !store.Sleep(ctx, recordedHealthPoll) {
				return nil
			}
		}
	}
}

// recordedHealthPoll is how often RecordedHealth looks for new lines.
const recordedHealthPoll = 200 * time.Millisecond

// NVMLHealth is the HealthSource of a machine with NVIDIA's driver: NVML's events (Xid
// errors, ECC) and health probes, through topology.WatchHealth.
func NVMLHealth(ctx context.Context, inv *topology.Inventory, report func(topology.GPUHealthChange)) error {
	return topology.WatchHealth(ctx, topology.ProbeOptions{}, inv, report)
}

// Agent keeps one node registered: its record and inventory, and a session that holds
// its alive key (the node is up while the agent lives). It re-registers whenever its
// session is lost (Consul restarted without its data, a long partition), and it takes
// part in the election of the scheduler.
type Agent struct {
	s   store.Store
	cfg AgentConfig
	log *zap.Logger

	mu      sync.Mutex
	inv     *topology.Inventory
	changed chan struct{} // an inventory update to publish
	session string
}

// NewAgent checks cfg and returns an agent for it.
func NewAgent(s store.Store, cfg AgentConfig) (*Agent, error) {
	if err := store.CheckNodeName("node name", cfg.Node); err != nil {
		return nil, err
	}
	if cfg.Inventory == nil {
		return nil, errors.New("agent: no inventory")
	}
	if err := CheckLabels(cfg.Labels); err != nil {
		return nil, err
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	return &Agent{s: s, cfg: cfg, log: log.With(zap.String("node", cfg.Node)), inv: cfg.Inventory, changed: make(chan struct{}, 1)}, nil
}

// Session returns the agent's current session ("" while unregistered).
func (a *Agent) Session() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.session
}

// Inventory returns the node's inventory as the agent knows it now (GPU health as
// changed since it started). The caller must not modify it.
func (a *Agent) Inventory() *topology.Inventory {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inv
}

// UpdateInventory publishes a changed inventory (a GPU's health changed, say).
func (a *Agent) UpdateInventory(inv *topology.Inventory) {
	a.mu.Lock()
	a.inv = inv
	a.mu.Unlock()
	select {
	case a.changed <- struct{}{}:
	default:
	}
}

// record builds the node's record and inventory JSON.
func (a *Agent) record() (NodeRecord, []byte, error) {
	a.mu.Lock()
	inv := a.inv
	a.mu.Unlock()
	data, err := inv.JSON()
	if err != nil {
		return NodeRecord{}, nil, err
	}
	sum := sha256.Sum256(data)
	r := NodeRecord{Name: a.cfg.Node, Addr: a.cfg.Addr, Labels: a.cfg.Labels, Auth: a.cfg.Auth, Release: a.cfg.Release, GPUs: len(inv.GPUs),
		CPUs: inv.CPU.LogicalCPUs, MemoryMiB: inv.MemoryMiB, InventoryHash: hex.EncodeToString(sum[:8]), Registered: time.Now().UTC(), Devices: inv.Allocatable()}
	return r, data, nil
}

// register creates a session and publishes the node under it. It returns the session
// and when the request that created it was sent (where its lease starts).
func (a *Agent) register(ctx context.Context) (string, time.Time, error) {
	rec, inv, err := a.record()
	if err != nil {
		return "", time.Time{}, err
	}
	since := time.Now()
	sess, err := a.s.CreateSession(ctx, store.SessionOptions{
		Name: "gangrun agent " + a.cfg.Node, TTL: SessionTTL, Behavior: store.DeleteKeys, NodeHealth: true,
	})
	if err != nil {
		return "", time.Time{}, err
	}
	_, err = a.s.Txn(ctx, []store.Op{
		{Verb: store.Set, Key: inventoryPrefix + a.cfg.Node, Value: inv},
		{Verb: store.Set, Key: nodesPrefix + a.cfg.Node, Value: mustRecord(schema.Node, rec)},
		{Verb: store.Lock, Key: alivePrefix + a.cfg.Node, Value: []byte(a.cfg.Addr), Session: sess},
	})
	if err != nil {
		_ = a.s.DestroySession(context.WithoutCancel(ctx), sess)
		if errors.Is(err, store.ErrTxnRejected) {
			return "", time.Time{}, fmt.Errorf("node %s is registered by another live agent (or its session has not expired yet): %w", a.cfg.Node, err)
		}
		return "", time.Time{}, err
	}
	a.mu.Lock()
	a.session = sess
	a.mu.Unlock()
	a.log.Info("registered", zap.Int("devices", len(rec.Devices)), zap.Any("labels", rec.Labels))
	return sess, since, nil
}

// Run keeps the node registered until ctx ends, then destroys its session (the node
// shows down at once) and returns nil.
func (a *Agent) Run(ctx context.Context) error {
	if a.cfg.Health != nil {
		go a.watchHealth(ctx)
	}
	backoff := registerRetryMin
	for {
		sess, since, err := a.register(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			a.log.Warn("registration failed; retrying", zap.Error(err), zap.Duration("in", backoff))
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, registerRetryMax)
			continue
		}
		backoff = registerRetryMin
		err = a.serve(ctx, sess, since)
		if ctx.Err() != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deregisterWait)
			_ = a.s.DestroySession(dctx, sess)
			cancel()
			a.log.Info("deregistered")
			return nil
		}
		a.log.Warn("session lost; registering again", zap.Error(err))
	}
}

// serve keeps the session's lease (renewed since since) and runs the scheduler election
// and the inventory publisher until ctx ends or the lease is over.
func (a *Agent) serve(ctx context.Context, sess string, since time.Time) error {
	lease := store.Keep(a.s, sess, SessionTTL, since, a.cfg.Log)
	defer lease.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 3)
	var wg sync.WaitGroup
	run := func(f func(context.Context, string) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(sctx, sess); err != nil {
				errc <- err
			}
		}()
	}
	run(func(ctx context.Context, _ string) error {
		select {
		case <-ctx.Done():
			return nil
		case <-lease.Done():
			return lease.Err()
		}
	})
	run(a.publish)
	if !a.cfg.NoScheduler {
		run(a.elect)
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	cancel()
	wg.Wait()
	return err
}

// publish rewrites the node's record when its inventory changes.
func (a *Agent) publish(ctx context.Context, sess string) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-a.changed:
		}
		rec, inv, err := a.record()
		if err != nil {
			return err
		}
		_, err = a.s.Txn(ctx, []store.Op{
			{Verb: store.CheckSession, Key: alivePrefix + a.cfg.Node, Session: sess},
			{Verb: store.Set, Key: inventoryPrefix + a.cfg.Node, Value: inv},
			{Verb: store.Set, Key: nodesPrefix + a.cfg.Node, Value: mustRecord(schema.Node, rec)},
		})
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("publish inventory: %w", err)
		}
		a.log.Info("inventory updated", zap.Int("devices", len(rec.Devices)))
	}
}

// elect tries to become the scheduler, runs it while it leads, and otherwise waits for
// the leader key to be free. It returns only when ctx ends (nil) or the session is gone.
func (a *Agent) elect(ctx context.Context, sess string) error {
	w := store.NewWatcher(a.s, schedulerKey)
	for {
		_, err := a.s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: schedulerKey, Value: []byte(a.cfg.Node), Session: sess}})
		switch {
		case err == nil:
			a.log.Info("elected scheduler")
			lctx, stopLeading := context.WithCancel(ctx)
			var wg sync.WaitGroup
			for _, f := range a.cfg.Leader {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// A task that stops while this agent still leads is started again:
					// a leader without its job controller would grant and never launch.
					for {
						err := f(lctx, a.s, sess)
						if lctx.Err() != nil {
							return
						}
						a.log.Warn("a leader's task stopped; starting it again", zap.Error(err), zap.Duration("in", leaderTaskRetry))
						if !store.Sleep(lctx, leaderTaskRetry) {
							return
						}
					}
				}()
			}
			err = NewScheduler(a.s, SchedulerConfig{Session: sess, Name: a.cfg.Node, Log: a.log.Named("scheduler"),
				Events: a.cfg.Events}).Run(ctx)
			stopLeading()
			wg.Wait()
			if ctx.Err() != nil {
				return nil
			}
			a.log.Warn("scheduler stopped", zap.Error(err))
			continue
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, store.ErrSessionGone):
			return fmt.Errorf("elect: %w", store.ErrSessionGone)
		case errors.Is(err, store.ErrLockDelay):
			// The key is free but in its last holder's lock-delay: nothing will change it
			// for the watch to see, so try again shortly.
			if !store.Sleep(ctx, electRetry) {
				return nil
			}
			continue
		}
		// Held by another agent (or Consul unreachable): wait for a change of the key.
		// Held by this agent's own session, it tries again at once: a snapshot restored
		// into a Consul that lost its data brings the key back held by the session this
		// agent renews, and nothing else would ever change it.
		for {
			entries, err := w.Next(ctx)
			if err != nil {
				return nil
			}
			held := false
			for _, e := range entries {
				held = held || (e.Key == schedulerKey && e.Session != "" && e.Session != sess)
			}
			if !held {
				break
			}
		}
	}
}

// watchHealth republishes the inventory whenever the health source reports a GPU's
// health changing, until ctx ends.
func (a *Agent) watchHealth(ctx context.Context) {
	a.mu.Lock()
	cur := *a.inv
	a.mu.Unlock()
	cur.GPUs = append([]topology.GPU(nil), cur.GPUs...)
	err := a.cfg.Health(ctx, &cur, func(ch topology.GPUHealthChange) {
		for i := range cur.GPUs {
			if cur.GPUs[i].Index == ch.Index {
				cur.GPUs[i].Health = ch.Health
			}
		}
		a.log.Warn("gpu health changed", zap.Int("gpu", ch.Index), zap.String("health", string(ch.Health.State)), zap.Strings("reasons", ch.Health.Reasons))
		next := cur
		next.GPUs = append([]topology.GPU(nil), cur.GPUs...)
		a.UpdateInventory(&next)
		if ch.Health.State == topology.Failed {
			// A failed GPU drains its node (Slurm drains a node whose health check fails):
			// no new work lands there, and the jobs running there move off it.
			reason := fmt.Sprintf("GPU %d failed: %s", ch.Index, strings.Join(ch.Health.Reasons, "; "))
			if err := SetFailureDrain(ctx, a.s, a.cfg.Node, failure.GPUHealth, reason); err != nil {
				a.log.Warn("drain the node after a GPU failed", zap.Error(err))
			} else {
				a.log.Warn("node drained", zap.String("reason", reason))
			}
		}
	})
	if err != nil && ctx.Err() == nil {
		a.log.Warn("gpu health watch stopped", zap.Error(err))
	}
}
