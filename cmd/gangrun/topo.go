package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/gangrun/gangrun/internal/userfile"
	"github.com/gangrun/gangrun/launcher"
	"github.com/gangrun/gangrun/topology"
	"github.com/spf13/pflag"
)

const topoSynopsis = "[--json | --nccl-env [--rank N [--master-addr ADDR] [--nproc-per-node N] [--cpu-bind MODE] [--nccl-topo MODE]]] [--nccl-topo-xml FILE] [--topology-file FILE]"

// topoFlags are gangrun topo's flags.
type topoFlags struct {
	asJSON, ncclEnv                     *bool
	xmlPath                             *string
	rank                                *int
	masterAddr, nproc, cpuBind, ncclTop *string
	file, sysfsRoot                     *string
}

// newTopoFlags registers gangrun topo's flags on a new flag set.
func newTopoFlags(e *env) (*pflag.FlagSet, *topoFlags) {
	fs := newFlagSet(e, "topo", topoSynopsis)
	f := &topoFlags{}
	f.asJSON = fs.Bool("json", false, "print the inventory as JSON (what --topology-file reads)")
	f.ncclEnv = fs.Bool("nccl-env", false, "print the NCCL environment for this node, one NAME=value per line")
	f.xmlPath = fs.String("nccl-topo-xml", "", "write an NCCL topology file (NCCL_TOPO_FILE format) to `FILE`; - for stdout")
	f.rank = fs.Int("rank", -1, "with --nccl-env: print what local rank `N` of `gangrun run` gets (NCCL settings, its device on a MIG node, its CPUs)")
	f.masterAddr = fs.String("master-addr", "", "with --rank: route NCCL_SOCKET_IFNAME to `ADDR` (default $MASTER_ADDR)")
	f.nproc = fs.String("nproc-per-node", "auto", "with --rank: workers on the node, as gangrun run takes it")
	f.cpuBind = fs.String("cpu-bind", "numa", "with --rank: numa or none, as gangrun run takes it")
	f.ncclTop = fs.String("nccl-topo", "auto", "with --rank: auto, always or never, as gangrun run takes it")
	f.file = fs.String("topology-file", "", "read a recorded inventory from `FILE` instead of probing (gangrun topo --json, or nvidia-smi topo -m and/or -q -x output)")
	f.sysfsRoot = fs.String("sysfs-root", "", "probe /sys and /proc under `DIR` instead of / (for tests)")
	_ = fs.MarkHidden("sysfs-root")
	return fs, f
}

// check refuses the flags that do not go together; the error is the usage error to
// print.
func (f *topoFlags) check(fs *pflag.FlagSet) error {
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *f.asJSON && *f.ncclEnv {
		return errors.New("--json and --nccl-env are exclusive")
	}
	if fs.Changed("rank") && !*f.ncclEnv {
		return fmt.Errorf("--rank %d needs --nccl-env", *f.rank)
	}
	for _, name := range []string{"master-addr", "nproc-per-node", "cpu-bind", "nccl-topo"} {
		if fs.Changed(name) && !fs.Changed("rank") {
			return fmt.Errorf("--%s needs --nccl-env --rank N", name)
		}
	}
	if *f.file != "" && *f.sysfsRoot != "" {
		return errors.New("--topology-file and --sysfs-root are exclusive")
	}
	if *f.xmlPath == "-" && (*f.asJSON || *f.ncclEnv) {
		return errors.New("--nccl-topo-xml - writes to stdout and cannot be combined with --json or --nccl-env")
	}
	return nil
}

// runTopo prints this node's inventory: the nvidia-smi-like matrix by default, the
// Inventory JSON with --json, the NCCL environment with --nccl-env; --nccl-topo-xml
// writes an NCCL topology file ("-" for stdout).
func runTopo(ctx context.Context, e *env, args []string) int {
	fs, f := newTopoFlags(e)
	if done, code := parseFlags(e, fs, args); done {
		return code
	}
	if err := f.check(fs); err != nil {
		return usageErr(e, "topo", "%v", err)
	}
	var src topology.Source
	if *f.file != "" {
		src = topology.FileSource(*f.file)
	} else {
		src = topology.NewProber(topology.ProbeOptions{SysfsRoot: *f.sysfsRoot})
	}
	inv, err := src.Inventory(ctx)
	if err != nil {
		if *f.file != "" {
			return usageErr(e, "topo", "%v", topology.FlagError(err)) // a recording named on the command line: bad input
		}
		return failErr(e, "topo", err)
	}
	if *f.xmlPath != "" {
		if code := writeTopoXML(e, inv, *f.xmlPath, *f.file); code != exitOK {
			return code
		}
	}
	switch {
	case *f.asJSON:
		out, err := inv.JSON()
		if err != nil {
			return failErr(e, "topo", err)
		}
		_, err = e.stdout.Write(out)
		if err != nil {
			return failErr(e, "topo", err)
		}
	case *f.ncclEnv && fs.Changed("rank"):
		return f.printRankEnv(e, inv)
	case *f.ncclEnv:
		for _, v := range inv.NCCLEnv() {
			fmt.Fprintln(e.stdout, v.String())
		}
	case *f.xmlPath == "":
		if err := inv.WriteMatrix(e.stdout); err != nil {
			return failErr(e, "topo", err)
		}
	}
	return exitOK
}

// writeTopoXML writes inv's NCCL topology file to path ("-": stdout), never onto
// input, the command's own --topology-file. It returns the exit code.
func writeTopoXML(e *env, inv *topology.Inventory, path, input string) int {
	var buf bytes.Buffer
	if err := inv.WriteNCCLTopoXML(&buf); err != nil {
		return failErr(e, "topo", err)
	}
	var err error
	if path == "-" {
		_, err = e.stdout.Write(buf.Bytes())
	} else {
		// Never onto the command's own input, a FIFO or a device (userfile.Create).
		f, cerr := userfile.Create(path, 0o644, input)
		if cerr != nil {
			return usageErr(e, "topo", "--nccl-topo-xml %v", cerr)
		}
		_, err = f.Write(buf.Bytes())
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			err = fmt.Errorf("write NCCL topology file %s: %w", path, err)
		}
	}
	if err != nil {
		return failErr(e, "topo", err)
	}
	return exitOK
}

// printRankEnv prints what local rank --rank of `gangrun run` gets on this node
// (launcher.RankEnv): its lines on stdout, its notes on stderr. It returns the exit
// code.
func (f *topoFlags) printRankEnv(e *env, inv *topology.Inventory) int {
	addr := *f.masterAddr
	if addr == "" {
		addr = e.getenv("MASTER_ADDR")
	}
	lines, notes, err := launcher.RankEnv(inv, launcher.RankEnvQuery{LocalRank: *f.rank, NProcPerNode: *f.nproc,
		CPUBind: *f.cpuBind, NCCLTopo: *f.ncclTop, MasterAddr: addr})
	if err != nil {
		return usageErr(e, "topo", "%v", err)
	}
	for _, n := range notes {
		fmt.Fprintln(e.stderr, "gangrun topo: "+n)
	}
	for _, l := range lines {
		fmt.Fprintln(e.stdout, l)
	}
	return exitOK
}
