package slurm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/cgroup"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/internal/userfile"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/policy"
)

// notBuilt is the reason of an option Slurm has and gangrun does not build yet.
const notBuilt = "not supported by gangrun (docs/slurm.md lists what is)"

// sbatchOptions are sbatch 22.05's options (sbatch --help), those gangrun builds and,
// refused, the rest; then gangrun's own supervision options (--gangrun-*).
var sbatchOptions = []option{
	{long: "account", short: 'A', arg: reqArg},
	{long: "array", short: 'a', arg: reqArg},
	{long: "chdir", short: 'D', arg: reqArg},
	{long: "cpus-per-task", short: 'c', arg: reqArg},
	{long: "dependency", short: 'd', arg: reqArg},
	{long: "error", short: 'e', arg: reqArg},
	{long: "export", arg: reqArg},
	{long: "gres", arg: reqArg},
	{long: "gpus", short: 'G', arg: reqArg},
	{long: "gpus-per-node", arg: reqArg},
	{long: "gpus-per-task", arg: reqArg},
	{long: "help", short: 'h', arg: noArg},
	{long: "job-name", short: 'J', arg: reqArg},
	{long: "mem", arg: reqArg},
	{long: "nodes", short: 'N', arg: reqArg},
	{long: "ntasks", short: 'n', arg: reqArg},
	{long: "ntasks-per-node", arg: reqArg},
	{long: "no-requeue", arg: noArg},
	{long: "open-mode", arg: reqArg},
	{long: "output", short: 'o', arg: reqArg},
	{long: "parsable", arg: noArg},
	{long: "partition", short: 'p', arg: reqArg},
	{long: "priority", arg: reqArg},
	{long: "quiet", short: 'Q', arg: noArg},
	{long: "requeue", arg: noArg},
	{long: "signal", arg: reqArg},
	{long: "time", short: 't', arg: reqArg},
	{long: "uid", arg: reqArg},
	{long: "usage", arg: noArg},
	{long: "verbose", short: 'v', arg: noArg},
	{long: "version", short: 'V', arg: noArg},
	{long: "wait", short: 'W', arg: noArg},
	{long: "wrap", arg: reqArg},
	// The nodes it takes (nodechoice.go).
	{long: "constraint", short: 'C', arg: reqArg},
	{long: "exclude", short: 'x', arg: reqArg},
	{long: "exclusive", arg: optArg},
	{long: "nodelist", short: 'w', arg: reqArg},
	// gangrun's supervision (docs/slurm.md, "Gang supervision"); as #GANGRUN lines
	// they are --max-restarts, --spare-nodes, --checkpoint-dir, --term-timeout.
	{long: "gangrun-max-restarts", arg: reqArg},
	{long: "gangrun-spare-nodes", arg: reqArg},
	{long: "gangrun-checkpoint-dir", arg: reqArg},
	{long: "gangrun-term-timeout", arg: reqArg},
	// The rest of sbatch's: refused.
	{long: "acctg-freq", arg: reqArg, unsupported: notBuilt},
	{long: "batch", arg: reqArg, unsupported: notBuilt},
	{long: "bb", arg: reqArg, unsupported: notBuilt},
	{long: "bbf", arg: reqArg, unsupported: notBuilt},
	{long: "begin", short: 'b', arg: reqArg},
	{long: "cluster-constraint", arg: reqArg, unsupported: notBuilt},
	{long: "clusters", short: 'M', arg: reqArg, unsupported: notBuilt},
	{long: "comment", arg: reqArg, unsupported: notBuilt},
	{long: "container", arg: reqArg, unsupported: notBuilt},
	{long: "contiguous", arg: noArg, unsupported: notBuilt},
	{long: "core-spec", short: 'S', arg: reqArg, unsupported: notBuilt},
	{long: "cores-per-socket", arg: reqArg, unsupported: notBuilt},
	{long: "cpu-bind", arg: reqArg, unsupported: notBuilt},
	{long: "cpu-freq", arg: reqArg, unsupported: notBuilt},
	{long: "cpus-per-gpu", arg: reqArg, unsupported: notBuilt},
	{long: "deadline", arg: reqArg, unsupported: notBuilt},
	{long: "delay-boot", arg: reqArg, unsupported: notBuilt},
	{long: "distribution", short: 'm', arg: reqArg, unsupported: notBuilt},
	{long: "export-file", arg: reqArg, unsupported: notBuilt},
	{long: "extra-node-info", short: 'B', arg: reqArg, unsupported: notBuilt},
	{long: "get-user-env", arg: optArg, unsupported: notBuilt},
	{long: "gid", arg: reqArg, unsupported: notBuilt},
	{long: "gpu-bind", arg: reqArg, unsupported: notBuilt},
	{long: "gpu-freq", arg: reqArg, unsupported: notBuilt},
	{long: "gpus-per-socket", arg: reqArg, unsupported: notBuilt},
	{long: "gres-flags", arg: reqArg, unsupported: notBuilt},
	{long: "hint", arg: reqArg, unsupported: notBuilt},
	{long: "hold", short: 'H', arg: noArg},
	{long: "ignore-pbs", arg: noArg, unsupported: notBuilt},
	{long: "input", short: 'i', arg: reqArg, unsupported: notBuilt},
	{long: "kill-on-invalid-dep", arg: reqArg},
	{long: "licenses", short: 'L', arg: reqArg, unsupported: notBuilt},
	{long: "mail-type", arg: reqArg},
	{long: "mail-user", arg: reqArg},
	{long: "mcs-label", arg: reqArg, unsupported: notBuilt},
	{long: "mem-bind", arg: reqArg, unsupported: notBuilt},
	{long: "mem-per-cpu", arg: reqArg},
	{long: "mem-per-gpu", arg: reqArg},
	{long: "mincpus", arg: reqArg, unsupported: notBuilt},
	{long: "network", arg: reqArg, unsupported: notBuilt},
	{long: "nice", arg: optArg},
	{long: "no-kill", short: 'k', arg: optArg, unsupported: notBuilt},
	{long: "nodefile", short: 'F', arg: reqArg, unsupported: notBuilt},
	{long: "ntasks-per-core", arg: reqArg, unsupported: notBuilt},
	{long: "ntasks-per-gpu", arg: reqArg, unsupported: notBuilt},
	{long: "ntasks-per-socket", arg: reqArg, unsupported: notBuilt},
	{long: "overcommit", short: 'O', arg: noArg, unsupported: notBuilt},
	{long: "oversubscribe", short: 's', arg: noArg, unsupported: notBuilt},
	{long: "power", arg: reqArg, unsupported: notBuilt},
	{long: "profile", arg: reqArg, unsupported: notBuilt},
	{long: "propagate", arg: optArg, unsupported: notBuilt},
	{long: "qos", short: 'q', arg: reqArg},
	{long: "reboot", arg: noArg, unsupported: notBuilt},
	{long: "reservation", arg: reqArg, unsupported: notBuilt},
	{long: "sockets-per-node", arg: reqArg, unsupported: notBuilt},
	{long: "spread-job", arg: noArg, unsupported: notBuilt},
	{long: "switches", arg: reqArg, unsupported: notBuilt},
	{long: "test-only", arg: noArg, unsupported: notBuilt},
	{long: "thread-spec", arg: reqArg, unsupported: notBuilt},
	{long: "threads-per-core", arg: reqArg, unsupported: notBuilt},
	{long: "time-min", arg: reqArg, unsupported: notBuilt},
	{long: "tmp", arg: reqArg, unsupported: notBuilt},
	{long: "use-min-nodes", arg: noArg, unsupported: notBuilt},
	{long: "wckey", arg: reqArg},
}

