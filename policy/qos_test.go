package policy

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestQOSLimits: a job's QOS (its --qos, else its account's) gives its priority factor
// and its limits, as sacctmgr's QOS: MaxWall, GrpTRES and MaxTRESPerUser GPUs,
// MaxJobsPerUser, each with Slurm's pending reason; an unknown --qos is refused at
// admission in Slurm's words.
func TestQOSLimits(t *testing.T) {
	p, err := Parse([]byte(`{"priority": {"weights": {"qos": 1000}},
		"qos": {"normal": {"priority": 10}, "high": {"priority": 100, "max_wall": "1h", "grp_gpus": 16, "max_gpus_per_user": 8, "max_jobs_per_user": 2}},
		"accounts": {"ml": {"qos": "high"}, "web": {"qos": "normal"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	job := func(user, account, qos string, gpus int, limit time.Duration) Job {
		return Job{ID: "1", User: user, Account: account, QOS: qos, GPUs: gpus, TimeLimit: limit}
	}
	if err := p.Admit(job("alice", "ml", "bogus", 1, time.Minute)); !errors.Is(err, ErrInvalidQOS) {
		t.Errorf("--qos bogus: %v, want ErrInvalidQOS", err)
	}
	if f := p.Factors(job("bob", "web", "high", 1, time.Minute), time.Now(), nil, 8); f.QOS != 1 {
		t.Errorf("web's job with --qos high: QOS factor %v, want 1 (the job's QOS, not its account's)", f.QOS)
	}
	if f := p.Factors(job("bob", "web", "", 1, time.Minute), time.Now(), nil, 8); f.QOS != 0.1 {
		t.Errorf("web's job: QOS factor %v, want 0.1 (its account's QOS)", f.QOS)
	}
	h := p.NewHeld()
	if why := p.Check(job("alice", "ml", "", 1, 2*time.Hour), h, nil); !strings.HasPrefix(why, "QOSMaxWallDurationPerJobLimit: ") {
		t.Errorf("--time 2h in QOS high: %q", why)
	}
	if why := p.Check(job("alice", "ml", "", 1, 0), h, nil); !strings.HasPrefix(why, "QOSMaxWallDurationPerJobLimit: --time UNLIMITED") {
		t.Errorf("no --time in QOS high: %q", why)
	}
	h.Add(job("alice", "ml", "", 8, time.Minute)) // high through its account
	if why := p.Check(job("alice", "web", "high", 1, time.Minute), h, nil); !strings.HasPrefix(why, "QOSMaxGRESPerUser: alice holds 8 of 8 GPUs in QOS high") {
		t.Errorf("alice's 9th GPU in QOS high: %q", why)
	}
	if why := p.Check(job("alice", "web", "", 8, time.Minute), h, nil); why != "" {
		t.Errorf("alice's job in QOS normal: %q, want none", why)
	}
	h.Add(job("bob", "web", "high", 8, time.Minute))
	if why := p.Check(job("carol", "ml", "", 1, time.Minute), h, nil); !strings.HasPrefix(why, "QOSGrpGRES: QOS high holds 16 of 16 GPUs") {
		t.Errorf("a 17th GPU in QOS high: %q", why)
	}
	p.QOS["high"] = QOS{Priority: 100, MaxJobsPerUser: 2}
	h.Add(job("alice", "ml", "high", 1, time.Minute))
	if why := p.Check(job("alice", "ml", "", 1, time.Minute), h, nil); !strings.HasPrefix(why, "QOSMaxJobsPerUserLimit: alice runs 2 of 2 jobs in QOS high") {
		t.Errorf("alice's 3rd job in QOS high: %q", why)
	}
	if _, err := Parse([]byte(`{"qos": {"q": {"grp_gpus": -1}}}`)); err == nil || !strings.Contains(err.Error(), "qos.q.grp_gpus -1") {
		t.Errorf("a negative limit: %v", err)
	}
}
