// Package allocator reserves GPUs across nodes as a gang: all of a request's GPUs or
// none, each held through the requester's Consul session so that they come back by
// themselves when the holder dies.
//
// The parts, like Slurm's (slurmctld, salloc, squeue, scontrol, scancel):
//   - Agent (one per node) registers the node, its inventory and labels, and keeps a
//     session alive so the cluster sees it up; the agents elect one Scheduler.
//   - Client submits a Request under its own session and waits for its Grant.
//   - Scheduler orders pending requests by priority then arrival and places each
//     through the pipeline (pipeline.go, in Nomad's shape: the feasibility checkers of
//     feasible.go, then the node ranker ChooseNodes and the device ranker
//     ChooseDevices), keeps a reservation for the first request that does not fit so a
//     stream of small requests cannot starve it (reserve.go), and commits each grant in
//     fenced, chunked transactions (commit.go).
//
// Key layout in the coordination store (everything under Prefix):
//
//	gangrun/cluster/nodes/<node>        NodeRecord: address, labels, allocatable devices (agent)
//	gangrun/cluster/alive/<node>        locked by the agent's session: the node is up
//	gangrun/cluster/drain/<node>        Drain: the node takes no new grants (admin)
//	gangrun/cluster/requests/<id>       Request, locked by the requester's session
//	gangrun/cluster/grants/<id>         Grant, locked by the requester's session
//	gangrun/cluster/gpus/<node>/<dev>   the grant id, locked by the requester's session
//	gangrun/scheduler/leader            locked by the scheduling agent's session
//	gangrun/scheduler/status            SchedulerStatus: why each request waits
//	gangrun/inventory/<node>            the node's topology.Inventory (agent)
//
// A gang larger than one transaction (128 operations, 512 KiB) is committed in chunks
// (store.SplitTxn cuts them), and is never visible half-granted: its Grant record says
// "pending" until the last chunk has locked the last GPU, and a final transaction flips
// it to "granted". Readers count a grant only when it says "granted"; a pending grant
// whose scheduler died is rolled back by the next scheduler. Sessions use Behavior
// "delete", so when a holder dies, its request, grant and GPU keys disappear in one
// step, 2×TTL after its last renewal at most, and the GPUs can be locked again after
// GrantLockDelay.
package allocator

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gangrun/gangrun/failure"
	"github.com/gangrun/gangrun/internal/quote"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/topology"
)

// Key prefixes (see the package documentation).
const (
	Prefix = "gangrun/"
	// ClusterPrefix holds the allocator's cluster state (nodes, requests, grants, GPU
	// locks): one List of it is a consistent snapshot (Snapshot, CheckInvariants).
	ClusterPrefix   = Prefix + "cluster/"
	nodesPrefix     = ClusterPrefix + "nodes/"
	alivePrefix     = ClusterPrefix + "alive/"
	drainPrefix     = ClusterPrefix + "drain/"
	requestsPrefix  = ClusterPrefix + "requests/"
	grantsPrefix    = ClusterPrefix + "grants/"
	gpusPrefix      = ClusterPrefix + "gpus/"
	schedulerKey    = Prefix + "scheduler/leader"
	statusKey       = Prefix + "scheduler/status"
	inventoryPrefix = Prefix + "inventory/"
)

// Session settings.
const (
	// SessionTTL is the TTL of agent and grant sessions (store.SessionTTL, 20 s): a dead
	// holder's GPUs come back within 2×SessionTTL (Consul invalidates a session up to
	// twice its TTL after the last renewal) plus GrantLockDelay.
	SessionTTL = store.SessionTTL
	// GrantLockDelay is the lock-delay of grant sessions: after a holder dies, its GPUs
	// cannot be locked again for this long, so a holder that lost its session but still
	// runs (cut off from Consul) gets time to notice and stop.
	GrantLockDelay = 5 * time.Second
	// ReleaseBound is the longest a dead holder's GPUs stay unavailable.
	ReleaseBound = 2*SessionTTL + GrantLockDelay
)

// Label names with a meaning to the scheduler.
const (
	// LabelPartition is the node label --partition matches (Slurm's partition).
	LabelPartition = "partition"
	// LabelSwitch and LabelSpine place a node in the network tree (Slurm's
	// topology.conf leaf switch and the switch above it).
	LabelSwitch = "switch"
	LabelSpine  = "spine"
)

