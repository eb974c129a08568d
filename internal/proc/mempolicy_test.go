package proc

import (
	"bytes"
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

// TestStartUnderMemPolicy: a process started under a memory policy has it from its
// first mapping (its own /proc/self/numa_maps says so: numactl's preferred or bind on
// node 0, this machine's node), the forking thread gets its own policy back, and a node
// the kernel refuses starts the process with the default policy, reported as not applied.
func TestStartUnderMemPolicy(t *testing.T) {
	for _, c := range []struct {
		name    string
		mp      MemPolicy
		want    string
		applied bool
	}{
		{"preferred", MemPolicy{Nodes: []int{0}}, " prefer:0 ", true},
		{"strict", MemPolicy{Nodes: []int{0}, Strict: true}, " bind:0 ", true},
		{"none", MemPolicy{}, " default ", false},
		{"a node this machine lacks", MemPolicy{Nodes: []int{1000}, Strict: true}, " default ", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The forking thread is this goroutine's (StartPlacedMem locks it; so does
			// the test, to read its policy after).
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var out bytes.Buffer
			cmd := exec.Command("head", "-n", "1", "/proc/self/numa_maps")
			cmd.Stdout = &out
			p, _, applied, err := StartPlacedMem(cmd, nil, c.mp, nil)
			if err != nil {
				t.Fatal(err)
			}
			<-p.Exited()
			p.Release()
			if applied != c.applied || !strings.Contains(out.String(), c.want) {
				t.Errorf("applied %v, numa_maps %q; want applied %v and %q", applied, out.String(), c.applied, c.want)
			}
			if mode, _, err := getMempolicy(); err != nil || mode != mpolDefault {
				t.Errorf("the forking thread's policy after the start: %d %v, want the default back", mode, err)
			}
		})
	}
}
