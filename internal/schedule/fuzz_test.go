package schedule_test

import (
	"errors"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/internal/schedule"
)

// FuzzParse checks that Parse never panics, that it fails only with a
// *schedule.Error, and that a schedule it accepts fires, with strictly increasing
// fire times, and consistently: the first fire after f−1ns is f itself. Each input
// is tried in zones with 60- and 30-minute shifts, starting in the middle of the
// year, just before a spring-forward gap and inside the second pass of a repeated
// hour.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"* * * * *", "*/15 * * * *", "0 * * * *", "30 2 * * *", "30 1 * * *",
		"0,30 1,2 * * *", "*/20 30 2 * * *", "* * * * * *", "*/5 * * * * *",
		"0 0 29 2 *", "0 0 30 2 *", "0 12 1 * 1", "0 12 ? * mon", "0 9 * jan-mar mon-fri",
		"5 0-2/2 * * *", "59 23 31 12 *", "@yearly", "@annually", "@monthly", "@weekly",
		"@daily", "@midnight", "@hourly", "@every 1s", "@every 1500ms", "@every 500ms",
		"@every -1s", "@every 87600h", "@every 1.0000001s", "TZ=UTC * * * * *", "",
		"* * * *", "* * * * * * *", ", * * * *", "*/0 * * * *", "1-2-3 * * * *",
		"60 * * * *", "@every", "@fortnightly", "0 0 * * 7", "0 0 31 4,6,9,11 *",
	} {
		f.Add(seed)
	}
	zones := []string{"UTC", "America/New_York", "Australia/Lord_Howe"}
	starts := []time.Time{
		utc("2026-06-15T10:11:12.5Z"),
		utc("2026-03-08T06:30:00Z"), // New York, 30 min before the gap
		utc("2026-11-01T06:20:00Z"), // New York, second pass of the repeated hour
		utc("2026-04-04T15:05:00Z"), // Lord Howe, second pass of the repeated half hour
	}
	f.Fuzz(func(t *testing.T, spec string) {
		for _, tz := range zones {
			s, err := schedule.Parse(spec, tz, starts[0])
			if err != nil {
				var e *schedule.Error
				if !errors.As(err, &e) || e.Code == "" || e.Field == "" || e.Message == "" {
					t.Fatalf("Parse(%q, %q) error %#v is not a complete *schedule.Error", spec, tz, err)
				}
				continue
			}
			if s.Next(starts[0]).IsZero() {
				t.Fatalf("Parse(%q, %q) accepted a schedule with no fire time after its anchor", spec, tz)
			}
			for _, from := range starts {
				prev := from
				for range 5 {
					next := s.Next(prev)
					if next.IsZero() {
						break
					}
					if !next.After(prev) {
						t.Fatalf("%q in %s: Next(%v) = %v, not after", spec, tz, prev, next)
					}
					if again := s.Next(next.Add(-time.Nanosecond)); !again.Equal(next) {
						t.Fatalf("%q in %s: Next(%v − 1ns) = %v, want %v", spec, tz, next, again, next)
					}
					prev = next
				}
			}
		}
	})
}
