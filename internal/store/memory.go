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
	t := &memTxn{m: m, now: m.now(), idx: m.index + 1, staged: map[string]*Entry{}, deleted: map[string]bool{}}
	te := &TxnError{}
	for i, op := range ops {
		if reason := t.apply(op); reason != nil {
			te.Errors = append(te.Errors, OpError{Op: i, Key: op.Key, Reason: reason,
				What: fmt.Sprintf("%s %s: %v", op.Verb, op.Key, reason)})
		}
	}
	if len(te.Errors) > 0 {
		return TxnResult{}, te
	}
	t.commit()
	res := TxnResult{Entries: t.out}
	for _, op := range ops {
		switch op.Verb {
		case Set, CAS, Lock, Unlock:
			res.Index = t.idx // as Consul: the index is known from a written entry
		}
	}
	return res, nil
}

// memTxn is one Memory transaction being applied: its writes are staged over m's keys
// until commit. Callers hold m.mu.
type memTxn struct {
	m       *Memory
	now     time.Time
	idx     uint64            // the index the transaction is applied at, if it is
	staged  map[string]*Entry // keys written so far
	deleted map[string]bool   // keys deleted so far
	out     []Entry           // what its Gets read, in order
}

// get is key's entry as the operations so far left it; nil when there is none.
func (t *memTxn) get(key string) *Entry {
	if t.deleted[key] {
		return nil
	}
	if e, ok := t.staged[key]; ok {
		return e
	}
	return t.m.kv[key]
}

// put stages key's new value, held by session ("" for none); lock counts a Lock that
// changes the key's holder in its LockIndex.
func (t *memTxn) put(key string, value []byte, session string, lock bool) {
	prev := t.get(key)
	e := &Entry{Key: key, Value: append([]byte(nil), value...), CreateIndex: t.idx, ModifyIndex: t.idx, Session: session}
	if prev != nil {
		e.CreateIndex, e.LockIndex = prev.CreateIndex, prev.LockIndex
	}
	if lock && (prev == nil || prev.Session != session) {
		e.LockIndex++
	}
	t.staged[key] = e
	delete(t.deleted, key)
}

// del stages key's deletion.
func (t *memTxn) del(key string) {
	delete(t.staged, key)
	t.deleted[key] = true
}

// apply stages op, or returns why it fails (then it stages nothing).
func (t *memTxn) apply(op Op) error {
	e := t.get(op.Key)
	switch op.Verb {
	case Set:
		t.put(op.Key, op.Value, keepSession(e), false)
	case Delete:
		t.del(op.Key)
	case DeleteTree:
		for k := range t.m.kv {
			if strings.HasPrefix(k, op.Key) {
				t.del(k)
			}
		}
		for k := range t.staged {
			if strings.HasPrefix(k, op.Key) {
				t.del(k)
			}
		}
	case CAS:
		if (op.Index == 0 && e != nil) || (op.Index != 0 && (e == nil || e.ModifyIndex != op.Index)) {
			return ErrStaleIndex
		}
		t.put(op.Key, op.Value, keepSession(e), false)
	case DeleteCAS:
		if e == nil || e.ModifyIndex != op.Index {
			return ErrStaleIndex
		}
		t.del(op.Key)
	case Lock:
		return t.lock(op, e)
	case Unlock:
		if e == nil || e.Session != op.Session {
			return ErrNotLockHolder
		}
		t.put(op.Key, op.Value, "", false)
	case Get:
		if e == nil {
			return ErrKeyNotFound
		}
		t.out = append(t.out, clone(e))
	default:
		return t.check(op, e)
	}
	return nil
}

// lock stages a Lock of op.Key, whose entry is e, by op.Session: refused when the
// session is gone, another session holds the key, or the key's lock-delay from another
// holder has not ended.
func (t *memTxn) lock(op Op, e *Entry) error {
	if _, ok := t.m.sessions[op.Session]; !ok {
		return ErrSessionGone
	}
	if e != nil && e.Session != "" && e.Session != op.Session {
		return ErrLockHeld
	}
	if until, ok := t.m.lockDelay[op.Key]; ok && until.After(t.now) && (e == nil || e.Session != op.Session) {
		return ErrLockDelay
	}
	t.put(op.Key, op.Value, op.Session, true)
	return nil
}

// check runs a check operation (CheckIndex, CheckNotExists, CheckSession) against e,
// op.Key's entry; any other verb is unknown.
func (t *memTxn) check(op Op, e *Entry) error {
	switch op.Verb {
	case CheckIndex:
		switch {
		case e == nil:
			return ErrKeyNotFound
		case e.ModifyIndex != op.Index:
			return ErrStaleIndex
		}
	case CheckNotExists:
		if e != nil {
			return ErrKeyExists
		}
	case CheckSession:
		if e == nil || e.Session != op.Session {
			return ErrNotLockHolder
		}
	default:
		return fmt.Errorf("unknown verb %q", op.Verb)
	}
	return nil
}

// commit writes the staged keys and deletions into m at t.idx, when there are any.
func (t *memTxn) commit() {
	if len(t.staged) == 0 && len(t.deleted) == 0 {
		return
	}
	t.m.bump() // t.idx
	for k := range t.deleted {
		t.m.del(k, t.idx)
	}
	for k, e := range t.staged {
		t.m.kv[k] = e
		delete(t.m.tombstones, k)
	}
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
