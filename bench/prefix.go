package bench

import (
	"regexp"
	"strconv"
	"strings"
)

// A launcher prefix is what a job launcher or log collector writes in front of every
// line a process prints. Parse strips them before reading a line, and keeps the lines
// of each labelled process apart (a stream), so that one rank's table is read whole
// even when other ranks' lines are interleaved with it.
//
// The prefixes, in the order they are tried (several may stack, outermost first; blanks
// before one are allowed, as in an indented Markdown block):
//
//	2024-05-01T12:34:56.123Z   an ISO 8601 / RFC 3339 timestamp, as kubectl logs
//	[2024-05-01 12:34:56]      --timestamps and most log collectors write it,
//	                           bracketed or not; not part of the stream's label
//	[pod/NAME/CONTAINER]       kubectl logs --prefix
//	(head, rank=0, pid=3808)   SkyPilot's and Ray's per-node prefix (rank=N)
//	[1,0]<stdout>:             Open MPI's mpirun --tag-output ([JOB,RANK]<stream>:)
//	[0]                        MPICH's (Hydra) mpiexec -prepend-rank
//	  0:                       Slurm's srun --label (the task id, right-aligned)
//	node1:                     pdsh's and clush's "host: " (tried last, and never on a
//	                           line nccl-tests itself starts with "host: ", its
//	                           "host: Test CUDA failure ..." lines)
var (
	timestampPrefix = regexp.MustCompile(`^\s*\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\]?\s`)
	kubectlPrefix   = regexp.MustCompile(`^\s*\[(pod/[^\]\s]+)\]\s`)
	rayPrefix       = regexp.MustCompile(`^\s*\(([\w.-]+), rank=(\d+), pid=\d+(?:, ip=[\w.:-]+)?\)\s`)
	mpirunTag       = regexp.MustCompile(`^\s*\[(\d+),(\d+)\]<(?:stdout|stderr|stddiag)>:`)
	hydraPrefix     = regexp.MustCompile(`^\s*\[(\d+)\]\s`)
	srunLabel       = regexp.MustCompile(`^\s*(\d+):(?:\s|$)`)
	hostPrefix      = regexp.MustCompile(`^([A-Za-z][\w.-]*): `)
)

// streamKey labels the process a line came from: empty for a line without a launcher
// prefix. rank is the rank or task number the prefix gives (-1 when it gives a host
// name only), used to pick rank 0's copy of a table every rank printed.
type streamKey struct {
	label string // as printed: "[1,0]", "0", "node1", "rank=0"
	rank  int
}

// stripLauncher removes the unambiguous launcher prefixes (all but pdsh's host name)
// from line and returns what is left and the label of the process that printed it.
func stripLauncher(line string) (body string, key streamKey) {
	key.rank = -1
	var labels []string
	for {
		if m := timestampPrefix.FindString(line); m != "" {
			line = line[len(m):]
			continue
		}
		if m := kubectlPrefix.FindStringSubmatch(line); m != nil {
			labels = append(labels, m[1])
			line = line[len(m[0]):]
			continue
		}
		if m := rayPrefix.FindStringSubmatch(line); m != nil {
			labels = append(labels, m[1]+" rank="+m[2])
			key.rank, _ = strconv.Atoi(m[2])
			line = line[len(m[0]):]
			continue
		}
		if m := mpirunTag.FindStringSubmatch(line); m != nil {
			labels = append(labels, "["+m[1]+","+m[2]+"]")
			key.rank, _ = strconv.Atoi(m[2])
			line = line[len(m[0]):]
			continue
		}
		if m := hydraPrefix.FindStringSubmatch(line); m != nil {
			labels = append(labels, "["+m[1]+"]")
			key.rank, _ = strconv.Atoi(m[1])
			line = line[len(m[0]):]
			continue
		}
		if m := srunLabel.FindStringSubmatch(line); m != nil {
			labels = append(labels, m[1])
			key.rank, _ = strconv.Atoi(m[1])
			line = line[len(m[0]):]
			continue
		}
		break
	}
	key.label = strings.Join(labels, " ")
	return line, key
}

// stripHost removes a pdsh-style "host: " prefix: the host becomes the stream's label
// (appended to key's). Lines nccl-tests prints never start with a word and ": "
// (comments start with '#', rows with a number), so a match elsewhere only moves a
// line of noise into a stream of its own.
func stripHost(line string, key streamKey) (string, streamKey) {
	m := hostPrefix.FindStringSubmatch(line)
	if m == nil {
		return line, key
	}
	if key.label != "" {
		key.label += " "
	}
	key.label += m[1]
	return line[len(m[0]):], key
}
