package proc

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestTerminating(t *testing.T) {
	for _, c := range []struct {
		sig  os.Signal
		want bool
	}{{syscall.SIGINT, true}, {syscall.SIGTERM, true}, {syscall.SIGHUP, true}, {syscall.SIGQUIT, true},
		{syscall.SIGUSR1, false}, {syscall.SIGUSR2, false}, {os.Interrupt, true}} {
		if got := Terminating(c.sig); got != c.want {
			t.Errorf("Terminating(%v) = %v, want %v", c.sig, got, c.want)
		}
	}
}

// TestSignalWatch: every signal is forwarded; the first terminating one is recorded,
// closes Stopped and ends the context; a later one is not read.
func TestSignalWatch(t *testing.T) {
	in := make(chan os.Signal, 4)
	ctx, w := WatchSignals(context.Background(), in)
	defer w.Stop()
	in <- syscall.SIGUSR1
	if got := <-w.Forward(); got != syscall.SIGUSR1 {
		t.Fatalf("forwarded %v, want SIGUSR1", got)
	}
	select {
	case <-w.Stopped():
		t.Fatal("stopped by SIGUSR1")
	case <-ctx.Done():
		t.Fatal("context ended by SIGUSR1")
	case <-time.After(50 * time.Millisecond):
	}
	if w.Signal() != 0 || w.Err() != nil {
		t.Errorf("Signal %v, Err %v before any terminating signal", w.Signal(), w.Err())
	}
	in <- syscall.SIGTERM
	<-ctx.Done()
	<-w.Stopped()
	if got := <-w.Forward(); got != syscall.SIGTERM {
		t.Errorf("forwarded %v, want SIGTERM", got)
	}
	var se *SignalError
	if w.Signal() != syscall.SIGTERM || !errors.As(w.Err(), &se) || se.ExitCode() != 128+15 || se.Error() != "stopped by SIGTERM" {
		t.Errorf("Signal %v, Err %v", w.Signal(), w.Err())
	}
	w.Stop()
	in <- syscall.SIGINT // not read: the watch ended with its context
	if len(in) != 1 || w.Signal() != syscall.SIGTERM {
		t.Errorf("%d signals left unread, first signal %v", len(in), w.Signal())
	}
}

// TestSignalWatchStop: Stop ends the context without a signal; Stopped stays open.
func TestSignalWatchStop(t *testing.T) {
	ctx, w := WatchSignals(context.Background(), make(chan os.Signal))
	w.Stop()
	w.Stop()
	<-ctx.Done()
	select {
	case <-w.Stopped():
		t.Error("Stopped closed by Stop")
	default:
	}
	if w.Err() != nil {
		t.Errorf("Err %v after Stop", w.Err())
	}
}
