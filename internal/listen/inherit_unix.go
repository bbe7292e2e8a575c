//go:build unix

package listen

import (
	"errors"
	"net"
	"os"
	"syscall"
)

// inherited takes over the listening socket at fd. It checks fd before it
// owns it: a descriptor that is no listening socket (a file, the terminal)
// is left open and untouched.
func inherited(fd int, name string) (net.Listener, error) {
	listening, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN)
	switch {
	case errors.Is(err, syscall.EBADF):
		return nil, errors.New("no such file descriptor was inherited")
	case errors.Is(err, syscall.ENOTSOCK):
		return nil, errors.New("the file descriptor is not a socket")
	case err != nil:
		return nil, err
	case listening == 0:
		return nil, errors.New("the socket is not listening")
	}
	f := os.NewFile(uintptr(fd), name)
	// The listener holds a duplicate; fd itself is closed so that the
	// socket has one owner in this process.
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, err
	}
	if _, ok := ln.(*net.TCPListener); !ok {
		ln.Close()
		return nil, errors.New("the socket is not a TCP socket")
	}
	return ln, nil
}
