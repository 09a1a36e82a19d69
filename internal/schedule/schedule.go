// Package schedule parses job schedules and computes their fire times.
//
// A recurring schedule is one of
//
//   - cron with 5 fields: minute hour day-of-month month day-of-week;
//   - cron with 6 fields, seconds first;
//   - a macro: @yearly (= @annually), @monthly, @weekly, @daily (= @midnight), @hourly;
//   - @every <Go duration>, at least 1s, at most 87600h (10 × 365 days), in whole
//     milliseconds.
//
// A one-off schedule is an RFC 3339 instant, see [ParseAt] and [At].
//
// Cron fields are parsed by github.com/robfig/cron/v3 (names such as "mon" and "jan",
// ranges, lists, steps, "?" as "*"). Day-of-month and day-of-week follow robfig's
// rule: when neither field contains a "*" (or "?") that is unstepped or stepped
// by 1 ("*/1"), a day matches if EITHER field matches; otherwise both must match.
// So "0 0 */2 * 1" fires on odd days and on Mondays (Vixie cron, which looks only
// at the leading "*", would fire on odd Mondays), and "0 0 */1 * 1" on Mondays.
// Fire times are computed here, not by robfig, because of the daylight-saving
// rules below.
//
// # Time zones and daylight saving
//
// Cron schedules and macros are evaluated on the wall clock of their IANA time zone.
// Every matching wall-clock time (a "civil occurrence") fires at most once:
//
//   - Repeated hour (the clock falls back): a civil occurrence that happens twice
//     fires at its FIRST instant only; during the second pass nothing fires again
//     for a wall-clock time that already fired.
//   - Skipped hour (the clock springs forward): a civil occurrence inside the gap is
//     not lost; it fires once at the first instant after the gap, the transition
//     instant itself. Several occurrences in one gap collapse into that single fire,
//     also with an occurrence at exactly the end of the gap.
//   - Wildcard hours get no extra runs: a schedule that fires in every hour of the
//     day (its hour field allows all 24, as "*" does; @hourly counts as
//     "0 * * * *") drops the occurrences inside a gap instead of shifting them,
//     because it keeps firing at its regular rate right after the gap anyway. Any
//     other schedule, a wildcard minute in a fixed hour ("*/20 2 * * *") or a
//     stepped hour ("0 */2 * * *") included, would lose its gap occurrences for
//     good: they fire once at the gap's end.
//
// Under these rules the map from civil occurrence to instant is monotonic, so fire
// times are strictly increasing, and Next(t) is exact for every t, including a t in
// the second pass of a repeated hour: it returns the first fire after t and never a
// second fire of a wall-clock time that already fired in the first pass.
//
// @every schedules and [At] ignore time zones and daylight saving entirely: they
// live in absolute time.
package schedule

import (
	"errors"
	"fmt"
	"math/bits"
	"path"
	"regexp"
	"strings"
	"sync"
	"time"
	_ "time/tzdata" // zones must resolve even on hosts without /usr/share/zoneinfo
	"unicode/utf8"

	"github.com/robfig/cron/v3"
)

// Limits on input.
const (
	// MaxSpecLength is the longest schedule text Parse accepts, in bytes.
	MaxSpecLength = 256
	// MinEvery and MaxEvery bound the duration of an @every schedule.
	MinEvery = time.Second
	MaxEvery = 10 * 365 * 24 * time.Hour

	// horizonYears bounds the search for the next cron occurrence. The rarest
	// satisfiable calendar pattern is February 29, at most 8 years apart
	// (2096 → 2104).
	horizonYears = 10
	maxZoneName  = 128
	maxAtLength  = 64
)

// Error codes returned in [Error].Code.
const (
	CodeInvalidSchedule = "invalid_schedule"
	CodeInvalidTimezone = "invalid_timezone"
	CodeEveryTooShort   = "every_too_short"
	CodeInvalidAt       = "invalid_at"
	CodeAtInPast        = "at_in_past"
	CodeAtTooFar        = "at_too_far"
)

