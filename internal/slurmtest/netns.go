package slurmtest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The nodes' network (Options.Netns): a /24 inside the cluster's own network
// namespaces, which nothing outside them reaches or sees, so that two clusters at once
// may both use it.
const (
	// subnet is the network's first three octets: the controller is subnet.1 (on the
	// bridge), node i is subnet.(nodeBase+i).
	subnet   = "10.77.0"
	nodeBase = 10
)

// network is the cluster's namespaces: the controller's, holding the bridge br0 that
// every node's veth is attached to, and one a node, each named under /run/netns.
type network struct {
	// ctl is the controller's namespace's name; nodes are the nodes', in node order.
	ctl   string
	nodes []string
	// addrs are the nodes' addresses, in node order; ctlAddr the controller's.
	addrs   []string
	ctlAddr string
}

// newNetwork makes the namespaces of a cluster of nodes (names, in order), removed at
// the test's end (their veths and bridge go with them): the controller's, with br0 at
// subnet.1/24, and one a node with eth0 at subnet.(10+i)/24 wired to br0, loopback up
// in each.
func newNetwork(t testing.TB, names []string) *network {
	t.Helper()
	lookPath(t, "ip")
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	prefix := "gangrun-" + hex.EncodeToString(b[:])
	n := &network{ctl: prefix + "-ctl", ctlAddr: subnet + ".1"}
	t.Cleanup(n.remove)
	ip(t, "netns", "add", n.ctl)
	ip(t, "-n", n.ctl, "link", "set", "lo", "up")
	ip(t, "-n", n.ctl, "link", "add", "br0", "type", "bridge")
	ip(t, "-n", n.ctl, "addr", "add", n.ctlAddr+"/24", "dev", "br0")
	ip(t, "-n", n.ctl, "link", "set", "br0", "up")
	for i := range names {
		ns := fmt.Sprintf("%s-n%d", prefix, i)
		n.nodes = append(n.nodes, ns)
		addr := fmt.Sprintf("%s.%d", subnet, nodeBase+i)
		n.addrs = append(n.addrs, addr)
		ip(t, "netns", "add", ns)
		port := fmt.Sprintf("v%d", i)
		ip(t, "-n", n.ctl, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
		ip(t, "-n", n.ctl, "link", "set", port, "master", "br0", "up")
		ip(t, "-n", ns, "link", "set", "lo", "up")
		ip(t, "-n", ns, "addr", "add", addr+"/24", "dev", "eth0")
		ip(t, "-n", ns, "link", "set", "eth0", "up")
	}
	return n
}

// remove deletes the namespaces (what still runs in one keeps it alive, unnamed, until
// it exits: Cluster.stop has stopped the daemons before).
func (n *network) remove() {
	for _, ns := range append([]string{n.ctl}, n.nodes...) {
		if _, err := os.Stat(filepath.Join("/run/netns", ns)); err == nil {
			_ = exec.Command("ip", "netns", "del", ns).Run()
		}
	}
}

// hosts is the nodes' /etc/hosts: loopback, the controller's host name at its address,
// every node's name at its address (the node's own name included, never 127.0.1.1).
func (n *network) hosts(ctlHost string, names []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "127.0.0.1 localhost\n%s %s\n", n.ctlAddr, ctlHost)
	for i, name := range names {
		fmt.Fprintf(&b, "%s %s\n", n.addrs[i], name)
	}
	return b.String()
}

// in returns name and args run in namespace ns's network (nsenter --net).
func in(ns, name string, args ...string) (string, []string) {
	return "nsenter", append([]string{"--net=" + filepath.Join("/run/netns", ns), "--", name}, args...)
}

// nodeCommand is slurmd of node name (index i) run in the node's namespaces: its
// network namespace, and UTS and mount namespaces of its own in which the host name is
// name and hostsFile is bind-mounted on /etc/hosts, so that the node's jobs see both.
func (n *network) nodeCommand(i int, name, hostsFile string, slurmdArgs ...string) (string, []string) {
	script := `hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec slurmd "$@"`
	args := append([]string{"--uts", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", name, hostsFile}, slurmdArgs...)
	return in(n.nodes[i], "unshare", args...)
}

// ip runs ip(8) with args; the test fails on an error.
func ip(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("slurmtest: ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}
