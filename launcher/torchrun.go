package launcher

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/gangrun/gangrun/internal/quote"
)

// torchrun's options (torch/distributed/run.py, get_args_parser) by canonical name (the
// underscore spelling, which torch 1.x and 2.x both accept), and whether each takes a
// value. argparse also accepts the dash spellings torch 2.x added and unique prefixes
// (allow_abbrev), which canonicalOption resolves.
var torchrunOptions = map[string]bool{
	"nnodes": true, "nproc_per_node": true,
	"rdzv_backend": true, "rdzv_endpoint": true, "rdzv_id": true, "rdzv_conf": true,
	"standalone": false, "max_restarts": true, "monitor_interval": true,
	"start_method": true, "role": true, "module": false, "no_python": false,
	"run_path": false, "log_dir": true, "redirects": true, "tee": true,
	"node_rank": true, "master_addr": true, "master_port": true, "local_addr": true,
	"local_ranks_filter": true, "logs_specs": true, "numa_binding": true,
	"event_log_handler": true, "log_line_prefix_template": true,
	"signals_to_handle": true, "virtual_local_rank": false, "use_env": false,
}

// torchrun's one-letter aliases.
var torchrunShort = map[string]string{"m": "module", "r": "redirects", "t": "tee"}

var pythonName = regexp.MustCompile(`^python[0-9.]*$`)

// Torchrun is a parsed `torchrun ...` or `python -m torch.distributed.run ...` command.
type Torchrun struct {
	// Argv is the command as the user gave it.
	Argv []string
	// OptStart is the index in Argv of torchrun's first option (after "torchrun" or
	// after "-m torch.distributed.run").
	OptStart int
	// Script is the index of the training script (or module) in Argv; len(Argv) when
	// the command names none.
	Script int
	// Opts holds the torchrun options the user gave, by canonical (underscore) name;
	// boolean options map to "". A repeated option keeps its last value, as argparse.
	Opts map[string]string
	// Spelling holds each option as the user wrote it, for error messages.
	Spelling map[string]string
	// spans holds the [start, end) token ranges of each option in Argv.
	spans map[string][][2]int
}

// ParseTorchrun recognises a torchrun command: argv[0] named torchrun, or a python
// interpreter running -m torch.distributed.run. ok is false for any other command. An
// error means argv is torchrun but its options cannot be read (an option missing its
// value, or an ambiguous abbreviation).
//
// An option gangrun does not know is taken as a flag without a value; write unknown
// options that take one as --opt=value.
func ParseTorchrun(argv []string) (t *Torchrun, ok bool, err error) {
	start, ok := torchrunStart(argv)
	if !ok {
		return nil, false, nil
	}
	t = &Torchrun{Argv: argv, OptStart: start, Script: len(argv), Opts: map[string]string{},
		Spelling: map[string]string{}, spans: map[string][][2]int{}}
	for i := start; i < len(argv); i++ {
		arg := argv[i]
		if arg == "--" {
			t.Script = i + 1
			break
		}
		if !strings.HasPrefix(arg, "-") || arg == "-" {
			t.Script = i
			break
		}
		name, value, hasValue, err := splitOption(arg)
		if err != nil {
			return nil, true, err
		}
		takesValue, known := torchrunOptions[name]
		first := i
		if known && takesValue && !hasValue {
			if i+1 >= len(argv) {
				return nil, true, fmt.Errorf("torchrun option %s needs a value", arg)
			}
			i++
			value = argv[i]
		}
		t.Opts[name] = value
		t.spans[name] = append(t.spans[name], [2]int{first, i + 1})
		t.Spelling[name] = arg
		if !hasValue && takesValue {
			t.Spelling[name] = arg + " " + value
		}
	}
	return t, true, nil
}

// torchrunStart returns the index of torchrun's first option when argv launches
// torchrun.
func torchrunStart(argv []string) (int, bool) {
	if len(argv) == 0 {
		return 0, false
	}
	base := filepath.Base(argv[0])
	if base == "torchrun" {
		return 1, true
	}
	if !pythonName.MatchString(base) {
		return 0, false
	}
	for i := 1; i < len(argv); i++ {
		a := argv[i]
		switch {
		case a == "-m":
			if i+1 < len(argv) && argv[i+1] == "torch.distributed.run" {
				return i + 2, true
			}
			return 0, false
		case a == "-mtorch.distributed.run":
			return i + 1, true
		case a == "-X" || a == "-W":
			i++ // interpreter options with a value
		case strings.HasPrefix(a, "-"):
		default:
			return 0, false // a script: not torchrun
		}
	}
	return 0, false
}

