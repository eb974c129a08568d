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
