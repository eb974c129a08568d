package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gangrun/gangrun/internal/quote"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
)

// defaultReportPeriod is how far back `acct --report` looks without --since: the
// records' retention.
const defaultReportPeriod = job.DefaultAcctRetention

func runAcct(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "acct", "[--user U] [--account A] [--state S] [--since DATE|DURATION] [--until DATE|DURATION] [--report] [--json]")
	consul := consulFlag(fs)
	user := fs.String("user", "", "only this user's jobs")
	account := fs.String("account", "", "only this account's jobs")
	state := fs.String("state", "", "only jobs that ended in this state (COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL)")
	sinceFlag := fs.String("since", "", "jobs that ended from: YYYY-MM-DD[THH:MM[:SS]] (UTC) or a time ago (90m, 36h, 7d); default: 00:00 UTC today, the last 30 days with --report")
	untilFlag := fs.String("until", "", "jobs that ended before: as --since; default: now")
	report := fs.Bool("report", false, "sum jobs and GPU-hours per account and user (like sreport)")
	asJSON := fs.Bool("json", false, "print JSON")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		return usageErr(e, "acct", "unexpected argument %q: acct takes flags only", fs.Arg(0))
	}
	// A user or account is a name the records carry, never a path: "a/b" names none.
	for _, f := range []struct{ flag, v string }{{"--user", *user}, {"--account", *account}} {
		if f.v != "" {
			if err := store.CheckSegment(f.flag, f.v); err != nil {
				return usageErr(e, "acct", "%v", err)
			}
		}
	}
	now := time.Now().UTC()
	since := now.Truncate(24 * time.Hour)
	if *report {
		since = now.Add(-defaultReportPeriod)
	}
	until := now
	var err error
	if *sinceFlag != "" {
		if since, err = parseWhen(*sinceFlag, now); err != nil {
			return usageErr(e, "acct", "--since %s: %v", quote.Q(*sinceFlag), err)
		}
	}
	if *untilFlag != "" {
		if until, err = parseWhen(*untilFlag, now); err != nil {
			return usageErr(e, "acct", "--until %s: %v", quote.Q(*untilFlag), err)
		}
	}
	if !since.Before(until) {
		return usageErr(e, "acct", "--since %s is not before --until %s", since.Format(time.RFC3339), until.Format(time.RFC3339))
	}
	var st job.Status
	if *state != "" {
		st = job.Status(strings.ToUpper(*state))
		if !st.Final() {
			return usageErr(e, "acct", "--state %s: want an end state: COMPLETED, FAILED, CANCELLED, TIMEOUT or NODE_FAIL", quote.Q(*state))
		}
		if *report {
			return usageErr(e, "acct", "--state %q: --report sums every end state (drop --state)", *state)
		}
	}
	s, code := openReader(ctx, e, "acct", *consul)
	if code != exitOK {
		return code
	}
	defer s.Close()
	if *report {
		rep, err := job.Report(ctx, s, since, until)
		if err != nil {
			return failErr(e, "acct", err)
		}
		rep = filterReport(rep, *account, *user)
		if *asJSON {
			return printJSON(e, reportJSON(rep, since, until))
		}
		printReport(e, rep, since, until)
		return exitOK
	}
	recs, err := job.Records(ctx, s, since, until, job.Filter{User: *user, Account: *account, State: st})
	if err != nil {
		return failErr(e, "acct", err)
	}
	if *asJSON {
		if recs == nil {
			recs = []job.Record{}
		}
		return printJSON(e, recs)
	}
	printRecords(e, recs)
	return exitOK
}

// minAcctYear is the earliest year --since and --until take: the Unix epoch's.
const minAcctYear = 1970

