package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
)

// The burst's shape: what issue 10's break-it session ran ("100 concurrent grants with
// 17 holders SIGKILLed") on four 8-GPU nodes.
const (
	burstNodes    = 4
	burstRequests = 100
	burstKills    = 17
	// burstWait is each request's --wait: generous (the whole burst is served in about
	// 80 s on a loaded 2-core machine), so a request is refused only if the scheduler
	// stops granting.
	burstWait = 4 * time.Minute
	// burstDeadline bounds the burst: every alloc must have exited by then (none hangs).
	burstDeadline = burstWait + 30*time.Second
)

// TestBurstOfGrantsWithKilledHolders: 100 `gangrun alloc` processes start at once
// against 4 agents (32 GPUs), each asking for a gang of 1 or 2 nodes × 1..8 GPUs and
// holding it for 0.5..3 s with a command; 17 of them, picked at random at random
// moments, are SIGKILLed, some while they wait and some while they hold their grant.
// All along, Consul's cluster keys are read as often as the machine allows (a blocking
// query on gangrun/cluster/ that returns at each change, and consistent reads back to
// back) and every read is checked: no GPU is held by two grants and every grant is
// whole (a double booking that lasts longer than the longest gap between two reads,
// logged, cannot go unseen). At the end every alloc has exited (the others with their
// command's code 0), no read begun more than allocator.ReleaseBound (2×TTL plus the
// lock-delay, 45 s; docs/cluster.md, "How a gang is granted") after a killed holder's
// death saw its keys, and nothing is left: no GPU key, grant, request or alloc session,
// and no process of a killed holder's command.
func TestBurstOfGrantsWithKilledHolders(t *testing.T) {
	consul := consultest.Start(t).Addr
	for i := range burstNodes {
		startAgent(t, consul, fmt.Sprintf("burst-%d", i), "dgx-h100", "")
	}
	waitUntilFor(t, 60*time.Second, func() bool {
		nodes := nodesJSON(t, consul)
		up := 0
		for _, n := range nodes {
			if n.State == allocator.NodeUp && n.GPUsFree == 8 {
				up++
			}
		}
		return up == burstNodes
	}, fmt.Sprintf("%d agents up with 8 free GPUs each", burstNodes))
	s, err := store.NewConsul(consul)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mark := testMark(t) // fails the test if a killed holder's command outlives it

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	obs := newKeyObserver()
	obsDone := make(chan struct{})
	go func() { defer close(obsDone); obs.run(ctx, s) }()
	defer func() { cancel(); <-obsDone }()

	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 10))
	procs := make([]*burstProc, burstRequests)
	for i := range procs {
		procs[i] = &burstProc{i: i, nodes: 1 + rng.IntN(2), gpus: 1 + rng.IntN(8),
			hold: 500*time.Millisecond + time.Duration(rng.IntN(2500))*time.Millisecond, done: make(chan struct{})}
	}
	// Started all at once: Start returns once the child has exec'd, so one at a time
	// would spread the burst over seconds on a loaded machine.
	start := time.Now()
	var wg sync.WaitGroup
	startErrs := make([]error, len(procs))
	for i, p := range procs {
		wg.Add(1)
		go func() { defer wg.Done(); startErrs[i] = p.start(consul, mark) }()
	}
	wg.Wait()
	for _, p := range procs {
		if p.cmd.Process != nil {
			t.Cleanup(p.stop)
		}
	}
	if err := errors.Join(startErrs...); err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %d: %d allocs started in %s", seed, len(procs), time.Since(start).Round(time.Millisecond))

	// The killer: 17 kills at random moments, each of a random process in the state the
	// kill is for (9 waiting, 8 holding, in a random order; the other state when none is
	// in that one). A kill counts only if the process died of it.
	killerDone := make(chan struct{})
	var killErr error
	go func() {
		defer close(killerDone)
		modes := make([]bool, burstKills) // true: kill a holder (odd positions before the shuffle)
		for i := range modes {
			modes[i] = i%2 == 1
		}
		rng.Shuffle(len(modes), func(i, j int) { modes[i], modes[j] = modes[j], modes[i] })
		for k := 0; k < burstKills; {
			if !store.Sleep(ctx, time.Duration(200+rng.IntN(1800))*time.Millisecond) {
				return
			}
			victim := pickVictim(ctx, procs, rng, modes[k])
			if victim == nil {
				killErr = fmt.Errorf("only %d of %d kills: no alloc left waiting or holding", k, burstKills)
				return
			}
			if victim.kill() {
				k++
			}
		}
	}()

	// Every alloc exits: a hung one fails the test.
	deadline := time.After(time.Until(start.Add(burstDeadline)))
	for _, p := range procs {
		select {
		case <-p.done:
		case <-deadline:
			var hung []string
			for _, p := range procs {
				select {
				case <-p.done:
				default:
					hung = append(hung, fmt.Sprintf("alloc #%d (%s): %s", p.i, p.describe(), lastLines(p.stderr.String(), 3)))
					_ = p.cmd.Process.Kill()
				}
			}
			t.Fatalf("%d allocs still running %s after the burst started:\n%s", len(hung), burstDeadline, strings.Join(hung, "\n"))
		}
	}
	burstTook := time.Since(start)
	<-killerDone
	if killErr != nil {
		t.Error(killErr)
	}

	// Outcomes: the killed died of SIGKILL; every other alloc was granted, ran its
	// command and exited with its code 0.
	var killedPending, killedHolding, grantedAfterDeath, grantedByAllocs, unseen int
	var lastKill, lastExit time.Time
	var lockLife []time.Duration // per killed holder: from its death to its last key gone
	for _, p := range procs {
		p.mu.Lock()
		ended, killedAt, holding, granted, id := p.ended, p.killedAt, p.holdingAtKill, !p.granted.IsZero(), p.id
		p.mu.Unlock()
		if ended.After(lastExit) {
			lastExit = ended
		}
		if granted {
			grantedByAllocs++
			if _, seen := obs.grantedAt(id); !seen {
				unseen++ // granted and released between two reads of a starved observer
			}
		}
		ws, _ := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
		if killedAt.IsZero() {
			if p.cmd.ProcessState.ExitCode() != 0 || !granted {
				t.Errorf("alloc #%d (%s) ended with %v (granted: %v), want its command's exit code 0; stderr:\n%s",
					p.i, p.describe(), p.cmd.ProcessState, granted, p.stderr.String())
			}
			continue
		}
		if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Errorf("alloc #%d was SIGKILLed but ended with %v", p.i, p.cmd.ProcessState)
		}
		if killedAt.After(lastKill) {
			lastKill = killedAt
		}
		if holding {
			killedHolding++
		} else {
			killedPending++
			if at, ok := obs.grantedAt(id); ok && at.After(killedAt) {
				grantedAfterDeath++
			}
		}
	}
	if killedPending+killedHolding == burstKills && (killedPending == 0 || killedHolding == 0) {
		t.Errorf("killed %d waiting and %d holding: the test must kill both", killedPending, killedHolding)
	}

	// 25 s after the last holder died (killed, or exited after its release), nothing is
	// left: wait (the observer sees every change) until the held keys are gone or that
	// bound has passed, then read Consul afresh.
	bound := lastExit.Add(allocator.ReleaseBound)
	for time.Now().Before(bound) && len(obs.leftover()) > 0 {
		time.Sleep(50 * time.Millisecond)
	}
	entries, _, err := s.List(context.Background(), allocator.ClusterPrefix)
	if err != nil {
		t.Fatalf("read Consul's keys: %v", err)
	}
	var orphans []string
	for _, e := range entries {
		if isHeldKey(e.Key) {
			orphans = append(orphans, fmt.Sprintf("%s=%s (session %q)", e.Key, e.Value, e.Session))
		}
	}
	if len(orphans) > 0 {
		t.Errorf("%d keys left %s after the last holder died:\n%s", len(orphans), time.Since(lastExit).Round(time.Second), strings.Join(orphans, "\n"))
	}
	sessions, err := allocSessions(consul)
	if err != nil {
		t.Errorf("list Consul's sessions: %v", err)
	} else if len(sessions) > 0 {
		t.Errorf("%d alloc sessions left after every holder died: %v", len(sessions), sessions)
	}
	// Each killed holder's keys went within the bound of its own death.
	var lastLockGone time.Time
	var seenLate time.Duration // the latest start of a read that saw a killed holder's key, after its death
	for _, p := range procs {
		p.mu.Lock()
		killedAt, id := p.killedAt, p.id
		p.mu.Unlock()
		if killedAt.IsZero() {
			continue
		}
		gone, ok := obs.goneAt(id)
		if !ok {
			t.Errorf("alloc #%d's keys (request %s) are still there", p.i, id)
			continue
		}
		life := max(gone.Sub(killedAt), 0)
		lockLife = append(lockLife, life)
		if gone.After(lastLockGone) {
			lastLockGone = gone
		}
		// A read begun past the bound that still saw its keys is a lock held too long;
		// an answer that merely came late (a starved observer) is not.
		late := obs.seenAfter(id).Sub(killedAt)
		seenLate = max(seenLate, late)
		if late > allocator.ReleaseBound {
			t.Errorf("alloc #%d (request %s) was killed at +%s; a read begun %s later still saw its keys, past the %s bound",
				p.i, id, killedAt.Sub(start).Round(time.Millisecond), late.Round(time.Millisecond), allocator.ReleaseBound)
		}
	}
	slices.Sort(lockLife)

	snaps, states, gaps, violations, distinct, grantsSeen := obs.figures()
	gap := func(q float64) time.Duration {
		if len(gaps) == 0 {
			return 0
		}
		return gaps[min(len(gaps)-1, int(q*float64(len(gaps))))].Round(time.Millisecond)
	}
	doubles := 0
	for _, v := range distinct {
		if v.Kind == allocator.DoubleBooked {
			doubles++
		}
	}
	t.Logf("burst: %d allocs (1-2 nodes × 1-8 GPUs, holding 0.5-3 s) on %d nodes × 8 GPUs; all exited %s after the start",
		burstRequests, burstNodes, burstTook.Round(100*time.Millisecond))
	t.Logf("snapshots of Consul's keys checked: %d (%d distinct states; between two reads: median %s, 99th percentile %s, max %s)",
		snaps, states, gap(0.5), gap(0.99), gap(1))
	t.Logf("double-booked GPUs: %d; grants not whole: %d (in %d snapshots with a violation)", doubles, len(distinct)-doubles, violations)
	t.Logf("grants made: %d seen granted in Consul, %d allocs told they were granted (%d of those never seen: made and released between two reads)",
		grantsSeen, grantedByAllocs, unseen)
	t.Logf("holders killed: %d (%d waiting, of which %d granted after their death; %d holding), the last %s after the start",
		killedPending+killedHolding, killedPending, grantedAfterDeath, killedHolding, lastKill.Sub(start).Round(time.Millisecond))
	if len(lockLife) > 0 {
		t.Logf("killed holders' keys gone after their death (first answer without them): median %s, max %s; "+
			"last seen by a read begun %s after the death (bound %s); the last lock went %s after the last kill",
			lockLife[len(lockLife)/2].Round(time.Millisecond), lockLife[len(lockLife)-1].Round(time.Millisecond),
			seenLate.Round(time.Millisecond), allocator.ReleaseBound, lastLockGone.Sub(lastKill).Round(time.Millisecond))
	}
	t.Logf("orphaned locks %s after the last holder died: %d; alloc sessions left: %d", allocator.ReleaseBound, len(orphans), len(sessions))
	for i, v := range distinct {
		if i == 20 {
			t.Errorf("... and %d more", len(distinct)-20)
			break
		}
		t.Errorf("%s", v)
	}
}

