package main

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/store"
)

// TestRunTakesOnlyItsGrantsDevices: `gangrun run` under a grant of `gangrun alloc`
// (--grant ID, or $GANGRUN_GRANT as alloc's command finds it) runs one worker per
// granted device of its node with CUDA_VISIBLE_DEVICES naming exactly them; an
// inherited CUDA_VISIBLE_DEVICES may narrow them but not name another device; a node
// outside the grant, an unknown grant and a job's grant are refused; `gangrun nodes`
// counts the GPUs the grant uses.
func TestRunTakesOnlyItsGrantsDevices(t *testing.T) {
	c := startJobCluster(t, "gpu-a", "gpu-b")
	_, raw := startHolder(t, c.consul, 2, 3)
	line := string(raw) // as alloc puts it in GANGRUN_GRANT
	sum, err := allocator.ParseSummary(line)
	if err != nil {
		t.Fatal(err)
	}
	gn, err := sum.Node("gpu-a")
	if err != nil {
		t.Fatal(err)
	}
	granted := strings.Join(gn.Devices, ",")
	var other string // a GPU of gpu-a that is not granted
	for i := range 8 {
		if !slices.Contains(gn.Devices, strconv.Itoa(i)) {
			other = strconv.Itoa(i)
			break
		}
	}
	inv := c.inventory
	show := []string{"--", "/bin/sh", "-c", `echo "local $LOCAL_RANK of $LOCAL_WORLD_SIZE sees $CUDA_VISIBLE_DEVICES"`}
	run := func(vars map[string]string, flags ...string) (int, string, string) {
		return inProcessEnv(vars, append(append([]string{"run", "--node-name", "gpu-a", "--topology-file", inv}, flags...), show...)...)
	}

	// As alloc's command finds it: $GANGRUN_GRANT.
	code, out, errOut := run(map[string]string{"GANGRUN_GRANT": line})
	if code != 0 || !strings.Contains(out, "local 2 of 3 sees "+granted) || strings.Contains(out, "local 3") {
		t.Errorf("run under $GANGRUN_GRANT: exit %d, want 3 workers seeing %s:\n%s%s", code, granted, out, errOut)
	}
	// By id, read from Consul.
	t.Setenv("CONSUL_HTTP_ADDR", c.consul)
	code, out, errOut = inProcess(append([]string{"run", "--grant", sum.ID, "--node-name", "gpu-a", "--topology-file", inv}, show...)...)
	if code != 0 || !strings.Contains(out, "local 2 of 3 sees "+granted) {
		t.Errorf("run --grant %s: exit %d, want 3 workers seeing %s:\n%s%s", sum.ID, code, granted, out, errOut)
	}
	// An inherited CUDA_VISIBLE_DEVICES narrows the grant's devices...
	code, out, errOut = run(map[string]string{"GANGRUN_GRANT": line, "CUDA_VISIBLE_DEVICES": gn.Devices[1]})
	if code != 0 || !strings.Contains(out, "local 0 of 1 sees "+gn.Devices[1]) {
		t.Errorf("run with CUDA_VISIBLE_DEVICES=%s under the grant: exit %d:\n%s%s", gn.Devices[1], code, out, errOut)
	}
	// ...and is refused when it names a device outside it.
	for _, tc := range []struct {
		name  string
		vars  map[string]string
		flags []string
		want  string
	}{
		{"a device not granted", map[string]string{"GANGRUN_GRANT": line, "CUDA_VISIBLE_DEVICES": gn.Devices[0] + "," + other},
			nil, `gangrun run: CUDA_VISIBLE_DEVICES=` + gn.Devices[0] + "," + other + `: device "` + other + `" is not granted to this node by grant ` + sum.ID},
		{"a node outside the grant", map[string]string{"GANGRUN_GRANT": strings.ReplaceAll(line, `"gpu-a"`, `"gpu-z"`)},
			nil, `gangrun run: node "gpu-a" is not in grant ` + sum.ID},
		{"not a grant", map[string]string{"GANGRUN_GRANT": "{"}, nil, "gangrun run: GANGRUN_GRANT is not a grant"},
		{"an unknown grant", map[string]string{"CONSUL_HTTP_ADDR": c.consul}, []string{"--grant", "nosuch"},
			"gangrun run: --grant nosuch: no such grant"},
	} {
		code, out, errOut := run(tc.vars, tc.flags...)
		if code != 2 || !strings.HasPrefix(errOut, tc.want) || strings.Count(errOut, "\n") != 1 || out != "" {
			t.Errorf("%s: exit %d, stderr %q, stdout %q; want exit 2 and one line starting %q", tc.name, code, errOut, out, tc.want)
		}
	}

	// A cluster job's grant is its steps', not for run.
	dir := t.TempDir()
	t.Chdir(dir)
	jobID := c.submit("--nodes", "1", "--gpus-per-node", "2", "--", "sleep", "60")
	s, err := store.NewConsul(c.consul)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	waitUntil(t, func() bool {
		_, g, err := allocator.Show(t.Context(), s, jobID)
		return err == nil && g != nil
	}, "the job granted")
	code, _, errOut = inProcess(append([]string{"run", "--grant", jobID, "--node-name", "gpu-a", "--topology-file", inv}, show...)...)
	if code != 2 || !strings.Contains(errOut, "is cluster job "+jobID+"'s grant") {
		t.Errorf("run --grant JOB: exit %d, stderr %q", code, errOut)
	}

	// gangrun nodes counts what the grants use.
	waitUntil(t, func() bool {
		used := 0
		for _, n := range nodesJSON(t, c.consul) {
			used += n.GPUsUsed
			if n.GPUsUsed > 0 && !slices.Contains(n.Grants, sum.ID) {
				return false
			}
		}
		return used == 8
	}, "nodes counting 3+3 GPUs of the alloc and 2 of the job as used")
	code, text, _ := c.gangrun("nodes")
	if code != 0 || !strings.Contains(text, sum.ID) || !strings.Contains(strings.SplitN(text, "\n", 2)[0], "USED") {
		t.Errorf("nodes: %d\n%s", code, text)
	}
	_, _, _ = c.gangrun("cancel", jobID)
}
