package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzFlags: any arguments to the commands that start nothing and ask no Consul
// (hostlist, ckpt, version, help) end with exit 0, 1 or 2, never a panic, and a usage
// error is one line beginning "gangrun".
func FuzzFlags(f *testing.F) {
	for _, seed := range []string{
		"hostlist\x00expand\x00n[1-3]", "hostlist\x00compress\x00--sorted\x00b,a", "ckpt\x00ls\x00{ckpt}\x00--json",
		"ckpt\x00prune\x00{ckpt}\x00--keep\x001", "ckpt\x00latest\x00--format\x00bogus\x00{ckpt}", "version\x00--bogus",
		"help\x00nosuch", "hostlist\x00expand\x00n[1-99999999999]", "ckpt\x00verify\x00{ckpt}/checkpoint-1",
	} {
		f.Add(seed)
	}
	ckpt := filepath.Join(f.TempDir(), "ckpt")
	for _, c := range []string{"checkpoint-1", "checkpoint-2"} {
		if err := os.MkdirAll(filepath.Join(ckpt, c), 0o755); err != nil {
			f.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ckpt, c, "trainer_state.json"), []byte(`{"global_step": 1}`), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, in string) {
		args := strings.Split(strings.ReplaceAll(in, "{ckpt}", ckpt), "\x00")
		switch args[0] {
		case "hostlist", "ckpt", "version", "help":
		default:
			return
		}
		for _, a := range args {
			if a == "--yes" || strings.HasPrefix(a, "--yes=") {
				return // prune's deletion is its own tests'
			}
		}
		var stdout, stderr bytes.Buffer
		e := &env{stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }, stdin: strings.NewReader("")}
		code := dispatch(context.Background(), e, args)
		if code != 0 && code != 1 && code != 2 {
			t.Fatalf("%q: exit %d", args, code)
		}
		if code == exitUsage {
			lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
			if last := lines[len(lines)-1]; !strings.HasPrefix(last, "gangrun") {
				t.Errorf("%q: usage error %q does not begin with gangrun", args, last)
			}
		}
	})
}
