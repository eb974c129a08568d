package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/job"
)

// chromium runs Debian's headless chromium with args and returns its stdout; it fails
// the test when chromium is not installed (scripts/install-deps.sh chromium).
func chromium(t *testing.T, args ...string) []byte {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium not found: install Debian's chromium package (scripts/install-deps.sh chromium)")
	}
	profile := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--user-data-dir=" + profile}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+profile)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, errOut.String())
	}
	return out.Bytes()
}

// artifactDir is where tests keep what a person may want to look at afterwards (the
// status page's screenshot): $GANGRUN_TEST_ARTIFACTS, else a gangrun-artifacts
// directory under the system's temporary directory; it outlives the test.
func artifactDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("GANGRUN_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "gangrun-artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestStatusPageInChromium: an agent's --http-addr serves the status page; headless
// Chromium (Debian's) loads it from the test cluster, and the DOM it rendered has both
// nodes (one drained, with its reason), the queue's running job by id and name, and the
// job's attempts with the first one's failure as its cause; a screenshot is kept as an
// artifact. The page has no script and no external asset.
func TestStatusPageInChromium(t *testing.T) {
	port := freePort(t)
	c := startJobClusterWith(t, func(node string) []string {
		if node == "gpu-a" {
			return []string{"--http-addr", "127.0.0.1:" + strconv.Itoa(port)}
		}
		return nil
	}, "gpu-a", "gpu-b")
	if code, _, errOut := c.gangrun("drain", "gpu-b", "--reason", "fan replacement"); code != 0 {
		t.Fatalf("drain: %s", errOut)
	}
	id := c.submit("--nodes", "1", "--gpus-per-node", "4", "--name", "flaky-trainer", "--max-restarts", "2", "--",
		"/bin/sh", "-c", `[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && exit 3; sleep 300`)
	t.Cleanup(func() { stopJob(c, id) })
	waitUntilFor(t, 60*time.Second, func() bool {
		m := c.show(id)
		a, _ := m["attempts"].([]any)
		return m["state"] == string(job.Running) && len(a) >= 2
	}, "the job running its second attempt")

	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/"
	dom := string(chromium(t, "--dump-dom", url))
	for _, want := range []string{`id="node-gpu-a"`, `id="node-gpu-b"`, "fan replacement", `id="job-` + id + `"`, "flaky-trainer",
		`id="attempts-` + id + `"`, "exit code 3", `class="gpu held"`, `class="node drained"`, "who submits: MUNGE credentials"} {
		if !strings.Contains(dom, want) {
			t.Errorf("the DOM Chromium rendered lacks %q", want)
		}
	}
	for _, bad := range []string{"<script", "http://", "https://"} {
		if strings.Contains(strings.ReplaceAll(dom, url, ""), bad) {
			t.Errorf("the page has %q: it must be self-contained", bad)
		}
	}
	shot := filepath.Join(artifactDir(t), "statuspage-"+time.Now().UTC().Format("20060102T150405")+".png")
	chromium(t, "--screenshot="+shot, "--window-size=1200,900", "--hide-scrollbars", url)
	png, err := os.ReadFile(shot)
	if err != nil || len(png) < 1000 || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Fatalf("screenshot %s: %d bytes, %v", shot, len(png), err)
	}
	t.Logf("the status page's screenshot: %s (%d bytes)", shot, len(png))
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
	}
}
