package rendezvous

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/failure"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// Defaults of the dynamic rendezvous.
const (
	// DefaultLastCall is how long the leader waits for more nodes once MIN have joined
	// and fewer than MAX have (torch's dynamic rendezvous calls it last_call_timeout).
	DefaultLastCall = 3 * time.Second
	// SessionTTL is the TTL of a node's job session (store.SessionTTL, 20 s): a dead
	// node's membership key goes away 2×SessionTTL after its last renewal at most
	// (Consul's rule).
	SessionTTL = store.SessionTTL
	// joinReportEvery is how often a node still waiting for a round says so.
	joinReportEvery = 30 * time.Second
	// heartbeatEvery throttles the output heartbeats nodes publish for --hang-timeout.
	heartbeatEvery = time.Second
	// chunk is how many per-node assignments go in one transaction (under Consul's 128
	// operations, with room for the checks).
	chunk = 120
)

// jobStatus is where a run of the job stands, in its state key.
type jobStatus string

// Job statuses.
const (
	statusOpen     jobStatus = "open"     // the round accepts joins
	statusRunning  jobStatus = "running"  // the round is closed and its workers run
	statusEnded    jobStatus = "ended"    // the round failed or its membership changed; a new one opens next
	statusFinished jobStatus = "finished" // the job succeeded, or ran out of restarts: a new run starts fresh
)

// roundEnd is how the last round of a run ended, in its state key.
type roundEnd string

// Round ends.
const (
	endFailed     roundEnd = "failed"     // a worker failed (or the gang hung): the budget is charged
	endMembership roundEnd = "membership" // a node left or one waits to join
	endSucceeded  roundEnd = "succeeded"  // every node's workers exited 0
)

// DynamicConfig configures a dynamic rendezvous.
type DynamicConfig struct {
	// JobID names the job; jobs with different ids never see each other's keys.
	JobID string
	// MinNodes and MaxNodes are --nnodes MIN:MAX.
	MinNodes, MaxNodes int
	// MaxRestarts is the restart budget: a failure beyond it finishes the job.
	MaxRestarts int
	// LastCall is how long to wait for more nodes once MinNodes have joined;
	// DefaultLastCall when zero.
	LastCall time.Duration
	// GiveUpAfter, when positive, ends a Join that has waited this long for an
	// unavailable coordinator, with the error that made it wait (ErrUnavailable): a
	// coordinator that is one process on one host (the c10d endpoint's) is not coming
	// back. Zero waits for ever, as for Consul, which outlives any one host.
	GiveUpAfter time.Duration
	// Host identifies this machine (its hostname): a loopback MASTER_ADDR is allowed only
	// when every node of a round runs on the same host.
	Host string
	// Log receives the rendezvous' messages; nil discards them.
	Log *zap.Logger
	// FollowRun makes this node join the run whatever --nnodes and --max-restarts it
	// records: a cluster job's step, whose budget the job keeps (and raises for a node
	// failure, AddRestarts) and whose placement may change size, joins the job's run as
	// it stands.
	FollowRun bool
	// Events receives event.RoundClosed when this node gets its assignment of a round
	// (Nodes: the round's nodes in node-rank order, when the round carries them); the
	// supervisor reports how rounds end. nil discards them.
	Events event.Sink
}

// jobState is the job's state key: which round, and where it stands. Every change is a
// check-and-set on its ModifyIndex.
type jobState struct {
	// Run identifies this run of the job; a job id reused after the job finished starts a
	// new run.
	Run      string    `json:"run"`
	Round    int       `json:"round"`
	Status   jobStatus `json:"status"`
	Failures int       `json:"failures"`
	End      roundEnd  `json:"end,omitempty"`
	Failure  *Failure  `json:"failure,omitempty"`
	Detail   string    `json:"detail,omitempty"`
	// Error is a configuration error every node reports and exits on.
	Error string `json:"error,omitempty"`
	// runConfig is set by the node that started the run and carried by every state of
	// it; a node given other settings is refused until the run finishes (checkConfig).
	runConfig
	// Previous is how the previous round ended, kept when the next round opens so a node
	// that sees the state only after that still learns why its round ended.
	Previous *jobState `json:"previous,omitempty"`
	// newer is set (and nothing else) when a newer gangrun wrote the state: this node
	// cannot take part in the run, and writes nothing over it (no run is this one's).
	newer error
}

// budget is the run's restart budget: the one it records (which a job may have raised,
// AddRestarts), else def.
func (rc runConfig) budget(def int) int {
	if rc.MaxRestarts != nil {
		return *rc.MaxRestarts
	}
	return def
}

// runConfig is what every node of a run must agree on: --nnodes ("N" or "MIN:MAX") and
// --max-restarts. MaxRestarts is nil in a state an older gangrun wrote.
type runConfig struct {
	NNodes      string `json:"nnodes,omitempty"`
	MaxRestarts *int   `json:"max_restarts,omitempty"`
}

// memberRecord is a node's membership key, held by its session.
type memberRecord struct {
	Member
	Host string `json:"host"`
	// Round is the round the node wants to be in.
	Round int `json:"round"`
}

// roundRecord is one node's part of a closed round, written by the leader.
type roundRecord struct {
	Run string `json:"run"`
	Assignment
}

// Dynamic is the rendezvous of nodes that come and go (torch calls its own the dynamic
// rendezvous, torch/distributed/elastic/rendezvous/dynamic_rendezvous.py), over a
// coordination store — Consul in a cluster, the in-memory twin in tests: session-held
// membership keys, a CAS-guarded job state, and blocking queries. Keys, under
// gangrun/jobs/<job>/:
//
//	ctl/state               jobState (CAS)
//	ctl/leader              held by the leader's session: it closes rounds and is node rank 0
//	members/<node>          memberRecord, held by the node's session
//	rounds/<round>/<node>   roundRecord: the node's Assignment
//	done/<run>/<round>/<node>  the node's workers all succeeded
//
// and gangrun/heartbeat/<job>/<node> for --hang-timeout. Nodes other than the leader
// watch only ctl/ (two small keys), so a round of 1,024 nodes costs each node one small
// read of its own assignment.
type Dynamic struct {
	s      store.Store
	cfg    DynamicConfig
	log    *zap.Logger
	events event.Sink

	mu      sync.Mutex
	lease   *store.Lease           // the node's session and its lease; nil before the first join
	onLease func(killBy time.Time) // the supervisor's OnLease, handed to every new lease
	joined  bool                   // this process was in a round of the job: later outages are waited out
	hist    *history               // the last round this process was assigned; nil before one
}

// history is what a node remembers of the job across a loss of the coordinator's state
// (a Consul server that restarted without its data): the last round it ran and the
// restarts the job had spent by then. A new run of the job formed after such a loss
// starts its rounds after hist.Round and its failures at hist.Failures, so attempt
// numbers (log directories, GANGRUN_ATTEMPT, the fencing number) never go back and the
// restart budget is not refilled.
type history struct {
	Round    int `json:"round"`
	Failures int `json:"failures"`
}