// NodeRecord is what an agent publishes about its node.
type NodeRecord struct {
	Name   string            `json:"name"`
	Addr   string            `json:"addr,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// Devices are the node's allocatable devices (topology.Inventory.Allocatable):
	// whole GPUs by index, MIG devices by UUID, with their model and health.
	Devices []topology.Device `json:"devices"`
	// GPUs is the number of GPUs, allocatable or not.
	GPUs int `json:"gpus"`
	// CPUs and MemoryMiB are the node's logical CPUs and memory in MiB, scheduled as
	// Slurm's CPUs and RealMemory are (resources.go; topology.CPUInfo.LogicalCPUs and
	// topology.Inventory.MemoryMiB); 0 when unknown (an older agent, an inventory
	// recorded without them): that resource is then not checked on the node.
	CPUs      int   `json:"cpus,omitempty"`
	MemoryMiB int64 `json:"memory_mib,omitempty"`
	// InventoryHash identifies the inventory stored under gangrun/inventory/<node>, so
	// readers fetch it again only when it changed.
	InventoryHash string `json:"inventory_hash"`
	// Registered is when the agent (re)registered.
	Registered time.Time `json:"registered"`
	// Auth is how the node's agent knows who submitted a job (agent --auth): "munge"
	// (MUNGE credentials), "acl" (Consul's ACL tokens only) or "none" (nothing
	// checked: every local user may act as any other).
	Auth string `json:"auth,omitempty"`
	// Release is the gangrun release of the node's agent ("0.1.0", as `gangrun
	// version` prints it; Slurm's slurmd version in `scontrol show node`); "" for an
	// agent older than the field.
	Release string `json:"release,omitempty"`
}

// Drain is an administrator's note that a node takes no new grants.
type Drain struct {
	// Reason is why, in words (scontrol's Reason=).
	Reason string `json:"reason"`
	// Kind is the failure that drained the node when gangrun drained it on its own
	// (failure.GPUHealth: the agent's health watch saw a GPU fail); "" for an operator's
	// drain, and in a record an older gangrun wrote.
	Kind failure.Kind `json:"kind,omitempty"`
	// Since is when the node was drained.
	Since time.Time `json:"since"`
}

