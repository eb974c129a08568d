package allocator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// A cluster job's grant (Request.Job) is held by no session: it outlives its submitter.
// Its GPU keys are held node by node: by the node's agent when the scheduler grants
// them, so they come back by themselves if the node dies before the job starts there;
// then by the job's step on the node, which takes them over (HandOver) before it
// starts any worker, so that an agent restart frees nothing while the step runs, and
// the step's death (its session's) does. The grant record lists exactly the nodes
// whose keys it holds, with the session holding each: the step gives its node back
// (ReleaseNode) in one transaction with its keys. The job removes what is left, and
// the grant and its request, when it ends (ReleaseJob).

// RequestKey and GrantKey are the keys of request (or job) id and of its grant, for a
// caller that writes them in its own transaction (a job's cancel checks the grant's).
func RequestKey(id string) string { return requestsPrefix + id }

// GrantKey is the key of the grant of request id.
func GrantKey(id string) string { return grantsPrefix + id }

// ErrNotHolder means the node's keys in the grant are not held by the session that
// tried to take them over or give them back (its agent's session ended, another step
// took them, the node left the grant).
var ErrNotHolder = errors.New("the node's GPUs in the grant are not held by that session")

// ReadGrant returns grant id and its store index; nil when there is none.
func ReadGrant(ctx context.Context, s store.Store, id string) (*Grant, uint64, error) {
	e, err := s.Get(ctx, grantsPrefix+id)
	if err != nil || e == nil {
		return nil, 0, err
	}
	var g Grant
	if err := schema.Unmarshal(schema.Grant, e.Value, &g); err != nil {
		return nil, 0, fmt.Errorf("grant %s: %w", id, err)
	}
	return &g, e.ModifyIndex, nil
}

// jobGrantRetries bounds how often HandOver and ReleaseNode read the grant again after
// another node's step changed it meanwhile (each step changes it at most twice).
const jobGrantRetries = 64

// HandOver moves node's GPU keys of job grant id from the session holding them now
// (the node's agent's, as the grant records it) to session (the job's step on the
// node), and records it in the grant, in one transaction: the keys are never free. It
// returns the node's part of the grant. ErrNotHolder when the grant does not list the
// node, or its keys are no longer held as it records (the agent's session ended: its
// keys went with it); ErrNotFound when there is no granted grant.
func HandOver(ctx context.Context, s store.Store, id, node, session string) (GrantNode, error) {
	for range jobGrantRetries {
		g, idx, err := ReadGrant(ctx, s, id)
		if err != nil {
			return GrantNode{}, err
		}
		if g == nil || g.State != GrantGranted {
			return GrantNode{}, fmt.Errorf("grant %s: %w", id, ErrNotFound)
		}
		i := slices.IndexFunc(g.Nodes, func(gn GrantNode) bool { return gn.Name == node })
		if i < 0 {
			return GrantNode{}, fmt.Errorf("grant %s, node %s: %w", id, node, ErrNotHolder)
		}
		gn := g.Nodes[i]
		if gn.Session == session {
			return gn, nil // taken over already
		}
		ops := []store.Op{{Verb: store.CheckIndex, Key: grantsPrefix + id, Index: idx}}
		for _, d := range gn.Devices {
			k := gpuKey(node, d)
			ops = append(ops,
				store.Op{Verb: store.Unlock, Key: k, Value: []byte(id), Session: gn.Session},
				store.Op{Verb: store.Lock, Key: k, Value: []byte(id), Session: session})
		}
		g.Nodes[i].Session = session
		ops = append(ops, store.Op{Verb: store.Set, Key: grantsPrefix + id, Value: mustRecord(schema.Grant, g)})
		_, err = s.Txn(ctx, ops)
		switch {
		case err == nil:
			return g.Nodes[i], nil
		case errors.Is(err, store.ErrStaleIndex):
			continue // another node's step changed the grant: read it again
		case errors.Is(err, store.ErrTxnRejected):
			return GrantNode{}, fmt.Errorf("grant %s, node %s: %w (%v)", id, node, ErrNotHolder, err)
		}
		return GrantNode{}, err
	}
	return GrantNode{}, fmt.Errorf("grant %s, node %s: changed %d times while being taken over", id, node, jobGrantRetries)
}

