// Package health keeps what readiness needs to know of the background
// loops: whether each is moving. A loop whose every pass fails against the
// database does no work, though the database may answer a ping.
package health

import (
	"sync/atomic"
	"time"
)

// Streak is the current run of failed passes of one loop. The zero value
// has none. It is safe for concurrent use.
type Streak struct {
	since atomic.Pointer[time.Time]
}

// Fail records a pass that failed at now: it begins a streak, or goes on
// with the current one.
func (s *Streak) Fail(now time.Time) {
	if s.since.Load() == nil {
		s.since.CompareAndSwap(nil, &now)
	}
}

// Clear ends the streak: a pass succeeded (finding nothing to do counts),
// or the loop gave up what kept failing and is idle.
func (s *Streak) Clear() {
	if s.since.Load() != nil {
		s.since.Store(nil)
	}
}

// Pass records the outcome of a pass made at now: err nil ends the streak
// (Clear), an error begins it or goes on with it (Fail), except when ctxErr,
// the error of the pass's context, says the pass was cut short by its end
// (a shutdown): that one counts as neither.
func (s *Streak) Pass(now time.Time, err, ctxErr error) {
	switch {
	case err == nil:
		s.Clear()
	case ctxErr == nil:
		s.Fail(now)
	}
}

// Since returns when the current streak began, at its first failed pass;
// zero when there is none.
func (s *Streak) Since() time.Time {
	if t := s.since.Load(); t != nil {
		return *t
	}
	return time.Time{}
}
