package main

import (
	"bytes"
	"context"
	"strings"
	"syscall"
	"testing"
)

// hostlistResult is what one in-process `gangrun hostlist ...` run produced.
type hostlistResult struct {
	code           int
	stdout, stderr string
}

// runHostlistCLI runs `gangrun ARGS...` through dispatch with the given
// environment, or hostlistMain directly when stdin is given (env has no stdin).
func runHostlistCLI(t *testing.T, vars map[string]string, stdin *string, args ...string) hostlistResult {
	t.Helper()
	var out, errOut bytes.Buffer
	e := &env{stdout: &out, stderr: &errOut, getenv: func(k string) string { return vars[k] }}
	var code int
	if stdin != nil {
		code = hostlistMain(context.Background(), e, strings.NewReader(*stdin), args[1:])
	} else {
		code = dispatch(context.Background(), e, args)
	}
	return hostlistResult{code, out.String(), errOut.String()}
}

func TestHostlistCommand(t *testing.T) {
	str := func(s string) *string { return &s }
	cases := []struct {
		name   string
		vars   map[string]string
		stdin  *string
		args   []string
		code   int
		stdout string
		stderr string // a substring of stderr; "" means stderr must be empty
	}{
		{name: "expand", args: []string{"hostlist", "expand", "node[001-003,010]"}, stdout: "node001\nnode002\nnode003\nnode010\n"},
		{name: "expand several expressions", args: []string{"hostlist", "expand", "rack[1-2]-node[01-02]", "gpu[1-2]-ib", "a,b[1-2]"},
			stdout: "rack1-node01\nrack1-node02\nrack2-node01\nrack2-node02\ngpu1-ib\ngpu2-ib\na\nb1\nb2\n"},
		{name: "expand brackets with commas", args: []string{"hostlist", "expand", "linux[1,2]"}, stdout: "linux1\nlinux2\n"},
		{name: "expand from SLURM_JOB_NODELIST", vars: map[string]string{"SLURM_JOB_NODELIST": "a1g[0010,0011],b0005,c0007", "SLURM_NODELIST": "x"},
			args: []string{"hostlist", "expand"}, stdout: "a1g0010\na1g0011\nb0005\nc0007\n"},
		{name: "expand from SLURM_NODELIST", vars: map[string]string{"SLURM_NODELIST": "x[1-2]"}, args: []string{"hostlist", "expand"}, stdout: "x1\nx2\n"},
		{name: "expand empty expression", args: []string{"hostlist", "expand", ""}, code: 2,
			stderr: "gangrun hostlist expand: argument 1 \"\" is empty: want a hostlist expression such as node[01-04]\n"},
		{name: "expand separators only", args: []string{"hostlist", "expand", "n1", " , "}, code: 2, stderr: `argument 2 " , " is empty`},
		{name: "count empty expression", args: []string{"hostlist", "count", ""}, code: 2, stderr: `argument 1 "" is empty`},
		{name: "compress empty host", args: []string{"hostlist", "compress", "a1", ""}, code: 2, stderr: `argument 2 "" is empty`},
		{name: "expand newline inside a name", args: []string{"hostlist", "expand", "n1\x1b[2Jx"}, code: 2,
			stderr: "gangrun hostlist expand: hostlist: control character U+001B \"\\x1b\" at column 3 of \"n1\\x1b[2Jx\"\n"},
		{name: "expand right-to-left override", args: []string{"hostlist", "expand", "node\u202e01"}, code: 2,
			stderr: "gangrun hostlist expand: hostlist: invisible format character U+202E \"\\u202e\" at column 5 of \"node\\u202e01\"\n"},
		{name: "compress a zero-width space", args: []string{"hostlist", "compress", "n\u200b1"}, code: 2, stderr: `invisible format character U+200B`},
		{name: "count invalid UTF-8", args: []string{"hostlist", "count", "n\xff"}, code: 2, stderr: `invalid UTF-8 "\xff" at column 2`},
		{name: "expand SLURM_JOB_NODELIST with an escape", vars: map[string]string{"SLURM_JOB_NODELIST": "a[1-2]\x1b]0;x\x07"},
			args: []string{"hostlist", "expand"}, code: 2, stderr: `control character U+001B "\x1b" at column 7`},
		{name: "expand nothing", args: []string{"hostlist", "expand"}, code: 2, stderr: "gangrun hostlist expand: no EXPR given and SLURM_JOB_NODELIST is not set\n"},
		{name: "expand unbalanced", args: []string{"hostlist", "expand", "ok1", "n[1-2"}, code: 2,
			stderr: "gangrun hostlist expand: hostlist: unbalanced bracket: no matching ']' \"[\" at column 2 of \"n[1-2\"\n"},
		{name: "expand reversed", args: []string{"hostlist", "expand", "n[10-1]"}, code: 2, stderr: `reversed range (10 is greater than 1) "10-1" at column 3`},
		{name: "expand step", args: []string{"hostlist", "expand", "a[1-10:2]"}, code: 2, stderr: `unsupported step range`},
		{name: "expand absurd", args: []string{"hostlist", "expand", "n[0-99999999999]"}, code: 2,
			stderr: "gangrun hostlist expand: hostlist too large: \"n[0-99999999999]\" expands to 100000000000 hosts, more than the maximum of 1048576\n"},
		{name: "expand bad flag", args: []string{"hostlist", "expand", "--bogus", "n1"}, code: 2, stderr: "unknown flag: --bogus"},
		{name: "compress args", args: []string{"hostlist", "compress", "h003", "h002", "h001"}, stdout: "h[003,002,001]\n"},
		{name: "compress sorted", args: []string{"hostlist", "compress", "--sorted", "h003", "h002", "h001"}, stdout: "h[001-003]\n"},
		{name: "compress expressions and lists", args: []string{"hostlist", "compress", "n[1-3],n4", "n5 n6"}, stdout: "n[1-6]\n"},
		{name: "compress several prefixes", args: []string{"hostlist", "compress", "a1", "a2", "b1", "a3"}, stdout: "a[1-2],b1,a3\n"},
		{name: "compress stdin", stdin: str("n1\nn2\n\n  n3  \nn[5-6]\r\n"), args: []string{"hostlist", "compress"}, stdout: "n[1-3,5-6]\n"},
		{name: "compress empty stdin", stdin: str(""), args: []string{"hostlist", "compress"}, stdout: "\n"},
		{name: "compress bad stdin line", stdin: str("n1\nn2]\n"), args: []string{"hostlist", "compress"}, code: 2,
			stderr: "gangrun hostlist compress: stdin line 2: hostlist: unbalanced bracket: no matching '[' \"]\" at column 3 of \"n2]\"\n"},
		{name: "compress too long stdin line", stdin: str(strings.Repeat("n", 2<<20)), args: []string{"hostlist", "compress"}, code: 2, stderr: "longer than 1048576 bytes"},
		{name: "compress bad argument", args: []string{"hostlist", "compress", "n1", "n[2"}, code: 2, stderr: "gangrun hostlist compress: argument 2: hostlist: unbalanced bracket"},
		{name: "count", args: []string{"hostlist", "count", "n[0-99999999999]", "a,b"}, stdout: "100000000002\n"},
		{name: "count from environment", vars: map[string]string{"SLURM_JOB_NODELIST": "n[1-4]"}, args: []string{"hostlist", "count"}, stdout: "4\n"},
		{name: "count overflow", args: []string{"hostlist", "count", "n[1-9223372036854775807]", "x"}, code: 2, stderr: "more hosts than an int holds"},
		{name: "count bad", args: []string{"hostlist", "count", "n[]"}, code: 2, stderr: "empty range"},
		{name: "no subcommand", args: []string{"hostlist"}, code: 2, stderr: "gangrun hostlist: missing subcommand: expand, compress or count\n"},
		{name: "unknown subcommand", args: []string{"hostlist", "shrink"}, code: 2, stderr: `unknown subcommand "shrink"`},
		{name: "help", args: []string{"hostlist", "--help"}, stdout: hostlistUsage},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := runHostlistCLI(t, tc.vars, tc.stdin, tc.args...)
			if r.code != tc.code || r.stdout != tc.stdout {
				t.Errorf("gangrun %q = exit %d, stdout %q; want exit %d, stdout %q (stderr %q)",
					tc.args, r.code, r.stdout, tc.code, tc.stdout, r.stderr)
			}
			switch {
			case tc.stderr == "" && r.stderr != "":
				t.Errorf("stderr = %q, want nothing", r.stderr)
			case !strings.Contains(r.stderr, tc.stderr):
				t.Errorf("stderr = %q, want it to contain %q", r.stderr, tc.stderr)
			case r.stderr != "" && strings.Count(r.stderr, "\n") != 1:
				t.Errorf("stderr = %q, want one line", r.stderr)
			}
		})
	}
}

