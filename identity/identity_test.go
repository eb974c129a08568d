package identity_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/mungetest"
)

func open(t testing.TB, d *mungetest.Daemon) *identity.Munge {
	m, err := identity.Open(d.Socket)
	if err != nil {
		panic(err)
	}
	return m
}

// TestSealVerify: a credential sealed on one host of a cluster verifies on another
// (two munged daemons sharing a key) with the maker's uid and gid, only for the content
// it was sealed for, and once when it must be fresh; a host with another key cannot
// verify it, nor make one this cluster takes.
func TestSealVerify(t *testing.T) {
	ctx := context.Background()
	a := mungetest.Start(t)
	b := mungetest.StartWithKey(t, a.Key)
	outside := mungetest.Start(t)
	ma, mb, mo := open(t, a), open(t, b), open(t, outside)

	content := []byte("job 7 spec {...}")
	cred, err := ma.Seal(ctx, content)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cred, "MUNGE:") {
		t.Fatalf("credential %q: want MUNGE's armour", cred)
	}
	c, err := mb.Verify(ctx, cred, content, identity.Fresh)
	if err != nil {
		t.Fatalf("verify on the second host: %v", err)
	}
	if c.UID != uint32(os.Geteuid()) || c.GID != uint32(os.Getegid()) {
		t.Errorf("caller %d:%d, want this process's %d:%d", c.UID, c.GID, os.Geteuid(), os.Getegid())
	}
	if time.Since(c.Encoded) > time.Minute || c.TTL != 300*time.Second || !c.Host.IsValid() {
		t.Errorf("caller %+v: want made just now, munged's default TTL of 300 s and a host", c)
	}
	// Once only, when it must be fresh; any number of times when kept.
	if _, err := mb.Verify(ctx, cred, content, identity.Fresh); !errors.Is(err, identity.ErrReplayed) {
		t.Errorf("second fresh verify on the same host: %v, want ErrReplayed", err)
	}
	if _, err := mb.Verify(ctx, cred, content, identity.FreshOrReplayed); err != nil {
		t.Errorf("FreshOrReplayed on a replay: %v", err)
	}
	if _, err := mb.Verify(ctx, cred, content, identity.Kept); err != nil {
		t.Errorf("kept credential checked again: %v", err)
	}
	// Bound to its content.
	if _, err := ma.Verify(ctx, cred, []byte("job 8 spec {...}"), identity.Kept); !errors.Is(err, identity.ErrMismatch) {
		t.Errorf("other content: %v, want ErrMismatch", err)
	}
	// Another cluster's key.
	if _, err := mo.Verify(ctx, cred, content, identity.Kept); !errors.Is(err, identity.ErrInvalid) {
		t.Errorf("verified by a host with another key: %v, want ErrInvalid", err)
	}
	foreign, err := mo.Seal(ctx, content)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ma.Verify(ctx, foreign, content, identity.Kept); !errors.Is(err, identity.ErrInvalid) {
		t.Errorf("a credential from outside the cluster: %v, want ErrInvalid", err)
	}
	if _, err := ma.Who(ctx, foreign); !errors.Is(err, identity.ErrInvalid) {
		t.Errorf("Who of a credential from outside: %v, want ErrInvalid", err)
	}
	// Damaged and missing.
	for _, bad := range []string{"MUNGE:garbage:", "not a credential", cred[:len(cred)/2]} {
		if _, err := ma.Verify(ctx, bad, content, identity.Kept); !errors.Is(err, identity.ErrInvalid) {
			t.Errorf("Verify(%.20q): %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := ma.Verify(ctx, "", content, identity.Kept); !errors.Is(err, identity.ErrMissing) {
		t.Errorf("no credential: %v, want ErrMissing", err)
	}
	if w, err := ma.Who(ctx, cred); err != nil || w.UID != c.UID {
		t.Errorf("Who: %+v, %v", w, err)
	}
}

// TestExpired: a credential past its time-to-live is refused where it must be fresh
// and taken where it is kept. munged's TTL is in whole seconds: a 1-second one made by
// the munge command line, checked 2 s later.
func TestExpired(t *testing.T) {
	ctx := context.Background()
	d := mungetest.Start(t)
	m := open(t, d)
	content := []byte("cancel job 3")
	// The payload Seal would make, sealed with a TTL of 1 s by munge(1).
	sum := strings.TrimSpace(sha256Hex(content))
	out, err := exec.Command("munge", "--socket", d.Socket, "--ttl", "1", "--string", identity.PayloadPrefix+sum).Output()
	if err != nil {
		t.Fatalf("munge: %v", err)
	}
	cred := strings.TrimSpace(string(out))
	time.Sleep(2100 * time.Millisecond)
	if _, err := m.Verify(ctx, cred, content, identity.Fresh); !errors.Is(err, identity.ErrExpired) {
		t.Errorf("fresh: %v, want ErrExpired", err)
	}
	if _, err := m.Verify(ctx, cred, content, identity.FreshOrReplayed); !errors.Is(err, identity.ErrExpired) {
		t.Errorf("FreshOrReplayed: %v, want ErrExpired", err)
	}
	if _, err := m.Verify(ctx, cred, content, identity.Kept); err != nil {
		t.Errorf("kept: %v, want it taken", err)
	}
}

// TestOtherUser: a credential carries the uid of the process that made it: one made by
// nobody (the munge command run as that user) verifies as nobody's uid, not root's.
func TestOtherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test makes a credential as another user: run the tests as root (make test does)")
	}
	ctx := context.Background()
	d := mungetest.Start(t)
	m := open(t, d)
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	content := []byte("submit as nobody")
	cmd := exec.Command("munge", "--socket", d.Socket, "--string", identity.PayloadPrefix+sha256Hex(content))
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	cmd.SysProcAttr = credential(uid, gid)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("munge as nobody: %v", err)
	}
	c, err := m.Verify(ctx, strings.TrimSpace(string(out)), content, identity.Fresh)
	if err != nil {
		t.Fatal(err)
	}
	if int(c.UID) != uid || int(c.GID) != gid {
		t.Errorf("caller %d:%d, want nobody's %d:%d", c.UID, c.GID, uid, gid)
	}
}

