package runner

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gangrun/gangrun/bench"
)

// progressInterval is how often the progress line is redrawn and the progress file read.
const progressInterval = 500 * time.Millisecond

// progress composes the progress line for Config.Progress; a progress with a nil show
// does nothing.
type progress struct {
	show  func(line string)
	start time.Time // the run's start, for the time elapsed
}

func newProgress(show func(string)) progress {
	return progress{show: show, start: time.Now()}
}

// on reports whether a progress line is shown.
func (p progress) on() bool { return p.show != nil }

// elapsed is the time since the run started, to the second.
func (p progress) elapsed() time.Duration { return time.Since(p.start).Round(time.Second) }

// clear erases the line.
func (p progress) clear() {
	if p.on() {
		p.show("")
	}
}

// follow shows the bundled script's steps from its progress file at path until stop is
// called, then erases the line. pair names the pair of nodes measured ("" outside a
// pairwise sweep).
func (p progress) follow(ctx context.Context, path, pair string) (stop func()) {
	if !p.on() {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	var last *bench.Step
	var first time.Time
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = bench.Follow(ctx, path, progressInterval, func(line []byte) {
			s, err := bench.ParseStep(line)
			if err != nil {
				return
			}
			mu.Lock()
			if last == nil {
				first = time.Now()
			}
			last = &s
			mu.Unlock()
		})
	}()
	go func() {
		defer wg.Done()
		t := time.NewTicker(progressInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			mu.Lock()
			s, since := last, time.Since(first)
			mu.Unlock()
			if s == nil {
				what := "starting the gang"
				if pair != "" {
					what = "starting the gang of pair " + pair
				}
				p.show(fmt.Sprintf("%s · %s elapsed", what, p.elapsed()))
				continue
			}
			left, ok := s.Remaining(since)
			p.show(bench.ProgressLine(*s, pair, time.Since(p.start), left, ok))
		}
	}()
	return func() {
		cancel()
		wg.Wait()
		p.clear()
	}
}

// tick shows what and the time elapsed until stop is called, then erases the line.
func (p progress) tick(what string) (stop func()) {
	if !p.on() {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(progressInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				p.show(fmt.Sprintf("%s · %s elapsed", what, p.elapsed()))
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
		p.clear()
	}
}

// round shows the sweep's round r of rounds, of n pairs.
func (p progress) round(r, rounds, n int) {
	p.show(fmt.Sprintf("round %d/%d of the pairwise sweep: %d pairs · %s elapsed", r, rounds, n, p.elapsed()))
}
