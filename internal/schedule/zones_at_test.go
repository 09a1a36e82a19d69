package schedule_test

import (
	"errors"
	"testing"

	"github.com/vibejobs/vibejobs/internal/schedule"
)

// TestHostZoneNamesRefused: names only the host's zoneinfo directory
// holds are refused, as "Local" is: "localtime" is the host's own zone,
// "posixrules" and the posix/ and right/ trees are not in the embedded zone
// data (a replica without the directory could not load them), and the
// right/ zones put DST changes 27 s late.
func TestHostZoneNamesRefused(t *testing.T) {
	for _, tz := range []string{"localtime", "posixrules", "posix/Europe/Paris", "right/Europe/Paris",
		"./localtime", "./posixrules", "./posix/Europe/Paris", "./right/Europe/Paris", "Europe//Paris", "Europe/./Paris"} {
		s, err := schedule.Parse("30 2 * * *", tz, utc("2026-03-01T00:00:00Z"))
		var se *schedule.Error
		if err == nil {
			// In Europe/Paris, 02:30 on 2026-03-29 is in the gap: it fires at
			// the transition, 01:00:00Z.
			t.Errorf("Parse(..., %q) accepted a host-dependent, non-IANA zone; fires %v after 2026-03-28T12:00Z",
				tz, s.Next(utc("2026-03-28T12:00:00Z")).UTC())
			continue
		}
		if !errors.As(err, &se) || se.Code != schedule.CodeInvalidTimezone {
			t.Errorf("Parse(..., %q): %v, want invalid_timezone", tz, err)
		}
	}
}

// TestParseAtIsRFC3339: "at" is an RFC 3339 instant, no more and no less:
// §5.6 has offset minutes 00-59 and "." before the fraction (time.Parse
// also takes +00:60 and ","), and allows lower-case "t" and "z" (which
// time.Parse refuses).
func TestParseAtIsRFC3339(t *testing.T) {
	now := utc("2026-10-09T08:00:00Z")
	for _, s := range []string{
		"2026-10-09T12:00:00+00:60", // accepted today as +01:00
		"2026-10-09T09:00:00,5Z",    // comma fraction
	} {
		if at, err := schedule.ParseAt(s, now); err == nil {
			t.Errorf("ParseAt(%q) = %v, want invalid_at (not RFC 3339)", s, at)
		}
	}
	for _, s := range []string{"2026-10-09t09:00:00z", "2026-10-09T09:00:00z"} {
		if _, err := schedule.ParseAt(s, now); err != nil {
			t.Errorf("ParseAt(%q): %v; RFC 3339 §5.6 allows lower-case t and z", s, err)
		}
	}
}
