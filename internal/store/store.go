// Package store is gangrun's coordination store: a small key/value interface with
// Consul's semantics — consistent reads, sessions that hold keys and die with their
// holder, all-or-nothing multi-key transactions, and blocking queries — so that the
// allocator and the rendezvous are written once and run on Consul or, within one
// process, on the in-memory twin (Memory).
//
// The rules come from Consul (its documentation and agent/consul/state):
//   - a session has a TTL of 10s..24h and is invalidated up to 2×TTL after its last
//     renewal; on invalidation its keys are released or deleted (Behavior) and, for
//     LockDelay (default 15s in Consul, at most 60s), no other session may lock them;
//   - a transaction holds at most 128 operations and 512 KiB and applies all of them
//     or none;
//   - a blocking query returns when the index passes the one given or the wait time
//     (at most 10 minutes) ends; a return is no proof of a change, and an index that
//     goes backwards means "start again from 0".
package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gangrun/gangrun/internal/quote"
)

// Limits of Consul's transaction endpoint (agent/txn_endpoint.go: maxTxnOps; the
// txn_max_req_len default) and session endpoint (agent/structs: SessionTTLMin/Max,
// MaxLockDelay).
const (
	MaxTxnOps     = 128
	MaxTxnBytes   = 512 << 10
	MinSessionTTL = 10 * time.Second
	MaxSessionTTL = 24 * time.Hour
	MaxLockDelay  = 60 * time.Second
	MaxWaitTime   = 10 * time.Minute
	// ttlMultiplier: sessions are invalidated 2×TTL after the last renewal.
	ttlMultiplier = 2
)

// Entry is one key.
type Entry struct {
	Key   string
	Value []byte
	// CreateIndex and ModifyIndex are the store indices of the key's creation and last
	// change; ModifyIndex is what CAS and check-index compare against.
	CreateIndex uint64
	ModifyIndex uint64
	// LockIndex counts how many times the key has been locked.
	LockIndex uint64
	// Session is the session holding the key's lock; "" when unlocked.
	Session string
}

// Verb is a transaction operation (Consul's KV txn verbs).
type Verb string

// The verbs Txn accepts.
const (
	// Set writes Value; a lock on the key is kept.
	Set Verb = "set"
	// CAS writes Value if the key's ModifyIndex equals Index (0: the key must not exist).
	CAS Verb = "cas"
	// Delete removes the key (no error when absent).
	Delete Verb = "delete"
	// DeleteCAS removes the key if its ModifyIndex equals Index.
	DeleteCAS Verb = "delete-cas"
	// DeleteTree removes every key under the prefix Key.
	DeleteTree Verb = "delete-tree"
	// Lock writes Value and locks the key with Session; it fails when another session
	// holds the key or the key is within a lock-delay.
	Lock Verb = "lock"
	// Unlock writes Value and releases the key if Session holds it.
	Unlock Verb = "unlock"
	// Get returns the key (it fails when the key does not exist).
	Get Verb = "get"
	// CheckIndex fails unless the key's ModifyIndex equals Index.
	CheckIndex Verb = "check-index"
	// CheckNotExists fails if the key exists.
	CheckNotExists Verb = "check-not-exists"
	// CheckSession fails unless Session holds the key.
	CheckSession Verb = "check-session"
)

// Op is one transaction operation.
type Op struct {
	Verb    Verb
	Key     string
	Value   []byte
	Index   uint64
	Session string
}

// TxnResult is what an applied transaction returns.
type TxnResult struct {
	// Entries are the results of Get operations, in order.
	Entries []Entry
	// Index is the store index the transaction was applied at, when the store reports
	// it (a transaction that sets or locks a key); 0 when unknown. A List whose index is
	// at least Index sees the transaction's writes.
	Index uint64
}

// Why one operation made a transaction fail. Each reason is also a sentinel error:
// errors.Is(err, ErrLockHeld) holds for a *TxnError with an operation rejected for that
// reason, so callers never read the store's wording.
var (
	// ErrLockHeld: a Lock on a key another session holds.
	ErrLockHeld = errors.New("lock held by another session")
	// ErrLockDelay: a Lock on a key within the lock-delay of a session that held it and
	// was invalidated (Consul's "lock-delay", default 15 s).
	ErrLockDelay = errors.New("key in lock-delay")
	// ErrStaleIndex: a CAS, DeleteCAS or CheckIndex whose index is not the key's.
	ErrStaleIndex = errors.New("index is stale")
	// ErrKeyNotFound: a Get or CheckIndex on a key that does not exist.
	ErrKeyNotFound = errors.New("key does not exist")
	// ErrKeyExists: a CheckNotExists on a key that exists.
	ErrKeyExists = errors.New("key exists")
	// ErrNotLockHolder: a CheckSession or Unlock on a key the session does not hold.
	ErrNotLockHolder = errors.New("key not held by the session")
	// ErrTxnTooLarge: a transaction over MaxTxnOps operations or MaxTxnBytes; refused
	// before it is sent.
	ErrTxnTooLarge = errors.New("transaction too large")
)

