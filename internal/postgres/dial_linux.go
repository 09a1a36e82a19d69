package postgres

import (
	"strings"
	"syscall"
)

// optTCPUserTimeout is TCP_USER_TIMEOUT of <linux/tcp.h>, which package
// syscall does not name.
const optTCPUserTimeout = 0x12

// setUserTimeout sets TCP_USER_TIMEOUT on a TCP socket (see dialer).
func setUserTimeout(network, _ string, c syscall.RawConn) error {
	if !strings.HasPrefix(network, "tcp") {
		return nil
	}
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, optTCPUserTimeout, int(tcpUserTimeout.Milliseconds()))
	})
	if err != nil {
		return err
	}
	return serr
}
