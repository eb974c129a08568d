package job

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// Accounting keys, under gangrun/acct/ (docs/accounting.md):
//
//	jobs/<day>/<id>   Record of job id, which ended on day (YYYY-MM-DD, UTC): written
//	                  once, in the transaction that makes the job's state final
//	daily/<day>       Rollup of the records of day folded away after the retention
//
// A record is kept until it is older than the retention (agent --acct-retention,
// DefaultAcctRetention); then the elected agent adds it to its day's rollup and deletes
// it in one transaction, so a job is counted in exactly one of the two. Rollups are
// kept RollupRetention.
const (
	acctPrefix      = "gangrun/acct/"
	acctJobsPrefix  = acctPrefix + "jobs/"
	acctDailyPrefix = acctPrefix + "daily/"
	// dayLayout names a day in the keys: a UTC date.
	dayLayout = "2006-01-02"
)

// Defaults of accounting's periods.
const (
	// DefaultAcctRetention is how long a job's record is kept (agent --acct-retention):
	// 30 days.
	DefaultAcctRetention = 30 * 24 * time.Hour
	// RollupRetention is how long a day's rollup is kept: 400 days, a year of reports
	// and fair-share history with a month to spare.
	RollupRetention = 400 * 24 * time.Hour
	// DefaultAcctFoldInterval is how often the elected agent looks for records past the
	// retention (agent --acct-fold-interval): hourly.
	DefaultAcctFoldInterval = time.Hour
	// foldBatch bounds the records one fold transaction deletes (with the fence and the
	// rollup's check-and-set, within store.MaxTxnOps).
	foldBatch = 100
)

func acctDayPrefix(day string) string      { return acctJobsPrefix + day + "/" }
func acctJobKey(day, id string) string     { return acctDayPrefix(day) + id }
func acctDailyKey(day string) string       { return acctDailyPrefix + day }
func dayOf(t time.Time) string             { return t.UTC().Format(dayLayout) }
func dayStart(t time.Time) time.Time       { return t.UTC().Truncate(24 * time.Hour) }
func parseDay(d string) (time.Time, error) { return time.Parse(dayLayout, d) }

// Record is a finished job's accounting record (sacct's line): written once, when the
// job's state becomes final. Its JSON fields are what `gangrun acct --json` prints;
// fields may be added, none renamed.
type Record struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	User      string `json:"user"`
	Account   string `json:"account"`
	Partition string `json:"partition"`
	// State is the final status; Reason why it ended; ExitCode as State.ExitCode.
	State    Status `json:"state"`
	Reason   string `json:"reason,omitempty"`
	ExitCode int    `json:"exit_code"`
	// Nodes are the nodes the job ran on last (its spares not counted); NumNodes their
	// count, GPUs the GPUs they held for it (NumNodes × GPUsPerNode).
	Nodes       []string `json:"nodes"`
	NumNodes    int      `json:"num_nodes"`
	GPUsPerNode int      `json:"gpus_per_node"`
	GPUs        int      `json:"gpus"`
	// Submitted, Started (zero when it never ran) and Ended, in UTC; Elapsed is
	// Ended − Started in seconds (0 when it never ran).
	Submitted time.Time `json:"submitted"`
	Started   time.Time `json:"started,omitzero"`
	Ended     time.Time `json:"ended"`
	Elapsed   int64     `json:"elapsed_seconds"`
	// GPUSeconds is what the job is charged (GPUSeconds' rule).
	GPUSeconds float64 `json:"gpu_seconds"`
	// Restarts counts every restart of the job's gang (a new attempt after one that
	// ended), node failures included: the sum of RestartsByCause, which counts them by
	// cause (RestartCauses). NodeFailures counts the nodes it lost. (queue's and show's
	// "restarts" is State.Restarts, the run's failures less the node failures, which
	// counts a final failure too.)
	Restarts        int            `json:"restarts"`
	NodeFailures    int            `json:"node_failures"`
	RestartsByCause map[string]int `json:"restarts_by_cause,omitempty"`
	// Attempts counts the job's rendezvous rounds (the newest maxAttemptsKept kept).
	Attempts int `json:"attempts"`
	// Preemptions counts the times a job of a higher tier pre-empted it; PreemptedBy
	// names those jobs, oldest first.
	Preemptions int      `json:"preemptions"`
	PreemptedBy []string `json:"preempted_by,omitempty"`
	// ETTR is the effective training time ratio at the end (State.ETTR); absent when
	// it cannot be known.
	ETTR *float64 `json:"ettr,omitempty"`
}

