package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/slurmtest"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
)

// slurmPair is a real Slurm 22.05 and a gangrun cluster side by side, their nodes of
// the same names with 8 GPUs each and one partition, gpu: the same job script and
// command run on both, and the tests compare what a user sees.
type slurmPair struct {
	t     *testing.T
	real  *slurmtest.Cluster
	gr    *jobCluster
	links string // a directory of links named sbatch, srun, ... to the gangrun binary
}

// startSlurmPair starts both clusters with nodes.
func startSlurmPair(t *testing.T, nodes ...string) *slurmPair {
	t.Helper()
	return startSlurmPairWith(t, slurmtest.Options{}, nodes...)
}

// startSlurmPairWith is startSlurmPair with the real Slurm's options o (its nodes, GPUs,
// partition and first job id set here).
func startSlurmPairWith(t *testing.T, o slurmtest.Options, nodes ...string) *slurmPair {
	t.Helper()
	// Job ids far apart from each other and from the counts beside them in the
	// commands' output (Slurm's from 1001, gangrun's from 5001), so that a test can
	// put a word in place of an id.
	o.Nodes, o.GPUsPerNode, o.Partition, o.Extra = nodes, 8, "gpu", append(o.Extra, "FirstJobId=1001")
	real := slurmtest.Start(t, o)
	gr := startJobClusterWith(t, func(string) []string { return []string{"--labels", "partition=gpu"} }, nodes...)
	s, err := store.NewConsul(gr.consul)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Txn(context.Background(), []store.Op{{Verb: store.Set, Key: "gangrun/batch/jobseq", Value: []byte("5000")}}); err != nil {
		t.Fatal(err)
	}
	links := slurmLinks(t)
	return &slurmPair{t: t, real: real, gr: gr, links: links}
}

// side is one of the pair: "slurm" or "gangrun".
type side string

const (
	realSlurm   side = "slurm"
	gangrunSide side = "gangrun"
)

// env is the environment a user's shell has on side: Slurm's commands on its PATH
// (gangrun's links first, for gangrun), its configuration or Consul, no SLURM_* of the
// test's own.
func (p *slurmPair) env(s side, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLURM_") && !strings.HasPrefix(kv, "CONSUL_HTTP_ADDR=") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	path := os.Getenv("PATH")
	if s == realSlurm {
		env = append(env, "SLURM_CONF="+p.real.Conf, "PATH="+path)
	} else {
		env = append(env, "CONSUL_HTTP_ADDR="+p.gr.consul, "PATH="+p.links+":"+path, p.gr.mark)
	}
	return append(env, extra...)
}

// run runs a Slurm command on side in dir, with extra environment and stdin, and
// returns its stdout, stderr and exit code.
func (p *slurmPair) run(s side, dir, stdin string, extra []string, name string, args ...string) (string, string, int) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := name
	if s == gangrunSide {
		bin = filepath.Join(p.links, name)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir, cmd.Env = dir, p.env(s, extra...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), errOut.String(), 0
	case errors.As(err, &ee) && ctx.Err() == nil:
		return out.String(), errOut.String(), ee.ExitCode()
	}
	p.t.Fatalf("%s %s %v: %v\n%s", s, name, args, err, errOut.String())
	return "", "", -1
}

// waitEnd waits for job id on side to end and returns its final state.
func (p *slurmPair) waitEnd(s side, id string, within time.Duration) string {
	p.t.Helper()
	if s == realSlurm {
		return slurmtest.Field(p.real.WaitJob(id, within), "JobState")
	}
	deadline := time.Now().Add(within)
	for {
		m := p.gr.show(id)
		if st, _ := m["state"].(string); job.Status(st).Final() {
			return st
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("gangrun job %s did not end within %s: %v", id, within, m)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// submit writes script into a new directory and sbatches it on side with args; it
// returns the directory and the job's id, once the job has ended.
func (p *slurmPair) submit(s side, script string, extra []string, args ...string) (dir, id, state string) {
	p.t.Helper()
	dir, id = p.sbatch(s, script, extra, args...)
	return dir, id, p.waitEnd(s, id, 2*time.Minute)
}

// sbatch writes script into a new directory as job.sh and sbatches it on side with
// args (a refusal fails the test); it returns the directory and the job's id.
func (p *slurmPair) sbatch(s side, script string, extra []string, args ...string) (dir, id string) {
	p.t.Helper()
	dir = sharedDir(p.t)
	if err := os.WriteFile(filepath.Join(dir, "job.sh"), []byte(script), 0o755); err != nil {
		p.t.Fatal(err)
	}
	out, errOut, code := p.run(s, dir, "", extra, "sbatch", append(append([]string{"--parsable"}, args...), "job.sh")...)
	if code != 0 {
		p.t.Fatalf("%s: sbatch: exit %d: %s", s, code, errOut)
	}
	return dir, strings.TrimSpace(out)
}

// readEnv reads an `env | sort` file into a map.
func readEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok && k != "" && !strings.ContainsAny(k, " ()") {
			m[k] = v
		}
	}
	return m
}

// envRule says how a variable of a job's environment compares between Slurm and
// gangrun: the same (the default), set on both with values that differ by nature
// (ids, pids, ports, directories), or present on one side only by design
// (docs/slurm.md, "Environment").
type envRule int

const (
	envSame envRule = iota
	envBothSet
	envSlurmOnly
	envGangrunOnly
)

// envRules are the variables that do not compare as the same value, and why.
var envRules = map[string]envRule{
	"SLURM_JOB_ID": envBothSet, "SLURM_JOBID": envBothSet, "SLURM_TASK_PID": envBothSet,
	"SLURM_SUBMIT_DIR": envBothSet, "PWD": envBothSet, "OLDPWD": envBothSet,
	"SLURM_SRUN_COMM_PORT": envBothSet, "SLURM_STEP_LAUNCHER_PORT": envBothSet,
	"SLURM_CLUSTER_NAME":      envBothSet,     // slurm.conf's ClusterName; gangrun's Consul datacenter
	"SLURM_CONF":              envSlurmOnly,   // the submitting shell's, for the real Slurm
	"SLURM_WORKING_CLUSTER":   envSlurmOnly,   // Slurm's own controller address
	"SLURM_JOB_ACCOUNT":       envGangrunOnly, // gangrun always has an account (the user's name by default)
	"CONSUL_HTTP_ADDR":        envGangrunOnly, // where the job's srun and squeue find the cluster
	"GANGRUN_JOB_ID":          envGangrunOnly,
	"GANGRUN_NODE_ADDR":       envGangrunOnly,
	"GANGRUN_TEST_MARK":       envGangrunOnly,
	"PATH":                    envBothSet, // gangrun's side has its links first
	"_":                       envBothSet,
	"SLURM_JOB_CPUS_PER_NODE": envSame,
}

// compareEnv compares a Slurm job's environment with gangrun's by envRules; it
// returns how many variables agree and the differences.
func compareEnv(real, gr map[string]string, ids map[string]string) (agree, total int, diffs []string) {
	keys := map[string]bool{}
	for k := range real {
		keys[k] = true
	}
	for k := range gr {
		keys[k] = true
	}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range keys {
			if !yield(k) {
				return
			}
		}
	}) {
		rv, rok := real[k]
		gv, gok := gr[k]
		rule, known := envRules[k]
		if !known && strings.HasPrefix(k, "GANGRUN_TEST_") {
			rule = envGangrunOnly
		}
		total++
		ok := false
		switch rule {
		case envSame:
			ok = rok && gok && rv == gv
			if !ok && rok && gok {
				for from, to := range ids {
					rv = strings.ReplaceAll(rv, from, to)
				}
				ok = rv == gv
			}
		case envBothSet:
			ok = rok && gok
		case envSlurmOnly:
			ok = rok && !gok
		case envGangrunOnly:
			ok = gok && !rok
		}
		if ok {
			agree++
		} else {
			diffs = append(diffs, fmt.Sprintf("%s: slurm %q (%v), gangrun %q (%v)", k, real[k], rok, gr[k], gok))
		}
	}
	return agree, total, diffs
}

