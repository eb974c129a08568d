package cgroup

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/internal/proc"
)

// Usage is what a step's cgroup has used so far, as sstat reports it (MaxRSS, AveRSS,
// AveCPU, MaxPages): read from the cgroup's own files, so that it covers every process
// the step started, those that ended too, where the kernel keeps the figure.
type Usage struct {
	// PeakBytes is the most memory the cgroup was charged at once, in bytes: v2's
	// memory.peak (Linux 5.19 and later), v1's memory.max_usage_in_bytes. Page cache
	// counts, as the kernel charges it. 0 where neither can be read (no memory
	// controller, an older kernel): the caller keeps the highest CurrentBytes it saw.
	PeakBytes int64 `json:"peak_bytes"`
	// CurrentBytes is the memory charged now, in bytes: v2's memory.current, v1's
	// memory.usage_in_bytes.
	CurrentBytes int64 `json:"current_bytes"`
	// CPU is the CPU time used, user and system: v2's cpu.stat usage_usec (every
	// process, ended ones too); on v1, where a step has no cpuacct controller, the sum
	// of utime, stime, cutime and cstime of the processes in the cgroup now
	// (/proc/PID/stat, proc(5)), which misses those that ended unreaped by them.
	CPU time.Duration `json:"cpu_ns"`
	// MajorFaults is the count of major page faults (memory.stat's pgmajfault, v1's
	// total_pgmajfault): Slurm's "Pages".
	MajorFaults int64 `json:"major_faults"`
	// Procs is how many processes the cgroup holds now.
	Procs int `json:"procs"`
}

// Usage reads the step cgroup's usage now. Files that cannot be read leave their
// fields 0; it never fails.
func (s *Step) Usage() Usage {
	return ReadUsage(s.dirs, s.v2 != nil)
}

// ReadUsage reads the usage of the cgroup whose directories are dirs (v2: one, the
// unified hierarchy's; v1: one per controller, each named by its hierarchy's mount
// point under /sys/fs/cgroup).
func ReadUsage(dirs []string, v2 bool) Usage {
	var u Usage
	pids := map[int]bool{}
	for _, d := range dirs {
		for _, p := range pidsIn(d) {
			pids[p] = true
		}
		if v2 {
			u.PeakBytes = readInt(filepath.Join(d, "memory.peak"))
			u.CurrentBytes = readInt(filepath.Join(d, "memory.current"))
			u.MajorFaults = statField(filepath.Join(d, "memory.stat"), "pgmajfault")
			u.CPU = time.Duration(statField(filepath.Join(d, "cpu.stat"), "usage_usec")) * time.Microsecond
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "memory.usage_in_bytes")); err == nil {
			u.PeakBytes = readInt(filepath.Join(d, "memory.max_usage_in_bytes"))
			u.CurrentBytes = readInt(filepath.Join(d, "memory.usage_in_bytes"))
			u.MajorFaults = statField(filepath.Join(d, "memory.stat"), "total_pgmajfault")
		}
	}
	u.Procs = len(pids)
	if !v2 {
		for p := range pids {
			u.CPU += procCPU(p)
		}
	}
	return u
}

// readInt reads a file holding one number; 0 when it cannot.
func readInt(path string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return n
}

// statField reads key's value from a "KEY VALUE" file (memory.stat, cpu.stat); 0 when
// it is not there.
func statField(path, key string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+" "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every Linux
// architecture gangrun builds for (sysconf(_SC_CLK_TCK)).
const clockTicks = 100

// procCPU is process pid's CPU time with its reaped children's (proc(5): utime,
// stime, cutime, cstime, fields 14 to 17 of /proc/PID/stat); 0 when it cannot be read.
func procCPU(pid int) time.Duration {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	f := proc.StatFields(string(data))
	// f[0] is field 3 (state): utime is field 14, f[11].
	if len(f) < 15 {
		return 0
	}
	var ticks int64
	for _, s := range f[11:15] {
		n, _ := strconv.ParseInt(s, 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks
}