// GPUHours is the record's GPU-seconds in hours.
func (r Record) GPUHours() float64 { return r.GPUSeconds / 3600 }

// GPUSeconds is what job spec, in state st, is charged: the sum over its attempts of
// the GPUs the attempt ran on (its nodes × --gpus-per-node) times the attempt's running
// time, from its start (the rendezvous round) to its end (an attempt still open counts
// to the job's end). Spares held idle, the time pending (before the first attempt,
// between a requeue and the next) and an attempt whose nodes were never known (it ended
// before its round closed) are not charged; attempts older than the newest
// maxAttemptsKept are no longer in the state and are not charged either.
func GPUSeconds(spec Spec, st State) float64 {
	var total float64
	for _, a := range st.Attempts {
		if a.Started.IsZero() || len(a.Nodes) == 0 {
			continue
		}
		end := a.Ended
		if end.IsZero() {
			end = st.Ended
		}
		if d := end.Sub(a.Started); d > 0 {
			total += float64(len(a.Nodes)*spec.GPUsPerNode) * d.Seconds()
		}
	}
	return total
}

// RecordOf builds job j's accounting record from its spec and (final) state.
func RecordOf(j Job) Record {
	sp, st := j.Spec, j.State
	nodes := append([]string{}, st.Nodes...)
	if len(nodes) == 0 {
		for i := len(st.Attempts) - 1; i >= 0; i-- {
			if len(st.Attempts[i].Nodes) > 0 {
				nodes = append(nodes, st.Attempts[i].Nodes...)
				break
			}
		}
	}
	account := sp.Account
	if account == "" {
		account = sp.User // a job from before accounts: its user's own, as submit defaults it without a policy
	}
	r := Record{ID: sp.ID, Name: sp.Name, User: sp.User, Account: account, Partition: sp.Partition,
		State: st.Status, Reason: st.Reason, ExitCode: st.ExitCode, Nodes: nodes, NumNodes: len(nodes),
		GPUsPerNode: sp.GPUsPerNode, GPUs: len(nodes) * sp.GPUsPerNode,
		Submitted: sp.Submitted.UTC(), Started: st.Started.UTC(), Ended: st.Ended.UTC(),
		GPUSeconds: GPUSeconds(sp, st), NodeFailures: st.NodeFailures,
		RestartsByCause: maps.Clone(st.RestartsByCause), Attempts: len(st.Attempts), Preemptions: len(st.Preemptions)}
	for _, p := range st.Preemptions {
		r.PreemptedBy = append(r.PreemptedBy, p.By)
	}
	for _, n := range st.RestartsByCause {
		r.Restarts += n
	}
	if st.Started.IsZero() {
		r.Started = time.Time{}
	} else if st.Ended.After(st.Started) {
		r.Elapsed = int64(st.Ended.Sub(st.Started) / time.Second)
	}
	if v, ok := st.ETTR(sp.CheckpointDir, st.Ended); ok {
		r.ETTR = &v
	}
	return r
}

// recordOp is the operation that writes job j's record, in the transaction that makes
// its state final.
func recordOp(j Job) store.Op {
	r := RecordOf(j)
	b, _ := schema.Marshal(schema.AcctRecord, r)
	return store.Op{Verb: store.Set, Key: acctJobKey(dayOf(r.Ended), r.ID), Value: b}
}

// Filter selects records for Records: each set field must match.
type Filter struct {
	User, Account string
	State         Status
}

func (f Filter) match(r Record) bool {
	return (f.User == "" || r.User == f.User) && (f.Account == "" || r.Account == f.Account) && (f.State == "" || r.State == f.State)
}