// Request is a gang request: Nodes nodes with GPUsPerNode devices, CPUsPerNode CPUs and
// MemPerNodeMiB MiB of memory each.
type Request struct {
	ID string `json:"id"`
	// Nodes is how many nodes the request needs; MaxNodes, when larger, how many it
	// takes when they are free (a job's --nodes MIN:MAX).
	Nodes       int `json:"nodes"`
	MaxNodes    int `json:"max_nodes,omitempty"`
	GPUsPerNode int `json:"gpus_per_node"`
	// CPUsPerNode and MemPerNodeMiB are the CPUs and the memory (MiB) the request holds
	// on each of its nodes (resources.go): a job's tasks on the node times
	// --cpus-per-task, and its --mem (or --mem-per-cpu, --mem-per-gpu times the node's
	// CPUs or GPUs). 0 holds none; a request of no GPUs must ask for a CPU at least.
	CPUsPerNode   int   `json:"cpus_per_node,omitempty"`
	MemPerNodeMiB int64 `json:"mem_per_node_mib,omitempty"`
	// Nice is the job's --nice, already taken off Priority: kept so that sprio can
	// show it in its NICE column and the --priority alone under SITE.
	Nice int `json:"nice,omitempty"`
	// GPUModel, when set, must appear in the devices' model name, letter case aside
	// and '_' read as ' ' (gpuTypeMatches); without MIGProfile it asks for whole GPUs
	// only.
	GPUModel string `json:"gpu_model,omitempty"`
	// MIGProfile, when set, asks for MIG devices of that profile ("3g.40gb"), as
	// --gpus-per-node 3g.40gb:2 does (ParseGPUs); unset, any allocatable device counts,
	// a MIG device or a whole GPU.
	MIGProfile string `json:"mig_profile,omitempty"`
	// Partition, when set, must equal the node's "partition" label.
	Partition string `json:"partition,omitempty"`
	// Labels must all equal the node's labels.
	Labels map[string]string `json:"labels,omitempty"`
	// Priority orders the queue: higher first, then arrival.
	Priority int `json:"priority"`
	// QOS is the job's --qos ("": its account's), whose priority and limits the
	// policy applies.
	QOS string `json:"qos,omitempty"`
	// Wait is how long the request may wait for its grant; 0 waits forever.
	Wait time.Duration `json:"wait"`
	// Holder describes who asked ("user@host pid 123").
	Holder string `json:"holder"`
	// Session is the requester's session, which holds the request, grant and GPUs; ""
	// for a job's request.
	Session   string    `json:"session"`
	Submitted time.Time `json:"submitted"`
	// Job, when set, makes the request a cluster job's: durable, held by no session (it
	// outlives its submitter), and granted with each node's GPU keys locked by that
	// node's agent session (GrantNode.Session), which the job's step on the node then
	// takes over (HandOver). The job removes the request, and its grant, when it ends.
	Job string `json:"job,omitempty"`
	// Exclude names nodes the request must not be placed on (a job placed again after
	// losing them). ExcludeSession, for such a node, is the node's agent session when
	// it was lost: the exclusion holds only while that agent lives on (its session is
	// the node's alive session), and lapses once the agent has restarted or the node
	// went down and came back, since what failed there may have been the agent or
	// the step rather than the node.
	Exclude        []string          `json:"exclude,omitempty"`
	ExcludeSession map[string]string `json:"exclude_session,omitempty"`
	// User and Account are who submitted it and the account charged (a job's); the
	// policy's limits and fair-share count them (policy.Job). TimeLimit is the job's
	// --time (0: none), which a partition's max_time bounds.
	User      string        `json:"user,omitempty"`
	Account   string        `json:"account,omitempty"`
	TimeLimit time.Duration `json:"time_limit,omitempty"`
	// PartitionNodes, when set, are the node labels that make up Partition (the
	// policy's partitions.<name>.nodes), in place of the label partition=<Partition>.
	// The scheduler sets it from the policy at each pass; it is not stored.
	PartitionNodes map[string]string `json:"-"`
	// Spares, of Nodes (and MaxNodes), are a job's --spare-nodes, which CheckFeasible's
	// refusal names apart from its --nodes, as the user gave them. The submit sets it;
	// it is not stored.
	Spares int `json:"-"`
	// NodeChoice is --exclusive, --constraint, --nodelist and --exclude (nodechoice.go).
	NodeChoice
}

// nodesFlags writes the request's node count as the flags that asked for it:
// "--nodes 2", "--nodes 2:4", "--nodes 2 --spare-nodes 1".
func (r Request) nodesFlags() string {
	s := fmt.Sprintf("--nodes %d", r.Nodes-r.Spares)
	if r.MaxNodes > r.Nodes {
		s += fmt.Sprintf(":%d", r.MaxNodes-r.Spares)
	}
	if r.Spares > 0 {
		s += fmt.Sprintf(" --spare-nodes %d", r.Spares)
	}
	return s
}

// Durable reports whether the request is a job's, held by no session.
func (r Request) Durable() bool { return r.Job != "" }

