package schedule_test

import (
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/internal/schedule"
)

// countZones are zones with every kind of change of offset: DST both ways
// by an hour, at midnight (Santiago, Havana, Asunción), across midnight
// (Casey), by half an hour (Lord Howe), with 30- and 45-minute offsets
// (Adelaide, Kathmandu, Chatham, Eucla), negative DST (Dublin, Windhoek,
// Casablanca), a day skipped whole (Apia, Kiritimati, Kwajalein) or lived
// twice (Juneau, 1867), and local mean time with odd seconds.
var countZones = []string{"UTC", "Europe/Paris", "America/New_York", "America/Santiago", "America/Havana",
	"America/Asuncion", "Antarctica/Casey", "Australia/Lord_Howe", "Australia/Adelaide", "Asia/Kathmandu",
	"Pacific/Chatham", "Australia/Eucla", "Europe/Dublin", "Africa/Windhoek", "Africa/Casablanca",
	"Pacific/Apia", "Pacific/Kiritimati", "Pacific/Kwajalein", "America/Juneau", "Asia/Tehran",
	"America/Sao_Paulo", "Asia/Manila"}

// countWalkLimit bounds the fire times walkCountUpTo walks, so that a fuzz
// input costs milliseconds.
const countWalkLimit = 5_000

// walkCountUpTo is walkCount, or false if it would walk more than limit
// fire times.
func walkCountUpTo(s schedule.Schedule, after, until time.Time, limit int64) (int64, bool) {
	var n int64
	for t := s.Next(after); !t.IsZero() && !t.After(until); t = s.Next(t) {
		if n++; n > limit {
			return 0, false
		}
	}
	return n, true
}

// FuzzCount checks Count against walking Next for any schedule Parse
// accepts, in zones with every kind of change of offset, over windows of up
// to about a week (reversed and empty ones included) anywhere from 1800 to
// 2200. Windows with more than countWalkLimit fire times are not compared.
func FuzzCount(f *testing.F) {
	for _, seed := range []struct {
		spec  string
		zone  uint8
		after int64 // Unix milliseconds
		span  int32 // seconds; negative: until before after
	}{
		{"* * * * * *", 1, utc("2026-03-29T00:59:58Z").UnixMilli(), 7200},
		{"*/20 * * * * *", 1, utc("2026-10-24T23:59:58.5Z").UnixMilli(), 86400},
		{"0 * * * *", 3, utc("2022-09-10T00:00:00Z").UnixMilli(), 5 * 86400},
		{"0,30 * 0-3,22-23 * * *", 6, utc("2010-03-04T00:00:00Z").UnixMilli(), 4 * 86400},
		{"30 1 * * *", 7, utc("2026-04-03T00:00:00Z").UnixMilli(), 4 * 86400},
		{"*/15 * * * *", 9, utc("1986-01-01T00:00:00Z").UnixMilli(), 86400},
		{"0 45 2 * * *", 10, utc("2026-09-26T00:00:00Z").UnixMilli(), 3 * 86400},
		{"0 0 * * 1-5", 12, utc("2026-03-28T00:00:00Z").UnixMilli(), 6 * 86400},
		{"0 12 13 * 5", 15, utc("2011-12-27T00:00:00Z").UnixMilli(), 7 * 86400},
		{"59 23 * * *", 17, utc("1993-08-19T00:00:00Z").UnixMilli(), 5 * 86400},
		{"0 0 12 * * *", 18, utc("1867-10-17T00:00:00Z").UnixMilli(), 4 * 86400},
		{"0 0 29 2 *", 0, utc("2096-02-01T00:00:00Z").UnixMilli(), 30 * 86400},
		{"@every 97s", 2, utc("2026-11-01T05:00:00.123Z").UnixMilli(), 7200},
		{"@hourly", 4, utc("2026-03-08T03:00:00Z").UnixMilli(), -3600},
		{"* * * * *", 0, utc("2026-01-01T00:00:00Z").UnixMilli(), 0},
	} {
		f.Add(seed.spec, seed.zone, seed.after, seed.span)
	}
	lo, hi := utc("1800-01-01T00:00:00Z").UnixMilli(), utc("2200-01-01T00:00:00Z").UnixMilli()
	f.Fuzz(func(t *testing.T, spec string, zone uint8, afterMilli int64, span int32) {
		tz := countZones[int(zone)%len(countZones)]
		s, err := schedule.Parse(spec, tz, utc("2026-01-01T00:00:00.25Z"))
		if err != nil {
			return
		}
		afterMilli = lo + (afterMilli%(hi-lo)+(hi-lo))%(hi-lo)
		after := time.UnixMilli(afterMilli)
		until := after.Add(time.Duration(span%(8*86400)) * time.Second)
		want, ok := walkCountUpTo(s, after, until, countWalkLimit)
		if !ok {
			return
		}
		if got := s.Count(after, until); got != want {
			t.Fatalf("%q in %s: Count(%v, %v) = %d, Next walks through %d", spec, tz, after.UTC(), until.UTC(), got, want)
		}
	})
}