// Schedule yields fire times.
type Schedule interface {
	// Next returns the first fire time strictly after t, or the zero time if none
	// remains. Implementations are safe for concurrent use.
	Next(t time.Time) time.Time
	// Count returns the number of fire times in (after, until], the fire
	// times Next would walk through from after. It walks them one by one
	// only in the partial first and last days and on days whose UTC offset
	// changes; every other day is counted whole (a per-second schedule
	// fires 2.6 million times a month), and an @every schedule is divided.
	Count(after, until time.Time) int64
}

// Error is a bad-input error: Code is a snake_case code (one of the Code
// constants), Field the input field it concerns ("schedule", "timezone" or "at").
// Message is meant for the user and never contains more than a fragment of the
// input.
type Error struct{ Code, Field, Message string }

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (%s)", e.Code, e.Message, e.Field)
}

func scheduleError(format string, args ...any) *Error {
	return &Error{Code: CodeInvalidSchedule, Field: "schedule", Message: fmt.Sprintf(format, args...)}
}

// IgnoresZone reports whether spec is an @every schedule, whose fire times
// do not depend on its time zone (see Parse).
func IgnoresZone(spec string) bool {
	fields := strings.Fields(spec)
	return len(fields) > 0 && fields[0] == "@every"
}

// Parse parses a recurring schedule in the IANA time zone tz ("" means "UTC").
// anchor is the moment the schedule was set: @every fires at anchor + k·d for
// k ≥ 1, in absolute time, so restarts never drift it. The anchor is truncated to
// whole milliseconds, so every fire time of every Schedule returned by Parse is a
// whole millisecond (cron: whole second). Cron schedules ignore the anchor.
//
// Fire times returned by Next carry tz's location; compare them as instants.
//
// Errors are *Error:
//   - "invalid_schedule", Field "schedule": empty, longer than MaxSpecLength, not
//     5 or 6 cron fields or a known macro, a field out of range, a TZ=/CRON_TZ=
//     prefix (the zone is a separate field), a bad @every duration (not positive,
//     above MaxEvery, not whole milliseconds), or a schedule that never fires.
//   - "every_too_short", Field "schedule": @every between 0 and MinEvery.
//   - "invalid_timezone", Field "timezone": tz is not a known IANA zone ("Local"
//     included).
func Parse(spec, tz string, anchor time.Time) (Schedule, error) {
	if len(spec) > MaxSpecLength {
		return nil, scheduleError("schedule is longer than %d characters", MaxSpecLength)
	}
	fields := strings.Fields(spec)
	if len(fields) == 0 {
		return nil, scheduleError("schedule is empty")
	}
	if f := fields[0]; strings.HasPrefix(f, "TZ=") || strings.HasPrefix(f, "CRON_TZ=") {
		return nil, scheduleError("a time zone prefix is not allowed; set the timezone field instead")
	}
	loc, err := LoadLocation(tz)
	if err != nil {
		return nil, err
	}
	if fields[0] == "@every" {
		return parseEvery(fields, loc, anchor)
	}
	if strings.HasPrefix(fields[0], "@") {
		if len(fields) != 1 {
			return nil, scheduleError("a macro takes no arguments")
		}
		expanded, ok := macros[fields[0]]
		if !ok {
			return nil, scheduleError("unknown macro %q (want @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly or @every)", clip(fields[0]))
		}
		fields = strings.Fields(expanded)
	}
	if len(fields) != 5 && len(fields) != 6 {
		return nil, scheduleError("cron needs 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds first), got %d", len(fields))
	}
	s, err := parseCron(fields, loc)
	if err != nil {
		return nil, err
	}
	if s.Next(anchor).IsZero() {
		return nil, scheduleError("schedule never fires")
	}
	return s, nil
}

