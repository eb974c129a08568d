package launcher

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/failure"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/rendezvous"
)

// The Supervisor's loop: Run, the worker group's states (GroupState) and the step of
// each, top to bottom in the order a round goes through them (INIT, HEALTHY, then
// SUCCEEDED, FAILED, UNHEALTHY or STOPPED), as torch's elastic agent's _invoke_run
// (torch/distributed/elastic/agent/server/api.py), and the waits between them. How
// the processes are set up, started and stopped is in processes.go, the standbys in
// warm.go, and what a signal sent to gangrun means in signals.go.

// Run supervises the job until it succeeds, runs out of restarts, or is stopped, and
// returns how it ended. It never panics on worker behaviour.
func (s *Supervisor) Run(ctx context.Context) Result {
	var undo cleanups
	defer func() { undo.run() }()
	if err := s.setUp(&undo); err != nil {
		return Result{ExitCode: 1, Err: err}
	}
	return s.loop(ctx)
}

// loop moves the worker group between its states (GroupState), as torch's elastic
// agent's _invoke_run does (torch/distributed/elastic/agent/server/api.py): each
// state's step returns the next state, or done when the run ends.
func (s *Supervisor) loop(ctx context.Context) Result {
	var res Result
	var at attempt
	state := StateInit
	s.setState(state, &at)
	for {
		var next GroupState
		var done bool
		switch state {
		case StateInit:
			next, done = s.begin(ctx, &at, &res)
		case StateHealthy:
			next = s.watch(ctx, &at)
		case StateSucceeded:
			next, done = s.succeeded(ctx, &at, &res)
		case StateFailed:
			next, done = s.failed(ctx, &at, &res)
		case StateUnhealthy:
			next, done = s.unhealthy(ctx, &at, &res)
		case StateStopped:
			_ = at.round.Leave(context.WithoutCancel(ctx))
			s.log.Info("forwarding signal to workers and stopping", zap.String("signal", proc.SignalName(at.out.sig)), zap.Duration("term_timeout", s.cfg.TermTimeout))
			s.stop(at.g, at.out.sig, at.round.End().KillBy)
			res.ExitCode = 128 + int(at.out.sig)
			done = true
		}
		if done {
			return res
		}
		s.setState(next, &at)
		state = next
	}
}

// GroupState is the state of this node's worker group, in the names of torch's elastic
// agent (torch/distributed/elastic/agent/server/api.py, WorkerState).
type GroupState string

// The worker group's states. Run starts in INIT and moves: INIT → HEALTHY (workers
// started); HEALTHY → SUCCEEDED (every worker exited 0), FAILED (a worker here failed,
// or the gang hung), UNHEALTHY (the round ended elsewhere: another node failed, the
// membership changed, or this node's lease with the coordinator is over) or STOPPED (a
// signal to gangrun); SUCCEEDED, FAILED and UNHEALTHY → INIT (the next round) or the
// end of the run; STOPPED ends it.
const (
	StateInit      GroupState = "INIT"
	StateHealthy   GroupState = "HEALTHY"
	StateUnhealthy GroupState = "UNHEALTHY"
	StateFailed    GroupState = "FAILED"
	StateSucceeded GroupState = "SUCCEEDED"
	StateStopped   GroupState = "STOPPED"
)

// attempt is what the states of one round share.
type attempt struct {
	round   rendezvous.Round
	a       rendezvous.Assignment
	g       *group
	out     outcome
	started time.Time // when its workers started
}

// outcomeKind says how monitoring an attempt ended.
type outcomeKind int

const (
	outSucceeded outcomeKind = iota // every local worker exited 0
	outFailed                       // a local worker failed, or the gang hung
	outEnded                        // the round ended elsewhere
	outStopped                      // gangrun was told to stop
)

// outcome is how monitoring an attempt ended: its kind, and the root cause and its
// worker for outFailed or the terminating signal for outStopped.
type outcome struct {
	kind    outcomeKind
	failure *rendezvous.Failure
	failed  *worker // the root-cause worker when kind is outFailed; nil for a hang
	sig     syscall.Signal
}

