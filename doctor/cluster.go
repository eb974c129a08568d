package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	"golang.org/x/sys/unix"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// serverClockTimeout bounds each try of a Consul server's HTTP API for its clock.
const serverClockTimeout = 2 * time.Second

// clock checks that the kernel calls its clock synchronized (adjtimex's STA_UNSYNC,
// what timedatectl's "System clock synchronized" reads), and compares it with the
// Consul servers': off by more than the session TTL fails (what gangrun and munge
// compare across nodes would disagree), by more than a second warns. The servers'
// clock is read from the Date header of a server's HTTP answer: the agent's Consul
// when it is a server, else each server's HTTP API (the raft peers' addresses, on the
// agent's HTTP port) until one answers; when none does, the Consul agent's own when it
// is on another host, else it cannot be compared (a warning saying how to).
func (r *run) clock(ctx context.Context) Result {
	synced, maxErr, syncErr := kernelSynced()
	var note string
	var st Status = OK
	switch {
	case syncErr != nil:
		note, st = "the kernel's clock state cannot be read: "+syncErr.Error(), Warn
	case !synced:
		note, st = "the kernel says this clock is not synchronized (no NTP)", Warn
	default:
		note = fmt.Sprintf("synchronized (max error %s)", maxErr)
	}
	syncFix := "run an NTP client (chrony, systemd-timesyncd) on every node and Consul server"
	s := r.cfg.Consul
	if s == nil || !r.consulUp {
		res := Result{Status: Skip, Detail: note + "; not compared with the Consul servers': Consul does not answer"}
		if st == Warn {
			res.Status, res.Fix = Warn, syncFix
		}
		return res
	}
	c, whose, err := serversClock(ctx, s)
	if err != nil {
		return Result{Status: Warn, Detail: note + "; not compared with the Consul servers': " + err.Error(),
			Fix: "compare by hand: date -u here and on a Consul server; " + syncFix}
	}
	skew, unc := c.Skew()
	out := clockOutcome(skew, unc, r.cfg.SessionTTL)
	out.Detail = fmt.Sprintf("%s; %s (%s)", note, out.Detail, whose)
	if out.Status == OK && st == Warn {
		out.Status = Warn
	}
	if out.Status != OK {
		out.Fix = syncFix
	}
	return out
}

// clockOutcome judges a skew from the servers' clock and its uncertainty (both
// store.Clock.Skew's): beyond ttl for certain fails, beyond a second for certain warns.
func clockOutcome(skew, unc, ttl time.Duration) Result {
	abs := skew
	if abs < 0 {
		abs = -abs
	}
	certain := abs - unc // at least this far off
	dir := "ahead of"
	if skew < 0 {
		dir = "behind"
	}
	switch {
	case certain > ttl:
		return Result{Status: Fail, Detail: fmt.Sprintf("the Consul servers' clock is %s %s this one (±%s): more than the %s session TTL",
			abs.Round(time.Millisecond), dir, unc.Round(time.Millisecond), ttl)}
	case certain > time.Second:
		return Result{Status: Warn, Detail: fmt.Sprintf("the Consul servers' clock is %s %s this one (±%s): within the %s session TTL, but not synchronized",
			abs.Round(time.Millisecond), dir, unc.Round(time.Millisecond), ttl)}
	}
	return Result{Status: OK, Detail: fmt.Sprintf("within %s of the Consul servers' clock", (abs + unc).Round(100*time.Millisecond))}
}

// kernelSynced reads the kernel's clock state (adjtimex): whether it is synchronized
// (STA_UNSYNC clear) and its maximum error.
func kernelSynced() (bool, time.Duration, error) {
	var tx unix.Timex
	if _, err := unix.Adjtimex(&tx); err != nil {
		return false, 0, fmt.Errorf("adjtimex: %w", err)
	}
	return tx.Status&unix.STA_UNSYNC == 0, time.Duration(tx.Maxerror) * time.Microsecond, nil
}

// serversClock reads a Consul server's clock and says whose it is.
func serversClock(ctx context.Context, s store.ConsulClient) (store.Clock, string, error) {
	addr, _ := s.Addr()
	host, port := splitHostPort(addr)
	peers, err := s.Client().Status().PeersWithQueryOptions((&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return store.Clock{}, "", fmt.Errorf("Consul's servers: %w", err)
	}
	var peerHosts []string
	for _, p := range peers {
		if h, _, err := net.SplitHostPort(p); err == nil {
			peerHosts = append(peerHosts, h)
		}
	}
	if containsHost(peerHosts, host) {
		c, err := s.Clock(ctx, "")
		return c, "the Consul agent at " + addr + " is a server", err
	}
	var tried []string
	if port != "" {
		for _, h := range peerHosts {
			target := net.JoinHostPort(h, port)
			tctx, cancel := context.WithTimeout(ctx, serverClockTimeout)
			c, err := s.Clock(tctx, target)
			cancel()
			if err == nil {
				return c, "the Consul server at " + target, nil
			}
			tried = append(tried, target)
		}
	}
	if host != "" && !isThisHost(host) {
		c, err := s.Clock(ctx, "")
		return c, "the Consul agent at " + addr + ", on another host", err
	}
	why := "no server's HTTP API answered"
	if len(tried) > 0 {
		why += " at " + strings.Join(tried, ", ")
	}
	return store.Clock{}, "", fmt.Errorf("the Consul agent at %s is a client on this host, whose clock is this one's, and %s", addr, why)
}

// splitHostPort splits a Consul address ("127.0.0.1:8500", "https://h:8501",
// "unix:///run/consul.sock"): host and port, "" for a socket.
func splitHostPort(addr string) (string, string) {
	if i := strings.Index(addr, "://"); i >= 0 {
		if addr[:i] == "unix" {
			return "", ""
		}
		addr = addr[i+3:]
	}
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, ""
	}
	return h, p
}

