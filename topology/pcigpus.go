package topology

import (
	"sort"
	"strings"
)

// NVIDIAVendorID is NVIDIA's PCI vendor id, as sysfs's vendor file shows it.
const NVIDIAVendorID = "0x10de"

// NVIDIAGPUsOnPCI returns the PCI bus ids (sysfs form, sorted) of the NVIDIA GPUs on
// the PCI bus under sysfsRoot ("" or "/" for this machine): the functions of
// vendor 0x10de whose class is a display controller (0x03: VGA 0x0300, 3D 0x0302),
// which NVSwitches (0x0680) and NVIDIA's audio functions (0x0403) are not. It needs no
// driver: what the bus shows, to compare with what NVML lists (gangrun doctor). A
// missing or unreadable bus is no GPU.
func NVIDIAGPUsOnPCI(sysfsRoot string) []string {
	s := sysfs{root: ProbeOptions{SysfsRoot: sysfsRoot}.root()}
	names, _ := s.names("sys/bus/pci/devices")
	var out []string
	for _, n := range names {
		if s.read("sys/bus/pci/devices", n, "vendor") != NVIDIAVendorID {
			continue
		}
		if strings.HasPrefix(s.read("sys/bus/pci/devices", n, "class"), "0x03") {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}
