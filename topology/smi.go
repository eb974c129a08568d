package topology

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// A node recorded by nvidia-smi, for users who cannot run gangrun there: what
//
//	nvidia-smi topo -m        (or topo -mp: PCIe paths only)
//	nvidia-smi -q -x          (the XML query: names, UUIDs, bus ids, memory, MIG)
//
// print, one of them or both one after the other in one file
// (`{ nvidia-smi topo -m; nvidia-smi -q -x; } > node.txt`), read by ParseNvidiaSMI into
// an Inventory. The matrix's codes are nvidia-smi's legend, which this package's Level
// and Link already use (see Level):
//
//	X     Self                                     the diagonal
//	NV#   a bonded set of # NVLinks                GPULink.NVLinks = #
//	PIX   at most a single PCIe bridge             LevelPIX
//	PXB   multiple PCIe bridges, no host bridge    LevelPXB
//	PHB   a PCIe Host Bridge (typically the CPU)   LevelPHB
//	NODE  between host bridges of one NUMA node    LevelNODE
//	SYS   the SMP interconnect between NUMA nodes  LevelSYS
//
// and the older drivers' codes: SOC ("the SMP link between CPU sockets", before NODE and
// SYS were told apart) is read as SYS, PSB ("a single on-board PCIe switch") as PIX.
// What the text lacks is said in the inventory's Notes (smiNote*).

// MaxNvidiaSMIGPUs bounds the GPUs a recording may list (NVML's own limit is far below).
const MaxNvidiaSMIGPUs = 1024

// The notes ParseNvidiaSMI adds, saying what an nvidia-smi recording does not hold.
const (
	smiNoteSource    = "read from nvidia-smi output, not probed by gangrun"
	smiNoteNoXML     = "no PCI bus ids, GPU names, UUIDs or memory sizes: nvidia-smi topo -m does not print them (add nvidia-smi -q -x to the file)"
	smiNoteNoPorts   = "no NIC port state, link layer, rate or GIDs: nvidia-smi topo -m does not print them, so NCCL_IB_HCA is left to NCCL (it uses every HCA it finds)"
	smiNoteNVLink    = "NVLink: only the number of links per GPU pair (NV#); no per-link state, version or remote device"
	smiNoteNVLevel   = "PCIe level between NVLink-connected GPUs not recorded (topo -m prints NV#; topo -mp prints the level): taken as NODE within a NUMA node, SYS across"
	smiNoteMP        = "PCIe paths only (nvidia-smi topo -mp): NVLink not recorded, counted as none"
	smiNoteNoPCITree = "no PCI tree: PCIe levels are nvidia-smi's, as recorded"
	smiNoteNoCPU     = "CPU architecture, vendor and model not recorded: no NCCL topology file can be written"
	smiNoteHealth    = "GPU health not recorded: taken as healthy"
	smiNoteNoMatrix  = "no nvidia-smi topo -m matrix: GPU links and NICs unknown (every GPU pair taken as SYS)"
	smiNoteNoLegend  = "no NIC Legend: NICs named by their column (NIC0, NIC1, ...), not by their RDMA device"
)

