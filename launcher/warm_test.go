package launcher

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gangrun/gangrun/event"
	"github.com/gangrun/gangrun/internal/torchtest"
)

// testPython is the interpreter with torch: $GANGRUN_PYTHON, else /usr/bin/python3.
func testPython(t *testing.T) string {
	t.Helper()
	py := os.Getenv("GANGRUN_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if _, err := os.Stat(py); err != nil {
		t.Fatalf("no Python with torch (make test installs it; GANGRUN_PYTHON names it): %v", err)
	}
	return py
}

func TestParsePython(t *testing.T) {
	for _, c := range []struct {
		argv           []string
		ok             bool
		interp         int
		script, module string
		args           []string
	}{
		{[]string{"python3", "train.py", "--lr", "1"}, true, 1, "train.py", "", []string{"--lr", "1"}},
		{[]string{"/usr/bin/python3.11", "-u", "-X", "dev", "-W", "ignore", "-OO", "-B", "t.py"}, true, 8, "t.py", "", nil},
		{[]string{"python", "-Xfrozen_modules=off", "-Wd", "-m", "pkg.train", "-m", "x"}, true, 3, "", "pkg.train", []string{"-m", "x"}},
		{[]string{"python3", "-c", "print(1)"}, false, 0, "", "", nil},
		{[]string{"python3", "-I", "t.py"}, false, 0, "", "", nil},
		{[]string{"python3", "-u"}, false, 0, "", "", nil},
		{[]string{"python3", "-m"}, false, 0, "", "", nil},
		{[]string{"python3", "-"}, false, 0, "", "", nil},
		{[]string{"/bin/sh", "-c", "python3 t.py"}, false, 0, "", "", nil},
		{[]string{"torchrun", "t.py"}, false, 0, "", "", nil},
	} {
		pc, ok := parsePython(c.argv)
		if ok != c.ok {
			t.Errorf("%q: ok %v, want %v", c.argv, ok, c.ok)
			continue
		}
		if ok && (len(pc.interp) != c.interp || pc.script != c.script || pc.module != c.module || !slices.Equal(pc.args, c.args)) {
			t.Errorf("%q: %+v", c.argv, pc)
		}
	}
}

// warmScript is the training script of the warm tests: rank 0 imports a module of its
// directory that reads WARM_TEST_VAR and RANK at import time, prints what a script
// can see of how it was started, waits for rank 1 to have done the same and exited
// (SystemExit 0), and fails with an uncaught exception under torch's @record.
const warmScript = `
import os, sys, json, time
import helper
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    rank = os.environ["RANK"]
    print(json.dumps({"argv": sys.argv, "name": __name__, "path0": sys.path[0], "file": __file__,
                      "var": helper.VAR, "rank_at_import": helper.RANK, "rank": rank,
                      "cwd": os.getcwd(), "spec": __spec__ and __spec__.name}), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    done = os.path.join(os.environ["WARM_TEST_DIR"], "done-%s" % os.environ["GANGRUN_ATTEMPT"])
    if rank == "1":
        open(done, "w").close()
        sys.exit(0)
    for _ in range(1200):
        if os.path.exists(done):
            break
        time.sleep(0.05)
    if "WARM_TEST_EXIT" in os.environ:
        sys.exit(int(os.environ["WARM_TEST_EXIT"]))
    raise ValueError("boom")

if __name__ == "__main__":
    main()
`

