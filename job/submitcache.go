package job

import (
	"context"
	"strconv"
	"sync"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/store"
)

// clientCache is what the submits made through one store client keep between them, so
// that a long-lived submitter (the elected agent serving users' requests, a program
// queueing many jobs) reads less for each: the node records, used while nothing under
// gangrun/cluster/nodes/ changed (allocator.NodeRecords checks that at every submit),
// and the job id sequence as this client last wrote it, which the next submit claims
// with a check-and-set without reading it first (another submitter's write in between
// fails that check: the sequence is read then, and the id taken again). Neither makes a
// submit see the cluster older than a read would: a one-off submit behaves as before.
type clientCache struct {
	nodes allocator.NodeRecords
	// seqMu is held while a submit takes its id and sends the transaction that claims
	// it: a client's submits take their turns at the sequence instead of racing for it.
	seqMu sync.Mutex
	// seqValue and seqIndex are the sequence's value and ModifyIndex as this client last
	// wrote it; seqIndex 0: not known, read it.
	seqValue, seqIndex uint64
}

// cacheKey is the key of a store client's clientCache among its store.Locals.
type cacheKey struct{}

// cacheFor returns the clientCache of store client s: the one its earlier submits used
// for a store that keeps values of its callers (store.LocalOf: the two gangrun makes,
// Consul and Memory), a fresh one for any other Store.
func cacheFor(s store.Store) *clientCache {
	if c, ok := store.LocalOf(s, cacheKey{}, func() any { return &clientCache{} }); ok {
		return c.(*clientCache)
	}
	return &clientCache{}
}

// nextID returns the next job id and the operation that claims it (a check-and-set of
// the sequence key, in the submit's transaction): the id after the one this client last
// wrote, or, when that is not known, after the one the sequence holds now. Called with
// seqMu held.
func (c *clientCache) nextID(ctx context.Context, s store.Store) (string, store.Op, error) {
	n, idx := c.seqValue, c.seqIndex
	if idx == 0 {
		e, err := s.Get(ctx, seqKey)
		if err != nil {
			return "", store.Op{}, err
		}
		n = 0
		if e != nil {
			n, _ = strconv.ParseUint(string(e.Value), 10, 64)
			idx = e.ModifyIndex
		}
	}
	id := strconv.FormatUint(n+1, 10)
	return id, store.Op{Verb: store.CAS, Key: seqKey, Value: []byte(id), Index: idx}, nil
}

// claimed records the outcome err of the transaction (its result res) that claimed an
// id with seqOp: on success the sequence's new value and index, the next submit's
// starting point; on any failure nothing (the sequence is read again). Called with
// seqMu held.
func (c *clientCache) claimed(seqOp store.Op, res store.TxnResult, err error) {
	c.seqValue, c.seqIndex = 0, 0
	if err != nil || res.Index == 0 {
		return
	}
	n, perr := strconv.ParseUint(string(seqOp.Value), 10, 64)
	if perr == nil {
		c.seqValue, c.seqIndex = n, res.Index
	}
}