// ParseNvidiaSMI reads the output of `nvidia-smi topo -m` (or `-mp`), of
// `nvidia-smi -q -x`, or of both, into an inventory of the node named node. The text
// may be tab- or space-separated (as printed, or as a terminal or web page copied it),
// indented, wrapped in Markdown fences, with ANSI underlining, shell prompts and other
// lines around it; the columns may be the current ones (GPU0.., NIC0.. with a NIC
// Legend, CPU Affinity, NUMA Affinity, GPU NUMA ID) or older drivers' (the RDMA device
// names, mlx5_0.., as column names; CPU Affinity alone). A matrix whose rows were cut
// short (an excerpt) keeps the links its rows and columns give. Two matrices of one node
// (topo -m and topo -mp) are merged: NV# from one, PCIe levels from the other.
//
// Errors name the line: a matrix cell that is not one of nvidia-smi's codes, a row of
// the wrong length, two matrices of different nodes, an XML that does not parse or
// whose GPUs do not match the matrix's; input with neither is an error too.
func ParseNvidiaSMI(data []byte, node string) (*Inventory, error) {
	text, xmlDoc, err := splitSMIXML(data)
	if err != nil {
		return nil, err
	}
	ms, err := findMatrices(text)
	if err != nil {
		return nil, err
	}
	var q *smiLog
	if xmlDoc != nil {
		if q, err = parseSMIXML(xmlDoc); err != nil {
			return nil, err
		}
	}
	if len(ms) == 0 && q == nil {
		return nil, errors.New("neither an nvidia-smi topo -m matrix (a header line starting GPU0) nor nvidia-smi -q -x XML found")
	}
	m, err := mergeMatrices(ms)
	if err != nil {
		return nil, err
	}
	inv := &Inventory{SchemaVersion: SchemaVersion, Node: node, CPU: CPUInfo{Vendor: "unknown"}}
	inv.Notes = append(inv.Notes, smiNoteSource)
	if m != nil {
		m.fill(inv)
	} else {
		inv.Notes = append(inv.Notes, smiNoteNoMatrix)
	}
	if q != nil {
		if err := q.fill(inv, m != nil); err != nil {
			return nil, err
		}
	} else {
		inv.Notes = append(inv.Notes, smiNoteNoXML)
	}
	if len(inv.RDMADevices) > 0 {
		inv.Notes = append(inv.Notes, smiNoteNoPorts)
	}
	inv.Notes = append(inv.Notes, smiNoteNoPCITree, smiNoteNoCPU, smiNoteHealth)
	for i := range inv.GPUs {
		inv.GPUs[i].Health = Health{State: Healthy}
	}
	inv.normalize()
	if err := inv.Validate(); err != nil {
		return nil, err
	}
	return inv, nil
}

// looksLikeJSON reports whether a recording is gangrun's JSON (its first non-blank
// byte is '{'), not nvidia-smi output.
func looksLikeJSON(data []byte) bool {
	t := bytes.TrimLeft(data, " \t\r\n\ufeff")
	return len(t) > 0 && t[0] == '{'
}

// splitSMIXML cuts nvidia-smi -q -x's document (from "<?xml" or "<nvidia_smi_log" to
// "</nvidia_smi_log>") out of data; the rest is text.
func splitSMIXML(data []byte) (text []byte, doc []byte, err error) {
	start := bytes.Index(data, []byte("<?xml"))
	if i := bytes.Index(data, []byte("<nvidia_smi_log")); i >= 0 && (start < 0 || i < start) {
		start = i
	}
	if start < 0 {
		return data, nil, nil
	}
	endTag := []byte("</nvidia_smi_log>")
	end := bytes.Index(data[start:], endTag)
	if end < 0 {
		return nil, nil, fmt.Errorf("line %d: nvidia-smi -q -x XML without its closing </nvidia_smi_log>", lineOf(data, start))
	}
	end += start + len(endTag)
	text = append(append([]byte{}, data[:start]...), data[end:]...)
	return text, data[start:end], nil
}

func lineOf(data []byte, offset int) int { return bytes.Count(data[:offset], []byte("\n")) + 1 }

// ansiEscape matches terminal escape sequences (nvidia-smi underlines the matrix's
// header on a terminal: "\x1b[4mGPU0\x1b[0m").
var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;]*[A-Za-z]`)

// smiMatrix is one `nvidia-smi topo -m` matrix as read.
type smiMatrix struct {
	line    int      // input line of the header
	devices []string // column names: GPU0.., NIC0.. or mlx5_0..
	gpus    []int    // the GPUs' indices, in column order
	// cells[row][col]: the code printed, "" when the row is missing (an excerpt).
	cells [][]string
	// Per GPU row: CPU Affinity, NUMA Affinity ("" when not printed).
	cpus, numa []string
	rowsSeen   []bool
	legend     map[string]string // NIC0 → mlx5_0
	hasLegend  bool
	sawLegend  bool // a "Legend:" block followed it
	legendNV   bool // the legend lists NV#: a topo -m matrix (topo -mp's has no NV# line)
	pcieOnly   bool // topo -mp
	hasNUMA    bool
	tail       []string // the columns after the devices: CPU Affinity[, NUMA Affinity[, GPU NUMA ID]]
	closed     bool     // a line that is not one of its rows came after its rows
}

var (
	gpuName = regexp.MustCompile(`^GPU(\d+)$`)
	nicName = regexp.MustCompile(`^NIC(\d+)$`)
	// nicLegend is a line of "NIC Legend:": "  NIC0: mlx5_0".
	nicLegend = regexp.MustCompile(`^\s*(NIC\d+):\s*(\S+)\s*$`)
	// deviceName is an RDMA device's name as nvidia-smi prints it (mlx5_0, bnxt_re1).
	deviceName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]*$`)
	// codeCell is one of nvidia-smi topo's codes.
	codeCell = regexp.MustCompile(`^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|PSB)$`)
)