// NewDynamic returns a rendezvous for cfg.JobID in s.
func NewDynamic(s store.Store, cfg DynamicConfig) (*Dynamic, error) {
	if err := store.CheckSegment("job id", cfg.JobID); err != nil {
		return nil, err
	}
	if cfg.MinNodes < 1 || cfg.MaxNodes < cfg.MinNodes {
		return nil, fmt.Errorf("nnodes %d:%d: want 1 <= MIN <= MAX", cfg.MinNodes, cfg.MaxNodes)
	}
	if cfg.LastCall <= 0 {
		cfg.LastCall = DefaultLastCall
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	return &Dynamic{s: s, cfg: cfg, log: log, events: event.Or(cfg.Events)}, nil
}

func (c *Dynamic) key(parts ...string) string {
	return jobKey(c.cfg.JobID, parts...)
}

// jobKey is the key of job jobID's rendezvous made of parts, under gangrun/jobs/<job>/.
func jobKey(jobID string, parts ...string) string {
	return "gangrun/jobs/" + jobID + "/" + strings.Join(parts, "/")
}

// JobPrefixes are the key prefixes that hold job jobID's rendezvous: its rounds and
// runs, and its nodes' heartbeats. A job's records can be removed with them once no
// node of it runs (job.Controller purges an ended cluster job's).
func JobPrefixes(jobID string) []string {
	return []string{jobKey(jobID), "gangrun/heartbeat/" + jobID + "/"}
}

// Prefixes are the key prefixes that hold every job's rendezvous (JobPrefixes of all
// jobs).
func Prefixes() []string { return []string{"gangrun/jobs/", "gangrun/heartbeat/"} }

func (c *Dynamic) heartbeatKey(node string) string {
	return "gangrun/heartbeat/" + c.cfg.JobID + "/" + node
}

// ensureSession returns the node's lease, creating a session when there is none or the
// last one's lease is over. An old session whose lease ended may still be alive in
// Consul (a partition that healed before Consul's timer ran out): it is destroyed
// first, so its keys go at once and this node's name is free to join again.
func (c *Dynamic) ensureSession(ctx context.Context, node string) (*store.Lease, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lease != nil {
		select {
		case <-c.lease.Done():
		default:
			return c.lease, nil
		}
		c.lease.Close()
		dctx, cancel := context.WithTimeout(ctx, store.CallTimeout)
		_ = c.s.DestroySession(dctx, c.lease.Session())
		cancel()
		c.lease = nil
	}
	since := time.Now()
	id, err := c.s.CreateSession(ctx, store.SessionOptions{Name: "gangrun run " + c.cfg.JobID + " " + node,
		TTL: SessionTTL, Behavior: store.DeleteKeys, NodeHealth: true})
	if err != nil {
		return nil, err
	}
	c.lease = store.Keep(c.s, id, SessionTTL, since, c.log)
	if c.onLease != nil {
		c.lease.OnRenew(c.onLease)
	}
	return c.lease, nil
}

// setOnLease registers the supervisor's OnLease with the current and every later lease.
func (c *Dynamic) setOnLease(f func(time.Time)) {
	c.mu.Lock()
	c.onLease = f
	l := c.lease
	c.mu.Unlock()
	if l != nil {
		l.OnRenew(f)
	}
}

// Close leaves the job: the node's session is destroyed, so its keys go at once.
func (c *Dynamic) Close(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lease == nil {
		return nil
	}
	c.lease.Close()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), store.CallTimeout)
	defer cancel()
	err := c.s.DestroySession(dctx, c.lease.Session())
	c.lease = nil
	return err
}

// readCtl parses the ctl/ entries: the state (nil when absent), its index, and the
// leader's session.
func (c *Dynamic) readCtl(entries []store.Entry) (*jobState, uint64, string) {
	var st *jobState
	var idx uint64
	leader := ""
	for _, e := range entries {
		switch e.Key {
		case c.key("ctl", "state"):
			var s jobState
			switch err := schema.Unmarshal(schema.RdzvState, e.Value, &s); {
			case err == nil:
				st, idx = &s, e.ModifyIndex
			case errors.Is(err, schema.ErrNewer):
				st, idx = &jobState{newer: fmt.Errorf("job %s: %w", c.cfg.JobID, err)}, e.ModifyIndex
			}
		case c.key("ctl", "leader"):
			leader = e.Session
		}
	}
	return st, idx, leader
}

// casState replaces the state at index idx (0: create). It reports whether it won.
func (c *Dynamic) casState(ctx context.Context, idx uint64, st jobState, extra ...store.Op) (bool, error) {
	b, _ := schema.Marshal(schema.RdzvState, st)
	ops := append([]store.Op{{Verb: store.CAS, Key: c.key("ctl", "state"), Value: b, Index: idx}}, extra...)
	_, err := c.s.Txn(ctx, ops)
	if errors.Is(err, store.ErrTxnRejected) {
		return false, nil
	}
	return err == nil, err
}

func newRunID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// nnodes is this node's --nnodes as the job state records it: "N", or "MIN:MAX".
func (c *Dynamic) nnodes() string {
	if c.cfg.MinNodes == c.cfg.MaxNodes {
		return strconv.Itoa(c.cfg.MinNodes)
	}
	return strconv.Itoa(c.cfg.MinNodes) + ":" + strconv.Itoa(c.cfg.MaxNodes)
}

// freshRun is the state of a new run of the job, with this node's configuration. Its
// first round comes after prev's (the finished run it replaces; nil when there is
// none) and after the last round this process ran (a run formed again after the
// coordinator lost the job's state is the same job: it keeps the restarts spent).
func (c *Dynamic) freshRun(prev *jobState) jobState {
	mr := c.cfg.MaxRestarts
	st := jobState{Run: newRunID(), Round: 0, Status: statusOpen, runConfig: runConfig{NNodes: c.nnodes(), MaxRestarts: &mr}}
	if prev != nil {
		st.Round = prev.Round + 1
	}
	if h := c.history(); h != nil {
		st.Round = max(st.Round, h.Round+1)
		st.Failures = max(st.Failures, h.Failures)
	}
	return st
}

// history returns what this process remembers of the job (nil before its first round).
func (c *Dynamic) history() *history {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hist
}

// behind reports whether an open state's numbering is behind this process's history,
// as in a run formed again by nodes that remember less than this one: it must not
// reuse a round number this node already ran, nor refill spent restarts.
func (c *Dynamic) behind(st *jobState) bool {
	h := c.history()
	return h != nil && (st.Round <= h.Round || st.Failures < h.Failures)
}

// checkConfig refuses to join a run (not yet finished) that was started with another
// --nnodes or --max-restarts: the nodes would disagree on when a round closes and when
// the job is out of restarts. A state without them (an older gangrun's) matches.
func (c *Dynamic) checkConfig(st *jobState) error {
	if st.Status == statusFinished {
		return nil
	}
	if st.NNodes != "" && st.NNodes != c.nnodes() && !c.cfg.FollowRun {
		return fmt.Errorf("--nnodes %s differs from job %s's --nnodes %s (given by the node that started its run): every node of a job must give the same (a new --job-id starts over)",
			c.nnodes(), c.cfg.JobID, st.NNodes)
	}
	if st.MaxRestarts != nil && *st.MaxRestarts != c.cfg.MaxRestarts && !c.cfg.FollowRun {
		return fmt.Errorf("--max-restarts %d differs from job %s's --max-restarts %d (given by the node that started its run): every node of a job must give the same (a new --job-id starts over)",
			c.cfg.MaxRestarts, c.cfg.JobID, *st.MaxRestarts)
	}
	return nil
}

