package bench

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// fabricJSON is the --json form of a pairwise sweep.
type fabricJSON struct {
	Op        Op           `json:"op"`
	Nodes     []Node       `json:"nodes"`
	Rounds    int          `json:"rounds"`
	Matrix    [][]*float64 `json:"busbw_gbps"`
	Diagnosis Diagnosis    `json:"diagnosis"`
	Pairs     []pairJSON   `json:"pairs"`
}

type pairJSON struct {
	A      string  `json:"a"`
	B      string  `json:"b"`
	BusBW  float64 `json:"busbw_gbps"`
	Slow   bool    `json:"slow"`
	Error  string  `json:"error,omitempty"`
	Result *Result `json:"result,omitempty"`
}

// WriteFabric prints a pairwise sweep and its diagnosis for op in format ft:
//
//   - Table: the node × node busbw matrix in GB/s ("-" on the diagonal), the median,
//     then one "# SLOW" line per finding or "# no slow node or link";
//   - JSON: one object {"op", "nodes", "rounds", "busbw_gbps" (the matrix, null on the
//     diagonal), "diagnosis", "pairs" [{"a", "b", "busbw_gbps", "slow", "error",
//     "result"}]};
//   - CSV: node_a, node_b, busbw_gbps, slow, error, one line per pair.
func WriteFabric(w io.Writer, ft Format, op Op, f *Fabric, d Diagnosis) error {
	limit := (1 - d.Threshold) * d.Median
	isSlow := func(pr PairResult) bool {
		return len(f.Nodes) > 2 && (pr.Err != nil || pr.Figure() < limit)
	}
	switch ft {
	case JSON:
		out := fabricJSON{Op: op, Nodes: f.Nodes, Rounds: f.Rounds, Diagnosis: d, Pairs: []pairJSON{}}
		for _, row := range f.Matrix() {
			jr := make([]*float64, len(row))
			for j, v := range row {
				if !math.IsNaN(v) {
					jr[j] = &v
				}
			}
			out.Matrix = append(out.Matrix, jr)
		}
		for _, pr := range f.Pairs {
			pj := pairJSON{A: f.Nodes[pr.Pair.A].Name, B: f.Nodes[pr.Pair.B].Name, BusBW: pr.Figure(), Slow: isSlow(pr)}
			if pr.Err != nil {
				pj.Error = pr.Err.Error()
			} else {
				r := pr.Result
				pj.Result = &r
			}
			out.Pairs = append(out.Pairs, pj)
		}
		if err := json.NewEncoder(w).Encode(out); err != nil {
			return fmt.Errorf("write JSON: %w", err)
		}
		return nil
	case CSV:
		cw := csv.NewWriter(w)
		_ = cw.Write([]string{"node_a", "node_b", "busbw_gbps", "slow", "error"})
		for _, pr := range f.Pairs {
			e := ""
			if pr.Err != nil {
				e = pr.Err.Error()
			}
			_ = cw.Write([]string{f.Nodes[pr.Pair.A].Name, f.Nodes[pr.Pair.B].Name,
				strconv.FormatFloat(pr.Figure(), 'g', -1, 64), strconv.FormatBool(isSlow(pr)), e})
		}
		cw.Flush()
		if err := cw.Error(); err != nil {
			return fmt.Errorf("write CSV: %w", err)
		}
		return nil
	}
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "# %s busbw (GB/s) of every node pair: %d nodes, %d pairs in %d rounds; peak busbw of the largest size\n",
		opName(op), len(f.Nodes), len(f.Pairs), f.Rounds)
	width := 8
	for _, n := range f.Nodes {
		width = max(width, len(n.Name))
	}
	fmt.Fprintf(bw, "%-*s", width, "")
	for _, n := range f.Nodes {
		fmt.Fprintf(bw, "  %*s", width, n.Name)
	}
	bw.WriteString("\n")
	for i, row := range f.Matrix() {
		fmt.Fprintf(bw, "%-*s", width, f.Nodes[i].Name)
		for _, v := range row {
			cell := "-"
			if !math.IsNaN(v) {
				cell = strconv.FormatFloat(v, 'f', 2, 64)
			}
			fmt.Fprintf(bw, "  %*s", width, cell)
		}
		bw.WriteString("\n")
	}
	fmt.Fprintf(bw, "# median %.2f GB/s (median over nodes of each node's median pair); slow: more than %g%% below\n",
		d.Median, d.Threshold*100)
	if d.Note != "" {
		fmt.Fprintf(bw, "# %s\n", d.Note)
	}
	for _, s := range d.Slow {
		fmt.Fprintf(bw, "# SLOW %s %s: %.2f GB/s, %.0f%% below the median; %s\n",
			s.Kind, strings.Join(s.Nodes, "–"), s.BusBW, s.Below*100, s.Culprit)
	}
	if len(d.Slow) == 0 && d.Note == "" {
		bw.WriteString("# no slow node or link\n")
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// FailedPairs describes the pairs of f that failed, "a–b: why" each, in schedule order;
// nil when none failed.
func (f *Fabric) FailedPairs() []string {
	var out []string
	for _, pr := range f.Pairs {
		if pr.Err != nil {
			out = append(out, fmt.Sprintf("%s–%s: %v", f.Nodes[pr.Pair.A].Name, f.Nodes[pr.Pair.B].Name, pr.Err))
		}
	}
	return out
}

// NodeSummary is the one line a node other than node rank 0 prints at the end of a
// sweep across nodes (f then holds its own pairs only; rank is its index in f.Nodes):
// each partner's busbw in GB/s, or why the pair failed, and who prints the matrix.
func (f *Fabric) NodeSummary(rank int) string {
	var parts []string
	for _, pr := range f.Pairs {
		other := pr.Pair.A
		if other == rank {
			other = pr.Pair.B
		}
		if pr.Err != nil {
			parts = append(parts, fmt.Sprintf("%s failed (%v)", f.Nodes[other].Name, pr.Err))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.2f GB/s", f.Nodes[other].Name, pr.Figure()))
	}
	return fmt.Sprintf("pairwise sweep of %d nodes done; %s (node rank %d), busbw with %s; node rank 0 (%s) prints the matrix",
		len(f.Nodes), f.Nodes[rank].Name, rank, strings.Join(parts, ", "), f.Nodes[0].Name)
}