// TestHostlistRoundTrip checks `compress` of `expand`'s output gives the same hosts.
func TestHostlistRoundTrip(t *testing.T) {
	for _, expr := range []string{"node[001-003,010]", "rack[1-2]-node[01-02]", "gpu[1-2]-ib", "a,b[1-2]", "linux[1,2]", "a1g[0010,0011],b0005,c0007"} {
		expanded := runHostlistCLI(t, nil, nil, "hostlist", "expand", expr)
		compressed := runHostlistCLI(t, nil, &expanded.stdout, "hostlist", "compress")
		again := runHostlistCLI(t, nil, nil, "hostlist", "expand", strings.TrimSuffix(compressed.stdout, "\n"))
		if expanded.code != 0 || compressed.code != 0 || again.code != 0 || again.stdout != expanded.stdout {
			t.Errorf("%q: expand gave %q, compress %q, expand again %q (%s%s%s)", expr,
				expanded.stdout, compressed.stdout, again.stdout, expanded.stderr, compressed.stderr, again.stderr)
		}
	}
}

// failingWriter fails every write with err.
type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

func TestHostlistWriteErrors(t *testing.T) {
	cases := []struct {
		name   string
		err    error
		stderr string
	}{
		{"reader gone", syscall.EPIPE, ""},
		{"disk full", syscall.ENOSPC, "gangrun hostlist expand: writing output: no space left on device\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var errOut bytes.Buffer
			e := &env{stdout: failingWriter{tc.err}, stderr: &errOut, getenv: func(string) string { return "" }}
			code := dispatch(context.Background(), e, []string{"hostlist", "expand", "n[1-3]"})
			if code != exitFailure || errOut.String() != tc.stderr {
				t.Errorf("exit %d, stderr %q; want exit %d, stderr %q", code, errOut.String(), exitFailure, tc.stderr)
			}
		})
	}
}

func TestHostlistSubcommandHelp(t *testing.T) {
	for _, sub := range []string{"expand", "compress", "count"} {
		r := runHostlistCLI(t, nil, nil, "hostlist", sub, "--help")
		if r.code != 0 || !strings.HasPrefix(r.stdout, "usage: gangrun hostlist "+sub+" ") || r.stderr != "" {
			t.Errorf("hostlist %s --help = exit %d, stdout %q, stderr %q", sub, r.code, r.stdout, r.stderr)
		}
	}
}