// Records returns the records of the jobs that ended in [since, until) and match f,
// oldest job first. Records past the retention are in the rollups only.
//
// A range of at most maxDayLists days is read one day's list at a time; a longer one in
// a single list of every day's records, so the number of requests is bounded whatever
// the range (one per day since year 1 would be 740,000).
func Records(ctx context.Context, s store.Store, since, until time.Time, f Filter) ([]Record, error) {
	var out []Record
	keep := func(rs []storedRecord) {
		for _, r := range rs {
			if !r.Ended.Before(since) && r.Ended.Before(until) && f.match(r.Record) {
				out = append(out, r.Record)
			}
		}
	}
	if until.Sub(dayStart(since)) > maxDayLists*24*time.Hour {
		rs, _, err := prefixRecords(ctx, s, acctJobsPrefix)
		if err != nil {
			return nil, err
		}
		keep(rs)
	} else {
		for d := dayStart(since); d.Before(until); d = d.AddDate(0, 0, 1) {
			rs, _, err := dayRecords(ctx, s, dayOf(d))
			if err != nil {
				return nil, err
			}
			keep(rs)
		}
	}
	sort.SliceStable(out, func(a, b int) bool {
		na, _ := strconv.ParseUint(out[a].ID, 10, 64)
		nb, _ := strconv.ParseUint(out[b].ID, 10, 64)
		return na < nb
	})
	return out, nil
}

// storedRecord is a record and its key.
type storedRecord struct {
	Record
	key string
}

// dayRecords returns the records of day (unreadable ones left out) and the list's index.
func dayRecords(ctx context.Context, s store.Store, day string) ([]storedRecord, uint64, error) {
	rs, idx, err := prefixRecords(ctx, s, acctDayPrefix(day))
	if err != nil {
		return nil, 0, fmt.Errorf("accounting records of %s: %w", day, err)
	}
	return rs, idx, nil
}

// maxDayLists is the longest range, in days, Records reads one day at a time. Records
// are kept DefaultAcctRetention (30 days) before they are folded into rollups, so a
// longer range costs one list of about that many days' records instead.
const maxDayLists = 62

// prefixRecords returns the records under prefix (unreadable ones left out) and the
// list's index.
func prefixRecords(ctx context.Context, s store.Store, prefix string) ([]storedRecord, uint64, error) {
	entries, idx, err := s.List(ctx, prefix)
	if err != nil {
		return nil, 0, fmt.Errorf("accounting records: %w", err)
	}
	out := make([]storedRecord, 0, len(entries))
	for _, e := range entries {
		var r Record
		if schema.Unmarshal(schema.AcctRecord, e.Value, &r) == nil {
			out = append(out, storedRecord{r, e.Key}) // a newer gangrun's is left out, and stays
		}
	}
	return out, idx, nil
}

// WriteRecord stores r as a record, as the controller does when a job ends: for tools
// that import history, and for tests that need a record of another time.
func WriteRecord(ctx context.Context, s store.Store, r Record) error {
	if err := store.CheckSegment("job id", r.ID); err != nil {
		return err
	}
	if r.Ended.IsZero() {
		return errors.New("accounting record of job " + r.ID + ": no end time")
	}
	b, _ := schema.Marshal(schema.AcctRecord, r)
	_, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: acctJobKey(dayOf(r.Ended), r.ID), Value: b}})
	return err
}

// Usage is what a user used of an account: jobs ended and GPU-seconds charged, and the
// jobs by final state.
type Usage struct {
	Jobs       int            `json:"jobs"`
	GPUSeconds float64        `json:"gpu_seconds"`
	States     map[Status]int `json:"states,omitempty"`
}

// add counts record r.
func (u *Usage) add(r Record) {
	u.Jobs++
	u.GPUSeconds += r.GPUSeconds
	if u.States == nil {
		u.States = map[Status]int{}
	}
	u.States[r.State]++
}

// merge adds v.
func (u *Usage) merge(v Usage) {
	u.Jobs += v.Jobs
	u.GPUSeconds += v.GPUSeconds
	for st, n := range v.States {
		if u.States == nil {
			u.States = map[Status]int{}
		}
		u.States[st] += n
	}
}

