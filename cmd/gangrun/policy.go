package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"text/tabwriter"

	"github.com/gangrun/gangrun/acl"
	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/internal/userfile"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/policy"
)

// runPolicy is `gangrun policy set FILE` and `gangrun policy show [--json]`: the
// operator's partitions, accounts, limits and priority weights (docs/policy.md).
func runPolicy(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "policy", "set FILE | show [--json] | usage [--json]")
	consul := consulFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	verb := fs.Arg(0)
	switch {
	case verb == "set" && fs.NArg() == 2:
	case (verb == "show" || verb == "usage") && fs.NArg() == 1:
	default:
		return usageErr(e, "policy", "want set FILE, show or usage (got %q)", fs.Args())
	}
	var p *policy.Policy
	if verb == "set" {
		data, err := userfile.ReadFile(fs.Arg(1), policy.MaxPolicyBytes)
		if err != nil {
			return usageErr(e, "policy", "%v", err)
		}
		if p, err = policy.Parse(data); err != nil {
			return usageErr(e, "policy", "%s: %v", fs.Arg(1), err)
		}
	}
	s, code := openReader(ctx, e, "policy", *consul)
	if code != exitOK {
		return code
	}
	defer s.Close()
	switch verb {
	case "set":
		who, code := identify(ctx, e, "policy", s)
		if code != exitOK {
			return code
		}
		if who.Role == acl.RoleOpen {
			munge, err := clusterSealer(ctx, e, s)
			if err != nil {
				return sealerErr(e, "policy", err)
			}
			if munge != nil {
				// No ACLs, but MUNGE: the elected agent sets it for root only.
				data, _ := json.Marshal(p)
				_, err := asker(munge).SetPolicy(ctx, s, data)
				switch {
				case errors.Is(err, job.ErrDenied), errors.Is(err, job.ErrInvalid):
					return usageErr(e, "policy", "%v", err)
				case err != nil:
					return failErr(e, "policy", err)
				}
				fmt.Fprintf(e.stdout, "policy set: %d partitions, %d accounts; the scheduler applies it on its next pass\n", len(p.Partitions), len(p.Accounts))
				return exitOK
			}
		}
		if code := needAdmin(e, "policy", "changing the policy", who); code != exitOK {
			return code
		}
		detail := fmt.Sprintf("%d partitions, %d accounts", len(p.Partitions), len(p.Accounts))
		if err := policy.Save(ctx, s, p, auditOp(who, audit.ActionPolicySet, "policy", "", detail)); err != nil {
			return failErr(e, "policy", err)
		}
		fmt.Fprintf(e.stdout, "policy set: %d partitions, %d accounts; the scheduler applies it on its next pass\n", len(p.Partitions), len(p.Accounts))
		return exitOK
	case "usage":
		u, err := policy.LoadUsage(ctx, s)
		if err != nil {
			return failErr(e, "policy", err)
		}
		if *asJSON {
			return printJSON(e, u)
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ACCOUNT/USER\tGPU-HOURS (DECAYED)")
		for _, k := range slices.Sorted(maps.Keys(u.Accounts)) {
			fmt.Fprintf(tw, "%s\t%.3f\n", k, u.Accounts[k]/3600)
		}
		for _, k := range slices.Sorted(maps.Keys(u.Users)) {
			fmt.Fprintf(tw, "%s\t%.3f\n", k, u.Users[k]/3600)
		}
		tw.Flush()
		return exitOK
	}
	p, err := policy.Load(ctx, s)
	if err != nil {
		return failErr(e, "policy", err)
	}
	if p == nil {
		if *asJSON {
			return printJSON(e, nil)
		}
		fmt.Fprintln(e.stdout, "no policy set: jobs go by --priority, then submission; no limits")
		return exitOK
	}
	b, _ := json.MarshalIndent(p, "", "  ")
	fmt.Fprintln(e.stdout, string(b))
	return exitOK
}

// printPriorities prints `gangrun queue --priority` as sprio does: each factor times
// its weight, and the sum.
func printPriorities(e *env, entries []job.PriorityEntry) {
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOBID\tPARTITION\tUSER\tACCOUNT\tPRIORITY\tSITE\tAGE\tFAIRSHARE\tJOBSIZE\tPARTITION\tQOS\tREASON")
	for _, q := range entries {
		f, w := q.Factors, q.Weights
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%s\n", q.ID, orDash(q.Partition), q.User, orDash(q.Account),
			f.Priority, f.Site, float64(w.Age)*f.Age, float64(w.FairShare)*f.FairShare, float64(w.JobSize)*f.JobSize,
			float64(w.Partition)*f.Partition, float64(w.QOS)*f.QOS, orDash(q.Reason))
	}
	tw.Flush()
}
