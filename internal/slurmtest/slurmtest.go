// Package slurmtest starts a real Slurm 22.05 for tests: Debian's slurmctld and one
// slurmd per node (slurm-wlm: `apt-get install slurmctld slurmd slurm-client`, which
// `make test` runs), with a slurm.conf, gres.conf, state, spool and log directories of
// its own under the test's temporary directory, a munged of its own (mungetest; the
// conf's AuthInfo=socket= points Slurm at it), fake GPUs as character devices made with
// mknod (major 195, NVIDIA's) in gres.conf, and loopback ports from testport (below
// the ephemeral range, which a client socket could take before the daemon binds).
// Several nodes run on this one machine, each a slurmd started with -N NAME on a port
// of its own (Debian builds Slurm with multiple-slurmd support); with Options.Netns each
// node also has network, UTS and mount namespaces of its own (its own address, host
// name and /etc/hosts), as separate hosts would. It runs as root (slurmd starts the jobs'
// processes as their users); a missing binary or a non-root test fails, never skips.
//
// Conf writes only a slurm.conf, for the commands that read it without a controller
// (scontrol show hostnames, hostlist).
package slurmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/internal/mungetest"
	"github.com/gangrun/gangrun/internal/testport"
)

// Limits of the harness.
const (
	// startTimeout bounds how long the controller and the nodes may take to come up
	// (every node idle in sinfo).
	startTimeout = 60 * time.Second
	// stopTimeout bounds how long the jobs and daemons may take to stop at the test's
	// end before they are killed.
	stopTimeout = 30 * time.Second
	// commandTimeout bounds one client command (sbatch, squeue, scontrol...).
	commandTimeout = 60 * time.Second
	// nvidiaMajor is the character device major of /dev/nvidiaN (NVIDIA's driver).
	nvidiaMajor = 195
)

// Options shape the cluster.
type Options struct {
	// Nodes are the node names; default one node, "node1".
	Nodes []string
	// GPUsPerNode is each node's gres gpu count (default 4); CPUsPerNode its CPUs
	// (default 16: more than this machine has, allowed by
	// SlurmdParameters=config_overrides, so that tasks are not limited by the VM).
	GPUsPerNode, CPUsPerNode int
	// MemoryMiB, when set, is each node's RealMemory in MiB (default: Slurm's own, 1),
	// which a job's --mem, --mem-per-cpu or --mem-per-gpu is checked against at submit.
	MemoryMiB int64
	// Partition is the one partition's name, the default (default "gpu").
	Partition string
	// ClusterName is slurm.conf's ClusterName (default "gangruntest").
	ClusterName string
	// Extra lines appended to slurm.conf.
	Extra []string
	// Netns puts the controller and each node in a network namespace of its own, on one
	// bridge (10.77.0.0/24, inside the namespaces only: the controller at .1, node i at
	// .10+i), and each slurmd in UTS and mount namespaces of its own in which the host
	// name is the node's name and /etc/hosts names every node at its address: a node's
	// jobs then see a host of their own, as on a real cluster, and reach the other
	// nodes by name. Run (the cluster's commands) enters the controller's namespace.
	// The namespaces and veths go at the test's end.
	Netns bool
}

// Cluster is a running Slurm.
type Cluster struct {
	// Dir holds everything: slurm.conf, gres.conf, state/, spool/, log/, dev/.
	Dir string
	// Conf is slurm.conf's path: SLURM_CONF for the commands.
	Conf string
	// Nodes are the node names, Partition the partition's.
	Nodes     []string
	Partition string
	// ClusterName is slurm.conf's ClusterName.
	ClusterName string
	// Munge is the cluster's munged.
	Munge *mungetest.Daemon
	// Addrs are the nodes' addresses (NodeAddr), by node name: 127.0.0.1 each, or
	// the node's own with Options.Netns.
	Addrs map[string]string

	t    testing.TB
	pids []string // pid files of the daemons
	net  *network // the namespaces with Options.Netns, else nil
}

