package schedule_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/robfig/cron/v3"

	"github.com/vibejobs/vibejobs/internal/schedule"
)

// anchor is when the schedules under test were set, unless a case says otherwise.
var anchor = utc("2026-01-01T00:00:00Z")

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}

func mustParse(t testing.TB, spec, tz string, anchor time.Time) schedule.Schedule {
	t.Helper()
	s, err := schedule.Parse(spec, tz, anchor)
	if err != nil {
		t.Fatalf("Parse(%q, %q): %v", spec, tz, err)
	}
	return s
}

func formatUTC(ts []time.Time) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.UTC().Format(time.RFC3339Nano)
	}
	return out
}

type fireCase struct {
	name   string
	spec   string
	tz     string
	anchor string // RFC 3339; empty means the package anchor
	from   string // Next is called from here (exclusive)
	want   []string
}

func runFireCases(t *testing.T, cases []fireCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := anchor
			if tc.anchor != "" {
				a = utc(tc.anchor)
			}
			s := mustParse(t, tc.spec, tc.tz, a)
			got := schedule.NextN(s, utc(tc.from), len(tc.want))
			if g := formatUTC(got); !slices.Equal(g, tc.want) {
				t.Errorf("NextN(%q in %q, from %s)\n got %v\nwant %v", tc.spec, tc.tz, tc.from, g, tc.want)
			}
			for _, f := range got {
				if name, _ := f.Zone(); tc.tz != "" && f.Location().String() != tc.tz {
					t.Errorf("fire time %v (%s) is not in location %s", f, name, tc.tz)
				}
			}
		})
	}
}

