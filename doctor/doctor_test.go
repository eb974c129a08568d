package doctor

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/hashicorp/consul/api"

	"github.com/gangrun/gangrun/acl"
	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/consultest"
	"github.com/gangrun/gangrun/internal/mungetest"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/topology"
)

// byCheck indexes results by check name, failing the test when a check is missing or
// its line is not one line.
func byCheck(t *testing.T, results []Result) map[string]Result {
	t.Helper()
	out := map[string]Result{}
	for _, r := range results {
		if strings.ContainsAny(r.Line(), "\n\r") {
			t.Errorf("check %s: line %q is not one line", r.Check, r.Line())
		}
		out[r.Check] = r
	}
	for _, c := range Checks {
		if _, ok := out[c]; !ok {
			t.Errorf("no result for check %s", c)
		}
	}
	if len(results) != len(Checks) {
		t.Errorf("%d results for %d checks", len(results), len(Checks))
	}
	return out
}

// want checks one result's status and that its detail holds every part.
func want(t *testing.T, r Result, status Status, parts ...string) {
	t.Helper()
	if r.Status != status {
		t.Errorf("%s: %s, want %s: %s", r.Check, r.Status, status, r.Line())
	}
	for _, p := range parts {
		if !strings.Contains(r.Detail, p) {
			t.Errorf("%s: detail lacks %q: %s", r.Check, p, r.Detail)
		}
	}
	if (status == Fail || status == Warn) && r.Fix == "" && r.Check != "version" {
		t.Errorf("%s: %s without a fix: %s", r.Check, status, r.Line())
	}
}

// fixture extracts topology's recorded sysfs tree name (topology/testdata/sysfs).
func fixture(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("tar", "-xzf", filepath.Join("..", "topology", "testdata", "sysfs", name+".tar.gz"), "-C", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("tar: %v\n%s", err, out)
	}
	return dir
}

// noNVML is go-nvml's real binding pointed at a library that is not there: a node
// without the NVIDIA driver, whatever this machine has.
func noNVML(t *testing.T) nvml.Interface {
	return nvml.New(nvml.WithLibraryPath(filepath.Join(t.TempDir(), "libnvidia-ml.so.1")))
}

// mockA100 is go-nvml's DGX A100 mock server with its GPUs at the bus ids given (a
// recorded bus's), and the calls the probe makes that the mock leaves unset answering
// as a driver that does not support them would.
func mockA100(busIDs []string) nvml.Interface {
	srv := dgxa100.New()
	for i, dv := range srv.Devices {
		d := dv.(*server.Device)
		bus := busIDs[i]
		d.PciBusID = strings.ToUpper("0000" + bus)
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			long := strings.ToUpper("0000" + bus)
			for j := 0; j < len(long); j++ {
				p.BusId[j] = int8(long[j])
			}
			p.PciDeviceId = d.Config.PciDeviceId
			return p, nvml.SUCCESS
		}
		d.GetCpuAffinityFunc = func(int) ([]uint, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
		d.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) { return 0, nvml.SUCCESS }
		d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 0, false, false, nvml.SUCCESS }
		d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 40, nvml.SUCCESS }
		d.GetTemperatureThresholdFunc = func(nvml.TemperatureThresholds) (uint32, nvml.Return) { return 90, nvml.SUCCESS }
		d.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		if d.GetMinorNumberFunc == nil {
			d.GetMinorNumberFunc = func() (int, nvml.Return) { return i, nvml.SUCCESS }
		}
		if d.GetTopologyCommonAncestorFunc == nil {
			d.GetTopologyCommonAncestorFunc = func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		}
	}
	return srv
}

// kernelClockStatus is what the clock check's kernel part gives on this machine.
func kernelClockStatus(t *testing.T) Status {
	synced, _, err := kernelSynced()
	if err != nil || !synced {
		return Warn
	}
	return OK
}

