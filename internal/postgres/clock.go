package postgres

import (
	"context"
	"time"
)

// ClockSkewLimit is how far this process's clock may stand from the
// database's before the Store warns (postgres.clock_skew). Replicas compare
// their own clocks with the times the database holds: a run is claimed when
// the claiming replica's clock reaches its due time, and a lease is taken
// over when the recovering replica's clock passes the expiry that the
// claiming replica's clock set (the attempt's timeout plus a 5 s margin). A
// replica whose clock runs ahead of the others by more than that margin can
// take over a lease whose attempt is still in flight, and send the run a
// second time; by less, it sends runs early, and another's lateness figures
// are off by as much. The database's clock is the one reference they share.
const ClockSkewLimit = time.Second

// checkClock reads the database's clock and keeps its distance from this
// process's (ClockSkew). The read takes a round trip, so the database's time
// is compared with the middle of it, and the skew counts as beyond
// ClockSkewLimit only when it is so by more than half the round trip: a
// slow answer is not taken for a clock that is off. Crossing the limit
// either way is logged once (postgres.clock_skew, a warning, then
// postgres.clock_skew_resolved). A read that fails leaves the skew unknown.
func (s *Store) checkClock(ctx context.Context) {
	before := s.clock()
	var db time.Time
	err := s.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&db)
	after := s.clock()
	if err != nil {
		s.skewKnown.Store(false)
		return
	}
	half := after.Sub(before) / 2
	skew := db.Sub(before.Add(half))
	s.skew.Store(int64(skew))
	s.skewKnown.Store(true)
	off := skew.Abs()-half > ClockSkewLimit
	if s.skewOff.Swap(off) == off {
		return
	}
	if off {
		s.logger.Warn("postgres.clock_skew", "database_minus_local", skew.Round(time.Millisecond).String(),
			"limit", ClockSkewLimit.String(),
			"effect", "this replica claims runs and takes over leases by a clock the others do not share: "+
				"runs go out early or late, and a clock ahead by more than the lease margin (5 s) can send a run twice; "+
				"keep every host's clock synchronized (NTP)")
		return
	}
	s.logger.Info("postgres.clock_skew_resolved", "database_minus_local", skew.Round(time.Millisecond).String())
}

// ClockSkew returns the database's clock minus this process's at the last
// check (at Open, then every 5 s), and false while unknown: the last read
// failed.
func (s *Store) ClockSkew() (time.Duration, bool) {
	if !s.skewKnown.Load() {
		return 0, false
	}
	return time.Duration(s.skew.Load()), true
}
