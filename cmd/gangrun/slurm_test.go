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
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/slurm"
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
	real := slurmtest.Start(t, slurmtest.Options{Nodes: nodes, GPUsPerNode: 8, Partition: "gpu"})
	gr := startJobClusterWith(t, func(string) []string { return []string{"--labels", "partition=gpu"} }, nodes...)
	links := t.TempDir()
	for _, n := range slurm.Names() {
		if err := os.Symlink(gangrunBin, filepath.Join(links, n)); err != nil {
			t.Fatal(err)
		}
	}
	return &slurmPair{t: t, real: real, gr: gr, links: links}
}

// side is one of the pair: "slurm" or "gangrun".
type side string

const (
	realSlurm side = "slurm"
	gangrun   side = "gangrun"
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
	if s == gangrun {
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
	dir = sharedDir(p.t)
	if err := os.WriteFile(filepath.Join(dir, "job.sh"), []byte(script), 0o755); err != nil {
		p.t.Fatal(err)
	}
	out, errOut, code := p.run(s, dir, "", extra, "sbatch", append(append([]string{"--parsable"}, args...), "job.sh")...)
	if code != 0 {
		p.t.Fatalf("%s: sbatch: exit %d: %s", s, code, errOut)
	}
	id = strings.TrimSpace(out)
	return dir, id, p.waitEnd(s, id, 2*time.Minute)
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
			gdir, gid, gstate := p.submit(gangrun, script, []string{"TUTORIAL_VAR=kept"})
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
		{"bad signal", []string{"--signal=B:FOO@10", "job.sh"}, ""},
		{"bad open mode", []string{"--open-mode=bad", "job.sh"}, ""},
		{"negative tasks", []string{"--ntasks=-1", "job.sh"}, ""},
		{"DOS line breaks", []string{"dos.sh"}, ""},
		{"no interpreter line", []string{"noshebang.sh"}, ""},
		{"missing script", []string{"missing.sh"}, ""},
		{"empty stdin", nil, ""},
		{"bad #SBATCH line", []string{"badline.sh"}, ""},
		{"wrap with arguments", []string{"--wrap", "true", "x"}, ""},
	}
	agree := 0
	for _, tc := range cases {
		stdin := tc.stdin
		if stdin == "accepted" {
			stdin = ""
		}
		rout, rerr, rcode := p.run(realSlurm, dir, stdin, nil, "sbatch", tc.args...)
		gout, gerr, gcode := p.run(gangrun, dir, stdin, nil, "sbatch", tc.args...)
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
	for _, opt := range []string{"--exclusive", "--qos=high", "--begin=now", "-w", "gpu-a"} {
		args := []string{opt, "job.sh"}
		if opt == "-w" {
			args = []string{"-w", "gpu-a", "job.sh"}
		} else if opt == "gpu-a" {
			continue
		}
		_, gerr, gcode := p.run(gangrun, dir, "", nil, "sbatch", args...)
		name := strings.TrimLeft(strings.SplitN(opt, "=", 2)[0], "-")
		if name == "w" {
			name = "nodelist"
		}
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
		g.dir, g.id, g.state = p.submit(gangrun, script, extra, args...)
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
		for i, s := range []side{realSlurm, gangrun} {
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
			for i, s := range []side{realSlurm, gangrun} {
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
		for i, s := range []side{realSlurm, gangrun} {
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
