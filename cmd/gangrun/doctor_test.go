package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun"
	"github.com/gangrun/gangrun/doctor"
	"github.com/gangrun/gangrun/internal/consultest"
)

// doctorRun runs gangrun doctor as a process and returns its exit code, stdout and
// stderr.
func doctorRun(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(gangrunBin, append([]string{"doctor"}, args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if cmd.ProcessState == nil {
		t.Fatalf("gangrun doctor: %v", err)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// doctorLine is one line of gangrun doctor: status, check, detail.
var doctorLine = regexp.MustCompile(`^(ok|warn|fail|skip) +(\S+) +(\S.*)$`)

// doctorLines parses gangrun doctor's output: one line per check, in doctor.Checks'
// order; status by check.
func doctorLines(t *testing.T, out string) map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != len(doctor.Checks) {
		t.Fatalf("%d lines, want one per check (%d):\n%s", len(lines), len(doctor.Checks), out)
	}
	status := map[string]string{}
	for i, l := range lines {
		m := doctorLine.FindStringSubmatch(l)
		if m == nil || m[2] != doctor.Checks[i] {
			t.Fatalf("line %d %q: want STATUS %s DETAIL", i+1, l, doctor.Checks[i])
		}
		status[m[2]] = m[1]
	}
	return status
}

// TestDoctorCommand: gangrun doctor on this machine with the tests' Consul and munged:
// one line per check, nothing failing, exit 0; the same as JSON (its version this
// binary's release); with an agent of the cluster registered, the version line names
// the release its node record carries (this one's, as the agent is this binary). Consul
// closed: the consul line fails, exit 1. The agent's settings file with a topology file
// that does not read: the topology line fails, exit 1; one with a bad key: exit 2, one
// line, no check run.
func TestDoctorCommand(t *testing.T) {
	consul := consultest.Start(t)
	code, out, errOut := doctorRun(t, "--consul", consul.Addr, "--node-name", "n1")
	if code != exitOK || errOut != "" {
		t.Fatalf("exit %d, stderr %q, want 0 and nothing:\n%s", code, errOut, out)
	}
	st := doctorLines(t, out)
	for check, want := range map[string]string{"consul": "warn", "munge": "ok", "cgroup": "ok", "gpus": "warn", "topology": "skip", "version": "ok"} {
		if st[check] != want {
			t.Errorf("%s: %s, want %s\n%s", check, st[check], want, out)
		}
	}
	if !strings.Contains(out, "warn  gpus      no NVIDIA GPU: none on the PCI bus") {
		t.Errorf("the GPU line does not say plainly there is none:\n%s", out)
	}

	code, out, _ = doctorRun(t, "--consul", consul.Addr, "--node-name", "n1", "--json")
	var doc struct {
		Node, Version string
		OK            bool
		Checks        []doctor.Result
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != exitOK {
		t.Fatalf("--json: exit %d, %v\n%s", code, err, out)
	}
	if doc.Node != "n1" || doc.Version != gangrun.Version() || !doc.OK || len(doc.Checks) != len(doctor.Checks) || doc.Checks[0].Check != "consul" || doc.Checks[0].Status != doctor.Warn {
		t.Errorf("--json: %+v", doc)
	}

	startAgentWith(t, consul.Addr, "gpu-1", nil)
	waitUntilFor(t, 60*time.Second, func() bool { return len(nodesJSON(t, consul.Addr)) == 1 }, "the agent registered")
	_, out, _ = doctorRun(t, "--consul", consul.Addr, "--node-name", "gpu-1")
	if want := "ok    version   this binary is " + gangrun.Version() + "; the registered agents: " + gangrun.Version() + " on 1 (gpu-1)"; !strings.Contains(out, want) {
		t.Errorf("version line:\n%s", out)
	}

	closed := freeLoopbackAddr(t)
	code, out, _ = doctorRun(t, "--consul", closed, "--node-name", "n1")
	if code != exitFailure || !strings.HasPrefix(out, "fail  consul    cannot reach Consul at "+closed+" (from --consul): connection refused; to fix: ") {
		t.Errorf("Consul closed: exit %d\n%s", code, out)
	}
	if st := doctorLines(t, out); st["clock"] == "ok" || st["version"] != "skip" {
		t.Errorf("Consul closed: clock %s, version %s", st["clock"], st["version"])
	}

	dir := t.TempDir()
	conf := filepath.Join(dir, "agent.conf")
	bad := filepath.Join(dir, "topo.json")
	if err := os.WriteFile(bad, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, []byte("consul = "+consul.Addr+"\nnode-name = n1\ntopology-file = "+bad+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, _ = doctorRun(t, "--config", conf)
	if st := doctorLines(t, out); code != exitFailure || st["topology"] != "fail" || st["consul"] != "warn" {
		t.Errorf("a bad topology file: exit %d\n%s", code, out)
	}
	if !strings.Contains(out, "fail  topology  --topology-file "+bad+": ") {
		t.Errorf("the topology line does not name the file:\n%s", out)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"extra"}, `gangrun doctor: unexpected argument "extra": doctor takes the agent's flags only`},
		{[]string{"--auth", "kerberos"}, `gangrun doctor: --auth "kerberos": want munge or none (default: munge where munged answers, else Consul's ACLs)`},
		{[]string{"--waste-threshold", "0"}, `gangrun doctor: --waste-threshold 0: want a utilisation in % above 0 and at most 100`},
		{[]string{"--advertise-addr", "gpu01"}, `gangrun doctor: --advertise-addr "gpu01": want an IP address (the other nodes connect to it)`},
	} {
		code, out, errOut := doctorRun(t, tc.args...)
		if code != exitUsage || out != "" || strings.TrimSpace(errOut) != tc.want {
			t.Errorf("doctor %v: exit %d, stdout %q, stderr %q\nwant exit 2 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
}