// TestNoDaemon: a socket nobody listens on is ErrNoDaemon, naming the socket.
func TestNoDaemon(t *testing.T) {
	m, err := identity.Open(t.TempDir() + "/no-socket")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = m.Seal(ctx, []byte("x"))
	if !errors.Is(err, identity.ErrNoDaemon) || !strings.Contains(err.Error(), "no-socket") {
		t.Errorf("Seal without munged: %v, want ErrNoDaemon naming the socket", err)
	}
}

// TestSocketFrom: MUNGE_SOCKET wins over munge's default socket.
func TestSocketFrom(t *testing.T) {
	env := map[string]string{}
	get := func(k string) string { return env[k] }
	if got := identity.SocketFrom(get); got != identity.DefaultSocket {
		t.Errorf("default: %q", got)
	}
	env["MUNGE_SOCKET"] = "/tmp/x/socket"
	if got := identity.SocketFrom(get); got != "/tmp/x/socket" {
		t.Errorf("MUNGE_SOCKET: %q", got)
	}
}

// BenchmarkSeal and BenchmarkVerify: one credential made, one checked, through the test's
// own munged (benchmarks/README.md, "MUNGE credentials").
func BenchmarkSeal(b *testing.B) {
	m := open(nil, mungetest.Start(b))
	ctx := context.Background()
	for b.Loop() {
		if _, err := m.Seal(ctx, []byte("job 1")); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	d := mungetest.Start(b)
	m := open(nil, d)
	ctx := context.Background()
	cred, err := m.Seal(ctx, []byte("job 1"))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := m.Verify(ctx, cred, []byte("job 1"), identity.Kept); err != nil {
			b.Fatal(err)
		}
	}
}