// trailing columns after the devices, as printed.
const (
	colCPUAffinity  = "CPU Affinity"
	colNUMAAffinity = "NUMA Affinity"
	colGPUNUMAID    = "GPU NUMA ID"
)

// findMatrices finds every matrix in text with its NIC Legend and Legend.
func findMatrices(data []byte) ([]*smiMatrix, error) {
	text := ansiEscape.ReplaceAllString(strings.ReplaceAll(string(data), "\r\n", "\n"), "")
	lines := strings.Split(text, "\n")
	var ms []*smiMatrix
	var cur *smiMatrix
	inNICLegend, inLegend := false, false
	for i, raw := range lines {
		lineNo := i + 1
		trimmed := strings.TrimSpace(raw)
		fields := smiFields(raw)
		switch {
		case len(fields) > 0 && fields[0] == "GPU0" && isSMIHeader(fields):
			cur = &smiMatrix{line: lineNo, legend: map[string]string{}}
			if err := cur.header(fields); err != nil {
				return nil, fmt.Errorf("line %d: %w", lineNo, err)
			}
			ms = append(ms, cur)
			inNICLegend, inLegend = false, false
			continue
		case trimmed == "NIC Legend:":
			inNICLegend, inLegend = true, false
			if cur != nil {
				cur.hasLegend, cur.closed = true, true
			}
			continue
		case trimmed == "Legend:":
			inLegend, inNICLegend = true, false
			if cur != nil {
				cur.sawLegend, cur.closed = true, true
			}
			continue
		}
		if cur == nil {
			continue
		}
		if inNICLegend {
			if m := nicLegend.FindStringSubmatch(raw); m != nil {
				if !deviceName.MatchString(m[2]) {
					return nil, fmt.Errorf("line %d: NIC Legend: %s is %q, not an RDMA device name", lineNo, m[1], m[2])
				}
				cur.legend[m[1]] = m[2]
				continue
			}
			if trimmed != "" {
				inNICLegend = false
			}
			continue
		}
		if inLegend {
			if strings.HasPrefix(trimmed, "NV#") {
				cur.legendNV = true
			}
			continue
		}
		if cur.closed || len(fields) == 0 {
			if len(fields) == 0 && cur.anyRow() {
				cur.closed = true
			}
			continue
		}
		if r := cur.rowOf(fields[0]); r >= 0 {
			if err := cur.row(r, raw, fields); err != nil {
				return nil, fmt.Errorf("line %d: %w", lineNo, err)
			}
		} else if cur.anyRow() {
			cur.closed = true // prose after the matrix may name GPU0 too
		}
	}
	// A "topo -mp" command line belongs to the first matrix after it; a Legend without
	// NV# under a matrix without NV# cells is topo -mp's (topo -m always lists NV#).
	for i, raw := range lines {
		if t := strings.TrimSpace(raw); strings.Contains(t, "topo -mp") || strings.Contains(t, "topo -p -m") {
			for _, m := range ms {
				if m.line > i+1 {
					m.pcieOnly = true
					break
				}
			}
		}
	}
	for _, m := range ms {
		if m.sawLegend && !m.legendNV && !m.anyNV() {
			m.pcieOnly = true
		}
	}
	return ms, nil
}