// setState records that the worker group is now in state st (INIT again starts the
// next round; any other state entered twice is recorded once).
func (s *Supervisor) setState(st GroupState, at *attempt) {
	if st == s.state && st != StateInit {
		return
	}
	s.state = st
	e := event.Event{Time: time.Now(), Kind: event.StateChanged, Job: s.cfg.JobID, Node: s.cfg.NodeName, Attempt: -1, State: string(st)}
	if at.round != nil {
		e.Attempt = at.a.Round
	}
	s.events.Emit(e)
}

// begin is INIT: it joins the next round and starts this node's workers (HEALTHY), or
// ends the run (the job finished meanwhile, a signal, an error).
func (s *Supervisor) begin(ctx context.Context, at *attempt, res *Result) (GroupState, bool) {
	round, done := s.joinNext(ctx, at, res)
	if done {
		return "", true
	}
	*at = attempt{round: round, a: round.Assignment()}
	if end := round.End(); end.Lost {
		// The lease ran out between the round's closing and now (a stall): nothing of
		// this round may be written or started.
		s.log.Warn("the round was lost before its workers started: joining the next", zap.String("reason", end.Detail))
		return StateInit, false
	}
	s.checkResume(at)
	a := at.a
	s.pin(a.ResumeFrom)
	s.fence(a)
	s.events.Emit(event.Event{Time: time.Now(), Kind: event.CheckpointChosen, Job: s.cfg.JobID, Node: s.cfg.NodeName,
		Attempt: a.Round, Checkpoint: a.ResumeFrom})
	specs, err := s.specs(a)
	if err == nil {
		err = s.serveStore(a)
	}
	if err != nil {
		s.failStart(ctx, round, err, res)
		return "", true
	}
	s.log.Info("starting workers", s.attemptFields(a)...)
	g, err := s.startAttempt(at, specs)
	if err != nil {
		s.closeStore()
		s.failStart(ctx, round, err, res)
		res.ExitCode = StartExitCode(err, res.ExitCode)
		return "", true
	}
	at.g = g
	res.Attempts++
	s.afterStart(a, g, specs)
	return StateHealthy, false
}

// joinNext joins the next round for begin. done reports that the run ends instead, res
// saying how: a terminating signal (STOPPED), the job finished while this node waited
// for room (its end reported as its nodes did: 0, or the root cause's code), or the
// rendezvous' error.
func (s *Supervisor) joinNext(ctx context.Context, at *attempt, res *Result) (round rendezvous.Round, done bool) {
	round, sig, err := s.join(ctx)
	if sig != 0 {
		s.setState(StateStopped, at)
		res.ExitCode = 128 + int(sig)
		return nil, true
	}
	var finished *rendezvous.JobFinishedError
	if errors.As(err, &finished) {
		res.Err, res.Failure = err, finished.Failure
		switch {
		case finished.Succeeded:
			s.log.Info(finished.Error())
			res.Err = nil
		case finished.Failure != nil && finished.Failure.ExitCode != 0:
			s.log.Error(finished.Error())
			res.ExitCode = finished.Failure.ExitCode
		default:
			s.log.Error(finished.Error())
			res.ExitCode = 1
		}
		return nil, true
	}
	if err != nil {
		res.ExitCode, res.Err = 1, err
		return nil, true
	}
	return round, false
}

// checkResume drops from at's assignment a checkpoint to resume from outside this
// job's checkpoint directory: never a choice of gangrun's (it picks among the
// directory's checkpoints), and loading it would hand the workers someone else's files
// (a pickle runs code).
func (s *Supervisor) checkResume(at *attempt) {
	if at.a.ResumeFrom == "" || beneath(s.cfg.CheckpointDir, at.a.ResumeFrom) {
		return
	}
	s.log.Warn("the round names a checkpoint to resume from outside the checkpoint directory: starting without it",
		zap.String("resume_from", at.a.ResumeFrom), zap.String("checkpoint_dir", s.cfg.CheckpointDir))
	at.a.ResumeFrom = ""
}

