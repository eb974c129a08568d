package job

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/store"
)

// TestParseTimeAsSbatchReadsIt: Slurm's time_str2secs grammar exactly (its
// _is_valid_timespec, fields added up without clock ranges), "-1" as no limit, and
// gangrun's own bounds; TimeNote says how a value whose fields run past their clock
// range was read.
func TestParseTimeAsSbatchReadsIt(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  string // a fragment of the error; "" for none
		note string // TimeNote's reading; "" for none
	}{
		{"99:99:99", 100*time.Hour + 40*time.Minute + 39*time.Second, "", "4-04:40:39"},
		{"1-25", 49 * time.Hour, "", "2-01:00:00"},
		{"1-0:61", 25*time.Hour + time.Minute, "", "1-01:01:00"},
		{"90:90", 91*time.Minute + 30*time.Second, "", "01:31:30"},
		{"120", 2 * time.Hour, "", ""},
		{"25:00:00", 25 * time.Hour, "", ""},
		{"1-", 24 * time.Hour, "", ""},
		{"0", 0, "", ""},
		{"-1", 0, "", ""},
		{"UnLimited", 0, "", ""},
		{"-5", 0, "must not be negative (-1 alone means no limit)", ""},
		{"1:2:3:4", 0, "want minutes", ""},
		{"1-2-3", 0, "want minutes", ""},
		{"1:-2", 0, "want minutes", ""}, // a '-' after a ':'
		{"1:", 0, "want minutes", ""},   // M:S with one number
		{"1::2", 0, "want minutes", ""}, // H:M:S with two
		{"1-2:", 0, "want minutes", ""}, // D-H:M with two
		{":", 0, "want minutes", ""},
		{"1 2", 0, "want minutes", ""},
		{"1e9", 0, "want minutes", ""},
		{"0x10", 0, "want minutes", ""},
		{"100000000", 0, "want at most 365-00:00:00 (a year)", ""},
		{"99999999999999999999", 0, "want at most 365-00:00:00 (a year)", ""},
		{"9999999h", 0, "want at most 365-00:00:00 (a year)", ""},
		{"-1h", 0, "must not be negative", ""},
	} {
		got, err := ParseTime(tc.in)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("ParseTime(%q) = %s, %v; want %s", tc.in, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), `"`+tc.in+`"`)):
			t.Errorf("ParseTime(%q) = %v; want an error naming it and saying %q", tc.in, err, tc.err)
		}
		note := TimeNote(tc.in)
		if (tc.note == "") != (note == "") || !strings.Contains(note, tc.note) {
			t.Errorf("TimeNote(%q) = %q; want one saying %q", tc.in, note, tc.note)
		}
	}
}

// FuzzParseTime: any value parses within the bounds or is refused naming it; a value
// read differently than it looks has a note.
func FuzzParseTime(f *testing.F) {
	for _, s := range []string{"90", "1:02:03", "2-3:04:05", "99:99:99", "-1", "1-", "90m", "::", "1-2:3:4:5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, err := ParseTime(v)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("two-line error %q", err)
			}
			return
		}
		if d < 0 || d > MaxTime {
			t.Errorf("ParseTime(%q) = %s: out of 0..MaxTime", v, d)
		}
	})
}

// TestScriptOptionsRefuse: scripts sbatch refuses or gangrun could not keep as they
// are, and #GANGRUN lines that would be silently misread.
func TestScriptOptionsRefuse(t *testing.T) {
	for _, tc := range []struct{ name, script, want string }{
		{"CRLF", "#!/bin/sh\r\n#GANGRUN --nodes 1\r\necho hi\r\n", `script line 1: DOS line breaks (\r\n)`},
		{"CRLF later", "#!/bin/sh\necho a\r\n", "script line 2: DOS line breaks"},
		{"NUL", "#!/bin/sh\necho \x00\n", "script line 2: a NUL byte: not a text script"},
		{"not UTF-8", "#!/bin/sh\n\necho \xff\n", "script line 3: bytes that are not UTF-8"},
		{"no space", "#!/bin/sh\n#GANGRUN--nodes 1\necho hi\n", `script line 2 "#GANGRUN--nodes 1": a #GANGRUN line needs a space before its options`},
		{"env twice", "#!/bin/sh\n#GANGRUN --env A=1\n#GANGRUN --env=A=2\necho\n", `script line 3: --env "A" given twice (lines 2 and 3)`},
		{"env twice on a line", "#!/bin/sh\n#GANGRUN --env A=1 --env A=2\necho\n", `--env "A" given twice (lines 2 and 2)`},
	} {
		if _, err := ScriptOptions(tc.script); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want %q", tc.name, err, tc.want)
		}
	}
	// What stays fine: #GANGRUNX is another comment; one --env per variable.
	for _, ok := range []string{"#!/bin/sh\n#GANGRUNX --bogus\necho\n", "#!/bin/sh\n#GANGRUN --env A=1 --env B=2\necho é\n"} {
		if _, err := ScriptOptions(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
}

// FuzzScriptOptions: any script gives options or one error line, never a panic.
func FuzzScriptOptions(f *testing.F) {
	for _, s := range []string{"#!/bin/sh\n#GANGRUN --nodes 2\necho\n", "#GANGRUN --name 'a b'\n", "#GANGRUN \"\n", "\r\n", "#GANGRUN--x\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if _, err := ScriptOptions(s); err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("two-line error %q", err)
		}
	})
}