// smiFields splits a matrix line into cells: at tabs when the line has any (keeping
// empty cells, trimmed), else at runs of blanks with nvidia-smi's multi-word column
// names kept whole.
func smiFields(line string) []string {
	line = strings.TrimRight(line, " \r")
	if strings.Contains(line, "\t") {
		parts := strings.Split(strings.TrimLeft(line, " "), "\t")
		if len(parts) > 0 && strings.TrimSpace(parts[0]) == "" {
			parts = parts[1:] // the header's empty corner cell
		}
		out := make([]string, len(parts))
		for i, p := range parts {
			out[i] = strings.TrimSpace(p)
		}
		return out
	}
	f := strings.Fields(line)
	var out []string
	for i := 0; i < len(f); i++ {
		switch {
		case i+1 < len(f) && (f[i] == "CPU" || f[i] == "NUMA") && f[i+1] == "Affinity":
			out = append(out, f[i]+" Affinity")
			i++
		case i+2 < len(f) && f[i] == "GPU" && f[i+1] == "NUMA" && f[i+2] == "ID":
			out = append(out, colGPUNUMAID)
			i += 2
		default:
			out = append(out, f[i])
		}
	}
	return out
}

// isSMIHeader reports whether the fields are a matrix header: GPU0, then device names,
// then (usually) the affinity columns.
func isSMIHeader(f []string) bool {
	for _, c := range f {
		if c == colCPUAffinity {
			return true
		}
		if c != "" && !gpuName.MatchString(c) && !nicName.MatchString(c) && !(strings.Contains(c, "_") && deviceName.MatchString(c)) {
			return false
		}
	}
	return len(f) > 1 // no affinity column (a cut header): at least two devices
}

// header reads the column names.
func (m *smiMatrix) header(f []string) error {
	for _, c := range f {
		switch c {
		case "":
			continue
		case colCPUAffinity, colNUMAAffinity, colGPUNUMAID:
			if c == colNUMAAffinity {
				m.hasNUMA = true
			}
			m.tail = append(m.tail, c)
			continue
		}
		if len(m.tail) > 0 {
			continue // a column newer drivers may add after the affinities
		}
		if !gpuName.MatchString(c) && !deviceName.MatchString(c) {
			return fmt.Errorf("column %q: not a GPU or NIC name", c)
		}
		if len(m.devices) >= 4*MaxNvidiaSMIGPUs {
			return fmt.Errorf("more than %d columns", 4*MaxNvidiaSMIGPUs)
		}
		for _, d := range m.devices {
			if d == c {
				return fmt.Errorf("column %q appears twice", c)
			}
		}
		if g := gpuName.FindStringSubmatch(c); g != nil {
			n, err := strconv.Atoi(g[1])
			if err != nil || n >= MaxNvidiaSMIGPUs {
				return fmt.Errorf("column %q: GPU index out of range", c)
			}
			if n != len(m.gpus) {
				return fmt.Errorf("column %q: want GPU%d (GPUs are numbered from 0, in order)", c, len(m.gpus))
			}
			if len(m.devices) > len(m.gpus) {
				return fmt.Errorf("column %q after a NIC column: GPUs come first", c)
			}
			m.gpus = append(m.gpus, n)
		}
		m.devices = append(m.devices, c)
	}
	n := len(m.devices)
	m.cells = make([][]string, n)
	for i := range m.cells {
		m.cells[i] = make([]string, n)
	}
	m.cpus = make([]string, len(m.gpus))
	m.numa = make([]string, len(m.gpus))
	m.rowsSeen = make([]bool, n)
	return nil
}

func (m *smiMatrix) rowOf(label string) int {
	for i, d := range m.devices {
		if d == label {
			return i
		}
	}
	return -1
}

