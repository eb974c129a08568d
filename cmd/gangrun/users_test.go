package main

import (
	"os"
	"os/exec"
	"os/user"
	"sync"
	"testing"
)

// madeUsers counts the tests using each Unix user that unixUsers made, so that the last
// one to end removes it.
var madeUsers = struct {
	sync.Mutex
	n map[string]int
}{n: map[string]int{}}

// unixUsers makes sure each of names is a Unix user of this machine, as a cluster's
// users exist on every node (LDAP, sssd): a job's workers run as its user, so a test
// that submits as alice needs her. Those missing are made with useradd (a system user
// with a group of its own, no home, no login shell) and removed with userdel once the
// last test using them ends; existing ones are used as they are.
func unixUsers(t *testing.T, names ...string) {
	t.Helper()
	for _, name := range names {
		madeUsers.Lock()
		if _, err := user.Lookup(name); err != nil {
			out, err := exec.Command("useradd", "--system", "--user-group", "--no-create-home",
				"--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name).CombinedOutput()
			if _, lerr := user.Lookup(name); lerr != nil {
				madeUsers.Unlock()
				t.Fatalf("useradd %s: %v %s", name, err, out)
			}
			madeUsers.n[name] = 0
		}
		made := false
		if n, ok := madeUsers.n[name]; ok {
			madeUsers.n[name] = n + 1
			made = true
		}
		madeUsers.Unlock()
		if made {
			t.Cleanup(func() {
				madeUsers.Lock()
				defer madeUsers.Unlock()
				if madeUsers.n[name]--; madeUsers.n[name] == 0 {
					delete(madeUsers.n, name)
					if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
						t.Errorf("userdel %s: %v %s", name, err, out)
					}
				}
			})
		}
	}
}

// sharedDir returns a new directory every user may write in (mode 1777, as /tmp's),
// removed when the test ends: the work and output directory of several users' jobs
// (t.TempDir's are root's alone).
func sharedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gangrun-users-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o1777); err != nil {
		t.Fatal(err)
	}
	return dir
}
