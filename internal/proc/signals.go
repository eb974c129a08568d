package proc

import (
	"context"
	"os"
	"sync"
	"syscall"
)

// ForwardBuffer is how many signals a SignalWatch holds for its Forward channel; one
// that arrives while the channel is full is dropped, as signal.Notify drops signals on
// a full channel.
const ForwardBuffer = 16

// Terminating reports whether sig ends a long-running command: SIGINT, SIGTERM, SIGHUP
// or SIGQUIT (torchrun 2.x's --signals-to-handle default, on which it stops its
// workers). SIGUSR1, SIGUSR2 and anything that is not a syscall.Signal do not.
func Terminating(sig os.Signal) bool {
	ss, ok := sig.(syscall.Signal)
	return ok && (ss == syscall.SIGINT || ss == syscall.SIGTERM || ss == syscall.SIGHUP || ss == syscall.SIGQUIT)
}

// SignalWatch reads the signals sent to gangrun on behalf of a command that must act on
// them itself between (or instead of) supervisor runs: a pairwise sweep, an agent, an
// allocation that holds GPUs. Every signal it reads is passed on to Forward (for a
// supervisor that forwards them to its workers); the first terminating one (Terminating)
// is recorded, closes Stopped and ends the watch's context. Create it with WatchSignals.
type SignalWatch struct {
	forward chan os.Signal
	stopped chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}

	mu  sync.Mutex
	sig syscall.Signal // the first terminating signal; 0 before it
}

// WatchSignals starts reading in (a command's signal channel, such as the one
// signal.Notify fills). It returns a context derived from ctx that ends at the first
// terminating signal, and the watch. The watch reads until that context ends — its
// parent's end, the first terminating signal, or Stop — so a signal that arrives after
// it stays in in. Call Stop when done with it.
func WatchSignals(ctx context.Context, in <-chan os.Signal) (context.Context, *SignalWatch) {
	ctx, cancel := context.WithCancel(ctx)
	w := &SignalWatch{forward: make(chan os.Signal, ForwardBuffer), stopped: make(chan struct{}),
		cancel: cancel, done: make(chan struct{})}
	go w.read(ctx, in)
	return ctx, w
}

func (w *SignalWatch) read(ctx context.Context, in <-chan os.Signal) {
	defer close(w.done)
	for {
		select {
		case <-ctx.Done():
			return
		case sig, ok := <-in:
			if !ok {
				return
			}
			select {
			case w.forward <- sig:
			default: // full: dropped
			}
			if Terminating(sig) {
				w.mu.Lock()
				if w.sig == 0 {
					w.sig = sig.(syscall.Signal)
					close(w.stopped)
				}
				w.mu.Unlock()
				w.cancel()
			}
		}
	}
}

// Forward returns the channel every signal read is passed on to (ForwardBuffer deep):
// give it to a supervisor's Config.Signals.
func (w *SignalWatch) Forward() <-chan os.Signal { return w.forward }

// Stopped returns a channel closed when the first terminating signal has been read; it
// is never closed otherwise (not by Stop, not by the parent context's end).
func (w *SignalWatch) Stopped() <-chan struct{} { return w.stopped }

// Signal returns the first terminating signal read, 0 when none was.
func (w *SignalWatch) Signal() syscall.Signal {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sig
}

// Err returns a *SignalError for the first terminating signal read, nil when none was.
func (w *SignalWatch) Err() error {
	if sig := w.Signal(); sig != 0 {
		return &SignalError{Signal: sig}
	}
	return nil
}

// Stop ends the watch's context and waits until it has stopped reading. It may be
// called more than once.
func (w *SignalWatch) Stop() {
	w.cancel()
	<-w.done
}

// SignalError says that a command was stopped by a terminating signal; gangrun then
// exits with ExitCode, 128+N for signal N (POSIX shells' convention).
type SignalError struct {
	Signal syscall.Signal
}

// Error returns "stopped by SIGTERM" and the like.
func (e *SignalError) Error() string { return "stopped by " + SignalName(e.Signal) }

// ExitCode returns 128 + the signal's number.
func (e *SignalError) ExitCode() int { return 128 + int(e.Signal) }