// tutorialScript is the job script every Slurm tutorial shows, with nodes nodes: the
// batch step writes its environment, each task its own and a line with its ranks and
// GPUs.
func tutorialScript(nodes int) string {
	return fmt.Sprintf(`#!/bin/bash
#SBATCH --job-name=tutorial
#SBATCH --nodes=%d
#SBATCH --gres=gpu:4
#SBATCH --ntasks-per-node=4
#SBATCH --time=24:00:00
#SBATCH --partition=gpu
env | sort > batch.env
echo "batch on $SLURMD_NODENAME"
srun bash -c 'env | sort > task.$SLURM_PROCID.env; echo "task $SLURM_PROCID local $SLURM_LOCALID node $SLURM_NODEID step $SLURM_STEP_ID gpus $CUDA_VISIBLE_DEVICES"'
`, nodes)
}

// TestSbatchTutorialAgainstSlurm: the tutorial script (--nodes=2, --gres=gpu:4,
// --ntasks-per-node=4, --time, --partition, --job-name, then srun) submitted with
// sbatch --parsable to a real Slurm and to gangrun (its sbatch and srun by argv[0]),
// and with --nodes=1: both print the id alone, run the batch step once on the first
// node and one task per rank, write the same lines to slurm-ID.out (in any order), end
// COMPLETED; the batch step's and each task's environments agree variable by
// variable but for the ids, pids, ports, directories and the variables docs/slurm.md
// lists as each side's own. It logs the counts.
func TestSbatchTutorialAgainstSlurm(t *testing.T) {
	p := startSlurmPair(t, "gpu-a", "gpu-b")
	for _, nodes := range []int{2, 1} {
		t.Run(fmt.Sprintf("nodes=%d", nodes), func(t *testing.T) {
			p.t = t
			script := tutorialScript(nodes)
			rdir, rid, rstate := p.submit(realSlurm, script, []string{"TUTORIAL_VAR=kept"})
			gdir, gid, gstate := p.submit(gangrunSide, script, []string{"TUTORIAL_VAR=kept"})
			if rstate != "COMPLETED" || gstate != "COMPLETED" {
				t.Fatalf("states: slurm %s, gangrun %s", rstate, gstate)
			}
			lines := func(dir, id string) []string {
				data, err := os.ReadFile(filepath.Join(dir, "slurm-"+id+".out"))
				if err != nil {
					t.Fatal(err)
				}
				l := strings.Split(strings.TrimSpace(string(data)), "\n")
				sort.Strings(l)
				return l
			}
			rl, gl := lines(rdir, rid), lines(gdir, gid)
			if !slices.Equal(rl, gl) {
				t.Errorf("slurm-ID.out differs:\nslurm:\n%s\ngangrun:\n%s", strings.Join(rl, "\n"), strings.Join(gl, "\n"))
			}
			if want := 4*nodes + 1; len(gl) != want {
				t.Errorf("gangrun's slurm-%s.out has %d lines, want %d (the batch step once, a line per task)", gid, len(gl), want)
			}
			ids := map[string]string{rid: gid}
			agree, total, diffs := compareEnv(readEnv(t, filepath.Join(rdir, "batch.env")), readEnv(t, filepath.Join(gdir, "batch.env")), ids)
			t.Logf("batch step: %d of %d variables agree", agree, total)
			for _, d := range diffs {
				t.Errorf("batch step's environment: %s", d)
			}
			var ta, tt int
			for rank := 0; rank < 4*nodes; rank++ {
				name := fmt.Sprintf("task.%d.env", rank)
				a, n, diffs := compareEnv(readEnv(t, filepath.Join(rdir, name)), readEnv(t, filepath.Join(gdir, name)), ids)
				ta, tt = ta+a, tt+n
				for _, d := range diffs {
					t.Errorf("task %d's environment: %s", rank, d)
				}
			}
			t.Logf("tasks: %d of %d variables agree over %d tasks", ta, tt, 4*nodes)
		})
	}
}

// idPattern matches a job id in a message.
var idPattern = regexp.MustCompile(`\b\d+\b`)

// TestSbatchRefusalsAgainstSlurm: bad sbatch command lines and scripts go to a real
// Slurm's sbatch and to gangrun's: both refuse each with the same message and exit
// code (255 for an option's error, 1 for a script or a job refused). Options Slurm has
// and gangrun does not build are refused by gangrun alone, in sbatch's words.
func TestSbatchRefusalsAgainstSlurm(t *testing.T) {
	p := startSlurmPair(t, "gpu-a")
	dir := sharedDir(t)
	files := map[string]string{
		"job.sh":       "#!/bin/sh\n#SBATCH --gres=gpu:1\ntrue\n",
		"dos.sh":       "#!/bin/sh\r\n#SBATCH --gres=gpu:1\r\ntrue\r\n",
		"noshebang.sh": "#SBATCH --gres=gpu:1\ntrue\n",
		"badline.sh":   "#!/bin/sh\n#SBATCH --gres=gpu:1 --bogus\ntrue\n",
		"stray.sh":     "#!/bin/sh\n#SBATCH --gres=gpu:1 stray\ntrue\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name  string
		args  []string
		stdin string
	}{
		{"unknown option", []string{"--foo", "job.sh"}, ""},
		{"unknown short option", []string{"-X", "job.sh"}, ""},
		{"missing argument", []string{"-p"}, ""},
		{"an option after the script is the script's", []string{"job.sh", "-p"}, "accepted"},
		{"missing long argument", []string{"--partition"}, ""},
		{"argument not allowed", []string{"--parsable=3", "job.sh"}, ""},
		{"bad node count", []string{"--nodes=abc", "job.sh"}, ""},
		{"bad time", []string{"--time=xx", "job.sh"}, ""},
		{"negative priority", []string{"--priority=-1", "job.sh"}, ""},
		{"bad signal", []string{"--signal=B:FOO@10", "job.sh"}, ""},
		{"bad open mode", []string{"--open-mode=bad", "job.sh"}, ""},
		{"negative tasks", []string{"--ntasks=-1", "job.sh"}, ""},
		{"DOS line breaks", []string{"dos.sh"}, ""},
		{"no interpreter line", []string{"noshebang.sh"}, ""},
		{"missing script", []string{"missing.sh"}, ""},
		{"empty stdin", nil, ""},
		{"bad #SBATCH line", []string{"badline.sh"}, ""},
		{"a word that is no option on an #SBATCH line", []string{"stray.sh"}, ""},
		{"--export with no value", []string{"--export"}, ""},
		{"wrap with arguments", []string{"--wrap", "true", "x"}, ""},
		{"--exclusive", []string{"--exclusive", "job.sh"}, "accepted"},
		{"--exclusive with a bad value", []string{"--exclusive=bogus", "job.sh"}, ""},
		{"more -w nodes than -N", []string{"-N", "1", "-w", "gpu-a,gpu-b", "job.sh"}, ""},
		{"--nodelist", []string{"-w", "gpu-a", "job.sh"}, "accepted"},
	}
	agree := 0
	for _, tc := range cases {
		stdin := tc.stdin
		if stdin == "accepted" {
			stdin = ""
		}
		rout, rerr, rcode := p.run(realSlurm, dir, stdin, nil, "sbatch", tc.args...)
		gout, gerr, gcode := p.run(gangrunSide, dir, stdin, nil, "sbatch", tc.args...)
		if tc.stdin == "accepted" {
			if rcode != 0 || gcode != 0 {
				t.Errorf("%s: sbatch %q: slurm exit %d %q, gangrun exit %d %q: want both to accept it", tc.name, tc.args, rcode, rerr, gcode, gerr)
			} else {
				agree++
			}
			continue
		}
		if rcode == 0 {
			t.Errorf("%s: Slurm's sbatch accepted it: %s", tc.name, rout)
			continue
		}
		if rcode != gcode || rerr != gerr || gout != "" {
			t.Errorf("%s: sbatch %q:\nslurm   exit %d: %q\ngangrun exit %d: %q %q", tc.name, tc.args, rcode, rerr, gcode, gerr, gout)
			continue
		}
		agree++
	}
	t.Logf("%d of %d refusals agree in message and exit code", agree, len(cases))
	// The node choice's refusals: Slurm's line, then gangrun's naming the value.
	for _, args := range [][]string{{"-w", "nosuch", "job.sh"}, {"-x", "nosuch", "job.sh"}, {"-C", "nosuch", "job.sh"}, {"-C", "a&&b", "job.sh"}, {"-w", "gpu-[a", "job.sh"}} {
		_, rerr, rcode := p.run(realSlurm, dir, "", nil, "sbatch", args...)
		_, gerr, gcode := p.run(gangrunSide, dir, "", nil, "sbatch", args...)
		if rcode != gcode || !strings.HasPrefix(gerr, strings.TrimSuffix(rerr, "\n")+": ") || strings.Count(gerr, "\n") != 1 {
			t.Errorf("sbatch %q:\nslurm   exit %d: %q\ngangrun exit %d: %q, want Slurm's line and the value", args, rcode, rerr, gcode, gerr)
		}
	}
	for _, opt := range []string{"--reservation=x", "--comment=x"} {
		args := []string{opt, "job.sh"}
		_, gerr, gcode := p.run(gangrunSide, dir, "", nil, "sbatch", args...)
		name := strings.TrimLeft(strings.SplitN(opt, "=", 2)[0], "-")
		if gcode != 255 || !strings.HasPrefix(gerr, "sbatch: error: --"+name+" is not supported by gangrun") || strings.Count(gerr, "\n") != 1 {
			t.Errorf("gangrun sbatch %s: exit %d %q, want 255 and one line refusing --%s", opt, gcode, gerr, name)
		}
	}
}