// joinRetry bounds the pause between two tries to join while the coordinator is
// unavailable (joinRetryMin doubling to joinRetryMax); successRetry the pause between
// two tries to report this node's success.
const (
	joinRetryMin    = 500 * time.Millisecond
	joinRetryMax    = 5 * time.Second
	successRetryMin = 100 * time.Millisecond
	successRetryMax = 5 * time.Second
)

// Join implements Rendezvous: it blocks until a round closes with this node in it.
//
// Once this process has been in a round of the job, an unavailable coordinator (Consul
// unreachable, no leader) or a lease that ended does not end the join: the node waits
// it out, with a new session, and joins the next round it can. Before that, such errors
// are returned (a coordinator that cannot be reached at start is a usage problem),
// except for a cluster job's step (FollowRun), which waits from its first join.
// Errors that no wait can fix (another --nnodes than the job's, a name held by another
// node, the job finished meanwhile) are returned at once.
func (c *Dynamic) Join(ctx context.Context, req JoinRequest) (Round, error) {
	if err := store.CheckNodeName("node name", req.Node); err != nil {
		return nil, err
	}
	if req.LocalWorldSize < 1 {
		return nil, fmt.Errorf("join: local world size %d: must be at least 1", req.LocalWorldSize)
	}
	c.setOnLease(req.OnLease)
	backoff := joinRetryMin
	var downSince, reported time.Time
	for {
		r, err := c.join(ctx, req)
		if err == nil {
			if !downSince.IsZero() {
				c.log.Info("coordinator reachable again: joined", zap.Duration("after", time.Since(downSince).Round(time.Second)))
			}
			c.mu.Lock()
			c.joined = true
			c.mu.Unlock()
			return r, nil
		}
		c.mu.Lock()
		joined := c.joined
		c.mu.Unlock()
		retry := errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrLeaseExpired) || errors.Is(err, store.ErrSessionGone)
		// A first join fails at once: `gangrun run` pointed at a Consul that is not
		// there is a mistake to say now. A cluster job's step (FollowRun) was started
		// because Consul showed its job running here: Consul gone a moment later (an
		// outage, a restore) is waited for like any later one, for as long as the
		// step's own lease lets it (its end cancels ctx).
		if ctx.Err() != nil || (!joined && !c.cfg.FollowRun) || !retry {
			return nil, err
		}
		now := time.Now()
		if c.cfg.GiveUpAfter > 0 && !downSince.IsZero() && now.Sub(downSince) >= c.cfg.GiveUpAfter {
			return nil, fmt.Errorf("the coordinator has been unreachable for %s: %w", now.Sub(downSince).Round(time.Second), err)
		}
		switch {
		case downSince.IsZero():
			downSince, reported = now, now
			c.log.Warn("cannot join the job's next round: waiting for the coordinator", zap.Error(err))
		case now.Sub(reported) >= joinReportEvery:
			reported = now
			c.log.Warn("still waiting for the coordinator", zap.Duration("for", now.Sub(downSince).Round(time.Second)), zap.Error(err))
		}
		if !store.Sleep(ctx, backoff) {
			return nil, ctx.Err()
		}
		backoff = min(backoff*2, joinRetryMax)
	}
}

// join is one try of Join with one session.
func (c *Dynamic) join(ctx context.Context, req JoinRequest) (Round, error) {
	lease, err := c.ensureSession(ctx, req.Node)
	if err != nil {
		return nil, err
	}
	lost := lease.Done()
	// Every wait below ends when the lease does: a join may not go on under a session
	// the node no longer knows to be its own.
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-lost:
			cancel()
		case <-ctx.Done():
		}
	}()
	r, err := c.joinWith(ctx, req, lease)
	if err != nil && parent.Err() == nil && lease.Err() != nil {
		return nil, fmt.Errorf("rendezvous session lost while joining: %w", lease.Err())
	}
	return r, err
}

// joinWith runs the join loop under lease; ctx ends when the lease does.
func (c *Dynamic) joinWith(ctx context.Context, req JoinRequest, lease *store.Lease) (Round, error) {
	j := &joiner{c: c, req: req, lease: lease, sess: lease.Session(), w: store.NewWatcher(c.s, c.key("ctl")+"/")}
	if err := j.start(ctx); err != nil {
		return nil, err
	}
	// A join can wait for ever (nodes that never come): say so now and then.
	stopReport := c.reportJoinWait(ctx)
	defer stopReport()
	for {
		entries, err := j.next(ctx)
		if err != nil {
			return nil, err
		}
		st, idx, leader := c.readCtl(entries)
		if leader == "" {
			// Nobody leads: try to. Success changes the key, which wakes everyone.
			if lerr := c.takeLeader(ctx, req.Node, j.sess); lerr == nil {
				leader = j.sess
			} else {
				c.log.Debug("could not take the leader key: trying again", zap.Error(lerr))
				j.retryLead = true
			}
		}
		if r, err := j.step(ctx, st, idx, leader); r != nil || err != nil {
			return r, err
		}
	}
}

// joiner is the state of one joinWith: the node's request and session, the watch of
// the job's ctl/ keys, and this node's membership as it last wrote it.
type joiner struct {
	c     *Dynamic
	req   JoinRequest
	lease *store.Lease
	sess  string
	w     *store.Watcher

	first     []store.Entry // the watcher's first read, which the loop starts from
	readFirst bool          // whether the loop took first (an empty prefix reads as nil)
	retryLead bool          // the last try to lead failed: read again after a pause
	me        memberRecord  // this node's membership key, as last written
	waitedFor string        // the run this node saw running while it waited to join
}

// start reads the job's state once and makes this node a member. The watcher's first
// read returns at once: with it a node given another --nnodes or --max-restarts than
// the job's unfinished run is refused before it becomes a member (the leader would
// count it). The loop starts from the same read.
func (j *joiner) start(ctx context.Context) error {
	c := j.c
	first, err := j.w.Next(ctx)
	if err != nil {
		return err
	}
	j.first = first
	if st, _, _ := c.readCtl(first); st != nil {
		if st.newer != nil {
			return st.newer
		}
		if err := c.checkConfig(st); err != nil {
			return err
		}
	}
	j.me = memberRecord{Member: Member{Node: j.req.Node, Addr: j.req.Addr, LocalWorldSize: j.req.LocalWorldSize, Switch: j.req.Switch},
		Host: c.cfg.Host, Round: -1}
	return c.becomeMember(ctx, j.sess, j.me)
}

// reportJoinWait logs every joinReportEvery that this node still waits for a round,
// until the returned function is called or ctx ends.
func (c *Dynamic) reportJoinWait(ctx context.Context) (stop func()) {
	start := time.Now()
	wctx, stopReport := context.WithCancel(ctx)
	go func() {
		t := time.NewTicker(joinReportEvery)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
				c.log.Info("still waiting for a round of the job", zap.String("job", c.cfg.JobID),
					zap.String("nnodes", c.nnodes()), zap.Duration("waited", time.Since(start).Round(time.Second)))
			}
		}
	}()
	return stopReport
}

