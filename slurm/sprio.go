package slurm

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/gangrun/gangrun/internal/quote"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/policy"
)

// sprioLetters are the %-letters sprio 22.05 takes (src/sprio/opts.c), with their
// headers: the upper-case factor letters print the weighted factor, the lower-case
// ones the factor itself (-n).
var sprioLetters = map[string]string{
	"i": "JOBID", "r": "PARTITION", "u": "USER", "Y": "PRIORITY", "y": "PRIORITY", "S": "SITE",
	"A": "AGE", "a": "AGE", "B": "ASSOC", "b": "ASSOC", "F": "FAIRSHARE", "f": "FAIRSHARE",
	"J": "JOBSIZE", "j": "JOBSIZE", "P": "PARTITION", "p": "PARTITION", "Q": "QOS", "q": "QOS",
	"N": "NICE", "T": "TRES", "t": "TRES",
}

// sprio's long formats (src/sprio/sprio.c): -l, and -l with -n.
const (
	sprioLong     = "%.15i %9r %.8u %.10Y %.10S %.10A %.10B %.10F %.10J %.10P %.10Q %.11N %.20T"
	sprioLongNorm = "%.15i %9r %.8u %10y %10a %10b %10f %10j %10p %10q %20t"
)

// sprioOptions are sprio 22.05's options, those gangrun builds and, refused, the rest.
var sprioOptions = []option{
	{long: "format", short: 'o', arg: reqArg},
	{long: "help", arg: noArg},
	{long: "jobs", short: 'j', arg: reqArg},
	{long: "long", short: 'l', arg: noArg},
	{long: "noheader", short: 'h', arg: noArg},
	{long: "norm", short: 'n', arg: noArg},
	{long: "partition", short: 'p', arg: reqArg},
	{long: "usage", arg: noArg},
	{long: "user", short: 'u', arg: reqArg},
	{long: "verbose", short: 'v', arg: noArg},
	{long: "version", short: 'V', arg: noArg},
	{long: "weights", short: 'w', arg: noArg},
	{long: "cluster", short: 'M', arg: reqArg, unsupported: notBuilt},
	{long: "federation", arg: noArg, unsupported: notBuilt},
	{long: "local", arg: noArg, unsupported: notBuilt},
	{long: "sibling", arg: noArg, unsupported: notBuilt},
	{long: "sort", short: 'S', arg: reqArg, unsupported: notBuilt},
}

// sprioDefault is sprio's default format: the job, its partition (its user with -u),
// the priority and the site factor, then a column per factor whose weight is not 0
// (src/sprio/sprio.c); norm is -n's form.
func sprioDefault(w policy.Weights, users, norm bool) string {
	f := "%.15i %9r"
	if users {
		f += " %.8u"
	}
	col := func(l string) string {
		if norm {
			return " %10" + l
		}
		return " %.10" + l
	}
	if norm {
		f += " %10y"
	} else {
		f += " %.10Y %.10S"
	}
	for _, c := range []struct {
		w      int64
		letter string
	}{{w.Age, "a"}, {w.FairShare, "f"}, {w.JobSize, "j"}, {w.Partition, "p"}, {w.QOS, "q"}} {
		if c.w != 0 {
			l := c.letter
			if !norm {
				l = string(rune(l[0] - 'a' + 'A'))
			}
			f += col(l)
		}
	}
	return f
}

// Sprio is sprio: the priority factors of the pending jobs as gangrun's scheduler
// computes them (job.Priorities: policy.Factors' multifactor formula), by job id as
// sprio sorts them, with Slurm's columns and widths: -o, -l, -n,
// -w, -h, and the filters -j, -u and -p. NICE is the job's --nice, which PRIORITY has
// taken off (never below 1, as Slurm's priority_multifactor keeps a job's); ASSOC and
// TRES have no counterpart in gangrun's formula: 0 (none for TRES).
func Sprio(ctx context.Context, e *Env, args []string) int {
	v, rest, done, code := parseOpts(e, "sprio", sprioOptions, args, 1, "Usage: sprio [OPTIONS]\n")
	if done {
		return code
	}
	if len(rest) > 0 {
		fmt.Fprint(e.Stdout, sprioUsage)
		return errorf(e, "sprio", 1, "Unrecognized option: %s", rest[0])
	}
	for _, id := range splitList(v["jobs"]) {
		// sprio's words and exit code for an id no job can have (a Slurm job id is a
		// positive 32-bit number).
		if n, err := strconv.ParseUint(id, 10, 32); err != nil || n == 0 {
			return errorf(e, "sprio", 1, "Invalid job id: %s", quote.Plain(id))
		}
	}
	s, err := e.Cluster.Open(ctx)
	if err != nil {
		return errorf(e, "sprio", 1, "slurm_load_job_prio: %v", err)
	}
	defer s.Close()
	entries, err := job.Priorities(ctx, s)
	if err != nil {
		fmt.Fprintf(e.Stderr, "Couldn't get priority factors from controller: %v\n", err)
		return 1
	}
	p, _ := policy.Load(ctx, s)
	if p == nil {
		p = &policy.Policy{}
	}
	w := p.Priority.Weights
	format := sprioDefault(w, v.has("user"), v.has("norm"))
	switch {
	case v.has("format"):
		format = v["format"]
	case v.has("long") && v.has("norm"):
		format = sprioLongNorm
	case v.has("long"):
		format = sprioLong
	}
	fields := sprioFields(e, format)
	header := func() {
		if !v.has("noheader") {
			fmt.Fprintln(e.Stdout, render(fields, func(k string) string { return sprioLetters[k] }))
		}
	}
	if v.has("weights") {
		header()
		fmt.Fprintln(e.Stdout, render(fields, func(k string) string { return sprioWeight(k, w) }))
		return 0
	}
	jobs, users, parts := splitList(v["jobs"]), splitList(v["user"]), splitList(v["partition"])
	var shown []job.PriorityEntry
	for _, pe := range entries {
		if (len(jobs) > 0 && !slices.Contains(jobs, pe.ID)) || (len(users) > 0 && !slices.Contains(users, pe.User)) ||
			(len(parts) > 0 && !slices.Contains(parts, job.PartitionName(pe.Partition))) {
			continue
		}
		shown = append(shown, pe)
	}
	sortByJobID(shown)
	if len(shown) == 0 && len(jobs) > 0 {
		fmt.Fprintln(e.Stdout, "Unable to find jobs matching user/id(s) specified")
		return 0
	}
	header()
	for _, pe := range shown {
		fmt.Fprintln(e.Stdout, render(fields, func(k string) string { return sprioValue(k, pe) }))
	}
	return 0
}