// TestCheckHere: submit refuses, before anything is written, what run refuses of the
// same values, or what could only fail on the nodes.
func TestCheckHere(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	base := Spec{MinNodes: 1, MaxNodes: 1, GPUsPerNode: 1, WorkDir: dir, Command: []string{"true"}, Output: DefaultOutput}
	for _, tc := range []struct {
		name string
		mod  func(*Spec)
		want string
	}{
		{"fine", func(*Spec) {}, ""},
		{"a missing checkpoint dir", func(s *Spec) { s.CheckpointDir = "new/ckpt" }, ""},
		{"/dev/null output", func(s *Spec) { s.Output = "/dev/null" }, ""},
		{"a FIFO checkpoint dir", func(s *Spec) { s.CheckpointDir = fifo }, "--checkpoint-dir " + fifo + ": is a named pipe (FIFO), want a directory"},
		{"a file checkpoint dir", func(s *Spec) { s.CheckpointDir = file }, "is a regular file, want a directory"},
		{"a checkpoint dir under a file", func(s *Spec) { s.CheckpointDir = file + "/x" }, "cannot be created: " + file + " is a regular file, not a directory"},
		{"a checkpoint dir in /proc", func(s *Spec) { s.CheckpointDir = "/proc/1/ckpt" }, "/proc/1 is in the kernel's proc file system"},
		{"an output that is a directory", func(s *Spec) { s.Output = dir }, "is a directory: want a file"},
		{"an output that is a FIFO", func(s *Spec) { s.Output = fifo }, "is a named pipe (FIFO): want a file (or /dev/null)"},
		{"an output that is a socket", func(s *Spec) { s.Output = "sock" }, "is a socket: want a file"},
		{"an output in /proc", func(s *Spec) { s.Output = "/proc/out-%j" }, "kernel's proc file system"},
		{"an output below a file", func(s *Spec) { s.Output = "file/%j.out" }, "is a regular file, not a directory"},
		{"an empty command word", func(s *Spec) { s.Command = []string{""} }, `command "": an empty word is no command`},
		{"a directory as command", func(s *Spec) { s.Command = []string{"/tmp"} }, "command /tmp: is a directory, not a command"},
		{"a file that cannot run", func(s *Spec) { s.Command = []string{"./file"} }, "command ./file: is not executable"},
		{"a long name", func(s *Spec) { s.Name = strings.Repeat("n", 129) }, "--name \"nnnn"},
		{"an account with a slash", func(s *Spec) { s.Account = "a/b" }, `--account "a/b": want a name without '/' or spaces`},
		{"a huge priority", func(s *Spec) { s.Priority = 1 << 40 }, "--priority 1099511627776: want -4294967295 to 4294967295"},
		{"too many nodes", func(s *Spec) { s.MaxNodes = MaxNodes + 1 }, "--nodes 65537: want at most 65536"},
		{"a path too long", func(s *Spec) { s.CheckpointDir = strings.Repeat("a", 300) }, "a name of 300 bytes in the path"},
	} {
		s := base
		tc.mod(&s)
		err := s.CheckHere()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want %q", tc.name, err, tc.want)
		}
	}
}

// TestLogsOfAFIFOOutputDoNotBlock: a job whose output path is a named pipe, a
// directory or a device is refused at once, naming it, with or without --follow.
func TestLogsOfAFIFOOutputDoNotBlock(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "out.fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct{ output, want string }{
		{fifo, "is a named pipe (FIFO), want a regular file"},
		{dir, "is a directory, want a regular file"},
		{"/dev/zero", "is a character device, want a regular file"},
	} {
		id := strconv.Itoa(10 + i)
		putJob(t, s, Job{Spec: Spec{ID: id, User: "alice", WorkDir: dir, Output: tc.output}, State: State{Status: Completed}})
		for _, follow := range []bool{false, true} {
			done := make(chan error, 1)
			go func() { done <- Logs(ctx, s, id, follow, io.Discard) }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tc.output+": "+tc.want) {
					t.Errorf("%s follow %v: %v; want %q", tc.output, follow, err, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s follow %v: Logs blocked", tc.output, follow)
			}
		}
	}
}
