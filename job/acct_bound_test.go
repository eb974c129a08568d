package job

import (
	"context"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
)

// countingStore counts List requests.
type countingStore struct {
	store.Store
	lists int
}

func (c *countingStore) List(ctx context.Context, prefix string) ([]store.Entry, uint64, error) {
	c.lists++
	return c.Store.List(ctx, prefix)
}

// TestRecordsOverALongRangeIsBounded: `acct --since 1970-01-01` (or any range longer
// than maxDayLists days) reads the records in one list, not one per day, and finds the
// same records a day-by-day read does.
func TestRecordsOverALongRangeIsBounded(t *testing.T) {
	ctx := context.Background()
	s := &countingStore{Store: store.NewMemory()}
	ends := []time.Time{
		time.Date(1999, 12, 31, 23, 0, 0, 0, time.UTC),
		time.Date(2024, 3, 1, 10, 0, 0, 0, time.UTC),
		time.Date(2024, 3, 2, 10, 0, 0, 0, time.UTC),
	}
	for i, e := range ends {
		if err := WriteRecord(ctx, s, Record{ID: string(rune('1' + i)), User: "u", Account: "a", State: Completed, Ended: e}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		since, until time.Time
		want         int
		maxLists     int
	}{
		{time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), 3, 1},
		{time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), 3, 1},
		{time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC), time.Date(2024, 3, 2, 0, 0, 0, 0, time.UTC), 1, 1},
		{time.Date(2024, 2, 1, 0, 0, 0, 0, time.UTC), time.Date(2024, 3, 3, 0, 0, 0, 0, time.UTC), 2, maxDayLists},
	} {
		s.lists = 0
		recs, err := Records(ctx, s, tc.since, tc.until, Filter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != tc.want {
			t.Errorf("%s..%s: %d records, want %d", tc.since, tc.until, len(recs), tc.want)
		}
		if s.lists > tc.maxLists {
			t.Errorf("%s..%s: %d list requests, want at most %d", tc.since, tc.until, s.lists, tc.maxLists)
		}
	}
}