// sortByJobID puts the entries in sprio's default order, by job id: numerically by
// the job number, then by the array task's.
func sortByJobID(es []job.PriorityEntry) {
	key := func(id string) (int64, int64, string) {
		j, task, _ := strings.Cut(id, "_")
		a, _ := strconv.ParseInt(j, 10, 64)
		b, _ := strconv.ParseInt(task, 10, 64)
		return a, b, id
	}
	sort.SliceStable(es, func(x, y int) bool {
		a1, b1, s1 := key(es[x].ID)
		a2, b2, s2 := key(es[y].ID)
		if a1 != a2 {
			return a1 < a2
		}
		if b1 != b2 {
			return b1 < b2
		}
		return s1 < s2
	})
}

// sprioUsage is sprio's usage line, printed above its error for a word that is no
// option.
const sprioUsage = "Usage: sprio [-j jid[s]] [-u user_name[s]] [-o format] [-p partitions]\n" +
	"   [--federation] [--local] [--sibling] [--usage] [-hlnvVw]\n"

// sprioFields reads format as sprio does: a letter it does not know is named on
// stderr ("Invalid job format specification: Z") and left out, and the rest printed.
func sprioFields(e *Env, format string) []field {
	for {
		fields, err := parseFormat(format, sprioLetters)
		if err == nil {
			return fields
		}
		fmt.Fprintf(e.Stderr, "sprio: %s\n", err.(*UsageError).Msg)
		bad := regexp.MustCompile(`%\.?-?[0-9]*[^%.0-9-]|%\.?-?[0-9]*$`).FindAllStringIndex(format, -1)
		cut := false
		for _, m := range bad {
			if _, ok := sprioLetters[format[m[1]-1:m[1]]]; !ok || m[1]-m[0] < 2 {
				format, cut = format[:m[0]]+format[m[1]:], true
				break
			}
		}
		if !cut {
			return nil
		}
	}
}

// sprioWeight is the -w line's text for letter k: the weights, "Weights" for the job.
func sprioWeight(k string, w policy.Weights) string {
	switch k {
	case "i":
		return "Weights"
	case "S":
		return "1"
	case "A", "a":
		return strconv.FormatInt(w.Age, 10)
	case "F", "f":
		return strconv.FormatInt(w.FairShare, 10)
	case "J", "j":
		return strconv.FormatInt(w.JobSize, 10)
	case "P", "p":
		return strconv.FormatInt(w.Partition, 10)
	case "Q", "q":
		return strconv.FormatInt(w.QOS, 10)
	case "B", "b":
		return "0"
	}
	return ""
}

// sprioValue is letter k's text for pending job pe: the weighted factors as whole
// numbers (sprio's "%.0f"), the factors themselves to seven decimals (-n's letters).
func sprioValue(k string, pe job.PriorityEntry) string {
	f, w := pe.Factors, pe.Weights
	weighted := func(weight int64, factor float64) string {
		return strconv.FormatFloat(float64(weight)*factor, 'f', 0, 64)
	}
	norm := func(factor float64) string { return strconv.FormatFloat(factor, 'f', 7, 64) }
	switch k {
	case "i":
		return pe.ID
	case "r":
		return job.PartitionName(pe.Partition)
	case "u":
		if pe.User == "" {
			return "(null)"
		}
		return pe.User
	case "Y":
		return strconv.FormatInt(max(f.Priority, 1), 10)
	case "y":
		return fmt.Sprintf("%16.14f", float64(max(f.Priority, 1))/float64(uint32(0xffffffff)))
	case "S":
		// The job's --priority: its nice is NICE's column, as sprio shows them.
		return strconv.Itoa(f.Site + pe.Nice)
	case "N":
		return strconv.Itoa(pe.Nice)
	}
	// The factors' letters: upper case the weighted value, lower case the factor.
	factor := map[string]struct {
		weight int64
		value  float64
	}{"a": {w.Age, f.Age}, "f": {w.FairShare, f.FairShare}, "j": {w.JobSize, f.JobSize},
		"p": {w.Partition, f.Partition}, "q": {w.QOS, f.QOS}, "b": {0, 0}}
	if x, ok := factor[k]; ok {
		return norm(x.value)
	}
	if x, ok := factor[strings.ToLower(k)]; ok {
		return weighted(x.weight, x.value)
	}
	return ""
}