// splitOption canonicalises one option token: "--nproc-per-node=4" → ("nproc_per_node",
// "4", true).
func splitOption(arg string) (name, value string, hasValue bool, err error) {
	if strings.HasPrefix(arg, "--") {
		body := arg[2:]
		raw, v, has := strings.Cut(body, "=")
		name, err = canonicalOption(strings.ReplaceAll(raw, "-", "_"))
		if err != nil {
			return "", "", false, fmt.Errorf("torchrun option %s: %w", arg, err)
		}
		return name, v, has, nil
	}
	body := arg[1:]
	if long, ok := torchrunShort[body[:1]]; ok {
		if len(body) > 1 {
			return long, strings.TrimPrefix(body[1:], "="), true, nil
		}
		return long, "", false, nil
	}
	return strings.ReplaceAll(body, "-", "_"), "", false, nil
}

// canonicalOption resolves argparse's unique-prefix abbreviations.
func canonicalOption(name string) (string, error) {
	if _, ok := torchrunOptions[name]; ok {
		return name, nil
	}
	var matches []string
	for k := range torchrunOptions {
		if strings.HasPrefix(k, name) {
			matches = append(matches, k)
		}
	}
	switch len(matches) {
	case 0:
		return name, nil // unknown: passed through
	case 1:
		return matches[0], nil
	}
	return "", fmt.Errorf("ambiguous abbreviation (could be %s)", strings.Join(matches, ", "))
}

// TorchrunValues are the static-rendezvous settings gangrun gives a wrapped torchrun.
type TorchrunValues struct {
	NNodes       int
	NodeRank     int
	MasterAddr   string
	MasterPort   int
	NProcPerNode int
}

// NProcPerNode returns the user's --nproc_per_node value, if given.
func (t *Torchrun) NProcPerNode() (string, bool) {
	v, ok := t.Opts["nproc_per_node"]
	return v, ok
}

// CheckStatic reports the first user option that contradicts gangrun's rendezvous
// before anything starts: --standalone, --rdzv_endpoint, a non-static --rdzv_backend, a
// non-zero --max_restarts, an --nnodes other than gangrun's MIN[:MAX], an
// --nproc_per_node other than nproc, and a --master_port when gangrun picks the port
// afresh for each attempt (masterPort 0) or a different one, and on one node
// (nnodesMax 1) a --node_rank other than 0. Each error names both values. Identical
// values are accepted.
func (t *Torchrun) CheckStatic(nnodesMin, nnodesMax, nproc, masterPort int) error {
	for _, name := range []string{"standalone", "rdzv_endpoint"} {
		if _, ok := t.Opts[name]; ok {
			return fmt.Errorf("torchrun %s conflicts with gangrun's static rendezvous (gangrun sets --master_addr/--master_port); drop it", t.Spelling[name])
		}
	}
	if b, ok := t.Opts["rdzv_backend"]; ok && b != "static" {
		return fmt.Errorf("torchrun %s conflicts with gangrun's --rdzv_backend static; drop it", t.Spelling["rdzv_backend"])
	}
	if r, ok := t.Opts["max_restarts"]; ok && r != "0" {
		return fmt.Errorf("torchrun %s conflicts with gangrun's --max_restarts=0 (gangrun owns restarts: use gangrun run --max-restarts)", t.Spelling["max_restarts"])
	}
	if n, ok := t.Opts["nnodes"]; ok {
		min, max, err := ParseNNodes(n)
		if err != nil || min != nnodesMin || max != nnodesMax {
			want := strconv.Itoa(nnodesMin)
			if nnodesMax != nnodesMin {
				want += ":" + strconv.Itoa(nnodesMax)
			}
			return fmt.Errorf("torchrun %s conflicts with gangrun's --nnodes %s", t.Spelling["nnodes"], want)
		}
	}
	// On one node gangrun's node rank is 0 before any round: refuse another now.
	if r, ok := t.Opts["node_rank"]; ok && nnodesMax == 1 && r != "0" {
		return fmt.Errorf("torchrun %s conflicts with gangrun's --node_rank=0 (one node)", t.Spelling["node_rank"])
	}
	// A symbolic torchrun value (auto, gpu, cpu) is replaced by gangrun's count.
	if n, ok := t.Opts["nproc_per_node"]; ok && isNumber(n) && n != strconv.Itoa(nproc) {
		return fmt.Errorf("torchrun %s conflicts with gangrun's --nproc-per-node %d", t.Spelling["nproc_per_node"], nproc)
	}
	if p, ok := t.Opts["master_port"]; ok {
		if masterPort == 0 {
			return fmt.Errorf("torchrun %s conflicts with gangrun's master port, picked afresh for every attempt (give gangrun run --master-port %s instead)", t.Spelling["master_port"], p)
		}
		if p != strconv.Itoa(masterPort) {
			return fmt.Errorf("torchrun %s conflicts with gangrun's --master-port %d", t.Spelling["master_port"], masterPort)
		}
	}
	return nil
}

