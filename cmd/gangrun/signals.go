package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/gangrun/gangrun/internal/proc"
)

// startupStopGrace is how long a command stopped by a signal before its long-running
// loop took signals over may take to return (its context is cancelled, so Consul calls,
// probing and child processes end at once) before gangrun exits anyway. Past it the
// command is stuck in a call that ignores its context (a hung NFS read, a hung driver),
// and nothing it could still release is worth waiting for.
const startupStopGrace = time.Second

// startup relays the signals of a command that catches them (run, agent, alloc, bench
// nccl) in the two phases of its life:
//
//   - while it starts (parsing, probing, reading files, its first Consul calls), a
//     terminating signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) stops it at once: its context is
//     cancelled, what it prints from then on is dropped, and gangrun exits 128+N with
//     one line, as soon as the command has returned (having released what it created)
//     or after startupStopGrace, whichever comes first;
//   - once the command calls handOver (its supervisor or agent loop is about to read
//     them), every signal goes to signals, as before.
//
// SIGUSR1 and SIGUSR2 always go to signals (buffered; the supervisor forwards them to
// the workers once they run).
type startup struct {
	cmd    string
	cancel context.CancelFunc
	stderr io.Writer // the real stderr, for the one line
	exit   func(code int)

	// signals is what the command reads (env.signals).
	signals chan os.Signal
	// returned is closed when the command returns.
	returned chan struct{}

	mu      sync.Mutex
	handed  bool           // the command's loop reads signals now
	stopped syscall.Signal // the terminating signal that stopped it during startup
	printed bool           // the one line is out
}

// newStartup starts relaying in to the returned startup's signals for command cmd (as
// the user typed it: "run", "bench nccl"). cancel cancels the command's context on a
// stop; exit ends the process.
func newStartup(cmd string, in <-chan os.Signal, cancel context.CancelFunc, stderr io.Writer, exit func(int)) *startup {
	s := &startup{cmd: cmd, cancel: cancel, stderr: stderr, exit: exit,
		signals: make(chan os.Signal, cap(in)), returned: make(chan struct{})}
	go s.relay(in)
	return s
}

func (s *startup) relay(in <-chan os.Signal) {
	for sig := range in {
		ss, _ := sig.(syscall.Signal)
		s.mu.Lock()
		handed, first := s.handed, s.stopped
		if !handed && proc.Terminating(ss) && first == 0 {
			s.stopped = ss
		}
		s.mu.Unlock()
		switch {
		case handed || !proc.Terminating(ss):
			select {
			case s.signals <- sig:
			default: // full: dropped, as signal.Notify's own channel does
			}
		case first != 0: // a second one: no more waiting
			s.finish()
			s.exit(128 + int(first))
			return
		default:
			s.cancel()
			go func() {
				select {
				case <-s.returned:
				case <-time.After(startupStopGrace):
					s.finish()
					s.exit(128 + int(ss))
				}
			}()
		}
	}
}

// handOver gives the signals to the command's long-running loop. It returns false when
// a terminating signal already stopped the command: it must then return at once,
// starting nothing. A nil startup (tests that call dispatch in-process) always hands
// over.
func (s *startup) handOver() bool {
	if s == nil {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped != 0 {
		return false
	}
	s.handed = true
	return true
}

// done is called with the command's exit code when it returns. When a signal stopped
// it during startup, it prints the one line and returns 128+N instead.
func (s *startup) done(code int) int {
	close(s.returned)
	s.mu.Lock()
	sig := s.stopped
	s.mu.Unlock()
	if sig == 0 {
		return code
	}
	s.finish()
	return 128 + int(sig)
}

// finish prints, once, the line saying the command was stopped.
func (s *startup) finish() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.printed {
		return
	}
	s.printed = true
	fmt.Fprintf(s.stderr, "gangrun %s: stopped by %s while starting, before any work began\n", s.cmd, proc.SignalName(s.stopped))
}

// writer returns w muted once a signal stopped the command during startup, so that
// nothing it prints while it unwinds (a cancelled Consul call's error) goes with the one
// line.
func (s *startup) writer(w io.Writer) io.Writer {
	return mutedWriter{s: s, w: w}
}

// rawWriter returns the writer inside a startup's muted one (an *os.File that a child
// process can be given, or a terminal to test), else w.
func rawWriter(w io.Writer) io.Writer {
	if m, ok := w.(mutedWriter); ok {
		return m.w
	}
	return w
}

// mutedWriter drops what is written once its startup was stopped.
type mutedWriter struct {
	s *startup
	w io.Writer
}

func (m mutedWriter) Write(p []byte) (int, error) {
	m.s.mu.Lock()
	muted := m.s.stopped != 0
	m.s.mu.Unlock()
	if muted {
		return len(p), nil
	}
	return m.w.Write(p)
}