// failStart reports to the gang that this node's workers of round could not start
// (err, a start error of no rank) and ends the run with exit code 1.
func (s *Supervisor) failStart(ctx context.Context, round rendezvous.Round, err error, res *Result) {
	_ = round.Fail(ctx, rendezvous.Failure{Node: s.cfg.NodeName, Rank: -1, LocalRank: -1, ExitCode: 1, Kind: failure.StartError, Reason: err.Error()})
	res.ExitCode, res.Err = 1, err
}

// attemptFields are the log fields of "starting workers" for assignment a.
func (s *Supervisor) attemptFields(a rendezvous.Assignment) []zap.Field {
	fields := []zap.Field{zap.Int("attempt", a.Round), zap.Int("restarts", a.RestartCount),
		zap.Int("max_restarts", s.cfg.MaxRestarts), zap.Int("node_rank", a.NodeRank),
		zap.Int("nnodes", a.NNodes), zap.Int("world_size", a.WorldSize),
		zap.String("master", a.MasterEndpoint())}
	if a.ResumeFrom != "" {
		fields = append(fields, zap.String("resume_from", a.ResumeFrom))
	}
	return fields
}

// watch is HEALTHY: it monitors the workers until the attempt ends, and names the state
// that follows.
func (s *Supervisor) watch(ctx context.Context, at *attempt) GroupState {
	at.out = s.monitor(ctx, at.g, at.round, at.a)
	switch at.out.kind {
	case outSucceeded:
		return StateSucceeded
	case outFailed:
		return StateFailed
	case outStopped:
		return StateStopped
	}
	return StateUnhealthy
}

// monitor watches one attempt until it ends.
func (s *Supervisor) monitor(ctx context.Context, g *group, round rendezvous.Round, a rendezvous.Assignment) outcome {
	var hang <-chan time.Time
	if s.cfg.HangTimeout > 0 {
		t := time.NewTicker(hangCheckInterval(s.cfg.HangTimeout))
		defer t.Stop()
		hang = t.C
	}
	var reap <-chan time.Time
	if s.cfg.Subreaper {
		// Orphans of the workers' descendants are re-parented here: reap those that
		// exit while the attempt runs, so zombies do not pile up over a long job.
		t := time.NewTicker(zombieReapEvery)
		defer t.Stop()
		reap = t.C
	}
	var watchdog <-chan time.Time
	if s.timer != nil {
		t := time.NewTicker(100 * time.Millisecond) // torch's FileTimerServer's max_interval
		defer t.Stop()
		watchdog = t.C
	}
	var warmUp <-chan time.Time
	if s.warm.nextSpecs != nil {
		t := time.NewTimer(time.Until(s.started.Add(s.cfg.WarmDelay)))
		defer t.Stop()
		warmUp = t.C
	}
	remaining := len(g.workers)
	for {
		select {
		case <-warmUp:
			s.prepareStandbys(s.warm.nextSpecs)
			s.warm.nextSpecs = nil
		case <-watchdog:
			if r, ok := s.timer.expired(time.Now()); ok {
				if w := g.workerOf(r.PID); w != nil {
					return s.hung(g, w, failure.Watchdog, fmt.Sprintf("watchdog timer %q expired (torch.distributed.elastic.timer); every rank's stack is in its stderr", r.Scope))
				}
				s.timer.forget(r) // a pid of no worker of this attempt
			}
		case <-reap:
			keep := s.standbyPids(g.pids()) // exited leaders are reaped by their Release
			keep[s.guard.Pid()] = true
			proc.ReapZombies(keep)
		case i := <-g.exits:
			w := g.workers[i]
			st := w.reap(s.guard)
			if round.End().Lost {
				// The lease is over (this process may just have woken from a stall, and
				// the guardian killed the workers meanwhile): that, not the worker, ended
				// the attempt.
				return outcome{kind: outEnded}
			}
			if !st.Success() {
				return outcome{kind: outFailed, failure: s.failureOf(a, w), failed: w}
			}
			remaining--
			if remaining == 0 {
				return outcome{kind: outSucceeded}
			}
		case <-round.Ended():
			return outcome{kind: outEnded}
		case in := <-s.cfg.Signals:
			if stop := s.signalWhileRunning(g, in); stop != 0 {
				return outcome{kind: outStopped, sig: stop}
			}
		case <-hang:
			w, age, newest := g.heartbeats(s.started, s.cfg.HangTimeout)
			s.act.touchAt(newest) // a heartbeat is activity, as a line of output is
			if w != nil {
				return s.hung(g, w, failure.Hang, fmt.Sprintf("no heartbeat for %s, the longest of any rank (--hang-timeout %s); every rank's stack is in its stderr",
					age.Round(time.Second), s.cfg.HangTimeout))
			}
			if idle := time.Since(round.Activity(ctx, s.act.lastTime())); idle >= s.cfg.HangTimeout {
				return s.hung(g, nil, failure.Hang, fmt.Sprintf("no output from any rank for %s (--hang-timeout %s)", idle.Round(time.Second), s.cfg.HangTimeout))
			}
		case <-ctx.Done():
			return outcome{kind: outStopped, sig: syscall.SIGTERM}
		}
	}
}

