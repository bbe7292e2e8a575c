package natsconn

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// kernelReceived is the bytes the kernel received on c's socket
// (TCP_INFO's bytes_received), read without touching the socket's reader
// or writer.
func kernelReceived(c net.Conn) (uint64, bool) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	var ierr error
	if err := raw.Control(func(fd uintptr) {
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || ierr != nil {
		return 0, false
	}
	return info.Bytes_received, true
}
