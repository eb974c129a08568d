package main

import (
	"context"
	"fmt"

	"github.com/gangrun/gangrun"
	"github.com/gangrun/gangrun/doctor"
	"github.com/gangrun/gangrun/identity"
)

// runDoctor checks this node as `gangrun agent` with the same flags (or --config file)
// would run on it: one line per check, exit 1 when one fails (doctor.Run).
func runDoctor(ctx context.Context, e *env, args []string) int {
	fs, f := newAgentFlags(e, "doctor", "[--json] [--config FILE] [the agent's flags]")
	asJSON := fs.Bool("json", false, "print the checks as JSON")
	if done, code := parseAgentFlags(e, "doctor", fs, f, args); done {
		return code
	}
	if fs.NArg() > 0 {
		return usageErr(e, "doctor", "unexpected argument %q: doctor takes the agent's flags only", fs.Arg(0))
	}
	switch *f.authMode {
	case "", authMunge, authNone:
	default:
		return usageErr(e, "doctor", "--auth %q: want munge or none (default: munge where munged answers, else Consul's ACLs)", *f.authMode)
	}
	_, name, err := f.check() // what the agent would refuse, doctor refuses
	if err != nil {
		return usageErr(e, "doctor", "%v", err)
	}
	s, code := openStore(e, "doctor", *f.consul)
	if code != exitOK {
		return code
	}
	defer s.Close()
	results := doctor.Run(ctx, doctor.Config{Consul: s, MungeSocket: identity.SocketFrom(e.getenv), Auth: *f.authMode,
		Node: name, AdvertiseAddr: *f.addr, TopologyFile: *f.topoFile, Version: gangrun.Version()})
	for i := range results { // values from the node (a NIC's name, a file's text) reach no terminal raw
		results[i].Detail, results[i].Fix = oneLine(results[i].Detail), oneLine(results[i].Fix)
	}
	failed := doctor.Failed(results)
	if *asJSON {
		writeJSON(e.stdout, struct {
			Node    string          `json:"node"`
			Version string          `json:"version"`
			OK      bool            `json:"ok"`
			Checks  []doctor.Result `json:"checks"`
		}{name, gangrun.Version(), !failed, results})
	} else {
		for _, r := range results {
			fmt.Fprintln(e.stdout, r.Line())
		}
	}
	if failed {
		return exitFailure
	}
	return exitOK
}