// Validate checks the request's own fields: counts of at least 1, no negative wait,
// labels as CheckLabels wants them, and a partition and GPU model of printable text.
func (r Request) Validate() error {
	switch {
	case r.Nodes < 1:
		return fmt.Errorf("--nodes %d: must be at least 1", r.Nodes)
	case r.GPUsPerNode < 0 || (r.GPUsPerNode == 0 && r.CPUsPerNode < 1):
		return fmt.Errorf("--gpus-per-node %d: must be at least 1", r.GPUsPerNode)
	case r.CPUsPerNode < 0 || r.CPUsPerNode > MaxCPUsPerNode:
		return fmt.Errorf("%d CPUs per node: want 0 to %d", r.CPUsPerNode, MaxCPUsPerNode)
	case r.MemPerNodeMiB < 0 || r.MemPerNodeMiB > MaxMemPerNodeMiB:
		return fmt.Errorf("%dM of memory per node: want 0 to %dM", r.MemPerNodeMiB, MaxMemPerNodeMiB)
	case r.Wait < 0:
		return fmt.Errorf("--wait %s: must not be negative", r.Wait)
	case r.Nodes > MaxNodes:
		return fmt.Errorf("--nodes %d: want at most %d", r.Nodes, MaxNodes)
	case r.GPUsPerNode > MaxGPUsPerNode:
		return fmt.Errorf("--gpus-per-node %d: want at most %d devices on one node", r.GPUsPerNode, MaxGPUsPerNode)
	case r.Priority > MaxPriority || r.Priority < -MaxPriority:
		return fmt.Errorf("--priority %d: want %d to %d (Slurm's job priority is 32-bit)", r.Priority, -MaxPriority, MaxPriority)
	}
	for _, f := range []struct{ what, v string }{{"--partition", r.Partition}, {"--gpu-model", r.GPUModel}, {"--account", r.Account}} {
		if len(f.v) > maxNameBytes {
			return fmt.Errorf("%s %s: longer than %d bytes", f.what, quote.Q(f.v), maxNameBytes)
		}
	}
	if err := checkPrintable("--partition", r.Partition); err != nil {
		return err
	}
	if err := checkPrintable("--gpu-model", r.GPUModel); err != nil {
		return err
	}
	if r.MIGProfile != "" && !migProfileRE.MatchString(r.MIGProfile) {
		return fmt.Errorf("--gpus-per-node %s:%d: %q is not a MIG profile (like 1g.10gb, 3g.40gb, 1g.10gb+me)", r.MIGProfile, r.GPUsPerNode, r.MIGProfile)
	}
	if err := r.NodeChoice.Validate(); err != nil {
		return err
	}
	return CheckLabels(r.Labels)
}

// migProfileRE matches NVIDIA's MIG profile names: compute slices "g." memory "gb",
// with an optional "+me" (media extensions) or similar suffix ("1g.10gb", "3g.40gb",
// "1g.10gb+me", "1g.20gb"), the names nvidia-smi mig -lgip lists.
var migProfileRE = regexp.MustCompile(`^[1-9][0-9]?g\.[1-9][0-9]*gb(\+[a-z]+)?$`)

// ParseGPUs parses a --gpus-per-node value in Slurm's form [TYPE:]COUNT (sbatch
// --gpus-per-node=[type:]number): COUNT devices on each node, of TYPE when given. A
// TYPE that is a MIG profile name ("3g.40gb:2") asks for MIG devices of that profile
// (profile); any other TYPE ("h100:8") is a GPU model, matched as --gpu-model is
// (model). Errors name the value: a count that is not a whole number of at least 1, an
// empty or unprintable type.
//
// The count is at most MaxGPUsPerNode, the type at most 64 bytes.
func ParseGPUs(s string) (count int, profile, model string, err error) {
	typ, num, typed := strings.Cut(s, ":")
	if !typed {
		num, typ = s, ""
	}
	count, cerr := strconv.Atoi(num)
	switch {
	case cerr != nil || count < 1:
		return 0, "", "", fmt.Errorf("--gpus-per-node %q: want [TYPE:]COUNT, a count of at least 1 (8, h100:8, 3g.40gb:2)", s)
	case typed && typ == "":
		return 0, "", "", fmt.Errorf("--gpus-per-node %q: empty type before ':'", s)
	case count > MaxGPUsPerNode:
		return 0, "", "", fmt.Errorf("--gpus-per-node %d: want at most %d devices on one node", count, MaxGPUsPerNode)
	case len(typ) > maxGPUTypeBytes:
		return 0, "", "", fmt.Errorf("--gpus-per-node %s: a type longer than %d bytes", quote.Q(s), maxGPUTypeBytes)
	}
	if err := checkPrintable("--gpus-per-node", typ); err != nil {
		return 0, "", "", err
	}
	if migProfileRE.MatchString(strings.ToLower(typ)) {
		return count, strings.ToLower(typ), "", nil
	}
	return count, "", typ, nil
}

// MaxNodes bounds a request's nodes: as `gangrun run --nnodes` (launcher.MaxNNodes).
const MaxNodes = 65536

// MaxPriority bounds a request's --priority either way: Slurm keeps a job's priority
// as a 32-bit unsigned number; gangrun takes the negative ones too.
const MaxPriority = 1<<32 - 1

// maxNameBytes bounds a partition, GPU model or account name as asked, in bytes.
const maxNameBytes = 128

// MaxGPUsPerNode bounds a request's devices per node: more than any node holds (a DGX
// of 8 GPUs cut into 7 MIG devices each has 56), with room for larger machines.
const MaxGPUsPerNode = 1024