// gangrunAliases are `gangrun submit`'s option names as a script's #GANGRUN lines (and
// gangrun submit's command line) give them for a batch script, with sbatch's option
// each stands for.
var gangrunAliases = map[string]string{
	"nodes": "nodes", "gpus-per-node": "gpus-per-node", "name": "job-name", "partition": "partition",
	"account": "account", "uid": "uid", "priority": "priority", "time": "time", "signal": "signal",
	"dependency": "dependency", "array": "array", "output": "output", "mem": "mem",
	"max-restarts": "gangrun-max-restarts", "spare-nodes": "gangrun-spare-nodes",
	"checkpoint-dir": "gangrun-checkpoint-dir", "term-timeout": "gangrun-term-timeout",
	"exclusive": "exclusive", "constraint": "constraint", "nodelist": "nodelist", "exclude": "exclude",
}

// notBatchSupervised is why a batch script refuses the supervision options of `gangrun
// run` that have no --gangrun-* option: its script runs as Slurm's batch step, which
// restarts the script itself (job.Batch), not under `gangrun run`'s supervisor.
const notBatchSupervised = "a supervision option of gangrun's own jobs (gangrun submit without #SBATCH lines), which a Slurm batch script's batch step does not take (docs/slurm.md, \"Gang supervision\")"

// gangrunRefused are the rest of `gangrun submit`'s supervision options
// (launcher.Supervision): known on #GANGRUN lines of a batch script so that they are
// refused saying why, not taken for unknown ones.
var gangrunRefused = []option{
	{long: "restart-backoff", arg: reqArg}, {long: "no-restart-exit-code", arg: reqArg}, {long: "hang-timeout", arg: reqArg},
	{long: "warm-restarts", arg: optArg}, {long: "warm-imports", arg: reqArg}, {long: "warm-delay", arg: reqArg},
}

// gangrunOptions is the option table of #GANGRUN lines in a batch script.
func gangrunOptions() []option {
	var out []option
	// In name order, not the map's: getopt names an ambiguous abbreviation's
	// candidates in table order.
	for _, name := range slices.Sorted(maps.Keys(gangrunAliases)) {
		out = append(out, nodeChoiceAlias(option{long: name, arg: reqArg}))
	}
	for _, o := range gangrunRefused {
		o.unsupported = notBatchSupervised
		out = append(out, o)
	}
	// submit's own, which its caller acts on: the Consul address and JSON output.
	out = append(out, option{long: "env", arg: reqArg}, option{long: "json", arg: noArg}, option{long: "consul", arg: reqArg})
	return out
}

// BatchRequest is a batch job as its submitter asked for it: the job's spec, its
// array, and how sbatch reports it.
type BatchRequest struct {
	Spec  job.Spec
	Array *job.Array
	// Parsable is --parsable (the id alone), Wait -W (wait for the job's end, exit
	// with its code), Quiet -Q.
	Parsable, Wait, Quiet bool
}

