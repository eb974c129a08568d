package launcher

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/internal/proc"
)

// Warm restarts (docs/run.md, "Warm restarts"): while an attempt runs, a standby
// interpreter per local rank imports the heavy modules and waits; the next attempt's
// worker is that standby, handed its environment, argv and working directory, instead
// of a fresh interpreter.

// standbyProgram is the standby's Python program, written to the run's scratch
// directory.
//
//go:embed standby.py
var standbyProgram []byte

// DefaultWarmDelay is --warm-delay's default: how long after an attempt's workers start
// the standbys for the next one are started. A few seconds covers a trainer's own
// start-up on a small node (its imports, gloo's or NCCL's set-up, a checkpoint's load),
// with which a standby's import of torch would otherwise compete; failures come hours
// apart on a real cluster, so the next attempt finds its standbys ready all the same.
const DefaultWarmDelay = 5 * time.Second

// DefaultWarmImports is what a standby imports when --warm-imports is not given, each
// import's error ignored. torch._dynamo is there because torch 2.x's
// DistributedDataParallel imports it in its constructor (get_optimize_ddp_mode), some
// 900 modules and over a second of every restarted rank's time on a small node, where
// `import torch` does not; torch 1.13 has none, and its failed import costs nothing
// (benchmarks/README.md, goodput on torch 2.15: kill → first step 2.84 s before, 0.36 s
// with it).
var DefaultWarmImports = []string{"torch", "torch._dynamo"}

// lateVars are the worker variables whose values change from attempt to attempt: a
// standby is started without them and gets them at activation. Every other variable
// of the worker's environment holds its final value in the standby already (a library
// may read it at import time), and a standby whose environment differs from the
// attempt's in any of them is not used.
var lateVars = map[string]bool{
	"MASTER_ADDR": true, "MASTER_PORT": true,
	"RANK": true, "GROUP_RANK": true, "ROLE_RANK": true,
	"WORLD_SIZE": true, "GROUP_WORLD_SIZE": true, "ROLE_WORLD_SIZE": true, "LOCAL_WORLD_SIZE": true,
	"TORCHELASTIC_RESTART_COUNT": true, "TORCHELASTIC_ERROR_FILE": true,
	"GANGRUN_ATTEMPT": true, "GANGRUN_RESUME_FROM": true, HeartbeatEnv: true,
}

// LateVars returns the names of the worker variables set only when a standby is
// activated (sorted).
func LateVars() []string {
	out := make([]string, 0, len(lateVars))
	for k := range lateVars {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Bounds of an activation: a standby still importing is waited for (a fresh
// interpreter would import as long), one that does not take the request is not.
const (
	standbyReadyWait = 2 * time.Minute
	standbyAckWait   = 10 * time.Second
)

// pythonCommand is a worker command a standby can run: an interpreter with simple
// options, running a script or a module.
type pythonCommand struct {
	interp []string // the interpreter and its options
	script string   // the script, or
	module string   // the module (-m)
	args   []string // the script's or module's arguments
}

// parsePython recognises `python [-u|-O|-OO|-B|-X opt|-W arg]... (script | -m mod) [args]`;
// ok is false for anything else (-c, -i, -E, -I, a wrapper, a shell).
func parsePython(argv []string) (c pythonCommand, ok bool) {
	if len(argv) < 2 || !pythonName.MatchString(filepath.Base(argv[0])) {
		return c, false
	}
	i := 1
	for ; i < len(argv); i++ {
		a := argv[i]
		switch {
		case a == "-X" || a == "-W":
			if i+1 >= len(argv) {
				return c, false
			}
			i++
		case (strings.HasPrefix(a, "-X") || strings.HasPrefix(a, "-W")) && len(a) > 2:
		case len(a) > 1 && a[0] == '-' && strings.Trim(a[1:], "uOB") == "":
		case a == "-m":
			if i+1 >= len(argv) || argv[i+1] == "" || strings.HasPrefix(argv[i+1], "-") {
				return c, false
			}
			return pythonCommand{interp: argv[:i], module: argv[i+1], args: argv[i+2:]}, true
		case strings.HasPrefix(a, "-") || a == "":
			return c, false
		default:
			return pythonCommand{interp: argv[:i], script: a, args: argv[i+1:]}, true
		}
	}
	return c, false
}

// standbyEnv is env without the late variables, sorted.
func standbyEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); !lateVars[k] {
			out = append(out, kv)
		}
	}
	slices.Sort(out)
	return out
}

