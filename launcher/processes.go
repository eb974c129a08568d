package launcher

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/internal/cgroup"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/internal/tcpstore"
	"github.com/gangrun/gangrun/rendezvous"
	"github.com/gangrun/gangrun/topology"
)

// The Supervisor's process handling, which the loop (loop.go) calls: what the run sets
// up before its first round and undoes after its last (the guardian, the subreaper,
// the step's cgroup, the log or scratch directory), the processes of an attempt
// (specs), their start and their stop, and the workers' store. The standbys of warm
// restarts are in warm.go.

// cleanups are what Run undoes when it returns, last added first (as deferred calls).
type cleanups []func()

// add has f run when Run returns, before those added earlier.
func (c *cleanups) add(f func()) { *c = append(*c, f) }

// run runs the cleanups, last added first.
func (c cleanups) run() {
	for i := len(c) - 1; i >= 0; i-- {
		c[i]()
	}
}

// setUp prepares the node for the run's first round, in this order: the notes logged,
// the processes this one already has noted, the guardian and the subreaper, the step's
// cgroup, the log or scratch directory, the checkpoint pin, the workers' store, the
// standby program and torch's file-based watchdog. What it sets up is undone by undo,
// also when it fails; an error ends the run with exit code 1.
func (s *Supervisor) setUp(undo *cleanups) error {
	for _, n := range s.cfg.Notes {
		s.cfg.Log.Info(n)
	}
	s.adoptProcess()
	undo.add(func() {
		if err := s.guard.Close(); err != nil {
			s.log.Warn("guardian", zap.Error(err))
		}
	})
	if err := s.confine(); err != nil {
		return err
	}
	undo.add(s.unconfine) // after the standbys and workers are gone, before the guardian
	if err := s.makeLogDirs(undo); err != nil {
		return err
	}
	undo.add(func() { s.pin("") })
	undo.add(s.closeStore)
	undo.add(s.setupWarm())
	s.serveFileTimer(undo)
	return nil
}

// adoptProcess readies this process to supervise workers: with Config.Subreaper it
// notes the children it already has (never swept) and becomes a child subreaper, and
// with Config.GuardianArgv it starts the guardian. Each that fails is logged and run
// without.
func (s *Supervisor) adoptProcess() {
	if s.cfg.Subreaper {
		// Children this process inherited when it was exec'd (a shell's `exec >
		// >(tee run.log)` before `exec gangrun run`) are not the workers': the sweep
		// leaves them alone.
		s.inherited = map[int]bool{}
		for _, pid := range proc.Children() {
			s.inherited[pid] = true
		}
	}
	if len(s.cfg.GuardianArgv) > 0 {
		g, err := proc.StartGuardian(s.cfg.GuardianArgv)
		if err != nil {
			s.log.Warn("no guardian: only parent-death signals protect the workers if gangrun is killed", zap.Error(err))
		}
		s.guard = g
	}
	if s.cfg.Subreaper {
		if err := proc.BecomeSubreaper(); err != nil {
			s.log.Warn("not a subreaper: a worker's child that leaves its process group (setsid) may outlive the run", zap.Error(err))
			s.cfg.Subreaper = false
		}
	}
}