// CheckRound reports a user --node_rank or --master_addr that contradicts this
// round's values, naming both.
func (t *Torchrun) CheckRound(v TorchrunValues) error {
	if r, ok := t.Opts["node_rank"]; ok && r != strconv.Itoa(v.NodeRank) {
		return fmt.Errorf("torchrun %s conflicts with gangrun's --node_rank=%d", t.Spelling["node_rank"], v.NodeRank)
	}
	if a, ok := t.Opts["master_addr"]; ok && a != v.MasterAddr {
		return fmt.Errorf("torchrun %s conflicts with gangrun's --master_addr=%s", t.Spelling["master_addr"], v.MasterAddr)
	}
	return nil
}

// injected lists the options Command sets, by canonical name.
var injected = []string{"nnodes", "node_rank", "master_addr", "master_port", "nproc_per_node", "max_restarts"}

// Command returns the torchrun command with gangrun's static-rendezvous options
// inserted before the user's own: --nnodes, --node_rank, --master_addr, --master_port,
// --nproc_per_node and --max_restarts=0, in the underscore spellings torch 1.x and 2.x
// both accept. The user's own spellings of these options, which CheckStatic and
// CheckRound accepted as identical, are dropped, so argparse's last-one-wins rule
// cannot bring back a MIN:MAX --nnodes. Command does not look for conflicts.
func (t *Torchrun) Command(v TorchrunValues) []string {
	drop := make([]bool, len(t.Argv))
	// An identical --rdzv_backend static goes too: torchrun's default, and torch 1.13
	// knows no --rdzv-backend spelling.
	for _, name := range append(injected[:len(injected):len(injected)], "rdzv_backend") {
		for _, sp := range t.spans[name] {
			for i := sp[0]; i < sp[1]; i++ {
				drop[i] = true
			}
		}
	}
	out := make([]string, 0, len(t.Argv)+6)
	out = append(out, t.Argv[:t.OptStart]...)
	out = append(out,
		"--nnodes="+strconv.Itoa(v.NNodes),
		"--node_rank="+strconv.Itoa(v.NodeRank),
		"--master_addr="+v.MasterAddr,
		"--master_port="+strconv.Itoa(v.MasterPort),
		"--nproc_per_node="+strconv.Itoa(v.NProcPerNode),
		"--max_restarts=0",
	)
	for i := t.OptStart; i < len(t.Argv); i++ {
		if !drop[i] {
			out = append(out, t.Argv[i])
		}
	}
	return out
}

// ParseNNodes parses --nnodes MIN[:MAX] (torch's syntax, torch/distributed/run.py
// parse_min_max_nnodes): "2" means exactly 2, "1:4" between 1 and 4.
func ParseNNodes(s string) (min, max int, err error) {
	lo, hi, isRange := strings.Cut(s, ":")
	min, err = strconv.Atoi(lo)
	if err != nil || min < 1 {
		return 0, 0, fmt.Errorf("--nnodes %s: want N or MIN:MAX with 1 <= MIN <= MAX", quote.Q(s))
	}
	max = min
	if isRange {
		max, err = strconv.Atoi(hi)
		if err != nil || max < min {
			return 0, 0, fmt.Errorf("--nnodes %s: want N or MIN:MAX with 1 <= MIN <= MAX", quote.Q(s))
		}
	}
	if max > MaxNNodes {
		return 0, 0, fmt.Errorf("--nnodes %s: want at most %d nodes", quote.Q(s), MaxNNodes)
	}
	return min, max, nil
}

// ResolveNProcPerNode turns a --nproc-per-node value into a worker count: a positive
// integer; "auto" (the GPUs seen, else 1); "gpu" (the GPUs seen, an error when there are
// none); "cpu" (the CPUs). gpus and cpus are what this node has.
func ResolveNProcPerNode(v string, gpus, cpus int) (int, error) {
	switch v {
	case "auto":
		if gpus > 0 {
			return gpus, nil
		}
		return 1, nil
	case "gpu":
		if gpus == 0 {
			return 0, fmt.Errorf("--nproc-per-node gpu: this node has no GPU")
		}
		return gpus, nil
	case "cpu":
		return cpus, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("--nproc-per-node %s: want a positive number, auto, gpu or cpu", quote.Q(v))
	}
	if n > MaxNProcPerNode {
		return 0, fmt.Errorf("--nproc-per-node %d: want at most %d workers on one node (Slurm's default MaxTasksPerNode)", n, MaxNProcPerNode)
	}
	return n, nil
}

// MaxNProcPerNode is the most workers --nproc-per-node N starts on one node: Slurm's
// default MaxTasksPerNode (slurm.conf), 512. ("cpu" may give more on a larger node: one
// per CPU it has.)
const MaxNProcPerNode = 512

// MaxNNodes is the most nodes --nnodes takes, in nodes: more than any cluster gangrun's
// Consul layout serves (every node is a key and a session).
const MaxNNodes = 65536

func isNumber(s string) bool {
	_, err := strconv.Atoi(s)
	return err == nil
}
