package launcher

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

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

// DefaultWarmImports is what a standby imports when --warm-imports is not given.
var DefaultWarmImports = []string{"torch"}

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
	ctrl   *os.File    // gangrun → standby: the activation request
	acks   chan string // standby → gangrun: "ready", "go"
	env    []string    // its environment: the worker's less the late variables
	interp []string
}

// startStandby starts the standby of spec's local rank, a process like a worker.
func (s *Supervisor) startStandby(spec workerSpec, pc pythonCommand) (*standby, error) {
	imports := strings.Join(s.cfg.WarmImports, ",")
	mode := "strict"
	if s.cfg.WarmImports == nil {
		imports, mode = strings.Join(DefaultWarmImports, ","), "optional"
	}
	argv := append(slices.Clone(pc.interp), filepath.Join(s.warmDir, "standby.py"), imports, mode)
	env := standbyEnv(spec.env)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	if !s.cfg.User.IsSelf() {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cfg.User.Credential()} // kept by proc.Start
	}
	ctrlR, ctrlW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		ctrlR.Close()
		ctrlW.Close()
		return nil, err
	}
	cmd.ExtraFiles = []*os.File{ctrlR, ackW} // fds 3 and 4
	w := &worker{spec: workerSpec{localRank: spec.localRank, rank: -1}}
	var childEnds []*os.File
	for range 2 {
		r, wr, err := os.Pipe()
		if err != nil {
			break
		}
		w.readers = append(w.readers, r)
		childEnds = append(childEnds, wr)
	}
	closeAll := func() {
		for _, f := range append(append(childEnds, w.readers...), ctrlR, ctrlW, ackR, ackW) {
			f.Close()
		}
	}
	if len(childEnds) < 2 {
		closeAll()
		return nil, errors.New("output pipes")
	}
	cmd.Stdout, cmd.Stderr = childEnds[0], childEnds[1]
	p, _, err := proc.StartPlaced(cmd, nil, s.placement()) // in the step's cgroup, unbound
	if err != nil {
		closeAll()
		return nil, err
	}
	for _, f := range append(childEnds, ctrlR, ackW) {
		f.Close()
	}
	w.p = p
	_ = s.guard.Watch(p.Pid())
	prefix := "[standby" + strconv.Itoa(spec.localRank) + "]: "
	sinks := []*lineWriter{s.console, s.consoleErr}
	for i, r := range w.readers {
		w.targets[i] = &pumpTarget{prefix: prefix}
		w.pumps.Add(1)
		go func(i int, r *os.File) {
			defer w.pumps.Done()
			pumpTo(r, sinks[i], w.targets[i])
		}(i, r)
	}
	sb := &standby{w: w, ctrl: ctrlW, acks: make(chan string, 2), env: env, interp: slices.Clone(pc.interp)}
	go func() {
		defer close(sb.acks)
		defer ackR.Close()
		sc := bufio.NewScanner(ackR)
		for sc.Scan() {
			sb.acks <- sc.Text()
		}
	}()
	return sb, nil
}

// awaitAck waits for line from the standby, up to d; an error when it exits first.
func (sb *standby) awaitAck(line string, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case got, ok := <-sb.acks:
		if !ok {
			return errors.New("it exited")
		}
		if got != line {
			return fmt.Errorf("it said %q, not %q", got, line)
		}
		return nil
	case <-t.C:
		return fmt.Errorf("no %q within %s", line, d)
	}
}

// activate hands spec to the standby and returns it as spec's worker, its output going
// to spec's prefix and files.
func (sb *standby) activate(spec workerSpec, pc pythonCommand, cwd string, files []*os.File, act *activity) (*worker, error) {
	if err := sb.awaitAck("ready", standbyReadyWait); err != nil {
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
	data, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	w := sb.w
	w.spec, w.files = spec, files
	for i, t := range w.targets {
		var file io.Writer
		if i < len(files) {
			file = files[i]
		}
		t.set(spec.prefix, file, act)
	}
	go func(ctrl *os.File) {
		_, _ = ctrl.Write(append(data, '\n')) // a standby that died is seen by awaitAck
		ctrl.Close()
	}(sb.ctrl)
	sb.ctrl = nil
	if err := sb.awaitAck("go", standbyAckWait); err != nil {
		w.files = nil // the caller closes them
		return nil, err
	}
	return w, nil
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

// setupWarm sets up warm restarts when the config asks for them and the command is a
// Python interpreter running a script or module: it writes the standby program to a
// scratch directory (s.warmDir, "" when warm restarts are off). The returned cleanup
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
	s.warmDir = dir
	return func() {
		s.dropStandbys()
		os.RemoveAll(dir)
	}
}

// prepareStandbys starts a standby for each local rank of specs, for the next attempt,
// after dropping any left from before.
func (s *Supervisor) prepareStandbys(specs []workerSpec) {
	s.dropStandbys()
	if s.warmDir == "" {
		return
	}
	s.standbys = map[int]*standby{}
	for _, spec := range specs {
		pc, ok := parsePython(spec.argv)
		if !ok {
			continue
		}
		sb, err := s.startStandby(spec, pc)
		if err != nil {
			s.log.Warn("no standby for the next attempt", zap.Int("local_rank", spec.localRank), zap.Error(err))
			continue
		}
		s.standbys[spec.localRank] = sb
	}
}

// dropStandbys kills every standby not used.
func (s *Supervisor) dropStandbys() {
	for lr, sb := range s.standbys {
		sb.drop(s)
		delete(s.standbys, lr)
	}
}

// standbyPids adds the standbys' pids (their process groups) to keep.
func (s *Supervisor) standbyPids(keep map[int]bool) map[int]bool {
	for _, sb := range s.standbys {
		keep[sb.w.p.Pid()] = true
	}
	return keep
}

// takeStandby returns spec's worker started from its standby, or nil (having logged
// why) when it must start cold. files are spec's log files, already created.
func (s *Supervisor) takeStandby(spec workerSpec, files []*os.File) *worker {
	if s.warmDir == "" || spec.localRank < 0 {
		return nil
	}
	sb := s.standbys[spec.localRank]
	delete(s.standbys, spec.localRank)
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
	w, err := sb.activate(spec, pc, cwd, files, &s.act)
	if err != nil {
		return cold("its standby did not take the attempt: " + err.Error())
	}
	return w
}