// batchOpts are sbatch's options as given (the script's lines, then the command line).
type batchOpts struct {
	v values
	// noRequeue is whether --no-requeue came after the last --requeue.
	noRequeue bool
	env       []string // --env of #GANGRUN lines
	json      bool
}

func (o *batchOpts) set(p parsed) {
	if o.v == nil {
		o.v = values{}
	}
	o.v[p.name] = p.value
	switch p.name {
	case "requeue", "no-requeue":
		o.noRequeue = p.name == "no-requeue"
	}
}

// apply adds parsed options, refusing the unsupported ones (Slurm's exit code for an
// option's error, 255).
func (o *batchOpts) apply(ps []parsed) error {
	for _, p := range ps {
		if p.unsupported != "" {
			return &UsageError{Msg: fmt.Sprintf("error: --%s is %s", p.name, p.unsupported), Code: 255}
		}
		o.set(p)
	}
	return nil
}

// ScriptDirectives returns the words of a script's lines that begin with prefix
// ("#SBATCH", "#GANGRUN"): read as sbatch reads its #SBATCH lines, from the top until
// the first line that is neither blank nor a comment, each split into words as a
// shell would (quotes and backslashes, no expansion), a word starting with '#' and
// everything after it being a comment. Errors name the line.
func ScriptDirectives(script, prefix string) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(script))
	sc.Buffer(make([]byte, 64<<10), job.MaxScriptBytes)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || n == 1 && strings.HasPrefix(line, "#!") {
			continue
		}
		if !strings.HasPrefix(line, "#") {
			break
		}
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok || rest != "" && rest[0] != ' ' && rest[0] != '\t' {
			continue
		}
		words, err := job.SplitWords(rest)
		if err != nil {
			return nil, fmt.Errorf("script line %d: %w", n, err)
		}
		for _, w := range words {
			if strings.HasPrefix(w, "#") {
				break
			}
			out = append(out, w)
		}
	}
	return out, sc.Err()
}

// HasDirectives reports whether script has any #SBATCH line: a Slurm batch script.
func HasDirectives(script string) bool {
	w, err := ScriptDirectives(script, "#SBATCH")
	return err != nil || len(w) > 0
}

// ParseBatch reads a batch job's request as sbatch does: the script's #SBATCH lines,
// then its #GANGRUN lines (gangrun submit's names, for a script also run by Slurm),
// then gangrunArgs (gangrun submit's options, when it is gangrun submit that reads the
// script), then sbatchArgs (sbatch's command line), each later one winning. script is
// the script's text ("" with --wrap), name its path as given (the job's default
// name), scriptArgs its arguments. Errors are *UsageError in sbatch's words and exit
// codes.
func ParseBatch(e *Env, script, name string, scriptArgs, gangrunArgs, sbatchArgs []string) (*BatchRequest, error) {
	var o batchOpts
	if script != "" {
		if err := checkScript(script); err != nil {
			return nil, err
		}
		words, err := ScriptDirectives(script, "#SBATCH")
		if err != nil {
			return nil, &UsageError{Msg: "error: " + err.Error(), Code: 255}
		}
		ps, rest, err := getopt("sbatch", sbatchOptions, words, false, 255)
		if err != nil {
			return nil, err
		}
		if len(rest) > 0 {
			// sbatch refuses a word of an #SBATCH line that is no option (opt.c).
			return nil, &UsageError{Msg: "error: Invalid directive found in batch script: " + rest[0], Code: 255}
		}
		if err := o.apply(ps); err != nil {
			return nil, err
		}
		gw, err := ScriptDirectives(script, job.Directive)
		if err != nil {
			return nil, &UsageError{Msg: "error: " + err.Error(), Code: 255}
		}
		gangrunArgs = append(gw, gangrunArgs...)
	}
	if len(gangrunArgs) > 0 {
		ps, rest, err := getopt("sbatch", gangrunOptions(), gangrunArgs, false, 255)
		if err != nil {
			return nil, err
		}
		if len(rest) > 0 {
			return nil, &UsageError{Msg: fmt.Sprintf("error: a %s line holds %q, which is no option", job.Directive, rest[0]), Code: 255}
		}
		for _, p := range ps {
			if p.unsupported != "" {
				return nil, &UsageError{Msg: fmt.Sprintf("error: --%s is %s", p.name, p.unsupported), Code: 255}
			}
			switch p.name {
			case "env":
				o.env = append(o.env, p.value)
			case "json":
				o.json = true
			case "consul":
			default:
				o.set(parsed{name: gangrunAliases[p.name], value: p.value, hasValue: true})
			}
		}
	}
	ps, _, err := getopt("sbatch", sbatchOptions, sbatchArgs, false, 255)
	if err != nil {
		return nil, err
	}
	if err := o.apply(ps); err != nil {
		return nil, err
	}
	return o.request(e, script, name, scriptArgs)
}