// standby is a waiting interpreter for one local rank of the next attempt. Its output
// is pumped from the start (as "[standbyN]: " lines until activation); at activation
// its worker takes the rank's spec and its pumps the rank's prefix and log files.
type standby struct {
	w      *worker
	ctrl   *os.File    // gangrun → standby: the activation request (a Unix socket)
	acks   chan string // standby → gangrun: "ready", "go [PID]"
	env    []string    // its environment: the worker's less the late variables
	interp []string
}

// standbyEnds are the descriptors between gangrun and one standby: gangrun's ends and
// the standby's own (child: its stdout, stderr, fd 3 and fd 4), which gangrun closes
// once the standby holds them.
type standbyEnds struct {
	outR, errR, ctrl, ackR *os.File
	child                  [4]*os.File
}

// newStandbyEnds makes a standby's pipes and its control socket.
func newStandbyEnds() (*standbyEnds, error) {
	e := &standbyEnds{}
	var err error
	if e.outR, e.child[0], err = os.Pipe(); err != nil {
		return nil, err
	}
	if e.errR, e.child[1], err = os.Pipe(); err != nil {
		e.closeAll()
		return nil, err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		e.closeAll()
		return nil, os.NewSyscallError("socketpair", err)
	}
	e.ctrl, e.child[2] = os.NewFile(uintptr(fds[0]), "standby-ctrl"), os.NewFile(uintptr(fds[1]), "standby-ctrl")
	if e.ackR, e.child[3], err = os.Pipe(); err != nil {
		e.closeAll()
		return nil, err
	}
	return e, nil
}

// closeChild closes gangrun's copies of the standby's ends.
func (e *standbyEnds) closeChild() {
	for _, f := range e.child {
		if f != nil {
			f.Close()
		}
	}
}

// closeAll closes every end.
func (e *standbyEnds) closeAll() {
	e.closeChild()
	for _, f := range []*os.File{e.outR, e.errR, e.ctrl, e.ackR} {
		if f != nil {
			f.Close()
		}
	}
}

// startStandby starts the standby of spec's local rank, a process like a worker.
func (s *Supervisor) startStandby(spec workerSpec, pc pythonCommand) (*standby, error) {
	imports := strings.Join(s.cfg.WarmImports, ",")
	mode := "strict"
	if s.cfg.WarmImports == nil {
		imports, mode = strings.Join(DefaultWarmImports, ","), "optional"
	}
	argv := append(slices.Clone(pc.interp), filepath.Join(s.warm.dir, "standby.py"), imports, mode)
	env := standbyEnv(spec.env)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	if !s.cfg.User.IsSelf() {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cfg.User.Credential()} // kept by proc.Start
	}
	e, err := newStandbyEnds()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = e.child[0], e.child[1]
	cmd.ExtraFiles = []*os.File{e.child[2], e.child[3]}    // fds 3 and 4
	p, _, err := proc.StartPlaced(cmd, nil, s.placement()) // in the step's cgroup, unbound
	if err != nil {
		e.closeAll()
		return nil, err
	}
	e.closeChild()
	return s.newStandby(spec.localRank, p, e, env, slices.Clone(pc.interp)), nil
}