// MaxCPUsPerNode bounds a request's CPUs per node, far above any node's.
const MaxCPUsPerNode = 1 << 20

// MaxMemPerNodeMiB bounds a request's memory per node: 1 EiB in MiB, far above any
// node's (cgroup.MaxMem bounds a step's limit at 1 PiB).
const MaxMemPerNodeMiB = 1 << 40

// maxGPUTypeBytes bounds a GPU model or MIG profile as asked, in bytes.
const maxGPUTypeBytes = 64

// wants reports whether device d is of the kind r asks for: its model (GPUModel, a
// case-insensitive substring) and, with MIGProfile, a MIG device of that profile. A
// model without a profile asks for whole GPUs of that model, as a typed GPU request in
// Slurm does: never a MIG device, nor a gang mixing both.
func (r Request) wants(d topology.Device) bool {
	if r.MIGProfile != "" && !strings.EqualFold(d.MIGProfile, r.MIGProfile) {
		return false
	}
	if r.MIGProfile == "" && r.GPUModel != "" && d.MIGProfile != "" {
		return false
	}
	return r.GPUModel == "" || gpuTypeMatches(d.Model, r.GPUModel)
}

// devices counts n of the devices r asks for, for messages, with adj before the noun:
// "2 free GPUs (H100)", "1 free 3g.40gb MIG device".
func (r Request) devices(n int, adj string) string {
	noun := "GPU"
	if r.MIGProfile != "" {
		noun = r.MIGProfile + " MIG device"
	}
	if adj != "" {
		noun = adj + " " + noun
	}
	s := plural(n, noun)
	if r.GPUModel != "" {
		s += " (" + r.GPUModel + ")"
	}
	return s
}

// CheckLabels refuses labels that could not be written back as --labels KEY=VALUE,...
// or would show raw in `gangrun nodes`: an empty name; '=' or ',' in a name; ',' in a
// value; and, in either, a control character (newline, tab, escape), a Unicode format
// character (the right-to-left override U+202E, a zero-width space) or invalid UTF-8.
// The error quotes the label with %q, so nothing raw reaches a terminal.
func CheckLabels(labels map[string]string) error {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the same label reported first every time
	for _, k := range keys {
		v := labels[k]
		switch {
		case k == "":
			return fmt.Errorf("--labels %q: empty label name", "="+v)
		case strings.ContainsAny(k, "=,"):
			return fmt.Errorf("--labels: label name %q: no '=' or ',' in a name", k)
		case strings.Contains(v, ","):
			return fmt.Errorf("--labels %q: no ',' in a value (',' separates labels)", k+"="+v)
		case len(k) > maxNameBytes || len(v) > maxNameBytes:
			return fmt.Errorf("--labels %s: a name or value longer than %d bytes", quote.Q(k+"="+v), maxNameBytes)
		}
		if err := checkPrintable("--labels", k+"="+v); err != nil {
			return err
		}
	}
	return nil
}

// MaxReasonBytes bounds a drain reason: a line of `gangrun nodes`, kept on the node's
// drain key (Slurm's reasons are a short line too).
const MaxReasonBytes = 512

// CheckReason refuses a drain reason that is empty, longer than MaxReasonBytes, or not
// one line of printable text: it is a cell of `gangrun nodes`' table.
func CheckReason(reason string) error {
	if strings.TrimSpace(reason) == "" {
		return errors.New("--reason is required (it shows in gangrun nodes)")
	}
	if len(reason) > MaxReasonBytes {
		return fmt.Errorf("--reason of %d bytes (%.40q...): want at most %d, one line for gangrun nodes", len(reason), reason, MaxReasonBytes)
	}
	return checkPrintable("--reason", reason)
}

// checkPrintable refuses text that would show raw, or invisibly reordered, in gangrun's
// tables and logs: a control character (newline, tab, escape, DEL, C1), a Unicode format
// character (U+202E right-to-left override, U+200B zero-width space, U+FEFF) or invalid
// UTF-8. what names the flag; the text is quoted with %q.
func checkPrintable(what, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s %q: not valid UTF-8", what, s)
	}
	for _, c := range s {
		if unicode.IsControl(c) || unicode.Is(unicode.Cf, c) {
			return fmt.Errorf("%s %q: holds the invisible character %U (%s): only printable text is allowed", what, s, c, charName(c))
		}
	}
	return nil
}

