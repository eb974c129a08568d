// Package promtest starts a real Prometheus server (Debian's prometheus package) for
// tests, scraping the targets a test names, and asks it PromQL through its HTTP API.
package promtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/testport"
)

// ScrapeInterval is how often the server scrapes each target.
const ScrapeInterval = time.Second

// readyTimeout bounds the wait for the server to answer /-/ready.
const readyTimeout = 60 * time.Second

// Server is a Prometheus server a test started; it stops when the test ends.
type Server struct {
	t testing.TB
	// URL is the server's base URL, http://127.0.0.1:PORT.
	URL string
}

// Sample is one series of an instant query's answer: its labels and [time, "value"].
type Sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// Start starts Prometheus scraping targets (HOST:PORT, path /metrics) every
// ScrapeInterval, with its data in a test directory, and waits until it is ready. It
// fails the test when Debian's prometheus is not installed (scripts/install-deps.sh
// prometheus) or does not start.
func Start(t testing.TB, targets ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not found: install Debian's prometheus package (scripts/install-deps.sh prometheus)")
	}
	dir := t.TempDir()
	quoted := make([]string, len(targets))
	for i, tg := range targets {
		quoted[i] = strconv.Quote(tg)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: %s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: gangrun
    static_configs:
      - targets: [%s]
`, ScrapeInterval, strings.Join(quoted, ", "))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	log := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", log.String())
		}
	})
	s := &Server{t: t, URL: "http://" + addr}
	deadline := time.Now().Add(readyTimeout)
	for {
		if resp, err := http.Get(s.URL + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after %s:\n%s", readyTimeout, log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Query runs an instant PromQL query and returns its series; a query Prometheus
// refuses fails the test.
func (s *Server) Query(q string) []Sample {
	s.t.Helper()
	var data struct {
		Result []Sample `json:"result"`
	}
	s.get("/api/v1/query?query="+url.QueryEscape(q), &data)
	return data.Result
}

// Value returns the single series' value of q, or false when q has no single answer.
func (s *Server) Value(q string) (float64, bool) {
	s.t.Helper()
	r := s.Query(q)
	if len(r) != 1 {
		return 0, false
	}
	str, _ := r[0].Value[1].(string)
	v, err := strconv.ParseFloat(str, 64)
	return v, err == nil
}

// WaitValue waits up to within until q answers want, and fails the test otherwise.
func (s *Server) WaitValue(q string, want float64, within time.Duration) {
	s.t.Helper()
	var got float64
	var ok bool
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if got, ok = s.Value(q); ok && got == want {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	s.t.Errorf("prometheus: %s = %v (answered %v), want %v; all: %+v", q, got, ok, want, s.Query(q))
}

// LabelValues returns the values of label on the series match selects, as Grafana's
// label_values(match, label) asks them (/api/v1/label/LABEL/values?match[]=...).
func (s *Server) LabelValues(label, match string) []string {
	s.t.Helper()
	var data []string
	s.get("/api/v1/label/"+url.PathEscape(label)+"/values?match[]="+url.QueryEscape(match), &data)
	return data
}

// get decodes the data of a successful API answer into v.
func (s *Server) get(path string, v any) {
	s.t.Helper()
	resp, err := http.Get(s.URL + path)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		s.t.Fatalf("prometheus %s: %v", path, err)
	}
	if body.Status != "success" {
		s.t.Fatalf("prometheus %s: %s", path, body.Error)
	}
	if err := json.Unmarshal(body.Data, v); err != nil {
		s.t.Fatalf("prometheus %s: %v", path, err)
	}
}

// freePort returns a loopback port nothing listens on now, claimed for this test
// process (testport).
func freePort(t testing.TB) int {
	t.Helper()
	return testport.Get(t)
}

// lockedBuffer is a bytes.Buffer the server's output goroutines and the test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
