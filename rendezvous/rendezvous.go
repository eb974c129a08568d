// Package rendezvous agrees, round after round, on who is in a training gang and what
// each node's part is: its node rank, the global ranks it runs, where rank 0's master
// listens, which NCCL settings it uses, and which checkpoint every node resumes from.
//
// A rendezvous round is one attempt of the gang. It opens, nodes join, it closes with an
// Assignment for each node, and it ends when the gang succeeds, when any node reports a
// failure (the whole gang restarts in a new round), or when membership changes (a node
// died, or one is waiting to join). Three implementations share the Round interface:
//   - Local: one node, in-process, no service (the default);
//   - Dynamic: nodes come and go, coordinating through a store (Consul): sessions, CAS
//     and blocking queries;
//   - Static: Slurm, where the layout is fixed by SLURM_* variables and no service runs.
//
// The vocabulary follows torch.distributed.elastic (torch/distributed/elastic/rendezvous):
// a node is torch's "agent", node rank is its GROUP_RANK, and the number of nodes is
// GROUP_WORLD_SIZE.
package rendezvous

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/failure"
)

// Member is one node of a closed round.
type Member struct {
	// Node is the node's name (--node-name), unique within a job.
	Node string `json:"node"`
	// Addr is the address other nodes reach this node at (--advertise-addr).
	Addr string `json:"addr"`
	// LocalWorldSize is the number of ranks the node runs (its --nproc-per-node).
	LocalWorldSize int `json:"local_world_size"`
	// Switch names the network switch the node hangs off (its "switch" label), used to
	// place nodes under one switch at adjacent node ranks; "" when unknown.
	Switch string `json:"switch,omitempty"`
}

// Assignment is one node's part of a closed rendezvous round: everything its workers'
// environment is built from.
type Assignment struct {
	// JobID identifies the job (TORCHELASTIC_RUN_ID).
	JobID string `json:"job_id"`
	// Round is the rendezvous round, counting from 0 for the job's first attempt; it also
	// names the attempt (GANGRUN_ATTEMPT, the log directory attempt_K).
	Round int `json:"round"`
	// RestartCount is how many rounds of this job have failed so far: the restarts spent
	// from the budget (TORCHELASTIC_RESTART_COUNT). Membership changes do not count.
	RestartCount int `json:"restart_count"`
	// NodeRank is this node's rank among the round's nodes (GROUP_RANK).
	NodeRank int `json:"node_rank"`
	// NNodes is the number of nodes in the round (GROUP_WORLD_SIZE).
	NNodes int `json:"nnodes"`
	// LocalWorldSize is the number of ranks this node runs (LOCAL_WORLD_SIZE).
	LocalWorldSize int `json:"local_world_size"`
	// WorldSize is the total number of ranks of the round (WORLD_SIZE).
	WorldSize int `json:"world_size"`
	// RankOffset is the global rank of this node's local rank 0: the ranks of lower node
	// ranks come first, as in torch's elastic agent (_assign_worker_ranks).
	RankOffset int `json:"rank_offset"`
	// MasterAddr and MasterPort are where rank 0's rendezvous store listens
	// (MASTER_ADDR, MASTER_PORT).
	MasterAddr string `json:"master_addr"`
	MasterPort int    `json:"master_port"`
	// ResumeFrom is the checkpoint every node of the round resumes from, chosen once by
	// node rank 0; "" when the gang starts fresh.
	ResumeFrom string `json:"resume_from,omitempty"`
	// Node names this node's peers by node rank when the rendezvous knows them cheaply
	// (single node, Slurm); nil in large Consul rounds, where each node reads only its
	// own part.
	Nodes []Member `json:"nodes,omitempty"`
}

// Assign computes node nodeRank's part of a round whose nodes, in node-rank order, are
// nodes: the sizes and its rank offset. The caller fills in the rest.
func Assign(nodes []Member, nodeRank int) Assignment {
	a := Assignment{NodeRank: nodeRank, NNodes: len(nodes)}
	for i, m := range nodes {
		a.WorldSize += m.LocalWorldSize
		if i < nodeRank {
			a.RankOffset += m.LocalWorldSize
		}
		if i == nodeRank {
			a.LocalWorldSize = m.LocalWorldSize
		}
	}
	return a
}

// MasterEndpoint returns "MASTER_ADDR:MASTER_PORT", bracketing IPv6 addresses.
func (a Assignment) MasterEndpoint() string {
	return net.JoinHostPort(a.MasterAddr, strconv.Itoa(a.MasterPort))
}

