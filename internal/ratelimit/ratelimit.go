// Package ratelimit keeps per-key request budgets in memory, shared by the
// management API and the dashboard: a generic cell rate algorithm per key
// (Limiter), the limit of failed authentications per client address
// (FailureLimit) and the client address itself (Client).
//
// Budgets are per process: each replica behind a load balancer keeps its
// own.
package ratelimit

import (
	"cmp"
	"math"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Limiter is a generic cell rate algorithm per key: a key may take burst
// at once and one more after each every; each key holds the instant all it
// took is given back. It remembers at most maxKeys keys: when a new one
// comes, the one closest to being given back all it took is forgotten first.
// It is safe for concurrent use; a nil *Limiter allows everything.
type Limiter struct {
	mu      sync.Mutex
	every   time.Duration
	slack   time.Duration // (burst-1)·every: how far ahead clear may be
	maxKeys int
	clear   map[string]time.Time // key → when all it took is given back
}

// New returns a Limiter of burst, every and maxKeys (each at least 1).
func New(burst int, every time.Duration, maxKeys int) *Limiter {
	return &Limiter{every: max(every, 1), slack: time.Duration(max(burst, 1)-1) * max(every, 1),
		maxKeys: max(maxKeys, 1), clear: map[string]time.Time{}}
}

// Take counts one request of key at now. When key has nothing left, Take
// counts nothing and reports how long until it has, in whole seconds
// (≥ 1 s).
func (l *Limiter) Take(key string, now time.Time) (retryAfter time.Duration, ok bool) {
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

// Refund gives back one request Take counted for key.
func (l *Limiter) Refund(key string, now time.Time) {
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
func (l *Limiter) makeRoom(now time.Time) {
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

// Defaults of FailureLimit.
const (
	DefaultFailures   = 10
	DefaultEvery      = time.Minute
	DefaultMaxClients = 10000
)

// FailureLimit bounds the failed authentications of each client address
// (Client). A client may fail Failures times at once, and once more after
// each Every. At most MaxClients addresses are remembered: when a new one
// comes, the one closest to being forgiven is forgotten first. Zero values
// take the defaults (10 failures, one more a minute, 10000 clients); a
// negative Failures turns the limit off.
type FailureLimit struct {
	Failures   int
	Every      time.Duration
	MaxClients int
}

// NewLimiter returns the Limiter of f, keyed by client; nil when f is off.
func (f FailureLimit) NewLimiter() *Limiter {
	if f.Failures < 0 {
		return nil
	}
	return New(cmp.Or(f.Failures, DefaultFailures), cmp.Or(max(f.Every, 0), DefaultEvery),
		cmp.Or(max(f.MaxClients, 0), DefaultMaxClients))
}

// Client names the client of a request: its peer's IPv4 address, or IPv6
// /64 (a single host usually holds the whole prefix).
//
// The client is the connection's peer address: behind a reverse proxy every
// client shares the proxy's. X-Forwarded-For is not read, as any client may
// write it.
func Client(r *http.Request) string {
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
