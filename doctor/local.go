package doctor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/cgroup"
)

// mungeProbeTimeout bounds munged's probe, as the agent's own check at start does.
const mungeProbeTimeout = 15 * time.Second

// mungeFix is what to do about a munged that does not answer.
const mungeFix = "install munge with the cluster's key and start it: apt-get install munge; copy /etc/munge/munge.key from another node (mode 0400, owner munge); systemctl restart munge"

// munge checks that munged answers and decodes what it encodes here, as the agent's
// --auth needs: with --auth munge, or by default when Consul's ACLs are off (the agent
// then refuses to start without it), a munged that does not answer fails; by default
// with the ACLs on, the agent tells users apart by their tokens instead (a warning);
// with --auth none nothing is checked (a warning: anyone may run jobs as anyone).
func (r *run) munge(ctx context.Context) Result {
	if r.cfg.Auth == "none" {
		return Result{Status: Warn, Detail: "the agent's auth is none: no credential is checked, any local user who reaches Consul can run jobs as any user, root included",
			Fix: "start munge on every node with one key and leave auth unset (docs/acl.md)"}
	}
	socket := r.cfg.MungeSocket
	if socket == "" {
		socket = identity.DefaultSocket
	}
	caller, err := probeMunge(ctx, socket)
	if err == nil {
		return Result{Status: OK, Detail: fmt.Sprintf("munged answers at %s and decodes its own credential (uid %d); that its key is the cluster's shows only on another node", socket, caller.UID)}
	}
	detail := err.Error() // names the socket
	switch {
	case r.cfg.Auth == "munge":
		return Result{Status: Fail, Detail: detail + " (the agent's auth is munge: it will not start)", Fix: mungeFix}
	case r.aclOn:
		return Result{Status: Warn, Detail: detail + " (the agent will tell users apart by Consul's ACL tokens instead)", Fix: mungeFix}
	case !r.consulUp:
		return Result{Status: Fail, Detail: detail + " (and Consul did not say whether its ACLs are on: without either the agent refuses to start)", Fix: mungeFix}
	}
	return Result{Status: Fail, Detail: detail + " (and Consul's ACLs are off: the agent refuses to start)", Fix: mungeFix}
}

// probeMunge opens libmunge for socket and has munged encode and decode a credential.
func probeMunge(ctx context.Context, socket string) (identity.Caller, error) {
	m, err := identity.Open(socket)
	if err != nil {
		return identity.Caller{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, mungeProbeTimeout)
	defer cancel()
	return m.Probe(ctx)
}

// cgroup makes a step's cgroup here and removes it again, as a step would (cgroup.New
// with a pids limit and a devices rule), and says which controllers it got. A node
// whose cgroups cannot confine a step is a warning: steps then run unconfined (their
// default, --cgroup auto), saying why.
func (r *run) cgroup(context.Context) Result { return trialCgroup() }

// trialCgroup is the cgroup check on this machine.
func trialCgroup() Result {
	name := "gangrun-doctor-" + strconv.Itoa(os.Getpid())
	step, err := cgroup.New(name, cgroup.Limits{PidsLimit: cgroup.DefaultPidsLimit,
		Devices: []cgroup.DeviceRule{{Type: "c", Major: cgroup.NVIDIAMajor, Minor: 0, Access: "rwm", Path: "/dev/nvidia0"}}})
	var unusable *cgroup.Unusable
	switch {
	case errors.As(err, &unusable):
		return Result{Status: Warn, Detail: "steps run unconfined (no cpuset, memory, pids or GPU limits): " + err.Error(),
			Fix: "run the agent as root under its systemd unit (Delegate=yes); on cgroup v2 see docs/operations.md, \"cgroups\""}
	case err != nil:
		return Result{Status: Fail, Detail: "a step's cgroup cannot be made: " + err.Error()}
	}
	kind := "cgroup v1"
	if step.V2() {
		kind = "cgroup v2"
	}
	dirs := step.Dirs()
	detail := fmt.Sprintf("a step's cgroup made and removed (%s, controllers %s, in %s)", kind, strings.Join(step.Controllers(), ", "), dirs[0])
	if len(dirs) > 1 {
		detail = fmt.Sprintf("a step's cgroup made and removed (%s, controllers %s, e.g. %s)", kind, strings.Join(step.Controllers(), ", "), dirs[0])
	}
	why := step.Why()
	if err := step.Delete(); err != nil {
		return Result{Status: Fail, Detail: "a step's cgroup was made but cannot be removed: " + err.Error()}
	}
	if step.V2() {
		detail += "; made from this shell's cgroup: the agent's steps go beside the agent's own (docs/operations.md, \"cgroups\")"
	}
	if why != "" {
		return Result{Status: Warn, Detail: detail + "; but " + why,
			Fix: "give the steps' parent cgroup the controllers (cgroup.subtree_control; on a hybrid node, leave GANGRUN_CGROUP2_ROOT unset): docs/operations.md, \"cgroups\""}
	}
	return Result{Status: OK, Detail: detail}
}
