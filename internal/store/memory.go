package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// Memory is the Store within one process: the same semantics as Consul's KV, sessions
// (TTL invalidation after 2×TTL, Behavior, lock-delay), transactions and blocking
// queries, held in memory. It backs tests and single-process use; it is never shared
// between machines.
type Memory struct {
	mu         sync.Mutex
	index      uint64
	kv         map[string]*Entry
	tombstones map[string]uint64    // deleted key → index of the deletion
	lockDelay  map[string]time.Time // key → end of its lock-delay
	sessions   map[string]*memSession
	changed    chan struct{} // closed and replaced on every change
	now        func() time.Time
	Locals     // what other packages keep on this store (LocalOf)
}

type memSession struct {
	opts  SessionOptions
	timer *time.Timer
}

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory {
	return &Memory{
		index: 1, kv: map[string]*Entry{}, tombstones: map[string]uint64{},
		lockDelay: map[string]time.Time{}, sessions: map[string]*memSession{},
		changed: make(chan struct{}), now: time.Now,
	}
}

// bump advances the index and wakes watchers; callers hold mu.
func (m *Memory) bump() uint64 {
	m.index++
	close(m.changed)
	m.changed = make(chan struct{})
	return m.index
}

func clone(e *Entry) Entry {
	c := *e
	c.Value = append([]byte(nil), e.Value...)
	return c
}

// Get implements Store.
func (m *Memory) Get(_ context.Context, key string) (*Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.kv[key]
	if !ok {
		return nil, nil
	}
	c := clone(e)
	return &c, nil
}

