package metrics

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/topology"
)

// exportedNames are the metric names gangrun's collectors export (a histogram's
// _bucket, _sum and _count series included).
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	m := newMockNode(t, dgxh100.New(), "n")
	view := NewView(store.NewMemory(), 0)
	cs := []prometheus.Collector{
		NewGPUCollector(GPUConfig{NVML: m.srv, Node: "n", Inventory: func() *topology.Inventory { return m.inv }}),
		NewNodeCollector(view, "n"), NewSchedulerCollector(store.NewMemory(), view), NewJobCollector(store.NewMemory(), "n", 0, 0),
	}
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	names := map[string]bool{}
	for _, c := range cs {
		ch := make(chan *prometheus.Desc, 256)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			n := fq.FindStringSubmatch(d.String())[1]
			for _, s := range []string{"", "_bucket", "_sum", "_count"} {
				names[n+s] = true
			}
		}
	}
	return names
}

// promqlWords are PromQL's functions, aggregations and keywords the dashboard uses.
func promqlWords() map[string]bool {
	w := map[string]bool{}
	for _, s := range strings.Fields(`sum avg min max count by without on ignoring group_left group_right bool and or unless offset
		rate irate increase histogram_quantile vector label_values topk bottomk delta deriv abs clamp_min clamp_max time`) {
		w[s] = true
	}
	return w
}

// metricNames returns the metric names PromQL expression expr names: what is left of
// its identifiers once strings, label matchers, ranges, grouping label lists,
// functions and keywords are taken out.
func metricNames(expr string) []string {
	for _, re := range []string{`"(?:[^"\\]|\\.)*"`, `\{[^}]*\}`, `\[[^\]]*\]`, `\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`, `\$\w+`} {
		expr = regexp.MustCompile(re).ReplaceAllString(expr, " ")
	}
	// label_values(metric, label): the second argument is a label.
	expr = regexp.MustCompile(`label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*\w+\s*\)`).ReplaceAllString(expr, "$1")
	words := promqlWords()
	var out []string
	for _, m := range regexp.MustCompile(`[A-Za-z_:][\w:]*(\s*\()?`).FindAllStringSubmatch(expr, -1) {
		id := strings.TrimRight(strings.TrimSuffix(strings.TrimSpace(m[0]), "("), " ")
		if m[1] != "" || words[id] || regexp.MustCompile(`^[0-9eE.]+$`).MatchString(id) {
			continue // a function call, a keyword or a number
		}
		out = append(out, id)
	}
	return out
}

// TestGrafanaDashboardNamesExportedMetrics: every PromQL expression of the dashboards
// under scripts/grafana (panel targets, variable queries) names only metrics gangrun
// exports, and names at least one.
func TestGrafanaDashboardNamesExportedMetrics(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "scripts", "grafana", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards under scripts/grafana: %v", err)
	}
	exported := exportedNames(t)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		if err := json.Unmarshal(data, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var exprs []string
		var walk func(v any)
		walk = func(v any) {
			switch x := v.(type) {
			case map[string]any:
				for k, e := range x {
					if s, ok := e.(string); ok && (k == "expr" || k == "definition") {
						exprs = append(exprs, s)
					}
					walk(e)
				}
			case []any:
				for _, e := range x {
					walk(e)
				}
			}
		}
		walk(doc)
		if len(exprs) < 10 {
			t.Errorf("%s: only %d queries", f, len(exprs))
		}
		for _, e := range exprs {
			names := metricNames(e)
			if len(names) == 0 {
				t.Errorf("%s: %q names no metric", f, e)
			}
			for _, n := range names {
				if !exported[n] {
					t.Errorf("%s: %q names %s, which gangrun does not export", f, e, n)
				}
			}
		}
	}
}

// TestMetricNamesOfPromQL: the extraction the dashboard test relies on.
func TestMetricNamesOfPromQL(t *testing.T) {
	for expr, want := range map[string]string{
		`histogram_quantile(0.9, sum by (le) (rate(gangrun_job_wait_time_seconds_bucket[$__rate_interval])))`: "gangrun_job_wait_time_seconds_bucket",
		`avg by (hpc_job) (DCGM_FI_DEV_GPU_UTIL{hpc_job=~"$job", Hostname="a b"}) > 5`:                        "DCGM_FI_DEV_GPU_UTIL",
		`label_values(gangrun_gpu_info{hpc_job!=""}, hpc_job)`:                                                "gangrun_gpu_info",
		`gangrun_nodes or vector(0)`:                                     "gangrun_nodes",
		`no_such_metric * on(UUID) group_left(hpc_job) gangrun_gpu_info`: "no_such_metric gangrun_gpu_info",
	} {
		if got := strings.Join(metricNames(expr), " "); got != want {
			t.Errorf("%s: got %q, want %q", expr, got, want)
		}
	}
}
