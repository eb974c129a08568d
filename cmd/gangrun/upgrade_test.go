package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun"
	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
)

// beforeVersions is the commit the rolling-upgrade test upgrades from until a release
// tag older than VERSION exists: the last commit before records carried schema versions
// (its records have no "schema" member, which this gangrun reads as version 1). It has
// MUNGE identity, the request boxes, the sealed rendezvous, the recovery after Consul
// outages, and the fix that keeps a job's step running while its node's agent restarts
// (TestJobSurvivesAnotherNodesAgentRestart): a commit before that fix cannot be upgraded
// without stopping steps, as its elected agent takes a node whose agent stops for lost.
const beforeVersions = "e7e3eb7c4b015ae78b4e25c1e2ac28ecf39863f7"

// previousRelease returns the commit of the release before this one, and its name: the
// newest tag vX.Y.Z reachable from HEAD whose version is older than VERSION's, else
// beforeVersions.
func previousRelease(t *testing.T) (commit, name string) {
	t.Helper()
	out, err := exec.Command("git", "-C", repoRoot(t), "tag", "--list", "v*", "--merged", "HEAD").Output()
	if err != nil {
		t.Fatalf("git tag: %v (the rolling-upgrade test needs the repository's history: a full clone)", err)
	}
	cur := semver(gangrun.Version())
	best, bestName := []int(nil), ""
	for _, tag := range strings.Fields(string(out)) {
		v := semver(strings.TrimPrefix(tag, "v"))
		if v != nil && less(v, cur) && (best == nil || less(best, v)) {
			best, bestName = v, tag
		}
	}
	if best == nil {
		return beforeVersions, "the last commit before record versions (" + beforeVersions[:12] + ")"
	}
	rev, err := exec.Command("git", "-C", repoRoot(t), "rev-parse", bestName+"^{commit}").Output()
	if err != nil {
		t.Fatalf("git rev-parse %s: %v", bestName, err)
	}
	return strings.TrimSpace(string(rev)), bestName
}

// semver parses "X.Y.Z" (nil when it is not).
func semver(s string) []int {
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return nil
	}
	v := make([]int, 3)
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return nil
		}
		v[i] = n
	}
	return v
}

func less(a, b []int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// buildRelease returns the gangrun binary of commit, built from the repository's
// history (git archive of the commit, go build) and cached under
// ${XDG_CACHE_HOME:-~/.cache}/gangrun/gangrun-<commit>/ so that later runs take it at
// once. A commit the clone lacks fails the test: it needs the full history.
func buildRelease(t *testing.T, commit string) string {
	t.Helper()
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatal(err)
		}
		cache = filepath.Join(home, ".cache")
	}
	bin := filepath.Join(cache, "gangrun", "gangrun-"+commit, "gangrun")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	root := repoRoot(t)
	if err := exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		// A shallow clone (a CI's, say) lacks the history: fetch it from where the clone
		// came from, once, before giving up.
		if out, _ := exec.Command("git", "-C", root, "rev-parse", "--is-shallow-repository").Output(); strings.TrimSpace(string(out)) == "true" {
			if out, err := exec.Command("git", "-C", root, "fetch", "--quiet", "--unshallow").CombinedOutput(); err != nil {
				t.Logf("git fetch --unshallow: %v: %s", err, out)
			}
		}
	}
	if err := exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		t.Fatalf("commit %s is not in this clone (a shallow one?): the rolling-upgrade test builds it from the history", commit)
	}
	// git archive rather than a worktree: nothing is registered in the repository, so a
	// test killed half-way leaves nothing behind there.
	src := t.TempDir()
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", commit)
	untar := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	untar.Stdin = pipe
	if err := untar.Start(); err != nil {
		t.Fatal(err)
	}
	var archiveErr strings.Builder
	archive.Stderr = &archiveErr
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", commit, err, archiveErr.String())
	}
	if err := untar.Wait(); err != nil {
		t.Fatalf("untar %s: %v", commit, err)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		goTool = "go"
	}
	tmp := fmt.Sprintf("%s.%d.tmp", bin, os.Getpid())
	build := exec.Command(goTool, "build", "-o", tmp, "./cmd/gangrun")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=1", "CGO_CFLAGS=-Wno-deprecated-declarations")
	began := time.Now()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of %s: %v\n%s", commit, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil { // concurrent builders: the last rename wins, both whole
		t.Fatal(err)
	}
	t.Logf("built %s in %s, cached at %s", commit[:12], time.Since(began).Round(time.Second), bin)
	return bin
}

