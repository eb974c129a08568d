package store

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// DefaultWait is how long one blocking query waits before returning unchanged.
const DefaultWait = 5 * time.Minute

// Retry bounds for a store that does not answer (Consul restarting, say).
const (
	retryMin = 100 * time.Millisecond
	retryMax = 5 * time.Second
)

// suspectWait bounds a blocking query's wait while the store may not hold the data the
// watcher knew (Watcher.suspect).
const suspectWait = 2 * time.Second

// Watcher follows every key under a prefix with blocking queries, applying Consul's
// rules for the index (Consul docs, "Blocking Queries"): the first call returns at once;
// later calls block until the index passes the last one seen; an index that goes
// backwards (a store restored or restarted) resets the watch to 0, which returns at once,
// and so does an error (the store may come back restored, at a lower index); an index
// of 0 is taken as 1. A wake-up is no proof of a change: callers compare what
// they read.
type Watcher struct {
	s      Store
	prefix string
	index  uint64
	// suspect is set after the store did not answer, or answered at an index below the
	// last: it may be a Consul that lost its data (DataLost), whose index the other
	// clients' writes can raise past where its restore will put it. A blocking query at
	// such an index would sleep through the restore for its whole wait, so while
	// DataLost says so the waits are suspectWait. It is also set when another call of
	// the same client found the data lost (Unsettled): a watch that was idle through
	// the outage met no error of its own.
	suspect bool
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
		qwait := wait
		if !w.suspect && Unsettled(w.s) {
			w.suspect = true // another call of this client met the lost data
		}
		if w.suspect {
			qwait = min(wait, suspectWait)
		}
		out, idx, err := w.s.WatchList(ctx, w.prefix, w.index, qwait)
		if err == nil {
			if idx == 0 {
				idx = 1
			}
			if w.suspect {
				if w.suspect = DataLost(ctx, w.s); !w.suspect {
					// The data is the client's again (restored, or never lost). This
					// answer may be from before (a restore in progress); the next one is
					// read afresh, at once: its index counts from there.
					w.index = 0
					return out, nil
				}
			}
			prev := w.index
			switch {
			case idx < prev:
				// The store went back in time: start over, and report what is there now.
				w.index, w.suspect = 0, consulOf(w.s) != nil
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
		// The store did not answer: when it does again it may be another (restarted,
		// restored from a snapshot) whose index is below the last seen, and a blocking
		// query at that index would wait its whole time before saying so. Ask at once.
		w.index, w.suspect = 0, consulOf(w.s) != nil
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

// Answer is the latest answer of a watch of one prefix: its entries and index; OK once
// the first answer came.
type Answer struct {
	Entries []Entry
	Index   uint64
	OK      bool
}

// Follower keeps the latest answer of a Watcher on each of several prefixes, each
// watched by a goroutine of its own until the context given to Follow ends. Answers of
// one prefix come at most one per gap: changes that come faster are taken together
// (each answer lists the whole prefix), the first after a quiet spell without delay.
// The prefixes' answers are of different moments: a caller that needs them to agree
// checks what it acts on (a transaction's checks, a fresh read).
type Follower struct {
	mu      sync.Mutex
	answers []Answer
	changed chan struct{}
}

// Follow starts following prefixes of s until ctx ends.
func Follow(ctx context.Context, s Store, gap time.Duration, prefixes ...string) *Follower {
	f := &Follower{answers: make([]Answer, len(prefixes)), changed: make(chan struct{}, 1)}
	for i, prefix := range prefixes {
		w := NewWatcher(s, prefix)
		go func() {
			var last time.Time
			for {
				if !Sleep(ctx, gap-time.Since(last)) {
					return
				}
				entries, err := w.Next(ctx)
				if err != nil {
					return // ctx ended
				}
				last = time.Now()
				f.mu.Lock()
				f.answers[i] = Answer{entries, w.Index(), true}
				f.mu.Unlock()
				select {
				case f.changed <- struct{}{}:
				default:
				}
			}
		}()
	}
	return f
}

// Changed receives a value after an answer came (one for several, when they come
// before it is read).
func (f *Follower) Changed() <-chan struct{} { return f.changed }

// Latest returns the latest answer of each prefix, in Follow's order, and whether every
// prefix has answered.
func (f *Follower) Latest() ([]Answer, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := slices.Clone(f.answers)
	for _, a := range out {
		if !a.OK {
			return out, false
		}
	}
	return out, true
}

// Anchor makes sure key prefix itself exists (an empty value; written only when it is
// absent), so that blocking queries on prefix wake only for changes under it. Consul
// answers a list of a prefix that has no keys (and no tombstones, which it reaps after
// a while) with the index of the whole KV store, so a watch of such a prefix returns
// at every write anywhere (agent/consul/state/kvs.go, kvsListTxn; Consul v1.14): 64
// idle nodes' launchers made 57 reads of their empty prefixes for each job the
// cluster ran (benchmarks/README.md, "Cluster jobs"). The anchor is an ordinary key:
// readers of prefix skip the key equal to prefix. The in-memory store answers an empty
// prefix with a steady index, with or without an anchor.
func Anchor(ctx context.Context, s Store, prefix string) error {
	_, err := s.Txn(ctx, []Op{{Verb: CAS, Key: prefix, Index: 0}})
	if errors.Is(err, ErrTxnRejected) && !errors.Is(err, ErrPermissionDenied) {
		return nil // there already
	}
	return err
}
