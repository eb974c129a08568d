package main

import (
	"context"
	"errors"
	"fmt"
	"os/user"
	"strconv"
	"time"

	"github.com/gangrun/gangrun/agent"
	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
)

// How an agent knows who submits jobs (agent --auth, NodeRecord.Auth; docs/acl.md).
const (
	authMunge = agent.AuthMunge
	authACL   = agent.AuthACL
	authNone  = agent.AuthNone
)

// mungeProbeTimeout bounds an agent's check at start that munged answers.
const mungeProbeTimeout = 15 * time.Second

// agentAuth decides how the agent knows who submits jobs: --auth munge requires a
// munged that answers; --auth none checks nothing; by default MUNGE where munged
// answers, else Consul's ACLs when they are on (aclOn), else the agent refuses to
// start: no cluster runs every local user's jobs as whoever they claim without being
// told to. It returns the prover for the job controller and the steps (nil unless
// MUNGE), the mode, and an exit code (exitOK to go on).
func agentAuth(ctx context.Context, e *env, mode string, aclOn bool) (*identity.Munge, string, int) {
	socket := identity.SocketFrom(e.getenv)
	probe := func() (*identity.Munge, error) {
		m, err := identity.Open(socket)
		if err != nil {
			return nil, err
		}
		pctx, cancel := context.WithTimeout(ctx, mungeProbeTimeout)
		defer cancel()
		if _, err := m.Probe(pctx); err != nil {
			return nil, err
		}
		return m, nil
	}
	switch mode {
	case authNone:
		return nil, authNone, exitOK
	case authMunge:
		m, err := probe()
		if err != nil {
			return nil, "", usageErr(e, "agent", "--auth munge: %v", err)
		}
		return m, authMunge, exitOK
	case "":
		m, err := probe()
		if err == nil {
			return m, authMunge, exitOK
		}
		if aclOn {
			return nil, authACL, exitOK
		}
		return nil, "", usageErr(e, "agent", "no way to tell users apart: %v, and Consul's ACLs are off; "+
			"start munge on every node with one key (apt-get install munge; the same /etc/munge/munge.key everywhere), "+
			"or turn on Consul's ACLs (docs/acl.md), or pass --auth none to let every local user run jobs as any user, root included", err)
	}
	return nil, "", usageErr(e, "agent", "--auth %q: want munge or none (default: munge where munged answers, else Consul's ACLs)", mode)
}

// clusterSealer is the sealer a command's requests and jobs need on the cluster behind
// s: this host's munged when any registered agent checks MUNGE credentials, else nil
// (a cluster with --auth none or Consul's ACLs only). Errors: munge missing or munged
// not answering here, when the cluster needs it.
func clusterSealer(ctx context.Context, e *env, s store.Store) (*identity.Munge, error) {
	c, err := allocator.RegisteredNodes(ctx, s)
	if err != nil {
		return nil, err
	}
	want := false
	for _, n := range c.Nodes {
		if n.Record.Auth == authMunge {
			want = true
			break
		}
	}
	if !want {
		return nil, nil
	}
	m, err := identity.Open(identity.SocketFrom(e.getenv))
	if err != nil {
		return nil, fmt.Errorf("the cluster's agents check MUNGE credentials: %w", err)
	}
	return m, nil
}

// sealerErr reports a command that cannot make the credential its cluster needs: one
// line naming munged's socket, exit 1 (nothing was done).
func sealerErr(e *env, cmd string, err error) int {
	if errors.Is(err, identity.ErrNoDaemon) || errors.Is(err, identity.ErrNoMunge) {
		return failErr(e, cmd, fmt.Errorf("the cluster's agents check MUNGE credentials and this host cannot make one: %w", err))
	}
	return failErr(e, cmd, err)
}

// asker is who a command asks the elected agent as, through a request box: the Unix
// user running it, its credentials made by m.
func asker(m *identity.Munge) job.Asker {
	as := job.Asker{User: currentUser(), Wait: job.DefaultRequestWait}
	if m != nil { // a nil *identity.Munge is no nil Prover
		as.Prover = m
	}
	return as
}

// userOf is uid's user name here, or the number when this host does not know it.
func userOf(uid uint32) string {
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
		return u.Username
	}
	return strconv.FormatUint(uint64(uid), 10)
}
