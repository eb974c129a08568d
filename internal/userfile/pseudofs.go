package userfile

import (
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ExistingAncestor returns path or its nearest ancestor that exists (not following a
// final link); "" when none does.
func ExistingAncestor(path string) string {
	for d := filepath.Clean(path); ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return ""
		}
	}
}

// PseudoFS names the kernel file system that path (or its nearest existing ancestor) is
// on when it is one where no file a user means to keep can be made: "proc", "sysfs",
// "cgroup", "debugfs", "tracefs", "securityfs", "bpf", "devpts"; "" otherwise.
func PseudoFS(path string) string {
	a := ExistingAncestor(path)
	if a == "" {
		return ""
	}
	var st unix.Statfs_t
	if unix.Statfs(a, &st) != nil {
		return ""
	}
	switch int64(st.Type) {
	case unix.PROC_SUPER_MAGIC:
		return "proc"
	case unix.SYSFS_MAGIC:
		return "sysfs"
	case unix.CGROUP_SUPER_MAGIC, unix.CGROUP2_SUPER_MAGIC:
		return "cgroup"
	case unix.DEBUGFS_MAGIC:
		return "debugfs"
	case unix.TRACEFS_MAGIC:
		return "tracefs"
	case unix.SECURITYFS_MAGIC:
		return "securityfs"
	case unix.BPF_FS_MAGIC:
		return "bpf"
	case unix.DEVPTS_SUPER_MAGIC:
		return "devpts"
	}
	return ""
}