// TestNextDST pins the daylight-saving rules with exact instants. Transitions in
// 2026: New York 03-08 02:00→03:00 (07:00Z) and 11-01 02:00→01:00 (06:00Z);
// London 03-29 01:00→02:00 (01:00Z) and 10-25 02:00→01:00 (01:00Z); Lord Howe
// 04-05 02:00→01:30 (04-04 15:00Z) and 10-04 02:00→02:30 (10-03 15:30Z); Santiago
// 09-06 00:00→01:00 (04:00Z).
func TestNextDST(t *testing.T) {
	const ny, london, lordHowe, santiago = "America/New_York", "Europe/London", "Australia/Lord_Howe", "America/Santiago"
	runFireCases(t, []fireCase{
		// Fixed time inside the spring-forward gap: shifted to the gap's end, once.
		{"NY gap fixed", "30 2 * * *", ny, "", "2026-03-07T00:00:00Z",
			[]string{"2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"}},
		{"NY gap fixed two occurrences collapse", "0,30 2 * * *", ny, "", "2026-03-08T06:00:00Z",
			[]string{"2026-03-08T07:00:00Z", "2026-03-09T06:00:00Z", "2026-03-09T06:30:00Z"}},
		{"NY gap fixed collapses with gap end", "30 2,3 * * *", ny, "", "2026-03-08T06:00:00Z",
			[]string{"2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z", "2026-03-09T06:30:00Z"}},
		{"NY fixed 02:30 at fall back is unique", "30 2 * * *", ny, "", "2026-10-31T00:00:00Z",
			[]string{"2026-10-31T06:30:00Z", "2026-11-01T07:30:00Z", "2026-11-02T07:30:00Z"}},
		// Fixed time inside the repeated hour: first occurrence only.
		{"NY repeated fixed", "30 1 * * *", ny, "", "2026-10-31T00:00:00Z",
			[]string{"2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"}},
		{"NY 01:30 at spring forward exists", "30 1 * * *", ny, "", "2026-03-07T12:00:00Z",
			[]string{"2026-03-08T06:30:00Z", "2026-03-09T05:30:00Z"}},
		// Wildcard hour: gap occurrence dropped, repeated wall times not refired.
		{"NY hourly spring", "0 * * * *", ny, "", "2026-03-08T04:30:00Z",
			[]string{"2026-03-08T05:00:00Z", "2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z"}},
		{"NY hourly fall", "0 * * * *", ny, "", "2026-11-01T03:30:00Z",
			[]string{"2026-11-01T04:00:00Z", "2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z", "2026-11-01T08:00:00Z"}},
		{"NY @hourly spring", "@hourly", ny, "", "2026-03-08T04:30:00Z",
			[]string{"2026-03-08T05:00:00Z", "2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z"}},
		{"NY every 15 min spring", "*/15 * * * *", ny, "", "2026-03-08T06:30:00Z",
			[]string{"2026-03-08T06:45:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:15:00Z"}},
		{"NY every 15 min fall", "*/15 * * * *", ny, "", "2026-11-01T05:30:00Z",
			[]string{"2026-11-01T05:45:00Z", "2026-11-01T07:00:00Z", "2026-11-01T07:15:00Z"}},
		// Wildcard minute in a fixed hour, or a stepped hour: the day's
		// occurrences in the gap would be lost; they fire once at its end.
		{"NY wildcard minute fixed hour in gap", "*/20 2 * * *", ny, "", "2026-03-07T12:00:00Z",
			[]string{"2026-03-08T07:00:00Z", "2026-03-09T06:00:00Z", "2026-03-09T06:20:00Z", "2026-03-09T06:40:00Z"}},
		{"NY every minute of a fixed hour in gap", "* 2 * * *", ny, "", "2026-03-08T06:00:00Z",
			[]string{"2026-03-08T07:00:00Z", "2026-03-09T06:00:00Z"}},
		{"NY every two hours in gap", "0 */2 * * *", ny, "", "2026-03-08T05:30:00Z",
			[]string{"2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z", "2026-03-08T10:00:00Z"}},
		// Next from inside the second pass of the repeated hour (01:20 EST = 06:20Z).
		{"NY second pass quarter-hourly", "*/15 * * * *", ny, "", "2026-11-01T06:20:00Z",
			[]string{"2026-11-01T07:00:00Z", "2026-11-01T07:15:00Z"}},
		{"NY second pass fixed", "30 1 * * *", ny, "", "2026-11-01T06:20:00Z",
			[]string{"2026-11-02T06:30:00Z"}},
		{"NY second pass 02:00", "0 2 * * *", ny, "", "2026-11-01T06:20:00Z",
			[]string{"2026-11-01T07:00:00Z"}},
		{"NY second pass every second", "* * * * * *", ny, "", "2026-11-01T06:59:58.5Z",
			[]string{"2026-11-01T07:00:00Z", "2026-11-01T07:00:01Z"}},
		{"NY first pass every second", "* * * * * *", ny, "", "2026-11-01T05:59:58.5Z",
			[]string{"2026-11-01T05:59:59Z", "2026-11-01T07:00:00Z"}},
		// Seconds field: fixed hour and minute, so the gap's occurrences collapse.
		{"NY 6-field in gap", "*/20 30 2 * * *", ny, "", "2026-03-08T00:00:00Z",
			[]string{"2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z", "2026-03-09T06:30:20Z", "2026-03-09T06:30:40Z"}},
		{"NY 6-field every 5 s across gap", "*/5 * * * * *", ny, "", "2026-03-08T06:59:50Z",
			[]string{"2026-03-08T06:59:55Z", "2026-03-08T07:00:00Z", "2026-03-08T07:00:05Z"}},
		{"NY 6-field repeated", "15 30 1 * * *", ny, "", "2026-11-01T00:00:00Z",
			[]string{"2026-11-01T05:30:15Z", "2026-11-02T06:30:15Z"}},

		{"London gap fixed", "30 1 * * *", london, "", "2026-03-28T00:00:00Z",
			[]string{"2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"}},
		{"London repeated fixed", "30 1 * * *", london, "", "2026-10-24T00:00:00Z",
			[]string{"2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"}},
		{"London hourly spring", "0 * * * *", london, "", "2026-03-28T23:30:00Z",
			[]string{"2026-03-29T00:00:00Z", "2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z"}},
		{"London hourly fall", "0 * * * *", london, "", "2026-10-24T22:30:00Z",
			[]string{"2026-10-24T23:00:00Z", "2026-10-25T00:00:00Z", "2026-10-25T02:00:00Z"}},
		{"London every 15 min spring", "*/15 * * * *", london, "", "2026-03-29T00:40:00Z",
			[]string{"2026-03-29T00:45:00Z", "2026-03-29T01:00:00Z", "2026-03-29T01:15:00Z"}},
		{"London every 15 min fall", "*/15 * * * *", london, "", "2026-10-25T00:40:00Z",
			[]string{"2026-10-25T00:45:00Z", "2026-10-25T02:00:00Z", "2026-10-25T02:15:00Z"}},
		{"London second pass", "*/15 * * * *", london, "", "2026-10-25T01:20:00Z",
			[]string{"2026-10-25T02:00:00Z"}},
		{"London @monthly", "@monthly", london, "", "2026-03-15T00:00:00Z",
			[]string{"2026-03-31T23:00:00Z", "2026-04-30T23:00:00Z"}},
		{"London @daily across fall back", "@daily", london, "", "2026-10-24T12:00:00Z",
			[]string{"2026-10-24T23:00:00Z", "2026-10-26T00:00:00Z"}},

		// Lord Howe shifts by 30 minutes: repeated civil range [01:30, 02:00) on
		// 04-05, gap [02:00, 02:30) on 10-04.
		{"Lord Howe repeated fixed", "30 1 * * *", lordHowe, "", "2026-04-03T00:00:00Z",
			[]string{"2026-04-03T14:30:00Z", "2026-04-04T14:30:00Z", "2026-04-05T15:00:00Z"}},
		{"Lord Howe repeated fixed 01:45", "45 1 * * *", lordHowe, "", "2026-04-04T00:00:00Z",
			[]string{"2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"}},
		{"Lord Howe gap fixed", "15 2 * * *", lordHowe, "", "2026-10-02T00:00:00Z",
			[]string{"2026-10-02T15:45:00Z", "2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"}},
		{"Lord Howe gap end exists", "30 2 * * *", lordHowe, "", "2026-10-03T00:00:00Z",
			[]string{"2026-10-03T15:30:00Z", "2026-10-04T15:30:00Z"}},
		{"Lord Howe hourly forward", "0 * * * *", lordHowe, "", "2026-10-03T14:00:00Z",
			[]string{"2026-10-03T14:30:00Z", "2026-10-03T16:00:00Z", "2026-10-03T17:00:00Z"}},
		{"Lord Howe hourly back", "0 * * * *", lordHowe, "", "2026-04-04T13:30:00Z",
			[]string{"2026-04-04T14:00:00Z", "2026-04-04T15:30:00Z", "2026-04-04T16:30:00Z"}},
		{"Lord Howe every 15 min forward", "*/15 * * * *", lordHowe, "", "2026-10-03T15:00:00Z",
			[]string{"2026-10-03T15:15:00Z", "2026-10-03T15:30:00Z", "2026-10-03T15:45:00Z"}},
		{"Lord Howe every 15 min back", "*/15 * * * *", lordHowe, "", "2026-04-04T14:20:00Z",
			[]string{"2026-04-04T14:30:00Z", "2026-04-04T14:45:00Z", "2026-04-04T15:30:00Z"}},
		{"Lord Howe second pass", "*/15 * * * *", lordHowe, "", "2026-04-04T15:05:00Z",
			[]string{"2026-04-04T15:30:00Z", "2026-04-04T15:45:00Z"}},

		// Macros are cron schedules too.
		{"Santiago @midnight in gap", "@midnight", santiago, "", "2026-09-05T00:00:00Z",
			[]string{"2026-09-05T04:00:00Z", "2026-09-06T04:00:00Z", "2026-09-07T03:00:00Z"}},
		{"NY @daily fall", "@daily", ny, "", "2026-10-31T00:00:00Z",
			[]string{"2026-10-31T04:00:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"}},
		{"NY @weekly", "@weekly", ny, "", "2026-03-01T12:00:00Z",
			[]string{"2026-03-08T05:00:00Z", "2026-03-15T04:00:00Z"}},
		{"NY @yearly", "@yearly", ny, "", "2026-06-01T00:00:00Z",
			[]string{"2027-01-01T05:00:00Z", "2028-01-01T05:00:00Z"}},
		{"NY @annually", "@annually", ny, "", "2026-06-01T00:00:00Z",
			[]string{"2027-01-01T05:00:00Z"}},

		// @every lives in absolute time: DST changes nothing.
		{"@every 1h across NY spring", "@every 1h", ny, "2026-03-08T05:30:00Z", "2026-03-08T05:30:00Z",
			[]string{"2026-03-08T06:30:00Z", "2026-03-08T07:30:00Z", "2026-03-08T08:30:00Z"}},
		{"@every 1h across NY fall", "@every 1h", ny, "2026-11-01T04:30:00Z", "2026-11-01T05:00:00Z",
			[]string{"2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z", "2026-11-01T07:30:00Z"}},
		{"@every 24h across London fall", "@every 24h", london, "2026-10-24T12:00:00Z", "2026-10-24T12:00:00Z",
			[]string{"2026-10-25T12:00:00Z", "2026-10-26T12:00:00Z"}},
		{"@every 30m across Lord Howe forward", "@every 30m", lordHowe, "2026-10-03T15:00:00Z", "2026-10-03T15:10:00Z",
			[]string{"2026-10-03T15:30:00Z", "2026-10-03T16:00:00Z"}},
	})
}