// macros maps each macro to its 6-field cron equivalent (robfig's definitions).
var macros = map[string]string{
	"@yearly":   "0 0 0 1 1 *",
	"@annually": "0 0 0 1 1 *",
	"@monthly":  "0 0 0 1 * *",
	"@weekly":   "0 0 0 * * 0",
	"@daily":    "0 0 0 * * *",
	"@midnight": "0 0 0 * * *",
	"@hourly":   "0 0 * * * *",
}

var (
	cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow)
	fieldNames = [6]string{"second", "minute", "hour", "day-of-month", "month", "day-of-week"}
)

func parseCron(fields []string, loc *time.Location) (*cronSchedule, error) {
	six := fields
	if len(six) == 5 {
		six = append([]string{"0"}, fields...)
	}
	if err := checkStars(six); err != nil {
		return nil, err
	}
	parsed, err := cronParser.Parse(strings.Join(six, " "))
	if err != nil {
		return nil, cronFieldError(six, err)
	}
	spec, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return nil, scheduleError("not a cron schedule")
	}
	const star = 1 << 63
	return &cronSchedule{
		second:    spec.Second &^ star,
		minute:    spec.Minute &^ star,
		hour:      spec.Hour &^ star,
		dom:       spec.Dom &^ star,
		month:     spec.Month &^ star,
		dow:       spec.Dow &^ star,
		dayAnd:    spec.Dom&star != 0 || spec.Dow&star != 0,
		dropInGap: spec.Hour&^star == 1<<24-1,
		loc:       loc,
	}, nil
}

// checkStars refuses a "*" or "?" given a range end ("*-5", "?-3", "*-"):
// robfig reads it as the star alone and ignores the rest, so a typo for a
// range would fire at every value of the field.
func checkStars(six []string) *Error {
	for i, f := range six {
		for item := range strings.SplitSeq(f, ",") {
			if strings.HasPrefix(item, "*-") || strings.HasPrefix(item, "?-") {
				return scheduleError("%s field %q: %q stands for every value and takes no range end; write a range such as 0-5", fieldNames[i], clip(f), item[:1])
			}
		}
	}
	return nil
}

// cronFieldError names the first field robfig rejects, so the user sees which one
// is wrong; robfig's own error does not say.
func cronFieldError(six []string, whole error) *Error {
	for i := range six {
		probe := []string{"0", "0", "0", "*", "*", "*"}
		probe[i] = six[i]
		if _, err := cronParser.Parse(strings.Join(probe, " ")); err != nil {
			hint := ""
			if i == 5 {
				// Some crons read 7 as Sunday, others (Quartz, EventBridge) 1
				// as Sunday: refused, with the numbering this one uses.
				hint = " (days are 0–6 or SUN–SAT; Sunday is 0)"
			}
			return scheduleError("%s field %q: %s%s", fieldNames[i], clip(six[i]), fieldReason(err), hint)
		}
	}
	return scheduleError("%s", clip(whole.Error()))
}

// fieldReason is robfig's reason for refusing a field, with the part of the
// field it names clipped: robfig echoes it whole, and the field may be most
// of the 256 bytes of a schedule. robfig's messages end with ": " and that
// part (which holds no space), except its failure to read a number, which
// ends with strconv's wording and is said in words instead.
func fieldReason(err error) string {
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "failed to parse int from "); ok {
		expr, _, _ := strings.Cut(rest, ": ")
		if expr == "" {
			return "a number or a name is missing" // "1-", "*/", "-1"
		}
		return fmt.Sprintf("%q is not a number or a name", clip(expr))
	}
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return msg[:i+2] + clip(msg[i+2:])
	}
	return clip(msg)
}

