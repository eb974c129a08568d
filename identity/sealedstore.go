package identity

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/gangrun/gangrun/internal/store"
)

// ContentSealer makes and checks credentials bound to content: Munge.
type ContentSealer interface {
	Seal(ctx context.Context, content []byte) (string, error)
	Verify(ctx context.Context, cred string, content []byte, f Freshness) (Caller, error)
}

// sealedMagic starts a sealed value: then the credential, a newline, and the value.
const sealedMagic = "gangrun-sealed:"

// sealedCacheSize bounds the checked values a sealed store remembers.
const sealedCacheSize = 4096

// Sealed returns s with every value under prefixes sealed on its way in and checked on
// its way out: a value written (set, check-and-set, lock, unlock) carries a credential
// of this process, bound to the key and the value; a value read that carries no
// credential, or one that does not hold for its key and value, or one made by a uid
// trusted does not take, reads as absent (Get returns nil, List and WatchList leave the
// key out). Consul's keys are anyone's to write where its ACLs are off: what the job
// steps tell each other (a rendezvous' leader, members and assignments: MASTER_ADDR, the
// checkpoint to resume from) must come from the steps, which run as root. Names
// (Keys), sessions and the checks of a transaction pass through unchanged. Values
// already checked are remembered by key and text, so a watch that returns the same
// entries again costs no decoding.
func Sealed(s store.Store, m ContentSealer, trusted func(uid uint32) bool, prefixes ...string) store.Store {
	return &sealedStore{Store: s, m: m, trusted: trusted, prefixes: prefixes, checked: map[string][]byte{}, hidden: map[string]uint64{}}
}

type sealedStore struct {
	store.Store
	m        ContentSealer
	trusted  func(uid uint32) bool
	prefixes []string

	mu      sync.Mutex
	checked map[string][]byte // key "\x00" raw value → the value it seals (nil: refused)
	// hidden are the keys whose value reads as absent, and that value's index: a
	// write that expects the key absent (a check-and-set at index 0, a check-not-exists)
	// expects that value instead, so that a value written past the rules cannot keep
	// the key from being written by the rules' holders.
	hidden map[string]uint64
}

// Unwrap returns the Store the values are sealed in (store.Wrapper).
func (s *sealedStore) Unwrap() store.Store { return s.Store }

// covered reports whether key's values are sealed.
func (s *sealedStore) covered(key string) bool {
	for _, p := range s.prefixes {
		if len(key) >= len(p) && key[:len(p)] == p {
			return true
		}
	}
	return false
}

// storeContent is what a sealed value's credential is bound to.
func storeContent(key string, value []byte) []byte {
	return append([]byte("gangrun store "+key+"\n"), value...)
}

// seal wraps value of key.
func (s *sealedStore) seal(ctx context.Context, key string, value []byte) ([]byte, error) {
	cred, err := s.m.Seal(ctx, storeContent(key, value))
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(sealedMagic)+len(cred)+1+len(value))
	out = append(append(append(append(out, sealedMagic...), cred...), '\n'), value...)
	return out, nil
}

// open checks e's value and returns e with the value it seals; ok false for one that
// reads as absent. The checker's own trouble (munged not answering) is an error.
func (s *sealedStore) open(ctx context.Context, e store.Entry) (store.Entry, bool, error) {
	if !s.covered(e.Key) {
		return e, true, nil
	}
	ck := e.Key + "\x00" + string(e.Value)
	s.mu.Lock()
	v, seen := s.checked[ck]
	s.mu.Unlock()
	if !seen {
		var err error
		if v, err = s.check(ctx, e); err != nil {
			return e, false, err
		}
		s.mu.Lock()
		if len(s.checked) >= sealedCacheSize {
			clear(s.checked)
		}
		s.checked[ck] = v
		s.mu.Unlock()
	}
	s.mu.Lock()
	if v == nil {
		if len(s.hidden) >= sealedCacheSize {
			clear(s.hidden)
		}
		s.hidden[e.Key] = e.ModifyIndex
	} else {
		delete(s.hidden, e.Key)
	}
	s.mu.Unlock()
	if v == nil {
		return e, false, nil
	}
	e.Value = v
	return e, true, nil
}

