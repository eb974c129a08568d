package slurm

import (
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/cgroup"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/policy"
)

// TestSlurmSize: sizes as sstat 22.05 writes them: kilobytes, in a larger unit only
// while it divides them exactly (115824K, 100M), 0 bare.
func TestSlurmSize(t *testing.T) {
	for _, tc := range []struct {
		in   float64
		want string
	}{
		{0, "0"}, {4096, "4K"}, {118603776, "115824K"}, {100 << 20, "100M"}, {1536, "2K"},
		{3 << 40, "3T"}, {(1 << 30) + 4096, "1048580K"},
	} {
		if got := slurmSize(tc.in); got != tc.want {
			t.Errorf("slurmSize(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestCPUTime: sstat's AveCPU and MinCPU: HH:MM:SS, D-HH:MM:SS from a day.
func TestCPUTime(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want string
	}{
		{0, "00:00:00"}, {1500 * time.Millisecond, "00:00:01"}, {3661 * time.Second, "01:01:01"},
		{25 * time.Hour, "1-01:00:00"}, {-time.Second, "00:00:00"},
	} {
		if got := cpuTime(tc.in); got != tc.want {
			t.Errorf("cpuTime(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestSstatRow: a step over two nodes takes the larger node's memory for MaxRSS and
// MaxRSSNode, the average per task for AveRSS and AveCPU, the node with the least CPU
// per task for MinCPU; a node without a record counts for nothing, and a step with
// none leaves every usage field blank.
func TestSstatRow(t *testing.T) {
	st := statStep{id: "7.0", nodes: []string{"a", "b", "c"}, tasks: map[string]int{"a": 2, "b": 2, "c": 1}}
	usage := map[string]job.NodeUsage{
		"a": {Node: "a", MaxBytes: 100 << 20, Usage: cgroup.Usage{CurrentBytes: 60 << 20, CPU: 4 * time.Second, MajorFaults: 3}},
		"b": {Node: "b", MaxBytes: 300 << 20, Usage: cgroup.Usage{CurrentBytes: 140 << 20, CPU: 10 * time.Second, MajorFaults: 1}},
	}
	r := newStatRow(st, usage)
	for key, want := range map[string]string{
		"jobid": "7.0", "nodelist": "a,b,c", "ntasks": "5", "maxrss": "300M", "maxrssnode": "b", "averss": "40M",
		"maxpages": "3", "maxpagesnode": "a", "mincpu": "00:00:02", "mincpunode": "a", "avecpu": "00:00:02",
		"tresusageinmax": "cpu=00:00:05,mem=300M,pages=3", "tresusageinmaxnode": "cpu=b,mem=b,pages=a",
		"maxvmsize": "", "maxrsstask": "", "consumedenergy": "",
	} {
		if got := r.value(key); got != want {
			t.Errorf("%s = %q, want %q", key, got, want)
		}
	}
	none := newStatRow(st, nil)
	if none.value("maxrss") != "" || none.value("avecpu") != "" || none.value("ntasks") != "5" {
		t.Errorf("a step without usage: maxrss %q avecpu %q ntasks %q", none.value("maxrss"), none.value("avecpu"), none.value("ntasks"))
	}
}

// TestSstatColumns: the default header is sstat's fields at their widths; --format
// takes any case and NAME%WIDTH, and refuses an unknown field in sstat's words.
func TestSstatColumns(t *testing.T) {
	cols, err := sstatColumns("JobID,maxrss,MaxRSSNode%4,NTasks")
	if err != nil {
		t.Fatal(err)
	}
	tab := acctTable{cols: cols}
	head := tab.line(func(c sacctCol) string { return c.f.name })
	if want := "JobID            MaxRSS MaxR   NTasks "; head != want {
		t.Errorf("header %q, want %q", head, want)
	}
	p := acctTable{cols: cols, parsable: true, trailing: true}
	if got := p.line(func(c sacctCol) string { return c.f.name }); got != "JobID|MaxRSS|MaxRSSNode|NTasks|" {
		t.Errorf("-p header %q", got)
	}
	if _, err := sstatColumns("JobID,Bogus"); err == nil || err.Error() != `error: Invalid field requested: "Bogus"` {
		t.Errorf("unknown field: %v", err)
	}
	if _, err := sstatColumns(sstatDefault); err != nil {
		t.Errorf("the default fields: %v", err)
	}
	// A width past maxFieldWidth is refused by sstat and sacct alike (every line is built
	// in memory); sacct takes a negative width (the other justification), sstat does not.
	for _, f := range []string{"JobID%65536", "JobID%-5"} {
		if _, err := sstatColumns(f); err == nil || err.Error() != `error: Invalid field requested: "`+f+`"` {
			t.Errorf("sstat --format=%s: %v", f, err)
		}
	}
	for _, f := range []string{"JobID%2147483647", "JobID%-65536"} {
		if _, err := sacctColumns(values{"format": f}); err == nil || err.Error() != `error: Invalid field requested: "`+f+`"` {
			t.Errorf("sacct -o %s: %v", f, err)
		}
	}
	if cols, err := sacctColumns(values{"format": "JobID%-12,JobName%65535"}); err != nil || cols[0].width != 12 || cols[1].width != 65535 {
		t.Errorf("sacct -o JobID%%-12,JobName%%65535: %+v, %v", cols, err)
	}
	if _, err := parseStepList("7.x"); err == nil {
		t.Error("7.x taken for a step")
	}
	if sel, err := parseStepList("7,8.batch,9.2"); err != nil || len(sel) != 3 || sel[1].step != "batch" || sel[2].step != "2" {
		t.Errorf("parseStepList: %+v, %v", sel, err)
	}
}

// TestSprioFormats: the default format has a column per weight that is not 0, in
// sprio's order, the user's with -u; values are the weighted factors as whole numbers,
// -n's the factors to seven decimals; -w's line gives the weights.
func TestSprioFormats(t *testing.T) {
	w := policy.Weights{Age: 1000, FairShare: 10000, QOS: 0, JobSize: 500}
	if got, want := sprioDefault(w, false, false), "%.15i %9r %.10Y %.10S %.10A %.10F %.10J"; got != want {
		t.Errorf("default %q, want %q", got, want)
	}
	if got, want := sprioDefault(w, true, true), "%.15i %9r %.8u %10y %10a %10f %10j"; got != want {
		t.Errorf("-u -n %q, want %q", got, want)
	}
	fields, err := parseFormat(sprioDefault(w, false, false), sprioLetters)
	if err != nil {
		t.Fatal(err)
	}
	head := render(fields, func(k string) string { return sprioLetters[k] })
	if want := "          JOBID PARTITION   PRIORITY       SITE        AGE  FAIRSHARE    JOBSIZE"; head != want {
		t.Errorf("header\n%q, want\n%q", head, want)
	}
	pe := job.PriorityEntry{ID: "12", User: "alice", Partition: "gpu", Weights: w,
		Factors: policy.Factors{Age: 0.5, FairShare: 0.125, JobSize: 0.25, Priority: 1875}}
	line := render(fields, func(k string) string { return sprioValue(k, pe) })
	if want := "             12 gpu             1875          0        500       1250        125"; line != want {
		t.Errorf("line\n%q, want\n%q", line, want)
	}
	wl := render(fields, func(k string) string { return sprioWeight(k, w) })
	if want := "        Weights                               1       1000      10000        500"; wl != want {
		t.Errorf("-w\n%q, want\n%q", wl, want)
	}
	if got := sprioValue("f", pe); got != "0.1250000" {
		t.Errorf("-n fairshare %q", got)
	}
	// Every factor's letter pair: the weighted value, and -n's factor.
	pq := pe
	pq.Weights.Partition, pq.Weights.QOS = 2000, 400
	pq.Factors.Partition, pq.Factors.QOS = 0.75, 0.5
	for k, want := range map[string]string{"A": "500", "a": "0.5000000", "F": "1250", "J": "125", "j": "0.2500000",
		"P": "1500", "p": "0.7500000", "Q": "200", "q": "0.5000000", "B": "0", "b": "0.0000000", "Z": ""} {
		if got := sprioValue(k, pq); got != want {
			t.Errorf("sprioValue(%q) = %q, want %q", k, got, want)
		}
	}
}

// TestSprioFieldsDropsUnknownLetters: a letter sprio does not know is named on stderr
// and left out, the rest of the format kept, as sprio does (exit 0).
func TestSprioFieldsDropsUnknownLetters(t *testing.T) {
	var errOut strings.Builder
	e := &Env{Stderr: &errOut}
	fields := sprioFields(e, "%.15i %Z %10u%%")
	got := render(fields, func(k string) string { return sprioLetters[k] })
	if want := "          JOBID  USER      %"; got != want {
		t.Errorf("fields %q, want %q", got, want)
	}
	if errOut.String() != "sprio: error: Invalid job format specification: Z\n" {
		t.Errorf("stderr %q", errOut.String())
	}
	if f := sprioFields(&Env{Stderr: &errOut}, "%Z%"); len(f) != 0 {
		t.Errorf("%%Z%%: %+v, want nothing left", f)
	}
}

// TestSshareRows: the tree of a policy with two accounts, one user listed in each, and
// usage charged to one of them and to a user the policy does not list: the root, each
// account and its users, with sshare's columns; -u, -A and -U filter.
func TestSshareRows(t *testing.T) {
	p := &policy.Policy{Accounts: map[string]policy.Account{
		"hpc": {Shares: 1, Users: map[string]policy.User{"heavy": {}}},
		"lab": {Shares: 3, Users: map[string]policy.User{"light": {}}},
	}}
	u := &policy.Usage{Accounts: map[string]float64{"hpc": 3600}, Users: map[string]float64{"hpc/heavy": 3000, "hpc/guest": 600}}
	cols, err := sshareColumns(sshareDefault)
	if err != nil {
		t.Fatal(err)
	}
	tab := acctTable{cols: cols}
	var lines []string
	lines = append(lines, tab.line(func(c sacctCol) string { return c.f.name }))
	for _, r := range shareRows(p, u, shareFilter{all: true}) {
		lines = append(lines, tab.line(func(c sacctCol) string { return r.value(c.key) }))
	}
	want := []string{
		"Account                    User  RawShares  NormShares    RawUsage  EffectvUsage  FairShare ",
		"root                                          1.000000        3600      1.000000            ",
		" hpc                                     1    0.250000        3600      1.000000   0.062500 ",
		"  hpc                     guest     parent    0.250000         600      1.000000   0.062500 ",
		"  hpc                     heavy          1    0.250000        3000      1.000000   0.062500 ",
		" lab                                     3    0.750000           0      0.000000   1.000000 ",
		"  lab                     light          1    0.750000           0      0.000000   1.000000 ",
	}
	if got := strings.Join(lines, "\n"); got != strings.Join(want, "\n") {
		t.Errorf("sshare -a:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	fs := policy.NewFairShare(p, u, nil)
	if f := fs.Factor("hpc", "heavy"); f != 0.0625 {
		t.Errorf("the scheduler's factor for hpc/heavy %v, sshare's 0.062500", f)
	}
	rows := shareRows(p, u, shareFilter{me: "light"})
	if len(rows) != 4 || rows[3].user != "light" {
		t.Errorf("sshare as light: %+v, want root, hpc, lab and light's line", rows)
	}
	if rows := shareRows(&policy.Policy{}, policy.NewUsage(), shareFilter{all: true}); len(rows) != 0 {
		t.Errorf("sshare with no association: %+v, want no line (Slurm prints its header alone)", rows)
	}
	rows = shareRows(p, u, shareFilter{all: true, accounts: []string{"lab"}, usersOnly: true})
	if len(rows) != 1 || rows[0].user != "light" {
		t.Errorf("sshare -a -A lab -U: %+v", rows)
	}
	if c, err := sshareColumns("A,Eff,norms%8"); err != nil || len(c) != 3 || c[1].f.name != "EffectvUsage" || c[2].width != 8 {
		t.Errorf("prefixes: %+v, %v", c, err)
	}
	if _, err := sshareColumns("Bogus"); err == nil || err.Error() != `error: Invalid field requested: "bogus"` {
		t.Errorf("unknown field: %v", err)
	}
}