// Conf writes a minimal slurm.conf (a cluster name and a controller host, no daemon
// started) under the test's temporary directory and returns its path: enough for
// scontrol's local commands (show hostnames, show hostlist).
func Conf(t testing.TB) string {
	t.Helper()
	lookPath(t, "scontrol")
	p := filepath.Join(t.TempDir(), "slurm.conf")
	if err := os.WriteFile(p, []byte("ClusterName=gangruntest\nSlurmctldHost=localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Start starts a Slurm controller and its nodes for the test, stopped (every job
// cancelled, the daemons shut down) at the test's end.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("slurmtest: Slurm's daemons run as root (slurmd starts jobs as their users): run the test as root")
	}
	for _, b := range []string{"slurmctld", "slurmd", "sbatch", "scontrol", "sinfo"} {
		lookPath(t, b)
	}
	o.setDefaults()
	c := newCluster(t, o)
	if o.Netns {
		c.net = newNetwork(t, o.Nodes)
		if err := os.WriteFile(filepath.Join(c.Dir, "hosts"), []byte(c.net.hosts(hostname(), o.Nodes)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range o.Nodes {
		c.Addrs[n] = "127.0.0.1"
		if c.net != nil {
			c.Addrs[n] = c.net.addrs[i]
		}
	}
	ports, err := testport.Take(1 + len(o.Nodes))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.Conf, []byte(c.slurmConf(o, ports)), 0o644); err != nil {
		t.Fatal(err)
	}
	gres := fmt.Sprintf("Name=gpu File=%s/dev/nvidia[0-%d]\n", c.Dir, o.GPUsPerNode-1)
	if err := os.WriteFile(filepath.Join(c.Dir, "gres.conf"), []byte(gres), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.stop)
	ctld, ctldArgs := c.in("slurmctld", "-i")
	c.daemon(filepath.Join(c.Dir, "slurmctld.pid"), ctld, ctldArgs...)
	for i, n := range o.Nodes {
		name, args := "slurmd", []string{"-N", n}
		if c.net != nil {
			name, args = c.net.nodeCommand(i, n, filepath.Join(c.Dir, "hosts"), args...)
		}
		c.daemon(filepath.Join(c.Dir, "slurmd-"+n+".pid"), name, args...)
	}
	c.waitIdle()
	return c
}

// setDefaults fills in the options not given: one node "node1", 4 GPUs and 16 CPUs
// a node, partition "gpu", cluster "gangruntest".
func (o *Options) setDefaults() {
	if len(o.Nodes) == 0 {
		o.Nodes = []string{"node1"}
	}
	if o.GPUsPerNode == 0 {
		o.GPUsPerNode = 4
	}
	if o.CPUsPerNode == 0 {
		o.CPUsPerNode = 16
	}
	if o.Partition == "" {
		o.Partition = "gpu"
	}
	if o.ClusterName == "" {
		o.ClusterName = "gangruntest"
	}
}

// newCluster makes the cluster's directory (removed at the test's end) with its
// state, spool, log and dev directories and o.GPUsPerNode fake GPU devices in dev,
// and starts its munged.
func newCluster(t testing.TB, o Options) *Cluster {
	t.Helper()
	dir, err := os.MkdirTemp("", "gangrun-slurm-")
	if err != nil {
		t.Fatal(err)
	}
	// Jobs of other users read the conf and write their output beside it.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{Dir: dir, Conf: filepath.Join(dir, "slurm.conf"), Nodes: o.Nodes, Partition: o.Partition,
		ClusterName: o.ClusterName, t: t, Munge: mungetest.Start(t), Addrs: map[string]string{}}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, d := range []string{"state", "spool", "log", "dev"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < o.GPUsPerNode; i++ {
		dev := filepath.Join(dir, "dev", "nvidia"+strconv.Itoa(i))
		if err := syscall.Mknod(dev, syscall.S_IFCHR|0o666, int(unix.Mkdev(nvidiaMajor, uint32(i)))); err != nil {
			t.Fatalf("slurmtest: mknod %s: %v", dev, err)
		}
	}
	return c
}

// slurmConf is the cluster's slurm.conf: the controller on ports[0], node i's slurmd
// on ports[1+i] at c.Addrs (its host name its own with Options.Netns, else this
// machine's), everything under c.Dir, then o.Extra's lines.
func (c *Cluster) slurmConf(o Options, ports []int) string {
	dir := c.Dir
	ctlAddr := "127.0.0.1"
	if c.net != nil {
		ctlAddr = c.net.ctlAddr
	}
	var conf strings.Builder
	fmt.Fprintf(&conf, `ClusterName=%s
SlurmctldHost=%s(%s)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=%d
AuthType=auth/munge
AuthInfo=socket=%s
CredType=cred/munge
StateSaveLocation=%s/state
SlurmdSpoolDir=%s/spool/%%n
SlurmctldPidFile=%s/slurmctld.pid
SlurmdPidFile=%s/slurmd-%%n.pid
SlurmctldLogFile=%s/log/slurmctld.log
SlurmdLogFile=%s/log/slurmd-%%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
GresTypes=gpu
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
MessageTimeout=30
KillWait=5
InactiveLimit=0
MinJobAge=300
`, o.ClusterName, hostname(), ctlAddr, ports[0], c.Munge.Socket, dir, dir, dir, dir, dir, dir)
	for i, n := range o.Nodes {
		mem := ""
		if o.MemoryMiB > 0 {
			mem = fmt.Sprintf(" RealMemory=%d", o.MemoryMiB)
		}
		host := hostname()
		if c.net != nil {
			host = n
		}
		fmt.Fprintf(&conf, "NodeName=%s NodeHostname=%s NodeAddr=%s Port=%d CPUs=%d%s Gres=gpu:%d State=UNKNOWN\n",
			n, host, c.Addrs[n], ports[1+i], o.CPUsPerNode, mem, o.GPUsPerNode)
	}
	fmt.Fprintf(&conf, "PartitionName=%s Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n", o.Partition)
	for _, l := range o.Extra {
		conf.WriteString(l + "\n")
	}
	return conf.String()
}

// waitIdle waits until sinfo shows every node idle; the test fails after
// startTimeout.
func (c *Cluster) waitIdle() {
	c.t.Helper()
	deadline := time.Now().Add(startTimeout)
	for {
		out, _, code := c.Run(context.Background(), "", nil, "sinfo", "-h", "-N", "-o", "%N %t")
		idle := 0
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[1] == "idle" {
				idle++
			}
		}
		if code == 0 && idle == len(c.Nodes) {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("slurmtest: the nodes are not idle within %s: sinfo says %q\n%s", startTimeout, out, c.Logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// daemon starts a Slurm daemon, command name with args (it forks into the background),
// and notes its pid file.
func (c *Cluster) daemon(pidFile, name string, args ...string) {
	c.t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = c.Env(nil)
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Fatalf("slurmtest: %s %v: %v: %s\n%s", name, args, err, out, c.Logs())
	}
	c.pids = append(c.pids, pidFile)
}

// Env is the environment a Slurm command of this cluster runs in: the test's own,
// without any SLURM_* variable of an enclosing job, with SLURM_CONF set, then extra.
func (c *Cluster) Env(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLURM_") {
			env = append(env, kv)
		}
	}
	return append(append(env, "SLURM_CONF="+c.Conf), extra...)
}

// Run runs a Slurm command (sbatch, squeue, scontrol...) of this cluster in dir ("":
// the test's working directory) with extra environment, and returns its stdout,
// stderr and exit code (-1 when it could not run or ran past commandTimeout).
func (c *Cluster) Run(ctx context.Context, dir string, extra []string, name string, args ...string) (stdout, stderr string, code int) {
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	name, args = c.in(name, args...)
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, c.Env(extra)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return o.String(), e.String(), 0
	case errors.As(err, &ee) && ctx.Err() == nil:
		return o.String(), e.String(), ee.ExitCode()
	}
	return o.String(), e.String() + err.Error(), -1
}

// in returns command name with args as run in the controller's network namespace with
// Options.Netns, else unchanged.
func (c *Cluster) in(name string, args ...string) (string, []string) {
	if c.net == nil {
		return name, args
	}
	return in(c.net.ctl, name, args...)
}

// WaitJob waits until job id has left squeue (ended, and MinJobAge keeps it in
// scontrol show job) and returns its scontrol show job record.
func (c *Cluster) WaitJob(id string, within time.Duration) string {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		out, _, _ := c.Run(context.Background(), "", nil, "scontrol", "show", "job", id)
		if st := Field(out, "JobState"); st != "" && st != "PENDING" && st != "RUNNING" && st != "COMPLETING" && st != "CONFIGURING" {
			return out
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("slurmtest: job %s did not end within %s:\n%s\n%s", id, within, out, c.Logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Field returns the value of KEY=VALUE in scontrol's output ("" when absent).
func Field(out, key string) string {
	for _, w := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(w, key+"="); ok {
			return v
		}
	}
	return ""
}

// Logs returns the daemons' logs, for a failing test's report.
func (c *Cluster) Logs() string {
	var b strings.Builder
	logs, _ := filepath.Glob(filepath.Join(c.Dir, "log", "*.log"))
	for _, p := range logs {
		data, _ := os.ReadFile(p)
		if len(data) > 16<<10 {
			data = data[len(data)-16<<10:]
		}
		fmt.Fprintf(&b, "--- %s\n%s", p, data)
	}
	return b.String()
}

// stop cancels every job, waits for them to go, and stops the daemons (SIGTERM, then
// SIGKILL after stopTimeout).
func (c *Cluster) stop() {
	ctx := context.Background()
	if out, _, _ := c.Run(ctx, "", nil, "squeue", "-h", "-o", "%i"); strings.TrimSpace(out) != "" {
		c.Run(ctx, "", nil, "scancel", "--full", "--partition", c.Partition)
		deadline := time.Now().Add(stopTimeout)
		for time.Now().Before(deadline) {
			if out, _, code := c.Run(ctx, "", nil, "squeue", "-h", "-o", "%i"); code != 0 || strings.TrimSpace(out) == "" {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if c.t.Failed() {
		c.t.Logf("slurm logs:\n%s", c.Logs())
	}
	var pids []int
	for _, f := range c.pids {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			pids = append(pids, pid)
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
	}
	deadline := time.Now().Add(stopTimeout)
	for _, pid := range pids {
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// alive reports whether process pid runs (and is no zombie).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

// hostname is this machine's host name, which every slurmd's NodeHostname names.
func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "localhost"
	}
	return h
}

// lookPath fails the test when Slurm's binary name is missing.
func lookPath(t testing.TB, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Fatalf("slurmtest: %s not found: install Debian's Slurm (apt-get install slurmctld slurmd slurm-client; make test does)", name)
	}
}
