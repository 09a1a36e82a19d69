package web

import (
	"cmp"
	"time"

	"github.com/vibejobs/vibejobs/internal/ratelimit"
)

// LoginLimit bounds the failed logins of each client address
// (ratelimit.Proxies.Client); beyond it the client's logins answer 429 with
// Retry-After, without the token being checked. A successful login does not
// count. See ratelimit.FailureLimit for the fields and their defaults.
type LoginLimit = ratelimit.FailureLimit

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

func newPageLimiter(l PageLimit) *ratelimit.Limiter {
	if l.PerSecond < 0 {
		return nil
	}
	every := time.Duration(float64(time.Second) / cmp.Or(l.PerSecond, DefaultPagesPerSecond))
	return ratelimit.New(cmp.Or(max(l.Burst, 0), DefaultPageBurst), every, maxLimitedTokens)
}