// TestNextCivil pins the calendar semantics in UTC.
func TestNextCivil(t *testing.T) {
	runFireCases(t, []fireCase{
		{"daily", "0 9 * * *", "", "", "2026-05-30T09:00:00Z",
			[]string{"2026-05-31T09:00:00Z", "2026-06-01T09:00:00Z"}},
		{"sub-second from", "0 9 * * *", "UTC", "", "2026-05-30T08:59:59.999Z",
			[]string{"2026-05-30T09:00:00Z"}},
		// 2026-06-01 is a Monday: day-of-month OR day-of-week when both are set.
		{"dom or dow", "0 12 1 * 1", "", "", "2026-05-30T00:00:00Z",
			[]string{"2026-06-01T12:00:00Z", "2026-06-08T12:00:00Z", "2026-06-15T12:00:00Z", "2026-06-22T12:00:00Z", "2026-06-29T12:00:00Z", "2026-07-01T12:00:00Z"}},
		{"dom star and dow", "0 12 * * 1", "", "", "2026-05-30T00:00:00Z",
			[]string{"2026-06-01T12:00:00Z", "2026-06-08T12:00:00Z"}},
		// A stepped star restricts its field, so either field matching
		// suffices; a star stepped by 1 is still a star.
		{"dom stepped star or dow", "0 12 */2 * 1", "", "", "2026-06-05T13:00:00Z",
			[]string{"2026-06-07T12:00:00Z", "2026-06-08T12:00:00Z", "2026-06-09T12:00:00Z", "2026-06-11T12:00:00Z"}},
		{"dom star stepped by 1 and dow", "0 12 */1 * 1", "", "", "2026-05-30T00:00:00Z",
			[]string{"2026-06-01T12:00:00Z", "2026-06-08T12:00:00Z"}},
		{"dom and dow star stepped by 1", "0 12 1 * */1", "", "", "2026-05-30T00:00:00Z",
			[]string{"2026-06-01T12:00:00Z", "2026-07-01T12:00:00Z"}},
		{"question mark is star", "0 12 ? * mon", "", "", "2026-05-30T00:00:00Z",
			[]string{"2026-06-01T12:00:00Z", "2026-06-08T12:00:00Z"}},
		{"names and ranges", "0 9 * jan-feb mon-fri", "", "", "2026-02-26T10:00:00Z",
			[]string{"2026-02-27T09:00:00Z", "2027-01-01T09:00:00Z", "2027-01-04T09:00:00Z"}},
		{"31st skips short months", "0 0 31 * *", "", "", "2026-01-01T00:00:00Z",
			[]string{"2026-01-31T00:00:00Z", "2026-03-31T00:00:00Z", "2026-05-31T00:00:00Z", "2026-07-31T00:00:00Z"}},
		{"Feb 29", "0 0 29 2 *", "", "", "2026-01-01T00:00:00Z",
			[]string{"2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"}},
		{"Feb 29 across 2100", "0 0 29 2 *", "", "2097-01-01T00:00:00Z", "2097-01-01T00:00:00Z",
			[]string{"2104-02-29T00:00:00Z"}},
		{"6-field", "30 */20 9 * * *", "", "", "2026-05-30T09:20:30Z",
			[]string{"2026-05-30T09:40:30Z", "2026-05-31T09:00:30Z"}},
		{"year end wrap", "59 23 31 12 *", "", "", "2026-12-31T23:59:00Z",
			[]string{"2027-12-31T23:59:00Z"}},
		{"before 1970", "0 0 1 1 *", "", "", "1969-12-31T23:59:59Z",
			[]string{"1970-01-01T00:00:00Z", "1971-01-01T00:00:00Z"}},
		{"surrounding spaces", "  0  9 * * *\t", "", "", "2026-05-30T09:00:00Z",
			[]string{"2026-05-31T09:00:00Z"}},
		{"fixed offset zone", "0 9 * * *", "Asia/Kolkata", "", "2026-05-30T00:00:00Z",
			[]string{"2026-05-30T03:30:00Z", "2026-05-31T03:30:00Z"}},
		{"@every sub-second precision", "@every 1500ms", "", "2026-05-30T00:00:00.250Z", "2026-05-30T00:00:00Z",
			[]string{"2026-05-30T00:00:01.75Z", "2026-05-30T00:00:03.25Z", "2026-05-30T00:00:04.75Z"}},
		{"@every from long after anchor", "@every 7s", "", "2026-05-30T00:00:00Z", "2346-05-30T00:00:00Z",
			[]string{"2346-05-30T00:00:05Z", "2346-05-30T00:00:12Z"}},
		{"@every anchor truncated to ms", "@every 1s", "", "2026-05-30T00:00:00.1239Z", "2026-05-30T00:00:00Z",
			[]string{"2026-05-30T00:00:01.123Z"}},
		{"@every on a fire time", "@every 1m", "", "2026-05-30T00:00:00Z", "2026-05-30T00:02:00Z",
			[]string{"2026-05-30T00:03:00Z"}},
	})
}