// checkScript refuses what sbatch refuses of a script's text.
func checkScript(script string) error {
	switch {
	case strings.TrimSpace(script) == "":
		return &UsageError{Msg: "error: Batch script is empty!", Code: 1}
	case strings.Contains(script, "\r\n"):
		return &UsageError{Msg: "error: Batch script contains DOS line breaks (\\r\\n)\nsbatch: error: instead of expected UNIX line breaks (\\n).", Code: 1}
	case !strings.HasPrefix(script, "#!"):
		return &UsageError{Msg: "error: This does not look like a batch script.  The first\nsbatch: error: line must start with #! followed by the path to an interpreter.\nsbatch: error: For instance: #!/bin/sh", Code: 1}
	}
	if err := job.CheckScript(script); err != nil {
		return &UsageError{Msg: "error: " + err.Error(), Code: 1}
	}
	return nil
}

// bad is an option's value sbatch refuses: "Invalid --NAME specification", exit 255.
func bad(name string) error {
	return &UsageError{Msg: fmt.Sprintf("error: Invalid --%s specification", name), Code: 255}
}

// badf is an option's value refused with gangrun's reason, exit 255.
func badf(format string, a ...any) error {
	return &UsageError{Msg: "error: " + fmt.Sprintf(format, a...), Code: 255}
}

// count parses a whole number option of at least min: sbatch's "Invalid numeric
// value" otherwise.
func count(name, v string, min int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < min || n > 1<<24 {
		return 0, &UsageError{Msg: fmt.Sprintf("error: Invalid numeric value \"%s\" for --%s.", v, name), Code: 1}
	}
	return n, nil
}

// request builds the job from the options, in phases: the script and its name, the
// nodes it chooses, the tasks and nodes, the GPUs, the limits, gangrun's supervision,
// then who submits it, from where and with what environment. Errors are *UsageError,
// in the order sbatch's options are checked.
func (o *batchOpts) request(e *Env, script, name string, scriptArgs []string) (*BatchRequest, error) {
	v := o.v
	r := &BatchRequest{Parsable: v.has("parsable"), Wait: v.has("wait"), Quiet: v.has("quiet")}
	b := &job.Batch{Export: "ALL"}
	spec := job.Spec{Batch: b} // MaxRestarts 0: a plain batch job runs once
	if v.has("wrap") {
		if script != "" {
			return nil, badf("--wrap and a script: give one")
		}
		script = "#!/bin/sh\n# This script was created by sbatch --wrap.\n\n" + v["wrap"] + "\n"
		name = "wrap"
	}
	spec.Script, spec.Command = script, scriptArgs
	spec.Name = filepath.Base(name)
	if v.has("job-name") {
		spec.Name = v["job-name"]
	}
	spec.Account, spec.Partition = v["account"], v["partition"]
	if err := o.nodeChoice(&spec); err != nil {
		return nil, err
	}
	if err := o.tasks(&spec); err != nil {
		return nil, err
	}
	if err := o.gpus(&spec); err != nil {
		return nil, err
	}
	if err := o.limits(&spec, r); err != nil {
		return nil, err
	}
	b.NoRequeue = o.noRequeue
	spec.Output, b.Error, b.WCKey = v["output"], v["error"], v["wckey"]
	if err := o.supervision(&spec); err != nil {
		return nil, err
	}
	if err := o.origin(e, &spec, name); err != nil {
		return nil, err
	}
	r.Spec = spec
	return r, nil
}

// tasks sets spec's tasks (--ntasks, --ntasks-per-node, --cpus-per-task) and nodes:
// --nodes, else as many as --ntasks needs at --ntasks-per-node, else --nodelist's
// count (nodeChoice, before it), else one.
func (o *batchOpts) tasks(spec *job.Spec) error {
	v, b := o.v, spec.Batch
	var err error
	if v.has("ntasks") {
		if b.NTasks, err = count("ntasks", v["ntasks"], 1); err != nil {
			return err
		}
	}
	if v.has("ntasks-per-node") {
		if b.NTasksPerNode, err = count("ntasks-per-node", v["ntasks-per-node"], 1); err != nil {
			return err
		}
	}
	if v.has("cpus-per-task") {
		if b.CPUsPerTask, err = count("cpus-per-task", v["cpus-per-task"], 1); err != nil {
			return err
		}
	}
	least := max(1, len(spec.NodeList)) // -w's nodes, as slurmctld counts them
	spec.MinNodes, spec.MaxNodes = least, least
	if v.has("nodes") {
		lo, hi, err := job.ParseNodes(strings.Replace(v["nodes"], ":", "-", 1))
		if err != nil {
			return &UsageError{Msg: fmt.Sprintf("error: \"%s\" is not a valid node count", v["nodes"]), Code: 255}
		}
		spec.MinNodes, spec.MaxNodes = max(lo, least), hi
		if spec.MaxNodes < spec.MinNodes { // -w names more nodes than -N allows
			return &UsageError{Msg: fmt.Sprintf("error: invalid number of nodes (-N %d-%d)", spec.MinNodes, spec.MaxNodes), Code: 1}
		}
	} else if b.NTasks > 0 && b.NTasksPerNode > 0 {
		n := (b.NTasks + b.NTasksPerNode - 1) / b.NTasksPerNode
		spec.MinNodes, spec.MaxNodes = n, n
	}
	if b.NTasks > 0 && b.NTasksPerNode > 0 && b.NTasks > spec.MaxNodes*b.NTasksPerNode {
		return &UsageError{Msg: "error: Batch job submission failed: Requested node configuration is not available", Code: 1}
	}
	return nil
}