// check returns the value e's raw value seals (never nil for a good one), or nil.
func (s *sealedStore) check(ctx context.Context, e store.Entry) ([]byte, error) {
	rest, ok := bytes.CutPrefix(e.Value, []byte(sealedMagic))
	if !ok {
		return nil, nil
	}
	cred, value, ok := bytes.Cut(rest, []byte{'\n'})
	if !ok {
		return nil, nil
	}
	c, err := s.m.Verify(ctx, string(cred), storeContent(e.Key, value), Kept)
	switch {
	case err == nil && s.trusted(c.UID):
		if value == nil {
			value = []byte{}
		}
		return value, nil
	case err != nil && (ctx.Err() != nil || isTrouble(err)):
		return nil, err
	}
	return nil, nil
}

// isTrouble reports whether err is the checker's trouble, not the value's.
func isTrouble(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return true
	}
	return e.Kind == ErrNoDaemon || e.Kind == ErrNoMunge || e.Kind == ErrMunge
}

// Get implements store.Store.
func (s *sealedStore) Get(ctx context.Context, key string) (*store.Entry, error) {
	e, err := s.Store.Get(ctx, key)
	if err != nil || e == nil {
		return e, err
	}
	out, ok, err := s.open(ctx, *e)
	if err != nil || !ok {
		return nil, err
	}
	return &out, nil
}

// filter opens every entry, leaving out those that read as absent.
func (s *sealedStore) filter(ctx context.Context, entries []store.Entry) ([]store.Entry, error) {
	out := entries[:0:0]
	for _, e := range entries {
		o, ok, err := s.open(ctx, e)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, o)
		}
	}
	return out, nil
}

// List implements store.Store.
func (s *sealedStore) List(ctx context.Context, prefix string) ([]store.Entry, uint64, error) {
	entries, idx, err := s.Store.List(ctx, prefix)
	if err != nil {
		return nil, idx, err
	}
	entries, err = s.filter(ctx, entries)
	return entries, idx, err
}

// WatchList implements store.Store.
func (s *sealedStore) WatchList(ctx context.Context, prefix string, index uint64, wait time.Duration) ([]store.Entry, uint64, error) {
	entries, idx, err := s.Store.WatchList(ctx, prefix, index, wait)
	if err != nil {
		return nil, idx, err
	}
	entries, err = s.filter(ctx, entries)
	return entries, idx, err
}

// Txn implements store.Store: the values it writes under the prefixes are sealed, and
// the entries its Get operations return are opened (one that reads as absent is
// dropped).
func (s *sealedStore) Txn(ctx context.Context, ops []store.Op) (store.TxnResult, error) {
	sealed := ops
	own := func() {
		if &sealed[0] == &ops[0] {
			sealed = append([]store.Op(nil), ops...)
		}
	}
	for i, op := range ops {
		if !s.covered(op.Key) {
			continue
		}
		if op.Verb == store.CheckNotExists || op.Verb == store.CAS && op.Index == 0 {
			s.mu.Lock()
			idx, hid := s.hidden[op.Key]
			s.mu.Unlock()
			if hid {
				own()
				if op.Verb == store.CheckNotExists {
					sealed[i].Verb = store.CheckIndex
				}
				sealed[i].Index = idx
			}
		}
		switch op.Verb {
		case store.Set, store.CAS, store.Lock, store.Unlock:
			v, err := s.seal(ctx, op.Key, op.Value)
			if err != nil {
				return store.TxnResult{}, err
			}
			own()
			sealed[i].Value = v
		}
	}
	res, err := s.Store.Txn(ctx, sealed)
	if err != nil || len(res.Entries) == 0 {
		return res, err
	}
	entries, ferr := s.filter(ctx, res.Entries)
	if ferr != nil {
		return res, ferr
	}
	res.Entries = entries
	return res, nil
}
