package docs

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// pages are the Markdown files whose links are checked, relative to the repository
// root: the README, the benchmarks' README and every page of docs/.
func pages(t *testing.T, root string) []string {
	t.Helper()
	out := []string{"README.md", filepath.Join("benchmarks", "README.md")}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range more {
		rel, err := filepath.Rel(root, m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rel)
	}
	return out
}

// TestMarkdownLinks: every relative link of the README, benchmarks/README.md and
// docs/*.md names a file or directory of the repository, and a #fragment names an
// anchor the target page has (a heading's GitHub slug, or an explicit <a id>/<a name>).
// Links to other sites (http:, https:, mailto:) are not followed.
func TestMarkdownLinks(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{} // absolute path of a .md → its anchors
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		md, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		a := Anchors(string(md))
		anchors[path] = a
		return a, nil
	}
	checked := 0
	for _, page := range pages(t, root) {
		path := filepath.Join(root, page)
		md, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("%s: %v", page, err)
			continue
		}
		for _, l := range Links(string(md)) {
			checked++
			target, fragment, _ := strings.Cut(l.Target, "#")
			where := fmt.Sprintf("%s:%d: link %q", page, l.Line, l.Target)
			file := path
			if target != "" {
				if filepath.IsAbs(target) {
					t.Errorf("%s: an absolute path does not resolve on GitHub; use a relative one", where)
					continue
				}
				file = filepath.Join(filepath.Dir(path), filepath.FromSlash(target))
				if rel, err := filepath.Rel(root, file); err != nil || strings.HasPrefix(rel, "..") {
					t.Errorf("%s: leads outside the repository", where)
					continue
				}
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s: no such file or directory", where)
					continue
				}
			}
			if fragment == "" || !strings.HasSuffix(file, ".md") {
				continue // a fragment of a non-Markdown file (#L10) is GitHub's line anchor
			}
			a, err := anchorsOf(file)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			if !a[strings.ToLower(fragment)] {
				t.Errorf("%s: %s has no heading or anchor #%s", where, filepath.Base(file), fragment)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no links found: the parser is broken")
	}
}

// TestSlug: headings give GitHub's anchors.
func TestSlug(t *testing.T) {
	md := "# gangrun\n" +
		"## `gangrun run`\n" +
		"## Topology: `gangrun topo`\n" +
		"## Failure → restart, 2 nodes\n" +
		"### Run\n" +
		"### Run\n" +
		"## [Linked](x.md) *emphasis* and __bold__ text\n" +
		"## A_b-c (d) 'e' \"f\"?\n" +
		"## `FOO_BAR_BAZ` and `a*b`\n" +
		"```\n# not a heading\n```\n" +
		"Setext heading\n" +
		"==============\n" +
		"<a id=\"explicit\"></a>\n"
	got := Anchors(md)
	for _, want := range []string{"gangrun", "gangrun-run", "topology-gangrun-topo", "failure--restart-2-nodes", "run", "run-1",
		"linked-emphasis-and-bold-text", "a_b-c-d-e-f", "foo_bar_baz-and-ab", "setext-heading", "explicit"} {
		if !got[want] {
			t.Errorf("no anchor %q in %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Errorf("a line inside a code block taken as a heading")
	}
}

// TestLinks: links are found in prose, also when their text wraps, and not in code.
func TestLinks(t *testing.T) {
	md := "See [a](a.md#x) and [the\nwrapped one](b.md) and [site](https://example.com).\n" +
		"`[not](c.md)` here\n" +
		"\n" +
		"```\n[nor](d.md)\n```\n" +
		"[`code` text](e.md \"title\") ![img](f.png)\n"
	var got []string
	for _, l := range Links(md) {
		got = append(got, fmt.Sprintf("%d:%s", l.Line, l.Target))
	}
	if want := "1:a.md#x 1:b.md 8:e.md 8:f.png"; strings.Join(got, " ") != want {
		t.Errorf("links %v, want %s", got, want)
	}
}

// Link is one inline link of a Markdown page.
type Link struct {
	Line   int
	Target string
}

var (
	inlineLink = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+"[^"]*")?\s*\)`)
	codeSpan   = regexp.MustCompile("(`+)[^`]+?(`+)")
	atxHeading = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)(\s+#+)?\s*$`)
	setextRule = regexp.MustCompile(`^ {0,3}(=+|-+)\s*$`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:[^>]*\s)?(?:id|name)="([^"]+)"`)
	linkText   = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	underscore = regexp.MustCompile(`(^|[^\pL\pN_])(_{1,2})([^_\s](?:[^_]*[^_\s])?)(_{1,2})([^\pL\pN_]|$)`)
)

