package metrics

import (
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"

	"github.com/gangrun/gangrun/internal/promtest"
	"github.com/gangrun/gangrun/topology"
)

// grafanaDashboard is what the test reads of a Grafana dashboard: its panels' targets
// and its templating variables.
type grafanaDashboard struct {
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
			IncludeAll bool   `json:"includeAll"`
			Multi      bool   `json:"multi"`
		} `json:"list"`
	} `json:"templating"`
}

// labelValuesRe reads a query variable's label_values(METRIC, LABEL).
var labelValuesRe = regexp.MustCompile(`^label_values\(\s*([^,]+?)\s*,\s*(\w+)\s*\)$`)

// grafanaAll is how Grafana substitutes a multi-value variable set to All (no
// allValue) into a Prometheus query: every value regex-escaped, each backslash doubled
// for the PromQL string literal (the Prometheus data source's
// prometheusSpecialRegexEscape), as (a|b|c).
func grafanaAll(values []string) string {
	esc := make([]string, len(values))
	for i, v := range values {
		esc[i] = strings.ReplaceAll(regexp.QuoteMeta(v), `\`, `\\`)
	}
	return "(" + strings.Join(esc, "|") + ")"
}

// TestDCGMExporterDashboardInPrometheus loads NVIDIA's own dcgm-exporter dashboard
// (testdata/dcgm-exporter, as released) against a real Prometheus scraping the GPU
// metrics endpoint an agent serves (Handler over a GPUCollector), reading go-nvml's
// DGX H100 mock extended with GPM: every variable's label_values finds values, and every
// panel's query, with the variables set to All as Grafana sends them, returns a series
// for each of the 8 GPUs; the tensor core panel shows the tensor activity the GPUs
// report.
func TestDCGMExporterDashboardInPrometheus(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "dcgm-exporter", "dcgm-exporter-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash grafanaDashboard
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	if len(dash.Panels) != 8 {
		t.Fatalf("the dashboard has %d panels; NVIDIA's has 8", len(dash.Panels))
	}

	m := newMockNode(t, dgxh100.New(), "gpu-h1")
	for i := range m.tensor {
		m.tensor[i].Store(uint32(5 * (i + 1)))
	}
	gpus := NewGPUCollector(GPUConfig{NVML: m.srv, Node: "gpu-h1", Inventory: func() *topology.Inventory { return m.inv }})
	t.Cleanup(gpus.Close)
	srv := httptest.NewServer(Handler(gpus))
	t.Cleanup(srv.Close)
	p := promtest.Start(t, strings.TrimPrefix(srv.URL, "http://"))
	// The profiling fields need two GPM readings, so two scrapes of the endpoint.
	p.WaitValue(`count(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)`, 8, 30*time.Second)

	vars := map[string]string{}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		mm := labelValuesRe.FindStringSubmatch(v.Definition)
		if mm == nil {
			t.Fatalf("variable %s: %q is not label_values(METRIC, LABEL)", v.Name, v.Definition)
		}
		values := p.LabelValues(mm[2], mm[1])
		if len(values) == 0 {
			t.Errorf("variable %s (%s) has no values", v.Name, v.Definition)
		}
		if !v.IncludeAll || !v.Multi {
			t.Fatalf("variable %s is not a multi-value variable with All", v.Name)
		}
		vars[v.Name] = grafanaAll(values)
	}
	answered := 0
	for _, panel := range dash.Panels {
		ok := len(panel.Targets) > 0
		for _, target := range panel.Targets {
			q := target.Expr
			for name, value := range vars {
				q = strings.ReplaceAll(q, "$"+name, value)
			}
			series := p.Query(q)
			want := 8
			if strings.HasPrefix(q, "avg(") || strings.HasPrefix(q, "sum(") {
				want = 1
			}
			if len(series) != want {
				ok = false
				t.Errorf("panel %q: %s returned %d series, want %d", panel.Title, target.Expr, len(series), want)
			}
			if panel.Title == "Tensor Core Utilization" {
				for _, s := range series {
					gpu, _ := strconv.Atoi(s.Metric["gpu"])
					v, _ := strconv.ParseFloat(s.Value[1].(string), 64)
					if want := 0.05 * float64(gpu+1); v < want-1e-9 || v > want+1e-9 {
						t.Errorf("tensor core utilization of GPU %d: %v, want %v", gpu, v, want)
					}
				}
			}
		}
		if ok {
			answered++
		}
	}
	t.Logf("%d of %d panels of NVIDIA's dcgm-exporter dashboard return series from gangrun's metrics", answered, len(dash.Panels))
}
