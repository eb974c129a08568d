package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestBadInputs: each bad input is refused before anything starts with one line that
// names the bad value (quoted, so nothing raw reaches the terminal) and the exit code
// of its kind: 2 for usage, 126 for a command that cannot be executed. The lines are
// the bad inputs docs/run.md lists ("Flags") and docs/testing.md counts.
func TestBadInputs(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "started")
	touch := []string{"--", "/bin/sh", "-c", "touch " + marker}
	run := func(flags ...string) []string { return append(append([]string{"run"}, flags...), touch...) }
	plain := filepath.Join(dir, "train.py")
	if err := os.WriteFile(plain, []byte("print(1)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wrongShape := filepath.Join(dir, "inventory.json")
	if err := os.WriteFile(wrongShape, []byte(`{"schema_version": 1, "gpus": [{"index": 0, "nvlinks": "x"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	hangScript := filepath.Join(dir, "hang.sh")
	if err := os.WriteFile(hangScript, []byte("#!/bin/sh\n#GANGRUN --hang-timeout 1ns\ntouch "+marker+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	sbatchScript := filepath.Join(dir, "batch.sh")
	if err := os.WriteFile(sbatchScript, []byte("#!/bin/sh\n#SBATCH --gpus-per-node 1\n#GANGRUN --hang-timeout 5m\ntouch "+marker+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		code int
		want string // the whole stderr, one line
	}{
		// Durations: absurd values, and a hang timeout shorter than it can be checked.
		{"term timeout overflows", run("--term-timeout", "9999999h"), nil, 2, `gangrun run: --term-timeout "9999999h": must be a duration like 30s, 5m or 2h (at most 24h)`},
		{"term timeout over a day", run("--term-timeout", "25h"), nil, 2, `gangrun run: --term-timeout "25h": must be at most 24h`},
		{"term timeout negative", run("--term-timeout", "-1s"), nil, 2, `gangrun run: --term-timeout "-1s": must not be negative`},
		{"hang timeout overflows", run("--hang-timeout", "99999999999999h"), nil, 2, `gangrun run: --hang-timeout "99999999999999h": must be a duration like 30s, 5m or 2h (at most 10000h)`},
		{"hang timeout 1ns", run("--hang-timeout", "1ns"), nil, 2, `gangrun run: --hang-timeout "1ns": must be 0 (off) or at least 1s: it is checked every 100ms to 5s, so a shorter one cannot be honoured`},
		{"alloc wait overflows", []string{"alloc", "--wait", "9999999999h"}, nil, 2, `gangrun alloc: --wait "9999999999h": must be a duration like 30s, 5m or 2h (at most 10000h)`},
		{"restart backoff over a day", run("--restart-backoff", "2000000h"), nil, 2, `gangrun run: --restart-backoff "2000000h": want a duration such as 5s (0s for none, at most 24h) or exp`},
		{"max restarts absurd", run("--max-restarts", "99999999999"), nil, 2, `gangrun run: --max-restarts 99999999999: want 0 to 10000`},
		{"no-restart exit code out of range", run("--no-restart-exit-code", "256"), nil, 2, `gangrun run: --no-restart-exit-code 256: want 1..255, or 0 for none`},
		{"no-restart exit code negative", run("--no-restart-exit-code", "-1"), nil, 2, `gangrun run: --no-restart-exit-code -1: want 1..255, or 0 for none`},
		// submit's supervision flags are run's, refused alike (before anything is queued).
		{"submit hang timeout 1ns", []string{"submit", "--hang-timeout", "1ns", "--", "true"}, nil, 2, `gangrun submit: --hang-timeout "1ns": must be 0 (off) or at least 1s: it is checked every 100ms to 5s, so a shorter one cannot be honoured`},
		{"submit hang timeout on a #GANGRUN line", []string{"submit", hangScript}, nil, 2, `gangrun submit: --hang-timeout "1ns": must be 0 (off) or at least 1s: it is checked every 100ms to 5s, so a shorter one cannot be honoured`},
		{"submit restart backoff", []string{"submit", "--restart-backoff", "soon", "--", "true"}, nil, 2, `gangrun submit: --restart-backoff "soon": want a duration such as 5s (0s for none, at most 24h) or exp`},
		{"submit no-restart exit code out of range", []string{"submit", "--no-restart-exit-code", "256", "--", "true"}, nil, 2, `gangrun submit: --no-restart-exit-code 256: want 1..255, or 0 for none`},
		{"submit no-restart exit code negative", []string{"submit", "--no-restart-exit-code", "-1", "--", "true"}, nil, 2, `gangrun submit: --no-restart-exit-code -1: want 1..255, or 0 for none`},
		{"submit warm imports", []string{"submit", "--warm-imports", "no such;module", "--", "true"}, nil, 2, `gangrun submit: --warm-imports "no such;module": not a Python module name (dotted identifiers, as torch or torch.distributed)`},
		{"submit warm delay over a day", []string{"submit", "--warm-delay", "25h", "--", "true"}, nil, 2, `gangrun submit: --warm-delay "25h": must be at most 24h`},
		{"submit hang timeout in a Slurm batch script", []string{"submit", sbatchScript}, nil, 2, "gangrun submit: " + sbatchScript + `: --hang-timeout is a supervision option of gangrun's own jobs (gangrun submit without #SBATCH lines), which a Slurm batch script's batch step does not take (docs/slurm.md, "Gang supervision")`},
		{"integer overflows", run("--master-port", "99999999999999999999"), nil, 2, `gangrun run: --master-port "99999999999999999999": must be an integer`},
		// A topology file of the wrong shape, or not a file.
		{"topology of the wrong shape", run("--topology-file", wrongShape), nil, 2,
			`gangrun run: --topology-file ` + wrongShape + `: invalid JSON at line 1, column 59: field "gpus[0].nvlinks": want an array, got a string`},
		{"topology a FIFO", []string{"topo", "--topology-file", fifo}, nil, 2, "gangrun topo: --topology-file " + fifo + ": is a named pipe (FIFO), want a regular file"},
		{"checkpoint dir a FIFO", run("--checkpoint-dir", fifo), nil, 2, "gangrun run: --checkpoint-dir " + fifo + ": is a named pipe (FIFO), want a directory"},
		{"bench parse a FIFO", []string{"bench", "parse", fifo}, nil, 2, "gangrun bench parse: " + fifo + ": is a named pipe (FIFO), want a regular file"},
		// Log directories that cannot be written.
		{"log dir in /proc", run("--log-dir", "/proc/1"), nil, 2, "gangrun run: --log-dir /proc/1: cannot be written: /proc/1 is in the kernel's proc file system, where no files can be created"},
		// Commands that cannot be executed.
		{"command a directory", []string{"run", "--", "/tmp"}, nil, 126, "gangrun run: /tmp: is a directory, not a command"},
		{"command not executable", []string{"run", "--", plain}, nil, 126, "gangrun run: " + plain + ": is not executable (no execute permission)"},
		{"command missing", []string{"run", "--", "/nonexistent/train"}, nil, 127, "gangrun run: command not found: /nonexistent/train"},
		// Consul addresses.
		{"CONSUL_HTTP_ADDR malformed", []string{"nodes"}, map[string]string{"CONSUL_HTTP_ADDR": "127.0.0.1;8500"}, 2,
			`gangrun nodes: CONSUL_HTTP_ADDR "127.0.0.1;8500": host "127.0.0.1;8500": want an IP address or a host name (letters, digits, '-', '.')`},
		{"CONSUL_HTTP_ADDR with two ports", []string{"queue"}, map[string]string{"CONSUL_HTTP_ADDR": "127.0.0.1:8500:1"}, 2,
			`gangrun queue: CONSUL_HTTP_ADDR "127.0.0.1:8500:1": want HOST:PORT, http://HOST:PORT, https://HOST:PORT or unix://PATH`},
		{"CONSUL_HTTP_ADDR not an IP", run("--coordinator", "consul://", "--job-id", "j"), map[string]string{"CONSUL_HTTP_ADDR": "10.0.0.1.8500"}, 2,
			`gangrun run: CONSUL_HTTP_ADDR "10.0.0.1.8500": host "10.0.0.1.8500": not an IP address (four numbers 0-255) nor a host name (its last label is all digits)`},
		{"--consul not an IP", []string{"nodes", "--consul", "1.2.3.4.5:8500"}, nil, 2,
			`gangrun nodes: --consul "1.2.3.4.5:8500": host "1.2.3.4.5": not an IP address (four numbers 0-255) nor a host name (its last label is all digits)`},
		// Control and format characters.
		{"labels with a newline", []string{"alloc", "--labels", "rack=a\nb"}, nil, 2, `gangrun alloc: --labels "rack=a\nb": holds the invisible character U+000A (newline): only printable text is allowed`},
		{"labels with RLO", []string{"agent", "--node-name", "n", "--labels", "rack=\u202e1"}, nil, 2, `gangrun agent: --labels "rack=\u202e1": holds the invisible character U+202E (right-to-left override): only printable text is allowed`},
		{"label given twice", []string{"alloc", "--labels", "rack=a", "--labels", "rack=b"}, nil, 2, `gangrun alloc: --labels: label "rack" given twice ("rack=a" and "rack=b")`},
		{"hostlist with RLO", []string{"hostlist", "expand", "n\u202e1"}, nil, 2, `gangrun hostlist expand: hostlist: invisible format character U+202E "\u202e" at column 2 of "n\u202e1"`},
		{"nodelist with an escape", []string{"hostlist", "expand"}, map[string]string{"SLURM_JOB_NODELIST": "n[1-2]\x1b[2J"}, 2,
			`gangrun hostlist expand: hostlist: control character U+001B "\x1b" at column 7 of "n[1-2]\x1b[2J"`},
		{"node name with a tab", run("--node-name", "my\tnode"), nil, 2, `gangrun run: --node-name "my\tnode": only letters, digits, '-', '_' and '.' are allowed`},
		{"log dir with an escape", run("--log-dir", "/proc/x\x1b[2J"), nil, 2,
			`gangrun run: --log-dir /proc/x\u001b[2J: cannot be created: /proc is in the kernel's proc file system, where no files can be created`},
		// Empty values, and arguments to commands that take none.
		{"checkpoint dir empty", run("--checkpoint-dir", ""), nil, 2, `gangrun run: --checkpoint-dir "": must not be empty`},
		{"log dir empty", run("--log-dir", ""), nil, 2, `gangrun run: --log-dir "": must not be empty`},
		{"node name empty", []string{"agent", "--node-name", ""}, nil, 2, `gangrun agent: --node-name "": must not be empty`},
		{"env empty", run("--env", ""), nil, 2, `gangrun run: --env "": want KEY=VALUE`},
		{"env given twice", run("--env", "A=1", "--env", "A=2"), nil, 2, `gangrun run: --env A given twice ("A=1" and "A=2"): give each variable once`},
		{"hostlist expand empty", []string{"hostlist", "expand", ""}, nil, 2, `gangrun hostlist expand: argument 1 "" is empty: want a hostlist expression such as node[01-04]`},
		{"version flag", []string{"version", "--bogus"}, nil, 2, "gangrun version: unknown flag: --bogus"},
		// sbatch's names for submit's and alloc's options get gangrun's (a Slurm user's habit).
		{"submit --job-name", []string{"submit", "--job-name", "x", "--", "true"}, nil, 2, "gangrun submit: unknown flag: --job-name; sbatch's option; gangrun's is --name"},
		{"submit -N", []string{"submit", "-N", "2", "--", "true"}, nil, 2, "gangrun submit: unknown shorthand flag: 'N' in -N; sbatch's option; gangrun's is --nodes"},
		{"alloc --gres", []string{"alloc", "--gres=gpu:1"}, nil, 2, "gangrun alloc: unknown flag: --gres; sbatch's option; gangrun's is --gpus-per-node [TYPE:]COUNT"},
		{"submit unknown flag", []string{"submit", "--bogus", "--", "true"}, nil, 2, "gangrun submit: unknown flag: --bogus"},
		{"version argument", []string{"version", "now"}, nil, 2, `gangrun version: unexpected argument "now": version takes none`},
		{"slurm-links missing directory", []string{"slurm-links", filepath.Join(dir, "nope")}, nil, 2, "gangrun slurm-links: " + filepath.Join(dir, "nope") + ": no such directory (make it first, as ln needs)"},
		{"slurm-links file", []string{"slurm-links", plain}, nil, 2, "gangrun slurm-links: " + plain + ": not a directory"},
		{"nodes argument", []string{"nodes", "gpu-a"}, nil, 2, `gangrun nodes: unexpected argument "gpu-a": nodes takes flags only`},
		{"queue argument", []string{"queue", "abc"}, nil, 2, `gangrun queue: unexpected argument "abc": queue takes flags only (gangrun show ID shows one)`},
		{"cancel malformed id", []string{"cancel", "../x"}, nil, 2, `gangrun cancel: id "../x": only letters, digits, '-', '_' and '.' are allowed`},
		{"acl user bad name", []string{"acl", "user", "a.b"}, nil, 2, `gangrun acl: user "a.b": want 1 to 64 letters, digits, '_' and '-' (not first), as Consul's policy names take`},
		{"acl user of digits", []string{"acl", "user", "0"}, nil, 2, `gangrun acl: user "0": a name of digits only would be taken for a uid by the nodes (the jobs of a token's user run as that Unix user)`},
		{"acl user root", []string{"acl", "user", "root"}, nil, 2, `gangrun acl: user "root": a token's jobs run as its user on every node, and gangrun mints none for root (root submits as itself, on a node)`},
		{"acl unknown verb", []string{"acl", "mint"}, nil, 2, `gangrun acl: want bootstrap, user NAME or whoami (got ["mint"])`},
		{"audit bad since", []string{"audit", "--since", "yesterday"}, nil, 2, `gangrun audit: --since "yesterday": want a date YYYY-MM-DD[THH:MM[:SS]] (UTC) or a time ago such as 90m, 36h or 7d`},
		{"audit user with an escape", []string{"audit", "--user", "a\x1b[2J"}, nil, 2, `gangrun audit: --user "a\x1b[2J": only letters, digits, '-', '_' and '.' are allowed`},
		{"bench iters absurd", []string{"bench", "nccl", "--iters", "99999999999"}, nil, 2, "gangrun bench nccl: --iters 99999999999: want 1 to 1000000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			e := &env{stdout: &stdout, stderr: &stderr, getenv: os.Getenv, stdin: strings.NewReader("")}
			code := dispatch(context.Background(), e, tc.args)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			if got := strings.TrimSuffix(stderr.String(), "\n"); got != tc.want {
				t.Errorf("stderr %q\nwant   %q", got, tc.want)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Error("a worker started")
			}
		})
	}
}
