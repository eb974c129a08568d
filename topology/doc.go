// Package topology describes one node for placement, NCCL settings and health
// decisions: its GPUs (NVML), how every GPU pair connects (NVLink count or the PCIe
// level nvidia-smi reports), its RDMA NICs (InfiniBand or RoCE, from sysfs), its plain
// network interfaces, its CPUs and NUMA nodes, and the health of each GPU.
//
// An Inventory comes from a Source: NewProber probes the running machine (NVML through
// github.com/NVIDIA/go-nvml, RDMA and PCI through sysfs read under a root directory
// that tests point at fixture trees), and FileSource reads a recorded inventory, the
// JSON that `gangrun topo --json` prints, so a CPU-only machine can stand in for a GPU
// node in tests, demos and scale simulations, or what `nvidia-smi topo -m` and
// `nvidia-smi -q -x` printed on a node gangrun cannot run on (ParseNvidiaSMI).
//
// From an Inventory the package derives what other parts of gangrun need: the link
// between two GPUs (Link), the devices a scheduler may hand out (Allocatable), the
// NCCL environment for the node (NCCLEnv), an NCCL topology file (WriteNCCLTopoXML)
// and the `nvidia-smi topo -m`-style matrix (WriteMatrix). WatchHealth follows NVML
// Xid events while an agent runs.
//
// A machine without an NVIDIA driver or without RDMA devices is not an error: probing
// returns an inventory with no GPUs or no RDMA devices and a note saying why.
package topology
