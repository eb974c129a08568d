package job

import (
	"testing"
	"time"
)

// TestParseBegin: --begin's forms, as Slurm's parse_time reads them, at a fixed now
// (2026-03-10 14:30:00 local): relative to now, times of day (tomorrow once past), named
// times, dates; what is none of them is refused naming the value.
func TestParseBegin(t *testing.T) {
	now := time.Date(2026, 3, 10, 14, 30, 0, 0, time.Local)
	at := func(m time.Month, d, h, min, s int) time.Time { return time.Date(2026, m, d, h, min, s, 0, time.Local) }
	for _, tc := range []struct {
		in   string
		want time.Time
	}{
		{"now", now},
		{"now+60", now.Add(time.Minute)},
		{"now+1hour", now.Add(time.Hour)},
		{"now+2days", now.Add(48 * time.Hour)},
		{"now+3min", now.Add(3 * time.Minute)},
		{"now+1w", now.Add(7 * 24 * time.Hour)},
		{"16:00", at(3, 10, 16, 0, 0)},
		{"10:15:30", at(3, 11, 10, 15, 30)},
		{"4:00pm", at(3, 10, 16, 0, 0)},
		{"12:00 AM", at(3, 11, 0, 0, 0)},
		{"midnight", at(3, 11, 0, 0, 0)},
		{"noon", at(3, 11, 12, 0, 0)},
		{"teatime", at(3, 10, 16, 0, 0)},
		{"today", at(3, 10, 0, 0, 0)},
		{"Tomorrow", at(3, 11, 0, 0, 0)},
		{"2026-04-01", at(4, 1, 0, 0, 0)},
		{"2026-04-01T08:30", at(4, 1, 8, 30, 0)},
		{"2026-04-01T08:30:15", at(4, 1, 8, 30, 15)},
		{"04/01/26", at(4, 1, 0, 0, 0)},
		{"04/01", at(4, 1, 0, 0, 0)},
		{"0401", at(4, 1, 0, 0, 0)},
		{"01/05", time.Date(2027, 1, 5, 0, 0, 0, 0, time.Local)},
	} {
		got, err := ParseBegin(tc.in, now)
		if err != nil || !got.Equal(tc.want) {
			t.Errorf("ParseBegin(%q) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "bogus", "now-5", "now+5parsecs", "25:00", "13:00pm", "2026-13-01", "now+99999999999"} {
		if got, err := ParseBegin(in, now); err == nil {
			t.Errorf("ParseBegin(%q) = %s, want an error", in, got)
		}
	}
}
