package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/launcher"
)

// TestJobRunsAsItsUser: a job submitted as alice (root's --uid, as sbatch --uid) runs
// its workers as her Unix user, with her USER and HOME (a batch script's too); the checkpoint directory gangrun
// makes (its fence) before they start is hers to write; its output file is created
// with her permissions (hers when new, refused where she may not write: root's home);
// the root cause comes from the error file she writes, read with her permissions (a
// link she puts there to a file only root may read gives nothing away); a user the node
// does not know fails the job, saying so.
func TestJobRunsAsItsUser(t *testing.T) {
	c := startJobCluster(t, "gpu-a")
	unixUsers(t, "alice")
	alice, err := user.Lookup("alice")
	if err != nil {
		t.Fatal(err)
	}
	dir := sharedDir(t)
	t.Chdir(dir)
	secret := filepath.Join(t.TempDir(), "secret.json") // root's alone
	if err := os.WriteFile(secret, []byte(`{"message": "root's secret"}`), 0o600); err != nil {
		t.Fatal(err)
	}

	// Rank 0 writes its own error file and fails once rank 1 has written; rank 1 waits to
	// be stopped.
	// Both write what gangrun serves them: torch's watchdog pipe, the heartbeat file.
	own := c.submit("--uid", "alice", "--gpus-per-node", "2", "--max-restarts", "0", "--env", "TORCHELASTIC_ENABLE_FILE_TIMER=1",
		"--checkpoint-dir", "ckpt", "--", "/bin/sh", "-c",
		`echo "$(id -un):$(id -gn) user=$USER home=$HOME"
		echo '{"pid": 1, "scope_id": "s", "expiration_time": -1, "signal": 0}' > "$TORCHELASTIC_TIMER_FILE" && touch "$GANGRUN_HEARTBEAT_FILE" && echo pipe and heartbeat written
		[ "$RANK" = 1 ] && touch rank1-wrote && exec sleep 300
		mkdir ckpt/step-1 && echo checkpoint directory writable
		while [ ! -e rank1-wrote ]; do sleep 0.1; done
		printf '{"message": "alice wrote this"}' > "$TORCHELASTIC_ERROR_FILE"; exit 4`)
	m := c.waitState(own, job.Failed, 90*time.Second)
	if r, _ := m["reason"].(string); !strings.Contains(fmt.Sprint(m), "alice wrote this") {
		t.Errorf("the failed job's record lacks the message of alice's error file (reason %q):\n%v", r, m)
	}
	outFile := filepath.Join(dir, "gangrun-"+own+".out")
	out, err := os.ReadFile(outFile)
	if err != nil || !bytes.Contains(out, []byte("[rank0]: alice:alice user=alice home=/nonexistent\n")) ||
		!bytes.Contains(out, []byte("[rank0]: pipe and heartbeat written\n")) || !bytes.Contains(out, []byte("[rank1]: pipe and heartbeat written\n")) ||
		!bytes.Contains(out, []byte("[rank0]: checkpoint directory writable\n")) {
		t.Errorf("output: %v\n%s", err, out)
	}
	if st, err := os.Stat(outFile); err != nil || fmt.Sprint(st.Sys().(*syscall.Stat_t).Uid) != alice.Uid {
		t.Errorf("output file %s: %v, want it alice's (uid %s)", outFile, err, alice.Uid)
	}

	// A batch script runs as her too, from a copy she may read.
	script := filepath.Join(dir, "job.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n#GANGRUN --gpus-per-node 1\necho \"script as $(id -un) from $(stat -c %U \"$0\")'s copy\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	batch := c.submit("--uid", "alice", script)
	c.waitState(batch, job.Completed, 90*time.Second)
	if out, err := os.ReadFile(filepath.Join(dir, "gangrun-"+batch+".out")); err != nil || !bytes.Contains(out, []byte("[rank0]: script as alice from alice's copy\n")) {
		t.Errorf("the batch script's output: %v\n%s", err, out)
	}

	// Her error file is a link to root's secret: nothing of it reaches the record.
	link := c.submit("--uid", "alice", "--gpus-per-node", "1", "--max-restarts", "0", "--", "/bin/sh", "-c",
		`ln -s `+secret+` "$TORCHELASTIC_ERROR_FILE" && exit 5`)
	m = c.waitState(link, job.Failed, 90*time.Second)
	if s := fmt.Sprint(m); strings.Contains(s, "root's secret") || !strings.Contains(s, "exit code 5") {
		t.Errorf("a linked error file: the record shows what alice may not read, or not her exit code:\n%s", s)
	}

	// An output file where she may not write: refused, and nothing created there.
	rootDir := t.TempDir() // mode 0700, root's
	denied := c.submit("--uid", "alice", "--gpus-per-node", "1", "--output", filepath.Join(rootDir, "%j.out"), "--", "true")
	m = c.waitState(denied, job.Failed, 90*time.Second)
	if r := fmt.Sprint(m); !strings.Contains(r, "output "+filepath.Join(rootDir, denied+".out")+": ") || !strings.Contains(r, "permission denied") {
		t.Errorf("an output alice may not write: the record does not say so:\n%s", r)
	}
	if entries, _ := os.ReadDir(rootDir); len(entries) != 0 {
		t.Errorf("root's directory got %d entries from alice's job", len(entries))
	}
	// Its logs: nothing to show, said in one line with the recorded reason, exit 1.
	deniedOut := filepath.Join(rootDir, denied+".out")
	if code, out, errOut := c.gangrun("logs", denied); code != 1 || out != "" ||
		errOut != "gangrun logs: job "+denied+" has no output ("+deniedOut+" does not exist): it ended FAILED: output "+deniedOut+": open "+deniedOut+": permission denied\n" {
		t.Errorf("logs of the job whose output was refused: exit %d, %q, stderr %q", code, out, errOut)
	}

	// A named pipe as the output, which no one reads: refused, not waited on (the
	// step would hang in open(2), its GPUs held). And torch's watchdog pipe named as a
	// link to root's own pipe: not served, said once; the job runs.
	pipe := filepath.Join(dir, "out.fifo")
	rootPipe := filepath.Join(rootDir, "root.fifo")
	for _, p := range []string{pipe, rootPipe} {
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	uid, _ := strconv.Atoi(alice.Uid)
	gid, _ := strconv.Atoi(alice.Gid)
	if err := os.Chown(pipe, uid, gid); err != nil { // hers
		t.Fatal(err)
	}
	// submit refuses it before anything is queued (job.Spec.CheckHere); the step's own
	// check stays for a pipe made after submit.
	if code, _, errOut := c.gangrun("submit", "--uid", "alice", "--gpus-per-node", "1", "--output", pipe, "--", "true"); code != 2 ||
		errOut != "gangrun submit: --output "+pipe+": "+pipe+" is a named pipe (FIFO): want a file (or /dev/null)\n" {
		t.Errorf("a named pipe as the output: exit %d, stderr %q; want 2 and a refusal naming it", code, errOut)
	}
	timerLink := filepath.Join(dir, "timer-link")
	if err := os.Symlink(rootPipe, timerLink); err != nil {
		t.Fatal(err)
	}
	timerJob := c.submit("--uid", "alice", "--gpus-per-node", "1", "--env", "TORCHELASTIC_ENABLE_FILE_TIMER=1", "--env", "TORCHELASTIC_TIMER_FILE="+timerLink, "--", "true")
	c.waitState(timerJob, job.Completed, 90*time.Second)
	if out, _ := os.ReadFile(filepath.Join(dir, "gangrun-"+timerJob+".out")); !bytes.Contains(out, []byte("torch's file-based watchdog cannot be served")) ||
		!bytes.Contains(out, []byte("TORCHELASTIC_TIMER_FILE="+timerLink+": is a symbolic link: name the pipe itself")) {
		t.Errorf("a watchdog pipe named by a link: the output does not say it is not served:\n%s", out)
	}

	// A command only root may run, and a work directory only root may enter: both
	// passed root's checks, and both fail the job (not the node) when the worker
	// starts as her.
	secretCmd := filepath.Join(rootDir, "cmd.sh")
	if err := os.WriteFile(secretCmd, []byte("#!/bin/sh\necho ran\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmdJob := c.submit("--uid", "alice", "--gpus-per-node", "1", "--", secretCmd)
	m = c.waitState(cmdJob, job.Failed, 90*time.Second)
	if r := fmt.Sprint(m); !strings.Contains(r, secretCmd+": ") || m["exit_code"] != float64(126) {
		t.Errorf("a command alice may not run: want FAILED with exit code 126 naming it:\n%s", r)
	}
	t.Chdir(rootDir)
	wdJob := c.submit("--uid", "alice", "--gpus-per-node", "1", "--output", filepath.Join(dir, "%j.out"), "--", "ls")
	m = c.waitState(wdJob, job.Failed, 90*time.Second)
	if r := fmt.Sprint(m); !strings.Contains(r, "work directory "+rootDir+": permission denied") {
		t.Errorf("a work directory alice may not enter: want FAILED naming it:\n%s", r)
	}
	t.Chdir(dir)

	// A user unknown here is refused at submission, as sbatch --uid refuses one; a
	// job of a user the node does not know (submitted from a host that knows her)
	// fails, saying so.
	if code, _, errOut := c.gangrun("submit", "--uid", "no-such-user-gr", "--", "true"); code != 2 || errOut != "gangrun submit: --uid \"no-such-user-gr\": no such user on this node\n" {
		t.Errorf("submit --uid of an unknown user: exit %d, %q", code, errOut)
	}
	s, err := store.NewConsul(c.consul)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	munge, err := identity.Open(testMunge.Socket)
	if err != nil {
		t.Fatal(err)
	}
	unknown, err := job.SubmitSealed(context.Background(), s, job.Spec{Name: "x", User: "no-such-user-gr", MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1,
		Command: []string{"true"}, WorkDir: dir, Supervision: launcher.Supervision{MaxRestarts: 0}}, munge)
	if err != nil {
		t.Fatal(err)
	}
	m = c.waitState(unknown, job.Failed, 90*time.Second)
	if r := fmt.Sprint(m); !strings.Contains(r, `InvalidCredential: the job's user "no-such-user-gr" has no account on the elected agent's node`) {
		t.Errorf("an unknown user: the record does not say so:\n%s", r)
	}
}

// TestJobFindsItsCommandAsItsUser: a command named without a slash is the one the job's
// user finds on the PATH, not the one root finds first in a directory only root may
// enter (a pyenv shim under /root): the job runs the user's. A --uid given as a number
// is recorded by its user's name.
func TestJobFindsItsCommandAsItsUser(t *testing.T) {
	unixUsers(t, "alice")
	alice, err := user.Lookup("alice")
	if err != nil {
		t.Fatal(err)
	}
	dir := sharedDir(t)
	rootOnly := t.TempDir() // mode 0700, root's
	for d, who := range map[string]string{rootOnly: "root's", dir: "hers"} {
		if err := os.WriteFile(filepath.Join(d, "gr-which"), []byte("#!/bin/sh\necho "+who+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", rootOnly+":"+dir+":"+os.Getenv("PATH")) // the agents' PATH, and so the step's
	c := startJobCluster(t, "gpu-a")
	t.Chdir(dir)
	id := c.submit("--uid", alice.Uid, "--gpus-per-node", "1", "--", "gr-which")
	m := c.waitState(id, job.Completed, 90*time.Second)
	if m["user"] != "alice" {
		t.Errorf("--uid %s recorded as user %v, want alice", alice.Uid, m["user"])
	}
	if out, err := os.ReadFile(filepath.Join(dir, "gangrun-"+id+".out")); err != nil || !bytes.Contains(out, []byte("[rank0]: hers\n")) {
		t.Errorf("want the user's gr-which run: %v\n%s", err, out)
	}
}