// Links returns the inline links of md outside code blocks and code spans, with their
// line numbers; links to other sites (a scheme such as https:) are left out. A link's
// text may wrap over lines of its paragraph.
func Links(md string) []Link {
	var out []Link
	lines := prose(md)
	for i := 0; i < len(lines); {
		if strings.TrimSpace(lines[i]) == "" {
			i++
			continue
		}
		j := i
		for j < len(lines) && strings.TrimSpace(lines[j]) != "" {
			j++
		}
		para := strings.Join(lines[i:j], "\n")
		// Blank code spans out, keeping the newlines that number the lines.
		para = codeSpan.ReplaceAllStringFunc(para, func(span string) string {
			return strings.Map(func(r rune) rune {
				if r == '\n' {
					return r
				}
				return ' '
			}, span)
		})
		for _, m := range inlineLink.FindAllStringSubmatchIndex(para, -1) {
			target := strings.Trim(para[m[2]:m[3]], "<>")
			if hasScheme(target) {
				continue
			}
			out = append(out, Link{Line: i + 1 + strings.Count(para[:m[0]], "\n"), Target: target})
		}
		i = j
	}
	return out
}

// hasScheme reports whether target is an absolute URL (https:, mailto:, ...).
func hasScheme(target string) bool {
	i := strings.IndexAny(target, ":/#")
	return i > 0 && target[i] == ':'
}

// Anchors returns the anchors GitHub gives md: each heading's slug (Slug), a repeated
// slug numbered -1, -2, ..., and the ids and names of explicit <a> tags.
func Anchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	add := func(heading string) {
		s := Slug(heading)
		if n := seen[s]; n > 0 {
			seen[s] = n + 1
			s = fmt.Sprintf("%s-%d", s, n)
		} else {
			seen[s] = 1
		}
		out[s] = true
	}
	prev := ""
	for _, line := range prose(md) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out[strings.ToLower(m[1])] = true
		}
		p := strings.TrimSpace(prev)
		if m := atxHeading.FindStringSubmatch(line); m != nil {
			add(m[2])
			line = "" // a heading does not start a setext heading below it
		} else if setextRule.MatchString(line) && p != "" && !strings.HasPrefix(p, "|") && !strings.HasPrefix(p, "- ") && !strings.HasPrefix(p, "<") {
			add(p)
		}
		prev = line
	}
	return out
}

// Slug is GitHub's anchor for a heading's text: inline markup dropped (code spans keep
// their text, links their text, emphasis markers go), lowercased, every character that
// is not a letter, a digit, a space, '-' or '_' removed, and each space made '-'.
func Slug(heading string) string {
	// Outside code spans: links keep their text, _emphasis_ loses its underscores (a
	// '*' is punctuation, removed below).
	var h strings.Builder
	rest := heading
	for {
		loc := codeSpan.FindStringIndex(rest)
		if loc == nil {
			h.WriteString(plain(rest))
			break
		}
		h.WriteString(plain(rest[:loc[0]]))
		h.WriteString(strings.Trim(rest[loc[0]:loc[1]], "`"))
		rest = rest[loc[1]:]
	}
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h.String())) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// plain is heading text outside code spans without its inline markup.
func plain(s string) string {
	s = linkText.ReplaceAllString(s, "$1")
	return underscore.ReplaceAllString(s, "$1$3$5")
}

// prose returns md's lines, each line of a fenced code block (fences included) made
// empty, so that line numbers stay those of the file.
func prose(md string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(md))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	fence := ""
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case fence != "":
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]+" ") == "" {
				fence = ""
			}
			line = ""
		case strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~"):
			n := len(trimmed) - len(strings.TrimLeft(trimmed, trimmed[:1]))
			fence = trimmed[:n]
			line = ""
		}
		out = append(out, line)
	}
	return out
}