// next returns the job's ctl/ keys for the loop's next pass: the first read, then after
// a failed try to lead a fresh list after a pause, else the watch's next change.
func (j *joiner) next(ctx context.Context) ([]store.Entry, error) {
	c := j.c
	switch {
	case !j.readFirst: // (an empty prefix reads as nil: a flag, not first != nil)
		j.readFirst = true
		return j.first, nil
	case j.retryLead:
		// The last try to lead failed and nobody took the key: no change may come to
		// wake a blocking query (a lock-delay ends, a store error passes), so look
		// again after a pause.
		j.retryLead = false
		if !store.Sleep(ctx, leadRetry) {
			return nil, ctx.Err()
		}
		entries, _, err := c.s.List(ctx, c.key("ctl")+"/")
		return entries, err
	}
	return j.w.Next(ctx)
}

// takeLeader tries to take the job's leader key for session sess of node.
func (c *Dynamic) takeLeader(ctx context.Context, node, sess string) error {
	_, err := c.s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: c.key("ctl", "leader"), Value: []byte(node), Session: sess}})
	return err
}

// step acts on the job's state st (at index idx, led by session leader): it starts,
// moves on or refuses the run, or waits in or leads its round. It returns this node's
// round once one closed with it; nil and no error to read the state again.
func (j *joiner) step(ctx context.Context, st *jobState, idx uint64, leader string) (Round, error) {
	c := j.c
	var cfgErr error
	if st != nil && st.newer == nil {
		cfgErr = c.checkConfig(st)
	}
	switch {
	case st != nil && st.newer != nil:
		return nil, st.newer
	case st == nil:
		_, err := c.casState(ctx, 0, c.freshRun(nil))
		return nil, err
	case st.Error != "":
		return nil, errors.New(st.Error)
	case cfgErr != nil:
		return nil, cfgErr
	case st.Status == statusFinished && (st.Run == j.waitedFor || c.history() != nil):
		// The run this node waited to join is over (the rounds had no room for it), or
		// this node, in the middle of the job, finds it finished (by the others, while
		// it was cut off): either way the job is done, and running it again alone would
		// run it twice.
		return nil, &JobFinishedError{JobID: c.cfg.JobID, Succeeded: st.End == endSucceeded, Failure: st.Failure}
	case st.Status == statusFinished:
		c.log.Info("job id reused after the job finished: starting a new run", zap.String("job", c.cfg.JobID))
		_, err := c.casState(ctx, idx, c.freshRun(st))
		return nil, err
	case st.Status == statusEnded:
		prev := *st
		prev.Previous = nil
		_, err := c.casState(ctx, idx, jobState{Run: st.Run, Round: st.Round + 1, Status: statusOpen, Failures: st.Failures, Previous: &prev, runConfig: st.runConfig})
		return nil, err
	case st.Status == statusOpen && c.behind(st):
		// A run formed again after the coordinator lost the job's state, by nodes that
		// remember less of it than this one: move its numbering past this node's.
		h := c.history()
		next := *st
		next.Round, next.Failures = max(st.Round, h.Round+1), max(st.Failures, h.Failures)
		c.log.Info("the job's round numbering is behind this node's: moving it on (the coordinator lost the job's state)",
			zap.Int("round", st.Round), zap.Int("to_round", next.Round), zap.Int("failures", next.Failures))
		_, err := c.casState(ctx, idx, next)
		return nil, err
	case st.Status == statusRunning:
		return j.running(ctx, st, idx, leader)
	case st.Status == statusOpen:
		if j.me.Round != st.Round {
			j.me.Round = st.Round
			if err := c.putMember(ctx, j.sess, j.me); err != nil {
				return nil, err
			}
		}
		if leader == j.sess {
			return nil, c.lead(ctx, j.req, st, idx, j.sess)
		}
	}
	return nil, nil
}

// running is step for a running round: this node's round when it joined it while it
// was open; otherwise it waits for the next round (and, leading, watches over this one
// until it ends).
func (j *joiner) running(ctx context.Context, st *jobState, idx uint64, leader string) (Round, error) {
	c := j.c
	j.waitedFor = st.Run
	// Only a round this process joined while it was open: a node that restarted
	// mid-round waits for the next one (the leader sees it and re-forms the gang).
	if j.me.Round == st.Round {
		if r, ok, err := c.myRound(ctx, st, j.req.Node); err != nil {
			return nil, err
		} else if ok {
			return c.newRound(r, st, j.req.Node, j.lease, leader == j.sess), nil
		}
	}
	if j.me.Round != st.Round+1 {
		j.me.Round = st.Round + 1 // wait for the next round; the leader sees a waiter
		if err := c.putMember(ctx, j.sess, j.me); err != nil {
			return nil, err
		}
		c.log.Info("a round is running: waiting to join the next", zap.Int("round", st.Round))
	}
	if leader == j.sess {
		// This waiting node leads (the round's nodes may all be gone, after a
		// crash of the whole job): it watches over the round until it ends.
		return nil, c.watchOver(ctx, st, idx)
	}
	return nil, nil
}

// putMember writes this node's membership key, locked by its session. A name held by
// another live session is an error.
func (c *Dynamic) putMember(ctx context.Context, sess string, m memberRecord) error {
	b, _ := schema.Marshal(schema.RdzvMember, m)
	_, err := c.s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: c.key("members", m.Node), Value: b, Session: sess}})
	if errors.Is(err, store.ErrTxnRejected) {
		return fmt.Errorf("node name %s is already in job %s (another gangrun with the same --node-name): %w", m.Node, c.cfg.JobID, err)
	}
	return err
}

// leadRetry is the pause before a joining node looks again at a leader key it failed
// to take while nobody held it, or at its name's membership key held by another session.
const leadRetry = 500 * time.Millisecond

// memberTakeover is how long a joining node waits for its name's membership key to be
// freed: a gangrun of the same node that was SIGKILLed holds it until its session
// expires, 2×SessionTTL after its last renewal at most (job sessions have no
// lock-delay), plus slack for the clocks.
const memberTakeover = 2*SessionTTL + 5*time.Second

// becomeMember puts this node's membership key. While another session holds it (this
// node's previous gangrun, killed within 2×TTL, or a live gangrun with the same
// --node-name) it retries until memberTakeover has passed, then gives up with
// putMember's error. It polls: the holder's expiry is a key deletion a blocking query
// would see, but nothing changes when it does not expire, and that must end too.
func (c *Dynamic) becomeMember(ctx context.Context, sess string, m memberRecord) error {
	deadline := time.Now().Add(memberTakeover)
	for logged := false; ; logged = true {
		err := c.putMember(ctx, sess, m)
		if err == nil || !errors.Is(err, store.ErrTxnRejected) || time.Now().After(deadline) {
			return err
		}
		if !logged {
			c.log.Info("this node's name is held by another session: waiting for it to expire (a gangrun of this node killed less than 2×TTL ago, or another one with the same --node-name)",
				zap.String("node", m.Node), zap.Duration("up_to", memberTakeover))
		}
		if !store.Sleep(ctx, leadRetry) {
			return ctx.Err()
		}
	}
}