// zombieReapEvery is how often a subreaper supervisor reaps exited orphans during an
// attempt.
const zombieReapEvery = 5 * time.Second

// hangCheckInterval is how often --hang-timeout is checked: a tenth of it, between
// 100ms and 5s.
func hangCheckInterval(d time.Duration) time.Duration {
	return min(max(d/10, 100*time.Millisecond), 5*time.Second)
}

// succeeded is SUCCEEDED: this node's workers all exited 0; it reports that and waits
// for the gang. The run ends when the gang succeeded (or can no longer be asked);
// otherwise the round ended elsewhere and the gang goes on.
func (s *Supervisor) succeeded(ctx context.Context, at *attempt, res *Result) (GroupState, bool) {
	s.stop(at.g, 0, time.Time{})
	end, sig, err := s.awaitSuccess(ctx, at.round)
	if sig != 0 {
		s.setState(StateStopped, at)
		res.ExitCode = 128 + int(sig)
		return "", true
	}
	if end.Kind == rendezvous.Succeeded {
		s.log.Info("all workers finished", zap.Int("attempt", at.a.Round))
		s.events.Emit(event.Event{Time: time.Now(), Kind: event.RoundEnded, Job: s.cfg.JobID, Node: s.cfg.NodeName,
			Attempt: at.a.Round, Cause: end.Kind.String()})
		res.ExitCode = 0
		return "", true
	}
	if err != nil || end.Lost {
		// This node's workers all finished, and the coordinator can no longer say how
		// the others did. Starting them again would run a finished job a second time;
		// each other node's gangrun reports its own end.
		reason := end.Detail
		if err != nil {
			reason = err.Error()
		}
		s.log.Warn("this node's workers all finished; the other nodes' outcome is unknown: the rendezvous was lost",
			zap.Int("attempt", at.a.Round), zap.String("reason", reason))
		res.ExitCode = 0
		return "", true
	}
	return s.next(ctx, at, res)
}

// failed is FAILED: a worker of this node failed (or the gang hung). It tells the gang
// first, so the other nodes stop at once, reports the root cause and stops the workers.
func (s *Supervisor) failed(ctx context.Context, at *attempt, res *Result) (GroupState, bool) {
	out := at.out
	_ = at.round.Fail(ctx, *out.failure)
	if out.failed != nil {
		// The report says "see its output above": let the worker's last lines (its
		// traceback) reach the console first.
		out.failed.awaitOutput(reportOutputWait)
	}
	s.report(at.a, out.failure)
	s.events.Emit(event.Event{Time: time.Now(), Kind: event.WorkerFailed, Job: s.cfg.JobID, Node: s.cfg.NodeName,
		Attempt: at.a.Round, Rank: out.failure.Rank, ExitCode: out.failure.ExitCode, Failure: out.failure.Kind,
		Cause: out.failure.Reason, Detail: out.failure.Message})
	s.stop(at.g, syscall.SIGTERM, at.round.End().KillBy)
	return s.next(ctx, at, res)
}

