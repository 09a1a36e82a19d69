package egress

import (
	"crypto/tls"
	"net"
	"syscall"
)

// peerClosed reports whether the server has closed conn, or sent something
// unasked, while it sat idle: a look at its socket that neither waits nor
// takes a byte. A connection it cannot look into (not a socket) passes.
func peerClosed(conn net.Conn) bool {
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	closed := false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// 0 bytes: the peer's FIN. Bytes: an answer to nothing (a 408, a TLS
		// alert), after which the connection cannot carry a request. An error
		// other than "nothing to read": a reset.
		closed = err == nil || err != syscall.EAGAIN && err != syscall.EINTR
		return true // never wait for the socket to become readable
	})
	return closed || err != nil
}
