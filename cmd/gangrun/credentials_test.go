package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/consultest"
)

// consulCredentials are set in gangrun's environment by the tests below.
var consulCredentials = []string{
	"CONSUL_HTTP_TOKEN=tok-3f9a", "CONSUL_HTTP_TOKEN_FILE=/run/secrets/consul", "CONSUL_HTTP_AUTH=admin:pw",
	"CONSUL_CLIENT_CERT=/etc/consul/client.pem", "CONSUL_CLIENT_KEY=/etc/consul/client-key.pem",
}

// TestWorkersDoNotGetConsulCredentials: workers started by `gangrun run` (two of them,
// real processes printing their environment) see none of the Consul credentials
// gangrun was given, but do see one passed with --env, and the Consul address.
func TestWorkersDoNotGetConsulCredentials(t *testing.T) {
	mark := testMark(t)
	env := append([]string{mark, "CONSUL_HTTP_ADDR=127.0.0.1:1"}, consulCredentials...)
	printEnv := []string{"--", "/bin/sh", "-c", `env | grep '^CONSUL_' | sed "s/^/rank $RANK: /"`}

	r := runGangrun(t, env, append([]string{"run", "--nproc-per-node", "2"}, printEnv...)...)
	if r.code != 0 {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	for rank := range 2 {
		p := "rank " + string(rune('0'+rank)) + ": "
		if !strings.Contains(r.stdout, p+"CONSUL_HTTP_ADDR=127.0.0.1:1") {
			t.Errorf("rank %d lacks CONSUL_HTTP_ADDR:\n%s", rank, r.stdout)
		}
		for _, kv := range consulCredentials {
			name, _, _ := strings.Cut(kv, "=")
			if strings.Contains(r.stdout, p+name+"=") {
				t.Errorf("rank %d got %s:\n%s", rank, name, r.stdout)
			}
		}
	}

	r = runGangrun(t, env, append([]string{"run", "--nproc-per-node", "2", "--env", "CONSUL_HTTP_TOKEN=for-the-trainer"}, printEnv...)...)
	if r.code != 0 {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "rank 0: CONSUL_HTTP_TOKEN=for-the-trainer") || !strings.Contains(r.stdout, "rank 1: CONSUL_HTTP_TOKEN=for-the-trainer") {
		t.Errorf("--env CONSUL_HTTP_TOKEN did not reach the workers:\n%s", r.stdout)
	}
	if strings.Contains(r.stdout, "CONSUL_HTTP_AUTH=") {
		t.Errorf("a credential not given with --env reached the workers:\n%s", r.stdout)
	}
}

// TestAllocCommandKeepsConsulCredentials: the command `gangrun alloc -- CMD` runs is the
// user's own (it may call gangrun itself): it keeps gangrun's environment, credentials
// included.
func TestAllocCommandKeepsConsulCredentials(t *testing.T) {
	consul := consultest.Start(t).Addr
	startAgent(t, consul, "cred-a", "dgx-h100", "partition=train")
	waitUntil(t, func() bool {
		nodes := nodesJSON(t, consul)
		return len(nodes) == 1 && nodes[0].State == "up"
	}, "the agent up")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gangrunBin, "alloc", "--consul", consul, "--nodes", "1", "--gpus-per-node", "1", "--",
		"/bin/sh", "-c", "env | grep '^CONSUL_' | sort")
	// The dev agent has no ACLs: any token is accepted.
	cmd.Env = append(os.Environ(), consulCredentials[0])
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("alloc: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), consulCredentials[0]) {
		t.Errorf("the command lacks %s:\n%s", consulCredentials[0], out)
	}
}