// burstProc is one `gangrun alloc` of the burst.
type burstProc struct {
	i           int
	nodes, gpus int
	hold        time.Duration
	cmd         *exec.Cmd
	stdout      *lineWriter
	stderr      *lineWriter
	done        chan struct{} // closed when the process has exited and been reaped

	mu            sync.Mutex
	id            string    // the request id, once alloc said it submitted
	granted       time.Time // when alloc said it was granted
	ended         time.Time
	killedAt      time.Time // when a SIGKILL that ended it was sent
	holdingAtKill bool      // it had said it was granted when it was killed
	victim        bool      // picked by the killer
}

var submittedRE = regexp.MustCompile(`^gangrun alloc: request ([0-9a-f]+) submitted`)

// start starts p; a goroutine reaps it and closes p.done.
func (p *burstProc) start(consul, mark string) error {
	p.cmd = exec.Command(gangrunBin, "alloc", "--consul", consul, "--nodes", strconv.Itoa(p.nodes),
		"--gpus-per-node", strconv.Itoa(p.gpus), "--wait", burstWait.String(), "--",
		"sleep", strconv.FormatFloat(p.hold.Seconds(), 'f', 3, 64))
	p.cmd.Env = append(os.Environ(), mark)
	p.stdout = &lineWriter{onLine: func(line string) {
		if strings.HasPrefix(line, "granted ") {
			p.mu.Lock()
			p.granted = time.Now()
			p.mu.Unlock()
		}
	}}
	p.stderr = &lineWriter{onLine: func(line string) {
		if m := submittedRE.FindStringSubmatch(line); m != nil {
			p.mu.Lock()
			p.id = m[1]
			p.mu.Unlock()
		}
	}}
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	// The command inherits alloc's output: should it outlive a killed alloc, Wait
	// returns anyway (and testMark reports it).
	p.cmd.WaitDelay = 10 * time.Second
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start alloc #%d: %w", p.i, err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.mu.Lock()
		p.ended = time.Now()
		p.mu.Unlock()
		close(p.done)
	}()
	return nil
}

