package topology

import (
	"encoding/json"
	"testing"
)

func TestDeviceJSON(t *testing.T) {
	// The allocator stores a node's devices in this form (gangrun/cluster/nodes/<node>):
	// the fields and their order are the record's, the UUID left out; a MIG device
	// carries its profile (a request for a profile is matched against it).
	d := Device{ID: "MIG-1", GPU: 3, UUID: "MIG-1", Model: "NVIDIA A100-SXM4-40GB", MIGProfile: "3g.20gb",
		MemoryBytes: 20 << 30, Health: Degraded}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"MIG-1","gpu":3,"model":"NVIDIA A100-SXM4-40GB","mig_profile":"3g.20gb","memory_bytes":21474836480,"health":"degraded"}`
	if string(b) != want {
		t.Errorf("json %s\nwant %s", b, want)
	}
	// A whole GPU has no profile, and no mig_profile key.
	d.ID, d.MIGProfile = "3", ""
	if b, _ := json.Marshal(d); string(b) != `{"id":"3","gpu":3,"model":"NVIDIA A100-SXM4-40GB","memory_bytes":21474836480,"health":"degraded"}` {
		t.Errorf("a whole GPU's json: %s", b)
	}
}