// TestNextMatchesReference compares Next with a brute-force model of the DST rules
// that walks every minute in absolute time around each transition: a matching wall
// time fires the first time the clock shows it, and matching wall times the clock
// jumps over fire at the jump unless the schedule fires in every hour.
func TestNextMatchesReference(t *testing.T) {
	transitions := []struct{ tz, at string }{
		{"America/New_York", "2026-03-08T07:00:00Z"},
		{"America/New_York", "2026-11-01T06:00:00Z"},
		{"Europe/London", "2026-03-29T01:00:00Z"},
		{"Europe/London", "2026-10-25T01:00:00Z"},
		{"Australia/Lord_Howe", "2026-04-04T15:00:00Z"},
		{"Australia/Lord_Howe", "2026-10-03T15:30:00Z"},
		{"America/Santiago", "2026-04-05T03:00:00Z"},
		{"America/Santiago", "2026-09-06T04:00:00Z"},
	}
	specs := []string{
		"0 * * * *", "*/15 * * * *", "*/7 * * * *", "30 * * * *", "* * * * *",
		"30 2 * * *", "0 2 * * *", "30 1 * * *", "45 1 * * *", "15 2 * * *",
		"0,30 1,2 * * *", "10-50/10 0-3 * * *", "0 0 * * *", "59 23 * * *", "0 23 * * *",
		"*/10 2 * * *", "5 0-2/2 * * *", "0 0 * * 0", "0 3 * * *", "30 0 * * *",
	}
	for _, tr := range transitions {
		loc, err := time.LoadLocation(tr.tz)
		if err != nil {
			t.Fatal(err)
		}
		from := utc(tr.at).Add(-26 * time.Hour)
		to := utc(tr.at).Add(26 * time.Hour)
		for _, spec := range specs {
			want := referenceFires(t, spec, loc, from, to)
			s := mustParse(t, spec, tr.tz, anchor)
			var got []time.Time
			for f := s.Next(from); f.Before(to); f = s.Next(f) {
				got = append(got, f)
			}
			if g, w := formatUTC(got), formatUTC(want); !slices.Equal(g, w) {
				t.Errorf("%q in %s around %s:\n got %v\nwant %v", spec, tr.tz, tr.at, g, w)
			}
		}
	}
}

