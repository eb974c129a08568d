package cgroup

import (
	"strings"
	"testing"

	"github.com/containerd/cgroups/v3/cgroup2"
)

// TestResourcesV2 checks what a step's limits hand containerd's cgroup2 package: the
// development VM's v2 hierarchy offers no cpuset, memory or pids controller (bound to
// v1), so these are checked here as the library's input rather than in a kernel.
func TestResourcesV2(t *testing.T) {
	lim := Limits{CPUs: []int{0, 1, 2, 3, 8}, MemoryBytes: 4 << 30, PidsLimit: 32768}
	all := []string{"cpuset", "memory", "pids"}
	res := resourcesV2(lim, all, true)
	if res.CPU == nil || res.CPU.Cpus != "0-3,8" || res.CPU.Mems != "" || res.CPU.Weight != nil || res.CPU.Max != "" {
		t.Errorf("CPU %+v, want cpuset.cpus 0-3,8 alone (mems left to the parent's)", res.CPU)
	}
	if res.Memory == nil || res.Memory.Max == nil || *res.Memory.Max != 4<<30 || res.Memory.Swap == nil || *res.Memory.Swap != 0 ||
		res.Memory.High != nil || res.Memory.Low != nil || res.Memory.Min != nil || res.Memory.OOMGroup != nil {
		t.Errorf("Memory %+v, want memory.max 4 GiB and memory.swap.max 0 alone", res.Memory)
	}
	if res.Pids == nil || res.Pids.Max != 32768 {
		t.Errorf("Pids %+v, want pids.max 32768", res.Pids)
	}
	if got := strings.Join(res.EnabledControllers(), ","); got != "cpu,cpuset,memory,pids" {
		// newV2 enables its controllers itself (ToggleControllers with use), not the
		// library's list, which adds cpu for a cpuset.
		t.Errorf("the library's controllers for these resources: %s", got)
	}
	if res := resourcesV2(lim, all, false); res.Memory.Swap != nil {
		t.Errorf("without swap accounting memory.swap.max is set to %d", *res.Memory.Swap)
	}
	if res := resourcesV2(Limits{PidsLimit: 100}, all, true); res.CPU != nil || res.Memory != nil || res.Pids.Max != 100 {
		t.Errorf("no CPUs, no --mem: %+v", res)
	}
	if res := resourcesV2(lim, []string{"memory"}, true); res.CPU != nil || res.Pids != nil || res.Memory == nil {
		t.Errorf("only memory offered: %+v", res)
	}
	if n := len(res.Values()); n != 4 {
		t.Errorf("%d control files written, want 4 (cpuset.cpus, memory.swap.max, memory.max, pids.max)", n)
	}
}

// TestV2Controllers: a step uses each of cpuset, memory and pids its parent offers,
// and names as missing those a limit needs.
func TestV2Controllers(t *testing.T) {
	for _, c := range []struct {
		lim          Limits
		offered      string
		use, missing string
	}{
		{Limits{CPUs: []int{0}, PidsLimit: 10}, "cpuset cpu io memory hugetlb pids rdma misc", "cpuset,memory,pids", ""},
		{Limits{CPUs: []int{0}, PidsLimit: 10}, "hugetlb", "", "cpuset,pids"},
		{Limits{}, "hugetlb", "", ""},
		{Limits{PidsLimit: 10}, "memory", "memory", "pids"},
	} {
		use, missing := v2Controllers(c.lim, strings.Fields(c.offered))
		if strings.Join(use, ",") != c.use || strings.Join(missing, ",") != c.missing {
			t.Errorf("%+v in %q: use %v, missing %v; want %q, %q", c.lim, c.offered, use, missing, c.use, c.missing)
		}
	}
}

// TestStepParentV2: a step's cgroup goes beside gangrun's own, or in the root.
func TestStepParentV2(t *testing.T) {
	for own, want := range map[string]string{
		"/": "/",
		"/system.slice/gangrun-agent.service/supervisor": "/system.slice/gangrun-agent.service",
		"/user.slice/user-0.slice/session-3.scope":       "/user.slice/user-0.slice",
		"/top": "/",
	} {
		if got := stepParentV2(own); got != want {
			t.Errorf("stepParentV2(%q) = %q, want %q", own, got, want)
		}
	}
}

// TestDevicesV2: the device list handed to the library allows every device first and
// then carries the rules (the last match decides), and compiles into an eBPF program.
func TestDevicesV2(t *testing.T) {
	rules := []DeviceRule{{Type: "c", Major: NVIDIAMajor, Minor: 2, Access: "rwm"}, {Type: "c", Major: NVIDIAMajor, Minor: 3, Access: "rwm"}}
	devs := devicesV2(rules)
	if len(devs) != 3 || !devs[0].Allow || devs[0].Type != "a" || *devs[0].Major != -1 || *devs[0].Minor != -1 || devs[0].Access != "rwm" {
		t.Fatalf("first entry %+v, want allow a *:* rwm", devs[0])
	}
	for i, r := range rules {
		d := devs[i+1]
		if d.Allow || d.Type != "c" || *d.Major != NVIDIAMajor || *d.Minor != r.Minor || d.Access != "rwm" {
			t.Errorf("entry %d: %+v, want deny c 195:%d rwm", i+1, d, r.Minor)
		}
	}
	insts, _, err := cgroup2.DeviceFilter(devs)
	if err != nil || len(insts) == 0 {
		t.Errorf("DeviceFilter: %d instructions, %v", len(insts), err)
	}
}
