package web

import (
	"cmp"
	"math"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Defaults of LoginLimit.
const (
	DefaultLoginFailures   = 10
	DefaultLoginEvery      = time.Minute
	DefaultLoginMaxClients = 10000
)

// LoginLimit bounds the failed logins of each client address. A client may
// fail Failures times at once, and once more after each Every; beyond that
// its logins answer 429 with Retry-After, without the token being checked.
// A successful login does not count. The addresses of an IPv6 /64 are one
// client. At most MaxClients addresses are remembered: when a new one
// comes, the one closest to being forgiven is forgotten first. Zero values
// take the defaults (10 failures, one more a minute, 10000 clients); a
// negative Failures turns the limit off.
//
// The client is the connection's peer address: behind a reverse proxy every
// client shares the proxy's. X-Forwarded-For is not read, as any client may
// write it.
type LoginLimit struct {
	Failures   int
	Every      time.Duration
	MaxClients int
}

// loginLimiter implements LoginLimit as a generic cell rate algorithm: each
// client holds the instant its failures are all forgiven. It is safe for
// concurrent use.
type loginLimiter struct {
	mu         sync.Mutex
	every      time.Duration
	slack      time.Duration // (Failures-1)·Every: how far ahead clear may be
	maxClients int
	clear      map[string]time.Time // client → when its failures are forgiven
}

func newLoginLimiter(l LoginLimit) *loginLimiter {
	if l.Failures < 0 {
		return nil
	}
	failures := cmp.Or(l.Failures, DefaultLoginFailures)
	every := cmp.Or(max(l.Every, 0), DefaultLoginEvery)
	return &loginLimiter{every: every, slack: time.Duration(failures-1) * every,
		maxClients: cmp.Or(max(l.MaxClients, 0), DefaultLoginMaxClients), clear: map[string]time.Time{}}
}

// take counts a failed login of client at now, before the token is checked,
// so that concurrent attempts cannot all slip past the limit; refund takes
// it back when the login succeeds. When the client has no failure left,
// take counts nothing and reports how long until it has one, in whole
// seconds (≥ 1 s). A nil limiter allows everything.
func (l *loginLimiter) take(client string, now time.Time) (retryAfter time.Duration, ok bool) {
	if l == nil {
		return 0, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	clear, known := l.clear[client]
	if !known {
		l.makeRoom(now)
	}
	if clear.Before(now) {
		clear = now
	}
	if wait := clear.Sub(now) - l.slack; wait > 0 {
		return time.Duration(math.Ceil(wait.Seconds())) * time.Second, false
	}
	l.clear[client] = clear.Add(l.every)
	return 0, true
}

// refund takes back the failure take counted.
func (l *loginLimiter) refund(client string, now time.Time) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	clear, ok := l.clear[client]
	if !ok {
		return
	}
	if clear = clear.Add(-l.every); clear.After(now) {
		l.clear[client] = clear
	} else {
		delete(l.clear, client)
	}
}

// makeRoom makes sure one more client fits: it forgets the clients whose
// failures are all forgiven and, if that is not enough, the one closest to
// being forgiven. l.mu is held.
func (l *loginLimiter) makeRoom(now time.Time) {
	if len(l.clear) < l.maxClients {
		return
	}
	var oldest string
	var oldestClear time.Time
	for c, t := range l.clear {
		if !t.After(now) {
			delete(l.clear, c)
			continue
		}
		if oldest == "" || t.Before(oldestClear) {
			oldest, oldestClear = c, t
		}
	}
	if len(l.clear) >= l.maxClients {
		delete(l.clear, oldest)
	}
}

// clientOf names the client of a request for the login limit: its peer's
// IPv4 address, or IPv6 /64.
func clientOf(r *http.Request) string {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		// Not an IP peer (a test, a Unix socket): one client.
		return "other"
	}
	a := ap.Addr().Unmap()
	if a.Is4() {
		return a.String()
	}
	p, _ := a.WithZone("").Prefix(64)
	return p.String()
}
