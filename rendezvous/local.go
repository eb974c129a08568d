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
	jobID       string
	maxRestarts int

	mu       sync.Mutex
	round    int // the next round's number
	failures int
}

// NewLocal returns a Local rendezvous for job jobID whose restart budget is maxRestarts:
// the round that fails for the (maxRestarts+1)th time ends OutOfRestarts.
func NewLocal(jobID string, maxRestarts int) *Local {
	return &Local{jobID: jobID, maxRestarts: maxRestarts}
}

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
	resume, err := req.chooseResume(ctx)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	nodes := []Member{{Node: req.Node, Addr: LoopbackAddr, LocalWorldSize: req.LocalWorldSize, Switch: req.Switch}}
	a := Assign(nodes, 0)
	a.JobID, a.Round, a.RestartCount, a.Nodes = l.jobID, l.round, l.failures, nodes
	a.MasterAddr, a.MasterPort, a.ResumeFrom = LoopbackAddr, port, resume
	l.round++
	return newSoloRound(a, l.countFailure), nil
}

// countFailure counts a failed round and reports whether it used up the budget.
func (l *Local) countFailure() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failures++
	return l.failures > l.maxRestarts
}

// soloRound is a round only this node ends (Local's and Static's): nobody else can fail
// it, and success needs no one else's word.
type soloRound struct {
	a      Assignment
	ended  chan struct{}
	onFail func() bool // counts a failed round; true when it used up the budget
	mu     sync.Mutex
	end    End
}

func newSoloRound(a Assignment, onFail func() bool) *soloRound {
	return &soloRound{a: a, ended: make(chan struct{}), onFail: onFail}
}

func (r *soloRound) Assignment() Assignment { return r.a }
func (r *soloRound) Ended() <-chan struct{} { return r.ended }

func (r *soloRound) End() End {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.end
}

func (r *soloRound) finish(e End) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.end.Kind != Running {
		return false
	}
	r.end = e
	close(r.ended)
	return true
}

// Fail ends the round and counts the failure.
func (r *soloRound) Fail(_ context.Context, f Failure) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.end.Kind != Running {
		return nil
	}
	r.end = End{Kind: Failed, Failure: &f, OutOfRestarts: r.onFail()}
	close(r.ended)
	return nil
}

// Succeed returns at once: there is nobody else to wait for (Local), or no service to
// wait through (Static).
func (r *soloRound) Succeed(_ context.Context) (End, error) {
	r.finish(End{Kind: Succeeded})
	return r.End(), nil
}

func (r *soloRound) Leave(_ context.Context) error {
	r.finish(End{Kind: MembershipChanged, Detail: "node left"})
	return nil
}

// Activity returns local: the node judges a hang by its own workers' output.
func (r *soloRound) Activity(_ context.Context, local time.Time) time.Time { return local }

// embedded is the one-node rendezvous in this process (Local).
type embedded struct{}

func (embedded) name() string { return "embedded" }

func (embedded) claims(c string) bool { return c == "embedded" }

func (embedded) open(_ context.Context, _ string, cfg Config) (*Opened, error) {
	if cfg.MaxNodes > 1 {
		return nil, usage("--nnodes %s needs a coordinator shared by the nodes: --coordinator consul://HOST:PORT or slurm", nnodesString(cfg.MinNodes, cfg.MaxNodes))
	}
	node, err := nodeName(cfg.NodeName)
	if err != nil {
		return nil, err
	}
	job := cfg.JobID
	if job == "" {
		job = newJobID()
	}
	return &Opened{Rendezvous: NewLocal(job, cfg.MaxRestarts), JobID: job, NodeName: node, MinNodes: 1, MaxNodes: 1,
		Addr: cfg.AdvertiseAddr, GPUsOnNode: -1}, nil
}