// newStandby watches p, a started standby of localRank whose ends e gangrun holds (its
// own closed), pumps its output and reads its acknowledgements.
func (s *Supervisor) newStandby(localRank int, p *proc.Process, e *standbyEnds, env, interp []string) *standby {
	w := &worker{spec: workerSpec{localRank: localRank, rank: -1}, p: p, readers: []*os.File{e.outR, e.errR}}
	_ = s.guard.Watch(p.Pid())
	prefix := "[standby" + strconv.Itoa(localRank) + "]: "
	sinks := []*lineWriter{s.console, s.consoleErr}
	for i, r := range w.readers {
		w.targets[i] = &pumpTarget{prefix: prefix}
		w.pumps.Add(1)
		go func(i int, r *os.File) {
			defer w.pumps.Done()
			pumpTo(r, sinks[i], w.targets[i])
		}(i, r)
	}
	sb := &standby{w: w, ctrl: e.ctrl, acks: make(chan string, 2), env: env, interp: interp}
	go func(ackR *os.File) {
		defer close(sb.acks)
		defer ackR.Close()
		sc := bufio.NewScanner(ackR)
		for sc.Scan() {
			sb.acks <- sc.Text()
		}
	}(e.ackR)
	return sb
}

// awaitAck waits for the line word, or word and more after a space, from the standby,
// up to d, and returns the line; an error when it exits first.
func (sb *standby) awaitAck(word string, d time.Duration) (string, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case got, ok := <-sb.acks:
		if !ok {
			return "", errors.New("it exited")
		}
		if got != word && !strings.HasPrefix(got, word+" ") {
			return "", fmt.Errorf("it said %q, not %q", got, word)
		}
		return got, nil
	case <-t.C:
		return "", fmt.Errorf("no %q within %s", word, d)
	}
}

// activate hands spec to the standby and returns it as spec's worker, its output going
// to spec's prefix and files. With next, the standby then forks the rank's standby for
// the attempt after, onto next's child ends (closed here once sent), and says so on its
// acknowledgements (pendingFork).
func (sb *standby) activate(spec workerSpec, pc pythonCommand, cwd string, files []*os.File, act *activity, next *standbyEnds) (*worker, error) {
	if _, err := sb.awaitAck("ready", standbyReadyWait); err != nil {
		return nil, err
	}
	req := map[string]any{"env": envObject(spec.env), "cwd": cwd}
	// The rank is known now: its CPUs bind every thread the standby has (torch's
	// pools included), and its memory policy is the standby's to set on itself
	// (set_mempolicy acts on the calling thread only), before the script's first line.
	if len(spec.cpus) > 0 {
		if _, err := proc.BindProcess(sb.w.p.Pid(), spec.cpus); err != nil {
			return nil, err
		}
	}
	if len(spec.mem.Nodes) > 0 {
		mode := 1 // MPOL_PREFERRED: its first node
		if spec.mem.Strict {
			mode = 2 // MPOL_BIND
		}
		req["mempolicy"] = map[string]any{"mode": mode, "nodes": spec.mem.Nodes}
	}
	if pc.module != "" {
		req["module"] = pc.module
		req["argv"] = append([]string{"-m"}, pc.args...)
	} else {
		req["script"] = pc.script
		req["argv"] = append([]string{pc.script}, pc.args...)
	}
	var rights []byte
	if next != nil {
		req["next"] = map[string]any{"ppid": os.Getpid()}
		rights = unix.UnixRights(int(next.child[0].Fd()), int(next.child[1].Fd()), int(next.child[2].Fd()), int(next.child[3].Fd()))
	}
	data, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	w := sb.w
	w.spec, w.files = spec, files
	for i, t := range w.targets {
		var file io.Writer
		if i < len(files) && files[i] != nil {
			file = files[i]
		}
		t.set(spec.prefix, file, act)
		t.mute(spec.noConsole[i])
	}
	go func(ctrl *os.File) {
		// A standby that died is seen by awaitAck.
		_ = sendLine(ctrl, append(data, '\n'), rights)
		if next != nil {
			next.closeChild() // the standby holds its own copies once sent
		}
		ctrl.Close()
	}(sb.ctrl)
	sb.ctrl = nil
	if _, err := sb.awaitAck("go", standbyAckWait); err != nil {
		w.files = nil // the caller closes them
		return nil, err
	}
	return w, nil
}

