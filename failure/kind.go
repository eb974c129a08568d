// Package failure names the kinds of failure that end an attempt of a gang, so that
// the supervisor that decides a failure (launcher), the rendezvous that tells the other
// nodes, and the job controller that counts restarts by cause (job.State.RestartsByCause,
// the metric gangrun_job_restarts_total) switch on a kind, and never parse a sentence
// back. The sentence beside a kind (rendezvous.Failure.Reason, job.Attempt.Cause) is for
// people and logs only: rewording it changes no label.
package failure

// Kind is the class of a failure, as records in Consul carry it (a JSON string). The
// zero value, "", is no kind: an end that was no failure (a success, a membership
// change), or a record an older gangrun wrote before records carried kinds.
//
// The values that have a cause of gangrun_job_restarts_total with the same meaning are
// that cause's label value ("worker_exit", "signal", ...), so a kind reads as the
// dashboards do; job.CauseOf maps every kind to its cause.
type Kind string

// The kinds, by who decides them.
const (
	// Exit: a worker exited with a non-zero code (the launcher's supervisor).
	Exit Kind = "worker_exit"
	// Signal: a worker was killed by a signal, the kernel's OOM killer's included (the
	// launcher's supervisor).
	Signal Kind = "signal"
	// Hang: the supervisor's --hang-timeout stopped the gang: no output from any rank,
	// or no heartbeat from one, for that long.
	Hang Kind = "hang"
	// Watchdog: a rank's torch.distributed.elastic.timer watchdog timer expired (the
	// supervisor serves torch's timer server).
	Watchdog Kind = "watchdog"
	// StartError: the supervisor could not start the attempt's workers (their
	// specification, the TCPStore it serves, the processes themselves).
	StartError Kind = "start_error"
	// NodeLost: a node of the attempt was lost (down, cut off, its step gone, drained
	// by an operator); the job controller decides it.
	NodeLost Kind = "node_lost"
	// GPUHealth: a node of the attempt was drained because one of its GPUs failed (the
	// agent's health watch: an Xid, ECC, NVML's verdict).
	GPUHealth Kind = "gpu_health"
	// Preempted: a job of a higher tier pre-empted the job (the job controller).
	Preempted Kind = "preempted"
)

// Kinds returns every kind, in the order they are declared.
func Kinds() []Kind {
	return []Kind{Exit, Signal, Hang, Watchdog, StartError, NodeLost, GPUHealth, Preempted}
}