// TestDoctorOnAHealthyNode: this machine with a real Consul dev agent and a real munged:
// Consul answers (its ACLs off: a warning), munged answers, a step's cgroup is made
// and removed (cgroup v1: this machine's hierarchies, as root), no GPU (a warning,
// said plainly), eth0 up, no topology file, the clock compared with the Consul server's
// (the dev agent is a server), no agent registered. Nothing fails: exit 0.
func TestDoctorOnAHealthyNode(t *testing.T) {
	agent := consultest.Start(t)
	munged := mungetest.Start(t)
	results := Run(context.Background(), Config{Consul: consultest.ConsulStore(t, agent), MungeSocket: munged.Socket,
		Node: "n1", Version: "v-test", NVML: noNVML(t)})
	got := byCheck(t, results)
	want(t, got["consul"], Warn, "Consul at "+agent.Addr+" answers (leader ", "its ACLs are off")
	want(t, got["munge"], OK, "munged answers at "+munged.Socket, "decodes its own credential (uid 0)", "shows only on another node")
	want(t, got["cgroup"], OK, "a step's cgroup made and removed (cgroup v1, controllers cpuset, memory, pids, devices")
	want(t, got["gpus"], Warn, "no NVIDIA GPU: none on the PCI bus, and NVML library libnvidia-ml.so.1 not found", "offers no GPUs")
	want(t, got["nics"], OK, "interfaces up: ", "no RDMA device")
	if strings.Contains(got["nics"].Detail, "interfaces up: none") {
		t.Errorf("nics: %s", got["nics"].Detail)
	}
	want(t, got["topology"], Skip, "no topology-file")
	want(t, got["clock"], kernelClockStatus(t), "of the Consul servers' clock (the Consul agent at "+agent.Addr+" is a server)")
	want(t, got["version"], OK, "this binary is v-test; no agent has registered yet")
	if Failed(results) {
		t.Errorf("Failed = true for %v", results)
	}
	for _, d := range []string{"cpuset", "memory", "pids", "devices"} {
		if m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", d, "**", "gangrun-doctor-*")); len(m) > 0 {
			t.Errorf("trial cgroups left behind: %v", m)
		}
	}
}

// TestDoctorConsulDown: a Consul that is not there fails the consul check naming the
// address and what to do; munged is still checked (an agent without Consul's word on
// its ACLs needs it), the clock and the versions are not compared. Exit 1.
func TestDoctorConsulDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	s, err := store.NewConsulFrom(closed, "--consul")
	if err != nil {
		t.Fatal(err)
	}
	munged := mungetest.Start(t)
	start := time.Now()
	results := Run(context.Background(), Config{Consul: s, MungeSocket: munged.Socket, Node: "n1", Version: "v-test", NVML: noNVML(t)})
	got := byCheck(t, results)
	want(t, got["consul"], Fail, "cannot reach Consul at "+closed+" (from --consul): connection refused")
	if !strings.Contains(got["consul"].Fix, "systemctl start consul") {
		t.Errorf("consul fix: %q", got["consul"].Fix)
	}
	want(t, got["munge"], OK, "munged answers")
	clock := got["clock"]
	if clock.Status == OK || clock.Status == Fail || !strings.Contains(clock.Detail, "not compared with the Consul servers': Consul does not answer") {
		t.Errorf("clock: %s", clock.Line())
	}
	want(t, got["version"], Skip, "this binary is v-test; the cluster's versions not read: Consul does not answer")
	if !Failed(results) {
		t.Error("Failed = false with Consul down")
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the run took %v with Consul down", d)
	}
}

// TestDoctorMungeDown: munged not answering fails where the agent would refuse to start
// (--auth munge; by default with Consul's ACLs off), warns where it would use Consul's
// ACLs instead, and --auth none is a warning of its own whatever munged does.
func TestDoctorMungeDown(t *testing.T) {
	agent := consultest.Start(t)
	s := consultest.ConsulStore(t, agent)
	gone := filepath.Join(t.TempDir(), "munge.socket.2")
	for _, tc := range []struct {
		auth   string
		status Status
		part   string
	}{
		{"", Fail, "and Consul's ACLs are off: the agent refuses to start"},
		{"munge", Fail, "the agent's auth is munge: it will not start"},
		{"none", Warn, "the agent's auth is none: no credential is checked"},
	} {
		t.Run("auth="+tc.auth, func(t *testing.T) {
			got := byCheck(t, Run(context.Background(), Config{Consul: s, MungeSocket: gone, Auth: tc.auth, Node: "n1", NVML: noNVML(t)}))
			want(t, got["munge"], tc.status, tc.part)
			if tc.auth != "none" && !strings.Contains(got["munge"].Detail, gone) {
				t.Errorf("munge: the detail does not name the socket: %s", got["munge"].Detail)
			}
		})
	}
	// Consul's ACLs on: without munged the agent tells users apart by their tokens. The
	// doctor has no token here: the consul check fails saying so.
	aclAgent := consultest.StartACL(t)
	aclStore, err := store.NewConsulToken(aclAgent.Addr, "")
	if err != nil {
		t.Fatal(err)
	}
	got := byCheck(t, Run(context.Background(), Config{Consul: aclStore, MungeSocket: gone, Node: "n1", NVML: noNVML(t)}))
	want(t, got["consul"], Fail, "has its ACLs on, and no token was given or Consul does not know it")
	want(t, got["munge"], Warn, "the agent will tell users apart by Consul's ACL tokens instead")
}