func referenceFires(t *testing.T, spec string, loc *time.Location, from, to time.Time) []time.Time {
	t.Helper()
	civilSpec, err := cron.ParseStandard(spec)
	if err != nil {
		t.Fatal(err)
	}
	everyHour := civilSpec.(*cron.SpecSchedule).Hour&^(1<<63) == 1<<24-1
	// matches reports whether wall-clock time w (carried as UTC) matches spec;
	// robfig's Next is exact in UTC.
	matches := func(w time.Time) bool {
		return civilSpec.Next(w.Add(-time.Second)).Equal(w)
	}
	wall := func(u time.Time) time.Time {
		l := u.In(loc)
		return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), 0, 0, time.UTC)
	}
	// Start a day early so that "already shown" knows the recent past.
	seen := map[time.Time]bool{}
	var fires []time.Time
	fire := func(u time.Time) {
		if u.After(from) && u.Before(to) && (len(fires) == 0 || !fires[len(fires)-1].Equal(u)) {
			fires = append(fires, u)
		}
	}
	prev := wall(from.Add(-24 * time.Hour))
	for u := from.Add(-24*time.Hour + time.Minute); u.Before(to); u = u.Add(time.Minute) {
		w := wall(u)
		if !everyHour {
			for skipped := prev.Add(time.Minute); skipped.Before(w); skipped = skipped.Add(time.Minute) {
				if matches(skipped) && !seen[skipped] {
					seen[skipped] = true
					fire(u)
				}
			}
		}
		if matches(w) && !seen[w] {
			fire(u)
		}
		seen[w] = true
		prev = w
	}
	return fires
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name, spec, tz   string
		wantCode, wantIn string
	}{
		{"empty", "", "", "invalid_schedule", "empty"},
		{"blank", " \t ", "", "invalid_schedule", "empty"},
		{"4 fields", "* * * *", "", "invalid_schedule", "got 4"},
		{"7 fields", "0 * * * * * 2026", "", "invalid_schedule", "got 7"},
		{"8 fields", "* * * * * * * *", "", "invalid_schedule", "got 8"},
		{"too long", "0 9 * * *" + strings.Repeat(" ", 250), "", "invalid_schedule", "longer than 256"},
		{"minute 60", "60 * * * *", "", "invalid_schedule", "minute field"},
		{"hour 24", "0 24 * * *", "", "invalid_schedule", "hour field"},
		{"dom 0", "0 0 0 * *", "", "invalid_schedule", "day-of-month field"},
		{"dom 32", "0 0 32 * *", "", "invalid_schedule", "day-of-month field"},
		{"month 13", "0 0 1 13 *", "", "invalid_schedule", "month field"},
		{"dow 7", "0 0 * * 7", "", "invalid_schedule", "day-of-week field \"7\": end of range (7) above maximum (6): 7 (days are 0–6 or SUN–SAT; Sunday is 0)"},
		{"dow range to 7", "0 0 * * 1-7", "", "invalid_schedule", "Sunday is 0"},
		{"second 60", "60 * * * * *", "", "invalid_schedule", "second field"},
		{"garbage field", "0 9 * * fun", "", "invalid_schedule", "day-of-week field"},
		{"step 0", "*/0 * * * *", "", "invalid_schedule", "minute field"},
		{"reversed range", "0 5-3 * * *", "", "invalid_schedule", "hour field"},
		{"empty list", ", * * * *", "", "invalid_schedule", "never fires"},
		// robfig reads a star with a range end as the star alone: "*-5" would
		// fire every minute, not in minutes 0-5.
		{"star with range end", "*-5 * * * *", "", "invalid_schedule", `minute field "*-5"`},
		{"star with empty range end", "0 *- * * *", "", "invalid_schedule", "hour field"},
		{"question mark with range end", "0 0 ?-3 * *", "", "invalid_schedule", "day-of-month field"},
		{"star with range end and step", "0 0 * * *-5/2", "", "invalid_schedule", "day-of-week field"},
		{"star with range end in a list", "1,*-5 * * * * *", "", "invalid_schedule", "second field"},
		{"TZ prefix", "TZ=UTC * * * * *", "", "invalid_schedule", "time zone"},
		{"CRON_TZ prefix", "CRON_TZ=Europe/London 0 9 * * *", "", "invalid_schedule", "time zone"},
		{"never fires", "0 0 30 2 *", "", "invalid_schedule", "never fires"},
		{"never fires 31st", "0 0 31 4,6,9,11 *", "Europe/Paris", "invalid_schedule", "never fires"},
		{"unknown macro", "@fortnightly", "", "invalid_schedule", "unknown macro"},
		{"macro with argument", "@daily 9", "", "invalid_schedule", "no arguments"},
		{"macro wrong case", "@Daily", "", "invalid_schedule", "unknown macro"},
		{"every missing", "@every", "", "invalid_schedule", "exactly one"},
		{"every two args", "@every 1h 2h", "", "invalid_schedule", "exactly one"},
		{"every garbage", "@every soon", "", "invalid_schedule", "not a Go duration"},
		{"every no unit", "@every 60", "", "invalid_schedule", "not a Go duration"},
		{"every negative", "@every -1s", "", "invalid_schedule", "positive"},
		{"every zero", "@every 0s", "", "invalid_schedule", "positive"},
		{"every 500ms", "@every 500ms", "", "every_too_short", "at least 1s"},
		{"every 999ms", "@every 999ms", "", "every_too_short", "at least 1s"},
		{"every above 10 years", "@every 87601h", "", "invalid_schedule", "at most"},
		{"every sub-millisecond", "@every 1.0000001s", "", "invalid_schedule", "milliseconds"},
		{"unknown zone", "0 9 * * *", "Mars/Olympus_Mons", "invalid_timezone", "unknown time zone"},
		{"Local zone", "0 9 * * *", "Local", "invalid_timezone", "unknown time zone"},
		{"zone path", "0 9 * * *", "../../etc/passwd", "invalid_timezone", "unknown time zone"},
		{"zone lower case", "0 9 * * *", "utc", "invalid_timezone", "unknown time zone"},
		{"zone for every", "@every 1h", "Nowhere/Land", "invalid_timezone", "unknown time zone"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := schedule.Parse(tc.spec, tc.tz, anchor)
			if err == nil {
				t.Fatalf("Parse(%q, %q) = %v, want error %s", tc.spec, tc.tz, s, tc.wantCode)
			}
			var e *schedule.Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v (%T) is not a *schedule.Error", err, err)
			}
			wantField := "schedule"
			if strings.HasPrefix(tc.wantCode, "invalid_timezone") {
				wantField = "timezone"
			}
			if e.Code != tc.wantCode || e.Field != wantField || !strings.Contains(e.Message, tc.wantIn) {
				t.Errorf("got %+v, want code %s field %s message containing %q", e, tc.wantCode, wantField, tc.wantIn)
			}
		})
	}
}

