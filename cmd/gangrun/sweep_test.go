package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
)

// The bad-input sweep (issue 26): every command, hundreds of bad inputs (special files
// where a file or a directory is expected, links planted in a checkpoint directory,
// huge and out-of-range values, malformed documents and scripts, Consul down), each
// run as a process under a timeout, and each outcome put in one class:
//
//	hang     the command did not end within its timeout (it is killed, with its group)
//	damage   a file outside what the command was given changed, or its own input
//	accepted a bad input exited 0 without a word (or started the command)
//	unclear  refused, but not in one line naming the value (the last line of stderr
//	         must begin "gangrun CMD:", hold the value or what the case names, be at
//	         most 600 bytes, say no cause twice and use none of Go's words)
//	ok       refused clearly; or, for the valid edge cases run as controls, done
//
// go test -run TestBadInputSweep ./cmd/gangrun/ runs it on the gangrun built for the
// tests and fails on any hang, damage, acceptance or unclear message; -sweep-bin PATH
// runs it on another build (an older one, to count before and after), and
// -sweep-report FILE writes the counts and every case's outcome there.
var (
	sweepBin    = flag.String("sweep-bin", "", "TestBadInputSweep: run this gangrun binary instead of the one built for the tests")
	sweepReport = flag.String("sweep-report", "", "TestBadInputSweep: write the counts and each case's outcome to this file")
)

// sweepWant is what a case expects.
type sweepWant int

const (
	// wantRefusal: exit 1 or 2 (or code), one clear line naming needle.
	wantRefusal sweepWant = iota
	// wantOK: a valid edge case, exit 0.
	wantOK
	// wantNote: accepted (exit 0), with a line on stderr holding needle: a value read
	// differently than it looks is said, not taken silently.
	wantNote
	// wantSafe: either a clear refusal or success; only hangs and damage count (a run
	// that goes on without pinning a checkpoint, with a warning, is both fine).
	wantSafe
)

type sweepCase struct {
	group, name string
	args        []string
	env         []string
	want        sweepWant
	// needle must appear in the message (the bad value, or a phrase naming it);
	// default: the case's last argument.
	needle string
	// code, when set, is the exit code a refusal must have.
	code int
	// setup prepares a fresh directory for a case that changes files; its return is
	// substituted for "{dir}" in args and env. outside is the case's own tree that
	// nothing may change (links may point into it).
	setup   func(t *testing.T, outside string) string
	timeout time.Duration
}

// sweepOutcome is one case's result.
type sweepOutcome struct {
	c      sweepCase
	class  string
	why    string
	code   int
	stderr string
}

// Go's words, and the remains of an unexplained library error: never in a message.
var goWords = []string{"Go struct", "cannot unmarshal", "unexpected EOF", "invalid character 'ï'", "Get \"http", "Put \"http",
	"Post \"http", "goroutine ", "panic:", "runtime error", "%!", "EOF"}

func TestBadInputSweep(t *testing.T) {
	bin := gangrunBin
	if *sweepBin != "" {
		bin = *sweepBin
	}
	consul := consultest.Start(t).Addr
	sweepAgent(t, consul)
	fx := newSweepFixtures(t)
	cases := sweepCases(t, fx, consul)
	outcomes := make([]sweepOutcome, len(cases))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			outcomes[i] = runSweepCase(t, bin, fx, c)
		}()
	}
	wg.Wait()
	if after := treeSnapshot(t, fx.outside); !sameSnapshot(fx.outsideSnap, after) {
		t.Errorf("damage: the sweep's shared outside tree changed")
	}
	counts := map[string]int{}
	byGroup := map[string]map[string]int{}
	var report strings.Builder
	bad, controls := 0, 0
	for _, o := range outcomes {
		counts[o.class]++
		if byGroup[o.c.group] == nil {
			byGroup[o.c.group] = map[string]int{}
		}
		byGroup[o.c.group][o.class]++
		if o.c.want == wantOK {
			controls++
		}
		fmt.Fprintf(&report, "%-8s %-14s %-60s exit %-3d %s\n", o.class, o.c.group, o.c.name, o.code, oneLine(lastLine(o.stderr)))
		if o.class != "ok" {
			bad++
			t.Errorf("%s: %s: %s: %s (exit %d)\n  stderr: %s", o.class, o.c.group, o.c.name, o.why, o.code, clipSweep(o.stderr))
		}
	}
	summary := fmt.Sprintf("%d inputs (%d bad, %d valid controls): %d hang, %d damage, %d accepted, %d unclear, %d ok",
		len(outcomes), len(outcomes)-controls, controls, counts["hang"], counts["damage"], counts["accepted"], counts["unclear"], counts["ok"])
	groups := make([]string, 0, len(byGroup))
	for g := range byGroup {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	var gl strings.Builder
	for _, g := range groups {
		fmt.Fprintf(&gl, "  %-14s %v\n", g, byGroup[g])
	}
	t.Logf("sweep of %s: %s\n%s", bin, summary, gl.String())
	if *sweepReport != "" {
		if err := os.WriteFile(*sweepReport, []byte(summary+"\n"+gl.String()+"\n"+report.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// sweepAgent registers one node (a recorded DGX A100) that never schedules: submit and
// alloc see a cluster, and nothing submitted runs. It checks no credentials (--auth
// none): with MUNGE, policy set and drain would wait for an elected agent to check
// who asks, and this cluster elects none.
func sweepAgent(t *testing.T, consul string) {
	t.Helper()
	inv := filepath.Join(repoRoot(t), "topology", "testdata", "inventories", "dgx-a100.json")
	cmd := exec.Command(gangrunBin, "agent", "--consul", consul, "--node-name", "n1", "--advertise-addr", "127.0.0.1",
		"--topology-file", inv, "--no-scheduler", "--auth", "none")
	cmd.Env = agentEnv()
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, _ := exec.Command(gangrunBin, "nodes", "--consul", consul).CombinedOutput()
		if bytes.Contains(out, []byte("n1")) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sweep's agent did not register: %s\n%s", out, log.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// lastLine returns the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.TrimSpace(lines[i]) != "" {
			return lines[i]
		}
	}
	return ""
}

func clipSweep(s string) string {
	if len(s) > 400 {
		return s[:400] + fmt.Sprintf("... (%d bytes)", len(s))
	}
	return s
}

// sweepFixtures are the files and directories the cases name.
type sweepFixtures struct {
	dir string
	// outside is a tree no case is given: it must never change.
	outside     string
	outsideSnap map[string]string
	// special files
	fifo, sock, subdir, zeroLink, fifoLink, loop, missing, empty, big, binary string
	goodTopo, goodPolicy, goodNCCL, goodScript                                string
	ckpt                                                                      string
	long                                                                      string // 100 KB of 'x'
}

func newSweepFixtures(t *testing.T) *sweepFixtures {
	d := t.TempDir()
	fx := &sweepFixtures{dir: d, long: strings.Repeat("x", 100<<10)}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	fx.outside = filepath.Join(d, "outside")
	for _, f := range []string{"precious.txt", "sub/deeper.txt", "step-9/model.pt"} {
		must(os.MkdirAll(filepath.Join(fx.outside, filepath.Dir(f)), 0o755))
		must(os.WriteFile(filepath.Join(fx.outside, f), []byte("keep "+f), 0o644))
	}
	fx.outsideSnap = treeSnapshot(t, fx.outside)
	fx.fifo = filepath.Join(d, "fifo")
	must(syscall.Mkfifo(fx.fifo, 0o644))
	fx.sock = filepath.Join(d, "sock")
	l, err := net.Listen("unix", fx.sock)
	must(err)
	t.Cleanup(func() { l.Close() })
	fx.subdir = filepath.Join(d, "subdir")
	must(os.Mkdir(fx.subdir, 0o755))
	fx.zeroLink = filepath.Join(d, "zero-link")
	must(os.Symlink("/dev/zero", fx.zeroLink))
	fx.fifoLink = filepath.Join(d, "fifo-link")
	must(os.Symlink(fx.fifo, fx.fifoLink))
	fx.loop = filepath.Join(d, "loop")
	must(os.Symlink(fx.loop, fx.loop))
	fx.missing = filepath.Join(d, "missing")
	fx.empty = filepath.Join(d, "empty")
	must(os.WriteFile(fx.empty, nil, 0o644))
	fx.big = filepath.Join(d, "big")
	must(os.WriteFile(fx.big, bytes.Repeat([]byte("x"), 2<<20), 0o644))
	fx.binary = filepath.Join(d, "binary")
	bin := make([]byte, 4096)
	for i := range bin {
		bin[i] = byte(i * 7)
	}
	must(os.WriteFile(fx.binary, bin, 0o644))
	root := repoRoot(t)
	fx.goodTopo = filepath.Join(root, "topology", "testdata", "inventories", "dgx-a100.json")
	fx.goodNCCL = filepath.Join(root, "bench", "testdata", "nccl-tests", "all_reduce_perf.txt")
	fx.goodPolicy = filepath.Join(d, "policy.json")
	must(os.WriteFile(fx.goodPolicy, []byte(`{"priority": {"weights": {"age": 1000}}}`), 0o644))
	fx.goodScript = filepath.Join(d, "job.sh")
	must(os.WriteFile(fx.goodScript, []byte("#!/bin/sh\n#GANGRUN --nodes 1\necho hi\n"), 0o755))
	fx.ckpt = filepath.Join(d, "ckpt")
	for i := 1; i <= 3; i++ {
		c := filepath.Join(fx.ckpt, fmt.Sprintf("checkpoint-%d", i))
		must(os.MkdirAll(c, 0o755))
		must(os.WriteFile(filepath.Join(c, "trainer_state.json"), []byte(fmt.Sprintf(`{"global_step": %d}`, i)), 0o644))
	}
	return fx
}

// treeSnapshot maps every path under root to its type and content hash.
func treeSnapshot(t *testing.T, root string) map[string]string {
	out := map[string]string{}
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			out[p] = "error " + err.Error()
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		if d.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			sum := sha256.Sum256(b)
			out[rel] = hex.EncodeToString(sum[:8])
		} else {
			out[rel] = d.Type().String()
		}
		return nil
	})
	return out
}