// stop kills p if a failure of the test left it running.
func (p *burstProc) stop() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// state says whether p waits (submitted, not granted) or holds its grant, while alive.
func (p *burstProc) state() (waiting, holding bool) {
	select {
	case <-p.done:
		return false, false
	default:
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.victim || p.id == "" {
		return false, false
	}
	return p.granted.IsZero(), !p.granted.IsZero()
}

// kill SIGKILLs p and reports whether it died of it (it may have exited just before).
func (p *burstProc) kill() bool {
	p.mu.Lock()
	p.victim = true
	holding := !p.granted.IsZero()
	p.mu.Unlock()
	at := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return false // already reaped
	}
	<-p.done
	ws, _ := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return false
	}
	p.mu.Lock()
	p.killedAt = at
	// What it had said by its death counts: a grant it printed while the signal was on
	// its way was held.
	p.holdingAtKill = holding || !p.granted.IsZero()
	p.mu.Unlock()
	return true
}

func (p *burstProc) describe() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprintf("request %s, %d×%d GPUs, hold %s", p.id, p.nodes, p.gpus, p.hold)
}

// pickVictim waits (at most 30 s) for an alloc that holds its grant (holder) or waits
// for one, and returns a random one; the other kind when none of the kind asked for
// comes; nil when no alloc is left in either state.
func pickVictim(ctx context.Context, procs []*burstProc, rng *rand.Rand, holder bool) *burstProc {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var want, other []*burstProc
		for _, p := range procs {
			waiting, holding := p.state()
			switch {
			case holding == holder && (waiting || holding):
				want = append(want, p)
			case waiting || holding:
				other = append(other, p)
			}
		}
		switch {
		case len(want) > 0:
			return want[rng.IntN(len(want))]
		case time.Now().After(deadline) && len(other) > 0:
			return other[rng.IntN(len(other))]
		case time.Now().After(deadline) || ctx.Err() != nil:
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lineWriter keeps a process's output and calls onLine for each complete line.
type lineWriter struct {
	mu     sync.Mutex
	all    bytes.Buffer
	part   []byte
	onLine func(string)
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.all.Write(b)
	w.part = append(w.part, b...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			return len(b), nil
		}
		w.onLine(string(w.part[:i]))
		w.part = w.part[i+1:]
	}
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.all.String()
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

// isHeldKey says whether key holds GPUs or waits for them (docs/cluster.md, "How a gang
// is granted"): none may be left once their holders are dead.
func isHeldKey(key string) bool {
	for _, kind := range [...]string{"gpus/", "grants/", "requests/"} {
		if strings.HasPrefix(key, allocator.ClusterPrefix+kind) {
			return true
		}
	}
	return false
}

// keyObserver reads gangrun/cluster/ as often as it can and checks every state it reads
// with allocator.CheckInvariants: a watcher (blocking queries, each returning as soon as
// something changed) and a poller (consistent reads back to back). It also remembers,
// per request id, the start of the latest read that still saw one of its keys (the key
// existed at that moment or later: a sound lower bound however late the answer comes on
// a starved machine), and when the watcher's reads first showed them gone.
type keyObserver struct {
	mu        sync.Mutex
	snapshots int
	states    map[uint64]bool                // fingerprints of the distinct states read
	last      time.Time                      // the last read's answer
	gaps      []time.Duration                // between consecutive answers
	violating int                            // snapshots with a violation
	distinct  map[string]allocator.Violation // by its text
	granted   map[string]time.Time           // id → first seen granted
	seenSince map[string]time.Time           // id → start of the latest read that saw its keys
	present   map[string]bool                // ids with a key in the watcher's last read
	gone      map[string]time.Time           // id → the watcher's first answer without its keys
	lastHeld  []string                       // held keys in the watcher's last read
}

func newKeyObserver() *keyObserver {
	return &keyObserver{states: map[uint64]bool{}, distinct: map[string]allocator.Violation{}, granted: map[string]time.Time{},
		seenSince: map[string]time.Time{}, present: map[string]bool{}, gone: map[string]time.Time{}, lastHeld: []string{"(no snapshot yet)"}}
}

// run observes until ctx ends.
func (o *keyObserver) run(ctx context.Context, s store.Store) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			began := time.Now()
			entries, idx, err := s.List(ctx, allocator.ClusterPrefix)
			if err == nil {
				o.check(entries, idx, began)
			}
		}
	}()
	defer wg.Wait()
	w := store.NewWatcher(s, allocator.ClusterPrefix)
	for {
		began := time.Now()
		entries, err := w.Next(ctx)
		if err != nil {
			return // ctx ended (the watcher retries everything else)
		}
		now, ids, held := o.check(entries, w.Index(), began)
		o.mu.Lock()
		for id := range o.present {
			if !ids[id] {
				o.gone[id] = now
			}
		}
		for id := range ids {
			delete(o.gone, id) // back (never expected): gone only when gone for good
		}
		o.present, o.lastHeld = ids, held
		o.mu.Unlock()
	}
}

