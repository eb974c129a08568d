// Package doctor checks what a node needs to run gangrun's agent, one check at a time,
// each with what was found and what to do: `gangrun doctor` (docs/operations.md,
// "Checking a node"). Like `brew doctor` or Slurm's `slurmd -C` against slurm.conf, it
// reads and probes; the one thing it writes is a step's cgroup, made and removed again
// to show that a step can be confined.
//
// The checks, in order (Checks):
//
//	consul     Consul answers at the agent's address with a token an agent may use
//	           (acl.Whoami), and has a leader
//	munge      munged answers and decodes what it encodes (identity.Probe), as the
//	           agent's --auth needs
//	cgroup     a step's cgroup can be made here, with the controllers a step uses
//	gpus       NVML and the NVIDIA driver list the GPUs the PCI bus shows
//	nics       the network interfaces and RDMA ports and their link state; the
//	           --advertise-addr on one of them
//	topology   the --topology-file, when given, reads as an inventory
//	clock      the kernel's clock is synchronized, and within the session TTL of the
//	           Consul servers' clock
//	version    this binary's version against the other agents'
//
// What a node cannot check alone, each check's line says: that munged's key is the
// cluster's shows only when a credential made here decodes on another node.
package doctor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/hashicorp/consul/api"

	"github.com/gangrun/gangrun/acl"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/topology"
)

// Status is a check's outcome.
type Status string

// The outcomes. Only Fail makes `gangrun doctor` exit 1.
const (
	// OK: what the agent needs is there.
	OK Status = "ok"
	// Warn: the agent runs, but something is missing or odd (no GPU, ACLs off, a NIC
	// port down, a clock the kernel calls unsynchronized).
	Warn Status = "warn"
	// Fail: the agent cannot start, or jobs would fail here.
	Fail Status = "fail"
	// Skip: the check does not apply (no --topology-file) or could not run (Consul
	// does not answer, for the checks that read it).
	Skip Status = "skip"
)

// Result is one check's outcome: one line of `gangrun doctor`, one object of its
// --json.
type Result struct {
	// Check names the check: consul, munge, cgroup, gpus, nics, topology, clock, version.
	Check string `json:"check"`
	// Status is ok, warn, fail or skip.
	Status Status `json:"status"`
	// Detail is what was found, one line.
	Detail string `json:"detail"`
	// Fix is what to do about it, one line; empty when nothing is to be done.
	Fix string `json:"fix,omitempty"`
}

// Config is what the checks look at: the agent's own settings (its --config file
// or flags) and where to probe.
type Config struct {
	// Consul is the agent's Consul (its --consul, or CONSUL_HTTP_ADDR and the token
	// variables); *store.Consul is the one gangrun makes. Nil fails the consul check with
	// ConsulErr.
	Consul store.ConsulClient
	// ConsulErr says why there is no Consul client (a malformed address).
	ConsulErr error
	// MungeSocket is munged's socket (identity.SocketFrom).
	MungeSocket string
	// Auth is the agent's --auth: "" (munge where munged answers, else Consul's ACLs),
	// "munge" or "none".
	Auth string
	// Node is the node's name (the agent's --node-name, else the hostname).
	Node string
	// AdvertiseAddr is the agent's --advertise-addr; "" when not given.
	AdvertiseAddr string
	// TopologyFile is the agent's --topology-file; "" when it probes.
	TopologyFile string
	// Version is this binary's release (gangrun.Version: "0.1.0"), compared with the
	// releases the agents' node records carry (allocator.NodeRecord.Release).
	Version string
	// SysfsRoot and NVML are where the node is probed: "" and nil for this machine;
	// tests pass sysfs fixture trees and go-nvml's mock servers
	// (topology.ProbeOptions).
	SysfsRoot string
	NVML      nvml.Interface
	// SessionTTL bounds the clock's skew from the Consul servers' (store.SessionTTL
	// when 0).
	SessionTTL time.Duration
}

// run is one doctor run: the config and what earlier checks found that later ones use.
type run struct {
	cfg Config
	// consulUp: Consul answered the consul check; aclOn: its ACLs are on.
	consulUp, aclOn bool
	// inv is the node as probed (topology.NewProber), for gpus and nics.
	inv *topology.Inventory
}

// Checks are the checks' names, in the order Run runs them.
var Checks = []string{"consul", "munge", "cgroup", "gpus", "nics", "topology", "clock", "version"}

