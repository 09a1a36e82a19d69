package api

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vibejobs/vibejobs"
)

// API tokens are "vjt_" and the unpadded base64url of 32 random bytes. Only
// their SHA-256 is stored; the first tokenPrefixLen characters are kept in
// clear so a leaked token can be recognised.
const (
	tokenPrefix    = "vjt_"
	tokenLength    = len(tokenPrefix) + 43
	tokenPrefixLen = 12
)

// newTokenValue returns a fresh token and the hash to store.
func newTokenValue(r io.Reader) (value string, hash []byte, err error) {
	var b [32]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return "", nil, err
	}
	value = tokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	return value, hashToken(value), nil
}

func hashToken(value string) []byte {
	sum := sha256.Sum256([]byte(value))
	return sum[:]
}

func errUnauthorized(msg string) *vibejobs.Error {
	return &vibejobs.Error{Kind: vibejobs.EUNAUTHORIZED, Code: "unauthorized", Message: msg}
}

// authLimitedError refuses a client past its Config.FailedAuthLimit.
type authLimitedError struct{ retryAfter time.Duration }

func (e *authLimitedError) Error() string { return "too many failed authentications from the client" }

// authenticate finds the caller's token. It asks the store on every request,
// so a revocation takes effect at once; but a well-formed token from a
// client past its Config.FailedAuthLimit is refused (*authLimitedError)
// without being looked up, unless it was found valid lately (see
// ratelimit.Failures).
func (s *Server) authenticate(ctx context.Context, r *http.Request) (*vibejobs.Token, error) {
	h := r.Header.Values("Authorization")
	if len(h) == 0 {
		return nil, errUnauthorized("an Authorization: Bearer token is required")
	}
	scheme, value, ok := strings.Cut(h[0], " ")
	value = strings.TrimSpace(value)
	if len(h) != 1 || !ok || !strings.EqualFold(scheme, "Bearer") || value == "" {
		return nil, errUnauthorized("the Authorization header must be \"Bearer <token>\"")
	}
	if len(value) != tokenLength || !strings.HasPrefix(value, tokenPrefix) {
		return nil, errUnauthorized("the token is not valid")
	}
	hash := hashToken(value)
	attempt, wait, ok := s.authFailures.Try(s.proxies.Client(r), hash, s.now())
	if !ok {
		return nil, &authLimitedError{retryAfter: wait}
	}
	tok, err := s.store.TokenByHash(ctx, hash)
	if vibejobs.ErrorKind(err) == vibejobs.ENOTFOUND {
		attempt.Failed()
		return nil, errUnauthorized("the token is not valid")
	}
	if err != nil {
		attempt.Undecided()
		return nil, err
	}
	if tok.RevokedAt != nil {
		attempt.Failed()
		return nil, errUnauthorized("the token was revoked")
	}
	attempt.Succeeded()
	return tok, nil
}

// refuseAuth answers a request authenticate refused: 429 with Retry-After
// for a client past its limit, else the error, with a Bearer challenge when
// it is a 401.
func (s *Server) refuseAuth(c *call, err error) *response {
	var limited *authLimitedError
	if errors.As(err, &limited) {
		return errorResponse(&vibejobs.Error{Kind: vibejobs.ERATELIMIT, Code: "rate_limited",
			Message: "too many failed authentications from this address; retry later"}).
			with("Retry-After", strconv.Itoa(int(limited.retryAfter/time.Second)))
	}
	resp := s.fail(c, err)
	if resp.status == http.StatusUnauthorized {
		// A challenge only where the token is at fault: not on a 503
		// while the database cannot look it up.
		resp.with("WWW-Authenticate", `Bearer realm="vibejobs"`)
	}
	return resp
}

// authorize checks the token's role against what the route asks. It depends
// on nothing but the token, so a refusal reveals nothing about resources.
func authorize(t *vibejobs.Token, a access) *vibejobs.Error {
	switch a {
	case accessRead:
		return nil
	case accessWrite:
		if t.Role == vibejobs.RoleAdmin || t.Role == vibejobs.RoleWrite {
			return nil
		}
		return errForbidden("this token's role (" + string(t.Role) + ") may not change anything")
	case accessAdmin:
		if t.Role == vibejobs.RoleAdmin || t.Installation {
			return nil
		}
		return errForbidden("only an admin token manages tokens")
	case accessInstallation:
		if t.Installation {
			return nil
		}
		return errForbidden("only the installation administrator token manages projects")
	}
	return nil
}

// limiter is a token bucket per API token.
type limiter struct {
	mu        sync.Mutex
	rate      float64 // tokens per second
	burst     float64
	buckets   map[string]*bucket
	lastSweep time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newLimiter(perSecond float64, burst int) *limiter {
	return &limiter{rate: perSecond, burst: math.Max(1, float64(burst)), buckets: map[string]*bucket{}}
}

// allow takes one token from id's bucket at now. When the bucket is empty it
// reports how long until one is back, rounded up to whole seconds (≥ 1 s).
// now is wall time: when it is before the bucket's last request (the clock
// was stepped back), the bucket refills from now on, with nothing added for
// the step, rather than not until the clock has caught up.
func (l *limiter) allow(id string, now time.Time) (retryAfter time.Duration, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(now)
	b := l.buckets[id]
	if b == nil {
		b = &bucket{tokens: l.burst, last: now}
		l.buckets[id] = b
	}
	if el := now.Sub(b.last); el > 0 {
		b.tokens = math.Min(l.burst, b.tokens+el.Seconds()*l.rate)
		b.last = now
	} else if el < 0 {
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return 0, true
	}
	secs := math.Ceil((1 - b.tokens) / l.rate)
	return time.Duration(math.Max(1, secs)) * time.Second, false
}

// sweep forgets buckets that have refilled, at most once a minute, so the map
// holds only tokens active lately.
func (l *limiter) sweep(now time.Time) {
	if now.Sub(l.lastSweep) < time.Minute {
		return
	}
	l.lastSweep = now
	for id, b := range l.buckets {
		if b.tokens+now.Sub(b.last).Seconds()*l.rate >= l.burst {
			delete(l.buckets, id)
		}
	}
}
