package proc

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// MemPolicy is the NUMA memory policy a process starts with (set_mempolicy(2)): its
// memory comes from Nodes, preferred (numactl --preferred: other nodes when those are
// full) or, Strict, only from them (numactl --membind: the process is OOM-killed
// rather than spill). No Nodes: the default policy (local allocation).
type MemPolicy struct {
	Nodes  []int
	Strict bool
}

// Linux's memory policy modes (include/uapi/linux/mempolicy.h).
const (
	mpolDefault   = 0
	mpolPreferred = 1
	mpolBind      = 2
)

// nodeMask is a nodemask_t large enough for any kernel's MAX_NUMNODES (1024).
type nodeMask [1024 / 64]uint64

// setMempolicy sets the calling thread's policy. maxnode counts the bits of mask the
// kernel reads, plus one: the kernel has always read one bit fewer than it is told
// (numactl passes the same).
func setMempolicy(mode int, mask *nodeMask) error {
	var ptr, maxnode uintptr
	if mask != nil {
		ptr, maxnode = uintptr(unsafe.Pointer(mask)), uintptr(len(mask)*64+1)
	}
	_, _, errno := unix.Syscall(unix.SYS_SET_MEMPOLICY, uintptr(mode), ptr, maxnode)
	if errno != 0 {
		return errno
	}
	return nil
}

// getMempolicy returns the calling thread's policy and nodes.
func getMempolicy() (mode int, mask nodeMask, err error) {
	var m int32
	_, _, errno := unix.Syscall6(unix.SYS_GET_MEMPOLICY, uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&mask)),
		uintptr(len(mask)*64+1), 0, 0, 0)
	if errno != 0 {
		return 0, mask, errno
	}
	return int(m), mask, nil
}

// withMemPolicy runs fn (a fork) with the calling thread, which must be locked to its
// goroutine, under mp, and then gives the thread its own policy back: a child inherits
// its forking thread's policy, and keeps it across execve. It reports whether mp was
// applied: not when it has no nodes, or the kernel refused it (a node this machine
// lacks, or one outside gangrun's cpuset.mems), in which case fn runs under the
// thread's own policy.
func withMemPolicy(mp MemPolicy, fn func()) (applied bool) {
	if len(mp.Nodes) == 0 {
		fn()
		return false
	}
	oldMode, oldMask, err := getMempolicy()
	if err != nil {
		fn()
		return false
	}
	var mask nodeMask
	for _, n := range mp.Nodes {
		if n < 0 || n >= len(mask)*64 {
			fn()
			return false
		}
		mask[n/64] |= 1 << (n % 64)
	}
	mode := mpolPreferred
	if mp.Strict {
		mode = mpolBind
	}
	if len(mp.Nodes) > 1 && !mp.Strict {
		// MPOL_PREFERRED takes one node (MPOL_PREFERRED_MANY needs Linux 5.15): the
		// first, the GPU's own.
		mask = nodeMask{}
		mask[mp.Nodes[0]/64] |= 1 << (mp.Nodes[0] % 64)
	}
	if setMempolicy(mode, &mask) != nil {
		fn()
		return false
	}
	fn()
	// Restoring the policy just read cannot fail short of a kernel bug; this thread
	// would then keep the rank's, and only gangrun's own allocations would follow it.
	if oldMode == mpolDefault {
		_ = setMempolicy(mpolDefault, nil)
	} else {
		_ = setMempolicy(oldMode, &oldMask)
	}
	return true
}
