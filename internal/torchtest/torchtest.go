// Package torchtest names the PyTorch installations the end-to-end tests run on, so a
// test whose outcome can differ between torch versions runs once on each (a matrix,
// not a copy of the test):
//
//   - Debian bookworm's torch 1.13 (CPU, gloo) through $GANGRUN_PYTHON, else
//     /usr/bin/python3;
//   - torch 2.x from PyPI (requirements/torch2.txt) through $GANGRUN_PYTHON2, else the
//     interpreter scripts/install-torch2.sh installs, found the way it finds it: the
//     virtual environment ${XDG_CACHE_HOME:-~/.cache}/gangrun/torch2-<first 12 hex
//     digits of the requirements file's sha256>.
//
// Over torch 2.x, the trainers the checkpoint tests save with (requirements/trainers.txt)
// through $GANGRUN_TRAINERS (Trainers), and the Slurm clients the Slurm front end's
// client tests run (requirements/clients.txt) through $GANGRUN_CLIENTS (Clients).
//
// `make test` installs all three and exports their variables. A missing installation
// fails the test that asks for it, naming what to run; it never skips.
package torchtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// Python is one interpreter with torch.
type Python struct {
	// Path is the interpreter's path.
	Path string
	// Version is torch.__version__ as it prints it ("1.13.0a0", "2.15.0+cu130").
	Version string
	// Bin is the directory holding the interpreter and the console scripts of its
	// environment (torchrun for torch 2.x; Debian's torchrun is /usr/bin/torchrun).
	Bin string
}

// Name is the subtest name of the installation: "torch" and its major.minor version,
// "torch1.13", "torch2.15".
func (p Python) Name() string {
	v := p.Version
	if i := strings.IndexAny(v, "+a"); i >= 0 {
		v = v[:i]
	}
	parts := strings.SplitN(v, ".", 3)
	if len(parts) >= 2 {
		v = parts[0] + "." + parts[1]
	}
	return "torch" + v
}

// Major is torch's major version (1 or 2).
func (p Python) Major() int {
	if strings.HasPrefix(p.Version, "1.") {
		return 1
	}
	return 2
}

// probes caches each interpreter's torch version (or the error importing it) for the
// test binary's life: importing torch takes seconds.
var probes sync.Map // path → *probe

type probe struct {
	once    sync.Once
	version string
	err     string
}

// Debian returns Debian's torch 1.13: $GANGRUN_PYTHON, else /usr/bin/python3.
func Debian(t testing.TB) Python {
	t.Helper()
	py := os.Getenv("GANGRUN_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	return load(t, py, "`make test` installs Debian's python3-torch (scripts/install-deps.sh torch)")
}

// PyPI returns torch 2.x from PyPI: $GANGRUN_PYTHON2, else scripts/install-torch2.sh's
// interpreter for this checkout's requirements/torch2.txt.
func PyPI(t testing.TB) Python {
	t.Helper()
	py := os.Getenv("GANGRUN_PYTHON2")
	if py == "" {
		py = defaultPyPI(t)
	}
	return load(t, py, "`make test` installs it (scripts/install-torch2.sh)")
}

// All returns every installation, Debian's first.
func All(t testing.TB) []Python {
	t.Helper()
	return []Python{Debian(t), PyPI(t)}
}

// Each runs fn as a subtest for every installation ("torch1.13", "torch2.15"), one after
// the other (they would compete for this machine's CPUs).
func Each(t *testing.T, fn func(t *testing.T, py Python)) {
	t.Helper()
	for _, py := range All(t) {
		t.Run(py.Name(), func(t *testing.T) { fn(t, py) })
	}
}

// defaultPyPI is where scripts/install-torch2.sh installs the interpreter.
func defaultPyPI(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	req := filepath.Join(filepath.Dir(file), "..", "..", "requirements", "torch2.txt")
	data, err := os.ReadFile(req)
	if err != nil {
		t.Fatalf("torch 2.x: %v (GANGRUN_PYTHON2 names the interpreter otherwise)", err)
	}
	sum := sha256.Sum256(data)
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "gangrun", "torch2-"+hex.EncodeToString(sum[:])[:12], "bin", "python")
}

// load returns py's installation, importing torch once per test binary.
func load(t testing.TB, py, install string) Python {
	t.Helper()
	v, _ := probes.LoadOrStore(py, &probe{})
	p := v.(*probe)
	p.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, py, "-c", "import torch, torch.distributed; print(torch.__version__)").Output()
		if err != nil {
			msg := err.Error()
			var ee *exec.ExitError
			if errors.As(err, &ee) && len(ee.Stderr) > 0 {
				lines := strings.Split(strings.TrimSpace(string(ee.Stderr)), "\n")
				msg = lines[len(lines)-1]
			}
			p.err = msg
			return
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		p.version = lines[len(lines)-1]
	})
	if p.err != "" {
		t.Fatalf("torch is needed: %s cannot import it (%s); %s", py, p.err, install)
	}
	return Python{Path: py, Version: p.version, Bin: filepath.Dir(py)}
}

// Trainers returns the directory of the trainers the checkpoint tests save with
// (requirements/trainers.txt: transformers, accelerate, DeepSpeed, Lightning), to put on
// PYTHONPATH over torch 2.x from PyPI (PyPI(t)): $GANGRUN_TRAINERS, else where
// scripts/install-trainers.sh installs it, ${XDG_CACHE_HOME:-~/.cache}/gangrun/trainers-<first
// 12 hex digits of the sha256 of requirements/trainers.txt and requirements/torch2.txt>.
// A missing installation fails the test, naming what to run; it never skips.
func Trainers(t testing.TB) string {
	t.Helper()
	return packages(t, "trainers", "GANGRUN_TRAINERS")
}

// Clients returns the directory of the Slurm clients the Slurm front end's client tests
// run (requirements/clients.txt: submitit, dask-jobqueue), to put on PYTHONPATH over
// torch 2.x from PyPI as Trainers': $GANGRUN_CLIENTS, else where
// scripts/install-clients.sh installs it (clients-<hash>, as Trainers'). A missing
// installation fails the test, naming what to run; it never skips.
func Clients(t testing.TB) string {
	t.Helper()
	return packages(t, "clients", "GANGRUN_CLIENTS")
}

// packages is the directory scripts/install-NAME.sh installs requirements/NAME.txt to
// over torch 2.x: $envVar, else ${XDG_CACHE_HOME:-~/.cache}/gangrun/NAME-<first 12 hex
// digits of the sha256 of requirements/NAME.txt and requirements/torch2.txt>; it fails
// the test when that is not installed (no marker).
func packages(t testing.TB, name, envVar string) string {
	t.Helper()
	dir := os.Getenv(envVar)
	if dir == "" {
		_, file, _, _ := runtime.Caller(0)
		reqs := filepath.Join(filepath.Dir(file), "..", "..", "requirements")
		h := sha256.New()
		for _, f := range []string{name + ".txt", "torch2.txt"} {
			data, err := os.ReadFile(filepath.Join(reqs, f))
			if err != nil {
				t.Fatalf("%s: %v (%s names the directory otherwise)", name, err, envVar)
			}
			h.Write(data)
		}
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache")
		}
		dir = filepath.Join(cache, "gangrun", name+"-"+hex.EncodeToString(h.Sum(nil))[:12])
	}
	if _, err := os.Stat(filepath.Join(dir, ".installed")); err != nil {
		t.Fatalf("the %s are needed: %s is not installed (%v); `make test` installs it (scripts/install-%s.sh)", name, dir, err, name)
	}
	return dir
}