// makeLogDirs creates the run's own directory under LogDir (Config.LogDirPerRun) and
// makes it LogDir, or, without a LogDir, the scratch directory of the workers' error
// files and heartbeats, removed when Run returns (undo) or should this process die
// (the guardian).
func (s *Supervisor) makeLogDirs(undo *cleanups) error {
	if s.cfg.LogDir != "" && s.cfg.LogDirPerRun {
		if err := os.MkdirAll(s.cfg.LogDir, logDirMode); err != nil {
			return fmt.Errorf("--log-dir %s: %w", s.cfg.LogDir, err)
		}
		dir, err := os.MkdirTemp(s.cfg.LogDir, safeName(s.cfg.JobID)+"_")
		if err != nil {
			return fmt.Errorf("--log-dir %s: %w", s.cfg.LogDir, err)
		}
		s.cfg.LogDir = dir
		s.log.Info("worker logs in this run's directory", zap.String("dir", dir))
	}
	if s.cfg.LogDir != "" {
		return nil
	}
	dir, err := os.MkdirTemp("", "gangrun-"+safeName(s.cfg.JobID)+"-")
	if err != nil {
		return fmt.Errorf("create scratch dir: %w", err)
	}
	s.scratch = dir
	if !s.cfg.User.IsSelf() {
		// The user's workers pass through to their own rank directories; they list
		// nothing here.
		if err := os.Chmod(dir, 0o711); err != nil {
			os.RemoveAll(dir)
			return fmt.Errorf("scratch dir: %w", err)
		}
	}
	undo.add(func() { os.RemoveAll(dir) })
	if err := s.guard.RemoveOnDeath(dir); err != nil {
		s.log.Warn("guardian", zap.Error(err))
	}
	return nil
}

// serveFileTimer serves torch's file-based watchdog (FileTimerEnableEnv) to the
// workers this node starts itself (a wrapped torchrun serves its own), closed when Run
// returns (undo); one that cannot be served is logged, and its timers not judged.
func (s *Supervisor) serveFileTimer(undo *cleanups) {
	env := newEnvMap(s.cfg.Env.Base, s.cfg.Env.Extra)
	if env[FileTimerEnableEnv] != "1" || s.torch != nil {
		return
	}
	ft, err := openFileTimer(env[FileTimerFileEnv], s.cfg.User)
	if err != nil {
		s.log.Warn("torch's file-based watchdog cannot be served: its timers are not judged", zap.Error(err))
		return
	}
	s.timer = ft
	undo.add(ft.close)
	if ft.created != "" {
		if err := s.guard.RemoveOnDeath(ft.created); err != nil {
			s.log.Warn("guardian", zap.Error(err))
		}
	}
	s.log.Info("serving torch's file-based watchdog", zap.String(FileTimerFileEnv, ft.path))
}

// placement is where workers start: the step's cgroup, or nil (a nil *cgroup.Step in
// the interface would not be nil).
func (s *Supervisor) placement() proc.Placement {
	if s.cg == nil {
		return nil
	}
	return s.cg
}

// confine creates the step's cgroup (Config.Confine) and has the guardian remove it
// should this process die; an error ends the run only under --cgroup required.
func (s *Supervisor) confine() error {
	c := s.cfg.Confine
	if c.Why != "" {
		s.log.Info(c.Why)
	}
	if c.Mode == "" || c.Mode == cgroup.Off {
		return nil
	}
	job := safeName(s.cfg.JobID)
	if len(job) > 64 {
		job = job[:64] // a cgroup's name is a file name: at most 255 bytes
	}
	name := "gangrun-" + job + "-" + strconv.Itoa(os.Getpid()) + "-" + randomHex(3)
	st, err := cgroup.New(name, c.Limits)
	if err != nil {
		if c.Mode == cgroup.Required {
			return fmt.Errorf("--cgroup required: %w", err)
		}
		s.log.Info("running the step unconfined (--cgroup auto): " + err.Error())
		return nil
	}
	s.cg = st
	for _, d := range st.Dirs() {
		if err := s.guard.RemoveCgroupOnDeath(d); err != nil {
			s.log.Warn("guardian", zap.Error(err))
		}
	}
	fields := []zap.Field{zap.String("cgroup", name), zap.Strings("controllers", st.Controllers()),
		zap.String("cpus", topology.FormatCPUList(c.Limits.CPUs))}
	if c.Limits.MemoryBytes > 0 {
		fields = append(fields, zap.String("mem", cgroup.FormatMem(c.Limits.MemoryBytes)))
	}
	if c.Limits.PidsLimit > 0 {
		fields = append(fields, zap.Int64("pids_limit", c.Limits.PidsLimit))
	}
	if n := len(c.Limits.Devices); n > 0 && slices.Contains(st.Controllers(), "devices") {
		paths := make([]string, n)
		for i, r := range c.Limits.Devices {
			paths[i] = r.Path
		}
		fields = append(fields, zap.Strings("devices_denied", paths))
	}
	if st.V2() {
		fields = append(fields, zap.String("hierarchy", "v2"))
	}
	s.log.Info("step confined to its cgroup", fields...)
	if why := st.Why(); why != "" {
		s.log.Info("the step's cgroup lacks part of its confinement: " + why)
	}
	return nil
}

