package postgres

import (
	"net"
	"time"
)

// Dead connections. A connection whose peer vanished without a reset (a
// failover, a route or NAT entry gone) answers nothing: the default
// keepalive (9 probes 15 s apart after 15 s idle) takes 2.5 min to find an
// idle one dead, and the kernel retransmits a request in flight for a
// quarter of an hour or more. Every connection the
// Store opens asks the kernel to give up sooner: keepalive probes after
// 15 s idle, every 5 s, 3 of them; and, where the system has it, a request
// left unacknowledged for 30 s ends the connection (TCP_USER_TIMEOUT). All
// dead connections then fail at once, and pgx opens new ones; the callers'
// own timeouts (StoreTimeout) remain for a server that acknowledges and
// does not answer.
const (
	keepAliveIdle     = 15 * time.Second
	keepAliveInterval = 5 * time.Second
	keepAliveCount    = 3
	tcpUserTimeout    = 30 * time.Second
)

// dialer returns the dialer of the Store's connections; connectTimeout is
// the URL's connect_timeout (0: none).
func dialer(connectTimeout time.Duration) *net.Dialer {
	return &net.Dialer{
		Timeout: connectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount,
		},
		Control: setUserTimeout,
	}
}
