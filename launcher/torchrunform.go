package launcher

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The torchrun form of `gangrun run`: torchrun's command line with `gangrun run` in
// place of `torchrun` (options, then a training script and its arguments, no --). The
// script runs as torchrun runs it (torch/distributed/run.py, config_from_args): the
// interpreter, -u, then the script; -m runs a module; --no-python runs the script
// itself; --run-path runs it with runpy.run_path.

// PythonExecEnv overrides the interpreter torchrun runs scripts with (run.py:
// os.getenv("PYTHON_EXEC", sys.executable)); gangrun reads it the same way.
const PythonExecEnv = "PYTHON_EXEC"

// runPathCode is what torchrun's --run-path does in the worker (run.py,
// run_script_path): sys.argv becomes the script and its arguments, and the script runs
// as __main__ through runpy.run_path in the interpreter that imported nothing else.
const runPathCode = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"

// ScriptOptions is the launch part of torchrun's command line.
type ScriptOptions struct {
	// Script is the training script (a module name with Module); Args its arguments.
	Script string
	Args   []string
	// Module is -m; NoPython --no-python; RunPath --run-path (which wins over
	// NoPython, as in torchrun).
	Module, NoPython, RunPath bool
	// Python is the interpreter (FindPython); unused with NoPython.
	Python string
}

// ScriptCommand returns the worker command torchrun would run for o:
//
//	PYTHON -u SCRIPT ARGS...                   (the default)
//	PYTHON -u -m MODULE ARGS...                (-m)
//	SCRIPT ARGS...                             (--no-python)
//	PYTHON -u -c <runpy.run_path> SCRIPT ARGS...  (--run-path)
//
// Errors are torchrun's: -m with --no-python, and --run-path with a path that is not
// absolute ("Script must be provided as an abs path").
func ScriptCommand(o ScriptOptions) ([]string, error) {
	switch {
	case o.RunPath:
		if !filepath.IsAbs(o.Script) {
			return nil, fmt.Errorf("--run-path %s: torchrun runs the script by its absolute path; give /abs/path/%s", o.Script, filepath.Base(o.Script))
		}
		return append([]string{o.Python, "-u", "-c", runPathCode, o.Script}, o.Args...), nil
	case o.NoPython && o.Module:
		return nil, errors.New("don't use both the --no-python flag and the --module flag at the same time (as torchrun refuses them)")
	case o.NoPython:
		return append([]string{o.Script}, o.Args...), nil
	case o.Module:
		return append([]string{o.Python, "-u", "-m", o.Script}, o.Args...), nil
	}
	return append([]string{o.Python, "-u", o.Script}, o.Args...), nil
}

// IsScript reports whether the first word of a command given without -- names a
// training script that torchrun would run with Python rather than a program: a path
// ending in .py, or an existing regular file without execute permission. Anything
// else (python3, ./a.out, a name on PATH) is a command, run as given.
func IsScript(name string) bool {
	if strings.HasSuffix(name, ".py") {
		return true
	}
	fi, err := os.Stat(name)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 == 0
}

// FindPython returns the interpreter a torchrun user's script would run with:
// $PYTHON_EXEC when set (as torchrun reads it); else torchrun's own sys.executable,
// the interpreter on the #! line of the torchrun found on PATH; else python, then
// python3, on PATH. The error says what was looked for.
func FindPython(getenv func(string) string) (string, error) {
	if p := getenv(PythonExecEnv); p != "" {
		return p, nil
	}
	if tr, err := exec.LookPath("torchrun"); err == nil {
		if py := shebangPython(tr); py != "" {
			return py, nil
		}
	}
	for _, name := range []string{"python", "python3"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no Python to run the script with: no torchrun, python or python3 on PATH, and %s is not set; give --python PATH", PythonExecEnv)
}

// shebangPython returns the interpreter named on path's #! line when it is a Python
// (a console script's, "#!/venv/bin/python3"), else "".
func shebangPython(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "#!") {
		return ""
	}
	fields := strings.Fields(strings.TrimPrefix(line, "#!"))
	if len(fields) == 0 {
		return ""
	}
	interp := fields[0]
	if filepath.Base(interp) == "env" && len(fields) > 1 {
		p, err := exec.LookPath(fields[1])
		if err != nil {
			return ""
		}
		interp = p
	}
	if !pythonName.MatchString(filepath.Base(interp)) {
		return ""
	}
	if _, err := os.Stat(interp); err != nil {
		return ""
	}
	return interp
}
