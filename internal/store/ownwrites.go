package store

import (
	"context"
	"strings"
	"sync"
)

// OwnWrites remembers the highest store index of a client's own writes under each
// prefix it watches, so that it acts on no view older than them: a watch may answer at
// an index from before a write the client has already made (another prefix's answer
// came first, or the answer was on its way), and acting on that view would act again
// on a state the client has moved on (a scheduler granting a request twice, a job
// controller deleting a requeued job's new request). Safe for concurrent use; the zero
// value is ready.
type OwnWrites struct {
	mu sync.Mutex
	at map[string]uint64
}

// Wrote records a write of the client's own under prefix, at index idx (a
// transaction's TxnResult.Index, a Job's Index).
func (w *OwnWrites) Wrote(prefix string, idx uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.at == nil {
		w.at = map[string]uint64{}
	}
	w.at[prefix] = max(w.at[prefix], idx)
}

// Covers reports whether a view of prefix at index idx includes every write the client
// made under it.
func (w *OwnWrites) Covers(prefix string, idx uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return idx >= w.at[prefix]
}

// Reread lists prefix afresh: what a watcher does when its watch has not brought a view
// that Covers its writes within the time it waits for one. A read older than a write of
// the client's own under prefix (or under a prefix within it) means the store went back
// in time (Consul restored from a snapshot): what it holds now is what there is, and
// waiting for the old index would wait until as many writes came again, so those writes
// are forgotten, and wentBack says so. Errors are the List's.
func (w *OwnWrites) Reread(ctx context.Context, s Store, prefix string) (entries []Entry, idx uint64, wentBack bool, err error) {
	entries, idx, err = s.List(ctx, prefix)
	if err != nil {
		return nil, 0, false, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for p, at := range w.at {
		if strings.HasPrefix(p, prefix) && idx < at {
			delete(w.at, p)
			wentBack = true
		}
	}
	return entries, idx, wentBack, nil
}
