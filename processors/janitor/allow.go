package janitor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"time"
)

// A node's annotations are the node's own: its kubelet may edit them, so
// a compromised node may point faultline.io/bmc-address (or
// faultline.io/agent-address) at a host of its choosing, and
// faultline.io/bmc-secret at any Secret of the janitor's namespace, to be
// sent those credentials at its next reboot. The janitor therefore
// follows an address only into the networks configured for it (every
// address a host name resolves to, checked again on every connection so a
// name that resolves otherwise later, or a redirect, cannot leave them),
// and a Secret only when configured.

// Reasons of a refused annotation.
const (
	ReasonBMCAddressNotAllowed = "BMCAddressNotAllowed"
	ReasonBMCSecretNotAllowed  = "BMCSecretNotAllowed"
	// ReasonBMCAnnotationNotAllowed: redfish.labels_only, and the node
	// names its BMC only by its own annotation.
	ReasonBMCAnnotationNotAllowed = "BMCAnnotationNotAllowed"
	ReasonAgentAddressNotAllowed  = "AgentAddressNotAllowed"
	// ReasonBMCHTTPNotAllowed: faultline.io/bmc-address is an http://
	// URL (credentials in cleartext) and redfish.allow_http is not set.
	ReasonBMCHTTPNotAllowed = "BMCHTTPNotAllowed"
)

// networks is an allowlist of networks; empty allows nothing.
type networks []netip.Prefix

// parseNetworks parses CIDRs ("10.20.0.0/16", "fd00:bmc::/64"; a bare
// address is its own /32 or /128), naming key and the index of a bad one.
func parseNetworks(key string, cidrs []string) (networks, error) {
	var out networks
	for i, c := range cidrs {
		c = strings.TrimSpace(c)
		p, err := netip.ParsePrefix(c)
		if err != nil {
			a, aerr := netip.ParseAddr(c)
			if aerr != nil {
				return nil, fmt.Errorf("%s[%d]: %q is not a CIDR (10.20.0.0/16) or an address", key, i, c)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func (n networks) contains(a netip.Addr) bool {
	a = a.Unmap()
	return slices.ContainsFunc(n, func(p netip.Prefix) bool { return p.Contains(a) })
}

// lookupFunc resolves a host name (net.DefaultResolver's LookupNetIP).
type lookupFunc func(ctx context.Context, host string) ([]netip.Addr, error)

func defaultLookup(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// errNotAllowed is an address outside the allowlist.
type errNotAllowed struct{ msg string }

func (e *errNotAllowed) Error() string { return e.msg }

// check says why host (an address or a name: every address it resolves
// to) is not in n, key naming the allowlist; nil when it is.
func (n networks) check(ctx context.Context, lookup lookupFunc, key, host string) error {
	if len(n) == 0 {
		return &errNotAllowed{fmt.Sprintf("%s is empty: no address is allowed", key)}
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		addrs = []netip.Addr{a}
	} else {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if addrs, err = lookup(lctx, host); err != nil {
			return &errNotAllowed{fmt.Sprintf("%s does not resolve (%v), so it cannot be checked against %s", host, err, key)}
		}
		if len(addrs) == 0 {
			return &errNotAllowed{fmt.Sprintf("%s resolves to no address, so it cannot be checked against %s", host, key)}
		}
	}
	for _, a := range addrs {
		if !n.contains(a) {
			if a.String() == host {
				return &errNotAllowed{fmt.Sprintf("%s is not in %s", host, key)}
			}
			return &errNotAllowed{fmt.Sprintf("%s resolves to %s, which is not in %s", host, a, key)}
		}
	}
	return nil
}

// control refuses a connection to an address outside n (a net.Dialer's
// Control): the resolved address of every connection, redirects and a
// name that resolves otherwise since it was checked included.
func (n networks) control(key string) func(network, address string, _ syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return &errNotAllowed{fmt.Sprintf("connection to %s: not an address to check against %s", address, key)}
		}
		if !n.contains(ap.Addr()) {
			return &errNotAllowed{fmt.Sprintf("connection to %s: not in %s", address, key)}
		}
		return nil
	}
}

// notAllowed is err's errNotAllowed, nil when it is none.
func notAllowed(err error) *errNotAllowed {
	var na *errNotAllowed
	if errors.As(err, &na) {
		return na
	}
	return nil
}

// secretAllowed: name is in allowed (exact, or an entry ending in "*" as
// a prefix).
func secretAllowed(allowed []string, name string) bool {
	return slices.ContainsFunc(allowed, func(a string) bool {
		if p, ok := strings.CutSuffix(a, "*"); ok {
			return strings.HasPrefix(name, p)
		}
		return a == name
	})
}
