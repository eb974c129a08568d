package topology

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// WriteMatrix writes the node the way `nvidia-smi topo -m` lays it out: a summary line,
// a matrix with a row and a column per GPU and per RDMA device (NIC0.. in name order)
// giving the link between them (NV# or a PCIe level), each row's CPU and NUMA affinity,
// a legend, then one line per GPU and NIC and the inventory's notes.
func (inv *Inventory) WriteMatrix(w io.Writer) error {
	bw := bufio.NewWriter(w)
	nics := inv.rdmaInOrder()

	inv.writeMatrixSummary(bw, nics)
	if len(inv.GPUs)+len(nics) > 0 {
		rows, err := inv.matrixRows(nics)
		if err != nil {
			return err
		}
		fmt.Fprintln(bw)
		writeColumns(bw, rows)
		writeMatrixLegend(bw)
	}
	if len(inv.GPUs) > 0 {
		inv.writeGPUList(bw)
	}
	if len(nics) > 0 {
		writeNICList(bw, nics)
	}
	if len(inv.Notes) > 0 {
		fmt.Fprintln(bw)
		fmt.Fprintln(bw, "Notes:")
		for _, n := range inv.Notes {
			fmt.Fprintf(bw, "  %s\n", n)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write topology matrix of %s: %w", inv.Node, err)
	}
	return nil
}

// writeMatrixSummary writes WriteMatrix's first two lines: the node's GPU and RDMA
// device counts, driver and CUDA versions, then its CPU and NUMA nodes.
func (inv *Inventory) writeMatrixSummary(bw *bufio.Writer, nics []RDMADevice) {
	fmt.Fprintf(bw, "Node %s: %s, %s", inv.Node, plural(len(inv.GPUs), "GPU"), plural(len(nics), "RDMA device"))
	if inv.Driver != "" {
		fmt.Fprintf(bw, ", driver %s", inv.Driver)
	}
	if inv.CUDADriver != "" {
		fmt.Fprintf(bw, ", CUDA %s", inv.CUDADriver)
	}
	if inv.CPU.Arch == "" { // an nvidia-smi recording
		fmt.Fprintf(bw, "\nCPU: not recorded, %s\n", plural(len(inv.NUMANodes), "NUMA node"))
	} else {
		fmt.Fprintf(bw, "\nCPU: %s, %s, %s, %s\n", inv.CPU.Arch, cpuName(inv.CPU),
			plural(inv.CPU.Sockets, "socket"), plural(len(inv.NUMANodes), "NUMA node"))
	}
}

// matrixEndpoint is one row and column of the matrix: a GPU, or an RDMA device by name,
// with its PCI bus ID and NUMA node.
type matrixEndpoint struct {
	gpu  *GPU
	nic  string
	bus  string
	numa int
}

// matrixRows returns the matrix's rows, its header first: per GPU then per NIC, the
// level to every other endpoint ("X" to itself) and the CPU and NUMA affinity.
func (inv *Inventory) matrixRows(nics []RDMADevice) ([][]string, error) {
	tree := newPCITree(inv.PCIDevices)
	header := []string{""}
	for _, g := range inv.GPUs {
		header = append(header, fmt.Sprintf("GPU%d", g.Index))
	}
	for i := range nics {
		header = append(header, fmt.Sprintf("NIC%d", i))
	}
	header = append(header, "CPU Affinity", "NUMA Affinity")
	rows := [][]string{header}

	var eps []matrixEndpoint
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		eps = append(eps, matrixEndpoint{gpu: g, bus: g.PCIBusID, numa: g.NUMANode})
	}
	for i := range nics {
		eps = append(eps, matrixEndpoint{nic: nics[i].Name, bus: nics[i].PCIBusID, numa: nics[i].NUMANode})
	}
	for r, a := range eps {
		row := []string{header[r+1]}
		for c, b := range eps {
			var cell string
			switch {
			case r == c:
				cell = "X"
			case a.gpu != nil && b.gpu != nil:
				l, err := inv.Link(a.gpu.Index, b.gpu.Index)
				if err != nil {
					return nil, err
				}
				cell = l.String()
			default:
				l, ok := inv.recordedLevel(a, b)
				if !ok {
					l = tree.level(a.bus, b.bus, a.numa, b.numa)
				}
				cell = l.String()
			}
			row = append(row, cell)
		}
		affinity := ""
		if a.gpu != nil {
			affinity = a.gpu.CPUAffinity
		}
		if affinity == "" {
			affinity = inv.numaCPUs(a.numa)
		}
		numa := "N/A"
		if a.numa >= 0 {
			numa = strconv.Itoa(a.numa)
		}
		row = append(row, orNA(affinity), numa)
		rows = append(rows, row)
	}
	return rows, nil
}