// limits sets spec's time limit, signal, dependency, memory, priority and output
// file mode, and r's array (--array).
func (o *batchOpts) limits(spec *job.Spec, r *BatchRequest) error {
	v, b := o.v, spec.Batch
	var err error
	if v.has("time") {
		if spec.TimeLimit, err = job.ParseTime(v["time"]); err != nil {
			return bad("time")
		}
	}
	if v.has("signal") {
		if err := o.signal(spec); err != nil {
			return err
		}
	}
	if v.has("dependency") {
		if spec.Dependency, err = job.ParseDependency(v["dependency"]); err != nil {
			return badf("%v", err)
		}
	}
	spec.Hold = v.has("hold") // held by its user until scontrol release
	if v.has("array") {
		a, err := job.ParseArray(v["array"])
		if err != nil {
			return &UsageError{Msg: "error: Invalid job array specification", Code: 255}
		}
		r.Array = &a
	}
	if err := o.memory(spec); err != nil {
		return err
	}
	if v.has("priority") {
		if spec.Priority, err = strconv.Atoi(v["priority"]); err != nil {
			return bad("priority")
		}
		if spec.Priority < 0 { // sbatch's own check (opt.c); gangrun submit takes a negative one
			return &UsageError{Msg: "error: Priority must be >= 0", Code: 255}
		}
	}
	if v.has("kill-on-invalid-dep") {
		switch strings.ToLower(v["kill-on-invalid-dep"]) {
		case "yes":
			spec.KillInvalidDep = true
		case "no":
		default:
			return &UsageError{Msg: "error: Invalid --kill-on-invalid-dep specification", Code: 255}
		}
	}
	if v.has("begin") {
		if spec.Begin, err = job.ParseBegin(v["begin"], time.Now()); err != nil {
			// parse_time's line, then sbatch's (gangrun says pos=0 whatever the value).
			return &UsageError{Before: "Invalid time specification (pos=0): " + v["begin"], Msg: "error: Invalid --begin specification", Code: 255}
		}
	}
	spec.QOS = v["qos"]
	if err := setMail(spec, v); err != nil {
		return err
	}
	if v.has("nice") {
		if spec.Nice, err = parseNice(v["nice"]); err != nil {
			return err
		}
	}
	if v.has("open-mode") {
		switch m := strings.ToLower(v["open-mode"]); {
		case strings.HasPrefix("append", m) && m != "":
			b.OpenMode = "append"
		case strings.HasPrefix("truncate", m) && m != "":
			b.OpenMode = "truncate"
		default:
			return bad("open-mode")
		}
	}
	return nil
}

// signal sets spec's signal and when it comes from --signal=[B:]SIG[@TIME] (B: to
// the batch step alone; R:, at a reservation's end, is refused).
func (o *batchOpts) signal(spec *job.Spec) error {
	sig := o.v["signal"]
	flags, rest, ok := strings.Cut(sig, ":")
	if ok {
		if strings.Contains(flags, "R") {
			return badf("--signal=%s: R: (signal at a reservation's end) is %s", sig, notBuilt)
		}
		if strings.Trim(flags, "B") != "" {
			return bad("signal")
		}
		spec.Batch.SignalBatch, sig = true, rest
	}
	var err error
	if spec.Signal, spec.SignalBefore, err = job.ParseSignal(sig); err != nil {
		return bad("signal")
	}
	return nil
}

// supervision sets gangrun's supervision of the job from the --gangrun-* options; any
// of the first three makes the batch supervised.
func (o *batchOpts) supervision(spec *job.Spec) error {
	v, b := o.v, spec.Batch
	var err error
	if v.has("gangrun-max-restarts") {
		if spec.MaxRestarts, err = count("gangrun-max-restarts", v["gangrun-max-restarts"], 0); err != nil {
			return err
		}
		b.Supervised = true
	}
	if v.has("gangrun-spare-nodes") {
		if spec.SpareNodes, err = count("gangrun-spare-nodes", v["gangrun-spare-nodes"], 0); err != nil {
			return err
		}
		b.Supervised = true
	}
	if v.has("gangrun-checkpoint-dir") {
		spec.CheckpointDir, b.Supervised = v["gangrun-checkpoint-dir"], true
		if spec.MaxRestarts == 0 && !v.has("gangrun-max-restarts") {
			spec.MaxRestarts = job.DefaultMaxRestarts
		}
	}
	if v.has("gangrun-term-timeout") {
		if spec.TermTimeout, err = time.ParseDuration(v["gangrun-term-timeout"]); err != nil || spec.TermTimeout < 0 {
			return bad("gangrun-term-timeout")
		}
	}
	return nil
}