// ReleaseNode gives node's GPU keys of job grant id back, deleting the keys session
// still holds and the node's entry in the grant, in one transaction. Keys that went
// with an ended session are not there to delete. A node the grant no longer lists, or
// a grant that is gone, is no error: there is nothing left to give back.
func ReleaseNode(ctx context.Context, s store.Store, id, node, session string) error {
	for range jobGrantRetries {
		g, idx, err := ReadGrant(ctx, s, id)
		if err != nil || g == nil {
			return err
		}
		i := slices.IndexFunc(g.Nodes, func(gn GrantNode) bool { return gn.Name == node })
		if i < 0 {
			return nil
		}
		entries, _, err := s.List(ctx, gpusPrefix+node+"/")
		if err != nil {
			return err
		}
		ops := []store.Op{{Verb: store.CheckIndex, Key: grantsPrefix + id, Index: idx}}
		for _, e := range entries {
			if string(e.Value) == id && e.Session == session {
				ops = append(ops, store.Op{Verb: store.CheckSession, Key: e.Key, Session: session},
					store.Op{Verb: store.Delete, Key: e.Key})
			}
		}
		g.Nodes = slices.Delete(g.Nodes, i, i+1)
		ops = append(ops, store.Op{Verb: store.Set, Key: grantsPrefix + id, Value: mustRecord(schema.Grant, g)})
		_, err = s.Txn(ctx, ops)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, store.ErrTxnRejected):
			continue // the grant or a key changed meanwhile: read them again
		}
		return err
	}
	return fmt.Errorf("release node %s of grant %s: changed %d times meanwhile", node, id, jobGrantRetries)
}

// ReleaseJob removes job grant id and request id at the job's end: the GPU keys still
// held by a node's agent (nodes where no step ran: a spare never used), then the grant
// and the request. It refuses (ErrNotHolder) while a step still holds keys: a node
// whose Session is not its agent's, with keys present. Nothing is removed then.
func ReleaseJob(ctx context.Context, s store.Store, id string) error {
	c, err := Snapshot(ctx, s)
	if err != nil {
		return err
	}
	return ReleaseJobIn(ctx, s, c, id)
}

// ReleaseJobIn is ReleaseJob with the GPU keys and sessions taken from c, a snapshot the
// caller read (a watch's, possibly a little old). That is safe: each GPU key is deleted
// only while its agent's session still holds it and at the index c shows (else nothing
// is removed and the error says so, to be tried again: a key freed and granted to
// another job since is that job's), the grant only at the index read now, and a key c
// did not show is left without a grant, which the scheduler's clean-up removes.
func ReleaseJobIn(ctx context.Context, s store.Store, c *Cluster, id string) error {
	for _, k := range []string{grantsPrefix + id, requestsPrefix + id} {
		if err := c.Newer[k]; err != nil {
			return fmt.Errorf("release job grant %s: %s: %w", id, k, err) // left to a gangrun that reads it
		}
	}
	var ops []store.Op
	if e, err := s.Get(ctx, grantsPrefix+id); err != nil {
		return err
	} else if e != nil {
		ops = append(ops, store.Op{Verb: store.DeleteCAS, Key: e.Key, Index: e.ModifyIndex})
	}
	if g, ok := c.Grants[id]; ok {
		for _, gn := range g.Nodes {
			agent := ""
			if n, ok := c.Nodes[gn.Name]; ok {
				agent = n.AliveSession
			}
			for _, d := range gn.Devices {
				if !c.Nodes[gn.Name].holds(d, id) {
					continue
				}
				if gn.Session != agent {
					return fmt.Errorf("grant %s: node %s's step still holds its GPUs: %w", id, gn.Name, ErrNotHolder)
				}
				// The agent holds every job's keys on its node: the session check alone
				// would pass on a key freed since and locked again for another job.
				ops = append(ops, store.Op{Verb: store.CheckSession, Key: gpuKey(gn.Name, d), Session: agent},
					c.gpuDelete(gpuKey(gn.Name, d)))
			}
		}
	}
	ops = append(ops, store.Op{Verb: store.Delete, Key: requestsPrefix + id})
	txns, err := store.SplitTxn(nil, ops)
	if err != nil {
		return err
	}
	for _, t := range txns {
		if _, err := s.Txn(ctx, t); err != nil {
			return fmt.Errorf("release job grant %s: %w", id, err)
		}
	}
	return nil
}

// holds reports whether device d of node n is held for grant id.
func (n *NodeState) holds(d, id string) bool {
	return n != nil && n.Held[d] == id
}

// JobRequest is the durable request of cluster job job: nodes nodes (up to maxNodes when
// free) of gpus GPUs each,
// in partition (may be ""), of priority, never refused (it waits as long as the job
// does), away from the exclude nodes.
func JobRequest(job string, nodes, maxNodes, gpus int, partition, model string, labels map[string]string, priority int, exclude []string) Request {
	return Request{ID: job, Job: job, Nodes: nodes, MaxNodes: maxNodes, GPUsPerNode: gpus, Partition: partition, GPUModel: model,
		Labels: labels, Priority: priority, Holder: "job " + job, Submitted: time.Now().UTC(), Exclude: exclude}
}

// JobRequestOps returns the transaction operations that write the durable request r
// (JobRequest) where none exists, for the job to write with its own records.
func JobRequestOps(r Request) ([]store.Op, error) {
	if !r.Durable() {
		return nil, fmt.Errorf("request %s is not a job's", r.ID)
	}
	if err := store.CheckSegment("job id", r.ID); err != nil {
		return nil, err
	}
	return []store.Op{
		{Verb: store.CheckNotExists, Key: requestsPrefix + r.ID},
		{Verb: store.Set, Key: requestsPrefix + r.ID, Value: mustRecord(schema.Request, r)},
	}, nil
}
