// Package listen opens a part's TCP listener from its listen address. An
// address is either host:port, bound here, or fd:N: a socket already
// listening that the process inherited as file descriptor N. That is how a
// systemd .socket unit hands its sockets to a service (the first is fd:3),
// and how `make cluster` keeps each part's port across the part's restarts:
// the socket belongs to whoever started the process, so the port is never
// released and nobody else can take it in between.
package listen

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// FDPrefix starts a listen address naming an inherited socket.
const FDPrefix = "fd:"

// Listen returns a TCP listener for addr: fd:N takes over the listening
// socket at file descriptor N, anything else is bound with net.Listen.
func Listen(addr string) (net.Listener, error) {
	n, ok := strings.CutPrefix(addr, FDPrefix)
	if !ok {
		return net.Listen("tcp", addr)
	}
	fd, err := strconv.Atoi(n)
	if err != nil || fd < 0 {
		return nil, fmt.Errorf("listen address %q: want fd:N, N the number of an inherited listening socket", addr)
	}
	ln, err := inherited(fd, addr)
	if err != nil {
		return nil, fmt.Errorf("listen address %q: %w", addr, err)
	}
	return ln, nil
}