func TestParseAccepts(t *testing.T) {
	for _, spec := range []string{
		"* * * * *", "0 0 29 2 *", "0 0 29 2 1", "@every 1s", "@every 87600h", "@every 1h30m",
		"0 0 * * 0-6", "0 0 1-31 * *", "0 0 12 * * ?", "@daily", "@midnight",
		"*/5 * * * *", "?/5 * * * *", "1,*/20 * * * *", "0 0 1-5/2 * *",
		"0 9 * * *" + strings.Repeat(" ", 256-len("0 9 * * *")),
	} {
		if _, err := schedule.Parse(spec, "Europe/Berlin", anchor); err != nil {
			t.Errorf("Parse(%q): %v", spec, err)
		}
	}
}

func TestParseAt(t *testing.T) {
	now := utc("2026-05-30T12:00:00Z")
	cases := []struct {
		name, in string
		want     string // UTC instant; empty when an error is expected
		wantCode string
	}{
		{"zulu", "2026-06-01T09:00:00Z", "2026-06-01T09:00:00Z", ""},
		{"offset", "2026-06-01T09:00:00+02:00", "2026-06-01T07:00:00Z", ""},
		{"fraction kept to ms", "2026-06-01T09:00:00.123456789Z", "2026-06-01T09:00:00.123Z", ""},
		{"just after now", "2026-05-30T12:00:00.001Z", "2026-05-30T12:00:00.001Z", ""},
		{"exactly one year", "2027-05-30T12:00:00Z", "2027-05-30T12:00:00Z", ""},
		{"now", "2026-05-30T12:00:00Z", "", "at_in_past"},
		{"past", "2026-05-29T12:00:00Z", "", "at_in_past"},
		{"past after truncation", "2026-05-30T12:00:00.0009Z", "", "at_in_past"},
		{"too far", "2027-05-30T12:00:00.001Z", "", "at_too_far"},
		{"much too far", "2099-01-01T00:00:00Z", "", "at_too_far"},
		{"garbage", "tomorrow", "", "invalid_at"},
		{"empty", "", "", "invalid_at"},
		{"no zone", "2026-06-01T09:00:00", "", "invalid_at"},
		{"space separator", "2026-06-01 09:00:00Z", "", "invalid_at"},
		{"date only", "2026-06-01", "", "invalid_at"},
		{"unix seconds", "1780304400", "", "invalid_at"},
		{"out of range", "2026-02-30T09:00:00Z", "", "invalid_at"},
		{"too long", "2026-06-01T09:00:00." + strings.Repeat("1", 60) + "Z", "", "invalid_at"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := schedule.ParseAt(tc.in, now)
			if tc.wantCode == "" {
				if err != nil {
					t.Fatalf("ParseAt(%q): %v", tc.in, err)
				}
				if got.Location() != time.UTC || !got.Equal(utc(tc.want)) {
					t.Errorf("ParseAt(%q) = %v, want %s", tc.in, got, tc.want)
				}
				return
			}
			var e *schedule.Error
			if !errors.As(err, &e) || e.Code != tc.wantCode || e.Field != "at" {
				t.Errorf("ParseAt(%q) = %v, %v; want code %s field at", tc.in, got, err, tc.wantCode)
			}
		})
	}
}