// list returns the prefix's entries and index; callers hold mu.
func (m *Memory) list(prefix string) ([]Entry, uint64) {
	var out []Entry
	var idx uint64
	for k, e := range m.kv {
		if strings.HasPrefix(k, prefix) {
			out = append(out, clone(e))
			idx = max(idx, e.ModifyIndex)
		}
	}
	for k, i := range m.tombstones {
		if strings.HasPrefix(k, prefix) {
			idx = max(idx, i)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, max(idx, 1)
}

// List implements Store.
func (m *Memory) List(_ context.Context, prefix string) ([]Entry, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out, idx := m.list(prefix)
	return out, idx, nil
}

// Keys implements Store.
func (m *Memory) Keys(_ context.Context, prefix string) ([]string, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out, idx := m.list(prefix)
	keys := make([]string, len(out))
	for i, e := range out {
		keys[i] = e.Key
	}
	return keys, idx, nil
}

// WatchList implements Store.
func (m *Memory) WatchList(ctx context.Context, prefix string, index uint64, wait time.Duration) ([]Entry, uint64, error) {
	if wait <= 0 || wait > MaxWaitTime {
		wait = MaxWaitTime
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		m.mu.Lock()
		out, idx := m.list(prefix)
		ch := m.changed
		m.mu.Unlock()
		if idx > index || index == 0 {
			return out, idx, nil
		}
		select {
		case <-ch:
		case <-timer.C:
			return out, idx, nil
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
	}
}

// Txn implements Store.
func (m *Memory) Txn(_ context.Context, ops []Op) (TxnResult, error) {
	if err := CheckTxn(ops); err != nil {
		return TxnResult{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// As Consul's state store does, operations are applied in order, each seeing what
	// the ones before it wrote (an Unlock then a Lock of one key by another session hand
	// the key over); an operation that fails writes nothing, the others go on being
	// checked so that every failure is reported, and any failure discards them all.
	te := &TxnError{}
	now := m.now()
	idx := m.index + 1 // the index the transaction is applied at, if it is
	staged := map[string]*Entry{}
	deleted := map[string]bool{}
	get := func(key string) *Entry {
		if deleted[key] {
			return nil
		}
		if e, ok := staged[key]; ok {
			return e
		}
		return m.kv[key]
	}
	put := func(key string, value []byte, session string, lock bool) {
		prev := get(key)
		e := &Entry{Key: key, Value: append([]byte(nil), value...), CreateIndex: idx, ModifyIndex: idx, Session: session}
		if prev != nil {
			e.CreateIndex, e.LockIndex = prev.CreateIndex, prev.LockIndex
		}
		if lock && (prev == nil || prev.Session != session) {
			e.LockIndex++
		}
		staged[key] = e
		delete(deleted, key)
	}
	del := func(key string) {
		delete(staged, key)
		deleted[key] = true
	}
	var out []Entry
	for i, op := range ops {
		e := get(op.Key)
		fail := func(reason error) {
			te.Errors = append(te.Errors, OpError{Op: i, Key: op.Key, Reason: reason,
				What: fmt.Sprintf("%s %s: %v", op.Verb, op.Key, reason)})
		}
		switch op.Verb {
		case Set:
			put(op.Key, op.Value, keepSession(e), false)
		case Delete:
			del(op.Key)
		case DeleteTree:
			for k := range m.kv {
				if strings.HasPrefix(k, op.Key) {
					del(k)
				}
			}
			for k := range staged {
				if strings.HasPrefix(k, op.Key) {
					del(k)
				}
			}
		case CAS:
			if (op.Index == 0 && e != nil) || (op.Index != 0 && (e == nil || e.ModifyIndex != op.Index)) {
				fail(ErrStaleIndex)
			} else {
				put(op.Key, op.Value, keepSession(e), false)
			}
		case DeleteCAS:
			if e == nil || e.ModifyIndex != op.Index {
				fail(ErrStaleIndex)
			} else {
				del(op.Key)
			}
		case Lock:
			if _, ok := m.sessions[op.Session]; !ok {
				fail(ErrSessionGone)
			} else if e != nil && e.Session != "" && e.Session != op.Session {
				fail(ErrLockHeld)
			} else if until, ok := m.lockDelay[op.Key]; ok && until.After(now) && (e == nil || e.Session != op.Session) {
				fail(ErrLockDelay)
			} else {
				put(op.Key, op.Value, op.Session, true)
			}
		case Unlock:
			if e == nil || e.Session != op.Session {
				fail(ErrNotLockHolder)
			} else {
				put(op.Key, op.Value, "", false)
			}
		case Get:
			if e == nil {
				fail(ErrKeyNotFound)
			} else {
				out = append(out, clone(e))
			}
		case CheckIndex:
			switch {
			case e == nil:
				fail(ErrKeyNotFound)
			case e.ModifyIndex != op.Index:
				fail(ErrStaleIndex)
			}
		case CheckNotExists:
			if e != nil {
				fail(ErrKeyExists)
			}
		case CheckSession:
			if e == nil || e.Session != op.Session {
				fail(ErrNotLockHolder)
			}
		default:
			fail(fmt.Errorf("unknown verb %q", op.Verb))
		}
	}
	if len(te.Errors) > 0 {
		return TxnResult{}, te
	}
	written := len(staged) > 0 || len(deleted) > 0
	if written {
		m.bump() // idx
		for k := range deleted {
			m.del(k, idx)
		}
		for k, e := range staged {
			m.kv[k] = e
			delete(m.tombstones, k)
		}
	}
	res := TxnResult{Entries: out}
	for _, op := range ops {
		switch op.Verb {
		case Set, CAS, Lock, Unlock:
			res.Index = idx // as Consul: the index is known from a written entry
		}
	}
	return res, nil
}

func modIndex(e *Entry) uint64 {
	if e == nil {
		return 0
	}
	return e.ModifyIndex
}

func keepSession(e *Entry) string {
	if e == nil {
		return ""
	}
	return e.Session
}

// put writes a key; callers hold mu.
func (m *Memory) put(key string, value []byte, idx uint64, session string) {
	e, ok := m.kv[key]
	if !ok {
		e = &Entry{Key: key, CreateIndex: idx}
		m.kv[key] = e
		delete(m.tombstones, key)
	}
	e.Value = append([]byte(nil), value...)
	e.ModifyIndex = idx
	e.Session = session
}

// del deletes a key; callers hold mu.
func (m *Memory) del(key string, idx uint64) {
	if _, ok := m.kv[key]; ok {
		delete(m.kv, key)
		m.tombstones[key] = idx
	}
}

// CreateSession implements Store.
func (m *Memory) CreateSession(_ context.Context, o SessionOptions) (string, error) {
	if err := o.Validate(); err != nil {
		return "", err
	}
	if o.Behavior == "" {
		o.Behavior = Release
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	id := h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
	m.mu.Lock()
	defer m.mu.Unlock()
	s := &memSession{opts: o}
	s.timer = time.AfterFunc(ttlMultiplier*o.TTL, func() { m.invalidate(id) })
	m.sessions[id] = s
	m.bump()
	return id, nil
}

// RenewSession implements Store.
func (m *Memory) RenewSession(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok {
		return fmt.Errorf("renew session %s: %w", id, ErrSessionGone)
	}
	s.timer.Reset(ttlMultiplier * s.opts.TTL)
	return nil
}

// DestroySession implements Store.
func (m *Memory) DestroySession(_ context.Context, id string) error {
	m.invalidate(id)
	return nil
}

// invalidate ends a session: its keys are released or deleted and their lock-delay
// starts (Consul: state store's deleteSessionTxn).
func (m *Memory) invalidate(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sessions[id]
	if !ok {
		return
	}
	s.timer.Stop()
	delete(m.sessions, id)
	idx := m.bump()
	until := m.now().Add(s.opts.LockDelay)
	for k, e := range m.kv {
		if e.Session != id {
			continue
		}
		if s.opts.LockDelay > 0 {
			m.lockDelay[k] = until
		}
		if s.opts.Behavior == DeleteKeys {
			m.del(k, idx)
		} else {
			e.Session = ""
			e.ModifyIndex = idx
		}
	}
}

// Sessions returns how many sessions are alive.
func (m *Memory) Sessions() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.sessions)
}

// SessionExists implements Store.
func (m *Memory) SessionExists(_ context.Context, id string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.sessions[id]
	return ok, nil
}
