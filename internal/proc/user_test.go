package proc

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestLookupUser: a name and a numeric uid find the same user (nobody, 65534 on Debian
// and most distributions); an unknown one is ErrUnknownUser, naming it.
func TestLookupUser(t *testing.T) {
	byName, err := LookupUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	byID, err := LookupUser("65534")
	if err != nil {
		t.Fatal(err)
	}
	if byName.UID != 65534 || byID.Name != "nobody" || byID.UID != byName.UID || byID.GID != byName.GID || len(byName.Groups) == 0 {
		t.Errorf("nobody: by name %+v, by id %+v", byName, byID)
	}
	if _, err := LookupUser("no-such-user-gr"); !errors.Is(err, ErrUnknownUser) || !strings.Contains(err.Error(), `"no-such-user-gr"`) {
		t.Errorf("unknown user: %v", err)
	}
}

// TestAsUserAndCredential (as root): what fn creates under AsUser is the user's and
// only where the user may write; the caller's own ids are untouched afterwards; a
// process started with the user's Credential through Start runs as the user.
func TestAsUserAndCredential(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test switches users: run it as root (CI does)")
	}
	u, err := LookupUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	open, err := os.MkdirTemp("", "gangrun-asuser-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(open)
	if err := os.Chmod(open, 0o1777); err != nil {
		t.Fatal(err)
	}
	closed := t.TempDir() // root's, mode 0700
	create := func(dir string) error {
		return AsUser(u, func() error { return os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644) })
	}
	if err := create(closed); !errors.Is(err, os.ErrPermission) {
		t.Errorf("nobody creating a file in root's 0700 directory: %v, want permission denied", err)
	}
	if err := create(open); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(open, "f")); err != nil || st.Sys().(*syscall.Stat_t).Uid != u.UID {
		t.Errorf("the file nobody made: %v, want uid %d", err, u.UID)
	}
	// The thread that took nobody's ids is gone: this goroutine's files are root's.
	for range 20 {
		mine := filepath.Join(open, "mine")
		if err := os.WriteFile(mine, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if st, _ := os.Stat(mine); st.Sys().(*syscall.Stat_t).Uid != 0 {
			t.Fatalf("a file made after AsUser belongs to uid %d", st.Sys().(*syscall.Stat_t).Uid)
		}
	}
	cmd := exec.Command("id", "-u")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: u.Credential()}
	var out strings.Builder
	cmd.Stdout = &out
	p, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	<-p.Exited()
	p.Release()
	if got := strings.TrimSpace(out.String()); got != "65534" {
		t.Errorf("id -u started with nobody's credential: %q", got)
	}
}
