package launcher

import (
	"fmt"

	"github.com/gangrun/gangrun/internal/quote"
)

// Bounds of --warm-imports: how many modules, and how long one module's dotted name
// may be, in bytes.
const (
	maxWarmImports      = 64
	maxWarmImportLength = 200
)

// checkWarmImports refuses a --warm-imports entry that is not a Python module's dotted
// name (identifiers of letters, digits and '_', not beginning with a digit, joined by
// '.': what importlib.import_module takes without a package), and lists of more than
// 64 entries. Whether the module can be imported is the standby's to find out: with
// --warm-imports given, a standby that cannot import one exits saying so, and the
// attempt starts cold (standby.py, strict mode).
func checkWarmImports(mods []string) error {
	if len(mods) > maxWarmImports {
		return fmt.Errorf("--warm-imports: %d modules: want at most %d", len(mods), maxWarmImports)
	}
	for _, m := range mods {
		if !isModuleName(m) {
			return fmt.Errorf("--warm-imports %s: not a Python module name (dotted identifiers, as torch or torch.distributed)", quote.Q(m))
		}
		if len(m) > maxWarmImportLength {
			return fmt.Errorf("--warm-imports %s: longer than %d bytes", quote.Q(m), maxWarmImportLength)
		}
	}
	return nil
}

// isModuleName reports whether m is a dotted name of ASCII Python identifiers.
func isModuleName(m string) bool {
	if m == "" {
		return false
	}
	start := true
	for i := 0; i < len(m); i++ {
		c := m[i]
		switch {
		case c == '.':
			if start {
				return false
			}
			start = true
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			start = false
		case c >= '0' && c <= '9':
			if start {
				return false
			}
		default:
			return false
		}
	}
	return !start
}
