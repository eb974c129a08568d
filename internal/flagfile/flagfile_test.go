package flagfile

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []Setting
		err      string
	}{
		{name: "empty", in: "", want: nil},
		{name: "comments and blanks", in: "# a comment\n\n   # indented\n\t\n", want: nil},
		{name: "spaces around", in: "consul = 10.0.0.1:8500\n", want: []Setting{{"consul", "10.0.0.1:8500", 1}}},
		{name: "no spaces", in: "consul=10.0.0.1:8500", want: []Setting{{"consul", "10.0.0.1:8500", 1}}},
		{name: "value holds =", in: "labels = partition=gpu,rack=r1\n", want: []Setting{{"labels", "partition=gpu,rack=r1", 1}}},
		{name: "hash inside a value", in: "node-name = a#b\n", want: []Setting{{"node-name", "a#b", 1}}},
		{name: "double quotes", in: `log-format = "json"`, want: []Setting{{"log-format", "json", 1}}},
		{name: "single quotes", in: `log-format = 'json'`, want: []Setting{{"log-format", "json", 1}}},
		{name: "unmatched quote kept", in: `log-format = "json`, want: []Setting{{"log-format", `"json`, 1}}},
		{name: "line numbers", in: "# c\n\na = 1\nb = 2\n", want: []Setting{{"a", "1", 3}, {"b", "2", 4}}},
		{name: "no =", in: "consul 10.0.0.1", err: `line 1: "consul 10.0.0.1": want KEY = VALUE`},
		{name: "no key", in: "= x", err: `line 1: "= x": no key before '='`},
		{name: "dashes", in: "--consul = x", err: `line 1: key "--consul": write the flag's name without its dashes (consul)`},
		{name: "empty value", in: "a = 1\nconsul =\n", err: "line 2: consul has no value: leave the line out to keep the default"},
		{name: "empty quotes", in: `consul = ""`, err: "line 1: consul has no value: leave the line out to keep the default"},
		{name: "DOS", in: "a = 1\r\n", err: `line 1: ends in a DOS line break (\r): convert the file with dos2unix`},
		{name: "NUL", in: "a = 1\nb = \x00\n", err: "line 2: holds a NUL byte: not a text file"},
		{name: "not UTF-8", in: "a = \xff\n", err: "line 1: is not valid UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.in))
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("Parse error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Parse = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// flags is a flag set shaped like gangrun agent's: strings, a list, a bool, a
// duration, a float.
type flags struct {
	fs        *pflag.FlagSet
	consul    *string
	node      *string
	labels    *[]string
	noSched   *bool
	wait      *time.Duration
	threshold *float64
	config    *string
}

func newFlags() *flags {
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	return &flags{fs: fs,
		consul:    fs.String("consul", "", ""),
		node:      fs.String("node-name", "", ""),
		labels:    fs.StringArray("labels", nil, ""),
		noSched:   fs.Bool("no-scheduler", false, ""),
		wait:      fs.Duration("waste-after", time.Hour, ""),
		threshold: fs.Float64("waste-threshold", 5, ""),
		config:    fs.String("config", "", ""),
	}
}

func TestApplyCommandLineWins(t *testing.T) {
	f := newFlags()
	if err := f.fs.Parse([]string{"--node-name", "cli", "--labels", "rack=cli"}); err != nil {
		t.Fatal(err)
	}
	settings, err := Parse([]byte(strings.Join([]string{
		"consul = 10.0.0.1:8500",
		"node-name = file",
		"labels = partition=gpu",
		"labels = rack=file",
		"no-scheduler = true",
		"waste-after = 30m",
	}, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	if err := Apply(f.fs, "agent.conf", settings, "config"); err != nil {
		t.Fatal(err)
	}
	if *f.consul != "10.0.0.1:8500" || *f.node != "cli" || !*f.noSched || *f.wait != 30*time.Minute || *f.threshold != 5 {
		t.Errorf("consul %q node %q no-scheduler %v waste-after %v threshold %v", *f.consul, *f.node, *f.noSched, *f.wait, *f.threshold)
	}
	if want := []string{"rack=cli"}; !reflect.DeepEqual(*f.labels, want) {
		t.Errorf("labels %q, want the command line's %q alone", *f.labels, want)
	}
}

func TestApplyListFromTheFile(t *testing.T) {
	f := newFlags()
	if err := f.fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	settings, _ := Parse([]byte("labels = a=1\nlabels = b=2\n"))
	if err := Apply(f.fs, "agent.conf", settings); err != nil {
		t.Fatal(err)
	}
	if want := []string{"a=1", "b=2"}; !reflect.DeepEqual(*f.labels, want) {
		t.Errorf("labels %q, want %q", *f.labels, want)
	}
}

func TestApplyRefuses(t *testing.T) {
	for _, tc := range []struct{ in, err string }{
		{"consull = x", `/etc/gangrun/agent.conf line 1: unknown key "consull" (did you mean consul?)`},
		{"colour = blue", `/etc/gangrun/agent.conf line 1: unknown key "colour" (the keys are the command's flags, without their dashes: see its --help)`},
		{"config = /etc/other.conf", `/etc/gangrun/agent.conf line 1: unknown key "config": it cannot be set in the file (the keys are the command's flags, without their dashes: see its --help)`},
		{"help = true", `/etc/gangrun/agent.conf line 1: unknown key "help" (the keys are the command's flags, without their dashes: see its --help)`},
		{"consul = a\n# c\nconsul = b", `/etc/gangrun/agent.conf line 3: consul given twice (first on line 1): it takes one value`},
		{"no-scheduler = maybe", `/etc/gangrun/agent.conf line 1: no-scheduler "maybe": want true or false`},
		{"waste-threshold = lots", `/etc/gangrun/agent.conf line 1: waste-threshold "lots": want a number`},
		{"waste-after = soon", `/etc/gangrun/agent.conf line 1: waste-after "soon": must be a duration like "30s" or "5m"`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			f := newFlags()
			if err := f.fs.Parse(nil); err != nil {
				t.Fatal(err)
			}
			settings, err := Parse([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			err = Apply(f.fs, "/etc/gangrun/agent.conf", settings, "config")
			if err == nil || err.Error() != tc.err {
				t.Fatalf("Apply error %v\nwant %q", err, tc.err)
			}
			if *f.consul != "" && strings.Contains(tc.in, "given twice") {
				t.Errorf("consul set to %q before the refusal", *f.consul)
			}
		})
	}
}

// TestCheckSetsNothing: a file refused by its last line changed no flag before it.
func TestCheckSetsNothing(t *testing.T) {
	f := newFlags()
	if err := f.fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	settings, _ := Parse([]byte("consul = 10.0.0.1:8500\nbogus = 1\n"))
	err := Apply(f.fs, "f", settings)
	if !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("Apply error %v, want ErrUnknownKey", err)
	}
	if *f.consul != "" || f.fs.Changed("consul") {
		t.Errorf("consul set to %q although the file was refused", *f.consul)
	}
}

func TestRead(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "agent.conf")
	if err := os.WriteFile(good, []byte("consul = x:1\nno-scheduler=\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Read(good)
	if err == nil || err.Error() != good+` line 2: no-scheduler has no value: leave the line out to keep the default` {
		t.Errorf("Read error %v", err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := Read(fifo); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "named pipe") {
			t.Errorf("Read of a FIFO: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Read of a FIFO blocked")
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, []byte(strings.Repeat("# x\n", MaxBytes/4+1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(big); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("Read of a file over MaxBytes: %v", err)
	}
	if _, err := Read(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Read of a missing file: %v", err)
	}
}

// FuzzParse: Parse never panics, and what it returns re-parses to the same settings
// when written back as KEY = VALUE lines.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "consul = 10.0.0.1:8500\n", "# c\nlabels = a=b\nlabels='c=d'\n", "a=\"\"", "x\r\n", "=", "--a=b"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := Parse(data)
		if err != nil {
			var fe *Error
			if !errors.As(err, &fe) || fe.Line < 1 {
				t.Fatalf("error %v is no *Error with a line", err)
			}
			return
		}
		var b strings.Builder
		for _, s := range got {
			if s.Key == "" || s.Value == "" || strings.ContainsAny(s.Key+s.Value, "\n\x00") {
				t.Fatalf("setting %+v", s)
			}
			if strings.TrimSpace(s.Value) != s.Value {
				continue // a quoted value with blanks inside its quotes: not written back
			}
			b.WriteString(s.Key + " = '" + s.Value + "'\n")
		}
		if _, err := Parse([]byte(b.String())); err != nil {
			t.Fatalf("written back %q: %v", b.String(), err)
		}
	})
}
