package topology

import (
	"bytes"
	"context"
	"encoding/xml"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

func TestLoadFileErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sparse := func(name string, size int64) string {
		p := write(name, "")
		if err := os.Truncate(p, size); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fifo := func(name string) string {
		p := filepath.Join(dir, name)
		if err := syscall.Mkfifo(p, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name, path, want string
	}{
		{"missing", filepath.Join(dir, "nope.json"), "topology file " + filepath.Join(dir, "nope.json") + ": no such file"},
		{"bad json", write("bad.json", "{\n  \"schema_version\": 1,\n  \"node\": x\n}"), "invalid JSON at line 3, column 11"},
		{"wrong type", write("type.json", `{"schema_version": 1, "gpus": [{"index": "zero"}]}`), `field "gpus[0].index": want an integer from -9223372036854775808 to 9223372036854775807, got a string`},
		{"no version", write("nover.json", `{"node": "a"}`), "no schema_version"},
		{"new version", write("v2.json", `{"schema_version": 2}`), "inventory written by a newer gangrun (schema_version 2; this one reads up to 1)"},
		{"version 0", write("v0.json", `{"schema_version": 0}`), "schema_version 0 is not supported (this gangrun reads 1)"},
		{"duplicate gpu", write("dup.json", `{"schema_version": 1, "gpus": [{"index": 0, "health": {"state": "healthy"}}, {"index": 0, "health": {"state": "healthy"}}]}`), "gpu index 0 appears twice"},
		{"bad link", write("link.json", `{"schema_version": 1, "gpus": [{"index": 0, "health": {"state": "healthy"}}], "gpu_links": [{"a": 0, "b": 3, "nvlinks": 1, "level": "PIX"}]}`), "gpu link 0-3 names an unknown gpu"},
		{"bad level", write("level.json", `{"schema_version": 1, "gpu_links": [{"a": 0, "b": 1, "level": "NV4"}]}`), `unknown PCIe level "NV4"`},
		{"bad state", write("state.json", `{"schema_version": 1, "gpus": [{"index": 0, "health": {"state": "sick"}}]}`), `gpu 0: health state "sick" is not healthy, degraded or failed`},
		{"too large", sparse("huge.json", MaxFileBytes+1), "larger than 16 MiB: not a recorded inventory"},
		{"endless device", "/dev/zero", "is a character device, want a regular file"},
		{"named pipe", fifo("fifo.json"), "is a named pipe (FIFO), want a regular file"},
		{"directory", dir, "is a directory, want a regular file"},
		{"unknown nic", write("nic.json", `{"schema_version": 1, "gpus": [{"index": 0, "health": {"state": "healthy"}, "nics": ["mlx5_9"]}]}`), `gpu 0: nic "mlx5_9" is not among rdma_devices`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadFile(tc.path)
			if err == nil {
				t.Fatalf("LoadFile succeeded, want an error containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q, want one line containing %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "topology file "+tc.path) {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

// TestDecodeShapeErrors: a value of the wrong JSON type is named by its path in the
// document and described in JSON's terms, never with a Go type name.
func TestDecodeShapeErrors(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"top level an array", `[1, 2]`, "line 1, column 2: the top level: want an object, got an array"},
		{"version a string", `{"schema_version": "1"}`, `field "schema_version": want an integer from -9223372036854775808 to 9223372036854775807, got a string`},
		{"links a string", `{"schema_version": 1, "gpus": [{"index": 0}, {"index": 1, "nvlinks": "x"}]}`, `field "gpus[1].nvlinks": want an array, got a string`},
		{"link a number", `{"schema_version": 1, "gpu_links": [{"a": 0, "b": 1}, 7]}`, `field "gpu_links[1]": want an object, got a number`},
		{"gpus an object", `{"schema_version": 1, "gpus": {"a": 1}}`, `field "gpus": want an array, got an object`},
		{"sockets a fraction", `{"schema_version": 1, "cpu": {"sockets": 1.5}}`, `field "cpu.sockets": want an integer from -9223372036854775808 to 9223372036854775807, got 1.5`},
		{"index out of range", `{"schema_version": 1, "gpus": [{"index": -99999999999999999999}]}`, `field "gpus[0].index": want an integer from -9223372036854775808 to 9223372036854775807, got -99999999999999999999`},
		{"memory negative", `{"schema_version": 1, "gpus": [{"index": 0, "memory_bytes": -1}]}`, `field "gpus[0].memory_bytes": want an integer from 0 to 18446744073709551615, got -1`},
		{"state a number", `{"schema_version": 1, "gpus": [{"index": 0, "health": {"state": 3}}]}`, `field "gpus[0].health.state": want a string, got a number`},
		{"level a number", `{"schema_version": 1, "gpu_links": [{"a": 0, "b": 1, "level": 2}]}`, `field "gpu_links[0].level": want a string, got a number`},
		{"mig a string", `{"schema_version": 1, "gpus": [{"index": 0, "mig_enabled": "yes"}]}`, `field "gpus[0].mig_enabled": want true or false, got a string`},
		{"nested key after arrays", `{"schema_version": 1, "numa_nodes": [{"id": 0}], "gpus": [{"index": 0, "nics": [1]}]}`, `field "gpus[0].nics[0]": want a string, got a number`},
		{"truncated", `{"schema_version": 1, "gpus": [`, "the file ends before the document does (truncated?)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.doc))
			if err == nil {
				t.Fatalf("Decode succeeded, want %q", tc.want)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error %q, want it to contain %q", msg, tc.want)
			}
			for _, goName := range []string{"struct {", "topology.", "[]", "int64", "*int", "uint64"} {
				if strings.Contains(msg, goName) {
					t.Errorf("error %q names a Go type (%q)", msg, goName)
				}
			}
		})
	}
}

func TestFileSource(t *testing.T) {
	src := FileSource(inventoryPath("dgx1"))
	inv, err := src.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if inv.Node != "dgx1-01" || len(inv.GPUs) != 8 {
		t.Errorf("node %s with %d GPUs", inv.Node, len(inv.GPUs))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := src.Inventory(ctx); err == nil {
		t.Error("cancelled context: no error")
	}
}

func TestLinkErrors(t *testing.T) {
	inv, err := LoadFile(inventoryPath("pcie-2socket"))
	if err != nil {
		t.Fatal(err)
	}
	for _, pair := range [][2]int{{0, 4}, {-1, 0}, {7, 7}} {
		if _, err := inv.Link(pair[0], pair[1]); err == nil {
			t.Errorf("Link(%d, %d) on a 4-GPU node: no error", pair[0], pair[1])
		}
	}
	if _, err := inv.GPUNICLevel(0, "mlx5_9"); err == nil {
		t.Error("GPUNICLevel with an unknown NIC: no error")
	}
}

func TestAllocatable(t *testing.T) {
	t.Run("whole GPUs", func(t *testing.T) {
		inv, err := LoadFile(inventoryPath("dgx-h100"))
		if err != nil {
			t.Fatal(err)
		}
		devs := inv.Allocatable()
		if len(devs) != 8 {
			t.Fatalf("%d devices, want 8", len(devs))
		}
		for i, d := range devs {
			if d.ID != string(rune('0'+i)) || d.GPU != i || d.Model != "NVIDIA H100 80GB HBM3" || d.MIGProfile != "" || d.UUID != inv.GPUs[i].UUID {
				t.Errorf("device %d: %+v", i, d)
			}
		}
	})
	t.Run("MIG instances that exist", func(t *testing.T) {
		inv, err := LoadFile(inventoryPath("dgx-a100-mig"))
		if err != nil {
			t.Fatal(err)
		}
		devs := inv.Allocatable()
		if len(devs) != 9 {
			t.Fatalf("%d devices, want 2 MIG devices and 7 GPUs: %+v", len(devs), devs)
		}
		g0, _ := inv.GPU(0)
		for k := 0; k < 2; k++ {
			d := devs[k]
			if d.ID != g0.MIGDevices[k].UUID || !strings.HasPrefix(d.ID, "MIG-") || d.GPU != 0 || d.MIGProfile != "3g.20gb" || d.MemoryBytes != 19968<<20 {
				t.Errorf("MIG device %d: %+v", k, d)
			}
		}
		if devs[2].ID != "1" {
			t.Errorf("after the MIG devices comes %+v, want GPU 1", devs[2])
		}
	})
	t.Run("failed GPUs are left out", func(t *testing.T) {
		inv, err := LoadFile(inventoryPath("dgx1"))
		if err != nil {
			t.Fatal(err)
		}
		inv.GPUs[3].Health = Health{Failed, []string{"Xid 79: GPU has fallen off the bus"}}
		inv.GPUs[4].Health = Health{Degraded, []string{"Xid 94: contained ECC error"}}
		var ids []string
		for _, d := range inv.Allocatable() {
			ids = append(ids, d.ID)
		}
		if want := []string{"0", "1", "2", "4", "5", "6", "7"}; !reflect.DeepEqual(ids, want) {
			t.Errorf("ids %v, want %v", ids, want)
		}
	})
}

func TestNCCLEnv(t *testing.T) {
	tests := []struct {
		fixture string
		want    []string
	}{
		{"dgx-h100", []string{"NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1", "NCCL_SOCKET_IFNAME=^lo,docker,veth,virbr"}},
		{"dgx1", []string{"NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1", "NCCL_SOCKET_IFNAME=^lo,docker,veth,virbr"}},
		{"pcie-2socket", []string{"NCCL_IB_GID_INDEX=3", "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1", "NCCL_SOCKET_IFNAME=^lo,docker,veth,virbr"}},
		{"cpu-only", []string{"NCCL_SOCKET_IFNAME=^lo,docker,veth,virbr"}},
	}
	for _, tc := range tests {
		inv, err := LoadFile(inventoryPath(tc.fixture))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range inv.NCCLEnv() {
			got = append(got, e.String())
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.fixture, got, tc.want)
		}
	}
}

// TestSocketIfnameExcludesContainerInterfaces checks the NCCL_SOCKET_IFNAME value, as
// NCCL reads it, against the interfaces of the container host.
func TestSocketIfnameExcludesContainerInterfaces(t *testing.T) {
	inv, err := LoadFile(inventoryPath("pcie-2socket"))
	if err != nil {
		t.Fatal(err)
	}
	list, err := ParseNCCLList(envValue(inv.NCCLEnv(), "NCCL_SOCKET_IFNAME"))
	if err != nil {
		t.Fatal(err)
	}
	var used []string
	for _, n := range inv.Netdevs {
		if list.Selects(n.Name, -1) {
			used = append(used, n.Name)
		}
	}
	if want := []string{"eno1", "ens3np0", "ens7np0"}; !reflect.DeepEqual(used, want) {
		t.Errorf("NCCL would use %v, want %v", used, want)
	}
}

func TestRoCEGIDIndexNeedsAgreement(t *testing.T) {
	inv, err := LoadFile(inventoryPath("pcie-2socket"))
	if err != nil {
		t.Fatal(err)
	}
	// Drop mlx5_1's v2 IPv4 entry at index 3: the ports no longer share an index.
	p := &inv.RDMADevices[1].Ports[0]
	p.GIDs = p.GIDs[:3]
	if v := envValue(inv.NCCLEnv(), "NCCL_IB_GID_INDEX"); v != "" {
		t.Errorf("NCCL_IB_GID_INDEX=%s with disagreeing ports, want none", v)
	}
}

func TestParseNCCLList(t *testing.T) {
	tests := []struct {
		in   string
		want NCCLList
		err  bool
	}{
		{"", NCCLList{}, false},
		{"mlx5", NCCLList{Entries: []NCCLListEntry{{"mlx5", -1}}}, false},
		{"=mlx5_0:1,mlx5_1:1", NCCLList{Exact: true, Entries: []NCCLListEntry{{"mlx5_0", 1}, {"mlx5_1", 1}}}, false},
		{"^=docker0", NCCLList{Exclude: true, Exact: true, Entries: []NCCLListEntry{{"docker0", -1}}}, false},
		{"^lo,,docker", NCCLList{Exclude: true, Entries: []NCCLListEntry{{"lo", -1}, {"docker", -1}}}, false},
		{"mlx5_0:x", NCCLList{}, true},
		{"mlx5_0:-1", NCCLList{}, true},
	}
	for _, tc := range tests {
		got, err := ParseNCCLList(tc.in)
		if (err != nil) != tc.err {
			t.Errorf("ParseNCCLList(%q) error %v, want error %v", tc.in, err, tc.err)
			continue
		}
		if err == nil && !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseNCCLList(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func TestNCCLListSelects(t *testing.T) {
	tests := []struct {
		list string
		name string
		port int
		want bool
	}{
		{"", "eth0", -1, true},
		{"^", "eth0", -1, false},
		{"mlx5_1", "mlx5_11", 1, true},
		{"=mlx5_1", "mlx5_11", 1, false},
		{"=mlx5_1", "mlx5_1", 1, true},
		{"=mlx5_1:1", "mlx5_1", 2, false},
		{"=mlx5_1:2", "mlx5_1", 2, true},
		{"^docker,lo", "docker0", -1, false},
		{"^docker,lo", "eth0", -1, true},
		{"^=docker0", "docker01", -1, true},
	}
	for _, tc := range tests {
		l, err := ParseNCCLList(tc.list)
		if err != nil {
			t.Fatal(err)
		}
		if got := l.Selects(tc.name, tc.port); got != tc.want {
			t.Errorf("%q selects %s:%d = %v, want %v", tc.list, tc.name, tc.port, got, tc.want)
		}
	}
}

func FuzzParseNCCLList(f *testing.F) {
	for _, s := range []string{"", "^lo,docker", "=mlx5_0:1,mlx5_1:1", "^=a:3,,b", "x:", ":1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseNCCLList(s)
		if err != nil {
			return
		}
		back, err := ParseNCCLList(l.String())
		if err != nil {
			t.Fatalf("String() of %q = %q does not parse: %v", s, l.String(), err)
		}
		if !reflect.DeepEqual(back, l) && !(len(back.Entries) == 0 && len(l.Entries) == 0 && back.Exclude == l.Exclude && back.Exact == l.Exact) {
			t.Fatalf("round trip of %q: %+v became %+v", s, l, back)
		}
	})
}

func TestCPUList(t *testing.T) {
	tests := []struct {
		in   string
		want []int
		out  string
		err  bool
	}{
		{"", nil, "", false},
		{"0-3,8", []int{0, 1, 2, 3, 8}, "0-3,8", false},
		{"8,0-3,2", []int{0, 1, 2, 3, 8}, "0-3,8", false},
		{"0-55,112-167", nil, "0-55,112-167", false},
		{"3-1", nil, "", true},
		{"a", nil, "", true},
		{"0-99999", nil, "", true},
	}
	for _, tc := range tests {
		got, err := ParseCPUList(tc.in)
		if (err != nil) != tc.err {
			t.Errorf("ParseCPUList(%q) error %v", tc.in, err)
		}
		if tc.want != nil && !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseCPUList(%q) = %v, want %v", tc.in, got, tc.want)
		}
		if !tc.err && FormatCPUList(got) != tc.out {
			t.Errorf("FormatCPUList(ParseCPUList(%q)) = %q, want %q", tc.in, FormatCPUList(got), tc.out)
		}
	}
}

func FuzzParseCPUList(f *testing.F) {
	for _, s := range []string{"0-3,8", "", "1,1,1", "5-2", "0-8191"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cpus, err := ParseCPUList(s)
		if err != nil {
			return
		}
		again, err := ParseCPUList(FormatCPUList(cpus))
		if err != nil || !reflect.DeepEqual(again, cpus) {
			t.Fatalf("%q: %v formats to %q which parses to %v (%v)", s, cpus, FormatCPUList(cpus), again, err)
		}
	})
}

// FuzzDecode: no input makes Decode panic, and whatever decodes re-encodes to JSON that
// decodes to the same bytes again.
func FuzzDecode(f *testing.F) {
	for _, name := range []string{"cpu-only", "pcie-2socket"} {
		b, err := os.ReadFile(inventoryPath(name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"schema_version": 1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		inv, err := Decode(data)
		if err != nil {
			return
		}
		out, err := inv.JSON()
		if err != nil {
			t.Fatal(err)
		}
		inv2, err := Decode(out)
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		out2, _ := inv2.JSON()
		if !bytes.Equal(out, out2) {
			t.Fatal("JSON not stable")
		}
	})
}

func TestLevelText(t *testing.T) {
	for l := LevelSelf; l <= LevelSYS; l++ {
		b, err := l.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back Level
		if err := back.UnmarshalText(b); err != nil || back != l {
			t.Errorf("%s round trip: %v %v", l, back, err)
		}
	}
	if _, err := Level(9).MarshalText(); err == nil {
		t.Error("Level(9) marshalled")
	}
	if (Link{NVLinks: 4, Level: LevelSYS}).String() != "NV4" || (Link{Level: LevelPXB}).String() != "PXB" {
		t.Error("Link.String")
	}
}

func TestNaturalLess(t *testing.T) {
	names := []string{"mlx5_10", "mlx5_2", "mlx5_1", "mlx5_11", "eth10", "eth9", "mlx4_0"}
	sorted := append([]string(nil), names...)
	for i := range sorted {
		for j := i + 1; j < len(sorted); j++ {
			if naturalLess(sorted[j], sorted[i]) {
				sorted[i], sorted[j] = sorted[j], sorted[i]
			}
		}
	}
	want := []string{"eth9", "eth10", "mlx4_0", "mlx5_1", "mlx5_2", "mlx5_10", "mlx5_11"}
	if !reflect.DeepEqual(sorted, want) {
		t.Errorf("%v, want %v", sorted, want)
	}
}

// xmlElem is a generic element for checking NCCL topology files with encoding/xml.
type xmlElem struct {
	XMLName xml.Name
	Attrs   []xml.Attr `xml:",any,attr"`
	Subs    []xmlElem  `xml:",any"`
}

func (e xmlElem) attr(k string) (string, bool) {
	for _, a := range e.Attrs {
		if a.Name.Local == k {
			return a.Value, true
		}
	}
	return "", false
}

// TestNCCLTopoXML checks the topology files against what NCCL's parser and topology
// code require: version 1, no declaration or tabs, at most 16 attributes per element,
// arch and vendor on every cpu (familyid/modelid on x86), class/busid/link attributes on
// every pci, dev/sm/rank/gdr on every gpu, dev on every net, and one gpu per GPU.
func TestNCCLTopoXML(t *testing.T) {
	for _, m := range nodeModels() {
		t.Run(m.fixture, func(t *testing.T) {
			inv, err := LoadFile(inventoryPath(m.fixture))
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := inv.WriteNCCLTopoXML(&buf); err != nil {
				t.Fatal(err)
			}
			text := buf.String()
			if strings.Contains(text, "\t") || strings.HasPrefix(text, "<?") {
				t.Error("NCCL's parser takes neither tabs nor an XML declaration")
			}
			var root xmlElem
			if err := xml.Unmarshal(buf.Bytes(), &root); err != nil {
				t.Fatalf("not well-formed: %v", err)
			}
			if v, _ := root.attr("version"); root.XMLName.Local != "system" || v != "1" {
				t.Fatalf("root <%s version=%q>", root.XMLName.Local, v)
			}
			counts := map[string]int{}
			var walk func(e xmlElem)
			walk = func(e xmlElem) {
				counts[e.XMLName.Local]++
				if len(e.Attrs) > 16 {
					t.Errorf("<%s> has %d attributes", e.XMLName.Local, len(e.Attrs))
				}
				required := map[string][]string{
					"cpu":    {"numaid", "arch", "vendor"},
					"pci":    {"busid", "class", "link_speed", "link_width"},
					"gpu":    {"dev", "sm", "rank", "gdr"},
					"net":    {"name", "dev", "speed", "port"},
					"nvlink": {"target", "count", "tclass"},
				}[e.XMLName.Local]
				if e.XMLName.Local == "cpu" && inv.CPU.Arch == "x86_64" {
					required = append(required, "familyid", "modelid")
				}
				for _, k := range required {
					if _, ok := e.attr(k); !ok {
						t.Errorf("<%s> lacks %s", e.XMLName.Local, k)
					}
				}
				for _, s := range e.Subs {
					walk(s)
				}
			}
			walk(root)
			if counts["gpu"] != len(inv.GPUs) {
				t.Errorf("%d gpu elements for %d GPUs", counts["gpu"], len(inv.GPUs))
			}
			if counts["net"] != strings.Count(envValue(inv.NCCLEnv(), "NCCL_IB_HCA"), ":") {
				t.Errorf("%d net elements, NCCL_IB_HCA %q", counts["net"], envValue(inv.NCCLEnv(), "NCCL_IB_HCA"))
			}
			if counts["cpu"] == 0 {
				t.Error("no cpu element")
			}
		})
	}
}

// BenchmarkProbe measures a full probe of the 8-GPU, 8-HCA machines: go-nvml's mock
// server and the extracted sysfs fixture (target: under 50 ms per probe).
func BenchmarkProbe(b *testing.B) {
	for _, m := range []*nodeModel{dgxH100(), dgxA100()} {
		b.Run(m.fixture, func(b *testing.B) {
			root := m.sysfsRoot(b)
			ctx := context.Background()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				opts := m.probeOptions(b, root) // a fresh mock: it records every call
				b.StartTimer()
				inv, err := NewProber(opts).Inventory(ctx)
				if err != nil || len(inv.GPUs) != 8 || len(inv.RDMADevices) != 8 {
					b.Fatalf("probe: %v", err)
				}
			}
		})
	}
}