// row reads the row of device r: a code per device column, then, for a GPU, its CPU
// and NUMA affinity. With tabs the cells are positional (an empty CPU Affinity stays
// empty; nvidia-smi writes an empty cell before GPU NUMA ID); with blanks the affinity
// cells are taken from the right.
func (m *smiMatrix) row(r int, raw string, f []string) error {
	if m.rowsSeen[r] {
		return fmt.Errorf("row %s appears twice in one matrix", m.devices[r])
	}
	m.rowsSeen[r] = true
	n := len(m.devices)
	cells := f[1:]
	if len(cells) < n {
		return fmt.Errorf("row %s has %d cells, want %d (one per column %s)", m.devices[r], len(cells), n, strings.Join(m.devices, " "))
	}
	for c := 0; c < n; c++ {
		code := cells[c]
		if !codeCell.MatchString(code) {
			return fmt.Errorf("row %s, column %s: %q is not one of nvidia-smi's codes (X, NV#, PIX, PXB, PHB, NODE, SYS)", m.devices[r], m.devices[c], code)
		}
		if (code == "X") != (c == r) {
			return fmt.Errorf("row %s, column %s: %q, but X marks the device itself only", m.devices[r], m.devices[c], code)
		}
		m.cells[r][c] = code
	}
	if r >= len(m.gpus) {
		return nil // a NIC's row has no affinity
	}
	rest := cells[n:]
	if !strings.Contains(raw, "\t") && len(rest) < len(m.tail) {
		// Blanks lost an empty cell: the one missing is the first (an empty CPU
		// Affinity), so the cells line up from the right.
		pad := make([]string, len(m.tail)-len(rest))
		rest = append(pad, rest...)
	}
	for i, c := range m.tail {
		if i >= len(rest) {
			break
		}
		v := rest[i]
		switch c {
		case colCPUAffinity:
			if _, err := ParseCPUList(cpuCell(v)); err != nil {
				return fmt.Errorf("row %s: CPU Affinity %q is not a CPU list", m.devices[r], v)
			}
			m.cpus[r] = v
		case colNUMAAffinity:
			// One node ("0"), or a list of them where a GPU is close to several.
			if _, err := ParseCPUList(cpuCell(v)); err != nil {
				return fmt.Errorf("row %s: NUMA Affinity %q is not a NUMA node or list of them", m.devices[r], v)
			}
			m.numa[r] = v
		}
	}
	return nil
}

// anyRow reports whether any row was read.
func (m *smiMatrix) anyRow() bool {
	for _, s := range m.rowsSeen {
		if s {
			return true
		}
	}
	return false
}

func (m *smiMatrix) anyNV() bool {
	for _, row := range m.cells {
		for _, c := range row {
			if strings.HasPrefix(c, "NV") {
				return true
			}
		}
	}
	return false
}

// code returns the code between devices a and b, from a's row or, when that row is
// missing, b's; "" when neither was printed.
func (m *smiMatrix) code(a, b int) string {
	if c := m.cells[a][b]; c != "" {
		return c
	}
	return m.cells[b][a]
}

// mergeMatrices merges the matrices of one node: the first's columns, NV# from any,
// PCIe codes from any. Matrices of different devices, or disagreeing codes, are an
// error: the file holds two nodes.
func mergeMatrices(ms []*smiMatrix) (*smiMatrix, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	base := ms[0]
	for _, o := range ms[1:] {
		if strings.Join(o.devices, " ") != strings.Join(base.devices, " ") {
			return nil, fmt.Errorf("line %d: a second matrix with other devices (%s) than line %d's (%s): give one node's nvidia-smi output per file",
				o.line, strings.Join(o.devices, " "), base.line, strings.Join(base.devices, " "))
		}
		n := len(base.devices)
		for a := 0; a < n; a++ {
			for b := 0; b < n; b++ {
				x, y := base.cells[a][b], o.cells[a][b]
				switch {
				case y == "":
				case x == "":
					base.cells[a][b] = y
				case x == y:
				case strings.HasPrefix(x, "NV") && !strings.HasPrefix(y, "NV"):
					base.cells[a][b] = x + "/" + y // NV from topo -m, the level from -mp
				case strings.HasPrefix(y, "NV") && !strings.HasPrefix(x, "NV"):
					base.cells[a][b] = y + "/" + x
				case strings.Contains(x, "/"):
				default:
					return nil, fmt.Errorf("line %d: %s to %s is %s, but %s in the matrix of line %d: give one node's nvidia-smi output per file",
						o.line, base.devices[a], base.devices[b], y, x, base.line)
				}
			}
		}
		for g := range base.gpus {
			if base.cpus[g] == "" {
				base.cpus[g] = o.cpus[g]
			}
			if base.numa[g] == "" {
				base.numa[g] = o.numa[g]
			}
		}
		for k, v := range o.legend {
			base.legend[k] = v
		}
		base.hasLegend = base.hasLegend || o.hasLegend
		base.pcieOnly = base.pcieOnly && o.pcieOnly
		base.hasNUMA = base.hasNUMA || o.hasNUMA
		for i := range base.rowsSeen {
			base.rowsSeen[i] = base.rowsSeen[i] || o.rowsSeen[i]
		}
	}
	return base, nil
}

