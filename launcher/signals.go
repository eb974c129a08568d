package launcher

import (
	"context"
	"os"
	"syscall"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/internal/proc"
)

// The signals sent to gangrun (Config.Signals) are read by whichever wait the worker
// group is in, but what each means is decided here, in one place:
//
//   - a terminating signal (proc.Terminating: SIGINT, SIGTERM, SIGHUP, SIGQUIT) stops
//     the run, and the end of Run's context counts as a SIGTERM;
//   - while the workers run (HEALTHY), any other signal (SIGUSR1, SIGUSR2) is
//     forwarded to each worker process, and logged;
//   - while the workers are being stopped, another signal is forwarded to them without
//     a log line, and a terminating one SIGKILLs them at once and ends the run after
//     them (Supervisor.stopSignal);
//   - while no worker runs (joining a round, awaiting the gang's success, the restart
//     backoff), any other signal is dropped;
//   - a value that is not a syscall.Signal is dropped everywhere.

// sigEvent is what one signal read from Config.Signals asks of the supervisor.
type sigEvent struct {
	// stop is the terminating signal that ends the run; 0 when the signal does not.
	stop syscall.Signal
	// forward is the other signal the workers are to receive; 0 when none.
	forward syscall.Signal
}

// eventOf turns a signal sent to gangrun into its event: a terminating signal stops,
// another syscall.Signal is forwarded, anything else asks nothing.
func eventOf(in os.Signal) sigEvent {
	ss, ok := in.(syscall.Signal)
	switch {
	case !ok:
		return sigEvent{}
	case proc.Terminating(ss):
		return sigEvent{stop: ss}
	}
	return sigEvent{forward: ss}
}

// awaitOrStop waits for a value on ch while no worker runs. It returns the value, or the
// terminating signal that cut the wait short (other signals are dropped), or SIGTERM
// with byCtx set when ctx ended first.
func awaitOrStop[T any](ctx context.Context, signals <-chan os.Signal, ch <-chan T) (v T, stop syscall.Signal, byCtx bool) {
	for {
		select {
		case v = <-ch:
			return v, 0, false
		case in := <-signals:
			if ev := eventOf(in); ev.stop != 0 {
				return v, ev.stop, false
			}
		case <-ctx.Done():
			return v, syscall.SIGTERM, true
		}
	}
}

// signalWhileRunning handles a signal that arrives while g's workers run: it returns
// the terminating signal that stops the run (Run leaves the round before forwarding
// it, so the other nodes see a membership change before their workers lose this
// node's), or forwards any other signal to the workers and returns 0.
func (s *Supervisor) signalWhileRunning(g *group, in os.Signal) syscall.Signal {
	ev := eventOf(in)
	if ev.forward != 0 {
		s.log.Info("forwarding signal to workers", zap.String("signal", proc.SignalName(ev.forward)))
		g.signal(ev.forward)
	}
	return ev.stop
}

// signalWhileStopping handles a signal that arrives while g's workers are being
// stopped: a terminating one is recorded as the run's stop signal (the first such;
// next ends the run once the workers are gone) and reports true, to SIGKILL the
// workers at once; any other is forwarded to them.
func (s *Supervisor) signalWhileStopping(g *group, in os.Signal) bool {
	ev := eventOf(in)
	if ev.stop != 0 {
		s.log.Warn("second signal: sending SIGKILL", zap.String("signal", proc.SignalName(ev.stop)))
		if s.stopSignal == 0 {
			s.stopSignal = ev.stop
		}
		return true
	}
	if ev.forward != 0 {
		g.signal(ev.forward)
	}
	return false
}