// Run runs every check in order and returns their results, one per check. It never
// stops at a failure: each check says what it found. ctx bounds the whole run (each
// Consul call is bounded by store.CallTimeout, munged's probe by 15 s).
func Run(ctx context.Context, cfg Config) []Result {
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = store.SessionTTL
	}
	r := &run{cfg: cfg}
	checks := map[string]func(context.Context) Result{
		"consul": r.consul, "munge": r.munge, "cgroup": r.cgroup, "gpus": r.gpus, "nics": r.nics,
		"topology": r.topology, "clock": r.clock, "version": r.version,
	}
	out := make([]Result, 0, len(Checks))
	for _, name := range Checks {
		res := checks[name](ctx)
		res.Check = name
		out = append(out, res)
	}
	return out
}

// Failed reports whether any result is Fail.
func Failed(results []Result) bool {
	for _, r := range results {
		if r.Status == Fail {
			return true
		}
	}
	return false
}

// Line is a result as `gangrun doctor` prints it: status, check, what was found and,
// after "; to fix: ", what to do.
func (r Result) Line() string {
	s := fmt.Sprintf("%-4s  %-8s  %s", r.Status, r.Check, r.Detail)
	if r.Fix != "" {
		s += "; to fix: " + r.Fix
	}
	return s
}

// consul checks that Consul answers with a token an agent may use, and has a leader.
func (r *run) consul(ctx context.Context) Result {
	s := r.cfg.Consul
	if s == nil {
		return Result{Status: Fail, Detail: fmt.Sprint(r.cfg.ConsulErr), Fix: "set consul = HOST:PORT in the agent's settings"}
	}
	addr, _ := s.Addr()
	who, err := acl.Whoami(ctx, s)
	switch {
	case err != nil && isUnavailable(err):
		detail := err.Error()
		var ue *store.UnavailableError
		if errors.As(err, &ue) && ue.Unreachable() {
			detail = fmt.Sprintf("cannot reach Consul at %s (%s): %s", ue.Addr, ue.From, ue.Cause())
		}
		return Result{Status: Fail, Detail: detail,
			Fix: "start Consul's agent on this node (systemctl start consul), or set consul = HOST:PORT in the agent's settings"}
	case err != nil && (isErr(err, acl.ErrNoToken) || isErr(err, acl.ErrForeignToken)):
		r.consulUp, r.aclOn = true, true
		detail := fmt.Sprintf("Consul at %s has its ACLs on, and %v", addr, err)
		if isErr(err, acl.ErrNoToken) { // Whoami's own advice is a user's
			detail = fmt.Sprintf("Consul at %s has its ACLs on, and no token was given or Consul does not know it", addr)
		}
		return Result{Status: Fail, Detail: detail,
			Fix: "set CONSUL_HTTP_TOKEN_FILE in agent.env to the agents' token (agent.token from gangrun acl bootstrap)"}
	case err != nil:
		return Result{Status: Fail, Detail: fmt.Sprintf("Consul at %s: %v", addr, err)}
	}
	r.consulUp, r.aclOn = true, who.Role != acl.RoleOpen
	leader, lerr := leaderOf(ctx, s)
	switch {
	case lerr != nil:
		return Result{Status: Fail, Detail: fmt.Sprintf("Consul at %s answers, but not who leads its servers: %v", addr, lerr),
			Fix: "check the servers: consul members; consul operator raft list-peers"}
	case leader == "":
		return Result{Status: Fail, Detail: fmt.Sprintf("Consul at %s answers, but its servers have no leader (quorum lost?): nothing can be written", addr),
			Fix: "bring a majority of the Consul servers back: consul operator raft list-peers"}
	}
	switch who.Role {
	case acl.RoleOpen:
		return Result{Status: Warn, Detail: fmt.Sprintf("Consul at %s answers (leader %s); its ACLs are off: a local user can write gangrun's records in Consul directly (stop or delete jobs, drain nodes)", addr, leader),
			Fix: "turn Consul's ACLs on and give the agents their token (docs/acl.md)"}
	case acl.RoleUser:
		return Result{Status: Fail, Detail: fmt.Sprintf("Consul at %s answers (leader %s), but the token is %s, not the agents'", addr, leader, who.Name()),
			Fix: "set CONSUL_HTTP_TOKEN_FILE in agent.env to the agents' token (agent.token from gangrun acl bootstrap)"}
	}
	return Result{Status: OK, Detail: fmt.Sprintf("Consul at %s answers (leader %s) with %s token", addr, leader, who.Name())}
}

// leaderOf asks Consul for its leader's address ("" when there is none).
func leaderOf(ctx context.Context, s store.ConsulClient) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, store.CallTimeout)
	defer cancel()
	return s.Client().Status().LeaderWithQueryOptions((&api.QueryOptions{}).WithContext(ctx))
}

// isUnavailable reports whether err is Consul not answering.
func isUnavailable(err error) bool { return errors.Is(err, store.ErrUnavailable) }

// isErr is errors.Is.
func isErr(err, target error) bool { return errors.Is(err, target) }
