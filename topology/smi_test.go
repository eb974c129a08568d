package topology

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// smiFixtures holds nvidia-smi output collected from public issues and guides (its
// README names each source).
const smiFixtures = "testdata/nvidia-smi"

func loadSMI(t *testing.T, name string) *Inventory {
	t.Helper()
	inv, err := LoadFile(filepath.Join(smiFixtures, name))
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// TestNvidiaSMIFixtures reads every collected `nvidia-smi topo -m` and checks what a
// reader of the text sees in it: the GPUs and NICs, chosen links, affinities and the
// notes saying what the text lacks.
func TestNvidiaSMIFixtures(t *testing.T) {
	type link struct {
		a, b  int
		want  string // Link.String(): NV# or the level
		level Level  // the PCIe level kept for an NVLink pair
	}
	type nic struct {
		gpu   int
		name  string
		level Level
	}
	cases := []struct {
		file   string
		gpus   int
		nics   []string
		links  []link
		gpuNIC []nic
		near   map[int][]string // GPU.NICs
		numa   map[int]int      // GPU index → NUMA node
		cpus   map[int]string   // GPU index → CPU affinity
		notes  []string         // substrings of notes that must be there
		absent []string         // and must not
	}{
		{file: "a100-8gpu-numa-spaces.txt", gpus: 8,
			links: []link{{0, 7, "NV12", LevelSYS}, {0, 3, "NV12", LevelNODE}},
			numa:  map[int]int{0: 0, 7: 1}, cpus: map[int]string{3: "0-23", 4: "24-47"},
			notes: []string{"taken as NODE within a NUMA node, SYS across", "no PCI bus ids"}, absent: []string{"NIC"}},
		{file: "h100-8gpu-cpulists.txt", gpus: 8, links: []link{{1, 6, "NV18", LevelSYS}},
			cpus: map[int]string{0: "0-51,104-155", 7: "52-103,156-207"}},
		{file: "dgx1-v100-tabs-cpu-affinity-only.txt", gpus: 8,
			links: []link{{0, 1, "NV1", LevelSYS}, {0, 3, "NV2", LevelSYS}, {0, 4, "SYS", LevelSYS}, {4, 7, "NV2", LevelSYS}},
			numa:  map[int]int{0: -1}, cpus: map[int]string{5: "0-95"}},
		{file: "two-gpu-nv2-numa-na.txt", gpus: 2, links: []link{{0, 1, "NV2", LevelSYS}}, numa: map[int]int{1: -1}},
		{file: "two-gpu-phb.txt", gpus: 2, links: []link{{0, 1, "PHB", LevelPHB}}, cpus: map[int]string{1: "0-11"}},
		{file: "rtx5090-2gpu-phb-legend.txt", gpus: 2, links: []link{{0, 1, "PHB", LevelPHB}}, numa: map[int]int{0: 0}},
		{file: "aws-g5-one-gpu-vm.txt", gpus: 1, numa: map[int]int{0: 0}, cpus: map[int]string{0: "0-31"},
			absent: []string{"NVLink: only"}},
		{file: "l40s-8gpu-1nic-spaces.txt", gpus: 8, nics: []string{"NIC0"},
			links:  []link{{0, 3, "NODE", LevelNODE}, {3, 4, "SYS", LevelSYS}},
			gpuNIC: []nic{{0, "NIC0", LevelSYS}}, numa: map[int]int{4: 1}, cpus: map[int]string{7: "90-179"},
			notes: []string{"no NIC Legend", "NCCL_IB_HCA is left to NCCL"}},
		{file: "pcie-4090-8gpu-2nic-no-legend.txt", gpus: 8, nics: []string{"NIC0", "NIC1"},
			links:  []link{{6, 7, "SYS", LevelSYS}},
			gpuNIC: []nic{{6, "NIC0", LevelPHB}, {6, "NIC1", LevelPHB}, {0, "NIC1", LevelSYS}},
			near:   map[int][]string{6: {"NIC0", "NIC1"}}, cpus: map[int]string{4: "56-111,168-223"}},
		{file: "hgx-h100-12nic-sglang-spaces.txt", gpus: 8,
			nics:   []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_10", "mlx5_11"},
			links:  []link{{0, 7, "NV18", LevelSYS}, {2, 3, "NV18", LevelNODE}},
			gpuNIC: []nic{{0, "mlx5_0", LevelPIX}, {1, "mlx5_3", LevelPIX}, {4, "mlx5_8", LevelPIX}, {7, "mlx5_11", LevelPIX}, {7, "mlx5_0", LevelSYS}},
			near:   map[int][]string{0: {"mlx5_0", "mlx5_1", "mlx5_2"}, 5: {"mlx5_9"}},
			cpus:   map[int]string{0: "4,6,8,10,12", 5: "1,3,5,7,9,11"}, numa: map[int]int{3: 0, 4: 1}},
		// nvidia-smi topo -mp of the same kind of node: PCIe levels, no NVLink.
		{file: "hgx-h100-12nic-topo-mp.txt", gpus: 8, nics: []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_10", "mlx5_11"},
			links:  []link{{0, 1, "NODE", LevelNODE}, {0, 4, "SYS", LevelSYS}},
			gpuNIC: []nic{{5, "mlx5_9", LevelPIX}}, cpus: map[int]string{0: "0,2,4,6,8,10"},
			notes: []string{"PCIe paths only (nvidia-smi topo -mp)"}, absent: []string{"taken as NODE within"}},
		// Older drivers named the NIC columns by their device; an excerpt of the first
		// rows of a DGX-2's 16 GPUs.
		{file: "dgx2-old-mlx5-header-excerpt.txt", gpus: 16, nics: []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"},
			links:  []link{{0, 15, "NV6", LevelSYS}, {3, 9, "NV6", LevelSYS}, {5, 9, "SYS", LevelSYS}},
			gpuNIC: []nic{{0, "mlx5_0", LevelPIX}, {2, "mlx5_0", LevelPXB}, {3, "mlx5_3", LevelNODE}, {9, "mlx5_0", LevelSYS}},
			near:   map[int][]string{2: {"mlx5_1"}}, cpus: map[int]string{3: "0-23,48-71", 4: ""},
			notes: []string{"rows missing from the matrix (an excerpt?): GPU4 ", "taken as SYS (without NVLink)"}, absent: []string{"no NIC Legend"}},
	}
	files, _ := filepath.Glob(filepath.Join(smiFixtures, "*.txt"))
	if len(files) != len(cases) {
		t.Errorf("%d fixtures, %d cases: every fixture needs a case", len(files), len(cases))
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			inv := loadSMI(t, c.file)
			if len(inv.GPUs) != c.gpus {
				t.Fatalf("%d GPUs, want %d", len(inv.GPUs), c.gpus)
			}
			var names []string
			for _, d := range inv.RDMADevices {
				names = append(names, d.Name)
				if len(d.Ports) != 0 {
					t.Errorf("%s: ports %v recorded, but the text has none", d.Name, d.Ports)
				}
			}
			if strings.Join(names, " ") != strings.Join(c.nics, " ") {
				t.Errorf("NICs %v, want %v", names, c.nics)
			}
			for _, l := range c.links {
				got, err := inv.Link(l.a, l.b)
				if err != nil || got.String() != l.want || got.Level != l.level {
					t.Errorf("GPU%d-GPU%d: %v level %v (%v), want %s level %v", l.a, l.b, got, got.Level, err, l.want, l.level)
				}
			}
			for _, n := range c.gpuNIC {
				if got, err := inv.GPUNICLevel(n.gpu, n.name); err != nil || got != n.level {
					t.Errorf("GPU%d-%s: %v (%v), want %v", n.gpu, n.name, got, err, n.level)
				}
			}
			for g, want := range c.near {
				if got := inv.GPUs[g].NICs; strings.Join(got, " ") != strings.Join(want, " ") {
					t.Errorf("GPU%d NICs %v, want %v", g, got, want)
				}
			}
			for g, want := range c.numa {
				if got := inv.GPUs[g].NUMANode; got != want {
					t.Errorf("GPU%d NUMA %d, want %d", g, got, want)
				}
			}
			for g, want := range c.cpus {
				if got := inv.GPUs[g].CPUAffinity; got != want {
					t.Errorf("GPU%d CPU affinity %q, want %q", g, got, want)
				}
			}
			notes := strings.Join(inv.Notes, "\n")
			for _, n := range append(c.notes, smiNoteSource, smiNoteNoPCITree, smiNoteHealth) {
				if !strings.Contains(notes, n) {
					t.Errorf("no note %q in:\n%s", n, notes)
				}
			}
			for _, n := range c.absent {
				if strings.Contains(notes, n) {
					t.Errorf("note %q should not be there:\n%s", n, notes)
				}
			}
			for _, g := range inv.GPUs {
				if g.Health.State != Healthy || g.PCIBusID != "" || g.UUID != "" {
					t.Errorf("GPU%d: %+v; want healthy, no bus id, no UUID (topo -m prints none)", g.Index, g)
				}
			}
		})
	}
}