// containsHost reports whether hosts holds host, comparing IP addresses as addresses.
func containsHost(hosts []string, host string) bool {
	want, werr := netip.ParseAddr(host)
	for _, h := range hosts {
		if h == host {
			return true
		}
		if got, err := netip.ParseAddr(h); err == nil && werr == nil && got.Unmap() == want.Unmap() {
			return true
		}
	}
	return false
}

// isThisHost reports whether host names this machine: localhost, a loopback address,
// or an address of one of its interfaces.
func isThisHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false // a name: taken for another host
	}
	if ip.IsLoopback() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Unmap() == ip.Unmap() {
			return true
		}
	}
	return false
}

// version compares this binary's release (gangrun.Version) with the releases the
// registered agents' node records carry (allocator.NodeRecord.Release, read through
// internal/schema as every reader of the records does): this node's own agent running
// another release, or agents of several releases, warn (an upgrade under way, or one
// left half done: docs/operations.md, "Upgrades"); records with no release (agents of
// before 0.1.0) are said so, and a record of a newer schema than this binary reads
// counts as a newer release's.
func (r *run) version(ctx context.Context) Result {
	if r.cfg.Consul == nil || !r.consulUp {
		return Result{Status: Skip, Detail: fmt.Sprintf("this binary is %s; the cluster's versions not read: Consul does not answer", r.cfg.Version)}
	}
	entries, _, err := r.cfg.Consul.List(ctx, allocator.ClusterPrefix+"nodes/")
	if err != nil {
		return Result{Status: Warn, Detail: fmt.Sprintf("this binary is %s; the node records cannot be read: %v", r.cfg.Version, err)}
	}
	byVersion := map[string][]string{}
	var unversioned []string
	own := ""
	for _, e := range entries {
		node := strings.TrimPrefix(e.Key, allocator.ClusterPrefix+"nodes/")
		if strings.Contains(node, "/") {
			continue
		}
		var rec allocator.NodeRecord
		v := ""
		var newer *schema.NewerError
		switch err := schema.Unmarshal(schema.Node, e.Value, &rec); {
		case errors.As(err, &newer):
			v = fmt.Sprintf("a newer release (node record schema %d)", newer.Got)
		case err == nil:
			v = rec.Release
		}
		if v == "" {
			unversioned = append(unversioned, node)
			continue
		}
		byVersion[v] = append(byVersion[v], node)
		if node == r.cfg.Node {
			own = v
		}
	}
	if len(entries) == 0 {
		return Result{Status: OK, Detail: fmt.Sprintf("this binary is %s; no agent has registered yet", r.cfg.Version)}
	}
	if len(byVersion) == 0 {
		records := fmt.Sprintf("the %d registered agents' records carry", len(unversioned))
		if len(unversioned) == 1 {
			records = "the registered agent's record carries"
		}
		return Result{Status: Skip, Detail: fmt.Sprintf("this binary is %s; %s no version (agents of before 0.1.0, the first release)", r.cfg.Version, records)}
	}
	var parts []string
	var versions []string
	for v := range byVersion {
		versions = append(versions, v)
	}
	sort.Strings(versions)
	for _, v := range versions {
		parts = append(parts, fmt.Sprintf("%s on %d (%s)", v, len(byVersion[v]), busList(byVersion[v])))
	}
	if len(unversioned) > 0 {
		parts = append(parts, fmt.Sprintf("no version on %d (%s)", len(unversioned), busList(unversioned)))
	}
	detail := fmt.Sprintf("this binary is %s; the registered agents: %s", r.cfg.Version, strings.Join(parts, ", "))
	switch {
	case own != "" && own != r.cfg.Version:
		return Result{Status: Warn, Detail: detail + fmt.Sprintf("; the agent registered as %s runs %s", r.cfg.Node, own),
			Fix: "restart the agent to run this binary (systemctl restart gangrun-agent), or run the doctor of the agent's version"}
	case len(byVersion) > 1 || len(unversioned) > 0 || versions[0] != r.cfg.Version:
		return Result{Status: Warn, Detail: detail, Fix: "finish the upgrade node by node (docs/operations.md)"}
	}
	return Result{Status: OK, Detail: detail}
}
