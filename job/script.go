package job

import (
	"bufio"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/gangrun/gangrun/internal/quote"
)

// Directive is the prefix of a script's option lines, as #SBATCH is sbatch's.
const Directive = "#GANGRUN"

// MaxScriptBytes bounds a submitted script (1 MiB): a batch script, not a dataset.
const MaxScriptBytes = 1 << 20

// ScriptOptions returns the options a script gives on its Directive lines: like sbatch's,
// they are read from the top of the script until the first line that is neither
// blank nor a comment ("#SBATCH directives must appear before any executable
// command"), each line split into words as a shell would (single and double quotes,
// backslash escapes). A directive line that does not parse is an error naming its line.
//
// Before that, the script as a whole is checked (CheckScript), and two directive lines
// giving one --env variable are refused (the command line may override one, as
// sbatch's does). #SBATCH lines are not read: a script with some and no Directive line
// is refused (its options would be lost), one with both is a script for both
// schedulers and its #SBATCH lines are left to Slurm.
func ScriptOptions(script string) ([]string, error) {
	if err := CheckScript(script); err != nil {
		return nil, err
	}
	var args []string
	envLine := map[string]int{}
	ours, sbatch := false, 0 // a Directive line seen; the first #SBATCH line's number
	sc := bufio.NewScanner(strings.NewReader(script))
	sc.Buffer(make([]byte, 64<<10), MaxScriptBytes)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if n == 1 && strings.HasPrefix(line, "#!") {
			continue
		}
		if line == "" {
			continue
		}
		if !strings.HasPrefix(line, "#") {
			break // the first command: no directive after it counts
		}
		if r, ok := strings.CutPrefix(line, "#SBATCH"); ok && (r == "" || r[0] == ' ' || r[0] == '\t') && sbatch == 0 {
			sbatch = n
		}
		rest, ok := strings.CutPrefix(line, Directive)
		if ok && strings.HasPrefix(rest, "-") {
			return nil, fmt.Errorf("script line %d %s: a %s line needs a space before its options", n, quote.Q(line), Directive)
		}
		if !ok || rest != "" && rest[0] != ' ' && rest[0] != '\t' {
			continue // another comment (#GANGRUNX is not ours either)
		}
		ours = true
		words, err := splitWords(rest)
		if err != nil {
			return nil, fmt.Errorf("script line %d %s: %w", n, quote.Q(line), err)
		}
		for i, w := range words {
			var kv string
			switch {
			case w == "--env" && i+1 < len(words):
				kv = words[i+1]
			case strings.HasPrefix(w, "--env="):
				kv = strings.TrimPrefix(w, "--env=")
			default:
				continue
			}
			name, _, _ := strings.Cut(kv, "=")
			if first, dup := envLine[name]; dup {
				return nil, fmt.Errorf("script line %d: --env %s given twice (lines %d and %d): give each variable once", n, quote.Q(name), first, n)
			}
			envLine[name] = n
		}
		args = append(args, words...)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("script: %w", err)
	}
	if sbatch > 0 && !ours {
		// A Slurm script's options, which gangrun does not read: running it without them
		// would run it on other resources than it asks for. A script for both keeps its
		// #SBATCH lines for Slurm beside #GANGRUN lines for gangrun.
		return nil, fmt.Errorf("script line %d: gangrun submit does not read #SBATCH lines: give the options on %s lines (a script for both Slurm and gangrun keeps both kinds)", sbatch, Directive)
	}
	return args, nil
}

// CheckScript refuses a script gangrun could not keep or run as it is: DOS line breaks
// ("\r\n": sbatch refuses them too, as the shell would read "\r" into every command), a
// NUL byte (no shell reads past one; not a text script), and bytes that are not UTF-8
// (the job record keeps the script as JSON text, which would change them). The error
// names the first line at fault.
func CheckScript(script string) error {
	line := func(i int) int { return strings.Count(script[:i], "\n") + 1 }
	if i := strings.Index(script, "\r\n"); i >= 0 {
		return fmt.Errorf("script line %d: DOS line breaks (\\r\\n): save it with Unix line breaks (\\n), as sbatch requires (dos2unix converts it)", line(i))
	}
	if i := strings.IndexByte(script, 0); i >= 0 {
		return fmt.Errorf("script line %d: a NUL byte: not a text script", line(i))
	}
	if !utf8.ValidString(script) {
		for i, r := range script {
			if r == utf8.RuneError {
				if _, size := utf8.DecodeRuneInString(script[i:]); size == 1 {
					return fmt.Errorf("script line %d: bytes that are not UTF-8 text (gangrun keeps the script as text)", line(i))
				}
			}
		}
	}
	return nil
}

// HasCommand reports whether script runs anything: a line that is neither blank nor a
// comment.
func HasCommand(script string) bool {
	for _, line := range strings.Split(script, "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			return true
		}
	}
	return false
}

// Interpreter returns the command a script's #! line names ("/bin/bash", or "/usr/bin/env
// python3" as two words); /bin/sh when it has none.
func Interpreter(script string) []string {
	first, _, _ := strings.Cut(script, "\n")
	if rest, ok := strings.CutPrefix(first, "#!"); ok {
		if f := strings.Fields(rest); len(f) > 0 {
			return f
		}
	}
	return []string{"/bin/sh"}
}

// splitWords splits s into words as a POSIX shell would, without expanding anything:
// whitespace separates, single quotes keep everything, double quotes keep all but \" and
// \\, a backslash outside quotes escapes the next character.
func splitWords(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated single quote")
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\\') {
					i++
				}
				cur.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, fmt.Errorf("unterminated double quote")
			}
			inWord = true
		case c == '\\':
			if i+1 < len(s) {
				i++
				cur.WriteByte(s[i])
			}
			inWord = true
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}