// check checks one read of the keys, begun at began, and returns when its answer came,
// the request ids with a key in it and its held keys.
func (o *keyObserver) check(entries []store.Entry, index uint64, began time.Time) (time.Time, map[string]bool, []string) {
	now := time.Now()
	c, vs := allocator.CheckInvariants(entries, index)
	h := fnv.New64a()
	ids := map[string]bool{}
	var held []string
	for _, e := range entries {
		fmt.Fprintf(h, "%s|%d|%s\n", e.Key, e.ModifyIndex, e.Session) // a value changes only with its ModifyIndex
		if !isHeldKey(e.Key) {
			continue
		}
		held = append(held, e.Key)
		if strings.HasPrefix(e.Key, allocator.ClusterPrefix+"gpus/") {
			ids[string(e.Value)] = true
		} else {
			ids[e.Key[strings.LastIndexByte(e.Key, '/')+1:]] = true
		}
	}
	state := h.Sum64()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.snapshots++
	o.states[state] = true
	if !o.last.IsZero() {
		o.gaps = append(o.gaps, now.Sub(o.last))
	}
	o.last = now
	if len(vs) > 0 {
		o.violating++
	}
	for _, v := range vs {
		o.distinct[v.String()] = v
	}
	for id, g := range c.Grants {
		if at, seen := o.granted[id]; g.State == allocator.GrantGranted && (!seen || now.Before(at)) {
			o.granted[id] = now
		}
	}
	for id := range ids {
		if began.After(o.seenSince[id]) {
			o.seenSince[id] = began
		}
	}
	return now, ids, held
}

