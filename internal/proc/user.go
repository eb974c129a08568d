package proc

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// User is a Unix user that processes run as: a cluster job's workers run as the user
// who submitted the job, as Slurm's slurmstepd runs a step's tasks (it stays root
// itself, and so does gangrun's step: it holds the agent's Consul token and the step's
// cgroup). The ids come from the node's own user and group databases (os/user: NSS
// with cgo, /etc/passwd and /etc/group without), as Slurm requires the submitting
// user to exist on every compute node.
type User struct {
	// Name is the user's login name; Home is its home directory ("" when the database
	// gives none).
	Name, Home string
	// UID and GID are the user's id and primary group id; Groups its supplementary
	// group ids (the primary one among them, as initgroups(3) gives).
	UID, GID uint32
	Groups   []uint32
}

// ErrUnknownUser is wrapped by LookupUser's error for a user the node's databases do
// not have.
var ErrUnknownUser = errors.New("no such user on this node")

// LookupUser finds the user name (or a numeric uid, as gangrun records a submitter
// without a name) in the node's databases. Errors: ErrUnknownUser wrapped, naming the
// user; or the databases' own error.
func LookupUser(name string) (*User, error) {
	u, err := user.Lookup(name)
	if _, isNum := strconv.ParseUint(name, 10, 32); err != nil && isNum == nil {
		u, err = user.LookupId(name)
	}
	var unknownName user.UnknownUserError
	var unknownID user.UnknownUserIdError
	if errors.As(err, &unknownName) || errors.As(err, &unknownID) {
		return nil, fmt.Errorf("user %q: %w", name, ErrUnknownUser)
	}
	if err != nil {
		return nil, fmt.Errorf("user %q: %w", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("user %q: ids %s:%s are not numbers", name, u.Uid, u.Gid)
	}
	out := &User{Name: u.Username, Home: u.HomeDir, UID: uint32(uid), GID: uint32(gid)}
	gids, err := u.GroupIds()
	if err != nil {
		gids = []string{u.Gid} // no group database entry for it: the primary group only
	}
	for _, g := range gids {
		if n, err := strconv.ParseUint(g, 10, 32); err == nil {
			out.Groups = append(out.Groups, uint32(n))
		}
	}
	return out, nil
}

// Credential is what a process started as u takes (syscall.SysProcAttr.Credential:
// setgroups, setgid and setuid in the child before it executes its program).
func (u *User) Credential() *syscall.Credential {
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
}

// Env is the login variables of u (USER, LOGNAME, HOME), as a login or Slurm's
// --get-user-env sets them; they replace those of the process that starts the workers.
func (u *User) Env() []string {
	env := []string{"USER=" + u.Name, "LOGNAME=" + u.Name}
	if u.Home != "" {
		env = append(env, "HOME="+u.Home)
	}
	return env
}

// IsSelf reports whether u is the user this process runs as (its effective uid): then
// nothing needs switching.
func (u *User) IsSelf() bool { return u == nil || int(u.UID) == os.Geteuid() }

// AsUser runs fn with the file system permissions of u (the kernel's fsuid, fsgid and
// supplementary groups, on a thread of its own), so that a path the user names (a
// job's --output) is created or read only where the user could: root creating it
// would let a user write or read any file on the node. The thread is discarded after
// fn (its goroutine exits locked to it), so no other goroutine ever runs with u's ids.
// A nil u, or u being this process's user, runs fn as it is. Errors: fn's, or the
// kernel refusing the ids (EPERM: gangrun is not root).
func AsUser(u *User, fn func() error) error {
	if u.IsSelf() {
		return fn()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		groups := make([]int, len(u.Groups))
		for i, g := range u.Groups {
			groups[i] = int(g)
		}
		// setgroups, setfsgid and setfsuid act on the calling thread only (x/sys makes
		// the plain system calls, unlike package syscall's all-threads Setgroups).
		if err := unix.Setgroups(groups); err != nil {
			done <- fmt.Errorf("take the groups of user %s: %w", u.Name, err)
			return
		}
		_, _ = unix.SetfsgidRetGid(int(u.GID))
		_, _ = unix.SetfsuidRetUid(int(u.UID))
		// setfsuid(2) reports no failure: read the ids back (an invalid id sets nothing
		// and returns the current one).
		if uid, _ := unix.SetfsuidRetUid(-1); uid != int(u.UID) {
			done <- fmt.Errorf("take the file system ids of user %s: %w", u.Name, syscall.EPERM)
			return
		}
		done <- fn()
	}()
	return <-done
}
