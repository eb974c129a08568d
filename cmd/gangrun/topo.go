package main

import (
	"bytes"
	"context"
	"fmt"

	"github.com/gangrun/gangrun/internal/userfile"
	"github.com/gangrun/gangrun/launcher"
	"github.com/gangrun/gangrun/topology"
)

const topoSynopsis = "[--json | --nccl-env [--rank N [--master-addr ADDR] [--nproc-per-node N] [--cpu-bind MODE] [--nccl-topo MODE]]] [--nccl-topo-xml FILE] [--topology-file FILE]"

// runTopo prints this node's inventory: the nvidia-smi-like matrix by default, the
// Inventory JSON with --json, the NCCL environment with --nccl-env; --nccl-topo-xml
// writes an NCCL topology file ("-" for stdout).
func runTopo(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "topo", topoSynopsis)
	asJSON := fs.Bool("json", false, "print the inventory as JSON (what --topology-file reads)")
	ncclEnv := fs.Bool("nccl-env", false, "print the NCCL environment for this node, one NAME=value per line")
	xmlPath := fs.String("nccl-topo-xml", "", "write an NCCL topology file (NCCL_TOPO_FILE format) to `FILE`; - for stdout")
	rank := fs.Int("rank", -1, "with --nccl-env: print what local rank `N` of `gangrun run` gets (NCCL settings, its device on a MIG node, its CPUs)")
	masterAddr := fs.String("master-addr", "", "with --rank: route NCCL_SOCKET_IFNAME to `ADDR` (default $MASTER_ADDR)")
	nproc := fs.String("nproc-per-node", "auto", "with --rank: workers on the node, as gangrun run takes it")
	cpuBind := fs.String("cpu-bind", "numa", "with --rank: numa or none, as gangrun run takes it")
	ncclTopo := fs.String("nccl-topo", "auto", "with --rank: auto, always or never, as gangrun run takes it")
	file := fs.String("topology-file", "", "read a recorded inventory from `FILE` instead of probing (gangrun topo --json, or nvidia-smi topo -m and/or -q -x output)")
	sysfsRoot := fs.String("sysfs-root", "", "probe /sys and /proc under `DIR` instead of / (for tests)")
	_ = fs.MarkHidden("sysfs-root")
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		return usageErr(e, "topo", "unexpected argument %q", fs.Arg(0))
	}
	if *asJSON && *ncclEnv {
		return usageErr(e, "topo", "--json and --nccl-env are exclusive")
	}
	if fs.Changed("rank") && !*ncclEnv {
		return usageErr(e, "topo", "--rank %d needs --nccl-env", *rank)
	}
	for _, f := range []string{"master-addr", "nproc-per-node", "cpu-bind", "nccl-topo"} {
		if fs.Changed(f) && !fs.Changed("rank") {
			return usageErr(e, "topo", "--%s needs --nccl-env --rank N", f)
		}
	}
	if *file != "" && *sysfsRoot != "" {
		return usageErr(e, "topo", "--topology-file and --sysfs-root are exclusive")
	}
	if *xmlPath == "-" && (*asJSON || *ncclEnv) {
		return usageErr(e, "topo", "--nccl-topo-xml - writes to stdout and cannot be combined with --json or --nccl-env")
	}

	var src topology.Source
	if *file != "" {
		src = topology.FileSource(*file)
	} else {
		src = topology.NewProber(topology.ProbeOptions{SysfsRoot: *sysfsRoot})
	}
	inv, err := src.Inventory(ctx)
	if err != nil {
		if *file != "" {
			return usageErr(e, "topo", "%v", topology.FlagError(err)) // a recording named on the command line: bad input
		}
		return failErr(e, "topo", err)
	}

	if *xmlPath != "" {
		var buf bytes.Buffer
		if err := inv.WriteNCCLTopoXML(&buf); err != nil {
			return failErr(e, "topo", err)
		}
		if *xmlPath == "-" {
			_, err = e.stdout.Write(buf.Bytes())
		} else {
			// Never onto the command's own input, a FIFO or a device (userfile.Create).
			f, cerr := userfile.Create(*xmlPath, 0o644, *file)
			if cerr != nil {
				return usageErr(e, "topo", "--nccl-topo-xml %v", cerr)
			}
			_, err = f.Write(buf.Bytes())
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				err = fmt.Errorf("write NCCL topology file %s: %w", *xmlPath, err)
			}
		}
		if err != nil {
			return failErr(e, "topo", err)
		}
	}
	switch {
	case *asJSON:
		out, err := inv.JSON()
		if err != nil {
			return failErr(e, "topo", err)
		}
		_, err = e.stdout.Write(out)
		if err != nil {
			return failErr(e, "topo", err)
		}
	case *ncclEnv && fs.Changed("rank"):
		addr := *masterAddr
		if addr == "" {
			addr = e.getenv("MASTER_ADDR")
		}
		lines, notes, err := launcher.RankEnv(inv, launcher.RankEnvQuery{LocalRank: *rank, NProcPerNode: *nproc,
			CPUBind: *cpuBind, NCCLTopo: *ncclTopo, MasterAddr: addr})
		if err != nil {
			return usageErr(e, "topo", "%v", err)
		}
		for _, n := range notes {
			fmt.Fprintln(e.stderr, "gangrun topo: "+n)
		}
		for _, l := range lines {
			fmt.Fprintln(e.stdout, l)
		}
	case *ncclEnv:
		for _, v := range inv.NCCLEnv() {
			fmt.Fprintln(e.stdout, v.String())
		}
	case *xmlPath == "":
		if err := inv.WriteMatrix(e.stdout); err != nil {
			return failErr(e, "topo", err)
		}
	}
	return exitOK
}