// forkWait bounds how long gangrun waits for a worker's "next" (the fork of the next
// standby, tens of milliseconds) once every worker of the attempt is started.
const forkWait = 2 * time.Second

// pendingFork is a standby activated with next ends: its "next [PID]" is still to come.
type pendingFork struct {
	from *standby
	ends *standbyEnds
}

// forkedPid waits up to d for the standby's "next [PID]" and returns PID, 0 when it did
// not fork, or an error.
func (pf *pendingFork) forkedPid(d time.Duration) (int, error) {
	got, err := pf.from.awaitAck("next", d)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(got)
	if len(f) < 2 {
		return 0, nil
	}
	pid, err := strconv.Atoi(f[1])
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("it said %q", got)
	}
	return pid, nil
}

// sendLine writes data to the Unix socket f, passing the descriptors in rights (nil:
// none) with its first byte.
func sendLine(f *os.File, data, rights []byte) error {
	fd := int(f.Fd())
	for len(data) > 0 {
		n, err := unix.SendmsgN(fd, data, rights, nil, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return os.NewSyscallError("sendmsg", err)
		}
		data, rights = data[n:], nil
	}
	return nil
}

// drop kills the standby and reaps it.
func (sb *standby) drop(s *Supervisor) {
	if sb.ctrl != nil {
		sb.ctrl.Close()
		sb.ctrl = nil
	}
	sb.w.reap(s.guard)
	sb.w.finishOutput()
}

// envObject is env as a JSON object.
func envObject(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// warmState is what the Supervisor keeps for warm restarts (Config.WarmRestarts).
type warmState struct {
	dir      string           // holds the standby program; "" when warm restarts are off
	standbys map[int]*standby // by local rank, for the next attempt
	// forked are the standbys the current attempt's warm workers forked at their
	// activation, for the attempt after (by local rank).
	forked   map[int]*standby
	pending  map[int]*pendingFork // activated standbys whose fork is still to be told
	forkTold bool                 // the log said that a standby could not fork
	// masterChecked: a warm rank of this attempt waited for rank 0's store (awaitMaster);
	// masterSilent: one waited in vain, so none waits again.
	masterChecked, masterSilent bool
	// nextSpecs are the specs whose standbys are due WarmDelay after the attempt's start
	// (nil: none due).
	nextSpecs []workerSpec
}

// setupWarm sets up warm restarts when the config asks for them and the command is a
// Python interpreter running a script or module: it writes the standby program to a
// scratch directory (s.warm.dir, "" when warm restarts are off). The returned cleanup
// kills the standbys left and removes the directory.
func (s *Supervisor) setupWarm() (cleanup func()) {
	cleanup = func() {}
	if !s.cfg.WarmRestarts || s.torch != nil {
		return cleanup
	}
	if _, ok := parsePython(s.cfg.Command); !ok {
		s.log.Info("warm restarts off: the command is not a Python interpreter running a script or -m module with only -u, -O, -B, -X or -W options")
		return cleanup
	}
	dir, err := os.MkdirTemp("", "gangrun-warm-"+safeName(s.cfg.JobID)+"-")
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "standby.py"), standbyProgram, 0o644)
		if err == nil && !s.cfg.User.IsSelf() {
			err = os.Chmod(dir, 0o755) // the user's standbys read the program
		}
		if err != nil {
			os.RemoveAll(dir)
		}
	}
	if err != nil {
		s.log.Warn("warm restarts off: cannot write the standby program", zap.Error(err))
		return cleanup
	}
	if err := s.guard.RemoveOnDeath(dir); err != nil {
		s.log.Warn("guardian", zap.Error(err))
	}
	s.warm.dir = dir
	return func() {
		s.dropStandbys()
		os.RemoveAll(dir)
	}
}