// JoinRequest is what a node brings to a round.
type JoinRequest struct {
	// Node is this node's name, unique within the job.
	Node string
	// Addr is the address the other nodes use for this one ("" lets the implementation
	// choose; Local uses 127.0.0.1).
	Addr string
	// LocalWorldSize is how many ranks this node runs; at least 1.
	LocalWorldSize int
	// Switch is the node's switch label, "" when unknown.
	Switch string
	// MasterPort is the port rank 0's store listens on when this node becomes node rank
	// 0; 0 picks a free port afresh for every round.
	MasterPort int
	// ChooseResume is called once per round, by node rank 0 only, to choose the
	// checkpoint the whole gang resumes from ("" for none). It may be nil.
	ChooseResume func(ctx context.Context) (string, error)
	// OnLease, when set, is called with the time by which this node's workers must be
	// dead unless the rendezvous renews its lease with the coordinator (store.Lease's
	// KillBy), at once and after every renewal, from the rendezvous' own goroutine; it
	// must not block. Rendezvous without a lease (Local, Static) never call it. The
	// supervisor hands it to its guardian, which kills the workers at that time if the
	// supervisor itself is frozen.
	OnLease func(killBy time.Time)
	// StoreRound, when set, is how a node other than node rank 0 of a rendezvous with no
	// coordinator to agree its rounds (Static: Slurm's and torchrun's static) meets node
	// rank 0's workers: it waits until the workers' store at master (MASTER_ADDR:
	// MASTER_PORT, which node rank 0's gangrun serves anew each attempt) is one newer
	// than the round after (-1: any), and returns the restart count node rank 0
	// published in it. The node's workers then get that count
	// (TORCHELASTIC_RESTART_COUNT), which names their keys in the store (torch's
	// /worker/attempt_N prefix), so that the nodes' workers meet even when their nodes
	// have counted different numbers of failures, and a node that restarts first does
	// not join node rank 0's store of the attempt that failed. Nil: no wait.
	StoreRound func(ctx context.Context, master string, after int) (int, error)
}

// chooseResume asks req.ChooseResume for the round's checkpoint ("" when it is nil).
func (req JoinRequest) chooseResume(ctx context.Context) (string, error) {
	if req.ChooseResume == nil {
		return "", nil
	}
	r, err := req.ChooseResume(ctx)
	if err != nil {
		return "", fmt.Errorf("choose the checkpoint to resume from: %w", err)
	}
	return r, nil
}

// EndKind says why a round ended.
type EndKind int

const (
	// Running means the round has not ended.
	Running EndKind = iota
	// Succeeded: every node's workers exited 0.
	Succeeded
	// Failed: a node reported a worker failure (or a hang); the gang restarts and the
	// restart budget is charged.
	Failed
	// MembershipChanged: a node left (its session ended) or a node is waiting to join;
	// the gang re-forms without charging the restart budget.
	MembershipChanged
)

// String returns "running", "succeeded", "failed" or "membership changed".
func (k EndKind) String() string {
	switch k {
	case Running:
		return "running"
	case Succeeded:
		return "succeeded"
	case Failed:
		return "failed"
	case MembershipChanged:
		return "membership changed"
	}
	return "EndKind(" + strconv.Itoa(int(k)) + ")"
}

// Failure describes the root cause of a failed round: the first worker to fail.
type Failure struct {
	// Node is the node the failing worker ran on.
	Node string `json:"node"`
	// Rank and LocalRank identify the worker; -1 when the failure is not one worker's
	// (a hang of the whole gang).
	Rank      int `json:"rank"`
	LocalRank int `json:"local_rank"`
	// ExitCode is the worker's exit status as a shell reports it (128+N for signal N).
	ExitCode int `json:"exit_code"`
	// Kind is the failure's class, which everything downstream switches on (the job's
	// restart causes); "" in a record an older gangrun wrote.
	Kind failure.Kind `json:"kind,omitempty"`
	// Reason is a one-line description for people and logs: "exit code 1", "signal
	// SIGKILL (9)", "no output for 5m0s (hang timeout)". Nothing parses it: Kind says
	// what it is.
	Reason string `json:"reason"`
	// Message is the first line of the worker's error file (torch's record format),
	// when it wrote one.
	Message string `json:"message,omitempty"`
}

// String describes the failure in one line.
func (f Failure) String() string {
	s := fmt.Sprintf("rank %d on %s: %s", f.Rank, f.Node, f.Reason)
	if f.Rank < 0 {
		s = fmt.Sprintf("%s: %s", f.Node, f.Reason)
	}
	if f.Message != "" {
		s += ": " + f.Message
	}
	return s
}