// recordedLevel is the level between a GPU and a NIC, or two NICs, as recorded
// (nvidia-smi); false when none is, and for two GPUs.
func (inv *Inventory) recordedLevel(a, b matrixEndpoint) (Level, bool) {
	switch {
	case a.gpu != nil && b.nic != "":
		l, err := inv.GPUNICLevel(a.gpu.Index, b.nic)
		return l, err == nil && len(inv.GPUNICLevels) > 0
	case a.nic != "" && b.gpu != nil:
		l, err := inv.GPUNICLevel(b.gpu.Index, a.nic)
		return l, err == nil && len(inv.GPUNICLevels) > 0
	case a.nic != "" && b.nic != "":
		return inv.nicLevel(a.nic, b.nic)
	}
	return 0, false
}

// writeMatrixLegend writes the legend of the matrix's cells, after a blank line.
func writeMatrixLegend(bw *bufio.Writer) {
	fmt.Fprintln(bw)
	fmt.Fprintln(bw, "Legend:")
	for _, l := range [][2]string{
		{"X", "the device itself"},
		{"NV#", "# NVLinks, direct or through the NVSwitch fabric"},
		{"PIX", "PCIe through at most one switch"},
		{"PXB", "PCIe through several switches, not through a host bridge"},
		{"PHB", "PCIe through a host bridge (the CPU's root complex)"},
		{"NODE", "PCIe between host bridges of one NUMA node"},
		{"SYS", "PCIe and the link between NUMA nodes (sockets)"},
	} {
		fmt.Fprintf(bw, "  %-4s  %s\n", l[0], l[1])
	}
}

// writeGPUList writes the "GPUs:" section: a line per GPU (name, UUID, bus ID, memory,
// compute capability, MIG, health) and one per MIG instance under it.
func (inv *Inventory) writeGPUList(bw *bufio.Writer) {
	fmt.Fprintln(bw)
	fmt.Fprintln(bw, "GPUs:")
	var rows [][]string
	for _, g := range inv.GPUs {
		state := string(g.Health.State)
		if len(g.Health.Reasons) > 0 {
			state += ": " + strings.Join(g.Health.Reasons, "; ")
		}
		mig := ""
		if g.MIGEnabled {
			mig = fmt.Sprintf("MIG, %s", plural(len(g.MIGDevices), "instance"))
		}
		rows = append(rows, []string{"  GPU" + strconv.Itoa(g.Index), g.Name, g.UUID, g.PCIBusID,
			fmt.Sprintf("%d MiB", g.MemoryBytes>>20), "sm " + g.ComputeCapability, orDash(mig), state})
		for _, m := range g.MIGDevices {
			rows = append(rows, []string{"", "  MIG " + m.Profile, m.UUID, "",
				fmt.Sprintf("%d MiB", m.MemoryBytes>>20), "", "", ""})
		}
	}
	writeColumns(bw, rows)
}

// writeNICList writes the "NICs:" section: a line per port of each RDMA device (link
// layer, rate, state, netdev), or one saying its ports were not recorded.
func writeNICList(bw *bufio.Writer, nics []RDMADevice) {
	fmt.Fprintln(bw)
	fmt.Fprintln(bw, "NICs:")
	var rows [][]string
	for i, d := range nics {
		if len(d.Ports) == 0 {
			rows = append(rows, []string{fmt.Sprintf("  NIC%d", i), d.Name, orDash(d.PCIBusID), "ports not recorded"})
		}
		for k, p := range d.Ports {
			label := ""
			name := ""
			if k == 0 {
				label, name = fmt.Sprintf("  NIC%d", i), d.Name
			}
			rate := fmt.Sprintf("%s Gb/s", strconv.FormatFloat(p.RateGbps, 'f', -1, 64))
			rows = append(rows, []string{label, name, d.PCIBusID, fmt.Sprintf("port %d", p.Port),
				p.LinkLayer, rate, p.State, orDash(p.Netdev)})
		}
	}
	writeColumns(bw, rows)
}

// numaCPUs returns a NUMA node's CPU list, "" when unknown.
func (inv *Inventory) numaCPUs(numa int) string {
	for _, n := range inv.NUMANodes {
		if n.ID == numa {
			return n.CPUs
		}
	}
	return ""
}

func cpuName(c CPUInfo) string {
	if c.ModelName != "" {
		return c.ModelName
	}
	return c.Vendor
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func orNA(s string) string {
	if s == "" {
		return "N/A"
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writeColumns writes rows with every column padded to its widest cell, two spaces
// apart, without trailing spaces.
func writeColumns(w *bufio.Writer, rows [][]string) {
	var widths []int
	for _, r := range rows {
		for i, c := range r {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], len(c))
		}
	}
	for _, r := range rows {
		var b strings.Builder
		for i, c := range r {
			if i > 0 {
				b.WriteString("  ")
			}
			b.WriteString(c)
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-len(c)))
			}
		}
		w.WriteString(strings.TrimRight(b.String(), " ") + "\n")
	}
}