// TestDoctorTopologyFile: a topology file that does not read fails naming it; a
// recorded DGX H100 reads, and differs from this machine's probe (no GPU): a warning.
func TestDoctorTopologyFile(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"schema_version": 1, "gpus": [`), 0o644); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join("..", "topology", "testdata", "inventories", "dgx-h100.json")
	for _, tc := range []struct {
		file   string
		status Status
		parts  []string
	}{
		{bad, Fail, []string{"--topology-file " + bad}},
		{filepath.Join(dir, "missing.json"), Fail, []string{"missing.json", "no such file"}},
		{good, Warn, []string{good + " reads as node", "8 GPUs", "this node's NVML lists 0"}},
	} {
		t.Run(filepath.Base(tc.file), func(t *testing.T) {
			r := &run{cfg: Config{TopologyFile: tc.file, Node: "n1", NVML: noNVML(t)}}
			res := r.topology(context.Background())
			res.Check = "topology"
			want(t, res, tc.status, tc.parts...)
		})
	}
}

// TestDoctorGPUs: NVML against what the PCI bus shows, on recorded nodes: a DGX A100's
// bus with go-nvml's DGX A100 mock lists its 8 GPUs; the same bus without a driver
// fails (8 GPUs on the bus, none listed); a bus with more GPUs than NVML lists fails
// naming the missing ones.
func TestDoctorGPUs(t *testing.T) {
	a100 := fixture(t, "dgx-a100")
	for _, tc := range []struct {
		name   string
		root   string
		lib    nvml.Interface
		status Status
		parts  []string
	}{
		{"driver", a100, mockA100(topology.NVIDIAGPUsOnPCI(a100)), OK, []string{"NVML lists 8 GPUs (8× Mock NVIDIA A100-SXM4-40GB)", "driver "}},
		{"no driver", a100, noNVML(t), Fail, []string{"the PCI bus shows 8 NVIDIA GPUs (0000:07:00.0, 0000:0f:00.0, 0000:47:00.0 and 5 more), but NVML library libnvidia-ml.so.1 not found"}},
		{"cpu only", fixture(t, "cpu-only"), noNVML(t), Warn, []string{"no NVIDIA GPU: none on the PCI bus"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &run{cfg: Config{SysfsRoot: tc.root, NVML: tc.lib, Node: "n1"}}
			res := r.gpus(context.Background())
			res.Check = "gpus"
			want(t, res, tc.status, tc.parts...)
		})
	}
	// A GPU the bus shows and NVML does not list.
	inv := []topology.GPU{{PCIBusID: "0000:07:00.0"}}
	if got := missingFromNVML([]string{"0000:07:00.0", "0000:0f:00.0"}, inv); len(got) != 1 || got[0] != "0000:0f:00.0" {
		t.Errorf("missingFromNVML = %v", got)
	}
}

// TestDoctorNICs: link state on recorded nodes and this one: an InfiniBand host with
// one port down and no interface up fails, with an Ethernet interface up warns naming
// the port; a DGX H100's ports all active is fine; an advertise-addr on no interface
// fails, one on this machine's interface is named, a loopback one warns.
func TestDoctorNICs(t *testing.T) {
	var ownIP, ownIf string
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && i.Flags&net.FlagUp != 0 && !p.Addr().IsLoopback() && p.Addr().Is4() && ownIP == "" {
				ownIP, ownIf = p.Addr().String(), i.Name
			}
		}
	}
	if ownIP == "" {
		t.Fatal("this machine has an interface up with an IPv4 address (the tests' Consul and agents use its network)")
	}
	// The same host with an Ethernet interface up: the port down is a warning.
	withEth := fixture(t, "ib-port-down")
	eth := filepath.Join(withEth, "sys", "class", "net", "eth9")
	if err := os.MkdirAll(eth, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"operstate": "up\n", "type": "1\n", "mtu": "1500\n"} {
		if err := os.WriteFile(filepath.Join(eth, name), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, root, advertise string
		status                Status
		parts                 []string
	}{
		{"ib port down", fixture(t, "ib-port-down"), "", Fail, []string{"interfaces up: none", "not active: mlx5_5/1 DOWN (Polling)"}},
		{"ib port down, eth up", withEth, "", Warn, []string{"interfaces up: eth9", "not active: mlx5_5/1 DOWN (Polling)"}},
		{"dgx h100", fixture(t, "dgx-h100"), "", OK, []string{"RDMA ports active: mlx5_0/1 400 Gb/sec (4X NDR)"}},
		{"advertise elsewhere", "", "192.0.2.77", Fail, []string{"advertise-addr 192.0.2.77 is on no interface here that is up"}},
		{"advertise here", "", ownIP, OK, []string{"advertise-addr " + ownIP + " on " + ownIf}},
		{"advertise loopback", "", "127.0.0.1", Warn, []string{"advertise-addr 127.0.0.1 is a loopback address"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &run{cfg: Config{SysfsRoot: tc.root, NVML: noNVML(t), Node: "n1", AdvertiseAddr: tc.advertise}}
			res := r.nics(context.Background())
			res.Check = "nics"
			want(t, res, tc.status, tc.parts...)
		})
	}
}

// TestClockOutcome: a skew from the servers' clock, with its uncertainty, against the
// session TTL.
func TestClockOutcome(t *testing.T) {
	ttl := 20 * time.Second
	for _, tc := range []struct {
		skew, unc time.Duration
		status    Status
		part      string
	}{
		{0, 500 * time.Millisecond, OK, "within 500ms of the Consul servers' clock"},
		{1200 * time.Millisecond, 600 * time.Millisecond, OK, "within 1.8s"},
		{-3 * time.Second, 600 * time.Millisecond, Warn, "is 3s behind this one (±600ms): within the 20s session TTL"},
		{25 * time.Second, 600 * time.Millisecond, Fail, "is 25s ahead of this one (±600ms): more than the 20s session TTL"},
		{20*time.Second + 500*time.Millisecond, 600 * time.Millisecond, Warn, "within the 20s session TTL"},
	} {
		got := clockOutcome(tc.skew, tc.unc, ttl)
		if got.Status != tc.status || !strings.Contains(got.Detail, tc.part) {
			t.Errorf("clockOutcome(%v, %v) = %s %q, want %s with %q", tc.skew, tc.unc, got.Status, got.Detail, tc.status, tc.part)
		}
	}
}

// TestDoctorVersions: the releases the registered agents' node records carry
// (allocator.NodeRecord.Release, as an agent registers it), against this binary's: none
// carrying one (agents of before 0.1.0) is said so; agents of this release are fine;
// one of another release, one whose record is of a newer schema than this binary reads,
// or this node's own agent on another release, warns.
func TestDoctorVersions(t *testing.T) {
	agent := consultest.Start(t)
	s := consultest.ConsulStore(t, agent)
	kv := s.Client().KV()
	put := func(node, record string) {
		t.Helper()
		if _, err := kv.Put(&api.KVPair{Key: "gangrun/cluster/nodes/" + node, Value: []byte(record)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	check := func() Result {
		r := &run{cfg: Config{Consul: s, Node: "n1", Version: "0.2.0"}, consulUp: true}
		res := r.version(context.Background())
		res.Check = "version"
		return res
	}
	want(t, check(), OK, "this binary is 0.2.0; no agent has registered yet")
	put("n1", `{"name": "n1"}`)
	put("n2", `{"name": "n2"}`)
	want(t, check(), Skip, "the 2 registered agents' records carry no version (agents of before 0.1.0")
	// As an agent registers: the schema first, the release in "release".
	reg := func(node, release string) {
		t.Helper()
		b, err := schema.Marshal(schema.Node, allocator.NodeRecord{Name: node, Release: release})
		if err != nil {
			t.Fatal(err)
		}
		put(node, string(b))
	}
	reg("n1", "0.2.0")
	reg("n2", "0.2.0")
	want(t, check(), OK, "the registered agents: 0.2.0 on 2 (n1, n2)")
	reg("n2", "0.1.0")
	want(t, check(), Warn, "0.1.0 on 1 (n2), 0.2.0 on 1 (n1)")
	put("n2", `{"schema": 99, "name": "n2", "release": "9.0.0"}`)
	want(t, check(), Warn, "0.2.0 on 1 (n1), a newer release (node record schema 99) on 1 (n2)")
	put("n2", `{"name": "n2"}`)
	want(t, check(), Warn, "0.2.0 on 1 (n1), no version on 1 (n2)")
	reg("n1", "0.1.0")
	res := check()
	want(t, res, Warn, "the agent registered as n1 runs 0.1.0")
	if !strings.Contains(res.Fix, "systemctl restart gangrun-agent") {
		t.Errorf("fix %q", res.Fix)
	}
}

// TestDoctorCgroup: the trial step cgroup on this machine's hierarchies: cgroup v1 as
// the node is (as root: made and removed with every controller a step uses); cgroup v2
// on the hybrid node's v2 mount (GANGRUN_CGROUP2_ROOT, as an operator may set it),
// whose controllers are bound to v1: a warning naming the limit that cannot be applied;
// and a GANGRUN_CGROUP2_ROOT that is no cgroup2 mount: steps would run unconfined, a
// warning saying why.
func TestDoctorCgroup(t *testing.T) {
	for _, tc := range []struct {
		name, root string
		status     Status
		parts      []string
	}{
		{"v1", "", OK, []string{"(cgroup v1, controllers cpuset, memory, pids, devices"}},
		// This hybrid node's v2 hierarchy holds no controller a step limits with (they are
		// bound to v1): the step's cgroup is made, its limits are not.
		{"v2", "/sys/fs/cgroup/unified", Warn, []string{"(cgroup v2, controllers devices", "made from this shell's cgroup", "but cgroup v2 offers no pids controller"}},
		{"not a cgroup", t.TempDir(), Warn, []string{"steps run unconfined", "is not the root of a cgroup2 mount"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GANGRUN_CGROUP2_ROOT", tc.root)
			res := trialCgroup()
			res.Check = "cgroup"
			want(t, res, tc.status, tc.parts...)
		})
	}
}

// TestDoctorConsulACLs: Consul with its ACLs on (default deny): the agents' token from
// gangrun acl bootstrap is what an agent needs (ok, and the clock and the versions are
// read with it); a user's token fails, naming whose it is.
func TestDoctorConsulACLs(t *testing.T) {
	agent := consultest.StartACL(t)
	mgmt, err := store.NewConsulToken(agent.Addr, agent.ManagementToken)
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := acl.Bootstrap(context.Background(), mgmt.Client())
	if err != nil {
		t.Fatal(err)
	}
	alice, err := acl.MintUser(context.Background(), mgmt.Client(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	munged := mungetest.Start(t)
	for _, tc := range []struct {
		token  string
		status Status
		part   string
	}{
		{tokens.Agent, OK, "with the agents' token"},
		{alice, Fail, "but the token is alice's, not the agents'"},
	} {
		s, err := store.NewConsulToken(agent.Addr, tc.token)
		if err != nil {
			t.Fatal(err)
		}
		got := byCheck(t, Run(context.Background(), Config{Consul: s, MungeSocket: munged.Socket, Node: "n1", Version: "v-test", NVML: noNVML(t)}))
		want(t, got["consul"], tc.status, tc.part)
		if tc.status == OK {
			want(t, got["clock"], kernelClockStatus(t), "(the Consul agent at "+agent.Addr+" is a server)")
			want(t, got["version"], OK, "no agent has registered yet")
		}
	}
}