// origin sets who runs the job (--uid, root only; else this process's user), where
// (--chdir against the working directory), with what environment (--export, then
// #GANGRUN --env), and where it was submitted from: the host, the directory and the
// script's path (name, made absolute; none for --wrap or a script read from stdin).
func (o *batchOpts) origin(e *Env, spec *job.Spec, name string) error {
	v, b := o.v, spec.Batch
	cwd, err := os.Getwd()
	if err != nil {
		return &UsageError{Msg: "error: getcwd failed: " + err.Error(), Code: 1}
	}
	spec.WorkDir = cwd
	if v.has("chdir") {
		spec.WorkDir = v["chdir"]
		if !filepath.IsAbs(spec.WorkDir) {
			spec.WorkDir = filepath.Join(cwd, spec.WorkDir)
		}
	}
	spec.User = currentUser()
	if v.has("uid") {
		if os.Geteuid() != 0 {
			return &UsageError{Msg: "error: --uid only permitted by root user", Code: 1}
		}
		u, err := proc.LookupUser(v["uid"])
		if err != nil {
			return &UsageError{Msg: fmt.Sprintf("error: Invalid user id: %s", v["uid"]), Code: 255}
		}
		spec.User = u.Name
	}
	environ := e.Environ()
	if v.has("export") {
		b.Export = exportMode(v["export"])
	}
	if b.Environ, err = job.ExportEnv(b.Export, environ, loginEnv(spec.User)); err != nil {
		return badf("%v", err)
	}
	for _, kv := range o.env { // #GANGRUN --env: variables of the batch step
		k, val, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return badf("--env %q: want KEY=VALUE", kv)
		}
		b.Environ = append(b.Environ, k+"="+val)
	}
	if h, err := os.Hostname(); err == nil {
		b.SubmitHost = h
	}
	b.SubmitDir = cwd
	if name != "" && name != "sbatch" && !v.has("wrap") {
		b.ScriptPath = name
		if !filepath.IsAbs(name) {
			b.ScriptPath = filepath.Join(cwd, name)
		}
	}
	return nil
}

// memory sets spec's memory per node from --mem, --mem-per-cpu or --mem-per-gpu
// (Slurm's syntax: a number of megabytes, or with a K, M, G, T suffix), which Slurm
// takes one at a time: two of them are sbatch's fatal error.
func (o *batchOpts) memory(spec *job.Spec) error {
	v := o.v
	opts := []struct {
		name  string
		to    *int64
		parse func(string) (int64, error)
	}{{"mem", &spec.Mem, cgroup.ParseMem}, {"mem-per-cpu", &spec.MemPerCPU, cgroup.ParseMemSize}, {"mem-per-gpu", &spec.MemPerGPU, cgroup.ParseMemSize}}
	given := 0
	for _, f := range opts {
		if v.has(f.name) {
			given++
		}
	}
	if given > 1 {
		return &UsageError{Msg: memExclusive, Code: 1}
	}
	for _, f := range opts {
		if !v.has(f.name) {
			continue
		}
		m, err := f.parse(v[f.name])
		if err != nil {
			return bad(f.name)
		}
		*f.to = m
	}
	return nil
}

// memExclusive is sbatch's refusal of two of --mem, --mem-per-cpu and --mem-per-gpu
// (Slurm 22.05's slurm_opt.c, _validate_memory_options), exit 1.
const memExclusive = "fatal: --mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive."

// gpus sets spec's GPUs per node from --gres=gpu[:type]:N, --gpus-per-node,
// --gpus (the job's total, split over its nodes) or --gpus-per-task (times the tasks
// per node). At most one of them may be given; none makes a CPU-only job (no GPUs: its
// CPUs and memory are placed, resources.go in the allocator).
func (o *batchOpts) gpus(spec *job.Spec) error {
	v := o.v
	b := spec.Batch
	n := 0 // how many ways the GPUs were asked for
	if v.has("gres") {
		found, err := o.gres(spec)
		if err != nil {
			return err
		}
		if found {
			n++
		}
	}
	if v.has("gpus-per-node") {
		n++
		typ, c, err := o.typedGPUs("gpus-per-node")
		if err != nil {
			return err
		}
		if err := setGPUs(spec, c, typ); err != nil {
			return err
		}
		b.TresPerNode = "gres:gpu:" + strings.TrimPrefix(v["gpus-per-node"], "gpu:")
	}
	if v.has("gpus-per-task") {
		typ, c, err := o.typedGPUs("gpus-per-task")
		if err != nil {
			return err
		}
		b.GPUsPerTask = c
		if n == 0 {
			n++
			tasks := b.TasksPerNode(spec.MinNodes)
			if spec.MinNodes != spec.MaxNodes || (b.NTasksPerNode == 0 && b.NTasks%spec.MinNodes != 0) {
				return badf("--gpus-per-task=%s: gangrun gives every node the same GPUs: give --ntasks-per-node (or --ntasks a multiple of --nodes)", v["gpus-per-task"])
			}
			if err := setGPUs(spec, c*tasks[0], typ); err != nil {
				return err
			}
		}
	}
	if v.has("gpus") {
		n++
		typ, c, err := o.typedGPUs("gpus")
		if err != nil {
			return err
		}
		if spec.MinNodes != spec.MaxNodes || c%spec.MinNodes != 0 {
			return badf("--gpus=%s: gangrun gives every node the same GPUs: give a number of GPUs that --nodes divides (or --gpus-per-node)", v["gpus"])
		}
		if err := setGPUs(spec, c/spec.MinNodes, typ); err != nil {
			return err
		}
	}
	switch {
	case n > 1:
		return badf("give the GPUs one way: --gres=gpu:N, --gpus-per-node, --gpus or --gpus-per-task")
	case n == 0:
		spec.GPUsPerNode = 0 // a CPU-only job
	}
	return nil
}