// leftover returns the held keys (GPU locks, grants, requests) of the last snapshot.
func (o *keyObserver) leftover() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.lastHeld
}

func (o *keyObserver) grantedAt(id string) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	at, ok := o.granted[id]
	return at, ok
}

// seenAfter returns the start of the latest read that saw a key of request id.
func (o *keyObserver) seenAfter(id string) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.seenSince[id]
}

// goneAt returns when the last key of request id went (false: seen, and still there).
func (o *keyObserver) goneAt(id string) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	at, ok := o.gone[id]
	return at, ok
}

// figures returns the snapshots read, the distinct states among them, the times
// between consecutive reads (sorted), the snapshots with a violation, the distinct
// violations (sorted) and the grants seen granted.
func (o *keyObserver) figures() (snapshots, states int, gaps []time.Duration, violating int, distinct []allocator.Violation, granted int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	keys := make([]string, 0, len(o.distinct))
	for k := range o.distinct {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		distinct = append(distinct, o.distinct[k])
	}
	gaps = slices.Clone(o.gaps)
	slices.Sort(gaps)
	return o.snapshots, len(o.states), gaps, o.violating, distinct, len(o.granted)
}

// allocSessions lists the Consul sessions of alloc requesters ("gangrun alloc <id>").
func allocSessions(consul string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+consul+"/v1/session/list", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/session/list: %s", resp.Status)
	}
	var sessions []struct{ ID, Name string }
	if err := json.NewDecoder(resp.Body).Decode(&sessions); err != nil {
		return nil, fmt.Errorf("decode /v1/session/list: %w", err)
	}
	var out []string
	for _, s := range sessions {
		if strings.HasPrefix(s.Name, "gangrun alloc ") {
			out = append(out, s.Name+" "+s.ID)
		}
	}
	return out, nil
}
