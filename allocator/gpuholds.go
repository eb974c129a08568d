package allocator

import (
	"strings"

	"github.com/gangrun/gangrun/internal/store"
)

// NodeGPUsPrefix is the prefix of node's device keys (gangrun/cluster/gpus/<node>/<dev>):
// each, while held by a session (a grant's, then its step's), names the grant holding
// the device. What a node watches to follow its devices being granted and given back.
func NodeGPUsPrefix(node string) string { return gpusPrefix + node + "/" }

// HeldDevices returns, from device keys (entries under NodeGPUsPrefix), the grant
// holding each held device, by device ID; a key no session holds is free.
func HeldDevices(entries []store.Entry) map[string]string {
	out := map[string]string{}
	for _, e := range entries {
		if _, dev, ok := parseGPUKey(e.Key); ok && e.Session != "" && !strings.Contains(dev, "/") {
			out[dev] = string(e.Value)
		}
	}
	return out
}
