package allocator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/gangrun/gangrun/hostlist"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/internal/store"
)

// CommandGrace is the SIGTERM → SIGKILL grace of a command run under a grant (Ticket.Run)
// when it is stopped by a signal or its grant is cancelled; a lease that is over cuts it
// short to the lease's kill time.
const CommandGrace = 30 * time.Second

// Summary is a grant as `gangrun alloc --json` prints it and GANGRUN_GRANT carries it:
// {"id", "nodes": [{"name", "addr", "gpus": [index...], "devices": [...]}]}.
type Summary struct {
	ID    string      `json:"id"`
	Nodes []GrantNode `json:"nodes"`
}

// Summary returns the grant's Summary.
func (g Grant) Summary() Summary { return Summary{ID: g.ID, Nodes: g.Nodes} }

// Env returns what a command run under the grant finds in its environment, as salloc's
// command finds SLURM_JOB_NODELIST and the like: GANGRUN_GRANT_ID, GANGRUN_NODELIST (the
// nodes as a Slurm hostlist), GANGRUN_NNODES and GANGRUN_GRANT (the Summary as JSON).
func (g Grant) Env() []string {
	names := make([]string, len(g.Nodes))
	for i, n := range g.Nodes {
		names[i] = n.Name
	}
	js, _ := json.Marshal(g.Summary())
	return []string{"GANGRUN_GRANT_ID=" + g.ID, "GANGRUN_NODELIST=" + hostlist.Compress(names),
		"GANGRUN_NNODES=" + strconv.Itoa(len(g.Nodes)), "GANGRUN_GRANT=" + string(js)}
}

// RunOptions configure Ticket.Run.
type RunOptions struct {
	// Environ is the environment the command inherits (os.Environ() when nil); the
	// grant's variables are added to it. The user's own credentials stay: the command
	// is theirs.
	Environ []string
	// Stdin, Stdout and Stderr are the command's (nil: none).
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// GuardianArgv starts the guardian (proc.Guardian) that kills the command's process
	// group if this process dies, or is frozen past the lease; nil runs without one.
	GuardianArgv []string
	// Stopped watches gangrun's signals: the first terminating one is forwarded to the
	// command, which is then stopped; nil: none.
	Stopped *proc.SignalWatch
	// Notify hears, in one line, why the command is being stopped or what went wrong
	// with the guardian (nil: nobody).
	Notify func(msg string)
}

// Run runs command under grant g, which t holds, and returns its exit code (128+N for
// death by signal N), like salloc's command: the grant's variables (Grant.Env) in its
// environment, in a process group of its own with a guardian. It stops the command
// (SIGTERM, then SIGKILL after CommandGrace) when o.Stopped reports a terminating signal (the
// code is then 128+N) or the grant is lost (the code is 1): cancelled, or its lease
// over — then by the lease's kill time, before Consul can hand the GPUs to another
// grant; the guardian kills it then if this process is frozen. An error means the
// command could not be started (wrapping exec's error).
func (t *Ticket) Run(g Grant, command []string, o RunOptions) (int, error) {
	notify := o.Notify
	if notify == nil {
		notify = func(string) {}
	}
	environ := o.Environ
	if environ == nil {
		environ = os.Environ()
	}
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Env = append(append([]string(nil), environ...), g.Env()...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = o.Stdin, o.Stdout, o.Stderr
	var guard *proc.Guardian
	if len(o.GuardianArgv) > 0 {
		gd, err := proc.StartGuardian(o.GuardianArgv)
		if err != nil {
			notify(fmt.Sprintf("no guardian (the command's children may outlive a killed gangrun): %v", err))
		}
		guard = gd
	}
	defer func() { _ = guard.Close() }()
	p, err := proc.Start(cmd)
	if err != nil {
		return 0, err
	}
	_ = guard.Watch(p.Pid())
	defer func() { _ = guard.Forget(p.Pid()) }()
	t.lease.OnRenew(func(killBy time.Time) { _ = guard.KillBy(killBy) })
	defer t.lease.OnRenew(nil)
	stop := func(sig syscall.Signal, grace time.Duration) {
		_ = p.Signal(sig)
		timer := time.NewTimer(max(grace, 0))
		defer timer.Stop()
		select {
		case <-p.Exited():
		case <-timer.C:
		}
	}
	var stopped <-chan struct{}
	if o.Stopped != nil {
		stopped = o.Stopped.Stopped()
	}
	code := -1
	select {
	case <-p.Exited():
	case <-stopped:
		sig := o.Stopped.Signal()
		stop(sig, CommandGrace)
		code = 128 + int(sig)
	case <-t.Lost():
		if err := t.lease.Err(); err != nil {
			notify(fmt.Sprintf("grant %s lost (%v): stopping the command", g.ID, err))
			stop(syscall.SIGTERM, min(CommandGrace, time.Until(t.lease.KillBy())))
		} else {
			notify(fmt.Sprintf("grant %s lost: stopping the command", g.ID))
			stop(syscall.SIGTERM, CommandGrace)
		}
		code = 1
	}
	st, _ := p.Release()
	if code < 0 {
		code = st.ShellCode()
	}
	return code, nil
}

// ParseSummary reads a grant as GANGRUN_GRANT carries it (Summary's JSON); an error
// names what is wrong with it.
func ParseSummary(js string) (Summary, error) {
	var s Summary
	if err := json.Unmarshal([]byte(js), &s); err != nil {
		return Summary{}, fmt.Errorf("GANGRUN_GRANT is not a grant (gangrun alloc --json): %v", err)
	}
	if s.ID == "" || len(s.Nodes) == 0 {
		return Summary{}, errors.New("GANGRUN_GRANT is not a grant (gangrun alloc --json): no id or no nodes")
	}
	return s, nil
}

// Node returns node's part of the grant; an error names the node and the grant's nodes
// when node is not one of them.
func (s Summary) Node(node string) (GrantNode, error) {
	names := make([]string, len(s.Nodes))
	for i, n := range s.Nodes {
		if n.Name == node {
			return n, nil
		}
		names[i] = n.Name
	}
	return GrantNode{}, fmt.Errorf("node %q is not in grant %s (its nodes: %s); give --node-name",
		node, s.ID, hostlist.Compress(names))
}

// GrantedSummary reads grant id (of `gangrun alloc`) from s and returns it when it is
// granted; an error, naming --grant and the id, says it does not exist, is a cluster
// job's, or is not granted (still pending, refused).
func GrantedSummary(ctx context.Context, s store.Store, id string) (Summary, error) {
	pending, g, err := Show(ctx, s, id)
	if errors.Is(err, ErrNotFound) {
		return Summary{}, fmt.Errorf("--grant %s: no such grant (gangrun queue lists them)", id)
	}
	if err != nil {
		return Summary{}, err
	}
	switch {
	case pending != nil && pending.Durable():
		return Summary{}, fmt.Errorf("--grant %s: this is cluster job %s's grant, whose steps the agents run; a grant of gangrun alloc is meant", id, id)
	case g != nil && g.State == GrantGranted:
		return g.Summary(), nil
	case g != nil:
		return Summary{}, fmt.Errorf("--grant %s: the grant is %s, not granted", id, g.State)
	}
	return Summary{}, fmt.Errorf("--grant %s: the request is still pending: it has no GPUs yet", id)
}