// gres sets spec's GPUs and the batch's TresPerNode from --gres's comma-separated
// gpu[:type][:N] entries ("none" and empty ones skipped; any other resource refused),
// and reports whether it named a GPU.
func (o *batchOpts) gres(spec *job.Spec) (bool, error) {
	v := o.v
	var found bool
	for _, g := range strings.Split(v["gres"], ",") {
		parts := strings.Split(g, ":")
		if g == "none" || g == "" {
			continue
		}
		if parts[0] != "gpu" {
			return false, badf("--gres=%s: generic resource %q is %s (gangrun schedules GPUs)", v["gres"], parts[0], notBuilt)
		}
		typ, cnt := "", "1"
		switch len(parts) {
		case 1:
		case 2:
			cnt = parts[1]
		case 3:
			typ, cnt = parts[1], parts[2]
		default:
			return false, bad("gres")
		}
		c, err := strconv.Atoi(cnt)
		if err != nil || c < 1 {
			return false, bad("gres")
		}
		if err := setGPUs(spec, c, typ); err != nil {
			return false, err
		}
		spec.Batch.TresPerNode, found = "gres:"+g, true
		if len(parts) == 2 || len(parts) == 1 {
			spec.Batch.TresPerNode = "gres:gpu:" + strconv.Itoa(c)
		}
	}
	return found, nil
}

// typedGPUs reads GPU option name's [TYPE:]COUNT: its type and count, or sbatch's
// "Invalid --NAME specification".
func (o *batchOpts) typedGPUs(name string) (string, int, error) {
	typ, c, ok := gpuCount(o.v[name])
	if !ok {
		return "", 0, bad(name)
	}
	return typ, c, nil
}

// setGPUs sets spec's GPUs per node, MIG profile and GPU model from perNode GPUs of
// type typ ("" for any), as allocator.ParseGPUs reads them.
func setGPUs(spec *job.Spec, perNode int, typ string) error {
	gpus, profile, model, err := allocator.ParseGPUs(gpuSpec(typ, perNode))
	if err != nil {
		return badf("%v", err)
	}
	spec.GPUsPerNode, spec.MIGProfile, spec.GPUModel = gpus, profile, model
	return nil
}

// gpuCount reads a GPU option's [TYPE:]COUNT (--gpus, --gpus-per-node,
// --gpus-per-task): its type ("" for none) and count; ok is false unless the count is
// a whole number of at least 1.
func gpuCount(s string) (typ string, n int, ok bool) {
	typ, cnt, found := strings.Cut(s, ":")
	if !found {
		typ, cnt = "", s
	}
	n, err := strconv.Atoi(cnt)
	return typ, n, err == nil && n >= 1
}

// gpuSpec is [TYPE:]COUNT for allocator.ParseGPUs.
func gpuSpec(typ string, n int) string {
	if typ == "" {
		return strconv.Itoa(n)
	}
	return typ + ":" + strconv.Itoa(n)
}

// exportMode is an --export value as job.ExportEnv takes it: ALL and NONE in capitals
// (Slurm takes them in any case), "" as ALL.
func exportMode(v string) string {
	switch strings.ToUpper(v) {
	case "", "ALL":
		return "ALL"
	case "NONE":
		return "NONE"
	}
	return v
}

// currentUser is this process's user's name (its uid when it has none).
func currentUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return strconv.Itoa(os.Getuid())
}

// loginEnv is what a login gives name (--export=NONE's variables).
func loginEnv(name string) []string {
	home, sh := "/", ""
	if u, err := proc.LookupUser(name); err == nil && u.Home != "" {
		home = u.Home
	}
	if data, err := os.ReadFile("/etc/passwd"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			f := strings.Split(l, ":")
			if len(f) == 7 && f[0] == name {
				sh = f[6]
			}
		}
	}
	return job.LoginEnv(name, home, sh)
}

// Sbatch is sbatch: it queues a batch script (a file, stdin, or --wrap's command) with
// the options of its #SBATCH lines and command line, and prints "Submitted batch job
// ID" (--parsable: the id alone). Exit codes as sbatch's: 0, 1 when the job is
// refused, 255 for a bad option.
func Sbatch(ctx context.Context, e *Env, args []string) int {
	ps, rest, err := getopt("sbatch", sbatchOptions, args, true, 255)
	if err != nil {
		return usage(e, "sbatch", err.(*UsageError))
	}
	var wrap bool
	for _, p := range ps {
		switch p.name {
		case "help", "usage":
			fmt.Fprintln(e.Stdout, "Usage: sbatch [OPTIONS...] executable [args...]")
			return 0
		case "version":
			fmt.Fprintln(e.Stdout, Version)
			return 0
		case "wrap":
			wrap = true
		}
	}
	var script, name string
	var scriptArgs []string
	switch {
	case wrap:
		if len(rest) > 0 {
			return errorf(e, "sbatch", 1, "Script arguments not permitted with --wrap option")
		}
	case len(rest) == 0:
		data, err := io.ReadAll(io.LimitReader(e.Stdin, job.MaxScriptBytes+1))
		if err != nil || len(data) > job.MaxScriptBytes {
			return errorf(e, "sbatch", 1, "Unable to read the batch script from standard input")
		}
		script, name = string(data), "sbatch"
		if strings.TrimSpace(script) == "" {
			return errorf(e, "sbatch", 1, "Batch script is empty!")
		}
	default:
		data, err := userfile.ReadFile(rest[0], job.MaxScriptBytes)
		if err != nil {
			return errorf(e, "sbatch", 1, "Unable to open file %s", rest[0])
		}
		script, name, scriptArgs = string(data), rest[0], rest[1:]
	}
	req, err := ParseBatch(e, script, name, scriptArgs, nil, args[:len(args)-len(rest)])
	var ue *UsageError
	if errors.As(err, &ue) {
		return usage(e, "sbatch", ue)
	}
	id, code := submitBatch(ctx, e, "sbatch", req)
	if code != 0 {
		return code
	}
	switch {
	case req.Quiet: // -Q: sbatch prints neither the id nor the sentence
	case req.Parsable:
		fmt.Fprintln(e.Stdout, id)
	default:
		fmt.Fprintf(e.Stdout, "Submitted batch job %s\n", id)
	}
	if req.Wait {
		return waitJob(ctx, e, "sbatch", id)
	}
	return 0
}