// install puts the binary src at dst as a package manager does: a new file renamed over
// the old one, so that what runs the old one (a step) keeps it.
func install(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := dst + ".new"
	if err := os.WriteFile(tmp, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// runBin runs binary bin with args and returns its exit code and output.
func runBin(bin string, args ...string) (int, string, string) {
	cmd := exec.Command(bin, args...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		code = -1
	}
	return code, out.String(), errOut.String()
}

// TestRollingUpgrade: a cluster of three agents of the previous release (the newest
// older tag, else the last commit before record versions), with two jobs running on
// all its GPUs and two waiting, is upgraded node by node to this build — each agent
// stopped with SIGTERM, its binary replaced as a package would, started again — the
// elected agent's node last. Throughout, no running step is stopped (the same step
// processes and workers run on), both releases' commands read the cluster, and a
// job submitted by either is run: the waiting jobs start and complete while old and
// new agents share the cluster under the old scheduler; once the elected node is
// upgraded the scheduler is an upgraded agent, and runs a job the previous release's
// command line submits, its records without a version read as version 1; every job
// ends COMPLETED with no restart and no node lost.
func TestRollingUpgrade(t *testing.T) {
	commit, name := previousRelease(t)
	old := buildRelease(t, commit)
	t.Logf("upgrading from %s to %s", name, gangrun.Version())
	nodes := []string{"gpu-a", "gpu-b", "gpu-c"}
	c := &jobCluster{t: t, consul: consultest.Start(t).Addr, mark: testMark(t), agents: map[string]*exec.Cmd{}, logs: map[string]*syncBuffer{},
		inventory: filepath.Join(repoRoot(t), "topology", "testdata", "inventories", "dgx-h100.json"),
		health:    map[string]string{}, dir: t.TempDir(), bins: map[string]string{}}
	for _, n := range nodes {
		c.bins[n] = filepath.Join(c.dir, n, "usr", "bin", "gangrun") // each node's own installed binary
		install(t, old, c.bins[n])
		c.startAgent(n)
	}
	// oldCLI runs the previous release's command line against the cluster.
	oldCLI := func(args ...string) (int, string, string) {
		return runBin(old, append([]string{args[0], "--consul", c.consul}, args[1:]...)...)
	}
	upNodes := func(cli func(...string) (int, string, string)) map[string]allocator.NodeStatus {
		code, out, errOut := cli("nodes", "--json")
		if code != 0 {
			t.Fatalf("nodes --json: exit %d: %s", code, errOut)
		}
		var ns []allocator.NodeStatus
		if err := json.Unmarshal([]byte(out), &ns); err != nil {
			t.Fatalf("nodes --json: %v\n%s", err, out)
		}
		m := map[string]allocator.NodeStatus{}
		for _, n := range ns {
			if n.State == allocator.NodeUp {
				m[n.Name] = n
			}
		}
		return m
	}
	waitUntilFor(t, 60*time.Second, func() bool { return len(upNodes(oldCLI)) == 3 }, "three agents of the previous release up")
	for n, st := range upNodes(c.gangrun) {
		if st.Version != "" {
			t.Fatalf("node %s runs release %q: the previous release's agents register none", n, st.Version)
		}
	}
	// rawNode is node n's record as it lies in Consul.
	rawNode := func(n string) string {
		s, err := store.NewConsul(c.consul)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		e, err := s.Get(context.Background(), allocator.ClusterPrefix+"nodes/"+n)
		if err != nil || e == nil {
			t.Fatalf("node %s's record: %v", n, err)
		}
		return string(e.Value)
	}

	dir := t.TempDir()
	t.Chdir(dir)
	gate := func(name string) (path, cmd string) {
		path = filepath.Join(dir, name)
		return path, `while [ ! -e ` + path + ` ]; do sleep 0.2; done; echo done`
	}
	oldSubmit := func(args ...string) string {
		code, out, errOut := oldCLI(append([]string{"submit"}, args...)...)
		if code != 0 {
			t.Fatalf("submit with the previous release: exit %d: %s", code, errOut)
		}
		return strings.TrimSpace(out)
	}
	// Two running jobs take every GPU: a 2-node one and a 1-node one; two more wait.
	gate1, cmd1 := gate("go1")
	gate2, cmd2 := gate("go2")
	r1 := oldSubmit("--nodes", "2", "--gpus-per-node", "8", "--name", "long", "--", "/bin/sh", "-c", cmd1)
	c.waitState(r1, job.Running, 60*time.Second)
	r2 := oldSubmit("--nodes", "1", "--gpus-per-node", "8", "--name", "short", "--", "/bin/sh", "-c", cmd2)
	c.waitState(r2, job.Running, 60*time.Second)
	p1 := oldSubmit("--nodes", "1", "--gpus-per-node", "8", "--name", "waiting1", "--", "/bin/echo", "p1")
	p2 := oldSubmit("--nodes", "1", "--gpus-per-node", "8", "--name", "waiting2", "--", "/bin/echo", "p2")
	for _, id := range []string{p1, p2} {
		if st := c.show(id)["state"]; st != string(job.Pending) {
			t.Fatalf("job %s: %v, want PENDING behind the running ones", id, st)
		}
	}
	waitUntilFor(t, 30*time.Second, func() bool { return countWorkers(c.mark) == 24 }, "24 workers of the running jobs")
	// The steps, by job and node: the same processes must run until their jobs end.
	steps := map[string]int{}
	for _, id := range []string{r1, r2} {
		for _, n := range c.show(id)["nodes"].([]any) {
			node := n.(map[string]any)["name"].(string)
			pid := stepPID(c.mark, id, node)
			if pid == 0 {
				t.Fatalf("no step of job %s on %s", id, node)
			}
			steps[id+"@"+node] = pid
		}
	}
	stepsRun := func(when string) {
		t.Helper()
		for k, pid := range steps {
			id, node, _ := strings.Cut(k, "@")
			if got := stepPID(c.mark, id, node); got != pid {
				t.Fatalf("%s: the step of job %s on %s is %d, was %d: a running step was stopped", when, id, node, got, pid)
			}
		}
		if n := countWorkers(c.mark); n < 8*len(steps) {
			t.Fatalf("%s: %d workers, want the %d of the running steps", when, n, 8*len(steps))
		}
	}
	leader := func() string {
		s, err := store.NewConsul(c.consul)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		e, err := s.Get(context.Background(), "gangrun/scheduler/leader")
		if err != nil || e == nil || e.Session == "" {
			return ""
		}
		return string(e.Value)
	}
	elected := leader()
	order := append([]string{}, nodes...)
	sort.SliceStable(order, func(i, j int) bool { return order[j] == elected }) // the elected agent's node last
	t.Logf("elected: %s; upgrade order: %v", elected, order)

	for i, n := range order {
		a := c.agents[n]
		_ = a.Process.Signal(syscall.SIGTERM)
		if err := a.Wait(); err != nil {
			t.Fatalf("agent %s stopped with %v, want exit 0", n, err)
		}
		stepsRun("agent " + n + " stopped")
		install(t, gangrunBin, c.bins[n])
		c.startAgent(n)
		waitUntilFor(t, 60*time.Second, func() bool { return upNodes(c.gangrun)[n].Version == gangrun.Version() },
			n+" up again with release "+gangrun.Version())
		stepsRun("agent " + n + " upgraded")
		// Old and new side by side: the upgraded nodes' records carry their schema and
		// release, the others' neither.
		versions := map[string]string{}
		for m, st := range upNodes(c.gangrun) {
			versions[m] = st.Version
			upgraded := slices.Contains(order[:i+1], m)
			if hasSchema := strings.HasPrefix(rawNode(m), `{"schema":1,`); upgraded != hasSchema || upgraded != (st.Version == gangrun.Version()) {
				t.Errorf("after %s's upgrade, node %s (upgraded: %v) registered release %q, record %.40s...", n, m, upgraded, st.Version, rawNode(m))
			}
		}
		t.Logf("after %s's upgrade: releases %v", n, versions)
		// Both releases' commands read the cluster: every node up, every job listed.
		if up := upNodes(oldCLI); len(up) != 3 {
			t.Errorf("after %s's upgrade the previous release sees %d nodes up, want 3", n, len(up))
		}
		if code, out, errOut := oldCLI("queue"); code != 0 || !strings.Contains(out, r1) || !strings.Contains(out, r2) {
			t.Errorf("after %s's upgrade, queue of the previous release: exit %d\n%s%s", n, code, out, errOut)
		}
		if i == 0 {
			// Old and new agents share the cluster, under the previous release's
			// scheduler: the waiting jobs start once the short one ends, and a job the
			// new release submits runs too.
			if l := leader(); l != elected {
				t.Fatalf("the scheduler moved to %s before its node was upgraded", l)
			}
			if err := os.WriteFile(gate2, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			c.waitState(r2, job.Completed, 60*time.Second)
			delete(steps, r2+"@"+c.show(r2)["nodes"].([]any)[0].(map[string]any)["name"].(string))
			c.waitState(p1, job.Completed, 60*time.Second)
			c.waitState(p2, job.Completed, 60*time.Second)
			n1 := c.submit("--nodes", "1", "--gpus-per-node", "8", "--name", "new-client", "--", "/bin/echo", "n1")
			c.waitState(n1, job.Completed, 60*time.Second)
		}
	}
	// Every agent upgraded: the scheduler is one of them.
	var now string
	waitUntilFor(t, 60*time.Second, func() bool { now = leader(); return now != "" }, "an elected scheduler")
	if v := upNodes(c.gangrun)[now].Version; v != gangrun.Version() {
		t.Errorf("the scheduler is %s, of release %q, want %s", now, v, gangrun.Version())
	}
	t.Logf("the scheduler moved from %s to %s", elected, now)
	stepsRun("every agent upgraded")
	// A job the previous release's command line writes (records without a version) is
	// read as version 1 by the upgraded scheduler, run, and its state written back with
	// its schema.
	n2 := oldSubmit("--nodes", "1", "--gpus-per-node", "8", "--name", "old-client", "--", "/bin/echo", "n2")
	c.waitState(n2, job.Completed, 60*time.Second)
	raw := func(key string) string {
		s, err := store.NewConsul(c.consul)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		e, err := s.Get(context.Background(), key)
		if err != nil || e == nil {
			t.Fatalf("%s: %v", key, err)
		}
		return string(e.Value)
	}
	if spec, state := raw("gangrun/batch/jobs/"+n2+"/spec"), raw("gangrun/batch/jobs/"+n2+"/state"); strings.Contains(spec, `"schema"`) || !strings.HasPrefix(state, `{"schema":1,`) {
		t.Errorf("job %s: spec %.60s..., state %.60s...; want the spec as the previous release wrote it, the state as this one", n2, spec, state)
	}
	if err := os.WriteFile(gate1, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{r1, r2} {
		m := c.waitState(id, job.Completed, 60*time.Second)
		if m["restarts"] != float64(0) || m["node_failures"] != float64(0) || len(m["attempts"].([]any)) != 1 {
			t.Errorf("job %s: %v restarts, %v node failures, %d attempts; want one attempt, nothing lost", id, m["restarts"], m["node_failures"], len(m["attempts"].([]any)))
		}
	}
}
