package allocator

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/policy"
)

// benchPolicy is the policy of BenchmarkPolicyPass: 20 accounts of 5 users, every
// limit kind set, every weight set.
func benchPolicy() *policy.Policy {
	p := &policy.Policy{
		Priority: policy.Priority{Weights: policy.Weights{Age: 1000, FairShare: 10000, JobSize: 1000, Partition: 1000, QOS: 500}},
		QOS:      map[string]policy.QOS{"normal": {Priority: 1}, "high": {Priority: 10}},
		Accounts: map[string]policy.Account{},
	}
	for a := range 20 {
		acc := policy.Account{Shares: 1 + a%4, GrpGPUs: 256, GrpJobs: 64, MaxGPUsPerUser: 64, MaxJobsPerUser: 24, Users: map[string]policy.User{}}
		if a%5 == 0 {
			acc.QOS = "high"
		}
		for u := range 5 {
			acc.Users[fmt.Sprintf("user%03d", a*5+u)] = policy.User{Shares: 1 + u%2}
		}
		p.Accounts[fmt.Sprintf("acct%02d", a)] = acc
	}
	return p
}

// BenchmarkPolicyPass times one scheduling pass under a policy with `pending` jobs
// waiting from 100 users in 20 accounts, on 256 registered 8-GPU nodes (the in-memory
// store) that earlier passes filled: every pending job is ranked by multifactor
// priority, checked against the limits, and those within them go through placement,
// which finds no room. Jobs ask for 1, 2, 4 or 8 GPUs on one node, or 2 nodes × 8.
//
//	go test ./allocator -run '^$' -bench BenchmarkPolicyPass -benchtime 20x
func BenchmarkPolicyPass(b *testing.B) {
	for _, pending := range []int{10, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("pending=%d", pending), func(b *testing.B) {
			ctx := context.Background()
			s := store.NewMemory()
			registerNodes(b, s, 256, "dgx-h100")
			sess := leaderSession(b, s)
			sc := NewScheduler(s, SchedulerConfig{Session: sess, Name: "bench"})
			sc.SetPolicy(benchPolicy())
			shapes := [][2]int{{1, 1}, {1, 2}, {1, 4}, {1, 8}, {2, 8}}
			submitted := time.Now().Add(-time.Hour)
			write := func(first, n int, fill bool) {
				var ops []store.Op
				for i := first; i < first+n; i++ {
					sh := shapes[i%len(shapes)]
					if fill {
						sh = [2]int{1, 8}
					}
					user := i % 100
					r := JobRequest(fmt.Sprint(i), sh[0], sh[0], sh[1], "", "", nil, 0, nil)
					r.User, r.Account = fmt.Sprintf("user%03d", user), fmt.Sprintf("acct%02d", user/5)
					r.TimeLimit, r.Submitted = time.Hour, submitted.Add(time.Duration(i)*time.Second)
					req, err := JobRequestOps(r)
					if err != nil {
						b.Fatal(err)
					}
					ops = append(ops, req...)
					if len(ops) >= 100 {
						if _, err := s.Txn(ctx, ops); err != nil {
							b.Fatal(err)
						}
						ops = ops[:0]
					}
				}
				if len(ops) > 0 {
					if _, err := s.Txn(ctx, ops); err != nil {
						b.Fatal(err)
					}
				}
			}
			// Fill the cluster first (256 jobs of 8 GPUs), then queue `pending`.
			write(100000, 256, true)
			for range 2 {
				c, err := Snapshot(ctx, s)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := sc.Pass(ctx, c); err != nil {
					b.Fatal(err)
				}
			}
			write(0, pending, false)
			c, err := Snapshot(ctx, s)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := sc.Pass(ctx, c); err != nil { // the first pass over the new jobs
				b.Fatal(err)
			}
			if c, err = Snapshot(ctx, s); err != nil {
				b.Fatal(err)
			}
			free := 0
			for _, n := range c.Nodes {
				free += len(n.Free())
			}
			b.ReportMetric(float64(free), "free-gpus")
			b.ReportMetric(float64(len(c.Grants)), "running")
			b.ResetTimer()
			for b.Loop() {
				if _, err := sc.Pass(ctx, c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
