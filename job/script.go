package job

import (
	"bufio"
	"fmt"
	"strings"
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
func ScriptOptions(script string) ([]string, error) {
	var args []string
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
		rest, ok := strings.CutPrefix(line, Directive)
		if !ok || rest != "" && rest[0] != ' ' && rest[0] != '\t' {
			continue // another comment (#GANGRUNX is not ours either)
		}
		words, err := splitWords(rest)
		if err != nil {
			return nil, fmt.Errorf("script line %d %q: %w", n, line, err)
		}
		args = append(args, words...)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("script: %w", err)
	}
	return args, nil
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