func writeWarmScript(t *testing.T) (dir string) {
	t.Helper()
	dir = t.TempDir()
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{
		"train.py":  warmScript,
		"helper.py": "import os\nVAR = os.environ.get('WARM_TEST_VAR')\nRANK = os.environ.get('RANK')\n",
	} {
		if err := os.WriteFile(filepath.Join(sub, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestWarmRestartRunsLikeCold: attempt 0 starts cold, attempt 1 from the standbys; each
// rank's output, exit code and error file are the same on both.
func TestWarmRestartRunsLikeCold(t *testing.T) {
	torchtest.Each(t, func(t *testing.T, tp torchtest.Python) {
		py := tp.Path
		dir := writeWarmScript(t)
		t.Chdir(dir)
		r := newTestRun(t, 2, "")
		rec := &event.Recorder{}
		r.cfg.Events = rec
		r.cfg.Command = []string{py, "-u", "sub/train.py", "--flag", "a b"}
		r.cfg.MaxRestarts = 1
		r.cfg.WarmRestarts = true
		r.cfg.LogDir = filepath.Join(dir, "logs")
		r.cfg.Tee = true
		r.cfg.Env.Base = append(r.cfg.Env.Base, "WARM_TEST_VAR=from-env", "WARM_TEST_DIR="+dir)
		res := r.run(t)
		if res.ExitCode != 1 || res.Attempts != 2 {
			t.Fatalf("exit %d after %d attempts, want 1 after 2; stderr:\n%s", res.ExitCode, res.Attempts, r.stderr)
		}
		if !strings.Contains(r.stderr.String(), `workers started	{"attempt": 0, "warm": 0, "cold": 2}`) ||
			!strings.Contains(r.stderr.String(), `workers started	{"attempt": 1, "warm": 2, "cold": 0}`) {
			t.Fatalf("want attempt 0 cold and attempt 1 warm; stderr:\n%s", r.stderr)
		}
		fails := rec.Of(event.WorkerFailed)
		if len(fails) != 2 || fails[0].ExitCode != 1 || fails[1].ExitCode != 1 || fails[0].Rank != 0 || fails[1].Rank != 0 {
			t.Fatalf("failures %+v: want rank 0, exit code 1, on both attempts", fails)
		}
		read := func(attempt, rank, name string) string {
			data, err := os.ReadFile(filepath.Join(dir, "logs", "attempt_"+attempt, "rank_"+rank, name))
			if err != nil {
				t.Fatal(err)
			}
			return string(data)
		}
		for _, rank := range []string{"0", "1"} {
			for _, name := range []string{"stdout.log", "stderr.log"} {
				cold, warm := read("0", rank, name), read("1", rank, name)
				if cold != warm {
					t.Errorf("rank %s %s differs:\ncold:\n%s\nwarm:\n%s", rank, name, cold, warm)
				}
			}
			out := read("1", rank, "stdout.log")
			for _, want := range []string{
				`"argv": ["sub/train.py", "--flag", "a b"]`, `"name": "__main__"`,
				`"path0": "` + filepath.Join(dir, "sub") + `"`, `"file": "` + filepath.Join(dir, "sub", "train.py") + `"`,
				`"var": "from-env"`, `"rank_at_import": "` + rank + `"`, `"spec": null`,
			} {
				if !strings.Contains(out, want) {
					t.Errorf("rank %s's warm output lacks %s:\n%s", rank, want, out)
				}
			}
			if !strings.Contains(r.stdout.String(), "[rank"+rank+`]: {"argv"`) {
				t.Errorf("console lacks rank %s's prefixed line:\n%s", rank, r.stdout)
			}
		}
		if !strings.Contains(read("1", "0", "stderr.log"), "ValueError: boom") {
			t.Errorf("no traceback in the warm attempt's stderr")
		}
		rep, ok := ReadErrorFile(filepath.Join(dir, "logs", "attempt_1", "rank_0", errorFileName))
		if !ok || !strings.Contains(rep.Message, "boom") {
			t.Errorf("warm attempt's error file: %+v, %v", rep, ok)
		}
	})
}

// TestWarmRestartModule: python -m runs from a standby as from a fresh interpreter, and
// a SystemExit code is the exit code.
func TestWarmRestartModule(t *testing.T) {
	py := testPython(t)
	dir := writeWarmScript(t)
	t.Chdir(filepath.Join(dir, "sub"))
	r := newTestRun(t, 2, "")
	r.cfg.Command = []string{py, "-m", "train", "x"}
	r.cfg.MaxRestarts = 1
	r.cfg.WarmRestarts = true
	r.cfg.WarmImports = []string{"json"}
	r.cfg.LogDir = filepath.Join(dir, "logs")
	r.cfg.Env.Base = append(r.cfg.Env.Base, "WARM_TEST_VAR=v", "WARM_TEST_DIR="+dir, "WARM_TEST_EXIT=7")
	rec := &event.Recorder{}
	r.cfg.Events = rec
	res := r.run(t)
	if fails := rec.Of(event.WorkerFailed); len(fails) != 2 || fails[0].ExitCode != 7 || fails[1].ExitCode != 7 {
		t.Errorf("failures %+v: want exit code 7 (SystemExit) on both attempts", fails)
	}
	if res.ExitCode != 7 || res.Attempts != 2 || !strings.Contains(r.stderr.String(), `"attempt": 1, "warm": 2`) {
		t.Fatalf("exit %d after %d attempts, want 7 after 2, warm; stderr:\n%s", res.ExitCode, res.Attempts, r.stderr)
	}
	for _, name := range []string{"stdout.log", "stderr.log"} {
		cold, _ := os.ReadFile(filepath.Join(dir, "logs", "attempt_0", "rank_0", name))
		warm, _ := os.ReadFile(filepath.Join(dir, "logs", "attempt_1", "rank_0", name))
		if string(cold) != string(warm) || len(cold) == 0 {
			t.Errorf("%s differs:\ncold:\n%s\nwarm:\n%s", name, cold, warm)
		}
	}
}

// TestWarmRestartFallsBackCold: a standby SIGKILLed before the restart leaves its rank
// to start cold, which the log says.
func TestWarmRestartFallsBackCold(t *testing.T) {
	py := testPython(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "t.py")
	// Attempt 0 waits for its standby, SIGKILLs it and fails; attempt 1 prints.
	err := os.WriteFile(script, []byte(`
import os, signal, sys, time
mark = os.environ["TEST_MARK"].encode()
if os.environ["GANGRUN_ATTEMPT"] == "0":
    for _ in range(1200):
        for pid in os.listdir("/proc"):
            try:
                cmd = open("/proc/%s/cmdline" % pid, "rb").read()
                env = open("/proc/%s/environ" % pid, "rb").read()
            except (OSError, ValueError):
                continue
            if b"standby.py" in cmd and b"TEST_MARK=" + mark in env:
                os.kill(int(pid), signal.SIGKILL)
                print("killed the standby", flush=True)
                sys.exit(3)
        time.sleep(0.05)
    sys.exit(4)
print("attempt", os.environ["GANGRUN_ATTEMPT"], "ran", flush=True)
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	r := newTestRun(t, 1, "")
	r.cfg.Command = []string{py, script}
	r.cfg.MaxRestarts = 1
	r.cfg.WarmRestarts = true
	res := r.run(t)
	if res.ExitCode != 0 || res.Attempts != 2 {
		t.Fatalf("exit %d after %d attempts, want 0 after 2; stderr:\n%s\nstdout:\n%s", res.ExitCode, res.Attempts, r.stderr, r.stdout)
	}
	if !strings.Contains(r.stdout.String(), "[rank0]: killed the standby") || !strings.Contains(r.stdout.String(), "[rank0]: attempt 1 ran") {
		t.Fatalf("stdout:\n%s", r.stdout)
	}
	if !strings.Contains(r.stderr.String(), "starting rank cold: its standby") ||
		!strings.Contains(r.stderr.String(), `workers started	{"attempt": 1, "warm": 0, "cold": 1}`) {
		t.Fatalf("the log does not say rank 0 started cold:\n%s", r.stderr)
	}
}