// charName names the characters people paste by mistake; others by category.
func charName(c rune) string {
	switch c {
	case '\n':
		return "newline"
	case '\r':
		return "carriage return"
	case '\t':
		return "tab"
	case 0x1b:
		return "escape"
	case 0:
		return "NUL"
	case 0x202e:
		return "right-to-left override"
	case 0x202d:
		return "left-to-right override"
	case 0x200b:
		return "zero-width space"
	case 0xfeff:
		return "byte order mark"
	}
	if unicode.IsControl(c) {
		return "a control character"
	}
	return "a format character"
}

// GrantState is a grant's state, as its record and `gangrun queue` write it.
type GrantState string

// Grant states.
const (
	GrantPending GrantState = "pending" // chunks are being locked; not a grant yet
	GrantGranted GrantState = "granted"
	GrantRefused GrantState = "refused"
)

// GrantNode is one node of a grant.
type GrantNode struct {
	Name string `json:"name"`
	Addr string `json:"addr,omitempty"`
	// GPUs are the parent GPU indices of Devices, in the same order.
	GPUs []int `json:"gpus"`
	// Devices are the device IDs (CUDA_VISIBLE_DEVICES entries).
	Devices []string `json:"devices"`
	// CPUs and MemoryMiB are the CPUs and memory (MiB) the grant holds on the node
	// (Request.CPUsPerNode, MemPerNodeMiB); 0 in a grant an older gangrun wrote.
	CPUs      int   `json:"cpus,omitempty"`
	MemoryMiB int64 `json:"memory_mib,omitempty"`
	// Session, in a job's grant, is the session that holds this node's GPU keys: the
	// node's agent's when granted, its step's once the step took them over. "" in a
	// grant of a requester's session (Grant.Session holds every key).
	Session string `json:"session,omitempty"`
}

// Grant is the scheduler's answer to a request.
type Grant struct {
	ID      string      `json:"id"`
	State   GrantState  `json:"state"`
	Nodes   []GrantNode `json:"nodes,omitempty"`
	Reason  string      `json:"reason,omitempty"` // why refused
	Session string      `json:"session"`
	Granted time.Time   `json:"granted,omitzero"`
}

// KeySession returns the session that must hold node gn's GPU keys of grant g: the
// node's own for a job's grant, else the grant's.
func (g Grant) KeySession(gn GrantNode) string {
	if gn.Session != "" {
		return gn.Session
	}
	return g.Session
}

// DeviceCount returns the number of devices in the grant.
func (g Grant) DeviceCount() int {
	n := 0
	for _, gn := range g.Nodes {
		n += len(gn.Devices)
	}
	return n
}

// SchedulerStatus is what the scheduler publishes after each pass.
type SchedulerStatus struct {
	// Pending maps each waiting request to why it waits ("Resources", as squeue's
	// reason column, spelled out).
	Pending map[string]string `json:"pending"`
	// Reserved maps a request to the nodes kept for it.
	Reserved map[string][]string `json:"reserved,omitempty"`
	Leader   string              `json:"leader"`
	Updated  time.Time           `json:"updated"`
}

func gpuKey(node, dev string) string { return gpusPrefix + node + "/" + dev }

// parseGPUKey splits gangrun/cluster/gpus/<node>/<dev>.
func parseGPUKey(key string) (node, dev string, ok bool) {
	rest, ok := strings.CutPrefix(key, gpusPrefix)
	if !ok {
		return "", "", false
	}
	node, dev, ok = strings.Cut(rest, "/")
	return node, dev, ok && node != "" && dev != ""
}

// mustRecord is v as a record of kind k (schema.Marshal: its schema version first).
func mustRecord(k schema.Kind, v any) []byte {
	b, err := schema.Marshal(k, v)
	if err != nil {
		panic(fmt.Sprintf("allocator: marshal %T: %v", v, err)) // only plain structs are marshalled
	}
	return b
}

// ErrNotFound means a node, request or grant does not exist.
var ErrNotFound = errors.New("not found")

// ErrJobRequest means a request or grant is a cluster job's: it is ended through the
// job (gangrun cancel JOBID), not released on its own.
var ErrJobRequest = errors.New("a cluster job's request: cancel the job instead")

// plural renders n with its noun: "1 node", "2 nodes".
func plural(n int, noun string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
