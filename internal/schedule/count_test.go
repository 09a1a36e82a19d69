package schedule_test

import (
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/internal/schedule"
)

// walkCount counts the fire times of s in (after, until] one Next at a time.
func walkCount(s schedule.Schedule, after, until time.Time) int64 {
	var n int64
	for t := s.Next(after); !t.IsZero() && !t.After(until); t = s.Next(t) {
		n++
	}
	return n
}

// TestCountMatchesNext: Count, which jumps over whole days, counts the fire
// times Next walks through, across every kind of change of offset: DST
// both ways, at midnight (Santiago, Havana), across midnight (Casey, 2010,
// whose midnight time.Date puts in the second pass), by half an hour (Lord Howe),
// negative DST (Dublin), a day skipped whole (Apia, 2011-12-30), and
// intervals that start and end at odd instants.
func TestCountMatchesNext(t *testing.T) {
	zones := []string{"UTC", "Europe/Paris", "America/New_York", "America/Santiago", "America/Havana",
		"Australia/Lord_Howe", "Europe/Dublin", "Pacific/Apia", "America/Sao_Paulo", "Asia/Tehran", "Antarctica/Casey"}
	windows := []struct{ after, until string }{
		{"2010-03-01T00:00:00Z", "2010-03-09T12:00:00Z"}, // Casey: 02:00 back to 23:00 the day before
		{"2011-12-27T13:17:29.5Z", "2012-01-03T07:00:00Z"},
		{"2018-10-30T22:59:59.999Z", "2018-11-08T00:00:00Z"}, // Sao Paulo at midnight
		{"2026-03-06T05:00:00.000000001Z", "2026-04-09T18:30:00Z"},
		{"2026-09-24T00:00:00Z", "2026-11-06T23:59:59Z"},
	}
	specs := []string{"0,30 * 0-3,22-23 * * *", "0 * * * *", "30 2 * * *", "0 0 * * *", "*/15 0-3 * * *",
		"0 30 23 * * 6", "0 0 1 * *", "45 1 29 2 *", "0 0 * * 1-5", "@every 97s"}
	for _, tz := range zones {
		for _, spec := range specs {
			s := mustParse(t, spec, tz, utc("2011-01-01T00:00:00.25Z"))
			for _, w := range windows {
				after, until := utc(w.after), utc(w.until)
				if got, want := s.Count(after, until), walkCount(s, after, until); got != want {
					t.Errorf("%q in %s: Count(%s, %s) = %d, Next walks through %d", spec, tz, w.after, w.until, got, want)
				}
			}
		}
	}
	// A whole year of a per-second schedule, and the second around a change.
	s := mustParse(t, "* * * * * *", "Europe/Paris", anchor)
	if got, want := s.Count(utc("2026-01-01T00:00:00Z"), utc("2027-01-01T00:00:00Z")), int64(365*86400-3600); got != want {
		t.Errorf("every second in Paris in 2026: Count = %d, want %d (the hour repeated in October fires once)", got, want)
	}
	for _, w := range [][2]string{{"2026-10-24T23:59:58Z", "2026-10-25T01:00:01Z"}, {"2026-03-29T00:59:58Z", "2026-03-29T01:00:01Z"}} {
		if got, want := s.Count(utc(w[0]), utc(w[1])), walkCount(s, utc(w[0]), utc(w[1])); got != want {
			t.Errorf("every second in Paris: Count(%s, %s) = %d, Next walks through %d", w[0], w[1], got, want)
		}
	}
	// Empty and reversed intervals, a one-off, and @every over centuries.
	if n := s.Count(anchor, anchor); n != 0 {
		t.Errorf("Count over an empty interval = %d", n)
	}
	if n := s.Count(anchor.Add(time.Hour), anchor); n != 0 {
		t.Errorf("Count over a reversed interval = %d", n)
	}
	at := schedule.At(anchor)
	if at.Count(anchor.Add(-time.Nanosecond), anchor) != 1 || at.Count(anchor, anchor.Add(time.Hour)) != 0 {
		t.Error("At counts its instant in (after, until] only")
	}
	every := mustParse(t, "@every 1s", "UTC", anchor)
	if got, want := every.Count(anchor, anchor.AddDate(400, 0, 0)), int64(146097*86400); got != want {
		t.Errorf("@every 1s over 400 years: Count = %d, want %d", got, want)
	}
}

// TestCountMatchesNextAtEveryChange checks Count against walking Next
// around every change of offset from 1801 to 2040 of countZones (LMT
// ends, days skipped or lived twice, DST both ways at any hour), with
// seconds fields, day-of-month OR day-of-week, and windows that start or
// end at the change itself or just beside it.
func TestCountMatchesNextAtEveryChange(t *testing.T) {
	specs := []string{"0 */3 * * *", "30 2 * * *", "15,45 0-2,22-23 * * *", "13 */29 0-3,22-23 * * *", "0 0 1,15 * 3"}
	windows := [][2]time.Duration{{-50 * time.Hour, 50 * time.Hour}, {-25*time.Hour - 1, 49*time.Hour + 500*time.Millisecond}, {-1, 1}}
	for _, tz := range countZones {
		loc, err := schedule.LoadLocation(tz)
		if err != nil {
			t.Fatal(err)
		}
		for _, spec := range specs {
			s := mustParse(t, spec, tz, anchor)
			// ZoneBounds can end a period at a year's end with no change
			// of offset, or at the instant it was asked about: stop there.
			change := time.Date(1801, 1, 1, 0, 0, 0, 0, loc)
			for {
				_, end := change.ZoneBounds()
				if end.IsZero() || !end.After(change) || end.Year() > 2040 {
					break
				}
				change = end
				for _, w := range windows {
					after, until := change.Add(w[0]), change.Add(w[1])
					if got, want := s.Count(after, until), walkCount(s, after, until); got != want {
						t.Errorf("%q in %s: Count(%v, %v) = %d, Next walks through %d", spec, tz, after.UTC(), until.UTC(), got, want)
					}
				}
			}
		}
	}
}
