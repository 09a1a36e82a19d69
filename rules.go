package vibejobs

import (
	"time"
)

// Backoff returns the delay after attempt n (1-based) before jitter:
// min(MaxBackoff, MinBackoff × 10^(n−1)).
func (p RetryPolicy) Backoff(n int) time.Duration {
	d := p.MinBackoff
	for i := 1; i < n; i++ {
		if d >= p.MaxBackoff {
			break
		}
		d *= 10
	}
	return min(d, p.MaxBackoff)
}

// Jitter spreads d by ±20 %: u is a uniform random number in [0, 1).
func Jitter(d time.Duration, u float64) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*u))
}

// AttemptResult is what one delivery attempt observed.
type AttemptResult struct {
	StatusCode int           // 0 when no response arrived
	ErrorCode  string        // "" for a 2xx
	RetryAfter time.Duration // from a Retry-After header on a retryable answer
}

// Step is the run's next state after an attempt.
type Step struct {
	State         RunState // succeeded, failed or retrying
	FailureReason string
	NextAttemptAt *time.Time
}

// NextStep applies the outcome rules of SEMANTICS.md section 2 to attempt n of
// a run, finished at now: any 2xx succeeds; 401 and 403 fail at once
// (app_rejected); anything else retries after the jittered backoff (at least
// Retry-After), unless attempts are used up (attempts_exhausted) or the next
// attempt would start after deadline (deadline_exceeded). u is a uniform
// random number in [0, 1) for the jitter.
func NextStep(p RetryPolicy, n int, res AttemptResult, deadline, now time.Time, u float64) Step {
	switch {
	case res.StatusCode >= 200 && res.StatusCode <= 299 && res.ErrorCode == "":
		return Step{State: RunSucceeded}
	case res.StatusCode == 401 || res.StatusCode == 403:
		return Step{State: RunFailed, FailureReason: ReasonAppRejected}
	case n >= p.MaxAttempts:
		return Step{State: RunFailed, FailureReason: ReasonAttemptsExhausted}
	}
	delay := max(Jitter(p.Backoff(n), u), res.RetryAfter)
	next := now.Add(delay)
	if next.After(deadline) {
		return Step{State: RunFailed, FailureReason: ReasonDeadlineExceeded}
	}
	return Step{State: RunRetrying, NextAttemptAt: &next}
}

// IsLate reports whether a first attempt started at start is late for an
// occurrence at scheduledFor (more than 60 s after it).
func IsLate(scheduledFor, start time.Time) bool {
	return start.Sub(scheduledFor) > LateThreshold
}