// myRound reads this node's part of the running round, if it has one.
func (c *Dynamic) myRound(ctx context.Context, st *jobState, node string) (Assignment, bool, error) {
	e, err := c.s.Get(ctx, c.key("rounds", strconv.Itoa(st.Round), node))
	if err != nil || e == nil {
		return Assignment{}, false, err
	}
	var r roundRecord
	if err := schema.Unmarshal(schema.RdzvRound, e.Value, &r); errors.Is(err, schema.ErrNewer) {
		return Assignment{}, false, fmt.Errorf("job %s, node %s: %w", c.cfg.JobID, node, err)
	} else if err != nil || r.Run != st.Run {
		return Assignment{}, false, nil
	}
	return r.Assignment, true, nil
}

// sessionAlive reports whether the store answers that session sess exists (false when
// it cannot be asked).
func (c *Dynamic) sessionAlive(ctx context.Context, sess string) bool {
	ok, err := c.s.SessionExists(ctx, sess)
	return err == nil && ok
}

// members reads every membership key of the job.
func (c *Dynamic) members(entries []store.Entry) map[string]memberRecord {
	out := map[string]memberRecord{}
	prefix := c.key("members") + "/"
	for _, e := range entries {
		if !strings.HasPrefix(e.Key, prefix) || e.Session == "" {
			continue
		}
		var m memberRecord
		if schema.Unmarshal(schema.RdzvMember, e.Value, &m) == nil {
			out[m.Node] = m // a newer gangrun's member is not one of this round's
		}
	}
	return out
}

// lead runs the leader's side of an open round: it waits until MaxNodes have joined, or
// MinNodes have and the last call has passed, then closes the round. It returns when the
// round is closed or the state changed under it.
func (c *Dynamic) lead(ctx context.Context, req JoinRequest, st *jobState, idx uint64, sess string) error {
	w := store.NewWatcher(c.s, c.key()+"")
	var deadline time.Time
	for {
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if !deadline.IsZero() {
			wctx, cancel = context.WithDeadline(ctx, deadline)
		}
		entries, err := w.Next(wctx)
		cancel()
		if err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil { // the last call ran out: read the members once more
			entries, _, err = c.s.List(ctx, c.key())
			if err != nil {
				return err
			}
		}
		cur, curIdx, leader := c.readCtl(entries)
		if cur == nil || curIdx != idx || leader != sess {
			return nil // the state moved on, or leadership did
		}
		var joined []memberRecord
		for _, m := range c.members(entries) {
			if m.Round == st.Round {
				joined = append(joined, m)
			}
		}
		n := len(joined)
		switch {
		case n >= c.cfg.MaxNodes:
			return c.close(ctx, req, st, idx, sess, joined)
		case n >= c.cfg.MinNodes && !deadline.IsZero() && !time.Now().Before(deadline):
			return c.close(ctx, req, st, idx, sess, joined)
		case n >= c.cfg.MinNodes && deadline.IsZero():
			deadline = time.Now().Add(c.cfg.LastCall)
			c.log.Info("enough nodes: last call", zap.Int("joined", n), zap.Int("min", c.cfg.MinNodes), zap.Int("max", c.cfg.MaxNodes), zap.Duration("last_call", c.cfg.LastCall))
		case n < c.cfg.MinNodes:
			deadline = time.Time{}
		}
	}
}

// watchOver runs the leader's checks on a round this node is not part of, until the
// state moves on.
func (c *Dynamic) watchOver(ctx context.Context, st *jobState, idx uint64) error {
	w := store.NewWatcher(c.s, c.key())
	for {
		entries, err := w.Next(ctx)
		if err != nil {
			return err
		}
		cur, curIdx, _ := c.readCtl(entries)
		if cur == nil || curIdx != idx {
			return nil
		}
		c.oversee(ctx, entries, st, idx)
	}
}

// order puts the leader first, then the nodes under its switch by name, then the other
// switches' nodes by (switch, name): nodes under one switch get adjacent node ranks.
func order(leader string, ms []memberRecord) []memberRecord {
	var lead memberRecord
	for _, m := range ms {
		if m.Node == leader {
			lead = m
		}
	}
	out := append([]memberRecord(nil), ms...)
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if (a.Node == leader) != (b.Node == leader) {
			return a.Node == leader
		}
		if (a.Switch == lead.Switch) != (b.Switch == lead.Switch) {
			return a.Switch == lead.Switch
		}
		if a.Switch != b.Switch {
			return a.Switch < b.Switch
		}
		return a.Node < b.Node
	})
	return out
}

// close closes the open round with joined nodes: node rank 0 (this node) picks the
// master port and the resume checkpoint, writes every node's assignment, then flips the
// state to running.
func (c *Dynamic) close(ctx context.Context, req JoinRequest, st *jobState, idx uint64, sess string, joined []memberRecord) error {
	ms := order(req.Node, joined)
	if len(ms) > c.cfg.MaxNodes {
		ms = ms[:c.cfg.MaxNodes]
	}
	leader := ms[0]
	if ip := net.ParseIP(leader.Addr); leader.Addr == "" || (ip != nil && ip.IsLoopback()) {
		for _, m := range ms {
			if m.Host != leader.Host {
				msg := fmt.Sprintf("MASTER_ADDR would be %q (node %s) but nodes %s and %s run on different hosts: give every node --advertise-addr with an address the others reach",
					leader.Addr, leader.Node, leader.Host, m.Host)
				_, err := c.casState(ctx, idx, jobState{Run: st.Run, Round: st.Round, Status: statusFinished, Failures: st.Failures, Error: msg, runConfig: st.runConfig})
				if err != nil {
					return err
				}
				return errors.New(msg)
			}
		}
		if leader.Addr == "" {
			leader.Addr = LoopbackAddr
		}
	}
	port := req.MasterPort
	if port == 0 {
		p, err := FreePort()
		if err != nil {
			return err
		}
		port = p
	}
	resume, err := req.chooseResume(ctx)
	if err != nil {
		return err
	}
	members := make([]Member, len(ms))
	for i, m := range ms {
		members[i] = m.Member
	}
	var ops []store.Op
	for i, m := range ms {
		a := Assign(members, i)
		a.JobID, a.Round, a.RestartCount = c.cfg.JobID, st.Round, st.Failures
		a.MasterAddr, a.MasterPort, a.ResumeFrom = leader.Addr, port, resume
		if len(members) <= 64 {
			a.Nodes = members
		}
		b, _ := schema.Marshal(schema.RdzvRound, roundRecord{Run: st.Run, Assignment: a})
		ops = append(ops, store.Op{Verb: store.Set, Key: c.key("rounds", strconv.Itoa(st.Round), m.Node), Value: b})
	}
	fence := []store.Op{
		{Verb: store.CheckSession, Key: c.key("ctl", "leader"), Session: sess},
		{Verb: store.CheckIndex, Key: c.key("ctl", "state"), Index: idx},
	}
	for len(ops) > 0 {
		n := min(len(ops), chunk)
		if _, err := c.s.Txn(ctx, append(append([]store.Op{}, fence...), ops[:n]...)); err != nil {
			if errors.Is(err, store.ErrTxnRejected) {
				return nil // deposed or the state moved: look again
			}
			return err
		}
		ops = ops[n:]
	}
	running := jobState{Run: st.Run, Round: st.Round, Status: statusRunning, Failures: st.Failures, runConfig: st.runConfig}
	cleanup := []store.Op{fence[0]}
	if st.Round > 0 {
		cleanup = append(cleanup, store.Op{Verb: store.DeleteTree, Key: c.key("rounds", strconv.Itoa(st.Round-1)) + "/"})
	}
	won, err := c.casState(ctx, idx, running, cleanup...)
	if err == nil && won {
		c.log.Info("round closed", zap.Int("round", st.Round), zap.Int("nnodes", len(ms)), zap.String("master", net.JoinHostPort(leader.Addr, strconv.Itoa(port))))
	}
	return err
}