// submitBatch checks and queues req, and returns its id; a refusal is printed as
// sbatch's "Batch job submission failed" (exit 1).
func submitBatch(ctx context.Context, e *Env, cmd string, req *BatchRequest) (string, int) {
	if err := req.Spec.CheckHere(); err != nil {
		return "", errorf(e, cmd, 1, "Batch job submission failed: %v", err)
	}
	s, err := e.Cluster.Open(ctx)
	if err != nil {
		return "", errorf(e, cmd, 1, "Batch job submission failed: %v", err)
	}
	defer s.Close()
	id, err := submit(ctx, e, s, req.Spec, req.Array)
	if err != nil && strings.Contains(err.Error(), policy.ErrInvalidQOS.Error()) {
		// slurmctld's words alone (the detail crosses a request box as text).
		return "", errorf(e, cmd, 1, "Batch job submission failed: %v", policy.ErrInvalidQOS)
	}
	if err != nil {
		return "", submitFailed(e, cmd, "Batch job submission failed", req.Spec, err)
	}
	return id, 0
}

// submit queues spec (the tasks of array a, when a is not nil) as sbatch and salloc
// do: in the cluster's name, and in the partition resolvePartition gives it.
func submit(ctx context.Context, e *Env, s Store, spec job.Spec, a *job.Array) (string, error) {
	spec.Batch.ClusterName = ClusterName(ctx, s)
	spec.Partition = resolvePartition(ctx, s, spec.Partition)
	id, _, err := e.Cluster.Submit(ctx, s, spec, a)
	return id, err
}

// waitJob waits for job id to end (sbatch -W) and returns its exit code.
func waitJob(ctx context.Context, e *Env, cmd, id string) int {
	s, err := e.Cluster.Open(ctx)
	if err != nil {
		return errorf(e, cmd, 1, "%v", err)
	}
	defer s.Close()
	for {
		j, err := job.Read(ctx, s, id)
		if err == nil && j.State.Status.Final() {
			code := j.State.ExitCode
			if j.State.Status != job.Completed && code == 0 {
				code = 1
			}
			return code
		}
		select {
		case <-ctx.Done():
			return 1
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// ClusterName is the cluster's name as Slurm's variables give it: the Consul
// datacenter the cluster runs in.
func ClusterName(ctx context.Context, s store.Store) string {
	if c, ok := s.(interface{ Client() *api.Client }); ok {
		if self, err := c.Client().Agent().Self(); err == nil {
			if dc, ok := self["Config"]["Datacenter"].(string); ok && dc != "" {
				return dc
			}
		}
	}
	return "gangrun"
}

// Version is what the commands print for --version: Slurm's form, naming gangrun.
const Version = "slurm 22.05.8 (gangrun)"

// resolvePartition is the partition a job asking for p is placed in: DefaultPartition
// for none, and none (any node) for job.NoPartition where no node carries it as its
// label, as sinfo shows the nodes without a label in that partition.
func resolvePartition(ctx context.Context, s store.Store, p string) string {
	if p == "" {
		return DefaultPartition(ctx, s)
	}
	if p != job.NoPartition {
		return p
	}
	if c, err := allocator.Snapshot(ctx, s); err == nil {
		for _, n := range c.NodeList() {
			if n.Labels["partition"] == job.NoPartition {
				return p
			}
		}
	}
	return ""
}

// DefaultPartition is the partition a job that names none goes to, as Slurm's default
// partition: the policy's default, else the first (in name order) of the nodes'
// partition labels; "" on a cluster whose nodes carry none (the job may run on any).
func DefaultPartition(ctx context.Context, s store.Store) string {
	return defaultPartition(ctx, s, nil)
}

// defaultPartition is DefaultPartition over nodes, the nodes its caller has read
// (nil: it reads them, when the policy names no default).
func defaultPartition(ctx context.Context, s store.Store, nodes []allocator.NodeStatus) string {
	if p, err := policy.Load(ctx, s); err == nil && p != nil {
		if d := p.DefaultPartition(); d != "" {
			return d
		}
	}
	if nodes == nil {
		c, err := allocator.Snapshot(ctx, s)
		if err != nil {
			return ""
		}
		nodes = c.NodeList()
	}
	best := ""
	for _, n := range nodes {
		if p := n.Labels["partition"]; p != "" && (best == "" || p < best) {
			best = p
		}
	}
	return best
}
