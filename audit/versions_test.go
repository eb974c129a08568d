package audit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// TestNewerEntriesAreLeftOutAndSaidSo: an audit entry one schema newer than this gangrun
// reads is not listed as anything it may not be (List leaves it out) and ListAll says
// why; the entries this gangrun reads are listed as before.
func TestNewerEntriesAreLeftOutAndSaidSo(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	now := time.Now().UTC()
	if err := Write(ctx, s, Entry{At: now, User: "root", Token: "operator", Action: ActionDrain, Target: "node a"}); err != nil {
		t.Fatal(err)
	}
	e := Entry{At: now, User: "root", Action: "something new", Target: "node b"}
	b, _ := schema.MarshalVersion(schema.AuditEntry, schema.AuditEntry.Version()+1, e)
	if _, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: key(e), Value: b}}); err != nil {
		t.Fatal(err)
	}
	all, newer, err := ListAll(ctx, s, time.Time{}, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all[0].Target != "node a" {
		t.Errorf("entries listed: %+v, want node a's only", all)
	}
	if len(newer) != 1 || !errors.Is(newer[0], schema.ErrNewer) || !strings.Contains(newer[0].Error(), "audit entry written by a newer gangrun (schema 2; this one reads up to 1)") {
		t.Errorf("entries left out: %v, want the newer one with its reason", newer)
	}
}
