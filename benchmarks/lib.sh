# Sourced by the benchmark scripts that need a Consul of their own.

# port prints a free TCP port on loopback.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_consul LOG starts a Consul dev agent ($consul) on free loopback ports, logging to
# LOG, and returns once it has a leader; it sets consul_pid and http (its HTTP port).
start_consul() {
  http=$(port)
  "$consul" agent -dev -bind 127.0.0.1 -client 127.0.0.1 -http-port "$http" -server-port "$(port)" \
    -serf-lan-port "$(port)" -serf-wan-port "$(port)" -dns-port -1 -grpc-port -1 -hcl 'ports { grpc_tls = -1 }' \
    -log-level warn >"$1" 2>&1 &
  consul_pid=$!
  until curl -sf "127.0.0.1:$http/v1/status/leader" | grep -q 127; do sleep 0.1; done
}

# start_munged starts a munged with a new key of its own in a new directory under /tmp
# (0755: munged wants every directory above its socket searchable by all) and exports
# MUNGE_SOCKET, so the agents started after it check MUNGE credentials, as on a default
# cluster, and the commands make them; it sets munged_pid and munged_dir, which
# stop_munged removes. Debian's munge: scripts/install-deps.sh munge.
start_munged() {
  munged_dir=$(mktemp -d /tmp/gangrun-bench-munge-XXXXXX)
  chmod 0755 "$munged_dir"
  /usr/sbin/mungekey --create --keyfile "$munged_dir/munge.key"
  /usr/sbin/munged --socket "$munged_dir/socket" --key-file "$munged_dir/munge.key" --pid-file "$munged_dir/munged.pid" \
    --seed-file "$munged_dir/munged.seed" --log-file "$munged_dir/munged.log"
  munged_pid=$(cat "$munged_dir/munged.pid")
  export MUNGE_SOCKET="$munged_dir/socket"
}

# stop_munged stops start_munged's munged and removes its directory.
stop_munged() {
  if [ -n "${munged_pid:-}" ]; then kill "$munged_pid" 2>/dev/null || true; fi
  if [ -n "${munged_dir:-}" ]; then rm -rf "$munged_dir"; fi
}

# low_port prints a port free now on loopback and on every interface, below the kernel's
# ephemeral range (32768 up), where no client socket takes it meanwhile (as
# benchmarks/goodput.py's free_port).
low_port() {
  python3 -c '
import random, socket
while True:
    p = random.randrange(10000, 20000)
    try:
        for h in ("127.0.0.1", "0.0.0.0"):
            s = socket.socket(); s.bind((h, p)); s.close()
    except OSError:
        continue
    print(p); break'
}
