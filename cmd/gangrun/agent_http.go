package main

import (
	"fmt"
	"net"
	"strconv"
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
