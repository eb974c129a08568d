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
	"strings"
	"time"
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

// OpError says why one operation made a transaction fail.
type OpError struct {
	// Op is the operation's position in the transaction.
	Op int
	// What is the store's reason.
	What string
}

// TxnError is returned by Txn when the transaction was rejected as a whole; nothing
// was applied. errors.Is(err, ErrTxnRejected) holds.
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

// Is makes errors.Is(err, ErrTxnRejected) true.
func (e *TxnError) Is(target error) bool { return target == ErrTxnRejected }

// LockDelayed reports whether a lock failed because of a lock-delay (Consul:
// "failed to lock key ... due to lock delay"), and which keys.
func (e *TxnError) LockDelayed() []string {
	var keys []string
	for _, oe := range e.Errors {
		if strings.Contains(oe.What, "lock delay") {
			if k, ok := quoted(oe.What); ok {
				keys = append(keys, k)
			}
		}
	}
	return keys
}

// quoted returns the first double-quoted string in s.
func quoted(s string) (string, bool) {
	i := strings.IndexByte(s, '"')
	if i < 0 {
		return "", false
	}
	j := strings.IndexByte(s[i+1:], '"')
	if j < 0 {
		return "", false
	}
	return s[i+1 : i+1+j], true
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
}

func (e *UnavailableError) Error() string { return e.Op + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *UnavailableError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrUnavailable) true.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// Store is the coordination store. Implementations: Consul (NewConsul) and Memory
// (NewMemory). All methods are safe for concurrent use.
type Store interface {
	// Get returns the key, or nil when it does not exist. Reads are consistent.
	Get(ctx context.Context, key string) (*Entry, error)
	// List returns every key under prefix, sorted, and the store index of the result.
	// Reads are consistent.
	List(ctx context.Context, prefix string) ([]Entry, uint64, error)
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

// CheckTxn validates ops against the transaction limits before they are sent.
func CheckTxn(ops []Op) error {
	if len(ops) == 0 {
		return errors.New("empty transaction")
	}
	if len(ops) > MaxTxnOps {
		return fmt.Errorf("transaction of %d operations: Consul allows at most %d", len(ops), MaxTxnOps)
	}
	// The request is JSON with each value base64-encoded (4 bytes per 3), plus the
	// per-operation framing.
	size := 0
	for _, op := range ops {
		size += len(op.Key) + (len(op.Value)+2)/3*4 + len(op.Session) + 96
	}
	if size > MaxTxnBytes {
		return fmt.Errorf("transaction of about %d bytes: Consul allows at most %d", size, MaxTxnBytes)
	}
	return nil
}

// CheckSegment checks a name used as one segment of a key (a node name, a job or request
// id): letters, digits, '-', '_' and '.' only, and not empty, so it can neither escape
// its prefix ("../x", "a/b") nor collide with another key. what names the value in the
// error.
func CheckSegment(what, s string) error {
	if s == "" || s == "." || s == ".." {
		return fmt.Errorf("%s %q: want a name of letters, digits, '-', '_' and '.'", what, s)
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("%s %q: only letters, digits, '-', '_' and '.' are allowed", what, s)
		}
	}
	return nil
}
