package job

import (
	"regexp"
	"slices"
	"strings"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/failure"
)

// Records an older gangrun wrote carry no failure kind: an attempt's (Attempt.Failure),
// a lost node's (LostNode.Kind), a drain's (allocator.Drain.Kind), and the root cause a
// node of an older release reported to the rendezvous (rendezvous.Failure.Kind), which
// this release's steps then record without one. Such records still reach this release
// during a rolling upgrade, and from the steps that outlive an agent's upgrade (they run
// the binary they started with), so their kind is read back from the sentences those
// releases wrote, once, here. The patterns are frozen copies of what releases before
// kinds wrote (launcher's hung and failureOf, proc.ExitStatus.String, allocator's drain
// on a failed GPU, the controller's requeue and pre-emption); they are never updated
// when this release rewords a sentence, and never applied to a record that carries a
// kind. Delete this file once no release without kinds can share a cluster (see
// docs/operations.md, "Upgrades").
var (
	legacyHang     = regexp.MustCompile(`\(--hang-timeout [^)]*\)|watchdog timer .* expired`)
	legacySignal   = regexp.MustCompile(`: signal SIG[A-Z0-9]+ \(\d+\)`)
	legacyExit     = regexp.MustCompile(`: exit code \d+`)
	legacyGPUDrain = regexp.MustCompile(`was drained: GPU \d+ failed`)
	legacyGPUFail  = regexp.MustCompile(`^GPU \d+ failed`) // a drain's own reason
)

// legacyPrefixes are how an older release's attempt causes began when a failure ended
// the attempt; any other kind-less cause (a success, a membership change, a
// cancellation) is no failure, whichever release wrote it.
var legacyPrefixes = []string{"failed: ", "requeued", "preempted by job ", "batch script: "}

// legacyKind returns the kind of failure an older release's attempt cause describes,
// as releases before kinds classified it; "" for none.
func legacyKind(cause string) failure.Kind {
	if !slices.ContainsFunc(legacyPrefixes, func(p string) bool { return strings.HasPrefix(cause, p) }) {
		return ""
	}
	switch {
	case strings.HasPrefix(cause, "preempted by job "):
		return failure.Preempted
	case legacyGPUDrain.MatchString(cause):
		return failure.GPUHealth
	case legacyHang.MatchString(cause):
		return failure.Hang
	case legacySignal.MatchString(cause):
		return failure.Signal
	case legacyExit.MatchString(cause):
		return failure.Exit
	case strings.HasPrefix(cause, "requeued"):
		return failure.NodeLost
	}
	return ""
}

// kind is the kind of failure that ended the attempt: its own, or, in a record an
// older release wrote, the one its cause describes.
func (a Attempt) kind() failure.Kind {
	if a.Failure != "" {
		return a.Failure
	}
	return legacyKind(a.Cause)
}

// kind is how the node was lost: its own kind, or, in a record an older release wrote,
// GPUHealth when its reason names a failed GPU's drain, else NodeLost.
func (l LostNode) kind() failure.Kind {
	switch {
	case l.Kind != "":
		return l.Kind
	case legacyGPUDrain.MatchString(l.Why):
		return failure.GPUHealth
	}
	return failure.NodeLost
}

// drainKind is the kind of failure that drained a node: the drain's own, or, in a
// drain an older release's agent wrote, GPUHealth when its reason names a failed GPU;
// "" for an operator's drain.
func drainKind(d allocator.Drain) failure.Kind {
	switch {
	case d.Kind != "":
		return d.Kind
	case legacyGPUFail.MatchString(d.Reason):
		return failure.GPUHealth
	}
	return ""
}