// ckptAttack returns a setup making a checkpoint directory of three complete
// checkpoints with plant applied to it.
func (fx *sweepFixtures) ckptAttack(plant func(t *testing.T, dir, outside string)) func(t *testing.T, outside string) string {
	return func(t *testing.T, outside string) string {
		dir := filepath.Join(t.TempDir(), "ckpt")
		for i := 1; i <= 3; i++ {
			c := filepath.Join(dir, fmt.Sprintf("checkpoint-%d", i))
			if err := os.MkdirAll(c, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(c, "trainer_state.json"), []byte(fmt.Sprintf(`{"global_step": %d}`, i)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		plant(t, dir, outside)
		return dir
	}
}

func sweepCases(t *testing.T, fx *sweepFixtures, consul string) []sweepCase {
	var cs []sweepCase
	add := func(c sweepCase) { cs = append(cs, c) }
	up := []string{"CONSUL_HTTP_ADDR=" + consul}
	closed := freeLoopbackAddr(t)
	touch := func(dir string) []string {
		return []string{"--", "/bin/sh", "-c", "touch " + filepath.Join(dir, "started")}
	}
	run := func(flags ...string) []string {
		return append(append([]string{"run", "--log-format", "text"}, flags...), touch("{mark}")...)
	}

	// 1. Special files where a file is read.
	specials := []struct{ name, path, needle string }{
		{"a FIFO", fx.fifo, fx.fifo}, {"a link to a FIFO", fx.fifoLink, fx.fifoLink}, {"a socket", fx.sock, fx.sock},
		{"a directory", fx.subdir, fx.subdir}, {"/dev/zero", "/dev/zero", "/dev/zero"}, {"a link to /dev/zero", fx.zeroLink, fx.zeroLink},
		{"a link loop", fx.loop, fx.loop}, {"missing", fx.missing, fx.missing}, {"empty", fx.empty, fx.empty},
		{"2 MB of x", fx.big, fx.big}, {"binary", fx.binary, fx.binary}, {"/proc/self/mem", "/proc/self/mem", "/proc/self/mem"},
		{"an empty path", "", "empty"}, {"/dev/stdin", "/dev/stdin", "/dev/stdin"},
	}
	for _, s := range specials {
		for _, pos := range []struct {
			where string
			args  []string
			env   []string
		}{
			{"run --topology-file", run("--topology-file", s.path), nil},
			{"topo --topology-file", []string{"topo", "--topology-file", s.path}, nil},
			{"agent --topology-file", []string{"agent", "--consul", closed, "--node-name", "n1", "--topology-file", s.path}, nil},
			{"bench parse", []string{"bench", "parse", s.path}, nil},
			{"policy set", []string{"policy", "set", s.path}, up},
			{"submit SCRIPT", []string{"submit", s.path}, up},
			{"CONSUL_HTTP_TOKEN_FILE", []string{"queue"}, append([]string{"CONSUL_HTTP_TOKEN_FILE=" + s.path}, up...)},
			{"agent --config", []string{"agent", "--consul", closed, "--node-name", "n1", "--config", s.path}, nil},
			{"doctor --config", []string{"doctor", "--consul", closed, "--node-name", "n1", "--config", s.path}, nil},
		} {
			if s.path == "" && pos.where == "CONSUL_HTTP_TOKEN_FILE" {
				continue // an empty variable is an unset one
			}
			if s.name == "empty" && strings.HasSuffix(pos.where, "--config") {
				continue // an empty settings file sets nothing: valid
			}
			add(sweepCase{group: "file", name: pos.where + " " + s.name, args: pos.args, env: pos.env, needle: s.needle})
		}
	}
	// Special files where a directory is used.
	for _, s := range []struct {
		name, path string
		okRun      bool
	}{
		{"a FIFO", fx.fifo, false}, {"a socket", fx.sock, false}, {"a regular file", fx.empty, false}, {"/dev/zero", "/dev/zero", false},
		{"a link loop", fx.loop, false}, {"a link to a FIFO", fx.fifoLink, false}, {"/proc/1", "/proc/1", false},
		{"an empty path", "", false},
	} {
		needle := s.path
		if needle == "" {
			needle = "empty"
		}
		add(sweepCase{group: "dir", name: "run --checkpoint-dir " + s.name, args: run("--checkpoint-dir", s.path), needle: needle})
		add(sweepCase{group: "dir", name: "run --log-dir " + s.name, args: run("--log-dir", s.path), needle: needle})
		add(sweepCase{group: "dir", name: "submit --checkpoint-dir " + s.name, args: []string{"submit", "--checkpoint-dir", s.path, "--", "true"}, env: up, needle: needle})
		for _, sub := range []string{"latest", "ls", "verify"} {
			c := sweepCase{group: "dir", name: "ckpt " + sub + " " + s.name, args: []string{"ckpt", sub, s.path}, needle: needle}
			// verify judges any path (exit 1, incomplete, and why on stdout); /proc/1 is
			// a directory to list like any other.
			if sub == "verify" && s.path != "" || s.path == "/proc/1" {
				c.want = wantSafe
			}
			add(c)
		}
		c := sweepCase{group: "dir", name: "ckpt prune " + s.name, args: []string{"ckpt", "prune", s.path, "--keep", "1", "--yes"}, needle: needle}
		if s.path == "/proc/1" {
			c.want = wantSafe
		}
		add(c)
	}
	// Outputs.
	for _, s := range []struct{ name, path string }{
		{"a FIFO", fx.fifo}, {"a directory", fx.subdir}, {"/dev/zero", "/dev/zero"}, {"a socket", fx.sock},
		{"under /proc", "/proc/self/gangrun.xml"}, {"the --topology-file itself", "{dir}/topo.json"},
	} {
		c := sweepCase{group: "output", name: "topo --nccl-topo-xml " + s.name, args: []string{"topo", "--topology-file", fx.goodTopo, "--nccl-topo-xml", s.path}, needle: s.path}
		if strings.Contains(s.path, "{dir}") {
			c.setup = func(t *testing.T, outside string) string {
				d := t.TempDir()
				b, err := os.ReadFile(fx.goodTopo)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(d, "topo.json"), b, 0o644); err != nil {
					t.Fatal(err)
				}
				return d
			}
			c.args = []string{"topo", "--topology-file", "{dir}/topo.json", "--nccl-topo-xml", "{dir}/topo.json"}
			c.needle = "topo.json"
		}
		add(c)
	}
	for _, s := range []struct{ name, path, needle string }{
		{"a directory", fx.subdir, fx.subdir}, {"under /proc", "/proc/gangrun-%j.out", "/proc"}, {"a FIFO", fx.fifo, fx.fifo},
		{"/dev/zero", "/dev/zero", "/dev/zero"}, {"an unknown pattern", "out-%q.txt", "%q"},
	} {
		add(sweepCase{group: "output", name: "submit --output " + s.name, args: []string{"submit", "--output", s.path, "--", "true"}, env: up, needle: s.needle})
	}

	// 2. Links and special files planted in a checkpoint directory: nothing outside it
	// may change, nothing may block.
	plants := []struct {
		name  string
		plant func(t *testing.T, dir, outside string)
	}{
		{".gangrun a link to outside", func(t *testing.T, dir, outside string) { mustSymlink(t, outside, filepath.Join(dir, ".gangrun")) }},
		{"trash a link to outside", func(t *testing.T, dir, outside string) {
			mustMkdirAll(t, filepath.Join(dir, ".gangrun"))
			mustSymlink(t, outside, filepath.Join(dir, ".gangrun", "trash"))
		}},
		{"pins a link to outside", func(t *testing.T, dir, outside string) {
			mustMkdirAll(t, filepath.Join(dir, ".gangrun"))
			mustSymlink(t, outside, filepath.Join(dir, ".gangrun", "pins"))
		}},
		{"a FIFO pin", func(t *testing.T, dir, outside string) {
			mustMkdirAll(t, filepath.Join(dir, ".gangrun", "pins"))
			if err := syscall.Mkfifo(filepath.Join(dir, ".gangrun", "pins", "pin-f.json"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"a pin linked to /dev/zero", func(t *testing.T, dir, outside string) {
			mustMkdirAll(t, filepath.Join(dir, ".gangrun", "pins"))
			mustSymlink(t, "/dev/zero", filepath.Join(dir, ".gangrun", "pins", "pin-z.json"))
		}},
		{"a malformed pin", func(t *testing.T, dir, outside string) {
			mustMkdirAll(t, filepath.Join(dir, ".gangrun", "pins"))
			mustWriteFile(t, filepath.Join(dir, ".gangrun", "pins", "pin-m.json"), `{"checkpoint": "checkpoint-1", "holder": "", "pid": -1}`)
		}},
		{"pins a FIFO", func(t *testing.T, dir, outside string) {
			mustMkdirAll(t, filepath.Join(dir, ".gangrun"))
			if err := syscall.Mkfifo(filepath.Join(dir, ".gangrun", "pins"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"the lock a FIFO", func(t *testing.T, dir, outside string) {
			mustMkdirAll(t, filepath.Join(dir, ".gangrun"))
			if err := syscall.Mkfifo(filepath.Join(dir, ".gangrun", "lock"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"the lock a link to outside", func(t *testing.T, dir, outside string) {
			mustMkdirAll(t, filepath.Join(dir, ".gangrun"))
			mustSymlink(t, filepath.Join(outside, "precious.txt"), filepath.Join(dir, ".gangrun", "lock"))
		}},
		{"the fence a link to outside", func(t *testing.T, dir, outside string) {
			mustMkdirAll(t, filepath.Join(dir, ".gangrun"))
			mustSymlink(t, filepath.Join(outside, "precious.txt"), filepath.Join(dir, ".gangrun", "fence"))
		}},
		{"a checkpoint a link to outside", func(t *testing.T, dir, outside string) {
			mustSymlink(t, filepath.Join(outside, "step-9"), filepath.Join(dir, "checkpoint-0"))
		}},
		{"a link inside an old checkpoint", func(t *testing.T, dir, outside string) {
			mustSymlink(t, outside, filepath.Join(dir, "checkpoint-1", "escape"))
		}},
	}
	for _, p := range plants {
		setup := fx.ckptAttack(p.plant)
		add(sweepCase{group: "ckpt-plant", name: "ckpt ls with " + p.name, args: []string{"ckpt", "ls", "{dir}"}, setup: setup, want: wantSafe})
		add(sweepCase{group: "ckpt-plant", name: "ckpt latest with " + p.name, args: []string{"ckpt", "latest", "{dir}"}, setup: setup, want: wantSafe})
		add(sweepCase{group: "ckpt-plant", name: "ckpt verify with " + p.name, args: []string{"ckpt", "verify", "{dir}/checkpoint-3"}, setup: setup, want: wantSafe})
		add(sweepCase{group: "ckpt-plant", name: "ckpt prune --yes with " + p.name, args: []string{"ckpt", "prune", "{dir}", "--keep", "1", "--yes"}, setup: setup, want: wantSafe})
		add(sweepCase{group: "ckpt-plant", name: "run --checkpoint-dir with " + p.name, args: run("--checkpoint-dir", "{dir}"), setup: setup, want: wantSafe, timeout: 60 * time.Second})
	}

	// 3. Values too long, too large, out of range or of the wrong form.
	long := fx.long
	longNeedle := long[:40]
	for _, v := range []struct {
		name string
		args []string
		env  []string
	}{
		{"run --job-id", run("--job-id", long), nil},
		{"run --node-name", run("--node-name", long), nil},
		{"run --advertise-addr", run("--advertise-addr", long), nil},
		{"run --coordinator", run("--coordinator", long), nil},
		{"run --warm-imports", run("--warm-imports", long), nil},
		{"run --resume-arg", run("--resume-arg", long), nil},
		{"submit --name", []string{"submit", "--name", long, "--", "true"}, up},
		{"submit --account", []string{"submit", "--account", long, "--", "true"}, up},
		{"submit --partition", []string{"submit", "--partition", long, "--", "true"}, up},
		{"submit --output", []string{"submit", "--output", long, "--", "true"}, up},
		{"submit --dependency", []string{"submit", "--dependency", "afterok:" + long, "--", "true"}, up},
		{"submit --checkpoint-dir", []string{"submit", "--checkpoint-dir", "/tmp/" + long, "--", "true"}, up},
		{"submit --gpus-per-node type", []string{"submit", "--gpus-per-node", long + ":1", "--", "true"}, up},
		{"alloc --gpu-model", []string{"alloc", "--gpu-model", long, "--wait", "1s", "--", "/bin/true"}, up},
		{"alloc --partition", []string{"alloc", "--partition", long, "--wait", "1s", "--", "/bin/true"}, up},
		{"alloc --account", []string{"alloc", "--account", long, "--wait", "1s", "--", "/bin/true"}, up},
		{"alloc --labels", []string{"alloc", "--labels", "k=" + long, "--wait", "1s", "--", "/bin/true"}, up},
		{"acct --user", []string{"acct", "--user", long}, up},
		{"acct --account", []string{"acct", "--account", long}, up},
		{"acct --state", []string{"acct", "--state", long}, up},
		{"audit --user", []string{"audit", "--user", long}, up},
		{"show ID", []string{"show", long}, up},
		{"cancel ID", []string{"cancel", long}, up},
		{"logs ID", []string{"logs", long}, up},
		{"drain NODE", []string{"drain", long, "--reason", "r"}, up},
		{"drain --reason", []string{"drain", "n1", "--reason", long}, up},
		{"resume NODE", []string{"resume", long}, up},
		{"acl user", []string{"acl", "user", long}, up},
		{"agent --node-name", []string{"agent", "--consul", closed, "--node-name", long}, nil},
		{"agent --labels", []string{"agent", "--consul", closed, "--node-name", "n", "--labels", "k=" + long}, nil},
		{"hostlist expand", []string{"hostlist", "expand", long}, nil},
		{"hostlist compress", []string{"hostlist", "compress", long}, nil},
		{"--consul", []string{"nodes", "--consul", long}, nil},
		{"CONSUL_HTTP_ADDR", []string{"nodes"}, []string{"CONSUL_HTTP_ADDR=" + long}},
		{"ckpt latest DIR", []string{"ckpt", "latest", long}, nil},
		{"ckpt --format", []string{"ckpt", "ls", fx.ckpt, "--format", long}, nil},
		{"topo --nccl-topo-xml", []string{"topo", "--topology-file", fx.goodTopo, "--nccl-topo-xml", "/tmp/" + long}, nil},
		{"a flag's name", []string{"queue", "--" + long}, up},
		{"a command's name", []string{long}, nil},
	} {
		add(sweepCase{group: "long", name: v.name + " 100 KB", args: v.args, env: v.env, needle: longNeedle})
	}
	// Host names past DNS's limits (63 per label, 253 in all).
	label64 := strings.Repeat("a", 64)
	name254 := strings.Repeat(strings.Repeat("b", 50)+".", 5) + "cc"
	for _, h := range []struct{ name, v string }{{"a 64-character label", label64}, {"a 257-character name", name254}} {
		add(sweepCase{group: "dns", name: "run --node-name " + h.name, args: run("--node-name", h.v), needle: h.v[:40]})
		add(sweepCase{group: "dns", name: "agent --node-name " + h.name, args: []string{"agent", "--consul", closed, "--node-name", h.v}, needle: h.v[:40]})
		add(sweepCase{group: "dns", name: "run --advertise-addr " + h.name, args: run("--advertise-addr", h.v), needle: h.v[:40]})
		add(sweepCase{group: "dns", name: "hostlist expand " + h.name, args: []string{"hostlist", "expand", h.v + "[1-2]"}, needle: h.v[:40]})
		add(sweepCase{group: "dns", name: "drain " + h.name, args: []string{"drain", h.v, "--reason", "r"}, env: up, needle: h.v[:40]})
		add(sweepCase{group: "dns", name: "--consul " + h.name, args: []string{"nodes", "--consul", h.v + ":8500"}, needle: h.v[:40]})
	}
	// Counts and numbers.
	for _, v := range []struct {
		name   string
		args   []string
		env    []string
		needle string
	}{
		{"run --nproc-per-node 100000000", run("--nproc-per-node", "100000000"), nil, "100000000"},
		{"run --nproc-per-node 0", run("--nproc-per-node", "0"), nil, `"0"`},
		{"run --nproc-per-node -1", run("--nproc-per-node", "-1"), nil, "-1"},
		{"run --nnodes 1:100000000", run("--nnodes", "1:100000000"), nil, "100000000"},
		{"run --nnodes 0", run("--nnodes", "0"), nil, `"0"`},
		{"run --nnodes 3:2", run("--nnodes", "3:2"), nil, "3:2"},
		{"run --master-port 70000", run("--master-port", "70000"), nil, "70000"},
		{"run --master-port -1", run("--master-port", "-1"), nil, "-1"},
		{"run --max-restarts -1", run("--max-restarts", "-1"), nil, "-1"},
		{"run --pids-limit -5", run("--pids-limit", "-5"), nil, "-5"},
		{"run --mem 1E", run("--mem", "1E"), nil, "1E"},
		{"run --term-timeout 1e100h", run("--term-timeout", "1e100h"), nil, "1e100h"},
		{"run --warm-delay -1s", run("--warm-delay", "-1s"), nil, "-1s"},
		{"run --restart-backoff forever", run("--restart-backoff", "forever"), nil, "forever"},
		{"run --cpu-bind bogus", run("--cpu-bind", "bogus"), nil, "bogus"},
		{"run --env A", run("--env", "A"), nil, `"A"`},
		{"run --env =1", run("--env", "=1"), nil, `"=1"`},
		{"run --coordinator etcd://x", run("--coordinator", "etcd://x"), nil, "etcd://x"},
		{"run --warm-imports not a module", run("--warm-imports", "no such;module"), nil, "no such;module"},
		{"submit --nodes 100000000", []string{"submit", "--nodes", "100000000", "--", "true"}, up, "100000000"},
		{"submit --nodes 0", []string{"submit", "--nodes", "0", "--", "true"}, up, `"0"`},
		{"submit --gpus-per-node 100000000", []string{"submit", "--gpus-per-node", "100000000", "--", "true"}, up, "100000000"},
		{"submit --spare-nodes 100000000", []string{"submit", "--spare-nodes", "100000000", "--", "true"}, up, "100000000"},
		{"submit --priority max int64", []string{"submit", "--priority", "9223372036854775807", "--", "true"}, up, "9223372036854775807"},
		{"submit --priority min int64", []string{"submit", "--priority", "-9223372036854775808", "--", "true"}, up, "-9223372036854775808"},
		{"submit --array 0-100000000", []string{"submit", "--array", "0-100000000", "--", "true"}, up, "100000000"},
		{"submit --array %0", []string{"submit", "--array", "0-3%0", "--", "true"}, up, "%0"},
		{"submit --mem 1E", []string{"submit", "--mem", "1E", "--", "true"}, up, "1E"},
		{"submit --max-restarts 99999999", []string{"submit", "--max-restarts", "99999999", "--", "true"}, up, "99999999"},
		{"submit --dependency afterok:", []string{"submit", "--dependency", "afterok:", "--", "true"}, up, "afterok:"},
		{"submit --uid nosuchuser", []string{"submit", "--uid", "nosuchuser_x", "--", "true"}, up, "nosuchuser_x"},
		{"alloc --nodes 100000000", []string{"alloc", "--nodes", "100000000", "--wait", "1s", "--", "/bin/true"}, up, "100000000"},
		{"alloc --gpus-per-node 100000000", []string{"alloc", "--gpus-per-node", "100000000", "--wait", "1s", "--", "/bin/true"}, up, "100000000"},
		{"alloc --priority max int64", []string{"alloc", "--priority", "9223372036854775807", "--wait", "1s", "--", "/bin/true"}, up, "9223372036854775807"},
		{"alloc --wait -1s", []string{"alloc", "--wait", "-1s"}, up, "-1s"},
		{"bench nccl --iters 0", []string{"bench", "nccl", "--iters", "0"}, nil, "0"},
		{"bench nccl --min-bytes 1E", []string{"bench", "nccl", "--min-bytes", "1E"}, nil, "1E"},
		{"topo --rank 100000000", []string{"topo", "--topology-file", fx.goodTopo, "--nccl-env", "--rank", "100000000"}, nil, "100000000"},
		{"topo --rank -2", []string{"topo", "--topology-file", fx.goodTopo, "--nccl-env", "--rank", "-2"}, nil, "-2"},
		{"hostlist expand n[1-100000000]", []string{"hostlist", "expand", "n[1-100000000]"}, nil, "n[1-100000000]"},
		{"hostlist expand n[99999999999999999999]", []string{"hostlist", "expand", "n[99999999999999999999]"}, nil, "99999999999999999999"},
		{"ckpt prune --keep 0", []string{"ckpt", "prune", fx.ckpt, "--keep", "0"}, nil, "--keep 0"},
		{"ckpt prune --keep 99999999999999999999", []string{"ckpt", "prune", fx.ckpt, "--keep", "99999999999999999999"}, nil, "99999999999999999999"},
		{"agent --waste-threshold 200", []string{"agent", "--consul", closed, "--node-name", "n", "--waste-threshold", "200"}, nil, "200"},
		{"agent --waste-threshold NaN", []string{"agent", "--consul", closed, "--node-name", "n", "--waste-threshold", "NaN"}, nil, "NaN"},
		{"agent --metrics-addr :99999", []string{"agent", "--consul", closed, "--node-name", "n", "--metrics-addr", ":99999"}, nil, ":99999"},
	} {
		add(sweepCase{group: "number", name: v.name, args: v.args, env: v.env, needle: v.needle})
	}
	// A --warm-imports module that cannot be imported: the restart is cold and says so.
	add(sweepCase{group: "number", name: "run --warm-imports a module that does not exist", want: wantNote, needle: "cannot import gangrun_no_such_module_x (--warm-imports)",
		args: []string{"run", "--max-restarts", "1", "--restart-backoff", "0s", "--warm-delay=0s", "--warm-imports", "gangrun_no_such_module_x", "--",
			"/usr/bin/python3", "{dir}/t.py"}, timeout: 60 * time.Second,
		setup: func(t *testing.T, _ string) string {
			d := t.TempDir()
			mustWriteFile(t, filepath.Join(d, "t.py"), "import os, sys\nsys.exit(3 if os.environ['GANGRUN_ATTEMPT'] == '0' else 0)\n")
			return d
		}})
	// Times and dates.
	for _, v := range []struct {
		name, value, needle string
		want                sweepWant
	}{
		{"--time 99:99:99 (sbatch adds the fields)", "99:99:99", "4-04:40:39", wantNote},
		{"--time 1-25 (sbatch adds the fields)", "1-25", "2-01:00:00", wantNote},
		{"--time -5", "-5", "-5", wantRefusal},
		{"--time 1:2:3:4", "1:2:3:4", "1:2:3:4", wantRefusal},
		{"--time 1-2-3", "1-2-3", "1-2-3", wantRefusal},
		{"--time 1:-2", "1:-2", "1:-2", wantRefusal},
		{"--time :", ":", `":"`, wantRefusal},
		{"--time abc", "abc", "abc", wantRefusal},
		{"--time 1e9", "1e9", "1e9", wantRefusal},
		{"--time 100000000 (minutes)", "100000000", "100000000", wantRefusal},
		{"--time 99999999999999999999", "99999999999999999999", "99999999999999999999", wantRefusal},
		{"--time 9999999h", "9999999h", "9999999h", wantRefusal},
		{"--time 1 2", "1 2", "1 2", wantRefusal},
		{"--time empty", "", `""`, wantRefusal},
	} {
		add(sweepCase{group: "time", name: "submit " + v.name, args: []string{"submit", "--time", v.value, "--", "true"}, env: up, needle: v.needle, want: v.want})
	}
	for _, v := range []struct{ name, needle string }{
		{"USR1@-1", "USR1@-1"}, {"USR1@99999999999", "USR1@99999999999"}, {"SIGBOGUS", "SIGBOGUS"}, {"65", `"65"`}, {"0", `"0"`},
	} {
		add(sweepCase{group: "time", name: "submit --signal " + v.name, args: []string{"submit", "--time", "1:00:00", "--signal", v.name, "--", "true"}, env: up, needle: v.needle})
	}
	for _, v := range []struct{ flag, value string }{
		{"--since", "0000-01-01"}, {"--since", "0001-01-01"}, {"--since", "1969-12-31"}, {"--since", "99999d"}, {"--since", "2024-13-01"},
		{"--since", "2024-02-30"}, {"--since", "-5d"}, {"--since", "yesterday"}, {"--until", "0000-01-01"}, {"--since", "2025-01-01T25:00"},
	} {
		add(sweepCase{group: "time", name: "acct " + v.flag + " " + v.value, args: []string{"acct", v.flag, v.value}, env: up, needle: v.value})
		if v.flag == "--since" { // audit takes no --until
			add(sweepCase{group: "time", name: "audit " + v.flag + " " + v.value, args: []string{"audit", v.flag, v.value}, env: up, needle: v.value})
		}
	}
	for _, v := range []string{"9999999999h", "-1s", "1e100s", "soon"} {
		add(sweepCase{group: "time", name: "run --hang-timeout " + v, args: run("--hang-timeout", v), needle: v})
		add(sweepCase{group: "time", name: "agent --min-job-age " + v, args: []string{"agent", "--consul", closed, "--node-name", "n", "--min-job-age", v}, needle: v})
	}
	// Names of the wrong form.
	for _, v := range []struct {
		name   string
		args   []string
		env    []string
		needle string
	}{
		{"acct --user a/b", []string{"acct", "--user", "a/b"}, up, "a/b"},
		{"acct --account a/b", []string{"acct", "--account", "a/b"}, up, "a/b"},
		{"acct --state BOGUS", []string{"acct", "--state", "BOGUS"}, up, "BOGUS"},
		{"audit --user a/b", []string{"audit", "--user", "a/b"}, up, "a/b"},
		{"show a/b", []string{"show", "a/b"}, up, "a/b"},
		{"logs ../x", []string{"logs", "../x"}, up, "../x"},
		{"drain a/b", []string{"drain", "a/b", "--reason", "r"}, up, "a/b"},
		{"resume ..", []string{"resume", ".."}, up, `".."`},
		{"submit --name with a newline", []string{"submit", "--name", "a\nb", "--", "true"}, up, `"a\nb"`},
		{"submit --account a/b", []string{"submit", "--account", "a/b", "--", "true"}, up, "a/b"},
		{"submit --partition a/b", []string{"submit", "--partition", "a/b", "--", "true"}, up, "a/b"},
		{"submit --gpus-per-node h100:x", []string{"submit", "--gpus-per-node", "h100:x", "--", "true"}, up, "h100:x"},
		{"submit --env A", []string{"submit", "--env", "A", "--", "true"}, up, `"A"`},
		{"run --job-id a/b", run("--job-id", "a/b"), nil, "a/b"},
		{"run --node-name -n", run("--node-name", "-n"), nil, `"-n"`},
		{"alloc --labels =x", []string{"alloc", "--labels", "=x", "--wait", "1s", "--", "/bin/true"}, up, "=x"},
		{"acl user a/b", []string{"acl", "user", "a/b"}, up, "a/b"},
		{"ckpt --format bogus", []string{"ckpt", "ls", fx.ckpt, "--format", "bogus"}, nil, "bogus"},
		{"ckpt verify a path that does not exist", []string{"ckpt", "verify", "/nonexistent/a/../b"}, nil, "/nonexistent/a/../b"},
	} {
		add(sweepCase{group: "name", name: v.name, args: v.args, env: v.env, needle: v.needle})
	}

	// 4. Consul down, or not where it is said to be.
	consulCmds := [][]string{
		{"nodes"}, {"queue"}, {"show", "1"}, {"cancel", "1"}, {"logs", "1"}, {"policy", "show"}, {"policy", "set", fx.goodPolicy},
		{"acct"}, {"audit"}, {"acl", "whoami"}, {"drain", "n1", "--reason", "r"}, {"resume", "n1"}, {"submit", "--", "true"},
		{"alloc", "--wait", "1s", "--", "/bin/true"},
	}
	for _, c := range consulCmds {
		name := strings.Join(c[:min(2, len(c))], " ")
		add(sweepCase{group: "consul", name: name + " with CONSUL_HTTP_ADDR closed", args: c, env: []string{"CONSUL_HTTP_ADDR=" + closed}, needle: "Consul at " + closed})
		add(sweepCase{group: "consul", name: name + " with --consul closed", args: append([]string{c[0], "--consul", closed}, c[1:]...), needle: "Consul at " + closed})
		add(sweepCase{group: "consul", name: name + " with CONSUL_HTTP_ADDR without a port", args: c, env: []string{"CONSUL_HTTP_ADDR=127.0.0.2"}, needle: "127.0.0.2:8500"})
		add(sweepCase{group: "consul", name: name + " with CONSUL_HTTP_SSL=maybe", args: c, env: append([]string{"CONSUL_HTTP_SSL=maybe"}, up...), needle: "CONSUL_HTTP_SSL"})
	}
	add(sweepCase{group: "consul", name: "run --coordinator consul:// closed", args: run("--coordinator", "consul://"+closed, "--job-id", "j"), needle: "Consul at " + closed})
	add(sweepCase{group: "consul", name: "run --coordinator consul:// unknown host", args: run("--coordinator", "consul://nosuchhost.invalid:8500", "--job-id", "j"), needle: "nosuchhost.invalid"})
	add(sweepCase{group: "consul", name: "agent with Consul closed, a bad --labels", args: []string{"agent", "--consul", closed, "--node-name", "n", "--labels", "x"}, needle: `"x"`})

	// Documents: the agent's settings file (agent --config, and doctor --config which
	// reads the same file).
	for _, d := range []struct{ name, doc, needle string }{
		{"an unknown key", "consull = 127.0.0.1:8500\n", `unknown key "consull" (did you mean consul?)`},
		{"a key with its dashes", "--consul = 127.0.0.1:8500\n", "without its dashes"},
		{"config itself", "config = /etc/gangrun/agent.conf\n", `unknown key "config"`},
		{"a line without =", "consul 127.0.0.1:8500\n", "want KEY = VALUE"},
		{"an empty value", "node-name =\n", "node-name has no value"},
		{"a key given twice", "node-name = a\nnode-name = b\n", "node-name given twice"},
		{"a bad duration", "min-job-age = forever\n", `min-job-age "forever"`},
		{"a bad bool", "no-scheduler = maybe\n", `no-scheduler "maybe": want true or false`},
		{"DOS line breaks", "node-name = a\r\n", "DOS line break"},
		{"a NUL byte", "node-name = a\x00\n", "NUL byte"},
		{"invalid UTF-8", "node-name = \xff\n", "not valid UTF-8"},
		{"a 10 KB value", "labels = k=" + long[:10000] + "\n", "--labels"},
		{"a 100 KB value (the file too large)", "labels = k=" + long + "\n", "longer than 65536 bytes"},
		{"a bad waste-threshold (checked past parsing)", "waste-threshold = 200\n", "--waste-threshold 200"},
	} {
		file := filepath.Join(fx.dir, "settings-"+strings.ReplaceAll(d.name, " ", "-")+".conf")
		mustWriteFile(t, file, d.doc)
		for _, cmd := range []string{"agent", "doctor"} {
			add(sweepCase{group: "document", name: cmd + " --config " + d.name, args: []string{cmd, "--consul", closed, "--config", file}, needle: d.needle})
		}
	}

	// 5. Documents: policies.
	for _, d := range []struct{ name, doc, needle string }{
		{"a byte-order mark", "\xEF\xBB\xBF{}", "byte-order mark"},
		{"a key given twice", `{"priority": {"weights": {"age": 1, "age": 2}}}`, "given twice"},
		{"top-level keys given twice", `{"accounts": {}, "accounts": {}}`, "given twice"},
		{"a weight at the int64 limit", `{"priority": {"weights": {"age": 9223372036854775807}}}`, "priority.weights.age"},
		{"a weight past int64", `{"priority": {"weights": {"age": 1e30}}}`, "priority.weights.age"},
		{"shares at the int64 limit", `{"accounts": {"a": {"shares": 9223372036854775807}}}`, "accounts.a.shares"},
		{"a decay half-life of 1ns", `{"priority": {"decay_half_life": "1ns"}}`, "decay_half_life"},
		{"a weight that is text", `{"priority": {"weights": {"age": "x"}}}`, "priority.weights.age"},
		{"a misspelt field", `{"acounts": {}}`, "acounts"},
		{"cut short", `{"priority": {"weights": {"age": 1}}`, "truncated"},
		{"two documents", `{} {}`, "second value"},
		{"an array", `[]`, "JSON object"},
		{"NUL bytes", "{\x00}", "line 1"},
		{"a negative tier", `{"partitions": {"p": {"tier": -1}}}`, "partitions.p.tier"},
		{"a 300 KB document", `{"accounts": {"` + strings.Repeat("a", 300<<10) + `": {}}}`, "262144"},
	} {
		add(sweepCase{group: "policy", name: "policy set " + d.name, args: []string{"policy", "set", "{dir}/policy.json"}, env: up, needle: d.needle,
			setup: func(t *testing.T, outside string) string {
				dir := t.TempDir()
				mustWriteFile(t, filepath.Join(dir, "policy.json"), d.doc)
				return dir
			}})
	}
	// Topology files.
	for _, d := range []struct{ name, doc, needle string }{
		{"a byte-order mark", "\xEF\xBB\xBF{\"schema_version\": 1}", "byte-order mark"},
		{"a key given twice", `{"schema_version": 1, "node": "a", "node": "b"}`, "given twice"},
		{"gpus of the wrong type", `{"schema_version": 1, "gpus": 5}`, `"gpus"`},
		{"cut short", `{"schema_version": 1, "gpus": [`, "truncated"},
		{"a future schema", `{"schema_version": 99}`, "schema_version 99"},
		{"no schema", `{}`, "schema_version"},
	} {
		add(sweepCase{group: "topology", name: "topo --topology-file " + d.name, args: []string{"topo", "--topology-file", "{dir}/t.json"}, needle: d.needle,
			setup: func(t *testing.T, outside string) string {
				dir := t.TempDir()
				mustWriteFile(t, filepath.Join(dir, "t.json"), d.doc)
				return dir
			}})
	}
	// Job scripts.
	for _, d := range []struct{ name, script, needle string }{
		{"CRLF line ends", "#!/bin/sh\r\n#GANGRUN --nodes 1\r\necho hi\r\n", "DOS line breaks"},
		{"binary", "#!/bin/sh\necho \x00\x01\x02\n", "NUL"},
		{"--env given twice", "#!/bin/sh\n#GANGRUN --env A=1\n#GANGRUN --env A=2\necho hi\n", "given twice"},
		{"#GANGRUN--nodes", "#!/bin/sh\n#GANGRUN--nodes 1\necho hi\n", "#GANGRUN--nodes"},
		{"an unknown option", "#!/bin/sh\n#GANGRUN --bogus\necho hi\n", "--bogus"},
		{"a bad quote", "#!/bin/sh\n#GANGRUN --name 'x\necho hi\n", "line 2"},
		{"no command", "#!/bin/sh\n#GANGRUN --nodes 1\n", "no command"},
		{"a bad --time", "#!/bin/sh\n#GANGRUN --time 1:2:3:4\necho hi\n", "1:2:3:4"},
		{"an argument", "#!/bin/sh\n#GANGRUN --nodes 1 extra\necho hi\n", "extra"},
		{"invalid UTF-8", "#!/bin/sh\necho \xff\xfe\n", "UTF-8"},
	} {
		add(sweepCase{group: "script", name: "submit a script with " + d.name, args: []string{"submit", "{dir}/job.sh"}, env: up, needle: d.needle,
			setup: func(t *testing.T, outside string) string {
				dir := t.TempDir()
				mustWriteFile(t, filepath.Join(dir, "job.sh"), d.script)
				return dir
			}})
	}
	// Submit checks what run checks.
	for _, v := range []struct {
		name   string
		args   []string
		needle string
	}{
		{"an empty command", []string{"submit", "--"}, "no command"},
		{"an empty word as command", []string{"submit", "--", ""}, `""`},
		{"a command that is a directory", []string{"submit", "--", "/tmp"}, "/tmp"},
		{"--checkpoint-dir under /proc", []string{"submit", "--checkpoint-dir", "/proc/1/x", "--", "true"}, "/proc"},
		{"--output under a file", []string{"submit", "--output", fx.empty + "/x.out", "--", "true"}, fx.empty},
	} {
		add(sweepCase{group: "submit", name: "submit " + v.name, args: v.args, env: up, needle: v.needle})
	}
	// Commands, subcommands and help.
	for _, v := range []struct {
		args   []string
		needle string
	}{
		{[]string{"help", "nosuch"}, "nosuch"}, {[]string{"nosuch"}, "nosuch"}, {[]string{"ckpt", "nosuch"}, "nosuch"},
		{[]string{"bench", "nosuch"}, "nosuch"}, {[]string{"hostlist", "nosuch"}, "nosuch"}, {[]string{"policy", "nosuch"}, "nosuch"},
		{[]string{"acl", "nosuch"}, "nosuch"}, {[]string{"queue", "--bogus"}, "--bogus"}, {[]string{"run"}, "command"},
		{[]string{"show"}, "id"}, {[]string{"version", "x"}, `"x"`}, {[]string{"run", "--", "/nonexistent/x"}, "/nonexistent/x"},
	} {
		c := sweepCase{group: "command", name: strings.Join(v.args, " "), args: v.args, env: up, needle: v.needle}
		add(c)
	}

	// Valid edge cases, as controls: each must succeed.
	for _, v := range []struct {
		name string
		args []string
		env  []string
	}{
		{"topo --topology-file", []string{"topo", "--topology-file", fx.goodTopo}, nil},
		{"topo --nccl-topo-xml a new file", []string{"topo", "--topology-file", fx.goodTopo, "--nccl-topo-xml", filepath.Join(t.TempDir(), "t.xml")}, nil},
		{"ckpt ls", []string{"ckpt", "ls", fx.ckpt}, nil},
		{"ckpt latest", []string{"ckpt", "latest", fx.ckpt}, nil},
		{"ckpt prune dry run", []string{"ckpt", "prune", fx.ckpt, "--keep", "1"}, nil},
		{"bench parse", []string{"bench", "parse", fx.goodNCCL}, nil},
		{"hostlist expand", []string{"hostlist", "expand", "n[01-03]"}, nil},
		{"hostlist expand a 63-character label", []string{"hostlist", "expand", strings.Repeat("a", 63)}, nil},
		{"run a command", run(), nil},
		{"run --checkpoint-dir a directory to be made", run("--checkpoint-dir", filepath.Join(t.TempDir(), "new")), nil},
		{"run --nproc-per-node 2", run("--nproc-per-node", "2"), nil},
		{"submit a script", []string{"submit", fx.goodScript}, up},
		{"submit --time 1-0", []string{"submit", "--time", "1-0", "--", "true"}, up},
		{"submit --time 2:30:00", []string{"submit", "--time", "2:30:00", "--", "true"}, up},
		{"submit --time UNLIMITED", []string{"submit", "--time", "UNLIMITED", "--", "true"}, up},
		{"submit --time 90m", []string{"submit", "--time", "90m", "--", "true"}, up},
		{"submit --priority -5", []string{"submit", "--priority", "-5", "--", "true"}, up},
		{"acct --since 2024-01-01", []string{"acct", "--since", "2024-01-01"}, up},
		{"acct --since 1970-01-01", []string{"acct", "--since", "1970-01-01"}, up},
		{"policy set", []string{"policy", "set", fx.goodPolicy}, up},
		{"queue", []string{"queue"}, up},
		{"help", []string{"help"}, nil},
		{"help run", []string{"help", "run"}, nil},
		{"version", []string{"version"}, nil},
		{"CONSUL_HTTP_SSL=false", []string{"queue"}, append([]string{"CONSUL_HTTP_SSL=false"}, up...)},
	} {
		add(sweepCase{group: "control", name: v.name, args: v.args, env: v.env, want: wantOK})
	}
	return cs
}

// quoteForNeedle returns how a value is expected in a message: Go-quoted when it holds
// what a terminal would not show.
func quoteForNeedle(v string) string {
	if strings.IndexFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0 {
		return fmt.Sprintf("%q", v)
	}
	return v
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func mustMkdirAll(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func mustWriteFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// freeLoopbackAddr returns a loopback address nothing listens on.
func freeLoopbackAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// runSweepCase runs one case as a process in its own group, under a timeout and a 4 GiB
// address-space limit (a command that grows for ever must not take the machine), and
// classifies what happened.
func runSweepCase(t *testing.T, bin string, fx *sweepFixtures, c sweepCase) sweepOutcome {
	o := sweepOutcome{c: c}
	mark := t.TempDir()
	outside := filepath.Join(t.TempDir(), "outside")
	for _, f := range []string{"precious.txt", "sub/deeper.txt", "step-9/model.pt"} {
		mustMkdirAll(t, filepath.Join(outside, filepath.Dir(f)))
		mustWriteFile(t, filepath.Join(outside, f), "keep "+f)
	}
	outsideSnap := treeSnapshot(t, outside)
	dir := ""
	if c.setup != nil {
		dir = c.setup(t, outside)
	}
	var inputSnap map[string]string
	if dir != "" {
		inputSnap = treeSnapshot(t, dir)
	}
	subst := func(s string) string {
		return strings.ReplaceAll(strings.ReplaceAll(s, "{dir}", dir), "{mark}", mark)
	}
	args := make([]string, len(c.args))
	for i, a := range c.args {
		args[i] = subst(a)
	}
	timeout := c.timeout
	switch {
	case timeout != 0:
	case args[0] == "agent":
		timeout = 10 * time.Second
	default:
		timeout = 20 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.Command("/bin/sh", append([]string{"-c", `ulimit -v 4194304; exec "$@"`, "sh", bin}, args...)...)
	cmd.Dir = fx.dir
	cmd.Env = append(os.Environ(), "GANGRUN_TEST_MARK=sweep", "TMPDIR="+mark)
	// Not the test's own Consul, unless the case says so.
	cmd.Env = append(cmd.Env, "CONSUL_HTTP_ADDR=", "CONSUL_HTTP_TOKEN=", "CONSUL_HTTP_TOKEN_FILE=")
	for _, e := range c.env {
		cmd.Env = append(cmd.Env, subst(e))
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	stdin, _ := cmd.StdinPipe() // held open: /dev/stdin is a pipe no one writes
	if err := cmd.Start(); err != nil {
		o.class, o.why = "unclear", "could not start: "+err.Error()
		return o
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		o.class, o.why = "hang", fmt.Sprintf("still running after %s", timeout)
		if args[0] == "agent" {
			// A daemon that took its flags runs until stopped: it accepted them.
			o.class, o.why = "accepted", "the agent took the bad input and ran"
		}
	}
	stdin.Close()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // anything it left in its group
	o.stderr = stderr.String()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		o.code = ee.ExitCode()
	}
	// Damage first: it outranks everything else.
	if after := treeSnapshot(t, outside); !sameSnapshot(outsideSnap, after) {
		o.class, o.why = "damage", "a file outside what the command was given changed"
		return o
	}
	if inputSnap != nil && strings.Contains(c.name, "--topology-file itself") {
		if after := treeSnapshot(t, dir); !sameSnapshot(inputSnap, after) {
			o.class, o.why = "damage", "the command's own input changed"
			return o
		}
	}
	if o.class == "hang" || o.class == "accepted" {
		return o
	}
	for _, crash := range []string{"panic: ", "fatal error: ", "goroutine ", "runtime/"} {
		if strings.Contains(o.stderr, crash) {
			o.class, o.why = "unclear", "crashed: a Go panic or runtime failure on stderr"
			return o
		}
	}
	_, startErr := os.Stat(filepath.Join(mark, "started"))
	started := startErr == nil
	switch c.want {
	case wantOK:
		if o.code != 0 {
			o.class, o.why = "unclear", "a valid input was refused"
		} else {
			o.class = "ok"
		}
		return o
	case wantSafe:
		if o.code == 0 || o.code == 1 || o.code == 2 {
			o.class = "ok"
		} else {
			o.class, o.why = "unclear", fmt.Sprintf("exit %d", o.code)
		}
		return o
	case wantNote:
		if o.code == 0 {
			if strings.Contains(o.stderr, c.needle) {
				o.class = "ok"
			} else {
				o.class, o.why = "accepted", "accepted without saying how the value was read ("+c.needle+")"
			}
			return o
		}
	}
	if o.code == 0 || started && c.want == wantRefusal {
		o.class, o.why = "accepted", "a bad input was taken"
		return o
	}
	if why := unclearRefusal(args, o.stderr, o.code, c); why != "" {
		o.class, o.why = "unclear", why
		return o
	}
	o.class = "ok"
	return o
}

func sameSnapshot(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// unclearRefusal says why a refusal's message is not one clear line, or "".
func unclearRefusal(args []string, stderr string, code int, c sweepCase) string {
	line := lastLine(stderr)
	cmdName := args[0]
	switch {
	case code != 1 && code != 2 && code != 126 && code != 127:
		return fmt.Sprintf("exit %d: want 2 for bad input (1 for a failure the command reports)", code)
	case c.code != 0 && code != c.code:
		return fmt.Sprintf("exit %d, want %d", code, c.code)
	case !strings.HasPrefix(line, "gangrun ") && !strings.HasPrefix(line, "gangrun:"):
		return "the last line of stderr does not begin with gangrun COMMAND:"
	case len(line) > 600:
		return fmt.Sprintf("a %d-byte message: long values must be shortened", len(line))
	}
	for _, w := range goWords {
		if strings.Contains(line, w) {
			return fmt.Sprintf("Go's words in the message (%q)", w)
		}
	}
	segs := strings.Split(line, ": ")
	for i := 1; i < len(segs); i++ {
		if strings.EqualFold(strings.TrimSpace(segs[i]), strings.TrimSpace(segs[i-1])) && len(segs[i]) > 3 {
			return fmt.Sprintf("one cause said twice (%q)", segs[i])
		}
	}
	if needle := c.needle; needle != "" {
		if len(needle) > 60 {
			needle = needle[:40]
		}
		if !strings.Contains(line, needle) && !strings.Contains(line, oneLine(needle)) {
			return fmt.Sprintf("the message does not name %q", needle)
		}
		if len(needle) > 8 && strings.Count(line, needle) > 2 {
			return fmt.Sprintf("the message names %q %d times", needle, strings.Count(line, needle))
		}
	}
	_ = cmdName
	return ""
}