func TestAt(t *testing.T) {
	at := utc("2026-06-01T09:00:00Z")
	var s schedule.Schedule = schedule.At(at)
	cases := []struct {
		from string
		want time.Time
	}{
		{"2026-06-01T08:59:59.999Z", at},
		{"2020-01-01T00:00:00Z", at},
		{"2026-06-01T09:00:00Z", time.Time{}},
		{"2026-06-01T09:00:01Z", time.Time{}},
	}
	for _, tc := range cases {
		if got := s.Next(utc(tc.from)); !got.Equal(tc.want) {
			t.Errorf("At.Next(%s) = %v, want %v", tc.from, got, tc.want)
		}
	}
	if got := schedule.NextN(s, utc("2026-01-01T00:00:00Z"), 5); len(got) != 1 || !got[0].Equal(at) {
		t.Errorf("NextN(At) = %v, want [%v]", got, at)
	}
}

func TestNextN(t *testing.T) {
	s := mustParse(t, "0 9 * * *", "Europe/Paris", anchor)
	from := utc("2026-05-30T00:00:00Z")
	cases := []struct {
		n    int
		want []string
	}{
		{-1, nil},
		{0, nil},
		{1, []string{"2026-05-30T07:00:00Z"}},
		{3, []string{"2026-05-30T07:00:00Z", "2026-05-31T07:00:00Z", "2026-06-01T07:00:00Z"}},
	}
	for _, tc := range cases {
		got := schedule.NextN(s, from, tc.n)
		if tc.want == nil && got != nil {
			t.Errorf("NextN(n=%d) = %v, want nil", tc.n, got)
		}
		if g := formatUTC(got); !slices.Equal(g, tc.want) {
			t.Errorf("NextN(n=%d) = %v, want %v", tc.n, g, tc.want)
		}
	}
	if got := schedule.NextN(s, from, 1000); len(got) != 1000 {
		t.Errorf("NextN(n=1000) returned %d times", len(got))
	}
}

