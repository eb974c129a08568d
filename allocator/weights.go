package allocator

import "github.com/gangrun/gangrun/topology"

// Pair weights, the one table the device ranker (ChooseDevices) scores with: how much
// a pair of devices inside one node is worth when they are placed together. They are
// go-gpuallocator's (calculateGPUPairScore in gpuallocator/besteffort_policy.go,
// v0.6.0): every NVLink between the pair adds WeightNVLink, and the PCIe path between
// them adds one of the level weights. A pair joined by NVLink gets both, as in
// go-gpuallocator, whose device list records the P2P level and the NVLink count side
// by side. One NVLink (100) outweighs the widest PCIe difference (60 - 10), so NVLink
// count decides first and the PCIe level breaks ties.
const (
	// WeightNVLink is added per NVLink between the pair (NV18 on an H100 pair: 1800).
	WeightNVLink = 100
	// WeightSameBoard is NVML's TOPOLOGY_INTERNAL (two devices on one board). gangrun
	// uses it for two MIG devices of the same GPU, the only same-board pair an
	// Inventory can express.
	WeightSameBoard = 60
	// WeightPIX is a PCIe path through at most one switch (topology.LevelPIX).
	WeightPIX = 50
	// WeightPXB is a path through several switches, not the host bridge (LevelPXB).
	WeightPXB = 40
	// WeightPHB is a path through the CPU's host bridge (LevelPHB).
	WeightPHB = 30
	// WeightNODE is a path between host bridges of one NUMA node (LevelNODE).
	WeightNODE = 20
	// WeightSYS is a path across NUMA nodes, over the CPU interconnect (LevelSYS).
	WeightSYS = 10
)

// PairWeight returns the weight of a pair of devices joined by l: WeightNVLink per
// NVLink plus the weight of l.Level (WeightSameBoard for topology.LevelSelf, which is
// what Inventory.Link reports for two MIG devices of one GPU). A level outside the
// known ones weighs 0.
func PairWeight(l topology.Link) int {
	w := WeightNVLink * max(l.NVLinks, 0)
	switch l.Level {
	case topology.LevelSelf:
		w += WeightSameBoard
	case topology.LevelPIX:
		w += WeightPIX
	case topology.LevelPXB:
		w += WeightPXB
	case topology.LevelPHB:
		w += WeightPHB
	case topology.LevelNODE:
		w += WeightNODE
	case topology.LevelSYS:
		w += WeightSYS
	}
	return w
}
