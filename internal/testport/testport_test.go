package testport

import (
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestTakeIsDisjointAcrossProcesses: ports taken by this process and by a second test
// process running at the same time never coincide, lie below the ephemeral range, and
// can be listened on.
func TestTakeIsDisjointAcrossProcesses(t *testing.T) {
	if os.Getenv("TESTPORT_CHILD") != "" {
		ps, err := Take(300)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, p := range ps {
			b.WriteString(strconv.Itoa(p) + " ")
		}
		os.Stdout.WriteString("PORTS " + b.String() + "\n")
		return
	}
	mine, err := Take(300)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestTakeIsDisjointAcrossProcesses$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "TESTPORT_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	_, list, ok := strings.Cut(string(out), "PORTS ")
	if !ok {
		t.Fatalf("child printed no ports:\n%s", out)
	}
	list, _, _ = strings.Cut(list, "\n")
	theirs := strings.Fields(list)
	if len(theirs) != 300 {
		t.Fatalf("child took %d ports, want 300", len(theirs))
	}
	low := usable()[len(usable())-1][1]
	for _, s := range theirs {
		p, _ := strconv.Atoi(s)
		if slices.Contains(mine, p) {
			t.Errorf("port %d taken by both processes", p)
		}
	}
	seen := map[int]bool{}
	for _, p := range mine {
		if seen[p] {
			t.Errorf("port %d handed out twice", p)
		}
		seen[p] = true
		if p >= low || (p >= 20000 && p < 30000) || p < 10000 {
			t.Errorf("port %d outside the ranges", p)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(mine[0]))
	if err != nil {
		t.Fatalf("listen on a port taken: %v", err)
	}
	l.Close()
}