// dynamicRound is a running round as one node sees it.
type dynamicRound struct {
	c      *Dynamic
	a      Assignment
	run    string
	node   string
	sess   string
	lease  *store.Lease
	ended  chan struct{}
	cancel context.CancelFunc

	mu     sync.Mutex
	end    End
	leader bool
	hbLast time.Time // the output time last published
	hbAt   time.Time // when it was published
}

func (c *Dynamic) newRound(a Assignment, st *jobState, node string, lease *store.Lease, leader bool) *dynamicRound {
	c.mu.Lock()
	c.hist = &history{Round: a.Round, Failures: a.RestartCount}
	c.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	r := &dynamicRound{c: c, a: a, run: st.Run, node: node, sess: lease.Session(), lease: lease,
		ended: make(chan struct{}), cancel: cancel, leader: leader}
	var nodes []string
	for _, m := range a.Nodes {
		nodes = append(nodes, m.Node)
	}
	c.events.Emit(event.Event{Time: time.Now(), Kind: event.RoundClosed, Job: c.cfg.JobID, Node: node, Attempt: a.Round, Nodes: nodes})
	go r.watch(ctx)
	return r
}

func (r *dynamicRound) Assignment() Assignment { return r.a }
func (r *dynamicRound) Ended() <-chan struct{} { return r.ended }

// End implements Round. It judges the lease on the caller's clock first: a supervisor
// that wakes from a stall longer than the lease learns here, before it acts on
// anything else it sees, that the round is over for this node.
func (r *dynamicRound) End() End {
	if !r.lease.Valid() {
		r.leaseOver()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.end
}

// leaseOver ends the round for this node because its lease is over: its workers must be
// dead by the lease's kill time, before Consul may invalidate the session and the other
// nodes re-form without this one.
func (r *dynamicRound) leaseOver() {
	r.finish(End{Kind: MembershipChanged, Lost: true, KillBy: r.lease.KillBy(),
		Detail: "this node lost its lease with the coordinator: " + errString(r.lease.Err())})
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

func (r *dynamicRound) finish(e End) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.end.Kind != Running {
		return
	}
	r.end = e
	close(r.ended)
	r.cancel()
}

// endOf translates a state that moved past this round into how the round ended.
func endOf(st *jobState) End {
	switch {
	case st == nil:
		return End{Kind: MembershipChanged, Detail: "the job's state disappeared", Lost: true}
	case st.newer != nil:
		return End{Kind: MembershipChanged, Detail: st.newer.Error()} // the next join says so too
	case st.End == endFailed:
		return End{Kind: Failed, Failure: st.Failure, OutOfRestarts: st.Status == statusFinished}
	case st.End == endSucceeded:
		return End{Kind: Succeeded}
	case st.Error != "":
		return End{Kind: Failed, Failure: &Failure{Rank: -1, LocalRank: -1, ExitCode: 1, Kind: failure.StartError, Reason: st.Error}, OutOfRestarts: true}
	}
	return End{Kind: MembershipChanged, Detail: st.Detail}
}

// watch follows the job until the round ends. Every node watches ctl/; the leader (or
// the node that takes over leadership) also watches the members and done markers.
func (r *dynamicRound) watch(ctx context.Context) {
	c := r.c
	// A lease that ends must end the round at once, not when the job's keys next change:
	// a blocking query can wait minutes, and after a Consul restart nothing may change.
	lost := r.lease.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-lost:
			cancel()
		case <-ctx.Done():
		}
	}()
	rw := &roundWatch{w: store.NewWatcher(c.s, c.key("ctl")+"/"), lw: store.NewWatcher(c.s, c.key())}
	for {
		r.mu.Lock()
		leading := r.leader
		r.mu.Unlock()
		entries, at, err := rw.next(ctx, c, leading)
		select {
		case <-lost:
			r.leaseOver()
			return
		default:
		}
		if err != nil {
			return
		}
		wentBack := at == 0 || at < rw.seen
		rw.seen = max(rw.seen, at)
		st, idx, leader := c.readCtl(entries)
		if st == nil && r.stateMayReturn(ctx, rw, wentBack) {
			continue
		}
		rw.awaitingRestore = false
		if st == nil || st.Run != r.run || st.Round != r.a.Round || st.Status != statusRunning {
			if st != nil && st.Previous != nil && st.Previous.Run == r.run && st.Previous.Round == r.a.Round {
				st = st.Previous // the next round opened already: this round's end is kept there
			}
			r.finish(endOf(st))
			return
		}
		if leader == "" {
			if err := c.takeLeader(ctx, r.node, r.sess); err == nil {
				leader = r.sess
			} else {
				rw.retryLead = true
			}
		}
		if leader == r.sess && !leading {
			r.mu.Lock()
			r.leader = true
			r.mu.Unlock()
			continue // read the whole job next
		}
		if leading {
			c.oversee(ctx, entries, st, idx)
		}
	}
}

// roundWatch is the state of one round's watch: its watchers of ctl/ and of the whole
// job (the leader's), and what its answers have shown so far.
type roundWatch struct {
	w, lw           *store.Watcher
	retryLead       bool   // the last try to lead failed: read again after a pause
	seen            uint64 // the highest index an answer came at
	awaitingRestore bool   // the job's state is gone from a Consul that lost its data
}

// next returns the watch's next answer and its index (0 when the watch found the index
// gone back): the whole job's keys when leading, ctl/'s afresh after a pause when the
// last try to lead failed, else ctl/'s next change.
func (rw *roundWatch) next(ctx context.Context, c *Dynamic, leading bool) (entries []store.Entry, at uint64, err error) {
	switch {
	case leading:
		entries, err = rw.lw.Next(ctx)
		at = rw.lw.Index()
	case rw.retryLead:
		// The last try to lead failed with nobody holding the key (its last holder's
		// lock-delay, a store error): no change may come to wake the watch, so look
		// again after a pause.
		rw.retryLead = false
		if store.Sleep(ctx, leadRetry) {
			entries, at, err = c.s.List(ctx, c.key("ctl")+"/")
		} else {
			err = ctx.Err()
		}
	default:
		entries, err = rw.w.Next(ctx)
		at = rw.w.Index()
	}
	return entries, at, err
}