// readFile reads dir/name, "" when it does not exist.
func readFile(dir, name string) string {
	b, _ := os.ReadFile(filepath.Join(dir, name))
	return string(b)
}

// TestSbatchOptionsAgainstSlurm: each of sbatch's options that shape the batch step,
// on a real Slurm and on gangrun: a failing script runs once and ends FAILED (no
// restart), --export=NONE and a list, --chdir, --output and --error patterns,
// --open-mode, --wrap; the files and contents a user finds agree.
func TestSbatchOptionsAgainstSlurm(t *testing.T) {
	p := startSlurmPair(t, "gpu-a", "gpu-b")
	type result struct {
		dir, id, state string
	}
	both := func(script string, extra []string, args ...string) (r, g result) {
		t.Helper()
		r.dir, r.id, r.state = p.submit(realSlurm, script, extra, args...)
		g.dir, g.id, g.state = p.submit(gangrunSide, script, extra, args...)
		return r, g
	}
	t.Run("a failing script runs once", func(t *testing.T) {
		p.t = t
		r, g := both("#!/bin/sh\n#SBATCH --nodes=2 --gres=gpu:1\necho run >> runs.txt\nexit 3\n", nil)
		if r.state != "FAILED" || g.state != "FAILED" {
			t.Errorf("states: slurm %s, gangrun %s; want FAILED", r.state, g.state)
		}
		if a, b := readFile(r.dir, "runs.txt"), readFile(g.dir, "runs.txt"); a != "run\n" || b != a {
			t.Errorf("runs.txt: slurm %q, gangrun %q; want one run", a, b)
		}
		m := p.gr.show(g.id)
		if m["exit_code"] != float64(3) || m["restarts"] != float64(0) {
			t.Errorf("gangrun job: exit_code %v, restarts %v; want 3, 0", m["exit_code"], m["restarts"])
		}
	})
	t.Run("export", func(t *testing.T) {
		p.t = t
		script := "#!/bin/sh\n#SBATCH --gres=gpu:1\necho \"FOO=${FOO-unset} BAR=${BAR-unset} OTHER=${OTHER-unset} HOME=${HOME-unset}\" > vars.txt\n"
		extra := []string{"FOO=1", "OTHER=x"}
		for _, export := range []string{"--export=NONE", "--export=FOO,BAR=2", "--export=ALL,BAR=3", "--export=ALL"} {
			r, g := both(script, extra, export)
			if a, b := readFile(r.dir, "vars.txt"), readFile(g.dir, "vars.txt"); a == "" || a != b {
				t.Errorf("%s: slurm %q, gangrun %q", export, a, b)
			}
		}
	})
	t.Run("chdir and patterns", func(t *testing.T) {
		p.t = t
		script := "#!/bin/sh\n#SBATCH --gres=gpu:1 --job-name=pat\npwd | sed 's|.*/||' \necho to-stderr >&2\n"
		var names [2][]string
		var outs [2]string
		var ids [2]string
		for i, s := range []side{realSlurm, gangrunSide} {
			dir := sharedDir(t)
			if err := os.Mkdir(filepath.Join(dir, "sub"), 0o777); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "job.sh"), []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			out, errOut, code := p.run(s, dir, "", nil, "sbatch", "--parsable", "--chdir=sub", "--output=%x-%j-%N-%n-%t-%4t.out", "--error=err-%j-%u.txt", "job.sh")
			if code != 0 {
				t.Fatalf("%s sbatch: %d %s", s, code, errOut)
			}
			ids[i] = strings.TrimSpace(out)
			p.waitEnd(s, ids[i], time.Minute)
			entries, _ := os.ReadDir(filepath.Join(dir, "sub"))
			for _, e := range entries {
				names[i] = append(names[i], strings.ReplaceAll(e.Name(), ids[i], "ID"))
				outs[i] += e.Name() + ": " + readFile(filepath.Join(dir, "sub"), e.Name())
			}
			outs[i] = strings.ReplaceAll(outs[i], ids[i], "ID")
		}
		// %N is the host's short name under Slurm, the node's name under gangrun (the
		// same on a cluster whose nodes are named after their hosts; docs/slurm.md).
		host, _ := os.Hostname()
		host, _, _ = strings.Cut(host, ".")
		for k := range names[0] {
			names[0][k] = strings.Replace(names[0][k], "-"+host+"-", "-gpu-a-", 1)
		}
		outs[0] = strings.ReplaceAll(outs[0], "-"+host+"-", "-gpu-a-")
		if !slices.Equal(names[0], names[1]) || outs[0] != outs[1] {
			t.Errorf("files in --chdir:\nslurm   %q %q\ngangrun %q %q", names[0], outs[0], names[1], outs[1])
		}
	})
	t.Run("open mode", func(t *testing.T) {
		p.t = t
		for _, mode := range []string{"--open-mode=append", "--open-mode=truncate"} {
			var got [2]string
			for i, s := range []side{realSlurm, gangrunSide} {
				dir := sharedDir(t)
				if err := os.WriteFile(filepath.Join(dir, "fixed.out"), []byte("old\n"), 0o666); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "job.sh"), []byte("#!/bin/sh\n#SBATCH --gres=gpu:1\necho new\n"), 0o755); err != nil {
					t.Fatal(err)
				}
				out, errOut, code := p.run(s, dir, "", nil, "sbatch", "--parsable", "--output=fixed.out", mode, "job.sh")
				if code != 0 {
					t.Fatalf("%s sbatch: %d %s", s, code, errOut)
				}
				p.waitEnd(s, strings.TrimSpace(out), time.Minute)
				got[i] = readFile(dir, "fixed.out")
			}
			if got[0] != got[1] {
				t.Errorf("%s: slurm %q, gangrun %q", mode, got[0], got[1])
			}
		}
	})
	t.Run("wrap", func(t *testing.T) {
		p.t = t
		var got [2]string
		for i, s := range []side{realSlurm, gangrunSide} {
			dir := sharedDir(t)
			out, errOut, code := p.run(s, dir, "", nil, "sbatch", "--parsable", "--gpus-per-node=2", "--wrap", "echo $SLURM_JOB_NAME $SLURM_GPUS_ON_NODE; echo $0 | sed 's|.*/||'")
			if code != 0 {
				t.Fatalf("%s sbatch: %d %s", s, code, errOut)
			}
			id := strings.TrimSpace(out)
			p.waitEnd(s, id, time.Minute)
			got[i] = readFile(dir, "slurm-"+id+".out")
		}
		if got[0] != got[1] || got[0] == "" {
			t.Errorf("--wrap: slurm %q, gangrun %q", got[0], got[1])
		}
	})
}

