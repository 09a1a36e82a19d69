package postgres

import (
	"context"
	"crypto/tls"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestConnectionsGiveUpOnADeadPeer: the Store's connections, in both pools,
// have keepalive probes and TCP_USER_TIMEOUT set, so that a peer gone
// without a reset fails them within seconds rather than the kernel's
// quarter of an hour (see dialer).
func TestConnectionsGiveUpOnADeadPeer(t *testing.T) {
	s := MustOpenTest(t)
	ctx := context.Background()
	check := func(what string, c net.Conn) {
		t.Helper()
		if tc, ok := c.(*tls.Conn); ok {
			c = tc.NetConn()
		}
		sc, ok := c.(syscall.Conn)
		if !ok {
			t.Fatalf("%s: a %T, not a socket", what, c)
		}
		raw, err := sc.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var keepAlive, idle, interval, count, user int
		var errs [5]error
		raw.Control(func(fd uintptr) {
			keepAlive, errs[0] = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE)
			idle, errs[1] = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE)
			interval, errs[2] = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL)
			count, errs[3] = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT)
			user, errs[4] = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, optTCPUserTimeout)
		})
		for _, err := range errs {
			if err != nil {
				t.Fatalf("%s: getsockopt: %v", what, err)
			}
		}
		if keepAlive != 1 || idle != int(keepAliveIdle.Seconds()) || interval != int(keepAliveInterval.Seconds()) ||
			count != keepAliveCount || user != int(tcpUserTimeout.Milliseconds()) {
			t.Errorf("%s: keepalive %d idle %d s interval %d s count %d, user timeout %d ms", what, keepAlive, idle, interval, count, user)
		}
	}
	for what, pool := range map[string]*pgxpool.Pool{"pool": s.pool, "queue pool": s.queue} {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		check(what, c.Conn().PgConn().Conn())
		c.Release()
	}
}