// OpError says why one operation made a transaction fail.
type OpError struct {
	// Op is the operation's position in the transaction.
	Op int
	// Key is the operation's key ("" when the store did not say).
	Key string
	// Reason is one of the reason sentinels above (ErrLockHeld, ErrLockDelay, ...), or
	// ErrSessionGone for a Lock with a session that does not exist; nil when the store's
	// reason is none of them.
	Reason error
	// What is the store's own description.
	What string
}

// TxnError is returned by Txn when the transaction was rejected as a whole; nothing
// was applied. errors.Is(err, ErrTxnRejected) holds, and errors.Is(err, R) for the
// Reason R of any of its operations.
type TxnError struct {
	Errors []OpError
}

// ErrTxnRejected marks a transaction that was rejected: a check failed, a lock is held
// or in lock-delay, a CAS index did not match.
var ErrTxnRejected = errors.New("transaction rejected")

func (e *TxnError) Error() string {
	parts := make([]string, 0, len(e.Errors))
	for _, oe := range e.Errors {
		parts = append(parts, fmt.Sprintf("op %d: %s", oe.Op, oe.What))
	}
	return "transaction rejected: " + strings.Join(parts, "; ")
}

// Is makes errors.Is(err, ErrTxnRejected) true, and errors.Is(err, R) for every Reason
// R of an operation.
func (e *TxnError) Is(target error) bool {
	if target == ErrTxnRejected {
		return true
	}
	for _, oe := range e.Errors {
		if oe.Reason != nil && oe.Reason == target {
			return true
		}
	}
	return false
}

// NotHolding reports whether err is a transaction rejected because a CheckSession or
// Unlock of key failed: the session named there does not hold key (or no longer
// exists). A fence on one key (a leader's) is told apart this way from other keys'
// checks failing in the same kind of transaction.
func NotHolding(err error, key string) bool {
	var te *TxnError
	if !errors.As(err, &te) {
		return false
	}
	for _, oe := range te.Errors {
		if oe.Key == key && (oe.Reason == ErrNotLockHolder || oe.Reason == ErrSessionGone) {
			return true
		}
	}
	return false
}

// LockDelayed returns the keys whose Lock failed because of a lock-delay.
func (e *TxnError) LockDelayed() []string {
	var keys []string
	for _, oe := range e.Errors {
		if oe.Reason == ErrLockDelay && oe.Key != "" {
			keys = append(keys, oe.Key)
		}
	}
	return keys
}

// Behavior is what happens to a session's keys when it is invalidated.
type Behavior string

// Session behaviors (Consul's session Behavior).
const (
	Release Behavior = "release"
	// DeleteKeys deletes the session's keys.
	DeleteKeys Behavior = "delete"
)

// SessionOptions configure a new session.
type SessionOptions struct {
	// Name describes the holder ("gangrun agent node-a").
	Name string
	// TTL must be renewed within; MinSessionTTL..MaxSessionTTL.
	TTL time.Duration
	// LockDelay keeps other sessions from locking this session's keys for this long
	// after it is invalidated; 0..MaxLockDelay.
	LockDelay time.Duration
	// Behavior: Release (default) or DeleteKeys.
	Behavior Behavior
	// NodeHealth ties the session to the health of the Consul node the client talks to
	// (Consul's default serfHealth check); false makes a TTL-only session.
	NodeHealth bool
}

// Validate checks the options against Consul's limits.
func (o SessionOptions) Validate() error {
	if o.TTL < MinSessionTTL || o.TTL > MaxSessionTTL {
		return fmt.Errorf("session TTL %s: want %s..%s (Consul's limits)", o.TTL, MinSessionTTL, MaxSessionTTL)
	}
	if o.LockDelay < 0 || o.LockDelay > MaxLockDelay {
		return fmt.Errorf("session lock-delay %s: want 0..%s (Consul's limit)", o.LockDelay, MaxLockDelay)
	}
	if o.Behavior != "" && o.Behavior != Release && o.Behavior != DeleteKeys {
		return fmt.Errorf("session behavior %q: want release or delete", o.Behavior)
	}
	return nil
}

// ErrSessionGone means the session no longer exists (expired or destroyed).
var ErrSessionGone = errors.New("session no longer exists")

