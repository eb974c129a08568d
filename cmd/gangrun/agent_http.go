package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/topology"
)

// checkListenAddr checks a HOST:PORT flag value ("" is off): a port from 0 (any free
// one, logged) to 65535 and a host that is empty (every address), an IP, or a name.
func checkListenAddr(flag, v string) error {
	if v == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("%s %q: want HOST:PORT, as 127.0.0.1:9410 or :9410", flag, v)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%s %q: port %q is not a number from 0 to 65535", flag, v, port)
	}
	return nil
}

// The HTTP server's limits: a slow or stuck client holds a connection this long.
const (
	httpReadHeaderTimeout = 10 * time.Second
	httpWriteTimeout      = 30 * time.Second
	httpShutdownWait      = 2 * time.Second
)

// serveHTTP serves h on ln until ctx ends.
func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: httpReadHeaderTimeout, WriteTimeout: httpWriteTimeout}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), httpShutdownWait)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	_ = srv.Serve(ln)
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
