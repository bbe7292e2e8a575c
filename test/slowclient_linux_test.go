package test

import (
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// slowClient is an HTTP client whose sockets have a 4 KiB receive buffer,
// so a server writing to a reader that stalls blocks within a few writes.
func slowClient(t *testing.T) *http.Client {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	tr := &http.Transport{DialContext: d.DialContext, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}
