package launcher

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Std is a set of a worker's standard streams, as torch numbers them
// (torch/distributed/elastic/multiprocessing/api.py, Std): 1 stdout, 2 stderr, 3 both.
type Std uint8

// The streams.
const (
	StdNone Std = 0
	StdOut  Std = 1
	StdErr  Std = 2
	StdAll  Std = 3
)

// StdSpec is torchrun's --redirects or --tee value: one Std for every local rank
// ("3"), or one per local rank ("0:1,1:2": stdout of local rank 0, stderr of local rank
// 1; the ranks not named get none), as torch's Std.from_str reads it.
type StdSpec struct {
	all     Std
	perRank map[int]Std // nil: all applies to every local rank
}

// ParseStd parses a --redirects or --tee value: "0" to "3", or LOCAL_RANK:STD pairs
// joined by commas. Errors name the value.
func ParseStd(s string) (StdSpec, error) {
	bad := func() (StdSpec, error) {
		return StdSpec{}, fmt.Errorf("%q: want 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or LOCAL_RANK:N pairs such as 0:1,1:2", s)
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n < 0 || n > 3 {
			return bad()
		}
		return StdSpec{all: Std(n)}, nil
	}
	m := map[int]Std{}
	for _, pair := range strings.Split(s, ",") {
		r, v, ok := strings.Cut(strings.TrimSpace(pair), ":")
		rank, err1 := strconv.Atoi(r)
		n, err2 := strconv.Atoi(v)
		if !ok || err1 != nil || err2 != nil || rank < 0 || n < 0 || n > 3 {
			return bad()
		}
		m[rank] = Std(n)
	}
	return StdSpec{perRank: m}, nil
}

// For returns the streams the spec names for localRank.
func (s StdSpec) For(localRank int) Std {
	if s.perRank == nil {
		return s.all
	}
	return s.perRank[localRank]
}

// IsZero reports whether the spec names no stream of any rank.
func (s StdSpec) IsZero() bool {
	for _, v := range s.perRank {
		if v != StdNone {
			return false
		}
	}
	return s.all == StdNone
}

// Streams is where each worker's stdout and stderr go, as torchrun's --redirects,
// --tee, --local-ranks-filter and --log-line-prefix-template say
// (torch/distributed/elastic/multiprocessing/api.py, DefaultLogsSpecs and TailLog): a
// stream of a local rank in Redirects goes to its log file only; one in Tee to its log
// file and the console; any other to the console only; and the console shows only the
// local ranks in Filter (nil: all; the log files are not filtered). The log files are
// LogDir/attempt_K/rank_N/{stdout,stderr}.log.
type Streams struct {
	Redirects, Tee StdSpec
	Filter         []int
	// PrefixTemplate, when set, is the console prefix of each line, with torch's macros
	// ${role_name}, ${local_rank}, ${rank} and ${hostname} replaced (torchrun's
	// --log-line-prefix-template); "" keeps gangrun's "[rankN]: ".
	PrefixTemplate string
}

// NeedsFiles reports whether some stream goes to a log file.
func (s *Streams) NeedsFiles() bool {
	return s != nil && (!s.Redirects.IsZero() || !s.Tee.IsZero())
}

// route returns, for localRank's stdout and stderr, whether each goes to its log file
// and to the console.
func (s *Streams) route(localRank int) (file, console [2]bool) {
	red, tee := s.Redirects.For(localRank), s.Tee.For(localRank)
	shown := s.Filter == nil || slices.Contains(s.Filter, localRank)
	for i, bit := range []Std{StdOut, StdErr} {
		file[i] = (red|tee)&bit != 0
		console[i] = red&bit == 0 && shown
	}
	return file, console
}

// prefix expands PrefixTemplate for a worker ("" when there is none).
func (s *Streams) prefix(role string, localRank, rank int) string {
	if s == nil || s.PrefixTemplate == "" {
		return ""
	}
	host, _ := os.Hostname()
	return strings.NewReplacer("${role_name}", role, "${local_rank}", strconv.Itoa(localRank),
		"${rank}", strconv.Itoa(rank), "${hostname}", host).Replace(s.PrefixTemplate)
}

// ParseRanks parses --local-ranks-filter: local ranks joined by commas ("0,1,2"), as
// torchrun reads it. Errors name the value.
func ParseRanks(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--local-ranks-filter %q: want local ranks joined by commas, such as 0,1,2", s)
		}
		out = append(out, n)
	}
	return out, nil
}
