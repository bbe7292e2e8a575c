//go:build !unix

package listen

import (
	"errors"
	"net"
)

func inherited(int, string) (net.Listener, error) {
	return nil, errors.New("inherited sockets are supported on Unix only")
}
