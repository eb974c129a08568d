package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/job"
)

// TestExclusiveJobsRunOneAtATime: three --exclusive jobs of one GPU each on one 8-GPU
// node run one at a time: while the first runs the other two wait PENDING for
// Resources, saying the node is in use, though 7 GPUs are free; each job takes a lock
// directory and fails if another holds it, so two at once would end FAILED.
func TestExclusiveJobsRunOneAtATime(t *testing.T) {
	c := startJobCluster(t, "gpu-a")
	dir := t.TempDir()
	t.Chdir(dir)
	script := `mkdir running || exit 9; while [ ! -e release ]; do sleep 0.1; done; rmdir running`
	release := func() {
		if err := os.WriteFile(filepath.Join(dir, "release"), nil, 0o644); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(release) // a failed test's jobs end too
	var ids []string
	for range 3 {
		ids = append(ids, c.submit("--exclusive", "--gpus-per-node", "1", "--", "/bin/sh", "-c", script))
	}
	var first string
	waitUntilFor(t, 90*time.Second, func() bool {
		for _, id := range ids {
			if c.show(id)["state"] == string(job.Running) {
				first = id
				return true
			}
		}
		return false
	}, "one of the exclusive jobs running")
	for _, id := range ids {
		if id == first {
			continue
		}
		waitUntilFor(t, 30*time.Second, func() bool {
			return strings.Contains(c.reason(id), "in use by another job (--exclusive)")
		}, "job "+id+" pending, its reason saying the node is in use")
		if st := c.show(id)["state"]; st != string(job.Pending) {
			t.Errorf("job %s is %v beside exclusive job %s, want PENDING", id, st, first)
		}
		if r := c.reason(id); !strings.HasPrefix(r, "Resources") {
			t.Errorf("job %s's reason %q, want Resources", id, r)
		}
	}
	release()
	for _, id := range ids {
		c.waitState(id, job.Completed, 2*time.Minute)
	}
}

// TestConstraintNodelistExcludeAcrossTwoAgents: on two agents, gpu-b labelled ib=hdr,
// --constraint ib runs on gpu-b, --nodelist gpu-a on gpu-a, --exclude gpu-b on gpu-a,
// a GPU type in Slurm's spelling on the H100s; a constraint no node meets and an
// unknown node are refused at submit, in Slurm's words and naming the value, and a GPU
// type no node has, exit 2.
func TestConstraintNodelistExcludeAcrossTwoAgents(t *testing.T) {
	c := startJobClusterWith(t, func(node string) []string {
		if node == "gpu-b" {
			return []string{"--labels", "ib=hdr"}
		}
		return nil
	}, "gpu-a", "gpu-b")
	t.Chdir(t.TempDir())
	for _, tc := range []struct {
		args []string
		node string
	}{
		{[]string{"--constraint", "ib"}, "gpu-b"},
		{[]string{"-C", "ib=hdr|nvlink"}, "gpu-b"},
		{[]string{"--nodelist", "gpu-a"}, "gpu-a"},
		{[]string{"-x", "gpu-b"}, "gpu-a"},
		// Slurm's AutoDetect=nvml name for the GPU.
		{[]string{"-x", "gpu-a", "--gpus-per-node", "nvidia_h100_80gb_hbm3:8"}, "gpu-b"},
	} {
		id := c.submit(append(append([]string{"--gpus-per-node", "8"}, tc.args...), "--", "true")...)
		m := c.waitState(id, job.Completed, 90*time.Second)
		nodes, _ := m["nodes"].([]any)
		if len(nodes) != 1 || nodes[0].(map[string]any)["name"] != tc.node {
			t.Errorf("%v: ran on %v, want %s", tc.args, m["nodes"], tc.node)
		}
		if code, out, _ := c.gangrun("show", id); code != 0 || !strings.Contains(out, "   OverSubscribe=OK Features=") {
			t.Errorf("show %s (%v): exit %d\n%s", id, tc.args, code, out)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-C", "nvlink"}, `gangrun submit: Invalid feature specification: --constraint "nvlink": no node has those features`},
		{[]string{"-w", "gpu-z"}, "gangrun submit: Invalid node name specified: --nodelist gpu-z is not a registered node"},
		{[]string{"-C", "[a|b]"}, `gangrun submit: --constraint "[a|b]": "[" is not supported by gangrun`},
		{[]string{"--exclusive=mcs"}, "gangrun submit: --exclusive=mcs: gangrun has no MCS labels"},
		{[]string{"-x", "gpu-[a"}, `gangrun submit: Invalid node name specified: --exclude="gpu-[a"`},
		{[]string{"-w", "gpu-a", "--nodes", "2"}, "gangrun submit: --nodes 2 (with --spare-nodes 0) and a --nodelist of 1"},
		{[]string{"--gpus-per-node", "a100:1"}, "gangrun submit: GPU model a100 (--gpus-per-node a100:1, or --gpu-model): no node has such GPUs"},
	} {
		code, out, errOut := c.gangrun(append(append([]string{"submit"}, tc.args...), "--", "true")...)
		if code != exitUsage || out != "" || !strings.HasPrefix(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("submit %v: exit %d %q %q, want %d and one line %q...", tc.args, code, out, errOut, exitUsage, tc.want)
		}
	}
}
