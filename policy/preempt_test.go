package policy

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPreemptionPolicyParses: the pre-emption fields' defaults, a full setting, and one
// clear error per bad value.
func TestPreemptionPolicyParses(t *testing.T) {
	off := mustParse(t, `{"partitions": {"low": {"tier": 1}, "high": {"tier": 5}}}`)
	if off.PreemptionOn() || off.MayPreempt("high", "low") {
		t.Errorf("pre-emption is on without the policy saying so")
	}
	if off.PreemptSignal() != syscall.SIGTERM || off.GraceTime() != DefaultGraceTime || off.ExemptTime() != 0 {
		t.Errorf("defaults: %v %s %s", off.PreemptSignal(), off.GraceTime(), off.ExemptTime())
	}
	on := mustParse(t, `{"preemption": {"type": "partition_prio", "exempt_time": "10m", "signal": "USR1", "grace_time": "2m"},
		"partitions": {"low": {"tier": 1}, "mid": {"tier": 3}, "high": {"tier": 5}, "keep": {"tier": 0, "preempt_mode": "off"}}}`)
	for _, tc := range []struct {
		preemptor, victim string
		want              bool
	}{
		{"high", "low", true}, {"high", "mid", true}, {"mid", "low", true},
		{"low", "mid", false}, {"high", "high", false}, {"low", "low", false},
		{"high", "keep", false},                              // preempt_mode off
		{"high", "unnamed", true}, {"unnamed", "low", false}, // a partition the policy does not name is tier 0
	} {
		if got := on.MayPreempt(tc.preemptor, tc.victim); got != tc.want {
			t.Errorf("MayPreempt(%s, %s) = %v, want %v", tc.preemptor, tc.victim, got, tc.want)
		}
	}
	if on.PreemptSignal() != syscall.SIGUSR1 || on.GraceTime() != 2*time.Minute || on.ExemptTime() != 10*time.Minute {
		t.Errorf("settings: %v %s %s", on.PreemptSignal(), on.GraceTime(), on.ExemptTime())
	}
	for _, tc := range []struct{ doc, want string }{
		{`{"preemption": {"type": "qos"}}`, `preemption.type "qos": want "off" or "partition_prio"`},
		{`{"preemption": {"type": "partition_prio", "signal": "KILL"}}`, `preemption.signal "KILL": want SIGTERM, SIGUSR1, SIGUSR2 or SIGINT`},
		{`{"preemption": {"exempt_time": "-1m"}}`, `preemption.exempt_time -1m0s: must not be negative`},
		{`{"preemption": {"grace_time": "-5s"}}`, `preemption.grace_time -5s: want 0 to 24h0m0s`},
		{`{"preemption": {"grace_time": "1000000h"}}`, `preemption.grace_time 1000000h0m0s: want 0 to 24h0m0s`},
		{`{"preemption": {"grace_time": 30}}`, `duration 30: want text such as "90m" or "168h"`},
		{`{"partitions": {"p": {"preempt_mode": "suspend"}}}`, `partitions.p.preempt_mode "suspend": want "requeue" or "off"`},
		{`{"preemption": {"tpye": "partition_prio"}}`, `unknown field "preemption.tpye"`},
	} {
		_, err := Parse([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%s): %v, want %q", tc.doc, err, tc.want)
		}
	}
}

// TestSelectVictims: the fewest victims whose GPUs let the pending job fit, the lowest
// tier, then the lowest --priority, then the youngest first; nothing when even all of
// them would not do. fits counts GPUs on one pool: free + the victims' ≥ need.
func TestSelectVictims(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	type job struct {
		id             string
		tier, prio     int
		startedMinutes int // after t0
		gpus           int
	}
	for _, tc := range []struct {
		name       string
		free, need int
		jobs       []job
		want       []string
	}{
		{name: "no candidates", need: 8, want: nil},
		{name: "one job more than enough", need: 4, jobs: []job{{"a", 1, 0, 0, 8}}, want: []string{"a"}},
		{name: "all of them would not do: none", free: 2, need: 16,
			jobs: []job{{"a", 1, 0, 0, 4}, {"b", 1, 0, 0, 8}}, want: nil},
		{name: "the lowest tier first", need: 8,
			jobs: []job{{"mid", 2, 0, 0, 8}, {"low", 1, 0, 0, 8}}, want: []string{"low"}},
		{name: "same tier: the lowest --priority first", need: 8,
			jobs: []job{{"p5", 1, 5, 0, 8}, {"p1", 1, 1, 0, 8}}, want: []string{"p1"}},
		{name: "same tier and priority: the youngest first", need: 8,
			jobs: []job{{"old", 1, 0, 0, 8}, {"young", 1, 0, 30, 8}}, want: []string{"young"}},
		{name: "fewest beats lowest: one big job rather than three small ones", need: 8,
			jobs: []job{{"s1", 1, 0, 0, 4}, {"s2", 1, 0, 0, 2}, {"s3", 1, 0, 0, 2}, {"big", 2, 0, 0, 8}}, want: []string{"big"}},
		{name: "free GPUs count: one small victim suffices", free: 6, need: 8,
			jobs: []job{{"big", 1, 0, 0, 8}, {"small", 2, 0, 0, 2}}, want: []string{"big"}},
		{name: "two needed, the most preferred pair", need: 8,
			jobs: []job{{"a", 1, 0, 0, 4}, {"b", 1, 1, 0, 4}, {"c", 1, 2, 0, 4}}, want: []string{"a", "b"}},
		{name: "same ids, any input order", need: 8,
			jobs: []job{{"c", 1, 2, 0, 4}, {"b", 1, 1, 0, 4}, {"a", 1, 0, 0, 4}}, want: []string{"a", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gpus := map[string]int{}
			var cands []Candidate
			for _, j := range tc.jobs {
				gpus[j.id] = j.gpus
				cands = append(cands, Candidate{ID: j.id, Tier: j.tier, Priority: j.prio, Started: t0.Add(time.Duration(j.startedMinutes) * time.Minute)})
			}
			fits := func(ids []string) bool {
				n := tc.free
				for _, id := range ids {
					n += gpus[id]
				}
				return n >= tc.need
			}
			if got := SelectVictims(cands, fits); !slices.Equal(got, tc.want) {
				t.Errorf("victims %v, want %v", got, tc.want)
			}
		})
	}
}

// TestSelectVictimsManyCandidates: past the exact search's bound, victims are taken in
// preference order until the job fits, then those not needed are spared.
func TestSelectVictimsManyCandidates(t *testing.T) {
	var cands []Candidate
	gpus := map[string]int{}
	for i := range 20 {
		id := string(rune('a' + i))
		cands = append(cands, Candidate{ID: id, Tier: 1, Priority: i})
		gpus[id] = 1
	}
	gpus["c"] = 8 // the third in preference order is big enough alone
	fits := func(ids []string) bool {
		n := 0
		for _, id := range ids {
			n += gpus[id]
		}
		return n >= 8
	}
	if got := SelectVictims(cands, fits); !slices.Equal(got, []string{"c"}) {
		t.Errorf("victims %v, want [c]: a and b are spared, their release is not needed", got)
	}
	// Needing 12: a..e give 12, and none of them can be spared.
	fits12 := func(ids []string) bool {
		n := 0
		for _, id := range ids {
			n += gpus[id]
		}
		return n >= 12
	}
	if got := SelectVictims(cands, fits12); !slices.Equal(got, []string{"a", "b", "c", "d", "e"}) {
		t.Errorf("victims %v, want [a b c d e]", got)
	}
}
