package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/torchtest"
	"github.com/gangrun/gangrun/rendezvous"
)

// dumpScript is the worker of the environment comparison: it records its environment
// and how it was started (argv, interpreter, whether -u made stdout unbuffered, the
// error file's directory and absence) in OUT/<GROUP_RANK>-<RANK>-<restart count>.json,
// and, with FAIL_FIRST set, rank 1 of the first attempt raises under torch's @record
// (which writes TORCHELASTIC_ERROR_FILE for the launcher to read).
const dumpScript = `import json, os, sys
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    ef = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
    out = {"env": dict(os.environ), "argv": sys.argv, "executable": sys.executable,
           "stdout_raw": type(sys.stdout.buffer).__name__,
           "error_dir_exists": os.path.isdir(os.path.dirname(ef)),
           "error_file_absent": ef != "" and not os.path.exists(ef)}
    rc = os.environ["TORCHELASTIC_RESTART_COUNT"]
    name = "%s-%s-%s.json" % (os.environ["GROUP_RANK"], os.environ["RANK"], rc)
    with open(os.path.join(sys.argv[1], name), "w") as f:
        json.dump(out, f)
    if os.environ.get("FAIL_FIRST") and rc == "0" and os.environ["RANK"] == "1":
        raise RuntimeError("injected failure of rank 1")

main()
`

// workerDump is one worker's record.
type workerDump struct {
	Env             map[string]string `json:"env"`
	Argv            []string          `json:"argv"`
	Executable      string            `json:"executable"`
	StdoutRaw       string            `json:"stdout_raw"`
	ErrorDirExists  bool              `json:"error_dir_exists"`
	ErrorFileAbsent bool              `json:"error_file_absent"`
}