// unhealthy is UNHEALTHY: the round ended elsewhere (or this node's lease is over); it
// stops the workers, by the lease's kill time when one applies.
func (s *Supervisor) unhealthy(ctx context.Context, at *attempt, res *Result) (GroupState, bool) {
	end := at.round.End()
	if end.Lost {
		fields := []zap.Field{zap.String("reason", end.Detail)}
		if !end.KillBy.IsZero() {
			// The lease's kill time; none when the job's state went (the stop timeout applies).
			fields = append(fields, zap.Duration("kill_in", time.Until(end.KillBy).Round(100*time.Millisecond)))
		}
		s.log.Warn("stopping this node's workers: the round is over for this node", fields...)
	}
	s.stop(at.g, syscall.SIGTERM, end.KillBy)
	return s.next(ctx, at, res)
}

// next decides, once a round's workers are stopped, how the run goes on: after a failed
// round, a restart (INIT, after the backoff) while the budget lasts, else the end with
// the root cause's code; after a membership change, the next round at once.
func (s *Supervisor) next(ctx context.Context, at *attempt, res *Result) (GroupState, bool) {
	a := at.a
	end := at.round.End()
	if s.stopSignal != 0 {
		// Told to stop while the workers were stopping: no next round.
		_ = at.round.Leave(context.WithoutCancel(ctx))
		s.log.Info("stopping: a signal arrived while the workers were stopping", zap.String("signal", proc.SignalName(s.stopSignal)))
		s.setState(StateStopped, at)
		res.ExitCode = 128 + int(s.stopSignal)
		return "", true
	}
	detail, kind := end.Detail, failure.Kind("")
	if end.Failure != nil {
		detail, kind = end.Failure.String(), end.Failure.Kind
	}
	s.events.Emit(event.Event{Time: time.Now(), Kind: event.RoundEnded, Job: s.cfg.JobID, Node: s.cfg.NodeName,
		Attempt: a.Round, Cause: end.Kind.String(), Detail: detail, Failure: kind})
	switch end.Kind {
	case rendezvous.Failed:
		res.Failure = end.Failure
		if end.Failure != nil && end.Failure.Node != s.cfg.NodeName {
			s.log.Warn("gang failed on another node", zap.String("root_cause", end.Failure.String()))
		}
		used := a.RestartCount + 1
		if end.OutOfRestarts { // the rendezvous judges the budget (the run's, which a job may raise)
			code := 1
			if end.Failure != nil && end.Failure.ExitCode != 0 {
				code = end.Failure.ExitCode
			}
			s.log.Error("no restarts left", zap.Int("restarts", a.RestartCount), zap.Int("max_restarts", s.cfg.MaxRestarts), zap.Int("exit_code", code))
			s.setState(StateFailed, at)
			res.ExitCode = code
			return "", true
		}
		if end.Failure != nil && s.cfg.NoRestartExitCode != 0 && end.Failure.ExitCode == s.cfg.NoRestartExitCode {
			s.log.Error("a worker exited with the no-restart code: the run ends without a restart",
				zap.Int("exit_code", end.Failure.ExitCode), zap.String("root_cause", end.Failure.String()))
			s.setState(StateFailed, at)
			res.ExitCode = end.Failure.ExitCode
			return "", true
		}
		if s.cfg.NoRestart != nil {
			if why := s.cfg.NoRestart(); why != "" {
				code := 1
				if end.Failure != nil && end.Failure.ExitCode != 0 {
					code = end.Failure.ExitCode
				}
				s.log.Warn("no restart: "+why, zap.Int("exit_code", code))
				s.setState(StateFailed, at)
				res.ExitCode = code
				return "", true
			}
		}
		newest := s.newestCheckpoint() // one listing of the directory for both judgements
		progressed := s.progressed(at, newest)
		s.strike(a.ResumeFrom, newest)
		delay := time.Duration(0)
		if progressed {
			s.stuck = 0
		} else {
			s.stuck++
			delay = s.cfg.Backoff.Delay(s.stuck)
		}
		s.log.Info("restarting the gang", zap.Int("restart", used), zap.Int("max_restarts", s.cfg.MaxRestarts),
			zap.Bool("progressed", progressed), zap.Duration("backoff", delay))
		cause := ""
		if end.Failure != nil {
			cause = end.Failure.Reason
		}
		s.events.Emit(event.Event{Time: time.Now(), Kind: event.Restarting, Job: s.cfg.JobID, Node: s.cfg.NodeName,
			Attempt: a.Round, Cause: cause, Failure: kind, Detail: "backoff " + delay.String()})
		if sig := s.sleep(ctx, delay); sig != 0 {
			s.setState(StateStopped, at)
			res.ExitCode = 128 + int(sig)
			return "", true
		}
	case rendezvous.MembershipChanged:
		s.log.Info("gang membership changed: re-forming", zap.String("detail", end.Detail))
	default:
		// Succeeded ends the run in succeeded; a round still running here has been left.
	}
	return StateInit, false
}