// Rollup is one day's usage by account and user, of the records folded into it (the
// jobs that ended that day, UTC, once past the retention).
type Rollup struct {
	Day string `json:"day"`
	// Usage is by account, then user.
	Usage map[string]map[string]*Usage `json:"usage"`
}

// Add folds record r into the rollup.
func (ro *Rollup) Add(r Record) {
	if ro.Usage == nil {
		ro.Usage = map[string]map[string]*Usage{}
	}
	if ro.Usage[r.Account] == nil {
		ro.Usage[r.Account] = map[string]*Usage{}
	}
	u := ro.Usage[r.Account][r.User]
	if u == nil {
		u = &Usage{}
		ro.Usage[r.Account][r.User] = u
	}
	u.add(r)
}

// Fold moves the records of the jobs that ended before cutoff into their days'
// rollups and deletes the rollups of days before now − RollupRetention. Each
// transaction adds a batch of records to their day's rollup (check-and-set) and deletes
// them, behind fence (the leader's check): a record is counted once, whoever folds,
// and never lost. It returns how many records it folded. A day whose rollup a newer
// gangrun wrote is skipped: nothing is folded into it (it goes past RollupRetention, by
// its day, as every rollup), and an error wrapping schema.ErrNewer says so once every
// other day is done.
func Fold(ctx context.Context, s store.Store, fence []store.Op, cutoff, now time.Time) (folded int, err error) {
	oldest := dayStart(now.Add(-RollupRetention))
	var newer error // a day whose rollup a newer gangrun wrote: skipped, and said at the end
	for d := oldest; !d.After(cutoff); d = d.AddDate(0, 0, 1) {
		n, err := foldDay(ctx, s, fence, dayOf(d), cutoff)
		folded += n
		if errors.Is(err, schema.ErrNewer) {
			if newer == nil {
				newer = err
			}
			continue
		}
		if err != nil {
			return folded, err
		}
	}
	defer func() {
		if err == nil {
			err = newer
		}
	}()
	entries, _, err := s.List(ctx, acctDailyPrefix)
	if err != nil {
		return folded, err
	}
	var drop []store.Op
	for _, e := range entries {
		day, err := parseDay(strings.TrimPrefix(e.Key, acctDailyPrefix))
		if err == nil && day.Before(oldest) {
			drop = append(drop, store.Op{Verb: store.Delete, Key: e.Key})
		}
	}
	txns, err := store.SplitTxn(fence, drop)
	if err != nil {
		return folded, err
	}
	for _, ops := range txns {
		if _, err := s.Txn(ctx, ops); err != nil {
			return folded, err
		}
	}
	return folded, nil
}

// foldDay folds day's records that ended before cutoff, a batch per transaction.
func foldDay(ctx context.Context, s store.Store, fence []store.Op, day string, cutoff time.Time) (int, error) {
	folded := 0
	for {
		rs, _, err := dayRecords(ctx, s, day)
		if err != nil {
			return folded, err
		}
		var batch []storedRecord
		for _, r := range rs {
			if r.Ended.Before(cutoff) && len(batch) < foldBatch {
				batch = append(batch, r)
			}
		}
		if len(batch) == 0 {
			return folded, nil
		}
		e, err := s.Get(ctx, acctDailyKey(day))
		if err != nil {
			return folded, err
		}
		ro, idx := Rollup{Day: day}, uint64(0)
		if e != nil {
			if err := schema.Unmarshal(schema.AcctRollup, e.Value, &ro); err != nil {
				// A newer gangrun's rollup is not overwritten: its day's records wait
				// for a gangrun that reads it.
				return folded, fmt.Errorf("rollup %s: %w", day, err)
			}
			idx = e.ModifyIndex
		}
		for _, r := range batch {
			ro.Add(r.Record)
		}
		b, _ := schema.Marshal(schema.AcctRollup, ro)
		ops := append(slices.Clone(fence), store.Op{Verb: store.CAS, Key: acctDailyKey(day), Value: b, Index: idx})
		for _, r := range batch {
			ops = append(ops, store.Op{Verb: store.Delete, Key: r.key})
		}
		_, err = s.Txn(ctx, ops)
		switch {
		case err == nil:
			folded += len(batch)
		case errors.Is(err, store.ErrStaleIndex):
			// Another fold changed the rollup meanwhile: read both again.
		default:
			return folded, err
		}
	}
}