// srunScript runs srun the ways a job script does: labels, -n and -N layouts, tasks
// that fail, are killed or do not exist, --gpus-per-task, -K; after each, srun's exit
// code.
const srunScript = `#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=4 --gres=gpu:4
srun -l bash -c 'echo hi'
srun -n 2 bash -c 'kill -9 $$'; echo "rc=$?"
srun -n 2 bash -c 'kill -TERM $$'; echo "rc=$?"
srun -n 3 bash -c 'exit 3'; echo "rc=$?"
srun -n1 nosuchcmd; echo "rc=$?"
srun -N1 -n2 bash -c 'echo small $SLURM_PROCID $SLURM_NNODES $SLURM_NTASKS $SLURM_STEP_NUM_TASKS $SLURM_NODELIST $SLURM_STEP_NODELIST $SLURM_TASKS_PER_NODE'
srun --ntasks-per-node=1 bash -c 'echo one-per-node $SLURM_PROCID $SLURM_NODEID $SLURM_STEP_TASKS_PER_NODE'
srun -n 8 --gpus-per-task=1 bash -c 'echo gpt $SLURM_PROCID $SLURM_NODEID gpus=$CUDA_VISIBLE_DEVICES'
srun -K -n 4 bash -c 'if [ $SLURM_PROCID = 1 ]; then exit 5; fi; exec sleep 60'; echo "rc=$?"
echo done
`

// TestSrunAgainstSlurm: srunScript's output on a real Slurm and on gangrun: every
// line of output, srun's messages (task reports, warnings) and exit codes the same, in
// any order, but for the lines docs/slurm.md lists as differing (Slurm's -K message
// from its node's slurmstepd, GPU indices given to tasks: compared by count and node,
// and on each side no two --gpus-per-task tasks of a node share a GPU).
func TestSrunAgainstSlurm(t *testing.T) {
	p := startSlurmPair(t, "gpu-a", "gpu-b")
	rdir, rid, rstate := p.submit(realSlurm, srunScript, nil)
	gdir, gid, gstate := p.submit(gangrunSide, srunScript, nil)
	if rstate != gstate {
		t.Errorf("states: slurm %s, gangrun %s", rstate, gstate)
	}
	taskGPUs := map[string][]string{} // per job, the "NODEID/GPU" of each --gpus-per-task task
	norm := func(dir, id string) []string {
		data := readFile(dir, "slurm-"+id+".out")
		var out []string
		for _, l := range strings.Split(strings.TrimSpace(data), "\n") {
			l = strings.ReplaceAll(l, "StepId="+id+".", "StepId=ID.")
			switch {
			case strings.Contains(l, "*** STEP") && strings.Contains(l, "CANCELLED AT"):
				continue // slurmstepd's note of a -K cancel: gangrun's nodes do not write it
			case strings.Contains(l, "step creation temporarily disabled, retrying") || strings.HasPrefix(l, "srun: Step created for job"):
				// Slurm's srun, now and then on a loaded machine, when the last step's
				// resources are not yet released: gangrun's steps do not wait for that.
				continue
			case strings.HasPrefix(l, "small "):
				// Which of the job's nodes a one-node step runs on: the first, or, on a
				// loaded machine, the other when the last step has not yet let go of
				// the first (Slurm 22.05 chose gpu-b there once): the step's one node.
				if f := strings.Fields(l); len(f) == 8 && !strings.Contains(f[6], ",") && strings.Contains(","+f[5]+",", ","+f[6]+",") {
					f[6] = "ONE-OF-THE-JOB'S-NODES"
					l = strings.Join(f, " ")
				}
			case strings.HasPrefix(l, "gpt "):
				// Which GPU a task gets: Slurm binds by its own order; count them instead
				// (none when CUDA_VISIBLE_DEVICES is empty), and check apart that no two
				// tasks of a node share one.
				f := strings.Fields(l)
				var gpus []string
				if len(f) == 4 && strings.HasPrefix(f[3], "gpus=") && f[3] != "gpus=" {
					gpus = strings.Split(strings.TrimPrefix(f[3], "gpus="), ",")
				}
				if len(f) >= 3 {
					for _, g := range gpus {
						taskGPUs[id] = append(taskGPUs[id], f[2]+"/"+g)
					}
					l = fmt.Sprintf("gpt %s node %s gpus %d", f[1], f[2], len(gpus))
				}
			}
			out = append(out, l)
		}
		sort.Strings(out)
		return out
	}
	r, g := norm(rdir, rid), norm(gdir, gid)
	same := 0
	for _, l := range r {
		if slices.Contains(g, l) {
			same++
		}
	}
	t.Logf("srun: %d of %d lines of Slurm's output are gangrun's", same, len(r))
	if !slices.Equal(r, g) {
		t.Errorf("output differs:\nslurm:\n%s\n\ngangrun:\n%s", strings.Join(r, "\n"), strings.Join(g, "\n"))
	}
	// srun -n 8 --gpus-per-task=1 on two nodes of 4 GPUs: each task its own GPU.
	for s, id := range map[side]string{realSlurm: rid, gangrunSide: gid} {
		gpus := slices.Clone(taskGPUs[id])
		slices.Sort(gpus)
		if len(gpus) != 8 || len(slices.Compact(gpus)) != 8 {
			t.Errorf("%s: --gpus-per-task=1 gave the 8 tasks the GPUs (node/GPU) %q, want 8 different ones", s, taskGPUs[id])
		}
	}
}

// timePattern matches squeue's and scontrol's times and durations.
var timePattern = regexp.MustCompile(`\b(\d+-)?\d{1,2}(:\d\d){1,2}\b|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d`)

// waitFor polls cond every 200 ms until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (last: %q)", what, within, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// scontrolFields reads scontrol's KEY=VALUE record into a map.
func scontrolFields(out string) map[string]string {
	m := map[string]string{}
	for _, w := range strings.Fields(out) {
		if k, v, ok := strings.Cut(w, "="); ok {
			m[k] = v
		}
	}
	return m
}