// parseWhen reads --since and --until: a UTC date (YYYY-MM-DD), a date and time
// (YYYY-MM-DDTHH:MM[:SS], or RFC 3339 with a zone), or a time before now: a Go
// duration (90m, 36h) or whole days (7d).
func parseWhen(v string, now time.Time) (time.Time, error) {
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, v); err == nil {
			if t.UTC().Year() < minAcctYear {
				return time.Time{}, fmt.Errorf("want a date from %d-01-01 on (no job ended before)", minAcctYear)
			}
			return t.UTC(), nil
		}
	}
	if d, ok := strings.CutSuffix(v, "d"); ok {
		if n, err := strconv.Atoi(d); err == nil && n >= 0 && n <= 100000 {
			if t := now.AddDate(0, 0, -n); t.Year() >= minAcctYear {
				return t, nil
			}
			return time.Time{}, fmt.Errorf("want at most %d days ago (%d-01-01: no job ended before)", int(now.Sub(time.Date(minAcctYear, 1, 1, 0, 0, 0, 0, time.UTC)).Hours()/24), minAcctYear)
		}
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 && d <= maxWait {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("want a date YYYY-MM-DD[THH:MM[:SS]] (UTC) or a time ago such as 90m, 36h or 7d")
}

// printRecords prints finished jobs as sacct does.
func printRecords(e *env, recs []job.Record) {
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOBID\tUSER\tACCOUNT\tPARTITION\tSTATE\tEXITCODE\tSTART\tEND\tELAPSED\tNNODES\tALLOCGPUS\tGPUHOURS\tRESTARTS\tPREEMPTED")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\t%d\t%.2f\t%d\t%d\n", r.ID, r.User, r.Account, orDash(r.Partition), r.State, r.ExitCode,
			stampOr(r.Started), stampOr(r.Ended), elapsed(r.Elapsed), r.NumNodes, r.GPUs, r.GPUHours(), r.Restarts, r.Preemptions)
	}
	tw.Flush()
}

// filterReport keeps account's usage (all when ""), and of it user's (all when "").
func filterReport(rep []job.AccountUsage, account, user string) []job.AccountUsage {
	out := []job.AccountUsage{}
	for _, a := range rep {
		if account != "" && a.Account != account {
			continue
		}
		if user != "" {
			kept := job.AccountUsage{Account: a.Account, Users: []job.UserUsage{}}
			for _, u := range a.Users {
				if u.User == user {
					kept.Users = append(kept.Users, u)
					kept.Jobs, kept.GPUSeconds, kept.States = u.Jobs, u.GPUSeconds, u.States
				}
			}
			if len(kept.Users) == 0 {
				continue
			}
			a = kept
		}
		out = append(out, a)
	}
	return out
}

// printReport prints the usage per account, then per user of each, as sreport's
// account utilisation by user.
func printReport(e *env, rep []job.AccountUsage, since, until time.Time) {
	fmt.Fprintf(e.stdout, "Usage of jobs that ended from %s to %s (GPU-hours)\n", since.Format(time.RFC3339), until.Format(time.RFC3339))
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ACCOUNT\tUSER\tJOBS\tGPUHOURS")
	for _, a := range rep {
		fmt.Fprintf(tw, "%s\t-\t%d\t%.2f\n", a.Account, a.Jobs, a.GPUSeconds/3600)
		for _, u := range a.Users {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f\n", a.Account, u.User, u.Jobs, u.GPUSeconds/3600)
		}
	}
	tw.Flush()
}

// reportJSON is `acct --report --json`: {"since", "until", "accounts": [{"account",
// "jobs", "gpu_seconds", "gpu_hours", "states", "users": [{"user", "jobs",
// "gpu_seconds", "gpu_hours", "states"}]}]}.
func reportJSON(rep []job.AccountUsage, since, until time.Time) any {
	type userJSON struct {
		job.UserUsage
		GPUHours float64 `json:"gpu_hours"`
	}
	type accountJSON struct {
		Account string `json:"account"`
		job.Usage
		GPUHours float64    `json:"gpu_hours"`
		Users    []userJSON `json:"users"`
	}
	out := struct {
		Since    string        `json:"since"`
		Until    string        `json:"until"`
		Accounts []accountJSON `json:"accounts"`
	}{Since: since.Format(time.RFC3339), Until: until.Format(time.RFC3339), Accounts: []accountJSON{}}
	for _, a := range rep {
		aj := accountJSON{Account: a.Account, Usage: a.Usage, GPUHours: a.GPUSeconds / 3600, Users: []userJSON{}}
		for _, u := range a.Users {
			aj.Users = append(aj.Users, userJSON{UserUsage: u, GPUHours: u.GPUSeconds / 3600})
		}
		out.Accounts = append(out.Accounts, aj)
	}
	return out
}