// unconfine removes the step's cgroup, killing what is left in it.
func (s *Supervisor) unconfine() {
	if s.cg == nil {
		return
	}
	if err := s.cg.Delete(); err != nil {
		s.log.Warn("remove the step's cgroup", zap.Error(err))
	}
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// specs builds the processes of one attempt.
func (s *Supervisor) specs(a rendezvous.Assignment) ([]workerSpec, error) {
	base := s.cfg.LogDir
	if base == "" {
		base = s.scratch
	}
	attempt := attemptPrefix + strconv.Itoa(a.Round)
	attemptDir := filepath.Join(base, attempt)
	resume := []string(nil)
	if a.ResumeFrom != "" && s.cfg.ResumeArg != "" {
		resume = []string{s.cfg.ResumeArg, a.ResumeFrom}
		if strings.HasSuffix(s.cfg.ResumeArg, "=") { // --resume-arg --resume= : one argument
			resume = []string{s.cfg.ResumeArg + a.ResumeFrom}
		}
	}
	if s.torch != nil {
		v := TorchrunValues{NNodes: a.NNodes, NodeRank: a.NodeRank, MasterAddr: a.MasterAddr, MasterPort: a.MasterPort, NProcPerNode: s.cfg.NProcPerNode}
		if err := s.torch.CheckRound(v); err != nil {
			return nil, err
		}
		node := "node_" + strconv.Itoa(a.NodeRank)
		dir := filepath.Join(attemptDir, node)
		errFile := filepath.Join(dir, errorFileName)
		return []workerSpec{{
			localRank: -1, rank: -1,
			argv:   append(s.torch.Command(v), resume...),
			env:    TorchrunEnv(s.cfg.Env, a, errFile),
			prefix: "[node" + strconv.Itoa(a.NodeRank) + "]: ",
			base:   base, rel: []string{attempt, node},
			dir: dir, errorFile: errFile, logFiles: s.cfg.LogDir != "", place: s.placement(), user: s.cfg.User,
		}}, nil
	}
	specs := make([]workerSpec, 0, a.LocalWorldSize)
	// A hung gang's stacks (collectStacks) need faulthandler, unless the user chose.
	_, userSet := newEnvMap(s.cfg.Env.Base, s.cfg.Env.Extra)["PYTHONFAULTHANDLER"]
	faulthandler := !userSet && (s.cfg.HangTimeout > 0 || s.timer != nil)
	for lr := 0; lr < a.LocalWorldSize; lr++ {
		rank := a.RankOffset + lr
		rankDir := "rank_" + strconv.Itoa(rank)
		dir := filepath.Join(attemptDir, rankDir)
		errFile := filepath.Join(dir, errorFileName)
		argv := append(append([]string{}, s.cfg.Command...), resume...)
		if s.cfg.LocalRankArg {
			argv = append(argv, "--local_rank="+strconv.Itoa(lr))
		}
		env := append(WorkerEnv(s.cfg.Env, a, lr, errFile), HeartbeatEnv+"="+filepath.Join(dir, heartbeatName))
		if s.timer != nil {
			env = append(env, FileTimerFileEnv+"="+s.timer.path)
		}
		if faulthandler {
			env = append(env, "PYTHONFAULTHANDLER=1")
		}
		var cpus []int
		var mem proc.MemPolicy
		if lr < len(s.cfg.Env.Ranks) {
			rp := s.cfg.Env.Ranks[lr]
			cpus, mem = rp.CPUs, proc.MemPolicy{Nodes: rp.Mems, Strict: rp.MemBind == topology.MemBindStrict}
		}
		spec := workerSpec{
			localRank: lr, rank: rank, argv: argv, cpus: cpus, mem: mem, place: s.placement(), user: s.cfg.User,
			env:    env,
			prefix: rankPrefix(rank), base: base, rel: []string{attempt, rankDir},
			dir: dir, errorFile: errFile, logFiles: s.cfg.LogDir != "",
		}
		if st := s.cfg.Streams; st != nil {
			file, console := st.route(lr)
			spec.logFiles = s.cfg.LogDir != "" && (file[0] || file[1])
			for i := range 2 {
				spec.noFile[i], spec.noConsole[i] = !file[i], !console[i]
			}
			if p := st.prefix(cmp.Or(s.cfg.Env.Role, RoleName), lr, rank); p != "" {
				spec.prefix = p
			}
		}
		specs = append(specs, spec)
	}
	return specs, nil
}

// startAttempt starts the workers of specs for attempt at: it notes the start (the
// attempt's time, the cgroup's OOM kills and refused forks so far, the watchdog's and
// the output's clocks) and starts them from the standbys when there are any
// (Config.WarmRestarts), else cold.
func (s *Supervisor) startAttempt(at *attempt, specs []workerSpec) (*group, error) {
	at.started = time.Now()
	s.started = at.started
	if s.cg != nil {
		s.oomBase, s.pidsBase = s.cg.OOMKills(), s.cg.PidsRefused()
	}
	if s.timer != nil {
		s.timer.reset()
	}
	s.act.touch()
	var fromStandby warmStart
	s.warm.masterChecked = false
	if s.warm.nextSpecs != nil && len(s.warm.standbys) == 0 {
		s.log.Info("starting cold: the last attempt ended within --warm-delay, before its standbys were started",
			zap.Duration("warm_delay", s.cfg.WarmDelay))
	} else if len(s.warm.standbys) > 0 {
		fromStandby = s.takeStandby
	}
	s.warm.nextSpecs = nil
	return startGroup(specs, s.console, s.consoleErr, &s.act, s.guard, fromStandby)
}

// afterStart follows the start of attempt a's workers g: it says once that the kernel
// refused a worker's memory binding and, with warm restarts, readies the standbys of
// the attempt after (those the warm workers forked, and fresh ones for the other ranks
// of specs, at once or WarmDelay later).
func (s *Supervisor) afterStart(a rendezvous.Assignment, g *group, specs []workerSpec) {
	for _, w := range g.workers {
		if w.memRefused && !s.memRefusedTold {
			s.memRefusedTold = true
			s.log.Info("no memory binding: the kernel refused the NUMA node of the workers' GPUs (a node this machine lacks, or one outside gangrun's cpuset)",
				zap.Int("rank", w.spec.rank), zap.Ints("numa_nodes", w.spec.mem.Nodes))
		}
	}
	if s.warm.dir == "" {
		return
	}
	s.log.Info("workers started", zap.Int("attempt", a.Round), zap.Int("warm", g.warm), zap.Int("cold", len(g.workers)-g.warm))
	// The standbys not used are dropped; those the warm workers forked serve the
	// attempt after, and only the ranks without one get a fresh standby.
	s.adoptForked()
	forked := s.warm.forked
	s.warm.forked = nil
	s.dropStandbys()
	s.warm.standbys = forked
	if s.cfg.WarmDelay <= 0 {
		s.prepareStandbys(specs)
	} else if !s.standbysFor(specs) {
		s.warm.nextSpecs = specs // monitor starts them when they are due
	}
}

// stop ends an attempt: it sends sig (when non-zero) to every live worker, waits up to
// TermTimeout (cut short to end by killBy, when set: the lease's kill time) for them to
// exit, SIGKILLs the rest, reaps everything and drains output. A terminating signal
// arriving meanwhile kills at once.
func (s *Supervisor) stop(g *group, sig syscall.Signal, killBy time.Time) {
	grace := s.cfg.TermTimeout
	if !killBy.IsZero() {
		grace = max(min(grace, time.Until(killBy)), 0)
	}
	if sig != 0 {
		g.signal(sig)
	}
	if len(g.live()) > 0 && grace > 0 {
		deadline := time.NewTimer(grace)
		defer deadline.Stop()
	wait:
		for len(g.live()) > 0 {
			select {
			case i := <-g.exits:
				g.workers[i].reap(s.guard)
			case <-deadline.C:
				s.log.Warn("workers still running after the grace: sending SIGKILL",
					zap.Int("workers", len(g.live())), zap.Duration("grace", grace))
				break wait
			case in := <-s.cfg.Signals:
				if s.signalWhileStopping(g, in) {
					break wait
				}
			}
		}
	}
	g.kill(s.guard)
	s.closeStore() // the attempt's workers are gone: the next attempt's find a new one
	if s.cfg.Subreaper {
		keep := s.standbyPids(map[int]bool{s.guard.Pid(): true})
		for pid := range s.inherited {
			keep[pid] = true
		}
		// Only what came from this run's workers: their environment carries the job and
		// node gangrun gave them, which nothing else among this process's children does.
		marks := []string{"GANGRUN_JOB_ID=" + s.cfg.JobID, "GANGRUN_NODE_NAME=" + s.cfg.NodeName}
		ours := func(pid int) bool { return proc.Marked(pid, marks) }
		if n := proc.KillOrphans(keep, g.pids(), ours); n > 0 {
			s.log.Info("killed processes the workers left outside their process groups", zap.Int("processes", n))
		}
	}
}

// serveStore starts the workers' TCPStore for attempt a on MASTER_PORT, on every
// interface as torch's own server binds, when this node serves it: node rank 0 with
// Env.AgentStore. The previous attempt's is closed first. An error (the port is taken)
// names the port.
func (s *Supervisor) serveStore(a rendezvous.Assignment) error {
	s.closeStore()
	if !s.cfg.Env.AgentStore || a.NodeRank != 0 {
		return nil
	}
	st, err := tcpstore.Listen(net.JoinHostPort("", strconv.Itoa(a.MasterPort)))
	if err != nil {
		return fmt.Errorf("MASTER_PORT %d: gangrun serves the workers' store there (TORCHELASTIC_USE_AGENT_STORE=True) and cannot: %w", a.MasterPort, err)
	}
	st.Set(StoreRoundKey, []byte(strconv.Itoa(a.RestartCount)))
	s.store = st
	return nil
}

// StoreRoundKey is the key of the workers' store under which node rank 0's gangrun
// publishes its attempt's restart count (rendezvous.JoinRequest.StoreRound); torch's
// keys are all under /worker/attempt_N or its own prefixes, never this one.
const StoreRoundKey = "gangrun/restart_count"

// storeRoundPoll is how often a node waiting for node rank 0's store asks again.
const storeRoundPoll = 200 * time.Millisecond

// storeRound is rendezvous.JoinRequest.StoreRound: it asks the store at master for
// StoreRoundKey until a store answers with a count above after (the store that node
// rank 0's gangrun opened for a newer attempt than this node's last), and returns it.
// It gives up when ctx ends (a signal, the run's end).
func (s *Supervisor) storeRound(ctx context.Context, master string, after int) (int, error) {
	logged := false
	for {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		v, err := tcpstore.Get(qctx, master, StoreRoundKey)
		cancel()
		if n, perr := strconv.Atoi(string(v)); err == nil && perr == nil && n > after {
			return n, nil
		}
		if !logged {
			s.log.Info("waiting for node rank 0's workers' store of a new attempt", zap.String("master", master), zap.Int("after_restart_count", after))
			logged = true
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(storeRoundPoll):
		}
	}
}

// closeStore closes the attempt's TCPStore, if this node serves one.
func (s *Supervisor) closeStore() {
	if s.store != nil {
		_ = s.store.Close()
		s.store = nil
	}
}
