package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"syscall"
	"time"
)

// ErrNotLoopback is returned for a target that is not on this machine's
// loopback interface. The generator only ever loads the machine it runs on:
// a load test must never be pointed at someone else's server by a typo.
var ErrNotLoopback = errors.New("loadgen: target is not a loopback address (127.0.0.0/8 or ::1)")

// CheckLoopback parses an http(s) URL and checks that its host is, or
// resolves only to, loopback addresses.
func CheckLoopback(ctx context.Context, rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("loadgen: target %q: %w", rawURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("loadgen: target %q: scheme must be http or https", rawURL)
	}
	host := u.Hostname()
	if host == "" {
		return fmt.Errorf("loadgen: target %q has no host", rawURL)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if !isLoopback(ip) {
			return fmt.Errorf("%w: %s", ErrNotLoopback, host)
		}
		return nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("loadgen: resolve %s: %w", host, err)
	}
	if len(addrs) == 0 {
		return fmt.Errorf("loadgen: %s resolves to no address", host)
	}
	for _, a := range addrs {
		if !isLoopback(a) {
			return fmt.Errorf("%w: %s resolves to %s", ErrNotLoopback, host, a)
		}
	}
	return nil
}

func isLoopback(a netip.Addr) bool { return a.Unmap().IsLoopback() }

// dialLoopbackOnly runs on every socket before it connects, after name
// resolution: a name that resolved to a loopback address when checked and to
// another one later (or a redirect) still cannot leave the machine.
func dialLoopbackOnly(_ context.Context, _, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil || !isLoopback(ap.Addr()) {
		return fmt.Errorf("%w: refusing to dial %s", ErrNotLoopback, address)
	}
	return nil
}

// NewClient returns the client the generator uses by default: connections
// only to loopback addresses, no proxy from the environment, no redirects,
// an idle pool large enough that no connection is closed and reopened under
// load, no compression, and no Client.Timeout (each request carries its own
// deadline in its context).
func NewClient() *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second, ControlContext: dialLoopbackOnly}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         d.DialContext,
		MaxIdleConns:        0, // no limit across hosts
		MaxIdleConnsPerHost: 1 << 16,
		// A target that stops answering must not take every descriptor:
		// past this, requests wait for a connection (and that wait counts
		// in their latency, as it should in an open loop).
		MaxConnsPerHost:     4096,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 5 * time.Second,
		DisableCompression:  true,
	}
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