// stateMayReturn reports, for an answer without the job's state, whether the watch
// should read on rather than end the round: the state is there when read afresh, or it
// is gone from a Consul that lost its data (wentBack: the answer's index went back) and
// no longer knows this node's session, which waits for the restore.
func (r *dynamicRound) stateMayReturn(ctx context.Context, rw *roundWatch, wentBack bool) bool {
	c := r.c
	// An answer without the job's state may be from before a restore that has
	// landed since: read it afresh before taking it for gone.
	if fresh, _, err := c.s.List(ctx, c.key("ctl")+"/"); err == nil {
		if again, _, _ := c.readCtl(fresh); again != nil {
			return true
		}
	}
	if (wentBack || store.DataLost(ctx, c.s)) && !c.sessionAlive(ctx, r.sess) {
		// The job's state is gone from a store whose data is not the data it had
		// (its index went back, or its cluster marker is gone or another: the
		// agents' writes to it may have raised its index past what this node saw):
		// a Consul that lost its data and answers until the operator restores its
		// snapshot (docs/operations.md, "Recovery"). That is no end of the round:
		// the restore brings the state back, and should it never, the lease ends
		// the round (its renewals meet the same store). The restore wakes the
		// watch: the job's keys change. A Consul that still knows this node's
		// session has not lost its data, whatever the marker says (a local user
		// who rewrote it where ACLs are off): the state is gone, the round ends.
		if !rw.awaitingRestore {
			rw.awaitingRestore = true
			c.log.Warn("the job's state is gone from a Consul that lost its data: waiting for its restore, or for the lease to end", zap.Int("round", r.a.Round))
		}
		return true
	}
	return false
}

// oversee is the leader's check of a running round: a member gone or restarted ends it
// (membership change), a node waiting to join ends it when the round has room
// (scale-up), and every member's done marker finishes the job.
func (c *Dynamic) oversee(ctx context.Context, entries []store.Entry, st *jobState, idx uint64) {
	members := c.members(entries)
	assigned := map[string]bool{}
	prefix := c.key("rounds", strconv.Itoa(st.Round)) + "/"
	done := map[string]bool{}
	donePrefix := c.key("done", st.Run, strconv.Itoa(st.Round)) + "/"
	for _, e := range entries {
		if n, ok := strings.CutPrefix(e.Key, prefix); ok {
			// A record left by an earlier run of the same job id is not this round's.
			var r roundRecord
			if schema.Unmarshal(schema.RdzvRound, e.Value, &r) == nil && r.Run == st.Run {
				assigned[n] = true
			}
		}
		if n, ok := strings.CutPrefix(e.Key, donePrefix); ok && e.Session != "" {
			done[n] = true
		}
	}
	end := func(status jobStatus, kind roundEnd, detail string) {
		ns := jobState{Run: st.Run, Round: st.Round, Status: status, Failures: st.Failures, End: kind, Detail: detail, runConfig: st.runConfig}
		if _, err := c.casState(ctx, idx, ns); err != nil {
			c.log.Warn("end round", zap.Error(err))
		}
	}
	names := make([]string, 0, len(assigned))
	for n := range assigned {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if m, ok := members[n]; !ok || m.Round != st.Round {
			if done[n] {
				continue // finished its part; its session may end
			}
			end(statusEnded, endMembership, "node "+n+" left")
			return
		}
	}
	if len(assigned) < c.cfg.MaxNodes {
		var waiting []string
		for n, m := range members {
			if !assigned[n] && m.Round > st.Round {
				waiting = append(waiting, n)
			}
		}
		if len(waiting) > 0 {
			sort.Strings(waiting)
			end(statusEnded, endMembership, "node "+strings.Join(waiting, ", ")+" waiting to join")
			return
		}
	}
	if len(done) >= len(assigned) && len(assigned) > 0 {
		all := true
		for n := range assigned {
			all = all && done[n]
		}
		if all {
			end(statusFinished, endSucceeded, "")
		}
	}
}

// Fail implements Round: the first failure reported ends the round for every node. A
// node whose lease is over reports nothing: its workers were stopped for that, not for
// a failure of theirs, and the round is over for it already.
func (r *dynamicRound) Fail(ctx context.Context, f Failure) error {
	c := r.c
	if !r.lease.Valid() {
		r.leaseOver()
		return fmt.Errorf("report the failure: %w", r.lease.Err())
	}
	for {
		entries, _, err := c.s.List(ctx, c.key("ctl")+"/")
		if err != nil {
			return err
		}
		st, idx, _ := c.readCtl(entries)
		if st == nil || st.Run != r.run || st.Round != r.a.Round || st.Status != statusRunning {
			return nil // already ended
		}
		ns := jobState{Run: st.Run, Round: st.Round, Status: statusEnded, Failures: st.Failures + 1, End: endFailed, Failure: &f, runConfig: st.runConfig}
		if ns.Failures > st.budget(c.cfg.MaxRestarts) {
			ns.Status = statusFinished
		}
		won, err := c.casState(ctx, idx, ns)
		if err != nil || won {
			if won {
				r.finish(endOf(&ns))
			}
			return err
		}
	}
}

// Succeed implements Round: it marks this node done and waits for the round's end.
func (r *dynamicRound) Succeed(ctx context.Context) (End, error) {
	c := r.c
	if !r.lease.Valid() {
		r.leaseOver()
		return r.End(), fmt.Errorf("report this node's success: %w", r.lease.Err())
	}
	// The done marker is retried through a passing outage: giving up would look to the
	// leader like a node that left without finishing. It stops when the store rejects
	// the lock (this node's session is gone) or the round ends otherwise.
	done := []store.Op{{Verb: store.Lock, Key: c.key("done", r.run, strconv.Itoa(r.a.Round), r.node), Value: []byte("ok"), Session: r.sess}}
	for backoff := successRetryMin; ; backoff = min(backoff*2, successRetryMax) {
		_, err := c.s.Txn(ctx, done)
		if err == nil {
			break
		}
		if errors.Is(err, store.ErrTxnRejected) || ctx.Err() != nil {
			return r.End(), err
		}
		c.log.Warn("reporting this node's success: retrying", zap.Error(err), zap.Duration("in", backoff))
		t := time.NewTimer(backoff)
		select {
		case <-r.ended:
			t.Stop()
			return r.End(), nil
		case <-ctx.Done():
			t.Stop()
			return r.End(), ctx.Err()
		case <-t.C:
		}
	}
	select {
	case <-r.ended:
		return r.End(), nil
	case <-ctx.Done():
		return r.End(), ctx.Err()
	}
}

// Leave implements Round: the node's membership key goes, so the others re-form.
func (r *dynamicRound) Leave(ctx context.Context) error {
	c := r.c
	_, err := c.s.Txn(ctx, []store.Op{
		{Verb: store.Delete, Key: c.key("members", r.node)},
		{Verb: store.Delete, Key: c.heartbeatKey(r.node)},
	})
	r.finish(End{Kind: MembershipChanged, Detail: "node " + r.node + " left"})
	return err
}

