package store

import (
	"context"
	"time"
)

// DefaultWait is how long one blocking query waits before returning unchanged.
const DefaultWait = 5 * time.Minute

// Retry bounds for a store that does not answer (Consul restarting, say).
const (
	retryMin = 100 * time.Millisecond
	retryMax = 5 * time.Second
)

// Watcher follows every key under a prefix with blocking queries, applying Consul's
// rules for the index (Consul docs, "Blocking Queries"): the first call returns at once;
// later calls block until the index passes the last one seen; an index that goes
// backwards (a store restored or restarted) resets the watch to 0, which returns at once;
// an index of 0 is taken as 1. A wake-up is no proof of a change: callers compare what
// they read.
type Watcher struct {
	s      Store
	prefix string
	index  uint64
	// Wait is the longest a single blocking query waits; DefaultWait when zero.
	Wait time.Duration
}

// NewWatcher returns a Watcher of prefix in s.
func NewWatcher(s Store, prefix string) *Watcher { return &Watcher{s: s, prefix: prefix} }

// Index returns the index of the last result (0 before the first).
func (w *Watcher) Index() uint64 { return w.index }

// Next returns the prefix's entries once they may have changed since the last call. It
// retries errors with a backoff of 100ms..5s and returns only ctx's error.
func (w *Watcher) Next(ctx context.Context) ([]Entry, error) {
	wait := w.Wait
	if wait <= 0 {
		wait = DefaultWait
	}
	backoff := retryMin
	for {
		out, idx, err := w.s.WatchList(ctx, w.prefix, w.index, wait)
		if err == nil {
			if idx == 0 {
				idx = 1
			}
			prev := w.index
			switch {
			case idx < prev:
				// The store went back in time: start over, and report what is there now.
				w.index = 0
				return out, nil
			case idx == prev:
				continue // the wait ended without a change
			}
			w.index = idx
			return out, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !Sleep(ctx, backoff) {
			return nil, ctx.Err()
		}
		backoff = min(backoff*2, retryMax)
	}
}

// Sleep waits d, or until ctx ends; it reports whether the whole d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