// ErrUnavailable marks an error of a store that could not be asked, or did not answer in
// time: Consul unreachable, a partition, no cluster leader (an election), a server
// error (HTTP 5xx). Asking again later may succeed. Errors the store gave as an answer
// (a rejected transaction, a gone session, an ACL refusal) are not unavailability.
var ErrUnavailable = errors.New("coordinator unavailable")

// UnavailableError is an error marked ErrUnavailable: Op is what was asked ("consul txn",
// "consul list gangrun/jobs/x/"), Err the cause.
type UnavailableError struct {
	Op  string
	Err error
	// Addr and From are set when no connection to Consul could be made at all (refused,
	// no such host, no route, a dial timeout): the address dialled and where it came
	// from ("--consul", "CONSUL_HTTP_ADDR", "the default"). Error then says so in
	// words a user can act on, instead of the request's URL.
	Addr, From string
}

// Error returns "OP: CAUSE", or for a connection that could not be made "cannot reach
// Consul at ADDR (FROM): CAUSE; start a Consul agent there, or give its address with
// --consul or CONSUL_HTTP_ADDR".
func (e *UnavailableError) Error() string {
	if e.Addr == "" {
		return e.Op + ": " + e.Err.Error()
	}
	return fmt.Sprintf("cannot reach Consul at %s (%s): %s; start a Consul agent there, or give its address with --consul or CONSUL_HTTP_ADDR",
		e.Addr, e.From, dialCause(e.Err))
}

// Unreachable reports whether the error is a connection that could not be made (Addr
// set): the message a command prints alone, without the operations that wrap it.
func (e *UnavailableError) Unreachable() bool { return e.Addr != "" }

// Cause is the system's reason a connection could not be made ("connection refused",
// "no such host \"h\""), for a message that gives its own advice; Err's text otherwise.
func (e *UnavailableError) Cause() string {
	if e.Addr == "" {
		return e.Err.Error()
	}
	return dialCause(e.Err)
}

// dialCause returns the system's reason a dial failed ("connection refused", "no such
// host", "i/o timeout"), without the URL and the addresses net/http puts around it.
func dialCause(err error) string {
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return "no such host " + strconv.Quote(dns.Name)
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		if oe.Timeout() {
			return "no answer to the connection (timed out)"
		}
		return oe.Err.Error()
	}
	return err.Error()
}

// Unwrap returns the cause.
func (e *UnavailableError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrUnavailable) true.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// ErrPermissionDenied marks a request Consul's ACL system refused: the token (from
// CONSUL_HTTP_TOKEN or CONSUL_HTTP_TOKEN_FILE) is unknown, or its policies do not let
// it read or write the key (Consul answers HTTP 403; in a transaction, the operation's
// error says "Permission denied"). Asking again with the same token fails the same way.
var ErrPermissionDenied = errors.New("permission denied")

// PermissionError is an error marked ErrPermissionDenied: Op is what was asked, Err
// Consul's answer (which names the token by its AccessorID, never by its secret).
type PermissionError struct {
	Op  string
	Err error
}

func (e *PermissionError) Error() string { return e.Op + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *PermissionError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrPermissionDenied) true.
func (e *PermissionError) Is(target error) bool { return target == ErrPermissionDenied }

// Store is the coordination store. Implementations: Consul (NewConsul) and Memory
// (NewMemory). All methods are safe for concurrent use.
type Store interface {
	// Get returns the key, or nil when it does not exist. Reads are consistent.
	Get(ctx context.Context, key string) (*Entry, error)
	// List returns every key under prefix, sorted, and the store index of the result.
	// Reads are consistent.
	List(ctx context.Context, prefix string) ([]Entry, uint64, error)
	// Keys returns the names of the keys under prefix, sorted, and the index List would
	// return (Consul's ?keys): a cheap way to tell whether anything under prefix changed
	// since a List (the same names and index: nothing was written or deleted). Reads are
	// consistent.
	Keys(ctx context.Context, prefix string) ([]string, uint64, error)
	// WatchList is a blocking List: it returns when the prefix's index passes index, or
	// after wait (at most MaxWaitTime), or when ctx ends (with ctx's error). index 0
	// returns at once.
	WatchList(ctx context.Context, prefix string, index uint64, wait time.Duration) ([]Entry, uint64, error)
	// Txn applies ops atomically (at most MaxTxnOps, MaxTxnBytes). A rejection is a
	// *TxnError (errors.Is ErrTxnRejected); other errors mean the store could not be
	// asked (if ctx ended mid-request, the transaction may have been applied).
	Txn(ctx context.Context, ops []Op) (TxnResult, error)
	// CreateSession creates a session and returns its ID.
	CreateSession(ctx context.Context, o SessionOptions) (string, error)
	// RenewSession resets the session's TTL; ErrSessionGone when it no longer exists.
	RenewSession(ctx context.Context, id string) error
	// DestroySession invalidates the session now (its keys are released or deleted, and
	// its lock-delay starts). Destroying a missing session is not an error.
	DestroySession(ctx context.Context, id string) error
	// SessionExists reports whether the session is alive.
	SessionExists(ctx context.Context, id string) (bool, error)
}

