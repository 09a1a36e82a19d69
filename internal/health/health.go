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

// Since returns when the current streak began, at its first failed pass;
// zero when there is none.
func (s *Streak) Since() time.Time {
	if t := s.since.Load(); t != nil {
		return *t
	}
	return time.Time{}
}
