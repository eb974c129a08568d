package topology

import (
	"reflect"
	"testing"
)

// TestNVIDIAGPUsOnPCI: every modelled node's GPUs are found on its PCI bus by vendor
// and class alone, none of its NVSwitches or NICs; a node without NVIDIA devices, and a
// root with no PCI bus, have none.
func TestNVIDIAGPUsOnPCI(t *testing.T) {
	for _, m := range allModels() {
		t.Run(m.fixture, func(t *testing.T) {
			var want []string
			for _, g := range m.gpus {
				want = append(want, g.pci.busID())
			}
			got := NVIDIAGPUsOnPCI(m.sysfsRoot(t))
			if !reflect.DeepEqual(got, want) {
				t.Errorf("NVIDIAGPUsOnPCI = %v, want the model's GPUs %v", got, want)
			}
		})
	}
	if got := NVIDIAGPUsOnPCI(t.TempDir()); got != nil {
		t.Errorf("a root without a PCI bus: %v", got)
	}
}