// clip returns at most the first 32 bytes of s, cut between characters, with
// "…" when it cut: a message then never quotes more than a fragment of the
// input, nor half a character (which %q would show as \xc3).
func clip(s string) string {
	const n = 32
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

func parseEvery(fields []string, loc *time.Location, anchor time.Time) (Schedule, error) {
	if len(fields) != 2 {
		return nil, scheduleError("@every needs exactly one duration, such as \"@every 90s\"")
	}
	d, err := time.ParseDuration(fields[1])
	switch {
	case err != nil:
		return nil, scheduleError("@every duration %q is not a Go duration such as 90s, 1h30m or 1500ms", clip(fields[1]))
	case d <= 0:
		return nil, scheduleError("@every duration must be positive")
	case d < MinEvery:
		return nil, &Error{Code: CodeEveryTooShort, Field: "schedule", Message: fmt.Sprintf("@every duration must be at least %v", MinEvery)}
	case d > MaxEvery:
		return nil, scheduleError("@every duration must be at most %v", MaxEvery)
	case d%time.Millisecond != 0:
		return nil, scheduleError("@every duration must be a whole number of milliseconds")
	}
	return &everySchedule{anchor: anchor.Round(0).Truncate(time.Millisecond), every: d, loc: loc}, nil
}

// zones caches successfully loaded locations: time.LoadLocation reads and parses
// the zone file on every call, and Parse runs for every job the platform loads.
var zones sync.Map // zone name → *time.Location

// LoadLocation returns the IANA time zone name ("" means UTC). A job's zone
// must not depend on the host, so names only a host's zoneinfo directory
// holds are refused: "Local", "localtime" and "posixrules" (the host's own
// zone), and the "posix/" and "right/" trees (not in the embedded zone
// data, so a replica without the directory could not load them; and the
// right/ zones count leap seconds, which Go ignores, putting every change
// 27 s off). Locations are cached, so repeated calls are cheap. The error is
// an *Error with Code "invalid_timezone", Field "timezone".
func LoadLocation(name string) (*time.Location, error) {
	if name == "" || name == "UTC" {
		return time.UTC, nil
	}
	if v, ok := zones.Load(name); ok {
		return v.(*time.Location), nil
	}
	bad := &Error{Code: CodeInvalidTimezone, Field: "timezone", Message: fmt.Sprintf("unknown time zone %q; use an IANA name such as Europe/Paris", clip(name))}
	switch {
	case name == "Local", name == "localtime", name == "posixrules", len(name) > maxZoneName,
		strings.HasPrefix(name, "posix/"), strings.HasPrefix(name, "right/"),
		// Another spelling of a path (./localtime, Europe//Paris) reads the
		// same host file: an IANA name is a clean path.
		path.Clean(name) != name:
		return nil, bad
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, bad
	}
	v, _ := zones.LoadOrStore(name, loc)
	return v.(*time.Location), nil
}

// ParseAt parses a one-off schedule: an RFC 3339 instant (any offset, fraction
// optional) that must be strictly after now and at most one calendar year ahead
// (now.AddDate(1, 0, 0), included). The instant is truncated to whole milliseconds,
// the precision of the wire format, before it is checked, and returned in UTC.
//
// Errors are *Error with Field "at": Code "invalid_at" (not RFC 3339),
// "at_in_past" (not after now) or "at_too_far".
func ParseAt(s string, now time.Time) (time.Time, error) {
	var at time.Time
	err := errors.New("not RFC 3339")
	if len(s) <= maxAtLength && rfc3339.MatchString(s) {
		// RFC 3339 allows lower case t and z; time.Parse does not.
		s = strings.ToUpper(s)
		at, err = time.Parse(time.RFC3339Nano, s)
	}
	if err != nil {
		return time.Time{}, &Error{Code: CodeInvalidAt, Field: "at", Message: "at must be an RFC 3339 instant such as 2026-10-09T09:00:00Z"}
	}
	at = at.UTC().Truncate(time.Millisecond)
	if !at.After(now) {
		return time.Time{}, &Error{Code: CodeAtInPast, Field: "at", Message: "at must be in the future"}
	}
	if at.After(now.AddDate(1, 0, 0)) {
		return time.Time{}, &Error{Code: CodeAtTooFar, Field: "at", Message: "at must be at most one year ahead"}
	}
	return at, nil
}

// rfc3339 is the date-time of RFC 3339 §5.6. It is checked before
// time.Parse, which also takes a comma before the fraction and offset
// minutes past 59 (+00:60 read as +01:00). The ranges of the other fields
// time.Parse checks.
var rfc3339 = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`)

// At is a Schedule that fires once, at its instant.
type At time.Time

// Next returns the instant of a if it is strictly after t, else the zero time.
func (a At) Next(t time.Time) time.Time {
	if at := time.Time(a); at.After(t) {
		return at
	}
	return time.Time{}
}

// Count implements Schedule: 1 if the instant of a is in (after, until].
func (a At) Count(after, until time.Time) int64 {
	if at := time.Time(a); at.After(after) && !at.After(until) {
		return 1
	}
	return 0
}

// NextN returns up to n fire times of s strictly after t, in increasing order;
// fewer when the schedule runs out. It returns nil for n ≤ 0. The result has
// length at most n, so callers bound n.
func NextN(s Schedule, t time.Time, n int) []time.Time {
	if n <= 0 {
		return nil
	}
	out := make([]time.Time, 0, min(n, 128))
	for range n {
		t = s.Next(t)
		if t.IsZero() {
			break
		}
		out = append(out, t)
	}
	return out
}

// everySchedule fires at anchor + k·every, k ≥ 1.
type everySchedule struct {
	anchor time.Time
	every  time.Duration
	loc    *time.Location
}

func (s *everySchedule) Next(t time.Time) time.Time {
	if t.Before(s.anchor) {
		return s.anchor.Add(s.every).In(s.loc)
	}
	// fire = t − (t − anchor) mod every + every.
	_, rem := periods(s.anchor, t, s.every)
	return t.Add(s.every - rem).In(s.loc)
}

// periods returns how many whole periods every fit in b − a (b ≥ a), and
// what is left. b − a can exceed time.Duration's range (292 years), so it
// is divided in 128 bits.
func periods(a, b time.Time, every time.Duration) (uint64, time.Duration) {
	sec := b.Unix() - a.Unix()
	nsec := int64(b.Nanosecond()) - int64(a.Nanosecond())
	if nsec < 0 {
		sec--
		nsec += 1e9
	}
	hi, lo := bits.Mul64(uint64(sec), 1e9)
	lo, carry := bits.Add64(lo, uint64(nsec), 0)
	hi += carry
	// Div64 needs hi < every: sec < 2^63 gives hi < 2^63·10^9/2^64 = 5·10^8 ns,
	// below MinEvery.
	q, rem := bits.Div64(hi, lo, uint64(every))
	return q, time.Duration(rem)
}

// Count implements Schedule: the fire times in (after, until] are the first
// one after after and those a whole number of periods later.
func (s *everySchedule) Count(after, until time.Time) int64 {
	first := s.Next(after)
	if first.After(until) {
		return 0
	}
	q, _ := periods(first, until, s.every)
	return int64(q) + 1
}

// cronSchedule is a parsed cron expression evaluated on the wall clock of loc.
// Field masks hold bit v for each allowed value v (robfig's layout, star bit
// removed).
type cronSchedule struct {
	second, minute, hour, dom, month, dow uint64
	// dayAnd: day-of-month AND day-of-week must match (one of them has a "*");
	// otherwise either suffices.
	dayAnd bool
	// dropInGap: occurrences in a spring-forward gap are dropped instead of
	// shifted to the gap's end (the schedule fires in every hour).
	dropInGap bool
	loc       *time.Location
}

// Next implements Schedule. It walks matching civil (wall-clock) times forward from
// the wall clock of t, skipping field by field, and maps each one to an instant with
// the daylight-saving rules of the package comment.
func (s *cronSchedule) Next(t time.Time) time.Time {
	t = t.In(s.loc)
	_, off := t.Zone()
	start := t.Unix() + int64(off) + 1 // first whole civil second after t's wall clock
	if s.loc != time.UTC {
		// In the second pass of a repeated hour, the civil times up to the end of
		// the repeated range already fired during the first pass: start after it.
		if zs, _ := t.ZoneBounds(); !zs.IsZero() {
			if _, prev := zs.Add(-1).Zone(); prev > off {
				start = max(start, zs.Unix()+int64(prev))
			}
		}
	}
	c := civilOf(start)
	limit := c.year + horizonYears
	for {
		var ok bool
		if c, ok = s.nextCivil(c, limit); !ok {
			return time.Time{}
		}
		at, inGap := s.resolve(c)
		switch {
		case inGap && at.IsZero():
			c = civilOf(c.seconds() + 1) // gap with unknown end (bad zone data): drop
		case inGap:
			if !s.dropInGap && at.After(t) {
				return at
			}
			// Every other occurrence in this gap maps to the same instant (or is
			// dropped too): resume at the first civil time after the gap.
			_, o := at.Zone()
			c = civilOf(max(c.seconds()+1, at.Unix()+int64(o)))
		case at.After(t):
			return at
		default:
			// Unreachable with well-formed zone data (see the start above); kept
			// so that Next never returns a time at or before t.
			c = civilOf(c.seconds() + 1)
		}
	}
}

// Count implements Schedule. It walks the fire times with Next only on
// days that are not plain (see plainDay). A plain day, if it matches, fires
// once at each matching hour, minute and second, at its midnight plus that
// time of day: a whole one is counted by multiplying, the part of one in
// (after, until] by counting the matching times of day in a range.
func (s *cronSchedule) Count(after, until time.Time) int64 {
	var n int64
	t := after
	perDay := s.timesBefore(86400)
	// day counts civil days on, so the loop moves on whatever instant
	// time.Date picks for a midnight that does not exist or exists twice.
	y, m, d := t.In(s.loc).Date()
	day := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	for {
		prev := day
		day = day.AddDate(0, 0, 1)
		midnight := time.Date(day.Year(), day.Month(), day.Day(), 0, 0, 0, 0, s.loc)
		// The rest of the day before midnight, after t: counted if the day
		// is plain, walked otherwise. t is in the day, or before it with no
		// fire time in (t, its start).
		start := time.Date(prev.Year(), prev.Month(), prev.Day(), 0, 0, 0, 0, s.loc)
		if end, ok := s.plainDay(start); ok && end.Equal(midnight) {
			last := end.Add(-time.Nanosecond)
			if until.Before(last) {
				last = until
			}
			if s.dayMatches(prev) && !last.Before(start) {
				// The fire times start + k s with t < start + k s ≤ last.
				from := 0
				if !t.Before(start) {
					from = int(t.Sub(start)/time.Second) + 1
				}
				if to := int(last.Sub(start)/time.Second) + 1; to > from {
					n += s.timesBefore(to) - s.timesBefore(from)
				}
			}
			if !until.After(end.Add(-time.Nanosecond)) {
				return n
			}
			t = end.Add(-time.Nanosecond)
		}
		for {
			next := s.Next(t)
			if next.IsZero() || next.After(until) {
				return n
			}
			if !next.Before(midnight) {
				break
			}
			n++
			t = next
		}
		// No fire time in (t, midnight): jump over the plain days from it.
		for midnight.After(t) {
			end, ok := s.plainDay(midnight)
			if !ok || end.After(until) {
				break
			}
			if s.dayMatches(day) {
				n += perDay
			}
			t = end.Add(-time.Nanosecond)
			day = day.AddDate(0, 0, 1)
			midnight = end
		}
	}
}

// dayMatches reports whether the civil day of day (its date, read in UTC)
// matches the month and day fields.
func (s *cronSchedule) dayMatches(day time.Time) bool {
	return s.month&(1<<int(day.Month())) != 0 && s.nextDay(day.Year(), int(day.Month()), day.Day()) == day.Day()
}

// timesBefore returns the number of matching times of day (hour, minute,
// second) earlier than sod seconds after midnight, 0 ≤ sod ≤ 86400.
func (s *cronSchedule) timesBefore(sod int) int64 {
	h, m, sec := sod/3600, sod/60%60, sod%60
	perHour := int64(bits.OnesCount64(s.minute) * bits.OnesCount64(s.second))
	n := int64(bits.OnesCount64(s.hour&(1<<h-1))) * perHour
	if h < 24 && s.hour&(1<<h) != 0 {
		n += int64(bits.OnesCount64(s.minute&(1<<m-1)) * bits.OnesCount64(s.second))
		if s.minute&(1<<m) != 0 {
			n += int64(bits.OnesCount64(s.second & (1<<sec - 1)))
		}
	}
	return n
}

// plainDay reports whether the civil day starting at start, a midnight of
// s.loc, lies in one period of its zone's offset, from that midnight to the
// next one (end), with no civil time of the day firing at an instant
// outside [start, end) (the first pass of a repeated hour before it) and
// none of another day firing inside (a skipped hour's end at start). Its
// fire times are then its matching civil times, each at one instant.
func (s *cronSchedule) plainDay(start time.Time) (end time.Time, ok bool) {
	start = start.In(s.loc)
	if start.Hour() != 0 || start.Minute() != 0 || start.Second() != 0 || start.Nanosecond() != 0 {
		return time.Time{}, false // no midnight that day: it falls in a gap
	}
	if s.loc == time.UTC {
		return start.Add(24 * time.Hour), true
	}
	y, m, d := start.Date()
	_, off := start.Zone()
	end = time.Date(y, m, d+1, 0, 0, 0, 0, s.loc)
	zs, ze := start.ZoneBounds()
	if _, endOff := end.Zone(); endOff != off || end.Sub(start) != 24*time.Hour || !ze.IsZero() && ze.Before(end) {
		return time.Time{}, false
	}
	if !zs.IsZero() {
		if !zs.Before(start) {
			return time.Time{}, false // a gap may end at start
		}
		// Across a fall-back at zs, the wall clock up to zs+prev was
		// lived through first before zs.
		if _, prev := zs.Add(-1).Zone(); prev > off && zs.Unix()+int64(prev) > start.Unix()+int64(off) {
			return time.Time{}, false
		}
	}
	return end, true
}

// resolve maps civil time c to the instant it fires at: its first occurrence, or,
// when c falls in a spring-forward gap (inGap), the end of the gap, which is the
// transition instant. That end is zero only if the zone data are inconsistent.
func (s *cronSchedule) resolve(c civil) (at time.Time, inGap bool) {
	t0 := time.Date(c.year, time.Month(c.month), c.day, c.hour, c.minute, c.second, 0, s.loc)
	if s.loc == time.UTC {
		return t0, false
	}
	_, off := t0.Zone()
	cs := c.seconds()
	if wall := t0.Unix() + int64(off); wall != cs {
		// c does not exist. time.Date chose either the offset from before the gap
		// (t0 is past the transition, its wall clock later than c) or the one from
		// after it (t0 is before the transition).
		zs, ze := t0.ZoneBounds()
		if wall > cs {
			return zs, true
		}
		return ze, true
	}
	// c exists. time.Date does not promise which of two occurrences it returns, so
	// look for an earlier one in the zone period before t0's, across a fall-back.
	if zs, _ := t0.ZoneBounds(); !zs.IsZero() {
		if _, prev := zs.Add(-1).Zone(); prev > off {
			if first := cs - int64(prev); first < zs.Unix() {
				return time.Unix(first, 0).In(s.loc), false
			}
		}
	}
	return t0, false
}

// civil is a wall-clock time to the second, in the proleptic Gregorian calendar.
type civil struct{ year, month, day, hour, minute, second int }

// civilOf returns the civil time sec seconds after 1970-01-01T00:00:00 (wall clock).
func civilOf(sec int64) civil {
	days := floorDiv(sec, 86400)
	rem := int(sec - days*86400)
	y, m, d := civilFromDays(days)
	return civil{y, m, d, rem / 3600, rem / 60 % 60, rem % 60}
}

// seconds is the inverse of civilOf.
func (c civil) seconds() int64 {
	return daysFromCivil(c.year, c.month, c.day)*86400 + int64(c.hour*3600+c.minute*60+c.second)
}

// nextCivil returns the first civil time ≥ c that matches every field, searching
// no later than the end of year limit. Like robfig, it advances the largest field
// that does not match and resets the smaller ones, so a call costs a handful of
// steps rather than one per second.
func (s *cronSchedule) nextCivil(c civil, limit int) (civil, bool) {
	for c.year <= limit {
		if m := nextBit(s.month, c.month); m != c.month {
			if m < 0 {
				c = civil{year: c.year + 1, month: 1, day: 1}
				continue
			}
			c = civil{year: c.year, month: m, day: 1}
		}
		if d := s.nextDay(c.year, c.month, c.day); d != c.day {
			if d < 0 {
				c = civil{year: c.year, month: c.month + 1, day: 1}
				if c.month > 12 {
					c = civil{year: c.year + 1, month: 1, day: 1}
				}
				continue
			}
			c = civil{year: c.year, month: c.month, day: d}
		}
		if h := nextBit(s.hour, c.hour); h != c.hour {
			if h < 0 {
				c = civil{year: c.year, month: c.month, day: c.day + 1} // nextDay handles overflow
				continue
			}
			c.hour, c.minute, c.second = h, 0, 0
		}
		if m := nextBit(s.minute, c.minute); m != c.minute {
			if m < 0 {
				c.hour, c.minute, c.second = c.hour+1, 0, 0
				continue
			}
			c.minute, c.second = m, 0
		}
		if sec := nextBit(s.second, c.second); sec != c.second {
			if sec < 0 {
				c.minute, c.second = c.minute+1, 0
				continue
			}
			c.second = sec
		}
		return c, true
	}
	return civil{}, false
}

// nextDay returns the first day ≥ d of month m in year y that matches the day
// fields, or -1 if none is left in that month.
func (s *cronSchedule) nextDay(y, m, d int) int {
	last := daysIn(y, m)
	if d > last {
		return -1
	}
	wd := weekday(daysFromCivil(y, m, d))
	for ; d <= last; d++ {
		domOK := s.dom&(1<<d) != 0
		dowOK := s.dow&(1<<wd) != 0
		if s.dayAnd && domOK && dowOK || !s.dayAnd && (domOK || dowOK) {
			return d
		}
		wd = (wd + 1) % 7
	}
	return -1
}

// nextBit returns the lowest set bit of mask at or above from, or -1.
func nextBit(mask uint64, from int) int {
	if from > 63 {
		return -1
	}
	if m := mask >> from << from; m != 0 {
		return bits.TrailingZeros64(m)
	}
	return -1
}

func daysIn(y, m int) int {
	switch m {
	case 2:
		if y%4 == 0 && (y%100 != 0 || y%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// weekday returns the day of the week (Sunday = 0) of a day counted from 1970-01-01.
func weekday(days int64) int {
	return int(floorMod(days+4, 7)) // 1970-01-01 was a Thursday
}

// daysFromCivil and civilFromDays convert between dates and days since 1970-01-01
// (Howard Hinnant's algorithms).
func daysFromCivil(y, m, d int) int64 {
	yy := int64(y)
	if m <= 2 {
		yy--
	}
	era := floorDiv(yy, 400)
	yoe := yy - era*400
	mp := int64(m+9) % 12 // March = 0
	doy := (153*mp+2)/5 + int64(d) - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

func civilFromDays(z int64) (y, m, d int) {
	z += 719468
	era := floorDiv(z, 146097)
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d = int(doy - (153*mp+2)/5 + 1)
	m = int((mp+2)%12 + 1)
	y = int(yoe + era*400)
	if m <= 2 {
		y++
	}
	return y, m, d
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func floorMod(a, b int64) int64 { return a - floorDiv(a, b)*b }
