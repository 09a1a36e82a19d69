// Package ratelimit keeps per-key request budgets in memory, shared by the
// management API and the dashboard: a generic cell rate algorithm per key
// (Limiter), the limit of failed authentications per client address
// (FailureLimit, Failures) and the client address itself, behind trusted
// reverse proxies too (Proxies).
//
// Budgets are per process: each replica behind a load balancer keeps its
// own.
package ratelimit

import (
	"cmp"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strings"
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
	if wait := l.wait(key, now); wait > 0 {
		return wait, false
	}
	l.add(key, now)
	return 0, true
}

// wait reports how long until key may take one more at now (0: it may).
// l.mu is held.
func (l *Limiter) wait(key string, now time.Time) time.Duration {
	clear := l.clear[key]
	if clear.Before(now) {
		clear = now
	}
	if wait := clear.Sub(now) - l.slack; wait > 0 {
		return time.Duration(max(1, math.Ceil(wait.Seconds()))) * time.Second
	}
	return 0
}

// peek reports what Take would, without counting anything.
func (l *Limiter) peek(key string, now time.Time) (retryAfter time.Duration, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.wait(key, now)
	return w, w == 0
}

// charge counts one request of key at now even when key has nothing left,
// so that it waits the longer.
func (l *Limiter) charge(key string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.add(key, now)
}

// add counts one request of key at now, making room for key when it is
// new. l.mu is held.
func (l *Limiter) add(key string, now time.Time) {
	clear, known := l.clear[key]
	if !known {
		l.makeRoom(now)
	}
	if clear.Before(now) {
		clear = now
	}
	l.clear[key] = clear.Add(l.every)
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

// NewFailures returns the Failures of f; nil when f is off.
func (f FailureLimit) NewFailures() *Failures {
	l := f.limiter()
	if l == nil {
		return nil
	}
	return &Failures{limiter: l, maxGood: cmp.Or(max(f.MaxClients, 0), DefaultMaxClients), good: map[string]time.Time{}}
}

// Failures limits the failed authentications of each client address, so
// that credentials which do not exist (each of which costs a look-up in the
// store) cannot be sent without bound. Past the limit the client is refused
// without the look-up, whatever it sends. An authentication is counted when
// it fails, not before: attempts still being looked up hold no budget, so a
// client's first burst of concurrent requests with a valid credential is
// not refused. Concurrent failures may thus all be looked up, but each one
// counts, past the limit too, so the client then waits until all are
// forgiven: in the long run it is looked up no more than the limit allows.
//
// Except for credentials recently found valid (from any address): those
// are neither counted nor refused, so that a client sending bad credentials
// from behind the same proxy or NAT as others does not lock them out. This
// tells a limited client nothing about a credential it does not already
// hold, since any other is refused unlooked. Failures remembers at most
// MaxClients such credentials, forgetting the one found valid least
// recently, and forgets one as soon as it fails (a revoked token).
//
// It is safe for concurrent use; a nil *Failures counts nothing and allows
// everything.
type Failures struct {
	limiter *Limiter
	mu      sync.Mutex
	maxGood int
	good    map[string]time.Time // credential key → when last found valid
}

// Try begins the authentication of client with the credential named by key
// at now. key must name the credential without being it (its SHA-256, as
// stored): Failures keeps it in memory. When ok is false, client is past
// its limit: refuse it, without looking the credential up, and tell it to
// retry after retryAfter (whole seconds, ≥ 1 s). Otherwise look the
// credential up and report the outcome on the Attempt.
func (f *Failures) Try(client string, key []byte, now time.Time) (a Attempt, retryAfter time.Duration, ok bool) {
	if f == nil {
		return Attempt{}, 0, true
	}
	a = Attempt{f: f, client: client, key: string(key), now: now}
	f.mu.Lock()
	_, good := f.good[a.key]
	f.mu.Unlock()
	if good {
		return a, 0, true
	}
	if retryAfter, ok = f.limiter.peek(client, now); !ok {
		return Attempt{}, retryAfter, false
	}
	return a, 0, true
}

// Attempt is one authentication Try let through. Report its outcome once.
type Attempt struct {
	f      *Failures
	client string
	key    string
	now    time.Time
}

// Succeeded reports that the credential is valid: the attempt does not
// count, and the credential is remembered as good.
func (a Attempt) Succeeded() {
	if a.f == nil {
		return
	}
	f := a.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.good[a.key]; !ok && len(f.good) >= f.maxGood {
		var oldest string
		var oldestAt time.Time
		for k, t := range f.good {
			if oldest == "" || t.Before(oldestAt) {
				oldest, oldestAt = k, t
			}
		}
		delete(f.good, oldest)
	}
	f.good[a.key] = a.now
}

// Failed reports that the credential is not valid (unknown, expired,
// revoked): the attempt counts against the client, and the credential is
// no longer remembered as good.
func (a Attempt) Failed() {
	if a.f == nil {
		return
	}
	a.f.mu.Lock()
	delete(a.f.good, a.key)
	a.f.mu.Unlock()
	a.f.limiter.charge(a.client, a.now)
}

// Undecided reports that the look-up itself failed (the store did not
// answer): the attempt does not count.
func (a Attempt) Undecided() {}

// limiter returns the Limiter of f, keyed by client; nil when f is off.
func (f FailureLimit) limiter() *Limiter {
	if f.Failures < 0 {
		return nil
	}
	return New(cmp.Or(f.Failures, DefaultFailures), cmp.Or(max(f.Every, 0), DefaultEvery),
		cmp.Or(max(f.MaxClients, 0), DefaultMaxClients))
}

// Proxies are the reverse proxies trusted to name the client of a request
// they forward, in X-Forwarded-For, and to say how it reached them (see
// Forwarded). The zero value trusts none.
type Proxies struct {
	trusted []netip.Prefix
}

// MaxTrustedProxies bounds the entries of ParseProxies.
const MaxTrustedProxies = 32

// ParseProxies reads a comma-separated list of IP addresses and CIDR
// prefixes, at most MaxTrustedProxies; blank entries are skipped.
func ParseProxies(s string) (Proxies, error) {
	var p Proxies
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		prefix, err := netip.ParsePrefix(item)
		if err != nil {
			a, aerr := netip.ParseAddr(item)
			if aerr != nil || a.Zone() != "" {
				return Proxies{}, fmt.Errorf("trusted proxies: %q is neither an IP address nor a CIDR prefix", item)
			}
			prefix = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		} else if prefix.Addr().Is4In6() {
			prefix = netip.PrefixFrom(prefix.Addr().Unmap(), max(prefix.Bits()-96, 0))
		}
		p.trusted = append(p.trusted, prefix.Masked())
	}
	if len(p.trusted) > MaxTrustedProxies {
		return Proxies{}, fmt.Errorf("trusted proxies: %d entries, at most %d", len(p.trusted), MaxTrustedProxies)
	}
	return p, nil
}

