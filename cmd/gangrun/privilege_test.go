package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/reason"
)

// userSealer seals a job's credential as Unix user name (munge(1) run as that user):
// what a user who writes the job record past gangrun submit's checks can make.
type userSealer struct {
	t            *testing.T
	name, socket string
}

func (u userSealer) Seal(_ context.Context, content []byte) (string, error) {
	return mungeAs(u.t, u.name, u.socket, content), nil
}

// startMungeAgent starts a Consul and one agent, node, on it, and waits until the
// agent is up and checking MUNGE credentials (the default cluster); it returns
// Consul's address.
func startMungeAgent(t *testing.T, node string) string {
	t.Helper()
	consul := consultest.Start(t).Addr
	startAgentWith(t, consul, node, nil)
	waitUntilFor(t, 60*time.Second, func() bool {
		nodes := nodesJSON(t, consul)
		return len(nodes) == 1 && nodes[0].State == "up" && nodes[0].Auth == "munge"
	}, "the agent up, checking MUNGE credentials")
	return consul
}

// TestPriorityIsAnOperators: on a default cluster (no ACLs, MUNGE), a user (mallory)
// cannot queue a job with a priority or a negative nice, whichever way: gangrun submit
// and sbatch refuse it (a negative nice in slurmctld 22.05's words, "Invalid --nice
// value"; a priority, which Slurm ignores from a user, "Access/permission denied";
// sbatch exit 1, gangrun 2), and a record she queues past them, with her own credential, is refused
// by the elected agent (FAILED, never started). Root (the operator) may.
func TestPriorityIsAnOperators(t *testing.T) {
	unixUsers(t, "mallory")
	consul := startMungeAgent(t, "prio-a")
	s, err := store.NewConsul(consul)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	dir := sharedDir(t)
	t.Chdir(dir)

	words := map[string]string{"--priority=1000": "Access/permission denied", "--nice=-5": "Invalid --nice value"}
	for _, opt := range []string{"--priority=1000", "--nice=-5"} {
		r := runAsUser(t, "mallory", testMunge.Socket, dir, "submit", "--consul", consul, opt, "--", "true")
		if r.code != 2 || !strings.Contains(r.stderr, words[opt]) || !strings.Contains(r.stderr, opt) {
			t.Errorf("mallory's gangrun submit %s: exit %d %q, want 2 and %s naming it", opt, r.code, r.stderr, words[opt])
		}
		sbatch := filepath.Join(filepath.Dir(binForUsers(t)), "sbatch") // where every user may run it
		if err := os.Symlink(binForUsers(t), sbatch); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
		r = runBinAsUser(t, sbatch, "mallory", testMunge.Socket, dir, []string{"CONSUL_HTTP_ADDR=" + consul}, opt, "--wrap", "true")
		if want := "sbatch: error: Batch job submission failed: " + words[opt] + "\n"; r.code != 1 || r.stderr != want {
			t.Errorf("mallory's sbatch %s: exit %d %q, want 1 and %q", opt, r.code, r.stderr, want)
		}
	}
	jobs, err := job.List(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 0 {
		t.Fatalf("refused submissions queued %d jobs", len(jobs))
	}

	// Past the commands: a record with her own credential.
	for _, spec := range []job.Spec{{Priority: 1000}, {Nice: -5}} {
		want := map[bool]string{true: "Access/permission denied", false: "Invalid --nice value"}[spec.Priority > 0]
		spec.Name, spec.User, spec.Command, spec.WorkDir = "raised", "mallory", []string{"true"}, dir
		spec.MinNodes, spec.MaxNodes = 1, 1
		id, err := job.SubmitSealed(ctx, s, spec, userSealer{t, "mallory", testMunge.Socket})
		if err != nil {
			t.Fatal(err)
		}
		var j *job.Job
		waitUntilFor(t, 90*time.Second, func() bool {
			j, err = job.Read(ctx, s, id)
			return err == nil && j.State.Status.Final()
		}, "mallory's raised job "+id+" ended")
		why := j.State.Reason
		if j.State.Status != job.Failed || !strings.HasPrefix(why, string(reason.InvalidCredential)) || !strings.Contains(why, want) || !j.State.Started.IsZero() {
			t.Errorf("mallory's job %s (priority %d, nice %d) past the commands: %s %q started %v, want FAILED, refused, never started",
				id, spec.Priority, spec.Nice, j.State.Status, why, j.State.Started)
		}
	}

	// The operator (root) may.
	code, out, errOut := inProcess("submit", "--consul", consul, "--priority", "1000", "--nice=-5", "--", "true")
	if code != 0 {
		t.Fatalf("root's submit --priority 1000 --nice=-5: %d %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	var j *job.Job
	waitUntilFor(t, 90*time.Second, func() bool {
		j, err = job.Read(ctx, s, id)
		return err == nil && j.State.Status.Final()
	}, "root's job "+id+" ended")
	if j.State.Status != job.Completed || j.Spec.Priority != 1000 || j.Spec.Nice != -5 {
		t.Errorf("root's job %s: %s %q priority %d nice %d, want COMPLETED with priority 1000, nice -5", id, j.State.Status, j.State.Reason, j.Spec.Priority, j.Spec.Nice)
	}
}

// TestSrunOnPendingJob: srun --jobid of a pending (held) batch job, by its user (root)
// and by another (mallory, under MUNGE), says srun 22.05's words for a pending job,
// exit 1, and starts nothing.
func TestSrunOnPendingJob(t *testing.T) {
	unixUsers(t, "mallory")
	consul := startMungeAgent(t, "srunp-a")
	dir := sharedDir(t)
	links := filepath.Dir(binForUsers(t)) // where every user may run them
	for _, n := range []string{"sbatch", "srun"} {
		if err := os.Symlink(binForUsers(t), filepath.Join(links, n)); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
	env := []string{"CONSUL_HTTP_ADDR=" + consul}
	r := runBinAsUser(t, filepath.Join(links, "sbatch"), "root", testMunge.Socket, dir, env, "--parsable", "-H", "--wrap", "true")
	if r.code != 0 {
		t.Fatalf("root's sbatch -H: exit %d %s", r.code, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	want := "srun: error: Unable to confirm allocation for job " + id + ": Job is pending execution\n" +
		"srun: Check SLURM_JOB_ID environment variable. Expired or invalid job " + id + "\n"
	for _, who := range []string{"root", "mallory"} {
		r := runBinAsUser(t, filepath.Join(links, "srun"), who, testMunge.Socket, dir, env, "--jobid="+id, "true")
		if r.code != 1 || r.stdout != "" || r.stderr != want {
			t.Errorf("%s's srun --jobid=%s of a pending job: exit %d %q %q, want 1 and %q", who, id, r.code, r.stdout, r.stderr, want)
		}
	}
	// Nothing started: no step recorded, the job still pending.
	s, err := store.NewConsul(consul)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if steps, err := job.SrunSteps(context.Background(), s, id); err != nil || len(steps) != 0 {
		t.Errorf("job %s's srun steps after the refused sruns: %+v %v, want none", id, steps, err)
	}
	if j, err := job.Read(context.Background(), s, id); err != nil {
		t.Error(err)
	} else if j.State.Status != job.Pending {
		t.Errorf("job %s after the refused sruns: %s, want PENDING", id, j.State.Status)
	}
	if code, _, errOut := inProcess("cancel", "--consul", consul, id); code != 0 {
		t.Errorf("cancel %s: %d %s", id, code, errOut)
	}
}

// TestSstatIsItsUsersAndRoots: sstat of a running job answers its user (here root, who
// queued it) with the step's figures; another user (mallory) gets the refusal and no
// figure, as slurmd answers a step's usage to the job's user and root alone.
func TestSstatIsItsUsersAndRoots(t *testing.T) {
	unixUsers(t, "mallory")
	consul := startMungeAgent(t, "sstat-a")
	dir := sharedDir(t)
	t.Chdir(dir)
	links := filepath.Dir(binForUsers(t)) // where every user may run them
	for _, name := range []string{"sbatch", "srun", "sstat", "scancel"} {
		if err := os.Symlink(binForUsers(t), filepath.Join(links, name)); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
	env := []string{"CONSUL_HTTP_ADDR=" + consul, "PATH=" + links + ":" + os.Getenv("PATH")} // srun in the job
	asRoot := func(name string, args ...string) gangrunResult {
		cmd := exec.Command(filepath.Join(links, name), args...)
		cmd.Env, cmd.Dir = append(os.Environ(), env...), dir
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := 0
		if x, ok := err.(*exec.ExitError); ok {
			code = x.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return gangrunResult{out.String(), errOut.String(), code}
	}
	r := asRoot("sbatch", "--parsable", "--gres=gpu:1", "--wrap", "srun sleep 300")
	if r.code != 0 {
		t.Fatalf("sbatch: exit %d %s", r.code, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	var last gangrunResult
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sstat: %+v\nslurm-%s.out: %s", last, id, readFile(dir, "slurm-"+id+".out"))
		}
		asRoot("scancel", id)
	})
	waitUntilFor(t, 90*time.Second, func() bool {
		last = asRoot("sstat", "-n", "-P", "-o", "JobID,MaxRSS", "-j", id)
		return strings.HasPrefix(last.stdout, id+".0|")
	}, "root's sstat of its running step")
	_ = last
	m := runBinAsUser(t, filepath.Join(links, "sstat"), "mallory", testMunge.Socket, dir, env, "-n", "-P", "-o", "JobID,MaxRSS", "-j", id)
	if want := "sstat: error: couldn't get steps for job " + id + ": Access/permission denied\n"; m.stdout != "" || m.stderr != want {
		t.Errorf("mallory's sstat of root's job: %q %q, want no figure and %q", m.stdout, m.stderr, want)
	}
}
