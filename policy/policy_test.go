package policy

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/reason"
)

// slurmExample is the configuration example of Slurm's priority_multifactor page
// (https://slurm.schedmd.com/priority_multifactor.html, "Configuration Example"):
// PriorityDecayHalfLife=14-0, PriorityMaxAge=14-0, PriorityFavorSmall=NO,
// PriorityWeightAge=1000, PriorityWeightFairshare=10000, PriorityWeightJobSize=1000,
// PriorityWeightPartition=1000, PriorityWeightQOS=0.
const slurmExample = `{
  "priority": {
    "weights": {"age": 1000, "fairshare": 10000, "job_size": 1000, "partition": 1000, "qos": 0},
    "max_age": "336h", "decay_half_life": "336h"
  },
  "partitions": {"batch": {"tier": 1}, "prio": {"tier": 2}},
  "accounts": {"a": {"shares": 1}, "b": {"shares": 1}}
}`

func mustParse(t *testing.T, doc string) *Policy {
	t.Helper()
	p, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPriorityArithmetic checks the multifactor sum against hand-computed values with
// the weights of Slurm's configuration example.
func TestPriorityArithmetic(t *testing.T) {
	p := mustParse(t, slurmExample)
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	// Equal shares, equal usage: U_a = 0.5 = S_a, so F = 2^(-0.5/0.5) = 0.5.
	half := &Usage{Accounts: map[string]float64{"a": 50, "b": 50}, Users: map[string]float64{"a/u": 50, "b/v": 50}}
	for _, tc := range []struct {
		name string
		job  Job
		u    *Usage
		want Factors
	}{
		{
			// 7 of 14 days: age 0.5 → 500; F 0.5 → 5000; 16 of 256 GPUs: 0.0625 → 62.5;
			// tier 1 of 2: 0.5 → 500. 6062.5, truncated.
			name: "half of everything",
			job:  Job{User: "u", Account: "a", Partition: "batch", GPUs: 16, Submitted: now.Add(-7 * 24 * time.Hour)},
			u:    half,
			want: Factors{Age: 0.5, FairShare: 0.5, JobSize: 0.0625, Partition: 0.5, Priority: 6062},
		},
		{
			// Queued 28 days: age caps at 1 → 1000; no usage: F 1 → 10000; 256 of 256 →
			// 1000; tier 2 of 2 → 1000; --priority 7 adds 7.
			name: "age capped, no usage, whole cluster, top tier, site",
			job:  Job{User: "u", Account: "a", Partition: "prio", GPUs: 256, Submitted: now.Add(-28 * 24 * time.Hour), Site: 7},
			u:    NewUsage(),
			want: Factors{Site: 7, Age: 1, FairShare: 1, JobSize: 1, Partition: 1, Priority: 13007},
		},
		{
			// Just queued, a partition the policy does not name: only fair-share (1)
			// and 1 GPU of 256 (1000/256 = 3.9) count.
			name: "new job, unnamed partition",
			job:  Job{User: "u", Account: "a", Partition: "other", GPUs: 1, Submitted: now},
			u:    nil,
			want: Factors{FairShare: 1, JobSize: 1.0 / 256, Priority: 10003},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := NewFairShare(p, tc.u, []string{tc.job.Account})
			got := p.Factors(tc.job, now, fs, 256)
			if !near(got.Age, tc.want.Age) || !near(got.FairShare, tc.want.FairShare) || !near(got.JobSize, tc.want.JobSize) ||
				!near(got.Partition, tc.want.Partition) || !near(got.QOS, tc.want.QOS) || got.Site != tc.want.Site || got.Priority != tc.want.Priority {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// TestFairShareClassic checks the classic factor 2^(-UE/S) (classic_fair_share.html)
// against hand-computed values.
func TestFairShareClassic(t *testing.T) {
	two := `{"accounts": {"a": {"shares": 1}, "b": {"shares": 3}}}`
	users := `{"accounts": {"a": {"shares": 1, "users": {"x": {"shares": 1}, "y": {"shares": 3}}}, "b": {"shares": 1}}}`
	damp := `{"priority": {"dampening": 2}, "accounts": {"a": {"shares": 1}, "b": {"shares": 3}}}`
	for _, tc := range []struct {
		name, doc     string
		usage         map[string]float64 // account → usage; "account/user" → user usage
		account, user string
		want          float64
	}{
		{"no usage at all", two, nil, "a", "x", 1},
		// S_a = 1/4, U_a = 30/40 = 0.75: 2^(-0.75/0.25) = 2^-3.
		{"over-served account", two, map[string]float64{"a": 30, "b": 10}, "a", "x", 0.125},
		// S_b = 3/4, U_b = 0.25: 2^(-1/3).
		{"under-served account", two, map[string]float64{"a": 30, "b": 10}, "b", "x", math.Exp2(-1.0 / 3)},
		// Dampening 2: 2^(-3/2).
		{"dampened", damp, map[string]float64{"a": 30, "b": 10}, "a", "x", math.Exp2(-1.5)},
		// S_a = 1/2; x has 1 of 4 user shares: S_x = 1/8. U_a = U_x = 0.5:
		// UE_x = 0.5 + (0.5-0.5)×1/4 = 0.5, F = 2^(-0.5/0.125) = 2^-4.
		{"heavy user", users, map[string]float64{"a": 20, "a/x": 20, "b": 20}, "a", "x", 0.0625},
		// y: S_y = 3/8, U_y = 0: UE_y = 0 + (0.5-0)×3/4 = 0.375, F = 2^(-1).
		{"light user of the same account", users, map[string]float64{"a": 20, "a/x": 20, "b": 20}, "a", "y", 0.5},
		// An account the policy does not name has one share: S = 1/(1+3+1) = 0.2,
		// U = 10/50: 2^(-0.2/0.2) = 0.5.
		{"account not in the policy", two, map[string]float64{"a": 30, "b": 10, "carol": 10}, "carol", "carol", 0.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := mustParse(t, tc.doc)
			u := NewUsage()
			for k, v := range tc.usage {
				if strings.Contains(k, "/") {
					u.Users[k] = v
				} else {
					u.Accounts[k] = v
				}
			}
			if got := NewFairShare(p, u, nil).Factor(tc.account, tc.user); !near(got, tc.want) {
				t.Fatalf("F(%s/%s) = %v, want %v", tc.account, tc.user, got, tc.want)
			}
		})
	}
}

// TestUsageDecay: one half-life halves the usage; charges add after the decay.
func TestUsageDecay(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	u := NewUsage()
	u.Decay(t0, time.Hour)
	u.Charge("a", "x", 100)
	u.Decay(t0.Add(time.Hour), time.Hour)
	if !near(u.Accounts["a"], 50) || !near(u.Users["a/x"], 50) {
		t.Fatalf("after one half-life: %+v", u)
	}
	u.Decay(t0.Add(3*time.Hour), time.Hour)
	u.Charge("a", "x", 10)
	if !near(u.Accounts["a"], 22.5) {
		t.Fatalf("after three half-lives and a charge of 10: %v, want 22.5", u.Accounts["a"])
	}
	u.Decay(t0.Add(100*time.Hour), time.Hour)
	if len(u.Accounts) != 0 || len(u.Users) != 0 {
		t.Fatalf("usage below %g GPU-seconds is forgotten: %+v", forgetBelow, u)
	}
}

const limitsDoc = `{
  "partitions": {"train": {"max_time": "24h", "max_gpus_per_job": 16, "allow_accounts": ["ml"]}},
  "accounts": {
    "ml": {"grp_gpus": 16, "grp_jobs": 3, "grp_gpu_hours": 10, "max_gpus_per_user": 8, "max_jobs_per_user": 2,
           "users": {"alice": {"max_gpus": 4}, "bob": {}, "dan": {"max_jobs": 1}}},
    "cv": {}
  }
}`

// TestLimits checks each limit and its Slurm reason against hand-counted tallies.
func TestLimits(t *testing.T) {
	p := mustParse(t, limitsDoc)
	job := func(user, account string, gpus int) Job {
		return Job{User: user, Account: account, Partition: "train", GPUs: gpus, TimeLimit: time.Hour}
	}
	for _, tc := range []struct {
		name    string
		running []Job
		usage   float64 // ml's usage in GPU-seconds
		job     Job
		want    string // the reason's name; "" none
	}{
		{"within every limit", nil, 0, job("bob", "ml", 8), ""},
		{"alice's own max_gpus", nil, 0, job("alice", "ml", 8), string(reason.QOSMaxGRESPerUser)},
		{"bob at max_gpus_per_user", []Job{job("bob", "ml", 8)}, 0, job("bob", "ml", 2), string(reason.QOSMaxGRESPerUser)},
		{"another user is not held back", []Job{job("bob", "ml", 8)}, 0, job("alice", "ml", 4), ""},
		{"bob at max_jobs_per_user", []Job{job("bob", "ml", 2), job("bob", "ml", 2)}, 0, job("bob", "ml", 2), string(reason.AssocMaxJobsLimit)},
		{"dan's own max_jobs", []Job{job("dan", "ml", 1)}, 0, job("dan", "ml", 1), string(reason.AssocMaxJobsLimit)},
		{"account at grp_gpus", []Job{job("bob", "ml", 8), job("alice", "ml", 4), job("dan", "ml", 2)}, 0, job("dan", "ml", 4), string(reason.AssocGrpGRES)},
		{"account at grp_jobs", []Job{job("bob", "ml", 1), job("alice", "ml", 1), job("dan", "ml", 1)}, 0, job("bob", "ml", 1), string(reason.AssocGrpJobsLimit)},
		{"account at grp_gpu_hours", nil, 10 * 3600, job("bob", "ml", 1), string(reason.AssocGrpGRESMinutes)},
		{"account just under grp_gpu_hours", nil, 10*3600 - 1, job("bob", "ml", 1), ""},
		{"time over max_time", nil, 0, Job{User: "bob", Account: "ml", Partition: "train", GPUs: 1, TimeLimit: 25 * time.Hour}, string(reason.PartitionTimeLimit)},
		{"no time limit under a max_time", nil, 0, Job{User: "bob", Account: "ml", Partition: "train", GPUs: 1}, string(reason.PartitionTimeLimit)},
		{"GPUs over max_gpus_per_job", nil, 0, job("bob", "ml", 32), string(reason.QOSMaxGRESPerJob)},
		{"account not allowed in the partition", nil, 0, job("carl", "cv", 1), string(reason.PartitionConfig)},
		{"unknown account", nil, 0, job("bob", "nope", 1), string(reason.InvalidAccount)},
		{"user not in the account", nil, 0, job("eve", "ml", 1), string(reason.InvalidAccount)},
		{"open account elsewhere", nil, 0, Job{User: "carl", Account: "cv", Partition: "other", GPUs: 64}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := p.NewHeld()
			for _, r := range tc.running {
				h.Add(r)
			}
			u := NewUsage()
			u.Accounts["ml"] = tc.usage
			got := p.Check(tc.job, h, u)
			name, _, _ := strings.Cut(got, ":")
			if name != tc.want {
				t.Fatalf("Check = %q, want reason %q", got, tc.want)
			}
		})
	}
}

// TestParseRefusesBadPolicies: each error names the field and the value.
func TestParseRefusesBadPolicies(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`{"priority": {"weights": {"age": -1}}}`, "priority.weights.age -1"},
		{`{"accounts": {"ml": {"grp_gpus": -2}}}`, "accounts.ml.grp_gpus -2"},
		{`{"accounts": {"ml": {"max_gpu_per_user": 2}}}`, `unknown field "accounts.ml.max_gpu_per_user"`},
		{`{"partitions": {"p": {"max_time": "1h", "default_time": "2h"}}}`, "partitions.p.default_time 2h0m0s"},
		{`{"partitions": {"p": {"max_time": 60}}}`, "duration 60"},
		{`{"partitions": {"p": {"allow_accounts": ["x"]}}, "accounts": {"ml": {}}}`, `account "x" is not in accounts`},
		{`{"accounts": {"ml": {"qos": "gold"}}}`, `accounts.ml.qos "gold"`},
		{`{"accounts": {"a/b": {}}}`, `account "a/b"`},
		{`{"accounts": {"a": {"users": {"u": {"default": true}}}, "b": {"users": {"u": {"default": true}}}}}`, "default"},
		{"{\n\"accounts\": {,}}", "line 2"},
		{"", "the policy is empty"},
		{"  \n", "the policy is empty"},
		{"null", `not "null"`},
		{"[1]", "must be a JSON object"},
		// Issue 26: what encoding/json let through or said in Go's words.
		{"\xEF\xBB\xBF{}", "UTF-8 byte-order mark (bytes EF BB BF)"},
		{`{"priority": {"weights": {"age": 1, "age": 2}}}`, `line 1, column 37: field "priority.weights.age" given twice (first at line 1, column 27)`},
		{`{"accounts": {"ml": {}}, "accounts": {}}`, `field "accounts" given twice`},
		{`{"priority": {"weights": {"age": 9223372036854775807}}}`, "priority.weights.age 9223372036854775807: want 0 to 4294967295"},
		{`{"priority": {"weights": {"age": 1e30}}}`, `line 1, column 38: field "priority.weights.age": want an integer from -9223372036854775808 to 9223372036854775807, got 1e30`},
		{`{"priority": {"weights": {"age": "x"}}}`, `field "priority.weights.age": want an integer`},
		{`{"accounts": {"ml": {"shares": 9223372036854775807}}}`, "accounts.ml.shares 9223372036854775807: want 0 to 4294967295"},
		{`{"partitions": {"p": {"tier": 70000}}}`, "partitions.p.tier 70000: want 0 to 65533"},
		{`{"priority": {"decay_half_life": "1ns"}}`, "priority.decay_half_life 1ns: want 0 (the default, 7 days) or at least 1m"},
		{`{"priority": {"max_age": "30s"}}`, "priority.max_age 30s"},
		{`{"priority": {"weights": {"age": 1}}`, "the file ends before the document does (truncated?)"},
		{`{} {}`, "a second value after the document"},
	} {
		_, err := Parse([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Parse(%s) = %v, want one line naming %q", tc.doc, err, tc.want)
		}
		if err != nil && (strings.Contains(err.Error(), "Go struct") || strings.Contains(err.Error(), "int64") || strings.Contains(err.Error(), "invalid character 'ï'")) {
			t.Errorf("Parse(%s) = %v: Go's words, not the file's", tc.doc, err)
		}
	}
}

// TestDefaults: the default account and partition, and the time a job gets.
func TestDefaults(t *testing.T) {
	p := mustParse(t, `{"partitions": {"a": {"default": true, "max_time": "8h"}, "b": {"default_time": "1h", "max_time": "8h"}},
		"accounts": {"ml": {"users": {"alice": {}, "bob": {}}}, "cv": {"users": {"bob": {"default": true}}}}}`)
	for user, want := range map[string]string{"alice": "ml", "bob": "cv", "carol": "carol"} {
		if got := p.DefaultAccount(user); got != want {
			t.Errorf("DefaultAccount(%s) = %q, want %q", user, got, want)
		}
	}
	if got := p.DefaultPartition(); got != "a" {
		t.Errorf("DefaultPartition = %q", got)
	}
	if a, b := p.DefaultTime("a"), p.DefaultTime("b"); a != 8*time.Hour || b != time.Hour {
		t.Errorf("DefaultTime: a %s (want max_time 8h), b %s (want default_time 1h)", a, b)
	}
}

// TestPriorityNeverWrapsAround: the heaviest weights the policy takes and the largest
// --priority a job may have give the highest priority, never a negative one; a job
// with no --priority ranks above one given the lowest.
func TestPriorityNeverWrapsAround(t *testing.T) {
	p := mustParse(t, `{"priority": {"weights": {"age": 4294967295, "fairshare": 4294967295, "job_size": 4294967295, "partition": 4294967295, "qos": 4294967295}}}`)
	now := time.Now()
	old := now.Add(-30 * 24 * time.Hour)
	high := p.Factors(Job{Site: math.MaxInt, Submitted: old, GPUs: 8}, now, nil, 8)
	if high.Priority != math.MaxInt64 {
		t.Errorf("the largest --priority with the heaviest weights: %d, want %d (held at the limit)", high.Priority, int64(math.MaxInt64))
	}
	plain := p.Factors(Job{Submitted: old, GPUs: 8}, now, nil, 8)
	low := p.Factors(Job{Site: math.MinInt, Submitted: old, GPUs: 8}, now, nil, 8)
	if plain.Priority <= low.Priority || plain.Priority < 0 {
		t.Errorf("no --priority: %d; the lowest --priority: %d: want the first above the second, and not negative", plain.Priority, low.Priority)
	}
}

// FuzzParse: any document is parsed or refused in one line, never a panic; what is
// accepted validates and survives a round trip.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{`{}`, `{"priority": {"weights": {"age": 1000}}}`, `{"accounts": {"ml": {"users": {"a": {"default": true}}}}}`,
		"\xEF\xBB\xBF{}", `{"a": 1, "a": 2}`, `{"partitions": {"p": {"max_time": "1h"}}}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("a two-line error: %q", err)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Errorf("Parse accepted what Validate refuses: %v", err)
		}
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Parse(b); err != nil {
			t.Errorf("a parsed policy does not parse again: %v\n%s", err, b)
		}
	})
}
