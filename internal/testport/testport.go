// Package testport hands the tests TCP ports for the servers they start (Consul agents,
// gangrun agents' metrics and status pages, Prometheus, torch's store) that neither
// another test process on this machine nor a client socket takes in the meantime.
//
// A port asked of the kernel with port 0 and released again comes from the ephemeral
// range (net.ipv4.ip_local_port_range, 32768–60999 by default), the same range every
// outgoing connection's local port is drawn from: under `go test ./...`, with packages'
// test processes side by side and hundreds of Consul connections open, a server started
// a moment later on such a port now and then failed with "address already in use".
// The ports handed out here lie below the ephemeral range, outside the ranges gangrun
// and torch use themselves (the Slurm master ports 20000–29999, torch's 29500 and
// 29400, Consul's 8300–8600), and each is claimed with a lock file that this process
// holds until it exits, so that two test processes never get the same one.
package testport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// ranges are the half-open port ranges [lo, hi) ports are drawn from; the top of the
// last is lowered to the ephemeral range's start when that starts lower.
var ranges = [][2]int{{10000, 20000}, {30000, 32768}}

// lockDir holds one lock file per port claimed by a running test process.
var lockDir = filepath.Join(os.TempDir(), "gangrun-testports")

var (
	mu   sync.Mutex
	held = map[int]*os.File{} // this process's claims: the lock files it keeps open
)

// tries is how many random ports Take checks for each it returns.
const tries = 200

// Get returns a free port on 127.0.0.1 claimed for this test process; the test fails
// when none can be found.
func Get(t testing.TB) int {
	t.Helper()
	p, err := Take(1)
	if err != nil {
		t.Fatal(err)
	}
	return p[0]
}

// Take returns n distinct ports, each free on 127.0.0.1 and on every interface when it
// was checked and claimed for this process until it exits. Errors: no lock directory,
// or no free port found in a few hundred tries.
func Take(n int) ([]int, error) {
	mu.Lock()
	defer mu.Unlock()
	if err := os.MkdirAll(lockDir, 0o1777); err != nil {
		return nil, fmt.Errorf("testport: %w", err)
	}
	rs := usable()
	total := 0
	for _, r := range rs {
		total += r[1] - r[0]
	}
	out := make([]int, 0, n)
	for len(out) < n {
		found := false
		for i := 0; i < tries && !found; i++ {
			k := rand.IntN(total)
			p := 0
			for _, r := range rs {
				if k < r[1]-r[0] {
					p = r[0] + k
					break
				}
				k -= r[1] - r[0]
			}
			found = claim(p)
			if found {
				out = append(out, p)
			}
		}
		if !found {
			return nil, errors.New("testport: no free port below the ephemeral range after many tries")
		}
	}
	return out, nil
}

// usable returns ranges cut at the start of the kernel's ephemeral range.
func usable() [][2]int {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 1024 {
				low = v
			}
		}
	}
	var rs [][2]int
	for _, r := range ranges {
		if r[1] > low {
			r[1] = low
		}
		if r[1] > r[0] {
			rs = append(rs, r)
		}
	}
	return rs
}

// claim takes port p for this process when no other process holds its lock and nothing
// listens on it.
func claim(p int) bool {
	if _, ok := held[p]; ok {
		return false
	}
	f, err := os.OpenFile(filepath.Join(lockDir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return false
	}
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		f.Close()
		return false
	}
	for _, addr := range []string{"127.0.0.1:", ":"} {
		l, err := net.Listen("tcp", addr+strconv.Itoa(p))
		if err != nil {
			f.Close()
			return false
		}
		l.Close()
	}
	held[p] = f
	return true
}