// TestSlurmCommandsAgainstSlurm: with the same jobs on a real Slurm and on gangrun (one
// running an srun step, one pending for resources, one that failed, one cancelled),
// squeue, sinfo, scontrol and scancel print the same (job ids, times and directories
// aside): default and -o/-O/-l formats, -h, -j, -u, -t, -p, -s steps; scontrol's
// job, step, node and partition fields (ExitCode=3:0; time limits and exit codes also
// as printed, not only as TIME); and their errors and exit codes, stdout and stderr
// apart.
// sacct is compared with Slurm's documented format only: this Slurm has no
// accounting database.
func TestSlurmCommandsAgainstSlurm(t *testing.T) {
	p := startSlurmPair(t, "gpu-a", "gpu-b")
	running := "#!/bin/bash\n#SBATCH --job-name=cmds --nodes=2 --gres=gpu:4 --ntasks-per-node=2 --time=10:00 --partition=gpu --exclusive=user\nsrun sleep 120\n"
	type jobs struct{ dir, run, pend, fail string }
	var js [2]jobs
	sides := []side{realSlurm, gangrunSide}
	for i, s := range sides {
		dir := sharedDir(t)
		js[i].dir = dir
		for name, text := range map[string]string{"run.sh": running,
			"fail.sh": "#!/bin/sh\n#SBATCH --job-name=fails --gres=gpu:1 --exclude=gpu-b\nexit 3\n"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		sub := func(args ...string) string {
			out, errOut, code := p.run(s, dir, "", nil, "sbatch", append([]string{"--parsable"}, args...)...)
			if code != 0 {
				t.Fatalf("%s sbatch %v: %d %s", s, args, code, errOut)
			}
			return strings.TrimSpace(out)
		}
		js[i].fail = sub("fail.sh")
		p.waitEnd(s, js[i].fail, time.Minute)
		js[i].run = sub("run.sh")
		waitFor(t, time.Minute, string(s)+" job running with its step", func() (bool, string) {
			out, errOut, _ := p.run(s, dir, "", nil, "squeue", "-h", "-s", "-o", "%i")
			return strings.Contains(out, js[i].run+".0"), out + errOut
		})
		js[i].pend = sub("--nodes=2", "--gres=gpu:8", "--job-name=waits", "--exclusive", "-w", "gpu-a,gpu-b", "--wrap", "sleep 1")
		waitFor(t, time.Minute, string(s)+" job pending for resources", func() (bool, string) {
			out, errOut, _ := p.run(s, dir, "", nil, "squeue", "-h", "-j", js[i].pend, "-o", "%r")
			return strings.TrimSpace(out) == "Resources", out + errOut
		})
	}
	// normIDs puts words for side i's job ids and directory.
	normIDs := func(i int, out string) string {
		out = strings.ReplaceAll(out, js[i].dir, "DIR")
		for id, name := range map[string]string{js[i].run: "RUN", js[i].pend: "PEND", js[i].fail: "FAIL"} {
			out = regexp.MustCompile(`\b`+id+`\b`).ReplaceAllString(out, name)
		}
		// scontrol's hostlist errors name the Slurm function that found them
		// ("scontrol: error: _parse_single_range: ..."): gangrun's do not.
		return regexp.MustCompile(`(?m)^scontrol: error: _\w+: .*\n`).ReplaceAllString(out, "")
	}
	// norm also puts TIME for every time and duration.
	norm := func(i int, out string) string {
		return timePattern.ReplaceAllString(normIDs(i, out), "TIME")
	}
	agree, total := 0, 0
	// ids puts side i's job ids for the words RUN and PEND in an argument.
	ids := func(i int, f string) string {
		return strings.NewReplacer("RUN", js[i].run, "PEND", js[i].pend, "ENDED", js[i].fail).Replace(f)
	}
	// compare runs a command on both sides and compares what it prints, on stdout and
	// on stderr apart (a script reads one, `2>/dev/null` drops the other), and its exit
	// code; exact keeps the times (time limits are settings, not clocks).
	compareAs := func(exact bool, name string, args ...string) {
		t.Helper()
		var outs, errs [2]string
		var codes [2]int
		for i, s := range sides {
			own := make([]string, len(args))
			for k, a := range args {
				own[k] = ids(i, a)
			}
			out, errOut, code := p.run(s, js[i].dir, "", nil, name, own...)
			n := norm
			if exact {
				n = normIDs
			}
			outs[i], errs[i], codes[i] = n(i, out), n(i, errOut), code
		}
		total++
		if outs[0]+errs[0] != outs[1]+errs[1] || codes[0] != codes[1] {
			t.Errorf("%s %q:\nslurm (exit %d):\n%s%s\ngangrun (exit %d):\n%s%s", name, args, codes[0], outs[0], errs[0], codes[1], outs[1], errs[1])
			return
		}
		if outs[0] != outs[1] {
			t.Errorf("%s %q: the same text, but on stdout:\nslurm:   %q\ngangrun: %q", name, args, outs[0], outs[1])
			return
		}
		agree++
	}
	compare := func(name string, args ...string) {
		t.Helper()
		compareAs(false, name, args...)
	}
	compare("squeue")
	compare("squeue", "-h", "-t", "R", "-o", "%i")
	compare("squeue", "-s")
	compare("squeue", "-o", "%i %j %T %t %l %D %R %u %P %C %b")
	compare("squeue", "-O", "JobID,Name,State,NumNodes,ReasonList")
	compare("squeue", "-u", "root", "-p", "gpu", "-t", "PD")
	compare("squeue", "-l", "-h")
	compare("squeue", "--states=all", "-h", "-o", "%j %T")
	compare("squeue", "-h", "-j", "PEND", "-o", "%i %r")
	compare("squeue", "-h", "--states=all", "-o", "%i %h %n %x %f")
	compare("squeue", "-h", "--jobs=RUN,PEND", "-o", "%i %t")
	compare("squeue", "-h", "-s", "RUN.0")
	compare("squeue", "-h", "-s", "RUN.0,RUN.7")
	compare("squeue", "-h", "-s", "RUN.7")
	compare("squeue", "-h", "-j", "PEND", "extra")
	compare("squeue", "-j", "99999")
	compare("squeue", "-h", "-j", "99999,PEND", "-o", "%i")
	compare("squeue", "-t", "XX")
	compare("squeue", "-O", "foo")
	compare("squeue", "--foo")
	compare("sinfo")
	compare("sinfo", "-N")
	compare("sinfo", "-h", "-o", "%P %a %D %t %N %G")
	compare("sinfo", "-t", "idle")
	compare("sinfo", "--foo")
	compare("scontrol", "show", "hostnames", "gpu-[a-b]")
	compare("scontrol", "show", "job", "99999")
	compare("scontrol", "show", "foo")
	compare("scontrol", "bogus")
	compare("scancel", "99999.0")
	compare("scancel", "abc")
	// Time limits as set: norm would hide a wrong one behind TIME.
	compareAs(true, "squeue", "-h", "--states=all", "-o", "%i %j %l")
	compareAs(true, "sinfo", "-h", "-o", "%P %l")
	// scontrol's records: the fields a user and a tool read.
	fieldsOfAs := func(exact bool, i int, args ...string) map[string]string {
		out, _, code := p.run(sides[i], js[i].dir, "", nil, "scontrol", args...)
		if code != 0 {
			t.Fatalf("%s scontrol %v: exit %d", sides[i], args, code)
		}
		if exact {
			return scontrolFields(normIDs(i, out))
		}
		return scontrolFields(norm(i, out))
	}
	fieldsOf := func(i int, args ...string) map[string]string {
		return fieldsOfAs(false, i, args...)
	}
	slurmPrints := map[string]bool{} // the keys checked, and whether Slurm printed each once
	check := func(what string, keys []string, a, b map[string]string) {
		t.Helper()
		for _, k := range keys {
			total++
			_, inA := a[k]
			_, inB := b[k]
			slurmPrints[k] = slurmPrints[k] || inA
			if inA != inB {
				t.Errorf("%s %s: printed by slurm %v, by gangrun %v", what, k, inA, inB)
				continue
			}
			if a[k] != b[k] {
				t.Errorf("%s %s: slurm %q, gangrun %q", what, k, a[k], b[k])
				continue
			}
			agree++
		}
	}
	jobKeys := []string{"JobId", "JobName", "UserId", "JobState", "Reason", "Dependency", "Requeue", "Restarts", "BatchFlag",
		"ExitCode", "TimeLimit", "Partition", "NodeList", "BatchHost", "NumNodes", "NumCPUs", "NumTasks", "CPUs/Task",
		"NtasksPerN:B:S:C", "WorkDir", "StdErr", "StdIn", "StdOut", "TresPerNode", "Command", "RunTime", "StartTime", "EndTime",
		"ReqNodeList", "ExcNodeList", "Features", "OverSubscribe"}
	for _, which := range []string{"run", "pend", "fail"} {
		id := func(i int) string {
			return map[string]string{"run": js[i].run, "pend": js[i].pend, "fail": js[i].fail}[which]
		}
		check("scontrol show job ("+which+")", jobKeys, fieldsOf(0, "show", "job", id(0)), fieldsOf(1, "show", "job", id(1)))
	}
	// Time limits as set (norm puts TIME for them).
	for _, which := range []string{"run", "pend", "fail"} {
		id := func(i int) string {
			return map[string]string{"run": js[i].run, "pend": js[i].pend, "fail": js[i].fail}[which]
		}
		check("scontrol show job ("+which+", exact)", []string{"TimeLimit"}, fieldsOfAs(true, 0, "show", "job", id(0)), fieldsOfAs(true, 1, "show", "job", id(1)))
	}
	check("scontrol show step (exact)", []string{"TimeLimit"},
		fieldsOfAs(true, 0, "show", "step", js[0].run+".0"), fieldsOfAs(true, 1, "show", "step", js[1].run+".0"))
	check("scontrol show partition (exact)", []string{"MaxTime", "DefaultTime"},
		fieldsOfAs(true, 0, "show", "partition", "gpu"), fieldsOfAs(true, 1, "show", "partition", "gpu"))
	check("scontrol show step", []string{"StepId", "UserId", "State", "Partition", "NodeList", "Nodes", "CPUs", "Tasks", "Name", "TimeLimit", "Dist", "TresPerNode"},
		fieldsOf(0, "show", "step", js[0].run+".0"), fieldsOf(1, "show", "step", js[1].run+".0"))
	check("scontrol show node", []string{"NodeName", "Gres", "State", "Partitions", "AvailableFeatures", "ActiveFeatures"},
		fieldsOf(0, "show", "node", "gpu-a"), fieldsOf(1, "show", "node", "gpu-a"))
	check("scontrol show partition", []string{"PartitionName", "Default", "Nodes", "State", "TotalNodes", "MaxTime", "MaxNodes"},
		fieldsOf(0, "show", "partition", "gpu"), fieldsOf(1, "show", "partition", "gpu"))
	// Holds, as root (an operator: scontrol hold is JobHeldAdmin, uhold JobHeldUser),
	// of the pending job, the running one, one unknown and none; released, the pending
	// job waits for resources again.
	compare("scontrol", "hold", "JobId=PEND")
	compareAs(true, "squeue", "-h", "-j", "PEND", "-o", "%i %T %r")
	compare("scontrol", "hold", "RUN")
	compare("scontrol", "hold", "99999")
	compare("scontrol", "hold", "ENDED")
	compare("scontrol", "release", "ENDED")
	compare("scontrol", "hold", "99999,PEND")
	compare("scontrol", "hold")
	compare("scontrol", "uhold", "PEND")
	compareAs(true, "squeue", "-h", "-j", "PEND", "-o", "%i %T %r")
	compare("scontrol", "release", "PEND")
	for i, s := range sides {
		waitFor(t, time.Minute, string(s)+" job released, pending for resources", func() (bool, string) {
			out, errOut, _ := p.run(s, js[i].dir, "", nil, "squeue", "-h", "-j", js[i].pend, "-o", "%T %r")
			return strings.TrimSpace(out) == "PENDING Resources", out + errOut
		})
	}
	compare("scontrol", "release", "PEND")
	compare("scontrol", "release", "RUN")
	// scancel: the pending job, while the running one still holds the resources it
	// waits for (cancelled after it, it could start first and end killed, 0:15); then
	// the running job's step.
	for i, s := range sides {
		if _, errOut, code := p.run(s, js[i].dir, "", nil, "scancel", js[i].pend); code != 0 {
			t.Errorf("%s scancel: exit %d %s", s, code, errOut)
		}
		p.waitEnd(s, js[i].pend, time.Minute)
	}
	for i, s := range sides {
		if _, errOut, code := p.run(s, js[i].dir, "", nil, "scancel", js[i].run+".0"); code != 0 {
			t.Errorf("%s scancel STEP: exit %d %s", s, code, errOut)
		}
	}
	for i, s := range sides {
		p.waitEnd(s, js[i].run, time.Minute)
	}
	check("scontrol show job (after scancel of its step)", []string{"JobState", "ExitCode", "Reason"},
		fieldsOf(0, "show", "job", js[0].run), fieldsOf(1, "show", "job", js[1].run))
	// A pending job cancelled: Slurm keeps its last pending reason (Resources), gangrun
	// says None (docs/slurm.md, what differs).
	check("scontrol show job (cancelled pending)", []string{"JobState", "ExitCode"},
		fieldsOf(0, "show", "job", js[0].pend), fieldsOf(1, "show", "job", js[1].pend))
	// Exit codes as written: norm puts TIME for a signal of two digits ("0:15").
	for _, which := range []string{"run", "pend", "fail"} {
		id := func(i int) string {
			return map[string]string{"run": js[i].run, "pend": js[i].pend, "fail": js[i].fail}[which]
		}
		check("scontrol show job ("+which+", ended, exact)", []string{"ExitCode"},
			fieldsOfAs(true, 0, "show", "job", id(0)), fieldsOfAs(true, 1, "show", "job", id(1)))
	}
	// sbatch -H: held by its user until released; then it runs (once the other jobs
	// have ended: Slurm's FIFO scheduler would keep it behind the pending job).
	var held [2]string
	for i, s := range sides {
		out, errOut, code := p.run(s, js[i].dir, "", nil, "sbatch", "--parsable", "-H", "--gres=gpu:1", "--wrap", "true")
		if code != 0 {
			t.Fatalf("%s sbatch -H: exit %d %s", s, code, errOut)
		}
		id := strings.TrimSpace(out)
		total++
		if out, errOut, _ := p.run(s, js[i].dir, "", nil, "squeue", "-h", "-j", id, "-o", "%T %r"); strings.TrimSpace(out) != "PENDING JobHeldUser" {
			t.Errorf("%s sbatch -H: squeue says %q %s, want PENDING JobHeldUser", s, out, errOut)
		} else {
			agree++
		}
		held[i] = id
	}
	// scontrol requeue of a pending job: refused, as Slurm refuses it.
	compareHeld := func(args ...string) {
		t.Helper()
		var outs [2]string
		var codes [2]int
		for i, s := range sides {
			own := append([]string{}, args...)
			own[len(own)-1] = held[i]
			out, errOut, code := p.run(s, js[i].dir, "", nil, "scontrol", own...)
			outs[i], codes[i] = strings.ReplaceAll(out+errOut, held[i], "HELD"), code
		}
		total++
		if outs[0] != outs[1] || codes[0] != codes[1] {
			t.Errorf("scontrol %q:\nslurm (exit %d): %s\ngangrun (exit %d): %s", args, codes[0], outs[0], codes[1], outs[1])
			return
		}
		agree++
	}
	compareHeld("requeue", "HELD")
	compareHeld("requeuehold", "HELD")
	for i, s := range sides {
		id := held[i]
		if _, errOut, code := p.run(s, js[i].dir, "", nil, "scontrol", "release", id); code != 0 {
			t.Errorf("%s scontrol release: exit %d %s", s, code, errOut)
		}
		if st := p.waitEnd(s, id, time.Minute); st != "COMPLETED" {
			t.Errorf("%s: the released job ended %s, want COMPLETED", s, st)
		}
	}
	// scontrol requeue and requeuehold of a running job: its steps stop and it waits
	// PENDING (Slurm: BeginTime, then it runs again; gangrun places it again at once);
	// requeuehold leaves it held.
	for _, verb := range []string{"requeue", "requeuehold"} {
		var runs [2]string
		for i, s := range sides {
			out, errOut, code := p.run(s, js[i].dir, "", nil, "sbatch", "--parsable", "--gres=gpu:1", "--wrap", "sleep 300")
			if code != 0 {
				t.Fatalf("%s sbatch: exit %d %s", s, code, errOut)
			}
			runs[i] = strings.TrimSpace(out)
			waitFor(t, time.Minute, string(s)+" job running", func() (bool, string) {
				out, errOut, _ := p.run(s, js[i].dir, "", nil, "squeue", "-h", "-j", runs[i], "-o", "%T")
				return strings.TrimSpace(out) == "RUNNING", out + errOut
			})
		}
		held = runs
		compareHeld(verb, "HELD")
		for i, s := range sides {
			waitFor(t, time.Minute, string(s)+" job requeued by scontrol "+verb, func() (bool, string) {
				out, errOut, _ := p.run(s, js[i].dir, "", nil, "squeue", "-h", "-j", runs[i], "-o", "%T %r")
				got := strings.TrimSpace(out)
				if verb == "requeuehold" {
					return got == "PENDING job requeued in held state", out + errOut
				}
				// Slurm keeps it PENDING (BeginTime) a while; gangrun places it again.
				if s == gangrunSide && got == "RUNNING None" {
					as, _ := p.gr.show(runs[i])["attempts"].([]any)
					return len(as) > 0 && strings.Contains(fmt.Sprint(as[0]), "scontrol requeue"), fmt.Sprint(as)
				}
				return got == "PENDING BeginTime", out + errOut
			})
		}
		if verb == "requeuehold" {
			var reasons [2]string
			for i, s := range sides {
				out, _, _ := p.run(s, js[i].dir, "", nil, "squeue", "-h", "-j", runs[i], "-o", "%T %r")
				reasons[i] = strings.TrimSpace(out)
			}
			total++
			if reasons[0] != reasons[1] {
				t.Errorf("squeue after requeuehold: slurm %q, gangrun %q", reasons[0], reasons[1])
			} else {
				agree++
			}
		}
		for i, s := range sides {
			if _, errOut, code := p.run(s, js[i].dir, "", nil, "scancel", runs[i]); code != 0 {
				t.Errorf("%s scancel: exit %d %s", s, code, errOut)
			}
			p.waitEnd(s, runs[i], time.Minute)
		}
	}
	compare("squeue")
	for k, printed := range slurmPrints {
		if !printed {
			t.Errorf("scontrol: Slurm printed no %s in any record checked: the check compares nothing", k)
		}
	}
	t.Logf("squeue, sinfo, scontrol, scancel: %d of %d outputs and fields agree", agree, total)
	// sacct, gangrun's alone: Slurm's default fields and widths, a line per step.
	out, errOut, code := p.run(gangrunSide, js[1].dir, "", nil, "sacct", "-j", js[1].run+","+js[1].fail)
	want := []string{
		"JobID           JobName  Partition    Account  AllocCPUS      State ExitCode ",
		"------------ ---------- ---------- ---------- ---------- ---------- -------- ",
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if code != 0 || len(lines) < 6 || lines[0] != want[0] || lines[1] != want[1] {
		t.Errorf("sacct: exit %d %s\n%s", code, errOut, out)
	}
	for _, w := range []string{fmt.Sprintf("%-12s %10s", js[1].fail, "fails"), js[1].fail + ".batch", "     FAILED      3:0", js[1].run + ".0"} {
		if !strings.Contains(out, w) {
			t.Errorf("sacct lacks %q:\n%s", w, out)
		}
	}
	out, _, _ = p.run(gangrunSide, js[1].dir, "", nil, "sacct", "-P", "-n", "-X", "-j", js[1].fail, "-o", "JobID,JobName,State,ExitCode,NNodes")
	if out != js[1].fail+"|fails|FAILED|3:0|1\n" {
		t.Errorf("sacct -P -n -X: %q", out)
	}
}

// TestModuleLoadAgainstSlurm: a job script's `module load` (Debian's Environment
// Modules 5.2) works on gangrun as on a real Slurm, both ways a Slurm user's does: a
// `#!/bin/bash -l` script, whose login shell reads /etc/profile.d/modules.sh on the
// node, and a plain `#!/bin/bash` script submitted from a shell that has `module`
// (bash exports it as BASH_FUNC_module%%, and sbatch's --export=ALL brings it). The
// module's variable reaches the batch step, and in the second way every srun task on
// both nodes. It failed before job.TaskPIDCommand: /bin/sh, which started every batch
// script and task, dropped BASH_FUNC_module%%.
func TestModuleLoadAgainstSlurm(t *testing.T) {
	if _, err := os.Stat("/etc/profile.d/modules.sh"); err != nil {
		t.Fatalf("Environment Modules is not installed (scripts/install-deps.sh modules): %v", err)
	}
	mods := sharedDir(t)
	if err := os.MkdirAll(filepath.Join(mods, "gtool"), 0o755); err != nil {
		t.Fatal(err)
	}
	modfile := "#%Module1.0\nsetenv GTOOL_VERSION 1.0\nprepend-path PATH " + mods + "/gtool-bin\n"
	if err := os.WriteFile(filepath.Join(mods, "gtool", "1.0"), []byte(modfile), 0o644); err != nil {
		t.Fatal(err)
	}
	// The submitting shell's module environment, as `env` shows it after modules.sh.
	out, err := exec.Command("bash", "-c", "source /etc/profile.d/modules.sh && env -0").Output()
	if err != nil {
		t.Fatal(err)
	}
	var shell []string
	for _, kv := range strings.Split(string(out), "\x00") {
		if strings.HasPrefix(kv, "BASH_FUNC_") || strings.HasPrefix(kv, "MODULE") {
			shell = append(shell, kv)
		}
	}
	if !slices.ContainsFunc(shell, func(kv string) bool { return strings.HasPrefix(kv, "BASH_FUNC_module%%=") }) {
		t.Fatalf("modules.sh exported no module function: %q", shell)
	}
	head := "#SBATCH --job-name=mods --nodes=2 --ntasks-per-node=1 --gres=gpu:1\n" +
		"module use " + mods + "\nmodule load gtool/1.0\n" +
		"echo \"batch $GTOOL_VERSION $LOADEDMODULES $(type -t module)\"\n"
	tasks := "srun bash -c 'echo \"task $SLURM_PROCID $GTOOL_VERSION ${PATH%%:*}\"'\n"
	batch := "batch 1.0 gtool/1.0 function"
	both := []string{batch, "task 0 1.0 " + mods + "/gtool-bin", "task 1 1.0 " + mods + "/gtool-bin"}
	p := startSlurmPair(t, "gpu-a", "gpu-b")
	for _, tc := range []struct {
		name, script string
		env          []string
		want         []string
	}{
		// A login shell's PATH is the node's own (/etc/profile sets it), where this
		// machine's srun is Debian's, not gangrun's link in the test's directory: on a
		// gangrun node `make install` puts the links in /usr/local/bin, ahead of
		// /usr/bin (docs/slurm.md, "Environment modules"). So the login script's srun
		// is not run here.
		{"login shell", "#!/bin/bash -l\n" + head, nil, []string{batch}},
		{"exported function", "#!/bin/bash\n" + head + tasks, shell, both},
	} {
		var got [2][]string
		for i, s := range []side{realSlurm, gangrunSide} {
			dir, id, state := p.submit(s, tc.script, tc.env)
			lines := strings.Split(strings.TrimSpace(readFile(dir, "slurm-"+id+".out")), "\n")
			sort.Strings(lines)
			got[i] = lines
			if state != "COMPLETED" {
				t.Errorf("%s, %s: job %s %s:\n%s", tc.name, s, id, state, strings.Join(lines, "\n"))
			}
		}
		if !slices.Equal(got[0], tc.want) || !slices.Equal(got[1], tc.want) {
			t.Errorf("%s: slurm-ID.out\nslurm:   %q\ngangrun: %q\nwant:    %q", tc.name, got[0], got[1], tc.want)
		}
	}
}

// TestSlurmPartitionOfUnlabelledNodes: on a cluster whose nodes carry no partition
// label, Slurm's commands show one partition, "gangrun", the default: a job that names
// none is in it (scontrol, squeue, its SLURM_JOB_PARTITION), -p gangrun is taken, and
// sinfo and scontrol agree that it is the default; scontrol update Partition=gangrun
// of a pending job is taken too.
func TestSlurmPartitionOfUnlabelledNodes(t *testing.T) {
	links := slurmLinks(t)
	p := &slurmPair{t: t, gr: startJobCluster(t, "gpu-a"), links: links}
	dir := sharedDir(t)
	var ids []string
	for _, args := range [][]string{{}, {"-p", "gangrun"}} {
		out, errOut, code := p.run(gangrunSide, dir, "", nil, "sbatch", append(args, "--parsable", "--gres=gpu:1", "--wrap", "echo part=$SLURM_JOB_PARTITION")...)
		if code != 0 {
			t.Fatalf("sbatch %v: exit %d %s", args, code, errOut)
		}
		ids = append(ids, strings.TrimSpace(out))
	}
	for _, id := range ids {
		if st := p.waitEnd(gangrunSide, id, time.Minute); st != "COMPLETED" {
			t.Fatalf("job %s: %s", id, st)
		}
		if got := strings.TrimSpace(readFile(dir, "slurm-"+id+".out")); got != "part=gangrun" {
			t.Errorf("job %s printed %q, want part=gangrun", id, got)
		}
		out, _, _ := p.run(gangrunSide, dir, "", nil, "scontrol", "show", "job", id)
		if f := scontrolFields(out); f["Partition"] != "gangrun" {
			t.Errorf("scontrol show job %s: Partition=%q", id, f["Partition"])
		}
	}
	out, _, _ := p.run(gangrunSide, dir, "", nil, "squeue", "-h", "-t", "all", "-p", "gangrun", "-o", "%i %P")
	if want := ids[0] + " gangrun\n" + ids[1] + " gangrun\n"; out != want && out != ids[1]+" gangrun\n"+ids[0]+" gangrun\n" {
		t.Errorf("squeue -p gangrun: %q, want both jobs", out)
	}
	if out, _, _ := p.run(gangrunSide, dir, "", nil, "sinfo", "-h", "-o", "%P"); out != "gangrun*\n" {
		t.Errorf("sinfo: %q, want gangrun*", out)
	}
	out, _, _ = p.run(gangrunSide, dir, "", nil, "scontrol", "show", "partition", "gangrun")
	if f := scontrolFields(out); f["Default"] != "YES" {
		t.Errorf("scontrol show partition gangrun: Default=%q\n%s", f["Default"], out)
	}
	// scontrol update Partition=gangrun of a pending job: taken, as sbatch -p gangrun is.
	out, errOut, code := p.run(gangrunSide, dir, "", nil, "sbatch", "-H", "--parsable", "--gres=gpu:1", "--wrap", "true")
	if code != 0 {
		t.Fatalf("sbatch -H: exit %d %s", code, errOut)
	}
	held := strings.TrimSpace(out)
	// At once, as Slurm takes it: an update waits for the cluster to accept a job just
	// submitted (job.DoUpdate).
	if out, errOut, code := p.run(gangrunSide, dir, "", nil, "scontrol", "update", "JobId="+held, "Partition=gangrun"); code != 0 || out+errOut != "" {
		t.Errorf("scontrol update JobId=%s Partition=gangrun: exit %d %q, want 0 and nothing", held, code, out+errOut)
	}
	out, _, _ = p.run(gangrunSide, dir, "", nil, "scontrol", "show", "job", held)
	if f := scontrolFields(out); f["Partition"] != "gangrun" {
		t.Errorf("scontrol show job %s after the update: Partition=%q", held, f["Partition"])
	}
	p.run(gangrunSide, dir, "", nil, "scancel", held)
}

// TestScancelNoteAgainstSlurm: a running batch job cancelled with scancel ends
// CANCELLED with slurmstepd's note in its output file on a real Slurm and on gangrun,
// the same line but for the id, node and time.
func TestScancelNoteAgainstSlurm(t *testing.T) {
	p := startSlurmPair(t, "gpu-a")
	script := "#!/bin/bash\n#SBATCH --gres=gpu:1\necho started\nsleep 300\n"
	var notes [2]string
	for i, s := range []side{realSlurm, gangrunSide} {
		dir, id := p.sbatch(s, script, nil)
		waitFor(t, time.Minute, string(s)+" job started", func() (bool, string) {
			data := readFile(dir, "slurm-"+id+".out")
			return strings.Contains(data, "started"), data
		})
		if _, errOut, code := p.run(s, dir, "", nil, "scancel", id); code != 0 {
			t.Fatalf("%s scancel: exit %d %s", s, code, errOut)
		}
		if st := p.waitEnd(s, id, time.Minute); st != "CANCELLED" {
			t.Errorf("%s: job %s ended %s, want CANCELLED", s, id, st)
		}
		waitFor(t, 30*time.Second, string(s)+" cancel note", func() (bool, string) {
			data := readFile(dir, "slurm-"+id+".out")
			for _, l := range strings.Split(data, "\n") {
				if strings.Contains(l, "*** JOB") {
					notes[i] = timePattern.ReplaceAllString(strings.ReplaceAll(l, id, "ID"), "TIME")
					return true, l
				}
			}
			return false, data
		})
	}
	if notes[0] != notes[1] {
		t.Errorf("cancel note: slurm %q, gangrun %q", notes[0], notes[1])
	}
	// An srun task gets one SIGTERM when its job is cancelled, though it reaches it both
	// from the node's step and through srun, which the batch shell's stop signals too:
	// a `gangrun run` task takes a second one for "kill now" (and never checkpoints).
	// Without the step's dedupe this failed 1 run in 3: the two SIGTERMs race.
	dir := sharedDir(t)
	task := "#!/bin/bash\n#SBATCH --gres=gpu:1\nsrun " + gangrunBin + " run --term-timeout 3s -- sh -c 'echo ready > ready; sleep 300'\n"
	if err := os.WriteFile(filepath.Join(dir, "task.sh"), []byte(task), 0o755); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := p.run(gangrunSide, dir, "", nil, "sbatch", "--parsable", "--gangrun-term-timeout=10s", "task.sh")
	if code != 0 {
		t.Fatalf("sbatch: exit %d %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	waitFor(t, time.Minute, "the task's worker running", func() (bool, string) {
		return readFile(dir, "ready") != "", readFile(dir, "slurm-"+id+".out")
	})
	if _, errOut, code := p.run(gangrunSide, dir, "", nil, "scancel", id); code != 0 {
		t.Fatalf("scancel: exit %d %s", code, errOut)
	}
	p.waitEnd(gangrunSide, id, time.Minute)
	// The job's srun step ends with it (CANCELLED), never RUNNING in sacct after it.
	waitFor(t, 30*time.Second, "the cancelled job's srun step ended", func() (bool, string) {
		out, errOut, _ := p.run(gangrunSide, dir, "", nil, "sacct", "-j", id, "-n", "-P", "-o", "JobID,State")
		return strings.Contains(out, id+".0|CANCELLED"), out + errOut
	})
	if data := readFile(dir, "slurm-"+id+".out"); strings.Contains(data, "second signal") || !strings.Contains(data, "SIGTERM") {
		t.Errorf("the srun task's gangrun run, on scancel: want one SIGTERM, no second signal:\n%s", data)
	}
}

// TestScancelSignalAgainstSlurm: `scancel --signal=SIG` signals a running batch job
// without cancelling it, on a real Slurm 22.05 and on gangrun alike: by default the
// srun step's task gets it and the batch shell does not, with --batch the batch shell
// does; the job stays RUNNING. An unknown signal is refused in scancel's words.
func TestScancelSignalAgainstSlurm(t *testing.T) {
	p := startSlurmPair(t, "gpu-a")
	script := `#!/bin/bash
#SBATCH --gres=gpu:1
trap 'echo batch USR2 >> got' USR2
trap 'echo batch TERM >> got' TERM
srun bash -c 'trap "echo task USR2 >> got" USR2; trap "echo task TERM >> got" TERM; echo ready > ready; while :; do sleep 1; done' &
while :; do sleep 1; done
`
	var bad [2]string
	for i, s := range []side{realSlurm, gangrunSide} {
		dir, id := p.sbatch(s, script, nil)
		waitFor(t, time.Minute, string(s)+" task started", func() (bool, string) {
			return readFile(dir, "ready") != "", readFile(dir, "slurm-"+id+".out")
		})
		if _, errOut, code := p.run(s, dir, "", nil, "scancel", "--signal", "USR2", id); code != 0 {
			t.Fatalf("%s scancel --signal USR2: exit %d %s", s, code, errOut)
		}
		waitFor(t, time.Minute, string(s)+" task got USR2", func() (bool, string) {
			got := readFile(dir, "got")
			return strings.Contains(got, "task USR2"), got
		})
		if _, errOut, code := p.run(s, dir, "", nil, "scancel", "-b", "-s", "SIGTERM", id); code != 0 {
			t.Fatalf("%s scancel -b -s SIGTERM: exit %d %s", s, code, errOut)
		}
		waitFor(t, time.Minute, string(s)+" batch shell got TERM", func() (bool, string) {
			got := readFile(dir, "got")
			return strings.Contains(got, "batch TERM"), got
		})
		if got := readFile(dir, "got"); got != "task USR2\nbatch TERM\n" {
			t.Errorf("%s: what the job's processes got:\n%s\nwant the task USR2, the batch shell TERM, nothing else", s, got)
		}
		if out, _, _ := p.run(s, dir, "", nil, "squeue", "-h", "-o", "%T", "-j", id); strings.TrimSpace(out) != "RUNNING" {
			t.Errorf("%s: job %s after the signals: %q, want RUNNING", s, id, out)
		}
		_, errOut, code := p.run(s, dir, "", nil, "scancel", "--signal=FOO", id)
		bad[i] = fmt.Sprintf("exit %d: %s", code, errOut)
		if _, errOut, code := p.run(s, dir, "", nil, "scancel", id); code != 0 {
			t.Fatalf("%s scancel: exit %d %s", s, code, errOut)
		}
		if st := p.waitEnd(s, id, time.Minute); st != "CANCELLED" {
			t.Errorf("%s: job %s ended %s, want CANCELLED", s, id, st)
		}
	}
	if bad[0] != bad[1] || bad[0] != "exit 1: Unknown job signal: FOO\n" {
		t.Errorf("scancel --signal=FOO: slurm %q, gangrun %q", bad[0], bad[1])
	}
}