// matrixRow reads a GPU row of a collected matrix the simplest way: its label and the
// codes after it, one per device column.
var matrixRow = regexp.MustCompile(`^\s*(GPU\d+|NIC\d+|mlx5_\d+)\s+((?:(?:X|NV\d+|PIX|PXB|PHB|NODE|SYS)\s*)+)`)

// TestNvidiaSMIMatrixReadsBack: every code a complete collected matrix prints for a
// GPU row is what the inventory answers for that pair, and what `gangrun topo` prints.
func TestNvidiaSMIMatrixReadsBack(t *testing.T) {
	for _, file := range []string{"a100-8gpu-numa-spaces.txt", "h100-8gpu-cpulists.txt", "dgx1-v100-tabs-cpu-affinity-only.txt",
		"l40s-8gpu-1nic-spaces.txt", "pcie-4090-8gpu-2nic-no-legend.txt", "hgx-h100-12nic-sglang-spaces.txt", "hgx-h100-12nic-topo-mp.txt",
		"two-gpu-phb.txt", "rtx5090-2gpu-phb-legend.txt"} {
		inv := loadSMI(t, file)
		var printed bytes.Buffer
		if err := inv.WriteMatrix(&printed); err != nil {
			t.Fatal(err)
		}
		in, _ := os.ReadFile(filepath.Join(smiFixtures, file))
		rows := 0
		for _, line := range strings.Split(string(in), "\n") {
			m := matrixRow.FindStringSubmatch(line)
			if m == nil || !strings.HasPrefix(m[1], "GPU") {
				continue
			}
			rows++
			codes := strings.Fields(m[2])
			var a int
			if _, err := fmtSscan(m[1][3:], &a); err != nil {
				t.Fatal(err)
			}
			for col, code := range codes {
				var got string
				if col < len(inv.GPUs) {
					l, err := inv.Link(a, col)
					if err != nil {
						t.Fatal(err)
					}
					got = l.String()
				} else {
					l, err := inv.GPUNICLevel(a, inv.RDMADevices[col-len(inv.GPUs)].Name)
					if err != nil {
						t.Fatal(err)
					}
					got = l.String()
				}
				if got != code {
					t.Errorf("%s: %s column %d: inventory says %s, the text %s", file, m[1], col, got, code)
				}
			}
			// gangrun topo prints the same row.
			if !regexp.MustCompile(`(?m)^` + m[1] + `\s+` + strings.Join(codes, `\s+`) + `\s`).Match(printed.Bytes()) {
				t.Errorf("%s: gangrun topo does not print row %s as %v:\n%s", file, m[1], codes, printed.String())
			}
		}
		if rows != len(inv.GPUs) {
			t.Errorf("%s: %d GPU rows read back, want %d", file, rows, len(inv.GPUs))
		}
	}
}

