package main

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/flagfile"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/slurm"
)

// makeIn runs make in the repository with args, building the binary into the test's
// own directory (BIN) rather than the checkout's bin/, and returns its output.
func makeIn(t *testing.T, bin string, args ...string) string {
	t.Helper()
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		goTool = "go"
	}
	cmd := exec.Command("make", append([]string{"-s", "-C", repoRoot(t), "GO=" + goTool, "BIN=" + bin}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// tree lists the files and links under root, relative, with their modes.
func tree(t *testing.T, root string) map[string]fs.FileMode {
	t.Helper()
	out := map[string]fs.FileMode{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		out["/"+rel] = info.Mode()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// installedFiles are the files make install puts on a node for a PREFIX, and their
// modes; with slurmLinks, the links of Slurm's command names to gangrun too.
func installedFiles(prefix string, slurmLinks bool) map[string]fs.FileMode {
	files := map[string]fs.FileMode{
		prefix + "/bin/gangrun":                              0o755,
		prefix + "/lib/systemd/system/gangrun-agent.service": 0o644,
		"/etc/gangrun/agent.conf":                            0o644,
		"/etc/gangrun/agent.env":                             0o644,
		prefix + "/share/doc/gangrun/operations.md":          0o644,
		prefix + "/share/doc/gangrun/examples/agent.conf":    0o644,
		prefix + "/share/doc/gangrun/examples/agent.env":     0o644,
	}
	if slurmLinks {
		for _, n := range slurm.Names() {
			files[prefix+"/bin/"+n] = fs.ModeSymlink | 0o777
		}
	}
	return files
}

// TestMakeInstall: make install DESTDIR=... puts the binary, the unit (its paths filled
// in for the PREFIX), the settings files and the guide where they belong, with their
// modes; a second install keeps the operator's agent.conf; make uninstall removes what
// install put there but the settings.
func TestMakeInstall(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "gangrun")
	for _, prefix := range []string{"/usr/local", "/usr"} {
		t.Run(prefix, func(t *testing.T) {
			dest := t.TempDir()
			makeIn(t, bin, "install", "DESTDIR="+dest, "PREFIX="+prefix)
			if got, want := tree(t, dest), installedFiles(prefix, true); !reflect.DeepEqual(got, want) {
				t.Errorf("installed %v\nwant      %v", got, want)
			}
			unit, err := os.ReadFile(filepath.Join(dest, prefix, "lib/systemd/system/gangrun-agent.service"))
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(unit, []byte("@")) {
				t.Errorf("the unit holds a placeholder not filled in:\n%s", unit)
			}
			for _, want := range []string{
				"ExecStart=" + prefix + "/bin/gangrun agent --config /etc/gangrun/agent.conf\n",
				"EnvironmentFile=-/etc/gangrun/agent.env\n",
				"Documentation=file:" + prefix + "/share/doc/gangrun/operations.md\n",
			} {
				if !bytes.Contains(unit, []byte(want)) {
					t.Errorf("the unit lacks %q", want)
				}
			}
			out, err := exec.Command(filepath.Join(dest, prefix, "bin/gangrun"), "version").CombinedOutput()
			if err != nil || !strings.HasPrefix(string(out), "gangrun ") {
				t.Errorf("the installed gangrun version: %v %s", err, out)
			}
			// An operator's settings survive the next install.
			conf := filepath.Join(dest, "etc/gangrun/agent.conf")
			if err := os.WriteFile(conf, []byte("consul = 10.0.0.1:8500\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if out := makeIn(t, bin, "install", "DESTDIR="+dest, "PREFIX="+prefix); !strings.Contains(out, "kept "+conf) {
				t.Errorf("second install said %q, want that it kept %s", out, conf)
			}
			if b, _ := os.ReadFile(conf); string(b) != "consul = 10.0.0.1:8500\n" {
				t.Errorf("agent.conf after a second install: %q", b)
			}
			makeIn(t, bin, "uninstall", "DESTDIR="+dest, "PREFIX="+prefix)
			want := map[string]fs.FileMode{"/etc/gangrun/agent.conf": 0o644, "/etc/gangrun/agent.env": 0o644}
			if got := tree(t, dest); !reflect.DeepEqual(got, want) {
				t.Errorf("after uninstall %v, want the settings alone %v", got, want)
			}
		})
	}
}

// hostUnits copies the host's systemd units (the targets and services the agent's unit
// names) into root, for systemd-analyze verify --root: it resolves every dependency
// inside root.
func hostUnits(t *testing.T, root string) {
	t.Helper()
	dst := filepath.Join(root, "usr/lib/systemd/system")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	src := "/usr/lib/systemd/system"
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() || e.Name() == "gangrun-agent.service" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			continue // a dangling alias link
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// verifyUnit runs systemd-analyze verify on the unit inside root and returns what it
// printed and whether it exited 0. It works without a running systemd (a container):
// --root resolves the unit, its ExecStart binary and its dependencies inside root.
func verifyUnit(t *testing.T, root string) (string, bool) {
	t.Helper()
	cmd := exec.Command("systemd-analyze", "verify", "--root="+root, "gangrun-agent.service")
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err == nil
}

// TestUnitVerifies: systemd-analyze verify finds nothing to say about the installed
// unit, for both PREFIXes; and it does find a broken one (a KillMode it does not know,
// an ExecStart binary that is not there), so its silence means something.
func TestUnitVerifies(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Fatal("systemd-analyze is needed (Debian's systemd package): ", err)
	}
	bin := filepath.Join(t.TempDir(), "gangrun")
	for _, prefix := range []string{"/usr/local", "/usr"} {
		t.Run(prefix, func(t *testing.T) {
			root := t.TempDir()
			makeIn(t, bin, "install", "DESTDIR="+root, "PREFIX="+prefix)
			hostUnits(t, root)
			if out, ok := verifyUnit(t, root); !ok || out != "" {
				t.Errorf("systemd-analyze verify: ok=%v\n%s", ok, out)
			}
			unitPath := filepath.Join(root, prefix, "lib/systemd/system/gangrun-agent.service")
			unit, err := os.ReadFile(unitPath)
			if err != nil {
				t.Fatal(err)
			}
			settings := unitSettings(string(unit))
			for key, want := range map[string]string{
				"KillMode": "process", "Delegate": "yes", "TasksMax": "infinity", "Restart": "on-failure",
				"LimitMEMLOCK": "infinity", "RestartPreventExitStatus": "2", "Type": "simple", "WantedBy": "multi-user.target",
			} {
				if got := settings[key]; len(got) != 1 || got[0] != want {
					t.Errorf("%s=%v, want %s", key, got, want)
				}
			}
			for _, key := range []string{"Wants", "After"} {
				for _, unit := range []string{"network-online.target", "consul.service", "munge.service"} {
					if !slices.Contains(strings.Fields(strings.Join(settings[key], " ")), unit) {
						t.Errorf("%s= lacks %s: %v", key, unit, settings[key])
					}
				}
			}
			if len(settings["Requires"]) > 0 {
				t.Errorf("Requires=%v: a node without that unit could not start the agent", settings["Requires"])
			}
			// The controls: what verify must not let pass.
			broken := strings.Replace(string(unit), "KillMode=process", "KillMode=processes", 1)
			if err := os.WriteFile(unitPath, []byte(broken), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, _ := verifyUnit(t, root); !strings.Contains(out, "kill mode") {
				t.Errorf("verify of KillMode=processes said %q", out)
			}
			if err := os.WriteFile(unitPath, unit, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(filepath.Join(root, prefix, "bin/gangrun")); err != nil {
				t.Fatal(err)
			}
			if out, ok := verifyUnit(t, root); ok || !strings.Contains(out, "is not executable") {
				t.Errorf("verify without the binary: ok=%v %q", ok, out)
			}
		})
	}
}

// unitSettings reads a unit file's KEY=VALUE lines, every value of each key in order.
func unitSettings(unit string) map[string][]string {
	out := map[string][]string{}
	sc := bufio.NewScanner(strings.NewReader(unit))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' || line[0] == '[' {
			continue
		}
		k, v, _ := strings.Cut(line, "=")
		out[k] = append(out[k], v)
	}
	return out
}

// TestExampleSettingsListEveryAgentFlag: the installed agent.conf lists every flag of
// gangrun agent (but --config) as a commented KEY = VALUE line, with the flag's own
// default where it has one; uncommented, the file is one gangrun agent --config takes.
// A flag added to the agent without a line here fails this test.
func TestExampleSettingsListEveryAgentFlag(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "packaging", "agent.conf"))
	if err != nil {
		t.Fatal(err)
	}
	fs, _ := newAgentFlags(&env{stdout: new(bytes.Buffer), stderr: new(bytes.Buffer), getenv: func(string) string { return "" }}, "agent", "")
	shown := map[string]string{} // key → the first value the example gives it
	var uncommented []string
	for _, line := range strings.Split(string(data), "\n") {
		rest, ok := strings.CutPrefix(line, "#")
		if !ok {
			if strings.TrimSpace(line) != "" {
				t.Errorf("line %q is set, not commented: the installed file changes no default", line)
			}
			continue
		}
		k, v, ok := strings.Cut(rest, " = ")
		if !ok || strings.ContainsAny(k, " #") {
			if strings.HasSuffix(strings.TrimSpace(rest), " =") {
				k, v, ok = strings.TrimSuffix(strings.TrimSpace(rest), " ="), "", true
			} else {
				continue // prose
			}
		}
		if _, seen := shown[k]; !seen {
			shown[k] = v
		}
		if v != "" {
			uncommented = append(uncommented, k+" = "+v)
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name == configFlag {
			return
		}
		v, ok := shown[f.Name]
		switch {
		case !ok:
			t.Errorf("agent flag --%s has no line in packaging/agent.conf", f.Name)
		case f.DefValue != "" && f.DefValue != "[]" && v != f.DefValue:
			t.Errorf("packaging/agent.conf shows %s = %s, but the flag's default is %s", f.Name, v, f.DefValue)
		}
	})
	for k := range shown {
		if fs.Lookup(k) == nil || k == configFlag {
			t.Errorf("packaging/agent.conf names %q, which is no agent flag", k)
		}
	}
	settings, err := flagfile.Parse([]byte(strings.Join(uncommented, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	if err := flagfile.Apply(fs, "agent.conf", settings, configFlag); err != nil {
		t.Errorf("the example, uncommented: %v", err)
	}
}

// TestAgentConfigFile: gangrun agent --config refuses a file with an unknown key or a
// bad value in one line, exit 2, before it does anything; flags on the command line
// win over the file (an agent whose file names a Consul that is not there but whose
// --consul is good registers).
func TestAgentConfigFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct{ file, want string }{
		{write("unknown.conf", "# gpu nodes\nconsul = 127.0.0.1:1\nnode-nam = a\n"),
			`gangrun agent: --config ` + dir + `/unknown.conf line 3: unknown key "node-nam" (did you mean node-name?)`},
		{write("twice.conf", "node-name = a\nnode-name = b\n"),
			`gangrun agent: --config ` + dir + `/twice.conf line 2: node-name given twice (first on line 1): it takes one value`},
		{write("bad.conf", "waste-after = 1ms\n"),
			`gangrun agent: --config ` + dir + `/bad.conf line 1: waste-after "1ms": must be at least 1s`},
		{write("config.conf", "config = /etc/gangrun/other.conf\n"),
			`gangrun agent: --config ` + dir + `/config.conf line 1: unknown key "config": it cannot be set in the file (the keys are the command's flags, without their dashes: see its --help)`},
		{filepath.Join(dir, "missing.conf"), `gangrun agent: --config ` + dir + `/missing.conf: no such file`},
	} {
		t.Run(filepath.Base(tc.file), func(t *testing.T) {
			cmd := exec.Command(gangrunBin, "agent", "--config", tc.file)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != exitUsage {
				t.Errorf("exit %v, want %d", err, exitUsage)
			}
			if got := strings.TrimSpace(stderr.String()); got != tc.want {
				t.Errorf("stderr %q\nwant   %q", got, tc.want)
			}
		})
	}
	consul := consultest.Start(t)
	inv := filepath.Join(repoRoot(t), "topology", "testdata", "inventories", "dgx-h100.json")
	conf := write("agent.conf", "consul = 127.0.0.1:1\nnode-name = from-file\nadvertise-addr = 127.0.0.1\ntopology-file = "+inv+"\nlabels = partition=gpu\nlabels = rack=r1\n")
	startAgentWith(t, consul.Addr, "from-cli", nil, "--config", conf)
	waitUntilFor(t, 60*time.Second, func() bool {
		for _, n := range nodesJSON(t, consul.Addr) {
			if n.Name == "from-cli" && n.State == "up" {
				if n.Labels["partition"] != "gpu" || n.Labels["rack"] != "r1" || n.GPUsTotal != 8 {
					t.Fatalf("node %+v: want the file's labels and inventory", n)
				}
				return true
			}
		}
		return false
	}, "the agent up under the command line's name and Consul, with the file's labels")
}

// buildDeb builds the Debian package with scripts/package-deb.sh (gzip: faster) from
// a binary built into the test's directory, and returns its path.
func buildDeb(t *testing.T, version string) string {
	t.Helper()
	out := t.TempDir()
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	cmd := exec.Command(filepath.Join(repoRoot(t), "scripts", "package-deb.sh"), out)
	cmd.Env = append(os.Environ(), "DEB_VERSION="+version, "DEB_COMPRESS=gzip", "BIN="+filepath.Join(t.TempDir(), "gangrun"),
		"PATH="+filepath.Dir(goTool)+":"+os.Getenv("PATH"))
	b, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("package-deb.sh: %v\n%s", err, stderr)
	}
	deb := strings.TrimSpace(string(b))
	if filepath.Dir(deb) != out {
		t.Fatalf("package-deb.sh printed %q, want a package in %s", deb, out)
	}
	return deb
}

// dpkgDeb runs dpkg-deb with args and returns its output.
func dpkgDeb(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("dpkg-deb", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg-deb %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// scratchRoot makes an empty root dpkg can install into: its database, empty.
func scratchRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"var/lib/dpkg/status", "var/lib/dpkg/available"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// dpkgRoot runs dpkg on root: maintainer scripts without chroot (root has no shell),
// with DPKG_ROOT set, as dpkg gives them; libc6 is the host's, not root's.
func dpkgRoot(t *testing.T, root string, args ...string) string {
	t.Helper()
	cmd := exec.Command("dpkg", append([]string{"--root=" + root, "--force-script-chrootless", "--force-depends"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestDebPackage: the package scripts/package-deb.sh builds holds what make install
// puts on a node (PREFIX=/usr) owned by root, with its control fields, conffiles and
// maintainer scripts; it installs into an empty root with dpkg, starting nothing; the
// agent started as the installed unit's ExecStart starts it (its argv, the installed
// agent.conf edited as an operator would, the unit's EnvironmentFile) joins a test
// cluster and runs a job; removal keeps the settings, purge removes them.
func TestDebPackage(t *testing.T) {
	for _, tool := range []string{"dpkg-deb", "dpkg"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (Debian's dpkg): %v", tool, err)
		}
	}
	deb := buildDeb(t, "0~test1")
	info := dpkgDeb(t, "--field", deb)
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok && !strings.HasPrefix(line, " ") {
			fields[k] = v
		}
	}
	goarch := runtime.GOARCH // amd64 and arm64 are their Debian names too
	for k, want := range map[string]string{"Package": "gangrun", "Version": "0~test1", "Architecture": goarch,
		"Section": "admin", "Priority": "optional", "Recommends": "munge"} {
		if fields[k] != want {
			t.Errorf("control field %s: %q, want %q", k, fields[k], want)
		}
	}
	if !strings.HasPrefix(fields["Depends"], "libc6 (>= 2.") || fields["Maintainer"] == "" || fields["Installed-Size"] == "" {
		t.Errorf("control fields %v", fields)
	}
	if base := filepath.Base(deb); base != "gangrun_0~test1_"+goarch+".deb" {
		t.Errorf("package file %s", base)
	}
	if got := dpkgDeb(t, "--info", deb, "conffiles"); got != "/etc/gangrun/agent.conf\n/etc/gangrun/agent.env\n" {
		t.Errorf("conffiles %q", got)
	}
	// The files: make install's for PREFIX=/usr, root's, with their modes.
	// The package has no Slurm links: they would be Debian's slurm-client's files.
	want := installedFiles("/usr", false)
	var files []string
	for _, line := range strings.Split(strings.TrimSpace(dpkgDeb(t, "--contents", deb)), "\n") {
		f := strings.Fields(line) // -rw-r--r-- root/root 2134 2025-01-01 00:00 ./etc/gangrun/agent.conf
		if len(f) != 6 || f[1] != "root/root" {
			t.Errorf("entry %q: want root/root", line)
			continue
		}
		name := strings.TrimPrefix(f[5], ".")
		if strings.HasPrefix(f[0], "d") {
			if f[0] != "drwxr-xr-x" {
				t.Errorf("directory %s has mode %s, want drwxr-xr-x", name, f[0])
			}
			continue
		}
		files = append(files, name)
		if m, ok := want[name]; !ok || f[0] != m.String() {
			t.Errorf("file %s mode %s, want %v", name, f[0], m)
		}
	}
	wantFiles := make([]string, 0, len(want))
	for f := range want {
		wantFiles = append(wantFiles, f)
	}
	sort.Strings(files)
	sort.Strings(wantFiles)
	if !reflect.DeepEqual(files, wantFiles) {
		t.Errorf("package files %v\nwant           %v", files, wantFiles)
	}

	root := scratchRoot(t)
	out := dpkgRoot(t, root, "--install", deb)
	if !strings.Contains(out, "Setting up gangrun (0~test1)") {
		t.Errorf("dpkg --install said:\n%s", out)
	}
	if got, want := dpkgStatus(t, root), "install ok installed"; got != want {
		t.Errorf("dpkg status %q, want %q", got, want)
	}
	if _, err := os.Lstat(filepath.Join(root, "etc/systemd/system/multi-user.target.wants/gangrun-agent.service")); err == nil {
		t.Error("the install enabled the unit")
	}
	joinClusterAsTheUnit(t, root)

	// Removal keeps the operator's settings (conffiles); purge removes them.
	dpkgRoot(t, root, "--remove", "gangrun")
	for _, f := range []string{"usr/bin/gangrun", "usr/lib/systemd/system/gangrun-agent.service"} {
		if _, err := os.Lstat(filepath.Join(root, f)); err == nil {
			t.Errorf("%s left after --remove", f)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "etc/gangrun/agent.conf")); err != nil {
		t.Errorf("agent.conf gone after --remove: %v", err)
	}
	dpkgRoot(t, root, "--purge", "gangrun")
	if _, err := os.Lstat(filepath.Join(root, "etc/gangrun/agent.conf")); err == nil {
		t.Error("agent.conf left after --purge")
	}
}

// dpkgStatus is gangrun's Status in root's dpkg database.
func dpkgStatus(t *testing.T, root string) string {
	t.Helper()
	out, err := exec.Command("dpkg-query", "--admindir="+filepath.Join(root, "var/lib/dpkg"), "-W", "-f=${Status}", "gangrun").Output()
	if err != nil {
		t.Fatalf("dpkg-query: %v", err)
	}
	return string(out)
}

// joinClusterAsTheUnit starts the agent installed under root as its unit does: the
// unit's ExecStart argv (paths under root), the unit's EnvironmentFile; the installed
// agent.conf and agent.env edited as an operator would for a test cluster (Consul's
// address, the node's name and a recorded inventory; the test's munged). The node
// comes up and runs a job to completion, its step the installed binary.
func joinClusterAsTheUnit(t *testing.T, root string) {
	t.Helper()
	unit, err := os.ReadFile(filepath.Join(root, "usr/lib/systemd/system/gangrun-agent.service"))
	if err != nil {
		t.Fatal(err)
	}
	settings := unitSettings(string(unit))
	if len(settings["ExecStart"]) != 1 || len(settings["EnvironmentFile"]) != 1 {
		t.Fatalf("unit ExecStart %v EnvironmentFile %v", settings["ExecStart"], settings["EnvironmentFile"])
	}
	argv := strings.Fields(settings["ExecStart"][0])
	for i, a := range argv {
		if strings.HasPrefix(a, "/") {
			argv[i] = filepath.Join(root, a) // the unit's paths, in the scratch root
		}
	}
	if want := []string{filepath.Join(root, "usr/bin/gangrun"), "agent", "--config", filepath.Join(root, "etc/gangrun/agent.conf")}; !reflect.DeepEqual(argv, want) {
		t.Fatalf("ExecStart %q, want %q", argv, want)
	}
	consul := consultest.Start(t)
	inv := filepath.Join(repoRoot(t), "topology", "testdata", "inventories", "dgx-h100.json")
	conf := filepath.Join(root, "etc/gangrun/agent.conf")
	example, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.NewReplacer("#consul = 127.0.0.1:8500", "consul = "+consul.Addr, "#node-name =", "node-name = pkg-node",
		"#advertise-addr =", "advertise-addr = 127.0.0.1", "#topology-file =", "topology-file = "+inv,
		"#labels = partition=gpu", "labels = partition=gpu").Replace(string(example))
	if err := os.WriteFile(conf, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	envFile := filepath.Join(root, strings.TrimPrefix(settings["EnvironmentFile"][0], "-"))
	envText, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	envText = append(envText, "MUNGE_SOCKET="+testMunge.Socket+"\n"...)
	if err := os.WriteFile(envFile, envText, 0o644); err != nil {
		t.Fatal(err)
	}
	// systemd's environment: its own PATH and what the EnvironmentFile sets, nothing of
	// the test's but the mark that finds leftover processes.
	mark := testMark(t)
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", mark}
	for _, line := range strings.Split(string(envText), "\n") {
		if line = strings.TrimSpace(line); line != "" && line[0] != '#' {
			env = append(env, line)
		}
	}
	agent := exec.Command(argv[0], argv[1:]...)
	agent.Env, agent.Dir = env, "/"
	log := &syncBuffer{}
	agent.Stdout, agent.Stderr = log, log
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = agent.Process.Signal(syscall.SIGTERM)
			_ = agent.Wait()
		}
	}
	defer func() {
		stop()
		if t.Failed() {
			t.Logf("installed agent log:\n%s", log.String())
		}
	}()
	c := &jobCluster{t: t, consul: consul.Addr, mark: mark}
	waitUntilFor(t, 60*time.Second, func() bool {
		for _, n := range nodesJSON(t, consul.Addr) {
			if n.Name == "pkg-node" && n.State == "up" && n.GPUsTotal == 8 && n.Labels["partition"] == "gpu" && n.Auth == authMunge {
				return true
			}
		}
		return false
	}, "the packaged agent up, with agent.conf's name, labels and inventory, checking MUNGE credentials")
	dir := t.TempDir()
	t.Chdir(dir)
	id := c.submit("--gpus-per-node", "2", "--", "/bin/sh", "-c", `echo "hello from $GANGRUN_NODE_NAME"`)
	c.waitState(id, job.Completed, 90*time.Second)
	if out, err := os.ReadFile(filepath.Join(dir, "gangrun-"+id+".out")); err != nil || !strings.Contains(string(out), "hello from pkg-node") {
		t.Errorf("job output %q, %v", out, err)
	}
	stop()
	if code := agent.ProcessState.ExitCode(); code != 0 {
		t.Errorf("the agent exited %d on SIGTERM (systemctl stop), want 0", code)
	}
}
