package rendezvous

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/internal/store"
)

// Config is what a node brings to its job's rendezvous, before the coordinator settles
// what it leaves open (a Slurm allocation decides the job id, the node's name and the
// number of nodes).
type Config struct {
	// JobID names the job; "" lets the backend decide (Slurm: SLURM_JOB_ID) or
	// generates one ("gr-" and 12 hex digits) where nodes need not agree on it.
	JobID string
	// NodeName is this node's name; "" lets the backend decide (Slurm: this node's
	// entry in SLURM_JOB_NODELIST), else the hostname.
	NodeName string
	// MinNodes and MaxNodes are --nnodes MIN:MAX; NNodesGiven says the user gave them
	// (a backend that knows the node count refuses another one instead of replacing it).
	MinNodes, MaxNodes int
	NNodesGiven        bool
	// MaxRestarts is the job's restart budget (the dynamic rendezvous finishes a job that
	// runs out of it).
	MaxRestarts int
	// FollowRun joins the job's run as it stands (DynamicConfig.FollowRun): a cluster
	// job's step.
	FollowRun bool
	// AdvertiseAddr is the address other nodes reach this one at; "" lets the backend
	// choose (Consul: the local address of the route towards Consul).
	AdvertiseAddr string
	// Getenv reads the environment (SLURM_* variables); nil is os.Getenv.
	Getenv func(string) string
	// Log receives the rendezvous' messages; Events its events (nil: none).
	Log    *zap.Logger
	Events event.Sink
	// WrapStore, when set, wraps the store the Consul rendezvous runs on: a cluster
	// job's step seals the values it writes and takes only values its peers sealed
	// (identity.Sealed).
	WrapStore func(store.Store) store.Store
}

// Opened is a node's rendezvous as its backend opened it, with what the backend settled.
type Opened struct {
	Rendezvous Rendezvous
	// Backend names the backend: "embedded", "slurm" or "consul".
	Backend string
	// JobID, NodeName, MinNodes, MaxNodes and Addr are the settled values (Addr "" on
	// one node: the rendezvous uses the loopback address).
	JobID, NodeName    string
	MinNodes, MaxNodes int
	Addr               string
	// Shared is true when several nodes meet in the rendezvous (they share the job's
	// log and checkpoint directories); false for the embedded one-node rendezvous.
	Shared bool
	// GPUsOnNode is the number of GPUs the coordinator gave this node (Slurm's
	// SLURM_GPUS_ON_NODE); -1 when it does not say.
	GPUsOnNode int
	// SetsDevices is true when the coordinator sets CUDA_VISIBLE_DEVICES for the node's
	// processes itself (Slurm), so gangrun must not.
	SetsDevices bool
	// Store is the coordination store (Consul) the rendezvous runs on; nil when none.
	Store store.Store
	// Close leaves the rendezvous and releases what it holds; it may be called more
	// than once.
	Close func()
}

// UsageError is an Open error caused by the coordinator URL or the configuration given
// (a bad value, a conflict with the Slurm allocation): the user's to fix.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }

// Unwrap returns the cause.
func (e *UsageError) Unwrap() error { return e.Err }

func usage(format string, a ...any) error { return &UsageError{Err: fmt.Errorf(format, a...)} }

// backend opens one kind of coordinator. Adding a coordinator (etcd, say) is one file
// with a type implementing it and one line in backends.
type backend interface {
	// name is the backend's name, as --coordinator gives it or as its URL scheme.
	name() string
	// claims reports whether coordinator (a --coordinator value) names this backend.
	claims(coordinator string) bool
	// open opens the node's rendezvous; cfg.Getenv is set.
	open(ctx context.Context, coordinator string, cfg Config) (*Opened, error)
}

// backends lists the coordinators Open knows, in the order they are tried.
func backends() []backend { return []backend{embedded{}, slurm{}, consul{}, c10d{}, torchrunStatic{}} }

// Coordinators returns the accepted --coordinator forms, for help and errors:
// "embedded, slurm, consul://HOST:PORT, c10d://HOST:PORT or static://HOST:PORT?node_rank=N".
func Coordinators() string {
	return "embedded, slurm, consul://HOST:PORT, c10d://HOST:PORT or static://HOST:PORT?node_rank=N"
}

// Open opens this node's rendezvous on the coordinator a --coordinator value names:
// "embedded" (one node, in-process), "slurm" (a static rendezvous from SLURM_*
// variables), "consul://HOST:PORT" (nodes meet through Consul; "consul://" takes the
// address from CONSUL_HTTP_ADDR), "c10d://HOST:PORT" (torchrun's c10d endpoint: the
// node at HOST serves the others, ParseC10dURL), "static://HOST:PORT?node_rank=N"
// (torchrun's static rendezvous: the layout fixed by the command lines), or "" for the
// default: slurm inside a Slurm job step,
// else embedded. Errors the user must fix are *UsageError; nothing is held when Open
// returns an error.
func Open(ctx context.Context, coordinator string, cfg Config) (*Opened, error) {
	if cfg.Getenv == nil {
		cfg.Getenv = os.Getenv
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	cfg.MinNodes, cfg.MaxNodes = max(cfg.MinNodes, 1), max(cfg.MaxNodes, cfg.MinNodes, 1)
	if coordinator == "" {
		coordinator = "embedded"
		if InSlurmStep(cfg.Getenv) {
			coordinator = "slurm"
		}
	}
	if cfg.JobID != "" {
		if err := store.CheckSegment("--job-id", cfg.JobID); err != nil {
			return nil, &UsageError{Err: err}
		}
	}
	for _, b := range backends() {
		if !b.claims(coordinator) {
			continue
		}
		o, err := b.open(ctx, coordinator, cfg)
		if err != nil {
			return nil, err
		}
		o.Backend = b.name()
		if o.Close == nil {
			o.Close = func() {}
		}
		return o, nil
	}
	return nil, usage("--coordinator %q: want %s", coordinator, Coordinators())
}

// nodeName returns name, else the hostname, checked as a key segment: the node's name is
// a key in Consul, a name the other nodes see, and GANGRUN_NODE_NAME: one rule for all.
func nodeName(name string) (string, error) {
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", usage("--node-name not given and the hostname is unknown: %v", err)
		}
		name = h
	}
	if err := store.CheckNodeName("--node-name", name); err != nil {
		return "", &UsageError{Err: err}
	}
	return name, nil
}

// newJobID returns a fresh job id such as "gr-3f9a1c0b7d2e".
func newJobID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "gr-" + hex.EncodeToString(b[:])
}

// nnodesString is --nnodes as given: "N" or "MIN:MAX".
func nnodesString(lo, hi int) string {
	if lo == hi {
		return fmt.Sprint(lo)
	}
	return fmt.Sprintf("%d:%d", lo, hi)
}

// IsUsage reports whether err is the user's to fix (a *UsageError anywhere in its chain).
func IsUsage(err error) bool {
	var u *UsageError
	return errors.As(err, &u)
}
