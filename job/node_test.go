package job

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
)

// TestLauncherAnchorsItsIndex: a launcher anchors its node's index of jobs
// (store.Anchor), so that its watch of an idle node does not wake at every write to
// Consul, and the anchor is no job to PlacedOn.
func TestLauncherAnchorsItsIndex(t *testing.T) {
	s := consultest.ConsulStore(t, consultest.Start(t))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = RunLauncher(ctx, LauncherConfig{Store: s, Node: "n1", Spawn: func(string) error { return nil }})
	}()
	defer func() { cancel(); wg.Wait() }()
	prefix := placedPrefix + "n1/"
	deadline := time.Now().Add(time.Minute)
	for {
		e, err := s.Get(ctx, prefix)
		if err == nil && e != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no anchor %s a minute after the launcher started: %+v %v", prefix, e, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, before, err := s.List(ctx, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: seqKey, Value: []byte("7")}}); err != nil {
		t.Fatal(err)
	}
	if _, after, err := s.List(ctx, prefix); err != nil || after != before {
		t.Errorf("the idle node's index moved from %d to %d (%v) with a write elsewhere", before, after, err)
	}
	if ids, err := PlacedOn(ctx, s, "n1"); err != nil || len(ids) != 0 {
		t.Errorf("PlacedOn(n1) = %v, %v; want no jobs (the anchor is none)", ids, err)
	}
}
