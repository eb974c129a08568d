package agent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/metrics"
	"github.com/gangrun/gangrun/statuspage"
	"github.com/gangrun/gangrun/topology"
)

// Stop is what stops a running agent, as Run logs it: Stopped is closed at the first
// terminating signal, Signal is that signal. *proc.SignalWatch is one.
type Stop interface {
	Stopped() <-chan struct{}
	Signal() syscall.Signal
}

// Run runs the agent until ctx ends (ctx should end on stop's signal, as the context
// of proc.WatchSignals does) or its registration fails for good. It makes the state
// directory and a directory for the steps' own messages, then starts, each in a
// goroutine: the stop's log line, the step launcher, the HTTP servers, the job
// mapping and the waste watch; and runs the allocator agent (registration, election,
// what runs while it leads) in its own. When that returns, the launcher is stopped
// first and waited for (no step starts after it), the steps' directory is removed
// unless a step it started still runs, and then every other goroutine is stopped and
// waited for before Run returns. Errors: the directories' (the state directory's
// naming --state-dir), or the allocator agent's.
func (a *Agent) Run(ctx context.Context, stop Stop) error {
	if err := os.MkdirAll(a.cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	stepLogs, err := os.MkdirTemp("", "gangrun-agent-"+a.cfg.Node+"-")
	if err != nil {
		return err
	}
	a.log.Info("the steps' own messages", zap.String("dir", stepLogs))
	gctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // runs before wg.Wait: deferred calls run last-in first-out
	goJoined(&wg, func() { a.logStop(gctx, stop) })
	lctx, stopLauncher := context.WithCancel(gctx)
	defer stopLauncher()
	launcherDone := make(chan struct{})
	goJoined(&wg, func() {
		defer close(launcherDone)
		_ = job.RunLauncher(lctx, job.LauncherConfig{Store: a.cfg.Store, Node: a.cfg.Node, Log: a.log.Named("jobs"),
			StateDir: a.cfg.StateDir, Spawn: a.spawner(stepLogs)})
	})
	a.serve(gctx, &wg)
	a.watch(gctx, &wg)
	if err := a.alloc.Run(gctx); err != nil {
		return err
	}
	stopLauncher()
	<-launcherDone // it starts no step from here on
	if n := a.steps.Load(); n > 0 {
		a.log.Info("leaving the steps' own messages: steps this agent started still run", zap.String("dir", stepLogs), zap.Int64("steps", n))
	} else if err := os.RemoveAll(stepLogs); err != nil {
		a.log.Warn("remove the steps' own messages", zap.Error(err))
	}
	return nil
}

// goJoined runs f in a goroutine that wg waits for.
func goJoined(wg *sync.WaitGroup, f func()) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		f()
	}()
}

// logStop logs "stopping" with the signal when stop's signal comes before ctx ends.
func (a *Agent) logStop(ctx context.Context, stop Stop) {
	if stop == nil {
		return
	}
	select {
	case <-stop.Stopped():
		a.log.Info("stopping", zap.String("signal", proc.SignalName(stop.Signal())))
	case <-ctx.Done():
	}
}

// serve starts the metrics' server and the status page's (those with a listener),
// each until ctx ends, in goroutines wg waits for.
func (a *Agent) serve(ctx context.Context, wg *sync.WaitGroup) {
	exposition := metrics.Handler(a.gpus, metrics.NewNodeCollector(a.view, a.cfg.Node), a.sched,
		metrics.NewJobCollector(a.cfg.Store, a.cfg.Node, 0, 0))
	if a.metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", exposition)
		goJoined(wg, func() { serveHTTP(ctx, a.metricsLn, mux) })
		a.log.Info("serving metrics", zap.String("url", "http://"+a.metricsLn.Addr().String()+"/metrics"))
	}
	if a.httpLn != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", exposition)
		mux.Handle("/", statuspage.Handler(statuspage.Config{Store: a.cfg.Store, Node: a.cfg.Node, Utilization: a.gpus.Utilization}))
		goJoined(wg, func() { serveHTTP(ctx, a.httpLn, mux) })
		a.log.Info("serving the status page", zap.String("url", "http://"+a.httpLn.Addr().String()+"/"))
	}
}

// watch starts dcgm-exporter's job mapping (when a directory is given) and the GPU
// waste watch, each until ctx ends, in goroutines wg waits for.
func (a *Agent) watch(ctx context.Context, wg *sync.WaitGroup) {
	if dir := a.cfg.JobMapDir; dir != "" {
		goJoined(wg, func() {
			if err := metrics.WriteJobMapping(ctx, metrics.JobMappingConfig{Store: a.cfg.Store, Node: a.cfg.Node, Dir: dir,
				Inventory: a.inventory, Log: a.log.Named("dcgm-job-map")}); err != nil {
				a.log.Error("--dcgm-job-mapping-dir", zap.Error(err))
			}
		})
	}
	goJoined(wg, func() {
		_ = metrics.WatchWaste(ctx, metrics.WasteConfig{Store: a.cfg.Store, Node: a.cfg.Node, Session: a.alloc.Session,
			GPUs: a.gpus, View: a.view, Threshold: a.cfg.WasteThreshold, After: a.cfg.WasteAfter, Log: a.log.Named("waste")})
	})
}

// The HTTP server's limits: a slow or stuck client holds a connection this long.
const (
	httpReadHeaderTimeout = 10 * time.Second
	httpWriteTimeout      = 30 * time.Second
	httpShutdownWait      = 2 * time.Second
)

// serveHTTP serves h on ln until ctx ends; it returns once the server has shut down
// (open connections given httpShutdownWait to finish).
func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: httpReadHeaderTimeout, WriteTimeout: httpWriteTimeout}
	var wg sync.WaitGroup
	goJoined(&wg, func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), httpShutdownWait)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	_ = srv.Serve(ln)
	wg.Wait()
}

// tapHealth returns src, also telling note each change it reports (the metrics' Xids).
func tapHealth(src allocator.HealthSource, note func(topology.GPUHealthChange)) allocator.HealthSource {
	return func(ctx context.Context, inv *topology.Inventory, report func(topology.GPUHealthChange)) error {
		return src(ctx, inv, func(ch topology.GPUHealthChange) {
			note(ch)
			report(ch)
		})
	}
}