// prepareStandbys starts a standby for each local rank of specs that has none fit for
// the next attempt (a forked one may be there already), and drops the standbys of
// local ranks not in specs.
func (s *Supervisor) prepareStandbys(specs []workerSpec) {
	if s.warm.dir == "" {
		return
	}
	if s.warm.standbys == nil {
		s.warm.standbys = map[int]*standby{}
	}
	want := map[int]bool{}
	for _, spec := range specs {
		want[spec.localRank] = true
		pc, ok := parsePython(spec.argv)
		if !ok {
			continue
		}
		if sb := s.warm.standbys[spec.localRank]; sb != nil {
			select {
			case <-sb.w.p.Exited():
			default:
				if slices.Equal(standbyEnv(spec.env), sb.env) && slices.Equal(pc.interp, sb.interp) {
					continue
				}
			}
			sb.drop(s)
			delete(s.warm.standbys, spec.localRank)
		}
		sb, err := s.startStandby(spec, pc)
		if err != nil {
			s.log.Warn("no standby for the next attempt", zap.Int("local_rank", spec.localRank), zap.Error(err))
			continue
		}
		s.warm.standbys[spec.localRank] = sb
	}
	for lr, sb := range s.warm.standbys {
		if !want[lr] {
			sb.drop(s)
			delete(s.warm.standbys, lr)
		}
	}
}

// standbysFor reports whether every local rank of specs has a standby.
func (s *Supervisor) standbysFor(specs []workerSpec) bool {
	for _, spec := range specs {
		if s.warm.standbys[spec.localRank] == nil {
			return false
		}
	}
	return true
}

// dropStandbys kills every standby not used, the forked ones for the attempt after
// included, and forgets the forks still to be told (a copy whose control socket
// closes exits).
func (s *Supervisor) dropStandbys() {
	for lr, pf := range s.warm.pending {
		pf.ends.closeAll()
		delete(s.warm.pending, lr)
	}
	for _, m := range []map[int]*standby{s.warm.standbys, s.warm.forked} {
		for lr, sb := range m {
			sb.drop(s)
			delete(m, lr)
		}
	}
}

// standbyPids adds the standbys' pids (their process groups) to keep.
func (s *Supervisor) standbyPids(keep map[int]bool) map[int]bool {
	for _, m := range []map[int]*standby{s.warm.standbys, s.warm.forked} {
		for _, sb := range m {
			keep[sb.w.p.Pid()] = true
		}
	}
	return keep
}

// takeStandby returns spec's worker started from its standby, or nil (having logged
// why) when it must start cold. files are spec's log files, already created. Where
// standbys fork (Config.Subreaper), the standby forks the rank's next one first, kept
// in s.warm.forked.
func (s *Supervisor) takeStandby(spec workerSpec, files []*os.File) *worker {
	if s.warm.dir == "" || spec.localRank < 0 {
		return nil
	}
	sb := s.warm.standbys[spec.localRank]
	delete(s.warm.standbys, spec.localRank)
	cold := func(why string) *worker {
		s.log.Info("starting rank cold: "+why, zap.Int("rank", spec.rank), zap.Int("local_rank", spec.localRank))
		if sb != nil {
			sb.drop(s)
		}
		return nil
	}
	if sb == nil {
		return cold("no standby")
	}
	select {
	case <-sb.w.p.Exited():
		return cold("its standby exited")
	default:
	}
	pc, ok := parsePython(spec.argv)
	if !ok || !slices.Equal(pc.interp, sb.interp) {
		return cold("the command's interpreter changed")
	}
	if !slices.Equal(standbyEnv(spec.env), sb.env) {
		return cold("its environment changed beyond the per-attempt variables")
	}
	cwd, err := os.Getwd()
	if err != nil {
		return cold("no working directory: " + err.Error())
	}
	if spec.rank != 0 {
		s.awaitMaster(spec.env)
	}
	var next *standbyEnds
	if s.cfg.Subreaper {
		if next, err = newStandbyEnds(); err != nil {
			s.log.Warn("the next standby starts afresh", zap.Int("local_rank", spec.localRank), zap.Error(err))
			next = nil
		}
	}
	w, err := sb.activate(spec, pc, cwd, files, &s.act, next)
	if err != nil {
		if next != nil {
			next.closeAll()
		}
		return cold("its standby did not take the attempt: " + err.Error())
	}
	if next != nil {
		if s.warm.pending == nil {
			s.warm.pending = map[int]*pendingFork{}
		}
		s.warm.pending[spec.localRank] = &pendingFork{from: sb, ends: next}
	}
	return w
}