// trusts reports whether a is a trusted proxy.
func (p Proxies) trusts(a netip.Addr) bool {
	for _, t := range p.trusted {
		if t.Contains(a) {
			return true
		}
	}
	return false
}

// Forwarded reports whether r came through a trusted proxy: its
// connection's peer is one. Only then may a header such a proxy sets about
// the client's connection (X-Forwarded-For, X-Forwarded-Proto) be
// believed; any other peer may write whatever it likes there. A peer that
// is no IP address (a test, a Unix socket) is not trusted.
func (p Proxies) Forwarded(r *http.Request) bool {
	if len(p.trusted) == 0 {
		return false
	}
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	return err == nil && p.trusts(ap.Addr().Unmap().WithZone(""))
}

// Client names the client of a request: its IPv4 address, or IPv6 /64 (a
// single host usually holds the whole prefix).
//
// The client is the connection's peer, unless the peer is a trusted proxy:
// then X-Forwarded-For is read from its right end, where the trusted
// proxies appended what they saw, and the client is the first address that
// is no trusted proxy. An entry that is no IP address ends the walk at the
// proxy that forwarded it: what lies left of the nearest untrusted hop may
// have been written by anyone, so it is never read. Without trusted
// proxies X-Forwarded-For is not read at all, and behind a reverse proxy
// every client shares the proxy's budget.
func (p Proxies) Client(r *http.Request) string {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		// Not an IP peer (a test, a Unix socket): one client.
		return "other"
	}
	client := ap.Addr().Unmap().WithZone("")
	if p.Forwarded(r) {
		client = p.forwardedFor(r.Header.Values("X-Forwarded-For"), client)
	}
	if client.Is4() {
		return client.String()
	}
	prefix, _ := client.Prefix(64)
	return prefix.String()
}

// forwardedFor walks the X-Forwarded-For values from the right, starting
// from the trusted proxy peer, and returns the client (see Client).
func (p Proxies) forwardedFor(values []string, peer netip.Addr) netip.Addr {
	client := peer
	for i := len(values) - 1; i >= 0; i-- {
		// From the right end, one entry at a time: the walk stops at the
		// first address that is no trusted proxy, so a long header costs
		// no more than the hops read.
		for rest := values[i]; ; {
			cut := strings.LastIndexByte(rest, ',')
			a, ok := hopAddr(strings.TrimSpace(rest[cut+1:]))
			if !ok {
				return client
			}
			client = a
			if !p.trusts(a) {
				return client
			}
			if cut < 0 {
				break
			}
			rest = rest[:cut]
		}
	}
	return client
}

// hopAddr reads one X-Forwarded-For entry: an address, or an address and
// port as some proxies write it.
func hopAddr(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	return netip.Addr{}, false
}
