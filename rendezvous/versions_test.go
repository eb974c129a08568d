package rendezvous

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// TestNewerRendezvousRecordsAreRefused: a job's rendezvous state, member or round
// record one schema newer than this gangrun reads is refused with its reason — a node
// does not join a run whose state it cannot read, nor take an assignment it cannot
// read, AddRestarts and ReadRun refuse the state — and none is written over.
func TestNewerRendezvousRecordsAreRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	newer := func(k schema.Kind, v any) []byte {
		b, err := schema.MarshalVersion(k, k.Version()+1, v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	wantRefused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, schema.ErrNewer) || !strings.Contains(err.Error(), "written by a newer gangrun (schema 2; this one reads up to 1)") {
			t.Errorf("%s: %v, want the refusal of a newer record", what, err)
		}
	}
	unchanged := func(s store.Store, key string, before store.Entry) {
		t.Helper()
		e, err := s.Get(ctx, key)
		if err != nil || e == nil || !bytes.Equal(e.Value, before.Value) || e.ModifyIndex != before.ModifyIndex {
			t.Errorf("%s was written over: %+v, %v", key, e, err)
		}
	}
	put := func(s store.Store, key string, v []byte) store.Entry {
		t.Helper()
		if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: key, Value: v}}); err != nil {
			t.Fatal(err)
		}
		e, _ := s.Get(ctx, key)
		return *e
	}

	t.Run(string(schema.RdzvState), func(t *testing.T) {
		s := store.NewMemory()
		key := jobKey("j1", "ctl", "state")
		before := put(s, key, newer(schema.RdzvState, jobState{Run: "r", Round: 3, Status: statusRunning}))
		c, err := NewDynamic(s, DynamicConfig{JobID: "j1", MinNodes: 1, MaxNodes: 1, MaxRestarts: 3, LastCall: 100 * time.Millisecond, Host: "h"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		_, err = c.Join(ctx, JoinRequest{Node: "n1", Addr: "10.0.0.1", LocalWorldSize: 1})
		wantRefused("join", err)
		if err != nil && !strings.Contains(err.Error(), "job j1: rendezvous state written by a newer gangrun") {
			t.Errorf("join's refusal does not name the job and the record: %v", err)
		}
		_, err = AddRestarts(ctx, s, "j1", 1)
		wantRefused("add restarts", err)
		_, _, err = ReadRun(ctx, s, "j1")
		wantRefused("read the run", err)
		unchanged(s, key, before)
	})

	t.Run(string(schema.RdzvRound), func(t *testing.T) {
		s := store.NewMemory()
		c, err := NewDynamic(s, DynamicConfig{JobID: "j2", MinNodes: 1, MaxNodes: 1, MaxRestarts: 3, Host: "h"})
		if err != nil {
			t.Fatal(err)
		}
		st := &jobState{Run: "r", Round: 0, Status: statusRunning}
		key := jobKey("j2", "rounds", "0", "n1")
		before := put(s, key, newer(schema.RdzvRound, roundRecord{Run: "r"}))
		_, ok, err := c.myRound(ctx, st, "n1")
		if ok {
			t.Error("a newer assignment was taken")
		}
		wantRefused("read this node's assignment", err)
		unchanged(s, key, before)
	})

	t.Run(string(schema.RdzvMember), func(t *testing.T) {
		s := store.NewMemory()
		c, err := NewDynamic(s, DynamicConfig{JobID: "j3", MinNodes: 1, MaxNodes: 2, MaxRestarts: 3, Host: "h"})
		if err != nil {
			t.Fatal(err)
		}
		sess, _ := s.CreateSession(ctx, store.SessionOptions{Name: "n2", TTL: time.Minute, Behavior: store.DeleteKeys})
		key := jobKey("j3", "members", "n2")
		if _, err := s.Txn(ctx, []store.Op{{Verb: store.Lock, Key: key, Value: newer(schema.RdzvMember, memberRecord{Member: Member{Node: "n2"}}), Session: sess}}); err != nil {
			t.Fatal(err)
		}
		entries, _, _ := s.List(ctx, c.key())
		if m := c.members(entries); len(m) != 0 {
			t.Errorf("a newer member was counted in the round: %v", m)
		}
	})
}

// TestRendezvousStateWithoutVersionIsRead: a state written before records carried
// versions is read (ReadRun), and written back with its version (AddRestarts).
func TestRendezvousStateWithoutVersionIsRead(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	key := jobKey("j", "ctl", "state")
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: key, Value: []byte(`{"run":"r","round":2,"status":"running","failures":1,"max_restarts":3}`)}}); err != nil {
		t.Fatal(err)
	}
	info, ok, err := ReadRun(ctx, s, "j")
	if err != nil || !ok || info.Run != "r" || info.Round != 2 || info.Failures != 1 || info.MaxRestarts != 3 {
		t.Fatalf("ReadRun: %+v %v %v", info, ok, err)
	}
	if ok, err := AddRestarts(ctx, s, "j", 1); !ok || err != nil {
		t.Fatalf("AddRestarts: %v %v", ok, err)
	}
	e, _ := s.Get(ctx, key)
	if !bytes.HasPrefix(e.Value, []byte(`{"schema":1,`)) || !bytes.Contains(e.Value, []byte(`"max_restarts":4`)) {
		t.Errorf("the state written back: %s", e.Value)
	}
}
