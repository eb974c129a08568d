package hostlist

import "fmt"

// DNS's limits on a host name (RFC 1035 section 2.3.4; RFC 1123 section 2.1): at most
// 63 bytes between dots, at most 253 in all (255 on the wire, less the length byte of
// the first label and the root's).
const (
	MaxLabelBytes    = 63
	MaxHostnameBytes = 253
)

// CheckHostname returns an error when host is longer than DNS allows a host name, or
// has a label (a part between dots) longer than DNS allows one; nil otherwise. Expand
// does not call it: a hostlist may name things that are not hosts; the commands that
// print or take host names do.
func CheckHostname(host string) error {
	if len(host) > MaxHostnameBytes {
		return fmt.Errorf("host name %s: %d bytes: DNS allows %d", quote(host), len(host), MaxHostnameBytes)
	}
	start := 0
	for i := 0; i <= len(host); i++ {
		if i == len(host) || host[i] == '.' {
			if n := i - start; n > MaxLabelBytes {
				return fmt.Errorf("host name %s: a label of %d bytes: DNS allows %d between dots", quote(host), n, MaxLabelBytes)
			}
			start = i + 1
		}
	}
	return nil
}