// Activity implements Round: nodes publish their last output time (at most once per
// second); the leader judges the gang by the newest of all.
func (r *dynamicRound) Activity(ctx context.Context, local time.Time) time.Time {
	c := r.c
	if !r.lease.Valid() {
		r.leaseOver()
		return time.Now() // the round is over for this node; nothing to judge
	}
	r.mu.Lock()
	publish := local.After(r.hbLast) && time.Since(r.hbAt) >= heartbeatEvery
	leading := r.leader
	r.mu.Unlock()
	if publish {
		if _, err := c.s.Txn(ctx, []store.Op{{Verb: store.Set, Key: c.heartbeatKey(r.node), Value: []byte(strconv.FormatInt(local.UnixNano(), 10))}}); err == nil {
			r.mu.Lock()
			r.hbLast, r.hbAt = local, time.Now()
			r.mu.Unlock()
		}
	}
	if !leading {
		return time.Now() // the leader judges
	}
	entries, _, err := c.s.List(ctx, "gangrun/heartbeat/"+c.cfg.JobID+"/")
	if err != nil {
		return time.Now() // cannot judge without the others' figures
	}
	newest := local
	for _, e := range entries {
		if ns, err := strconv.ParseInt(string(e.Value), 10, 64); err == nil {
			newest = maxTime(newest, time.Unix(0, ns))
		}
	}
	return newest
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// consul is the dynamic rendezvous over a Consul cluster (Dynamic on store.Consul).
type consul struct{}

func (consul) name() string { return "consul" }

func (consul) claims(c string) bool { return strings.HasPrefix(c, "consul://") }

func (consul) open(_ context.Context, coordinator string, cfg Config) (*Opened, error) {
	if cfg.JobID == "" {
		return nil, usage("--coordinator %s needs --job-id (the nodes of a job meet under it)", coordinator)
	}
	addr, err := store.ParseConsulURL(coordinator)
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	node, err := nodeName(cfg.NodeName)
	if err != nil {
		return nil, err
	}
	s, err := store.NewConsulFrom(addr, "--coordinator")
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	self := cfg.AdvertiseAddr
	if self == "" {
		self = DefaultAddr(addr)
	}
	host, _ := os.Hostname()
	var rs store.Store = s
	if cfg.WrapStore != nil {
		rs = cfg.WrapStore(s)
	}
	d, err := NewDynamic(rs, DynamicConfig{JobID: cfg.JobID, MinNodes: cfg.MinNodes, MaxNodes: cfg.MaxNodes,
		MaxRestarts: cfg.MaxRestarts, Host: host, Log: cfg.Log.Named("rendezvous"), Events: cfg.Events, FollowRun: cfg.FollowRun})
	if err != nil {
		s.Close()
		return nil, &UsageError{Err: err}
	}
	closed := false
	return &Opened{Rendezvous: d, JobID: cfg.JobID, NodeName: node, MinNodes: cfg.MinNodes, MaxNodes: cfg.MaxNodes,
		Addr: self, Shared: true, GPUsOnNode: -1, Store: s,
		Close: func() {
			if closed {
				return
			}
			closed = true
			_ = d.Close(context.Background())
			s.Close()
		}}, nil
}

// RunInfo is how the current run of a job of the dynamic rendezvous stands, as its
// state key records it.
type RunInfo struct {
	// Run identifies the run; Round is its current (or last) round.
	Run   string
	Round int
	// Failures counts its failed rounds; MaxRestarts is its budget (-1: not recorded).
	Failures, MaxRestarts int
	// Finished is true when the run is over: succeeded, or out of restarts.
	Finished bool
	// LastFailed is true when the current round, or the one before it when a new one is
	// open, ended failed; Failure is then its root cause.
	LastFailed bool
	Failure    *Failure
}

// ReadRun reads job jobID's current run; ok is false when the job has no state.
func ReadRun(ctx context.Context, s store.Store, jobID string) (info RunInfo, ok bool, err error) {
	e, err := s.Get(ctx, jobKey(jobID, "ctl", "state"))
	if err != nil || e == nil {
		return RunInfo{}, false, err
	}
	var st jobState
	if err := schema.Unmarshal(schema.RdzvState, e.Value, &st); err != nil {
		return RunInfo{}, false, fmt.Errorf("job %s's rendezvous state: %w", jobID, err)
	}
	info = RunInfo{Run: st.Run, Round: st.Round, Failures: st.Failures, MaxRestarts: st.budget(-1), Finished: st.Status == statusFinished}
	last := &st
	if st.Status == statusOpen && st.Previous != nil {
		last = st.Previous
	}
	if last.End == endFailed {
		info.LastFailed, info.Failure = true, last.Failure
	}
	return info, true, nil
}

// AddRestarts raises the restart budget of job jobID's current run by n, for every node
// at once (their next failure is judged against it): a cluster job gives back the
// restart that a node's failure cost its gang. It reports false when the run is over
// already (or there is none), and changes nothing then.
func AddRestarts(ctx context.Context, s store.Store, jobID string, n int) (bool, error) {
	key := jobKey(jobID, "ctl", "state")
	for {
		e, err := s.Get(ctx, key)
		if err != nil || e == nil {
			return false, err
		}
		var st jobState
		if err := schema.Unmarshal(schema.RdzvState, e.Value, &st); err != nil {
			return false, fmt.Errorf("job %s's rendezvous state: %w", jobID, err)
		}
		if st.Status == statusFinished {
			return false, nil
		}
		b := st.budget(0) + n
		st.MaxRestarts = &b
		data, _ := schema.Marshal(schema.RdzvState, st)
		_, err = s.Txn(ctx, []store.Op{{Verb: store.CAS, Key: key, Value: data, Index: e.ModifyIndex}})
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, store.ErrStaleIndex) {
			return false, err
		}
	}
}

// Evict removes node from job jobID's rendezvous at once: its membership key, and the
// leader key when the node's session holds it, as Consul would remove them when the
// node's session expires (up to 2×SessionTTL after its last renewal). The job's
// controller calls it for a node it has declared lost (down, or drained for a failed
// GPU), so that the survivors and a spare meet in the next round without waiting for
// that expiry; a deleted key carries no lock-delay. It reports whether a key went.
func Evict(ctx context.Context, s store.Store, jobID, node string) (bool, error) {
	m, err := s.Get(ctx, jobKey(jobID, "members", node))
	if err != nil || m == nil || m.Session == "" {
		return false, err
	}
	ops := []store.Op{{Verb: store.CheckSession, Key: m.Key, Session: m.Session}, {Verb: store.Delete, Key: m.Key}}
	if l, err := s.Get(ctx, jobKey(jobID, "ctl", "leader")); err == nil && l != nil && l.Session == m.Session {
		ops = append(ops, store.Op{Verb: store.CheckSession, Key: l.Key, Session: l.Session}, store.Op{Verb: store.Delete, Key: l.Key})
	}
	if _, err := s.Txn(ctx, ops); err != nil {
		if errors.Is(err, store.ErrNotLockHolder) || errors.Is(err, store.ErrKeyNotFound) {
			return false, nil // gone meanwhile, or taken by the node's next session
		}
		return false, err
	}
	return true, nil
}