// parseCode reads one cell: NVLinks and, when printed, the PCIe level (ok false when
// the cell shows NV# only).
func parseCode(c string) (nv int, level Level, hasLevel bool) {
	for _, part := range strings.Split(c, "/") {
		switch {
		case strings.HasPrefix(part, "NV"):
			nv, _ = strconv.Atoi(part[2:])
		case part == "X":
			level, hasLevel = LevelSelf, true
		case part == "SOC": // older drivers: across CPU sockets
			level, hasLevel = LevelSYS, true
		case part == "PSB": // older drivers: a single on-board PCIe switch
			level, hasLevel = LevelPIX, true
		case part != "":
			if l, err := ParseLevel(part); err == nil {
				level, hasLevel = l, true
			}
		}
	}
	return nv, level, hasLevel
}

// fill puts the matrix into inv: GPUs with their affinity, GPU links, NICs and the
// levels between them, each GPU's nearest NICs, the NUMA nodes, and notes on what the
// matrix could not say.
func (m *smiMatrix) fill(inv *Inventory) {
	m.fillGPUs(inv)
	missing, nvLevelGuessed := m.fillGPULinks(inv)
	missing += m.fillNICs(inv)
	assignNearestNICs(inv)
	// NUMA nodes: the CPUs of the first GPU on each (nvidia-smi's CPU Affinity is its
	// NUMA node's CPUs).
	seen := map[int]bool{}
	for _, g := range inv.GPUs {
		if g.NUMANode >= 0 && !seen[g.NUMANode] {
			seen[g.NUMANode] = true
			inv.NUMANodes = append(inv.NUMANodes, NUMANode{ID: g.NUMANode, Socket: -1, CPUs: g.CPUAffinity})
		}
	}
	m.addNotes(inv, missing, nvLevelGuessed)
}

// fillGPUs adds a GPU per matrix GPU row, with its CPU affinity and NUMA node.
func (m *smiMatrix) fillGPUs(inv *Inventory) {
	for g := range len(m.gpus) {
		gpu := GPU{Index: g, NUMANode: -1, CPUAffinity: cpuCell(m.cpus[g])}
		if n, err := strconv.Atoi(m.numa[g]); err == nil && n >= 0 {
			gpu.NUMANode = n
		}
		inv.GPUs = append(inv.GPUs, gpu)
	}
}

// fillGPULinks adds the link between each pair of GPUs. It returns how many pairs were
// printed nowhere (taken as SYS), and whether a level under NVLink was guessed from the
// GPUs' NUMA nodes (a cell with NV# alone).
func (m *smiMatrix) fillGPULinks(inv *Inventory) (missing int, nvLevelGuessed bool) {
	nGPU := len(m.gpus)
	for a := 0; a < nGPU; a++ {
		for b := a + 1; b < nGPU; b++ {
			c := m.code(a, b)
			if c == "" {
				missing++
				inv.GPULinks = append(inv.GPULinks, GPULink{A: a, B: b, Level: LevelSYS})
				continue
			}
			nv, level, ok := parseCode(c)
			if !ok {
				nvLevelGuessed = true
				level = LevelNODE
				if na, nb := inv.GPUs[a].NUMANode, inv.GPUs[b].NUMANode; na < 0 || nb < 0 || na != nb {
					level = LevelSYS
					if na >= 0 && na == nb {
						level = LevelNODE
					}
				}
			}
			inv.GPULinks = append(inv.GPULinks, GPULink{A: a, B: b, NVLinks: nv, Level: level})
		}
	}
	return missing, nvLevelGuessed
}