// adoptForked waits for the standbys the attempt's warm workers forked (their workers
// run meanwhile) and keeps them in s.warm.forked, for the attempt after.
func (s *Supervisor) adoptForked() {
	deadline := time.Now().Add(forkWait)
	for lr, pf := range s.warm.pending {
		delete(s.warm.pending, lr)
		pid, err := pf.forkedPid(max(time.Until(deadline), time.Millisecond))
		if err != nil {
			pf.ends.closeAll()
			s.log.Warn("the next standby starts afresh: its worker did not say what it forked", zap.Int("local_rank", lr), zap.Error(err))
			continue
		}
		s.adoptStandby(lr, pid, pf.ends, pf.from)
	}
}

// adoptStandby keeps pid, the standby that from forked for the attempt after (0: it did
// not fork), as localRank's, on the ends e.
func (s *Supervisor) adoptStandby(localRank, pid int, e *standbyEnds, from *standby) {
	if pid <= 0 {
		e.closeAll()
		if !s.warm.forkTold {
			s.warm.forkTold = true
			s.log.Info("the next attempt's standbys start afresh: a standby had more than one thread when activated (a module it imported started one), and a fork copies only one",
				zap.Int("local_rank", localRank))
		}
		return
	}
	p, err := proc.Adopt(pid)
	if err != nil {
		e.closeAll() // the copy, not re-parented here, exits by itself
		s.log.Warn("the next standby starts afresh", zap.Int("local_rank", localRank), zap.Error(err))
		return
	}
	if s.warm.forked == nil {
		s.warm.forked = map[int]*standby{}
	}
	s.warm.forked[localRank] = s.newStandby(localRank, p, e, from.env, from.interp)
}

// masterWait bounds how long a warm rank other than 0 waits for rank 0's store to
// listen on MASTER_ADDR:MASTER_PORT: torch's store client retries a refused connection
// only after a fixed second (measured on torch 1.13: benchmarks/README.md), which a
// rank started as fast as a standby's would otherwise lose at every restart.
const masterWait = time.Second

// awaitMaster waits, once per attempt, up to masterWait for MASTER_ADDR:MASTER_PORT in
// env to accept a TCP connection, closed at once (torch's store takes a client that
// closes without a request as gone). Where it waited in vain (a script whose rank 0
// does not listen there, or reaches it later), later attempts do not wait.
func (s *Supervisor) awaitMaster(env []string) {
	if s.warm.masterChecked || s.warm.masterSilent {
		return
	}
	s.warm.masterChecked = true
	var host, port string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "MASTER_ADDR="); ok {
			host = v
		} else if v, ok := strings.CutPrefix(kv, "MASTER_PORT="); ok {
			port = v
		}
	}
	if host == "" || port == "" {
		return
	}
	addr := net.JoinHostPort(host, port)
	deadline := time.Now().Add(masterWait)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			s.warm.masterSilent = true
			s.log.Info("warm ranks no longer wait for rank 0's store: nothing listened on MASTER_ADDR:MASTER_PORT within "+masterWait.String(),
				zap.String("master", addr))
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