func TestErrorString(t *testing.T) {
	e := &schedule.Error{Code: "invalid_at", Field: "at", Message: "at must be in the future"}
	if got, want := e.Error(), "invalid_at: at must be in the future (at)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func ExampleNextN() {
	s, err := schedule.Parse("30 2 * * *", "America/New_York", time.Now())
	if err != nil {
		panic(err)
	}
	from := time.Date(2026, 3, 7, 0, 0, 0, 0, time.UTC)
	for _, t := range schedule.NextN(s, from, 3) {
		fmt.Println(t.Format(time.RFC3339), "=", t.UTC().Format(time.RFC3339))
	}
	// Output:
	// 2026-03-07T02:30:00-05:00 = 2026-03-07T07:30:00Z
	// 2026-03-08T03:00:00-04:00 = 2026-03-08T07:00:00Z
	// 2026-03-09T02:30:00-04:00 = 2026-03-09T06:30:00Z
}

func BenchmarkNext(b *testing.B) {
	for _, bc := range []struct{ name, spec, tz string }{
		{"daily", "0 9 * * *", "America/New_York"},
		{"daily_UTC", "0 9 * * *", "UTC"},
		{"every5s", "*/5 * * * * *", "America/New_York"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := mustParse(b, bc.spec, bc.tz, anchor)
			// Stay in realistic years: past 2037 Go derives zone offsets from a
			// rule string, which is slower and not what production sees.
			start, end := utc("2026-01-01T00:00:00Z"), utc("2028-01-01T00:00:00Z")
			t := start
			for b.Loop() {
				if t = s.Next(t); t.After(end) {
					t = start
				}
			}
		})
	}
}

// TestParseErrorMessagesQuoteAFragment: an error message quotes at most a
// clipped fragment of the input (see Error), cut between characters, and
// says what is wrong in words rather than in strconv's.
func TestParseErrorMessagesQuoteAFragment(t *testing.T) {
	long := strings.Repeat("é", 100) // 200 bytes, 2 per character
	cases := []struct{ spec, tz, wantIn string }{
		{"0 9 * * " + long, "", "is not a number or a name"},
		{"0 9 * * 1-" + long, "", "is not a number or a name"},
		{"0 9 * * 1," + long, "", "is not a number or a name"},
		{"0 9 * * fun", "", `"fun" is not a number or a name`},
		{"0 9 * * 1-", "", "a number or a name is missing"},
		{"0 9 * * 1-2-" + long, "", "too many hyphens"},
		{"0 9 * * 1/2/" + long, "", "too many slashes"},
		{"@" + long, "", "unknown macro"},
		{"0 9 * * *", "Europe/" + long, "unknown time zone"},
	}
	for _, tc := range cases {
		_, err := schedule.Parse(tc.spec, tc.tz, anchor)
		var e *schedule.Error
		if !errors.As(err, &e) {
			t.Fatalf("Parse(%.20q…): %v, want a *schedule.Error", tc.spec, err)
		}
		msg := e.Message
		if !utf8.ValidString(msg) || strings.Contains(msg, `\x`) || strings.ContainsRune(msg, utf8.RuneError) {
			t.Errorf("Parse(%.20q…): message %q cuts a character in two", tc.spec, msg)
		}
		if strings.Contains(msg, strings.Repeat("é", 33)) {
			t.Errorf("Parse(%.20q…): message %q quotes more than a fragment of the input", tc.spec, msg)
		}
		if !strings.Contains(msg, tc.wantIn) {
			t.Errorf("Parse(%.20q…): message %q, want it to contain %q", tc.spec, msg, tc.wantIn)
		}
	}
}