// fillNICs adds an RDMA device per matrix NIC row (named through the legend), the
// levels from each GPU to it and between NICs, and its NUMA node (that of a GPU at NODE
// or nearer). It returns how many pairs were printed nowhere (taken as SYS).
func (m *smiMatrix) fillNICs(inv *Inventory) (missing int) {
	nGPU := len(m.gpus)
	names := make([]string, len(m.devices))
	for i, d := range m.devices[nGPU:] {
		name := d
		if v, ok := m.legend[d]; ok {
			name = v
		}
		names[nGPU+i] = name
	}
	for i := nGPU; i < len(m.devices); i++ {
		d := RDMADevice{Name: names[i], NUMANode: -1, Ports: []RDMAPort{}}
		for g := 0; g < nGPU; g++ {
			l := LevelSYS // printed nowhere (an excerpt): taken as the farthest
			if c := m.code(g, i); c != "" {
				_, l, _ = parseCode(c)
			} else {
				missing++
			}
			inv.GPUNICLevels = append(inv.GPUNICLevels, GPUNICLevel{GPU: g, NIC: names[i], Level: l})
			if l <= LevelNODE && inv.GPUs[g].NUMANode >= 0 && d.NUMANode < 0 {
				d.NUMANode = inv.GPUs[g].NUMANode
			}
		}
		for j := i + 1; j < len(m.devices); j++ {
			l := LevelSYS
			if c := m.code(i, j); c != "" {
				_, l, _ = parseCode(c)
			} else {
				missing++
			}
			inv.NICLevels = append(inv.NICLevels, NICLevel{A: names[i], B: names[j], Level: l})
		}
		inv.RDMADevices = append(inv.RDMADevices, d)
	}
	return missing
}

// assignNearestNICs sets each GPU's NICs: those at the smallest level from it, as the
// prober assigns them, in natural name order.
func assignNearestNICs(inv *Inventory) {
	for g := range inv.GPUs {
		best := LevelSYS + 1
		var nics []string
		for _, gl := range inv.GPUNICLevels {
			if gl.GPU != g {
				continue
			}
			switch {
			case gl.Level < best:
				best, nics = gl.Level, []string{gl.NIC}
			case gl.Level == best:
				nics = append(nics, gl.NIC)
			}
		}
		sort.Slice(nics, func(x, y int) bool { return naturalLess(nics[x], nics[y]) })
		inv.GPUs[g].NICs = nics
	}
}

// addNotes adds the notes on what the matrix cannot say: NVLink beyond its counts, a
// PCIe-only matrix, guessed levels, a missing legend, and rows cut from it (missing is
// the number of pairs printed nowhere; nvLevelGuessed, fillGPULinks's).
func (m *smiMatrix) addNotes(inv *Inventory, missing int, nvLevelGuessed bool) {
	nGPU := len(m.gpus)
	if nGPU > 1 || len(m.devices) > nGPU {
		inv.Notes = append(inv.Notes, smiNoteNVLink)
	}
	if m.pcieOnly {
		inv.Notes = append(inv.Notes, smiNoteMP)
	}
	if nvLevelGuessed {
		inv.Notes = append(inv.Notes, smiNoteNVLevel)
	}
	if len(m.devices) > nGPU && len(m.legend) == 0 && !m.oldHeader() {
		inv.Notes = append(inv.Notes, smiNoteNoLegend)
	}
	var cut []string
	for i, seen := range m.rowsSeen {
		if !seen {
			cut = append(cut, m.devices[i])
		}
	}
	if len(cut) > 0 {
		note := fmt.Sprintf("rows missing from the matrix (an excerpt?): %s; their links come from the other rows", strings.Join(cut, " "))
		if missing > 0 {
			note += fmt.Sprintf(", and %d pairs printed nowhere are taken as SYS (without NVLink)", missing)
		}
		inv.Notes = append(inv.Notes, note)
	}
}

// oldHeader reports whether the NIC columns are named by their RDMA device (drivers
// before the NIC Legend).
func (m *smiMatrix) oldHeader() bool {
	for _, d := range m.devices[len(m.gpus):] {
		if !nicName.MatchString(d) {
			return true
		}
	}
	return false
}