// JobFinishedError is Join's error when the run this node was waiting to join (it saw
// it running, and waited for a round with room) finished meanwhile: the job is over,
// and starting a new run of it alone would run it a second time.
type JobFinishedError struct {
	// JobID is the job.
	JobID string
	// Succeeded reports how the run ended: true when every node finished; false when it
	// ran out of restarts, with Failure its last root cause (nil if unknown).
	Succeeded bool
	Failure   *Failure
}

// Error describes how the job ended, in one line.
func (e *JobFinishedError) Error() string {
	if e.Succeeded {
		return "job " + e.JobID + " succeeded while this node waited to join: nothing left to run"
	}
	s := "job " + e.JobID + " ran out of restarts while this node waited to join"
	if e.Failure != nil {
		s += ": " + e.Failure.String()
	}
	return s
}

// End is how a round ended.
type End struct {
	Kind EndKind
	// Failure is the root cause when Kind is Failed.
	Failure *Failure
	// OutOfRestarts is set with Failed when the failure used up the job's restart budget:
	// the run is over, and no node starts another round of it. The rendezvous is the one
	// judge of the budget (its MaxRestarts; for the dynamic rendezvous the run's, which a
	// job may raise: AddRestarts).
	OutOfRestarts bool
	// Detail explains a membership change ("node b left", "node c is waiting").
	Detail string
	// Lost is set with MembershipChanged when this node can no longer see the round at
	// all: its lease with the coordinator is over (no renewal accepted in time, or its
	// session was invalidated), or the job's state vanished (a Consul server that lost
	// its data). Nothing then says how the other nodes ended.
	Lost bool
	// KillBy, when set, is when this node's workers must be dead: the coordinator may
	// hand their place to others soon after (the lease's kill time). The supervisor
	// cuts its SIGTERM grace short to meet it.
	KillBy time.Time
}

// Round is one closed rendezvous round as a node sees it.
type Round interface {
	// Assignment returns this node's part of the round.
	Assignment() Assignment
	// Ended is closed when the round ends for a reason this node did not report itself:
	// another node's failure, a membership change, or every node's success.
	Ended() <-chan struct{}
	// End returns how the round ended; Kind is Running while it has not.
	End() End
	// Fail reports a failure of this node's workers, ending the round for every node.
	// The first failure reported wins; later ones are ignored.
	Fail(ctx context.Context, f Failure) error
	// Succeed reports that this node's workers all exited 0 and blocks until every node
	// has, or the round ends otherwise; it returns the round's End.
	Succeed(ctx context.Context) (End, error)
	// Leave withdraws this node from the job (on shutdown); the others see a membership
	// change.
	Leave(ctx context.Context) error
	// Activity shares when this node's workers last wrote output (local) and returns the
	// latest output time of the gang as this node should judge a hang by: the gang's
	// newest when this node is the judge, and time.Now() when another node judges.
	Activity(ctx context.Context, local time.Time) time.Time
}

// Rendezvous hands out rounds.
type Rendezvous interface {
	// Join blocks until the next round closes with this node in it.
	Join(ctx context.Context, req JoinRequest) (Round, error)
}

// FreePort returns a TCP port that was free on every interface of this host when it
// was checked, for MASTER_PORT. The port is released before returning, so another
// process may still take it; torch's TCPStore then fails to bind and the round fails.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		return 0, fmt.Errorf("pick a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// DefaultAddr returns the address other nodes most likely reach this one at: the local
// address of a route towards remote (the coordinator's host:port; no packet is sent),
// unless that is a loopback address; else the first IPv4 address of an up, non-loopback
// interface that is not a container bridge (docker*, veth*, virbr*); else 127.0.0.1.
func DefaultAddr(remote string) string {
	if remote != "" {
		if conn, err := net.Dial("udp", remote); err == nil {
			ip := conn.LocalAddr().(*net.UDPAddr).IP
			conn.Close()
			if !ip.IsLoopback() {
				return ip.String()
			}
		}
	}
	ifaces, err := net.Interfaces()
	if err == nil {
		for _, ifc := range ifaces {
			if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 ||
				strings.HasPrefix(ifc.Name, "docker") || strings.HasPrefix(ifc.Name, "veth") || strings.HasPrefix(ifc.Name, "virbr") {
				continue
			}
			addrs, _ := ifc.Addrs()
			for _, a := range addrs {
				if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
					return ipn.IP.String()
				}
			}
		}
	}
	return LoopbackAddr
}
