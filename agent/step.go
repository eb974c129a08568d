package agent

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// spawner returns the launcher's way to start a job's step on this node: the command
// Config.StepArgv gives, in a session of its own (it outlives the agent, as slurmstepd
// outlives slurmd), its own messages before the job's output opens in
// dir/job-ID-step.log (dir is the agent's, one per agent process). a.steps counts the
// steps started that have not ended while this agent lives: each is reaped by a
// goroutine of its own, which Run does not wait for (the step outlives it).
func (a *Agent) spawner(dir string) func(id string) error {
	return func(id string) error {
		if a.cfg.StepArgv == nil {
			return errors.New("no gangrun binary to start the step with")
		}
		argv, err := a.cfg.StepArgv(id)
		if err != nil {
			return err
		}
		logFile, err := os.OpenFile(filepath.Join(dir, "job-"+id+"-step.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer logFile.Close()
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = logFile, logFile
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			return err
		}
		a.steps.Add(1)
		go func() { // reap it, while this agent lives
			_ = cmd.Wait()
			a.steps.Add(-1)
		}()
		return nil
	}
}
