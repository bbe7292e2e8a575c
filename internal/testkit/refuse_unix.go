//go:build unix

package testkit

import (
	"net"
	"syscall"
	"testing"
)

// Refusing returns a loopback address that refuses every connection: its
// port is bound, for the rest of the test, by a socket that never listens.
// A client that must find no server there is sure not to find one, with no
// port guessed free.
func Refusing(t testing.TB) string {
	t.Helper()
	syscall.ForkLock.RLock() // no child inherits it between the two calls
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("getsockname: %v", err)
	}
	in := sa.(*syscall.SockaddrInet4)
	return (&net.TCPAddr{IP: in.Addr[:], Port: in.Port}).String()
}
