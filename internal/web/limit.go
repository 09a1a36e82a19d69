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

// Defaults of PageLimit: the API's per-token limit.
const (
	DefaultPagesPerSecond = 100
	DefaultPageBurst      = 200
)

// PageLimit bounds the page requests of each token's sessions together, as
// the API bounds the token's requests (in a bucket of its own, so the
// dashboard and the token's API clients do not hold each other up): Burst
// at once, PerSecond more each second; beyond that a page answers 429 with
// Retry-After. Zero values take the defaults (100/s, burst 200); a negative
// PerSecond turns the limit off.
type PageLimit struct {
	PerSecond float64
	Burst     int
}

// maxLimitedTokens bounds the tokens the page limit remembers.
const maxLimitedTokens = 10000

// limiter is a generic cell rate algorithm per key: a key may take burst
// at once and one more after each every; each key holds the instant all it
// took is given back. It remembers at most maxKeys keys. It is safe for
// concurrent use; a nil limiter allows everything.
type limiter struct {
	mu      sync.Mutex
	every   time.Duration
	slack   time.Duration // (burst-1)·every: how far ahead clear may be
	maxKeys int
	clear   map[string]time.Time // key → when all it took is given back
}

func newLimiter(burst int, every time.Duration, maxKeys int) *limiter {
	return &limiter{every: max(every, 1), slack: time.Duration(max(burst, 1)-1) * max(every, 1),
		maxKeys: maxKeys, clear: map[string]time.Time{}}
}

func newLoginLimiter(l LoginLimit) *limiter {
	if l.Failures < 0 {
		return nil
	}
	return newLimiter(cmp.Or(l.Failures, DefaultLoginFailures), cmp.Or(max(l.Every, 0), DefaultLoginEvery),
		cmp.Or(max(l.MaxClients, 0), DefaultLoginMaxClients))
}

func newPageLimiter(l PageLimit) *limiter {
	if l.PerSecond < 0 {
		return nil
	}
	every := time.Duration(float64(time.Second) / cmp.Or(l.PerSecond, DefaultPagesPerSecond))
	return newLimiter(cmp.Or(max(l.Burst, 0), DefaultPageBurst), every, maxLimitedTokens)
}

// take counts one request of key at now. For logins it counts a failure
// before the token is checked, so that concurrent attempts cannot all slip
// past the limit; refund takes it back when the login succeeds. When key
// has nothing left, take counts nothing and reports how long until it has,
// in whole seconds (≥ 1 s).
func (l *limiter) take(key string, now time.Time) (retryAfter time.Duration, ok bool) {
	if l == nil {
		return 0, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	clear, known := l.clear[key]
	if !known {
		l.makeRoom(now)
	}
	if clear.Before(now) {
		clear = now
	}
	if wait := clear.Sub(now) - l.slack; wait > 0 {
		return time.Duration(max(1, math.Ceil(wait.Seconds()))) * time.Second, false
	}
	l.clear[key] = clear.Add(l.every)
	return 0, true
}

// refund gives back what take counted.
func (l *limiter) refund(key string, now time.Time) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	clear, ok := l.clear[key]
	if !ok {
		return
	}
	if clear = clear.Add(-l.every); clear.After(now) {
		l.clear[key] = clear
	} else {
		delete(l.clear, key)
	}
}

// makeRoom makes sure one more key fits: it forgets the keys that have all
// they took back and, if that is not enough, the one closest to it. l.mu is
// held.
func (l *limiter) makeRoom(now time.Time) {
	if len(l.clear) < l.maxKeys {
		return
	}
	var oldest string
	var oldestClear time.Time
	for k, t := range l.clear {
		if !t.After(now) {
			delete(l.clear, k)
			continue
		}
		if oldest == "" || t.Before(oldestClear) {
			oldest, oldestClear = k, t
		}
	}
	if len(l.clear) >= l.maxKeys {
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
