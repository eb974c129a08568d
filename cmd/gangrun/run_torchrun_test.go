package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestTorchrunOptionsRefused: what gangrun cannot honour of torchrun's command line is
// refused in one line naming it, exit 2, nothing started.
func TestTorchrunOptionsRefused(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "train.py")
	marker := filepath.Join(dir, "started")
	if err := os.WriteFile(script, []byte("open("+"'"+marker+"'"+", 'w').close()\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(flags ...string) []string { return append(append([]string{"run"}, flags...), script) }
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string // the whole stderr, one line
	}{
		{"logs specs", run("--logs-specs", "mine"), nil, "gangrun run: --logs-specs: a LogsSpecs plugin is Python run inside torchrun; gangrun writes the logs itself (--log-dir, --redirects, --tee)"},
		{"print completion", []string{"run", "--print-completion", "bash"}, nil, "gangrun run: --print-completion: gangrun prints no shell completion script (torchrun's comes from its argparse parser)"},
		{"duplicate filters", run("--duplicate_stdout_filters", "loss"), nil, "gangrun run: --duplicate-stdout-filters, --duplicate-stderr-filters: gangrun copies no filtered lines to another file; grep the --log-dir files"},
		{"etcd", run("--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "h:2379"), nil, "gangrun run: --rdzv-backend etcd-v2: gangrun speaks no etcd; give --rdzv-backend c10d --rdzv-endpoint HOST:PORT, or --coordinator consul://HOST:PORT"},
		{"unknown backend", run("--rdzv_backend=zk"), nil, `gangrun run: --rdzv-backend "zk": want static or c10d`},
		{"c10d without an endpoint", run("--rdzv-backend", "c10d"), nil, "gangrun run: --rdzv-backend c10d needs --rdzv-endpoint HOST[:PORT]"},
		{"c10d keep-alives", run("--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-conf", "keep_alive_interval=1"), nil,
			"gangrun run: rdzv-conf keep_alive_interval: cannot be honoured: a node is judged alive by its session with the endpoint (renewed every 10 s, gone 20 s to 40 s after its last renewal), not by torch's keep-alives"},
		{"c10d and consul", run("--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "--coordinator", "consul://127.0.0.1:8500"), nil,
			"gangrun run: --rdzv-backend c10d with --coordinator consul://127.0.0.1:8500: give one (c10d serves the rendezvous from the node at --rdzv-endpoint)"},
		{"c10d bad port", run("--rdzv-backend", "c10d", "--rdzv-endpoint", "h:99999"), nil, `gangrun run: --rdzv-endpoint "h:99999": port "99999": want 0..65535`},
		{"static, a range of nodes", run("--nnodes", "1:2", "--node-rank", "1", "--master-addr", "10.0.0.1"), nil,
			"gangrun run: --nnodes 1:2: torchrun's static rendezvous has a fixed number of nodes (give --rdzv-backend c10d for a range)"},
		{"static, node rank 0 elsewhere", run("--nnodes", "2", "--node-rank", "0", "--master-addr", "192.0.2.7"), nil,
			"gangrun run: --master-addr 192.0.2.7 with --node-rank 0: node rank 0 serves the workers' store at the master address, and 192.0.2.7 is not this machine"},
		{"static, node rank too high", run("--nnodes", "2", "--node-rank", "2"), nil, "gangrun run: --node-rank 2: want 0..1 (--nnodes 2)"},
		{"node rank on one node", run("--node_rank", "1"), nil, "gangrun run: --node-rank 1 on one node: want 0"},
		{"master elsewhere on one node", run("--master-addr", "192.0.2.7"), nil, "gangrun run: --master-addr 192.0.2.7 on one node: not an address or name of this machine (node rank 0's is this one)"},
		{"standalone on two nodes", run("--standalone", "--nnodes", "2"), nil, "gangrun run: --standalone with --nnodes 2: a standalone rendezvous has one node"},
		{"standalone and an endpoint", run("--standalone", "--rdzv-endpoint", "h:1"), nil, "gangrun run: --standalone with --rdzv-endpoint: a standalone rendezvous is its own (torchrun ignores yours); give one or the other"},
		{"rdzv id with a slash", run("--rdzv-id", "a/b"), nil, `gangrun run: --rdzv-id "a/b": only letters, digits, '-', '_' and '.' are allowed (it names the job's keys and directories)`},
		{"rdzv id and job id", run("--rdzv-id", "a", "--job-id", "b"), nil, "gangrun run: --rdzv-id a and --job-id b: give one"},
		{"numa node", run("--numa-binding", "node"), nil, "gangrun run: --numa-binding node: gangrun binds a worker to a fair share of its GPU's NUMA node CPUs (exclusive), not to the whole node, socket or core complex"},
		{"numa unknown", run("--numa-binding", "all"), nil, `gangrun run: --numa-binding "all": want node, socket, exclusive or core-complex (gangrun honours exclusive)`},
		{"signals", run("--signals-to-handle", "SIGTERM,SIGUSR1"), nil, `gangrun run: --signals-to-handle SIGTERM,SIGUSR1: gangrun stops the workers on SIGTERM, SIGINT, SIGHUP and SIGQUIT and forwards SIGUSR1 and SIGUSR2 without stopping them; "SIGUSR1" cannot be made to stop them`},
		{"start method", run("--start-method", "thread"), nil, `gangrun run: --start-method "thread": want spawn, fork or forkserver`},
		{"event log handler", run("--event-log-handler", "scuba"), nil, `gangrun run: --event-log-handler "scuba": gangrun has null and console (its own log lines); no other handler is registered`},
		{"monitor interval", run("--monitor-interval", "0"), nil, `gangrun run: --monitor-interval "0": want a number of seconds above 0`},
		{"module and no python", run("-m", "--no-python"), nil, "gangrun run: don't use both the --no-python flag and the --module flag at the same time (as torchrun refuses them)"},
		{"run path relative", []string{"run", "--run-path", "train.py"}, nil, "gangrun run: --run-path train.py: torchrun runs the script by its absolute path; give /abs/path/train.py"},
		{"tee out of range", run("--tee=4"), nil, `gangrun run: --tee "4": want true or false, or torchrun's 0 (none), 1 (stdout), 2 (stderr), 3 (both) or LOCAL_RANK:N pairs such as 0:1,1:2`},
		{"redirects out of range", run("-r", "5"), nil, `gangrun run: --redirects "5": want 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or LOCAL_RANK:N pairs such as 0:1,1:2`},
		{"ranks filter", run("--local-ranks-filter", "a"), nil, `gangrun run: --local-ranks-filter "a": want local ranks joined by commas, such as 0,1,2`},
		{"python after --", []string{"run", "--python", "/usr/bin/python3", "--", "/bin/true"}, nil, "gangrun run: --python /usr/bin/python3: it runs a script given without -- (torchrun's form); after -- the command runs as given"},
		{"xpu", run("--nproc-per-node", "xpu"), nil, "gangrun run: --nproc-per-node xpu: gangrun counts NVIDIA GPUs and CPUs only (N, auto, gpu or cpu)"},
		{"ambiguous prefix", run("--no", "1"), nil, "gangrun run: --no is ambiguous: it could be --no-python, --no-restart-exit-code, --node-name, --node-rank"},
		{"shutdown timeout negative", run("--shutdown-timeout", "-1"), nil, "gangrun run: --shutdown-timeout -1: want 0 to 86400 seconds"},
		{"shutdown and term timeouts", run("--shutdown-timeout", "5", "--term-timeout", "5s"), nil, "gangrun run: --shutdown-timeout and --term-timeout: give one"},
		{"virtual local rank beyond the devices", run("--virtual-local-rank", "--nproc-per-node", "2"), map[string]string{"CUDA_VISIBLE_DEVICES": "3"}, ""},
		{"shutdown timeout from the environment", run(), map[string]string{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "soon"}, `gangrun run: TORCH_ELASTIC_SHUTDOWN_TIMEOUT="soon": want whole seconds`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			e := &env{stdout: &stdout, stderr: &stderr, getenv: os.Getenv, stdin: strings.NewReader("")}
			code := dispatch(context.Background(), e, tc.args)
			got := strings.TrimSuffix(stderr.String(), "\n")
			switch tc.name {
			case "virtual local rank beyond the devices":
				// Refused at Prepare (the device list is known there); with no GPU
				// here the user's CUDA_VISIBLE_DEVICES is what the workers see.
				tc.want = "gangrun run: --virtual-local-rank with 2 workers: CUDA_VISIBLE_DEVICES names 1 devices, one for each local rank is needed"
			}
			if code != exitUsage {
				t.Errorf("exit %d, want 2", code)
			}
			if got != tc.want {
				t.Errorf("stderr %q\nwant   %q", got, tc.want)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Error("a worker started")
			}
		})
	}
}

// TestExpandArgs: torchrun's spellings are rewritten as pflag reads gangrun's flags.
func TestExpandArgs(t *testing.T) {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	fs.SetNormalizeFunc(normalizeFlag)
	var g gangFlags
	var tr trainFlags
	var tf torchrunFlags
	g.register(fs)
	tr.register(fs)
	tf.register(fs)
	for _, c := range []struct{ in, want []string }{
		{[]string{"--nproc_per_node=2", "t.py", "--lr", "1"}, []string{"--nproc-per-node=2", "t.py", "--lr", "1"}},
		{[]string{"--nproc", "2", "t.py"}, []string{"--nproc-per-node", "2", "t.py"}},
		{[]string{"--max_restarts", "1", "--", "python3", "--nproc", "2"}, []string{"--max-restarts", "1", "--", "python3", "--nproc", "2"}},
		{[]string{"--tee", "3", "t.py"}, []string{"--tee=3", "t.py"}},
		{[]string{"--tee", "0:1,1:2", "t.py"}, []string{"--tee=0:1,1:2", "t.py"}},
		{[]string{"-t", "2", "t.py"}, []string{"--tee=2", "t.py"}},
		{[]string{"-t3", "t.py"}, []string{"--tee=3", "t.py"}},
		{[]string{"--tee", "t.py"}, []string{"--tee", "t.py"}},
		{[]string{"--tee", "--log-dir", "d", "--", "x"}, []string{"--tee", "--log-dir", "d", "--", "x"}},
		{[]string{"-r", "3", "-m", "pkg.train", "-x"}, []string{"-r", "3", "-m", "pkg.train", "-x"}},
		{[]string{"--standalone", "--rdzv_id", "j", "train.py"}, []string{"--standalone", "--rdzv-id", "j", "train.py"}},
		{[]string{"--unknown-flag", "x"}, []string{"--unknown-flag", "x"}},
		{[]string{"--help"}, []string{"--help"}},
		{[]string{"--he"}, []string{"--he"}},
		{[]string{"-h"}, []string{"-h"}},
	} {
		got, err := expandArgs(fs, c.in)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%q: %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

// TestTorchrunFormOptions: torchrun's launch and output options do what they do under
// torchrun: --redirects, --tee, --local-ranks-filter and --log-line-prefix-template
// route each local rank's streams; -m, --no-python and --run-path start the script as
// torchrun does; PET_* variables stand for options not given; --virtual-local-rank
// gives every worker LOCAL_RANK 0 and its own device.
func TestTorchrunFormOptions(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	write := func(name, text string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	streams := write("streams.py", "import os, sys\nr = os.environ['LOCAL_RANK']\nprint('out' + r, flush=True)\nprint('err' + r, file=sys.stderr, flush=True)\n", 0o644)
	show := write("show.py", "import os, sys\nprint('name', __name__, 'argv', sys.argv[1:], 'role', os.environ['ROLE_NAME'], 'local', os.environ['LOCAL_RANK'], 'rank', os.environ['RANK'], 'cuda', os.environ.get('CUDA_VISIBLE_DEVICES'), 'unbuffered', type(sys.stdout.buffer).__name__, flush=True)\n", 0o644)
	write("showmod.py", "exec(open("+"'"+show+"'"+").read())\n", 0o644)
	sh := write("run.sh", "#!/bin/sh\necho shell $RANK \"$@\"\n", 0o755)
	logs := filepath.Join(dir, "logs")

	t.Run("streams", func(t *testing.T) {
		res := runGangrun(t, []string{testMark(t)}, "run", "--python", py, "--nproc-per-node", "2", "--redirects", "0:1", "--tee", "1:2",
			"--local-ranks-filter", "0", "--log-line-prefix-template", "${role_name}${local_rank}|", "--role", "trainer", "--log-dir", logs, streams)
		if res.code != 0 {
			t.Fatalf("exit %d:\n%s", res.code, res.stderr)
		}
		// As torchrun's, the run's logs are in a directory of their own, named by its
		// run id (a UUID on one node).
		runs, _ := filepath.Glob(filepath.Join(logs, "*_*"))
		if len(runs) != 1 || !uuidRE.MatchString(strings.SplitN(filepath.Base(runs[0]), "_", 2)[0]) {
			t.Fatalf("log directory holds %v, want one <run id>_* directory", runs)
		}
		console := res.stdout + res.stderr
		if !strings.Contains(console, "trainer0|err0") || strings.Contains(console, "out0") || strings.Contains(console, "out1") || strings.Contains(console, "err1") {
			t.Errorf("console: want local rank 0's stderr alone, prefixed trainer0|:\n%s", console)
		}
		for _, f := range []struct {
			path string
			want string // "" : the file must not exist
		}{
			{"attempt_0/rank_0/stdout.log", "out0\n"}, {"attempt_0/rank_0/stderr.log", ""},
			{"attempt_0/rank_1/stdout.log", ""}, {"attempt_0/rank_1/stderr.log", "err1\n"},
		} {
			data, err := os.ReadFile(filepath.Join(runs[0], f.path))
			if f.want == "" && err == nil {
				t.Errorf("%s exists (%q): no stream goes there", f.path, data)
			}
			if f.want != "" && string(data) != f.want {
				t.Errorf("%s = %q, %v; want %q", f.path, data, err, f.want)
			}
		}
		// The same log directory again: a second run beside the first, as torchrun's.
		res = runGangrun(t, []string{testMark(t)}, "run", "--python", py, "--tee", "3", "--log-dir", logs, streams)
		if runs, _ := filepath.Glob(filepath.Join(logs, "*_*")); res.code != 0 || len(runs) != 2 {
			t.Errorf("a second run into the log directory: exit %d, %d run directories:\n%s", res.code, len(runs), res.stderr)
		}
	})
	t.Run("launch forms", func(t *testing.T) {
		mark := testMark(t)
		for _, c := range []struct {
			name string
			env  []string
			args []string
			want []string
		}{
			{"module", []string{"PYTHONPATH=" + dir}, []string{"--python", py, "-m", "showmod", "x"},
				[]string{"[rank0]: name __main__ argv ['x'] role default local 0 rank 0 cuda None unbuffered FileIO"}},
			{"no python", nil, []string{"--no-python", sh, "a"}, []string{"[rank0]: shell 0 a"}},
			{"run path", nil, []string{"--python", py, "--run-path", show, "y"},
				[]string{"[rank0]: name __main__ argv ['y'] role default local 0 rank 0 cuda None"}},
			{"PET variables", []string{"PET_NPROC_PER_NODE=2", "PET_ROLE=pet"}, []string{"--python", py, show},
				[]string{"[rank1]: name __main__ argv [] role pet local 1 rank 1"}},
			{"virtual local rank", nil, []string{"--python", py, "--nproc-per-node", "2", "--virtual-local-rank", show},
				[]string{"[rank0]: name __main__ argv [] role default local 0 rank 0 cuda 0", "[rank1]: name __main__ argv [] role default local 0 rank 1 cuda 1"}},
		} {
			res := runGangrun(t, append([]string{mark}, c.env...), append([]string{"run"}, c.args...)...)
			if res.code != 0 {
				t.Errorf("%s: exit %d:\n%s", c.name, res.code, res.stderr)
				continue
			}
			for _, w := range c.want {
				if !strings.Contains(res.stdout, w) {
					t.Errorf("%s: stdout lacks %q:\n%s", c.name, w, res.stdout)
				}
			}
		}
	})
}

// FuzzExpandArgs: any words given to run are rewritten without a panic, into no more
// words than given, and from a -- on the words are copied as they are.
func FuzzExpandArgs(f *testing.F) {
	for _, seed := range []string{"--nproc\x002\x00t.py", "--tee\x003", "-t", "-t3\x00x", "--help", "--\x00--tee", "-r", "--no", "--tee=\x00-m"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
		fs.SetNormalizeFunc(normalizeFlag)
		var g gangFlags
		var tr trainFlags
		var tf torchrunFlags
		g.register(fs)
		tr.register(fs)
		tf.register(fs)
		args := strings.Split(s, "\x00")
		out, err := expandArgs(fs, args)
		if err != nil {
			return
		}
		if len(out) > len(args) {
			t.Fatalf("%q → %q: more words", args, out)
		}
		if j := slices.Index(out, "--"); j >= 0 {
			tail := out[j:]
			if !slices.Equal(args[len(args)-len(tail):], tail) {
				t.Fatalf("%q → %q: the words from -- on were changed", args, out)
			}
		}
	})
}