// runLaunchers runs one launcher command per node concurrently (bin is torchrun or
// gangrun; env the parent environment) and returns the dumps by file name, with the
// launchers' combined output.
func runLaunchers(t *testing.T, bin string, env []string, nodes [][]string) (map[string]workerDump, string) {
	t.Helper()
	out := t.TempDir()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var logs bytes.Buffer
	for i, args := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			argv := append(append([]string{}, args...), out)
			if bin == gangrunBin {
				argv = append([]string{"run"}, argv...) // alias torchrun='gangrun run'
			}
			cmd := exec.CommandContext(ctx, bin, argv...)
			cmd.Env = env
			b, err := cmd.CombinedOutput()
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(&logs, "--- %s node %d: %v\n%s", filepath.Base(bin), i, err, b)
			if err != nil {
				t.Errorf("%s %v: %v", filepath.Base(bin), args, err)
			}
		}()
	}
	wg.Wait()
	dumps := map[string]workerDump{}
	files, _ := filepath.Glob(filepath.Join(out, "*.json"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d workerDump
		if err := json.Unmarshal(data, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		dumps[filepath.Base(f)] = d
	}
	return dumps, logs.String()
}

// uuidRE is a version-4 UUID, torchrun's run id for a one-node job without --rdzv-id.
var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// compareWorkerEnv asserts that gangrun's workers got every variable torchrun's got, with
// the same value, rank by rank and attempt by attempt (files of the same name), except
// where the value cannot be the same: MASTER_ADDR names this machine in both, MASTER_PORT
// is a port one launcher picked (the same for every rank of an attempt),
// TORCHELASTIC_ERROR_FILE is an error.json in a directory that exists while the file
// does not, and a one-node TORCHELASTIC_RUN_ID is a fresh UUID in both. The workers ran
// the same interpreter, -u, with the same argv.
func compareWorkerEnv(t *testing.T, parent []string, torch, gang map[string]workerDump) {
	t.Helper()
	inherited := map[string]string{}
	for _, kv := range parent {
		k, v, _ := strings.Cut(kv, "=")
		inherited[k] = v
	}
	var names []string
	for name := range torch {
		names = append(names, name)
	}
	sort.Strings(names)
	if len(names) == 0 {
		t.Fatal("torchrun's workers recorded nothing")
	}
	var compared []string
	ports := map[string]map[string]bool{} // launcher → attempt's ports
	for _, name := range names {
		tw := torch[name]
		gw, ok := gang[name]
		if !ok {
			t.Errorf("%s: torchrun's worker recorded it, gangrun's did not", name)
			continue
		}
		for k, tv := range tw.Env {
			if old, ok := inherited[k]; ok && old == tv {
				continue // inherited, not torchrun's
			}
			gv, ok := gw.Env[k]
			if !ok {
				t.Errorf("%s: torchrun gives %s=%q, gangrun gives none", name, k, tv)
				continue
			}
			compared = append(compared, k)
			switch k {
			case "MASTER_ADDR":
				if !rendezvous.IsLocalHost(tv) || !rendezvous.IsLocalHost(gv) {
					t.Errorf("%s: MASTER_ADDR torchrun %q, gangrun %q: want addresses of this machine", name, tv, gv)
				}
			case "MASTER_PORT":
				for who, v := range map[string]string{"torchrun": tv, "gangrun": gv} {
					if p, err := strconv.Atoi(v); err != nil || p <= 0 || p > 65535 {
						t.Errorf("%s: %s's MASTER_PORT %q", name, who, v)
					}
					key := who + strings.SplitN(name, "-", 3)[2]
					if ports[key] == nil {
						ports[key] = map[string]bool{}
					}
					ports[key][v] = true
				}
			case "TORCHELASTIC_ERROR_FILE":
				for who, w := range map[string]workerDump{"torchrun": tw, "gangrun": gw} {
					if filepath.Base(w.Env[k]) != "error.json" || !w.ErrorDirExists || !w.ErrorFileAbsent {
						t.Errorf("%s: %s's error file %q: want error.json in an existing directory, absent at start (dir %v, absent %v)",
							name, who, w.Env[k], w.ErrorDirExists, w.ErrorFileAbsent)
					}
				}
			case "TORCHELASTIC_RUN_ID":
				if tv != gv && !(uuidRE.MatchString(tv) && uuidRE.MatchString(gv)) {
					t.Errorf("%s: TORCHELASTIC_RUN_ID torchrun %q, gangrun %q", name, tv, gv)
				}
			default:
				if tv != gv {
					t.Errorf("%s: %s torchrun %q, gangrun %q", name, k, tv, gv)
				}
			}
		}
		// The last argument is each launcher's own output directory.
		if tw.Executable != gw.Executable || tw.StdoutRaw != gw.StdoutRaw || len(tw.Argv) != len(gw.Argv) ||
			strings.Join(tw.Argv[:len(tw.Argv)-1], " ") != strings.Join(gw.Argv[:len(gw.Argv)-1], " ") {
			t.Errorf("%s: torchrun ran %s (stdout %s) %q, gangrun %s (stdout %s) %q", name, tw.Executable, tw.StdoutRaw, tw.Argv,
				gw.Executable, gw.StdoutRaw, gw.Argv)
		}
	}
	for name := range gang {
		if _, ok := torch[name]; !ok {
			t.Errorf("%s: gangrun's worker recorded it, torchrun's did not", name)
		}
	}
	for key, ps := range ports {
		if len(ps) != 1 {
			t.Errorf("%s: MASTER_PORT differs between the ranks of one attempt: %v", key, ps)
		}
	}
	sort.Strings(compared)
	t.Logf("compared: %s", strings.Join(slicesCompact(compared), " "))
}

func slicesCompact(s []string) []string {
	var out []string
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// TestWorkerEnvMatchesTorchrun: the same command line run by torchrun 2.x and by
// `gangrun run` (torchrun's form: `alias torchrun='gangrun run'`) gives the workers the
// same environment: every variable torchrun gives (sizes, ranks, role, restart count,
// max restarts, TORCHELASTIC_USE_AGENT_STORE, the signals, the error file's contract)
// with torchrun's value. On one node with a failure and a restart, and on two nodes of
// this machine meeting at a c10d endpoint.
func TestWorkerEnvMatchesTorchrun(t *testing.T) {
	py := torchtest.PyPI(t)
	torchrun := filepath.Join(py.Bin, "torchrun")
	dir := t.TempDir()
	script := filepath.Join(dir, "dump.py")
	if err := os.WriteFile(script, []byte(dumpScript), 0o644); err != nil {
		t.Fatal(err)
	}
	var parent []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "PATH" || k == "OMP_NUM_THREADS" || strings.HasPrefix(k, "PET_") || strings.HasPrefix(k, "TORCHELASTIC_") || k == "PYTHON_EXEC" {
			continue
		}
		parent = append(parent, kv)
	}
	// The interpreter on PATH is torch 2.x's, as for a user who activated its venv.
	parent = append(parent, "PATH="+py.Bin+":"+os.Getenv("PATH"))
	t.Run("one node", func(t *testing.T) {
		env := append(append([]string{}, parent...), testMark(t), "FAIL_FIRST=1")
		args := []string{"--nproc-per-node", "2", "--max-restarts", "1", "--role", "trainer", script}
		torch, tlog := runLaunchers(t, torchrun, env, [][]string{args})
		gang, glog := runLaunchers(t, gangrunBin, env, [][]string{args})
		if len(torch) != 4 {
			t.Fatalf("torchrun's workers wrote %d records, want 4 (2 ranks, 2 attempts):\n%s", len(torch), tlog)
		}
		compareWorkerEnv(t, env, torch, gang)
		if !strings.Contains(glog, "injected failure of rank 1") || !strings.Contains(tlog, "injected failure of rank 1") {
			t.Errorf("the error file's message did not reach both launchers' reports:\n%s\n%s", tlog, glog)
		}
	})
	t.Run("two nodes", func(t *testing.T) {
		env := append(append([]string{}, parent...), testMark(t))
		port := func() string { return strconv.Itoa(freePort(t)) }
		node := func(p string) []string {
			return []string{"--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "1", "--rdzv-backend", "c10d",
				"--rdzv-endpoint", "127.0.0.1:" + p, "--rdzv-id", "cmp2", script}
		}
		tp, gp := port(), port()
		torch, tlog := runLaunchers(t, torchrun, env, [][]string{node(tp), node(tp)})
		gang, glog := runLaunchers(t, gangrunBin, env, [][]string{node(gp), node(gp)})
		if len(torch) != 4 || len(gang) != 4 {
			t.Fatalf("records: torchrun %d, gangrun %d, want 4 each:\n%s\n%s", len(torch), len(gang), tlog, glog)
		}
		compareWorkerEnv(t, env, torch, gang)
	})
}

// TestTorchrunDocExamples: with `alias torchrun='gangrun run'`, torchrun's own
// documented examples (torch/distributed/run.py's module docstring, "Usage") run
// unchanged on torch 2.x: single-node multi-worker (--standalone), stacked single-node
// (c10d on localhost:0), fault tolerant on two nodes (c10d endpoint, --max-restarts=3,
// a worker failing once) and elastic on two nodes (--nnodes=1:4), and the static
// rendezvous of its note (--node-rank, --master-addr, --master-port), the two nodes
// being two processes of this machine.
func TestTorchrunDocExamples(t *testing.T) {
	py := torchtest.PyPI(t)
	script := filepath.Join(repoRoot(t), "scripts", "examples", "train_ddp.py")
	port, port2 := freePort(t), freePort(t)
	vars := []string{"PATH=" + py.Bin + ":" + os.Getenv("PATH"), "NUM_TRAINERS=2", "JOB_ID=doc-example",
		"HOST_NODE_ADDR=127.0.0.1:" + strconv.Itoa(port), "YOUR_TRAINING_SCRIPT=" + script, "MASTER_PORT_ARG=" + strconv.Itoa(port2)}
	bash := func(t *testing.T, line string, nodes int) []string {
		t.Helper()
		env := append(append(os.Environ(), vars...), testMark(t))
		outs := make([]string, nodes)
		var wg sync.WaitGroup
		for i := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
				defer cancel()
				cmd := exec.CommandContext(ctx, "bash", "-c", "shopt -s expand_aliases\nalias torchrun='"+gangrunBin+" run'\n"+line)
				cmd.Env = append(slices.Clip(env), "NODE_RANK_ARG="+strconv.Itoa(i)) // a copy per node
				b, err := cmd.CombinedOutput()
				outs[i] = string(b)
				if err != nil {
					t.Errorf("node %d: %v\n%s", i, err, b)
				}
			}()
		}
		wg.Wait()
		return outs
	}
	for _, c := range []struct {
		name, line string
		nodes      int
		want       []string // in the nodes' output
	}{
		{"single-node multi-worker", `torchrun
    --standalone
    --nnodes=1
    --nproc-per-node=$NUM_TRAINERS
    $YOUR_TRAINING_SCRIPT --steps 20`, 1, []string{"[rank0]: training: world size 2", "[rank0]: finished at step 20"}},
		{"stacked single-node multi-worker", `torchrun
    --rdzv-backend=c10d
    --rdzv-endpoint=localhost:0
    --nnodes=1
    --nproc-per-node=$NUM_TRAINERS
    $YOUR_TRAINING_SCRIPT --steps 20`, 1, []string{"[rank0]: training: world size 2", "[rank0]: finished at step 20"}},
		{"fault tolerant", `torchrun
    --nnodes=2
    --nproc-per-node=$NUM_TRAINERS
    --max-restarts=3
    --rdzv-id=$JOB_ID
    --rdzv-backend=c10d
    --rdzv-endpoint=$HOST_NODE_ADDR
    $YOUR_TRAINING_SCRIPT --steps 30 --fail-at-step 10`, 2, []string{"world size 4", "restarting the gang", "finished at step 30"}},
		{"elastic", `torchrun
    --nnodes=1:4
    --nproc-per-node=$NUM_TRAINERS
    --max-restarts=3
    --rdzv-id=$JOB_ID
    --rdzv-backend=c10d
    --rdzv-endpoint=$HOST_NODE_ADDR
    $YOUR_TRAINING_SCRIPT --steps 20`, 2, []string{"finished at step 20"}},
		// Not in the docstring's Usage, but its note on rendezvous: the static backend,
		// torch.distributed.launch's legacy form, each node given its rank.
		{"static", `torchrun
    --nnodes=2
    --node-rank=$NODE_RANK_ARG
    --master-addr=127.0.0.1
    --master-port=$MASTER_PORT_ARG
    --nproc-per-node=$NUM_TRAINERS
    $YOUR_TRAINING_SCRIPT --steps 20`, 2, []string{"world size 4", "finished at step 20"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The docstring's lines, joined as a shell reads them.
			line := strings.ReplaceAll(c.line, "\n    ", " \\\n    ")
			outs := bash(t, line, c.nodes)
			all := strings.Join(outs, "\n")
			for _, w := range c.want {
				if !strings.Contains(all, w) {
					t.Errorf("the output lacks %q:\n%s", w, all)
				}
			}
			if c.nodes == 2 && c.name != "static" && !strings.Contains(outs[0]+outs[1], "serving the c10d rendezvous endpoint") {
				t.Errorf("no node served the endpoint:\n%s\n%s", outs[0], outs[1])
			}
		})
	}
}
