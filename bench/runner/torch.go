package runner

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// torchCheckTimeout bounds checkTorch: importing torch takes a second or two.
const torchCheckTimeout = 2 * time.Minute

// torchUsable refuses, with a *UsageError, a python that cannot import torch. One that
// is not found at all passes: the gang's supervisor reports it (exit 127) when it
// starts the workers.
func torchUsable(ctx context.Context, python string) error {
	if _, err := exec.LookPath(python); err != nil {
		return nil
	}
	if err := checkTorch(ctx, python); err != nil {
		return &UsageError{Err: fmt.Errorf("--python %s: %w; give --python an interpreter that has torch (Debian's: /usr/bin/python3)", python, err)}
	}
	return nil
}

// checkTorch runs `python -c "import torch.distributed"` so that an interpreter without
// torch is refused in one line before any worker starts, rather than as a gang failure
// with a traceback from every rank. The error holds the interpreter's last line of
// output (e.g. "ModuleNotFoundError: No module named 'torch'").
func checkTorch(ctx context.Context, python string) error {
	ctx, cancel := context.WithTimeout(ctx, torchCheckTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, "-c", "import torch.distributed").CombinedOutput()
	if err == nil {
		return nil
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if last := strings.TrimSpace(lines[len(lines)-1]); last != "" {
		return fmt.Errorf("cannot import torch.distributed: %s", last)
	}
	return fmt.Errorf("cannot import torch.distributed: %w", err)
}
