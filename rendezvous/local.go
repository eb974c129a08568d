package rendezvous

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// LoopbackAddr is MASTER_ADDR for a gang that runs on one machine only.
const LoopbackAddr = "127.0.0.1"

// Local is the rendezvous of a single node with no external service: every round closes
// at once with this node alone, at node rank 0, with MASTER_ADDR 127.0.0.1. It counts
// failed rounds itself. Safe for use by one supervisor at a time.
type Local struct {
	jobID string

	mu       sync.Mutex
	round    int // the next round's number
	failures int
}

// NewLocal returns a Local rendezvous for job jobID.
func NewLocal(jobID string) *Local { return &Local{jobID: jobID} }

// Join closes the next round with this node alone. It picks a free MASTER_PORT unless
// req.MasterPort is set, and calls req.ChooseResume for the resume checkpoint.
func (l *Local) Join(ctx context.Context, req JoinRequest) (Round, error) {
	if req.LocalWorldSize < 1 {
		return nil, fmt.Errorf("join: local world size %d: must be at least 1", req.LocalWorldSize)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	port := req.MasterPort
	if port == 0 {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		port = p
	}
	resume := ""
	if req.ChooseResume != nil {
		r, err := req.ChooseResume(ctx)
		if err != nil {
			return nil, fmt.Errorf("choose the checkpoint to resume from: %w", err)
		}
		resume = r
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	nodes := []Member{{Node: req.Node, Addr: LoopbackAddr, LocalWorldSize: req.LocalWorldSize, Switch: req.Switch}}
	a := Assign(nodes, 0)
	a.JobID, a.Round, a.RestartCount, a.Nodes = l.jobID, l.round, l.failures, nodes
	a.MasterAddr, a.MasterPort, a.ResumeFrom = LoopbackAddr, port, resume
	l.round++
	return &localRound{owner: l, a: a, ended: make(chan struct{})}, nil
}

type localRound struct {
	owner *Local
	a     Assignment
	ended chan struct{}

	mu  sync.Mutex
	end End
}

func (r *localRound) Assignment() Assignment { return r.a }
func (r *localRound) Ended() <-chan struct{} { return r.ended }

func (r *localRound) End() End {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.end
}

func (r *localRound) finish(e End) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.end.Kind != Running {
		return false
	}
	r.end = e
	close(r.ended)
	return true
}

func (r *localRound) Fail(_ context.Context, f Failure) error {
	if r.finish(End{Kind: Failed, Failure: &f}) {
		r.owner.mu.Lock()
		r.owner.failures++
		r.owner.mu.Unlock()
	}
	return nil
}

func (r *localRound) Succeed(_ context.Context) (End, error) {
	r.finish(End{Kind: Succeeded})
	return r.End(), nil
}

func (r *localRound) Leave(_ context.Context) error {
	r.finish(End{Kind: MembershipChanged, Detail: "node left"})
	return nil
}

// Activity returns local: one node judges its own gang.
func (r *localRound) Activity(_ context.Context, local time.Time) time.Time { return local }