func fmtSscan(s string, v *int) (int, error) {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, os.ErrInvalid
		}
		n = n*10 + int(c-'0')
	}
	*v = n
	return 1, nil
}

// TestNvidiaSMIGolden writes each collected recording's inventory as `gangrun topo
// --json` does and compares with testdata/golden/nvidia-smi/ (go test ./topology -run
// TestNvidiaSMIGolden -update rewrites them); the JSON reads back as the same inventory.
func TestNvidiaSMIGolden(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(smiFixtures, "*.txt"))
	xmls, _ := filepath.Glob(filepath.Join(smiFixtures, "*.xml"))
	for _, f := range append(files, xmls...) {
		inv, err := LoadFile(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out, err := inv.JSON()
		if err != nil {
			t.Fatal(err)
		}
		golden := filepath.Join("testdata", "golden", "nvidia-smi", filepath.Base(f)+".json")
		if *update {
			if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(golden, out, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatalf("%v (go test ./topology -run TestNvidiaSMIGolden -update)", err)
		}
		if !bytes.Equal(out, want) {
			t.Errorf("%s: inventory differs from %s:\n%s", f, golden, out)
		}
		back, err := Decode(out)
		if err != nil {
			t.Fatalf("%s: the JSON does not read back: %v", f, err)
		}
		again, _ := back.JSON()
		if !bytes.Equal(again, out) {
			t.Errorf("%s: JSON round trip changed it", f)
		}
	}
}

// TestNvidiaSMIWithQueryXML: nvidia-smi -q -x (telegraf's recording of a g5's A10G)
// after a topo -m (ai-on-eks's g5, another machine of the same kind) in one file adds
// the GPU's name, UUID, bus id and memory; the XML alone gives the GPUs without links;
// an A100 in MIG mode lists no instances (the XML has no MIG UUIDs).
func TestNvidiaSMIWithQueryXML(t *testing.T) {
	topo, _ := os.ReadFile(filepath.Join(smiFixtures, "aws-g5-one-gpu-vm.txt"))
	xml, _ := os.ReadFile(filepath.Join(smiFixtures, "telegraf-a10g.xml"))
	inv, err := ParseNvidiaSMI(append(append([]byte{}, topo...), xml...), "g5")
	if err != nil {
		t.Fatal(err)
	}
	g := inv.GPUs[0]
	if g.Name != "NVIDIA A10G" || g.UUID != "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94" || g.PCIBusID != "0000:00:1e.0" ||
		g.MemoryBytes != 23028<<20 || g.NUMANode != 0 || g.CPUAffinity != "0-31" || inv.Driver != "515.105.01" || inv.CUDADriver != "11.7" {
		t.Errorf("combined: %+v driver %q cuda %q", g, inv.Driver, inv.CUDADriver)
	}
	if strings.Contains(strings.Join(inv.Notes, "\n"), "no PCI bus ids") {
		t.Errorf("notes say bus ids are missing: %q", inv.Notes)
	}
	// The XML first, then the matrix: the same.
	again, err := ParseNvidiaSMI(append(append([]byte{}, xml...), topo...), "g5")
	if err != nil || again.GPUs[0].UUID != g.UUID || again.GPUs[0].CPUAffinity != "0-31" {
		t.Errorf("XML first: %v %+v", err, again)
	}

	alone := loadSMI(t, "telegraf-tesla-t4.xml")
	if len(alone.GPUs) != 1 || alone.GPUs[0].Name != "Tesla T4" || len(alone.GPULinks) != 0 ||
		!strings.Contains(strings.Join(alone.Notes, "\n"), smiNoteNoMatrix) {
		t.Errorf("XML alone: %+v notes %q", alone.GPUs, alone.Notes)
	}

	mig := loadSMI(t, "telegraf-a100-sxm4-v12.xml")
	if !mig.GPUs[0].MIGEnabled || len(mig.GPUs[0].MIGDevices) != 0 || len(mig.Allocatable()) != 0 ||
		!strings.Contains(strings.Join(mig.Notes, "\n"), "MIG mode on with 4 instances, not listed") {
		t.Errorf("MIG: %+v allocatable %v notes %q", mig.GPUs[0], mig.Allocatable(), mig.Notes)
	}
	// What cannot be written from a recording is refused in one line.
	if err := loadSMI(t, "hgx-h100-12nic-sglang-spaces.txt").WriteNCCLTopoXML(&bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "not recorded") {
		t.Errorf("NCCL topology file from topo -m: %v", err)
	}
}

// TestNvidiaSMINodeName: a recording is named after its file until --node-name (ForNode)
// says otherwise; gangrun's JSON keeps its own name.
func TestNvidiaSMINodeName(t *testing.T) {
	path := filepath.Join(smiFixtures, "two-gpu-phb.txt")
	if inv := loadSMI(t, "two-gpu-phb.txt"); inv.Node != "two-gpu-phb" || !inv.FromNvidiaSMI() {
		t.Errorf("node %q from nvidia-smi %v", inv.Node, inv.FromNvidiaSMI())
	}
	inv, err := ForNode(context.Background(), path, "gpu-b")
	if err != nil || inv.Node != "gpu-b" {
		t.Errorf("ForNode: %v %q", err, inv.Node)
	}
	js, err := ForNode(context.Background(), inventoryPath("dgx1"), "gpu-b")
	if err != nil || js.Node == "gpu-b" || js.FromNvidiaSMI() {
		t.Errorf("ForNode of a JSON recording: %v %q", err, js.Node)
	}
}

// TestNvidiaSMIErrors: what is not nvidia-smi's output, or holds two nodes, is refused
// in one line naming the line and the value.
func TestNvidiaSMIErrors(t *testing.T) {
	header := "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
	cases := []struct {
		name, in, want string
	}{
		{"nothing", "hello\n", "neither an nvidia-smi topo -m matrix"},
		{"bad code", header + "GPU0\t X \tNV2\t0-7\t0\nGPU1\tNVL\t X \t0-7\t0\n", `line 3: row GPU1, column GPU0: "NVL" is not one of nvidia-smi's codes`},
		{"X off the diagonal", header + "GPU0\t X \t X \t0-7\t0\n", `line 2: row GPU0, column GPU1: "X", but X marks the device itself only`},
		{"short row", header + "GPU0\t X \n", "line 2: row GPU0 has 1 cells, want 2"},
		{"GPUs out of order", "\tGPU0\tGPU2\tCPU Affinity\nGPU0\t X \tPIX\t0-7\n", `line 1: column "GPU2": want GPU1`},
		{"row twice", header + "GPU0\t X \tPIX\t0-7\t0\nGPU0\t X \tPIX\t0-7\t0\n", "line 3: row GPU0 appears twice"},
		{"two nodes", header + "GPU0\t X \tPIX\t0-7\t0\nGPU1\tPIX\t X \t0-7\t0\n\n" + header + "GPU0\t X \tSYS\t0-7\t0\nGPU1\tSYS\t X \t0-7\t0\n",
			"line 5: GPU0 to GPU1 is SYS, but PIX in the matrix of line 1: give one node's nvidia-smi output per file"},
		{"other devices", header + "GPU0\t X \tPIX\t0-7\t0\nGPU1\tPIX\t X \t0-7\t0\n\n\tGPU0\tCPU Affinity\nGPU0\t X \t0-7\n", "a second matrix with other devices"},
		{"XML unclosed", "<?xml version=\"1.0\"?>\n<nvidia_smi_log><gpu>", "line 1: nvidia-smi -q -x XML without its closing </nvidia_smi_log>"},
		{"XML of another node", header + "GPU0\t X \tPIX\t0-7\t0\nGPU1\tPIX\t X \t0-7\t0\n<nvidia_smi_log><gpu id=\"00000000:01:00.0\"></gpu></nvidia_smi_log>",
			"nvidia-smi -q -x lists 1 GPUs, the topo -m matrix 2"},
	}
	for _, c := range cases {
		_, err := ParseNvidiaSMI([]byte(c.in), "n")
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error %v, want one line containing %q", c.name, err, c.want)
		}
	}
	// Through LoadFile, the error names the file and says both readings failed.
	path := filepath.Join(t.TempDir(), "node.txt")
	if err := os.WriteFile(path, []byte("GPU0 is fine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadFile(path)
	if err == nil || !strings.HasPrefix(err.Error(), "topology file "+path+": not a gangrun inventory (JSON) nor nvidia-smi output that reads: neither") {
		t.Errorf("LoadFile: %v", err)
	}
}

// TestNvidiaSMIMerge: topo -m and topo -mp of one node in one file: NV# from the first,
// the PCIe levels from the second (the DeepEP #397 node's -mp, with the NV18 its
// NVSwitch gives, written here as topo -m would print it).
func TestNvidiaSMIMerge(t *testing.T) {
	mp, _ := os.ReadFile(filepath.Join(smiFixtures, "hgx-h100-12nic-topo-mp.txt"))
	var m strings.Builder
	for _, line := range strings.Split(string(mp), "\n") {
		switch {
		case strings.Contains(line, "topo -mp"):
			line = strings.Replace(line, "topo -mp", "topo -m", 1)
		case strings.HasPrefix(line, "  PIX  ="):
			line += "\n  NV#  = Connection traversing a bonded set of # NVLinks"
		}
		if strings.HasPrefix(line, "GPU") {
			cells := strings.Split(line, "\t")
			for i := 1; i <= 8; i++ {
				if strings.TrimSpace(cells[i]) != "X" {
					cells[i] = "NV18"
				}
			}
			line = strings.Join(cells, "\t")
		}
		m.WriteString(line + "\n")
	}
	inv, err := ParseNvidiaSMI([]byte(m.String()+string(mp)), "hgx")
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := inv.Link(0, 4); l.NVLinks != 18 || l.Level != LevelSYS {
		t.Errorf("GPU0-GPU4: %+v, want NV18 over SYS", l)
	}
	if l, _ := inv.Link(0, 1); l.NVLinks != 18 || l.Level != LevelNODE {
		t.Errorf("GPU0-GPU1: %+v, want NV18 over NODE", l)
	}
	notes := strings.Join(inv.Notes, "\n")
	if strings.Contains(notes, "taken as NODE within") || strings.Contains(notes, "PCIe paths only") {
		t.Errorf("merged notes: %s", notes)
	}
}

// FuzzParseNvidiaSMI feeds arbitrary text to ParseNvidiaSMI: never a panic or a
// multi-line error; what it accepts is a valid inventory whose JSON reads back the same
// and whose matrix prints.
func FuzzParseNvidiaSMI(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(smiFixtures, "*"))
	for _, file := range files {
		if strings.HasSuffix(file, ".md") {
			continue
		}
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("\tGPU0\tmlx5_0\tCPU Affinity\nGPU0\t X \tSOC\t0-7\nmlx5_0\tPSB\t X \n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		inv, err := ParseNvidiaSMI(in, "fuzz")
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		if err := inv.Validate(); err != nil {
			t.Fatalf("accepted an invalid inventory: %v", err)
		}
		out, err := inv.JSON()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Decode(out)
		if err != nil {
			t.Fatalf("JSON does not read back: %v\n%s", err, out)
		}
		again, _ := back.JSON()
		if !bytes.Equal(again, out) {
			t.Fatalf("JSON round trip changed it")
		}
		if err := inv.WriteMatrix(&bytes.Buffer{}); err != nil {
			t.Fatal(err)
		}
	})
}
