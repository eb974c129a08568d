package bench

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// TestNewerSweepRecordsAreRefused: a pairwise sweep's sweep key, a node's check-in and a
// pair's outcome one schema newer than this gangrun reads are refused with the reason,
// not misread as this sweep's.
func TestNewerSweepRecordsAreRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k := sweepKeys{"job"}
	newer := func(kind schema.Kind, v any) []byte {
		b, err := schema.MarshalVersion(kind, kind.Version()+1, v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		kind schema.Kind
		key  string
		val  []byte
		read func(n *NodeSweep) error
	}{
		{schema.BenchSweep, k.sweep(), newer(schema.BenchSweep, sweepRecord{Status: sweepReady, NNodes: 2}), func(n *NodeSweep) error {
			_, err := n.awaitSweep(ctx, store.NewWatcher(n.Store, k.sweep()), sweepGathering)
			return err
		}},
		{schema.BenchNode, k.node(1), newer(schema.BenchNode, checkIn{Node: Node{Name: "n1"}, NodeRank: 1}), func(n *NodeSweep) error {
			_, err := n.gather(ctx)
			return err
		}},
		{schema.BenchPair, k.pair("n0", "n1"), newer(schema.BenchPair, outcome{A: "n0", B: "n1", Error: "x"}), func(n *NodeSweep) error {
			_, err := n.read(ctx, Pair{A: 0, B: 1}, []Node{{Name: "n0"}, {Name: "n1"}})
			return err
		}},
	}
	for _, c := range cases {
		t.Run(string(c.kind), func(t *testing.T) {
			s := store.NewMemory()
			if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: c.key, Value: c.val}}); err != nil {
				t.Fatal(err)
			}
			err := c.read(&NodeSweep{Store: s, JobID: "job", NNodes: 2})
			if !errors.Is(err, schema.ErrNewer) || !strings.Contains(err.Error(), "written by a newer gangrun (schema 2; this one reads up to 1)") {
				t.Errorf("%v, want the refusal of a newer record", err)
			}
		})
	}
}