// Rollups returns the rollups of the days in [since, until), by day.
func Rollups(ctx context.Context, s store.Store, since, until time.Time) ([]Rollup, error) {
	entries, _, err := s.List(ctx, acctDailyPrefix)
	if err != nil {
		return nil, err
	}
	var out []Rollup
	for _, e := range entries {
		day, err := parseDay(strings.TrimPrefix(e.Key, acctDailyPrefix))
		if err != nil || day.Before(dayStart(since)) || !day.Before(until) {
			continue
		}
		var ro Rollup
		if schema.Unmarshal(schema.AcctRollup, e.Value, &ro) == nil {
			out = append(out, ro)
		}
	}
	return out, nil
}

// AccountUsage is one account's usage in a report, and its users'.
type AccountUsage struct {
	Account string `json:"account"`
	Usage
	Users []UserUsage `json:"users"`
}

// UserUsage is one user's usage of an account in a report.
type UserUsage struct {
	User string `json:"user"`
	Usage
}

// Report sums the usage of the jobs that ended in [since, until), per account and
// user, as sreport's account utilisation by user: the records still kept (their exact
// end times) plus the rollups of the days folded (whole UTC days: a day's rollup counts
// when the day starts within [day of since, until)). Accounts and users are sorted by
// name.
func Report(ctx context.Context, s store.Store, since, until time.Time) ([]AccountUsage, error) {
	sum := Rollup{Usage: map[string]map[string]*Usage{}}
	rollups, err := Rollups(ctx, s, since, until)
	if err != nil {
		return nil, err
	}
	for _, ro := range rollups {
		for acct, users := range ro.Usage {
			for user, u := range users {
				if sum.Usage[acct] == nil {
					sum.Usage[acct] = map[string]*Usage{}
				}
				if sum.Usage[acct][user] == nil {
					sum.Usage[acct][user] = &Usage{}
				}
				sum.Usage[acct][user].merge(*u)
			}
		}
	}
	records, err := Records(ctx, s, since, until, Filter{})
	if err != nil {
		return nil, err
	}
	for _, r := range records {
		sum.Add(r)
	}
	out := []AccountUsage{}
	for _, acct := range slices.Sorted(maps.Keys(sum.Usage)) {
		a := AccountUsage{Account: acct, Users: []UserUsage{}}
		for _, user := range slices.Sorted(maps.Keys(sum.Usage[acct])) {
			u := *sum.Usage[acct][user]
			a.Usage.merge(u)
			a.Users = append(a.Users, UserUsage{User: user, Usage: u})
		}
		out = append(out, a)
	}
	return out, nil
}

// KeepAccounts returns the elected agent's accounting keeper, the signature
// allocator.AgentConfig.Leader takes (allocator.Periodic): on taking the lead and every
// interval (0: DefaultAcctFoldInterval) it folds the records older than retention (0:
// DefaultAcctRetention) into the daily rollups (Fold), fenced by the leader's session.
func KeepAccounts(log *zap.Logger, retention, interval time.Duration) func(ctx context.Context, s store.Store, session string) error {
	if retention <= 0 {
		retention = DefaultAcctRetention
	}
	if interval <= 0 {
		interval = DefaultAcctFoldInterval
	}
	if log == nil {
		log = zap.NewNop()
	}
	return allocator.Periodic(log, interval, "accounting: fold records past the retention", func(ctx context.Context, s store.Store, fence []store.Op) error {
		now := time.Now()
		n, err := Fold(ctx, s, fence, now.Add(-retention), now)
		if err == nil && n > 0 {
			log.Info("accounting: records past the retention folded into the daily rollups", zap.Int("records", n), zap.Duration("retention", retention))
		}
		return err
	})
}