// join joins the next round, giving up when gangrun is told to stop.
func (s *Supervisor) join(ctx context.Context) (rendezvous.Round, syscall.Signal, error) {
	jctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type joined struct {
		r   rendezvous.Round
		err error
	}
	ch := make(chan joined, 1)
	req := rendezvous.JoinRequest{
		Node: s.cfg.NodeName, Addr: s.cfg.Addr, LocalWorldSize: s.cfg.NProcPerNode,
		Switch: s.cfg.Switch, MasterPort: s.cfg.MasterPort, ChooseResume: s.chooseResume,
		OnLease: s.onLease,
	}
	if s.cfg.Env.AgentStore {
		req.StoreRound = s.storeRound // node rank 0's gangrun serves the store, and says its round there
	}
	go func() {
		r, err := s.rdzv.Join(jctx, req)
		ch <- joined{r, err}
	}()
	j, stop, byCtx := awaitOrStop(ctx, s.cfg.Signals, ch)
	if stop == 0 {
		if j.err != nil {
			return nil, 0, fmt.Errorf("rendezvous: %w", j.err)
		}
		return j.r, 0, nil
	}
	cancel()
	// A round joined meanwhile is left, unless Run's context ended.
	if j := <-ch; j.r != nil && !byCtx {
		_ = j.r.Leave(context.WithoutCancel(ctx))
	}
	return nil, stop, nil
}

// onLease hands the rendezvous' lease to the guardian: if this process is frozen when
// killBy passes, the guardian kills the workers in its place.
func (s *Supervisor) onLease(killBy time.Time) {
	if err := s.guard.KillBy(killBy); err != nil {
		s.log.Warn("guardian", zap.Error(err))
	}
}

// awaitSuccess reports this node's success and waits for the whole gang's. It returns
// how the round ended, the terminating signal that cut the wait short (0 if none), and
// the coordinator's error when the success could not be reported or waited for.
func (s *Supervisor) awaitSuccess(ctx context.Context, round rendezvous.Round) (rendezvous.End, syscall.Signal, error) {
	type result struct {
		end rendezvous.End
		err error
	}
	ch := make(chan result, 1)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		end, err := round.Succeed(sctx)
		ch <- result{end, err}
	}()
	r, stop, byCtx := awaitOrStop(ctx, s.cfg.Signals, ch)
	if stop == 0 {
		return r.end, 0, r.err
	}
	if !byCtx {
		cancel()
		_ = round.Leave(context.WithoutCancel(ctx))
	}
	return rendezvous.End{}, stop, nil
}

// sleep waits d, returning early with the signal that stops gangrun.
func (s *Supervisor) sleep(ctx context.Context, d time.Duration) syscall.Signal {
	if d <= 0 {
		return 0
	}
	t := time.NewTimer(d)
	defer t.Stop()
	_, stop, _ := awaitOrStop(ctx, s.cfg.Signals, t.C)
	return stop
}