// CheckTxn validates ops against the transaction limits before they are sent; an
// error wraps ErrTxnTooLarge (or says the transaction is empty).
func CheckTxn(ops []Op) error {
	if len(ops) == 0 {
		return errors.New("empty transaction")
	}
	if len(ops) > MaxTxnOps {
		return fmt.Errorf("%w: %d operations, Consul allows at most %d", ErrTxnTooLarge, len(ops), MaxTxnOps)
	}
	size := 0
	for _, op := range ops {
		size += opBytes(op)
	}
	if size > MaxTxnBytes {
		return fmt.Errorf("%w: about %d bytes, Consul allows at most %d", ErrTxnTooLarge, size, MaxTxnBytes)
	}
	return nil
}

// opBytes estimates one operation's share of a transaction request: JSON with the
// value base64-encoded (4 bytes per 3), plus the per-operation framing.
func opBytes(op Op) int { return len(op.Key) + (len(op.Value)+2)/3*4 + len(op.Session) + 96 }

// SplitTxn splits ops into transactions that each begin with fence (checks every chunk
// must repeat: a check-session on a leader key, a check-index on a state) and stay within
// MaxTxnOps operations and MaxTxnBytes: the one place the chunking rule lives. Operations
// keep their order. It fails (ErrTxnTooLarge) when fence alone, or fence and any single
// operation, exceeds the limits. No ops gives no transactions.
func SplitTxn(fence, ops []Op) ([][]Op, error) {
	fenceBytes := 0
	for _, op := range fence {
		fenceBytes += opBytes(op)
	}
	if len(fence) >= MaxTxnOps || fenceBytes >= MaxTxnBytes {
		return nil, fmt.Errorf("%w: a fence of %d operations leaves no room", ErrTxnTooLarge, len(fence))
	}
	var out [][]Op
	cur := append([]Op(nil), fence...)
	size := fenceBytes
	for _, op := range ops {
		b := opBytes(op)
		if fenceBytes+b > MaxTxnBytes {
			return nil, fmt.Errorf("%w: operation on %s of about %d bytes", ErrTxnTooLarge, op.Key, b)
		}
		if len(cur) == MaxTxnOps || size+b > MaxTxnBytes {
			out = append(out, cur)
			cur, size = append([]Op(nil), fence...), fenceBytes
		}
		cur = append(cur, op)
		size += b
	}
	if len(cur) > len(fence) {
		out = append(out, cur)
	}
	return out, nil
}

// CheckSegment checks a name used as one segment of a key (a node name, a job or request
// id): letters, digits, '-', '_' and '.' only, and not empty, so it can neither escape
// its prefix ("../x", "a/b") nor collide with another key. what names the value in the
// error.
//
// It is at most MaxSegmentBytes long: ids and names also become file names (a job's
// scratch directory, its output file), whose components Linux holds to 255 bytes.
func CheckSegment(what, s string) error {
	if s == "" || s == "." || s == ".." {
		return fmt.Errorf("%s %q: want a name of letters, digits, '-', '_' and '.'", what, s)
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("%s %s: only letters, digits, '-', '_' and '.' are allowed", what, quote.Q(s))
		}
	}
	if len(s) > MaxSegmentBytes {
		return fmt.Errorf("%s %s: longer than %d bytes", what, quote.Q(s), MaxSegmentBytes)
	}
	return nil
}

// MaxSegmentBytes is the longest key segment (an id, a name) CheckSegment takes, in
// bytes.
const MaxSegmentBytes = 128

// CheckNodeName checks a node's name: a key segment (CheckSegment) that is also a host
// name as DNS allows one (RFC 1035 2.3.4): dot-separated labels of at most 63 bytes,
// not beginning or ending with '-', 253 bytes in all. Slurm's NodeName is a host name.
func CheckNodeName(what, s string) error {
	if err := CheckSegment(what, s); err != nil {
		return err
	}
	for _, l := range strings.Split(strings.TrimSuffix(s, "."), ".") {
		switch {
		case l == "":
			return fmt.Errorf("%s %s: an empty label (two dots, or a leading one): want a host name", what, quote.Q(s))
		case len(l) > 63:
			return fmt.Errorf("%s %s: a label of %d bytes: DNS allows 63 between dots", what, quote.Q(s), len(l))
		case l[0] == '-' || l[len(l)-1] == '-':
			return fmt.Errorf("%s %s: a label begins or ends with '-': want a host name", what, quote.Q(s))
		}
	}
	return nil
}