// cpuCell reads a CPU Affinity cell: "N/A" and blanks are unknown.
func cpuCell(s string) string {
	if s == "N/A" {
		return ""
	}
	return s
}

// smiLog is the part of nvidia-smi -q -x's document (nvsmi_device_v12.dtd and later)
// gangrun reads.
type smiLog struct {
	Driver string   `xml:"driver_version"`
	CUDA   string   `xml:"cuda_version"`
	GPUs   []smiGPU `xml:"gpu"`
}

type smiGPU struct {
	ID      string `xml:"id,attr"`
	Name    string `xml:"product_name"`
	UUID    string `xml:"uuid"`
	Minor   string `xml:"minor_number"`
	BusID   string `xml:"pci>pci_bus_id"`
	FBTotal string `xml:"fb_memory_usage>total"`
	MIG     string `xml:"mig_mode>current_mig"`
	MIGDevs []struct {
		Index int `xml:"index"`
	} `xml:"mig_devices>mig_device"`
}

// parseSMIXML decodes nvidia-smi -q -x's document (without fetching its DTD).
func parseSMIXML(doc []byte) (*smiLog, error) {
	var q smiLog
	d := xml.NewDecoder(bytes.NewReader(doc))
	d.Strict = false
	if err := d.Decode(&q); err != nil {
		return nil, fmt.Errorf("nvidia-smi -q -x XML: %w", err)
	}
	if len(q.GPUs) > MaxNvidiaSMIGPUs {
		return nil, fmt.Errorf("nvidia-smi -q -x XML: %d GPUs, more than %d", len(q.GPUs), MaxNvidiaSMIGPUs)
	}
	return &q, nil
}

// fill adds the XML's GPUs to inv: the i-th <gpu> (nvidia-smi lists them in NVML index
// order, by PCI bus id) is GPU i of the matrix; without a matrix the XML makes the GPUs.
func (q *smiLog) fill(inv *Inventory, haveMatrix bool) error {
	inv.Driver, inv.CUDADriver = q.Driver, q.CUDA
	if haveMatrix && len(q.GPUs) != len(inv.GPUs) {
		return fmt.Errorf("nvidia-smi -q -x lists %d GPUs, the topo -m matrix %d: give one node's output", len(q.GPUs), len(inv.GPUs))
	}
	for i, x := range q.GPUs {
		if !haveMatrix {
			inv.GPUs = append(inv.GPUs, GPU{Index: i, NUMANode: -1})
		}
		g := &inv.GPUs[i]
		g.Name, g.UUID = strings.TrimSpace(x.Name), strings.TrimSpace(x.UUID)
		bus := x.BusID
		if bus == "" {
			bus = x.ID
		}
		g.PCIBusID = sysfsBusID(bus)
		if n, err := strconv.Atoi(strings.TrimSpace(x.Minor)); err == nil {
			g.Minor = n
		}
		g.MemoryBytes = mibBytes(x.FBTotal)
		if strings.TrimSpace(x.MIG) == "Enabled" {
			// MIG mode on: its instances are what gets allocated, and CUDA names them by
			// UUID, which -q -x does not print; none is listed, so none is allocatable.
			g.MIGEnabled = true
			inv.Notes = append(inv.Notes, fmt.Sprintf("GPU%d has MIG mode on with %d instances, not listed: nvidia-smi -q -x prints no MIG UUIDs (nvidia-smi -L does), and CUDA needs them", i, len(x.MIGDevs)))
		}
	}
	return nil
}

// sysfsBusID turns nvidia-smi's bus id ("00000000:1B:00.0") into sysfs form
// ("0000:1b:00.0").
func sysfsBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	dom, rest, ok := strings.Cut(s, ":")
	if !ok {
		return s
	}
	if len(dom) > 4 {
		dom = dom[len(dom)-4:]
	}
	return dom + ":" + rest
}

// mibBytes reads "81920 MiB" as bytes; 0 when it is not that.
func mibBytes(s string) uint64 {
	f := strings.Fields(s)
	if len(f) != 2 || f[1] != "MiB" {
		return 0
	}
	n, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil || n > 1<<40 {
		return 0
	}
	return n << 20
}
