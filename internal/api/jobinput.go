package api

import (
	"errors"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/egress"
	"github.com/vibejobs/vibejobs/internal/schedule"
)

// jobInput is a create or PATCH body: a nil field was not given.
type jobInput struct {
	name, schedule, at, timezone, url, timeout, catchUp *string
	enabled                                             *bool
	retry                                               *retryInput
}

type retryInput struct {
	maxAttempts            *int
	minBackoff, maxBackoff *string
}

// parseJobInput decodes a job body strictly: one JSON object, known fields
// only, each of its type and none null.
func parseJobInput(body []byte) (*jobInput, *vibejobs.Error) {
	o, e := decodeObject(body, "")
	if e != nil {
		return nil, e
	}
	if e := o.only("name", "schedule", "at", "timezone", "url", "enabled", "retry", "timeout", "catchUp"); e != nil {
		return nil, e
	}
	in := &jobInput{}
	for _, f := range []struct {
		key string
		dst **string
	}{
		{"name", &in.name}, {"schedule", &in.schedule}, {"at", &in.at}, {"timezone", &in.timezone},
		{"url", &in.url}, {"timeout", &in.timeout}, {"catchUp", &in.catchUp},
	} {
		v, e := o.str(f.key)
		if e != nil {
			return nil, e
		}
		*f.dst = v
	}
	if in.enabled, e = o.boolean("enabled"); e != nil {
		return nil, e
	}
	ro, e := o.nested("retry")
	if e != nil {
		return nil, e
	}
	if ro != nil {
		if e := ro.only("maxAttempts", "minBackoff", "maxBackoff"); e != nil {
			return nil, e
		}
		in.retry = &retryInput{}
		if in.retry.maxAttempts, e = ro.integer("maxAttempts"); e != nil {
			return nil, e
		}
		if in.retry.minBackoff, e = ro.str("minBackoff"); e != nil {
			return nil, e
		}
		if in.retry.maxBackoff, e = ro.str("maxBackoff"); e != nil {
			return nil, e
		}
	}
	return in, nil
}

// newJobDefaults is a job before its input is applied.
func newJobDefaults(projectID string) *vibejobs.Job {
	return &vibejobs.Job{
		ProjectID: projectID,
		Timezone:  "UTC",
		Enabled:   true,
		State:     vibejobs.JobActive,
		Retry:     vibejobs.DefaultRetryPolicy(),
		Timeout:   vibejobs.DefaultTimeout,
		CatchUp:   vibejobs.CatchUpAll,
	}
}

// applyJobInput checks in and writes it onto j: a new job with its defaults
// (creating) or the stored one (PATCH). It reports whether the schedule
// changed: another schedule or time zone, or an at given (again). Fields are
// checked in a fixed order so an answer names one field predictably.
func (s *Server) applyJobInput(j *vibejobs.Job, in *jobInput, now time.Time, creating bool) (scheduleChanged bool, e *vibejobs.Error) {
	if in.name != nil {
		if e := checkName(*in.name, "name"); e != nil {
			return false, e
		}
		j.Name = *in.name
	} else if creating {
		return false, invalid("invalid_name", "name", "name is required")
	}

	switch {
	case in.schedule != nil && in.at != nil:
		return false, invalid("schedule_conflict", "schedule", "give either schedule (recurring) or at (one-off), not both")
	case creating && in.schedule == nil && in.at == nil:
		return false, invalid("schedule_required", "schedule", "give schedule (recurring) or at (one-off)")
	}
	if in.timezone != nil {
		tz := *in.timezone
		if _, err := schedule.LoadLocation(tz); err != nil {
			return false, scheduleErr(err, "timezone", "invalid_timezone")
		}
		if tz == "" {
			tz = "UTC"
		}
		if tz != j.Timezone {
			j.Timezone = tz
			// Neither a one-off instant nor @every depends on the zone: a
			// new anchor would only move an @every job's grid.
			scheduleChanged = j.At == nil && !schedule.IgnoresZone(j.Schedule)
		}
	}
	if in.schedule != nil {
		spec := strings.TrimSpace(*in.schedule)
		if spec != j.Schedule || j.At != nil {
			scheduleChanged = true
		}
		j.Schedule, j.At = spec, nil
	}
	if in.at != nil {
		at, err := schedule.ParseAt(*in.at, now)
		if err != nil {
			return false, scheduleErr(err, "at", "invalid_at")
		}
		j.Schedule, j.At = "", &at
		scheduleChanged = true
	}
	if j.At == nil && (scheduleChanged || creating) {
		if _, err := schedule.Parse(j.Schedule, j.Timezone, now); err != nil {
			return false, scheduleErr(err, "schedule", "invalid_schedule")
		}
	}

	if in.url != nil {
		u, e := s.checkURL(*in.url)
		if e != nil {
			return false, e
		}
		j.URL = u
	} else if creating {
		return false, invalid("invalid_url", "url", "url is required")
	}

	if in.retry != nil {
		if e := applyRetry(&j.Retry, in.retry); e != nil {
			return false, e
		}
	}
	if in.timeout != nil {
		d, err := time.ParseDuration(*in.timeout)
		if err != nil || d < vibejobs.MinTimeout || d > vibejobs.MaxTimeout {
			return false, invalid("invalid_timeout", "timeout", "timeout must be a duration from 1s to 30s, such as \"10s\"")
		}
		j.Timeout = d
	}
	if in.catchUp != nil {
		switch c := vibejobs.CatchUp(*in.catchUp); c {
		case vibejobs.CatchUpAll, vibejobs.CatchUpLatest, vibejobs.CatchUpNone:
			j.CatchUp = c
		default:
			return false, invalid("invalid_catch_up", "catchUp", "catchUp must be all, latest or none")
		}
	}
	if in.enabled != nil {
		j.Enabled = *in.enabled
	}
	return scheduleChanged, nil
}

// checkName accepts 1–200 characters, not all blank, without control
// characters or the characters that hide or reorder text (hiddenInName).
func checkName(name, field string) *vibejobs.Error {
	if strings.TrimSpace(name) == "" || utf8.RuneCountInString(name) > vibejobs.MaxNameLength {
		return invalid("invalid_name", field, "name must be 1 to 200 characters")
	}
	for _, r := range name {
		switch {
		case unicode.IsControl(r):
			return invalid("invalid_name", field, "name must not contain control characters")
		case r == utf8.RuneError:
			// Sent as such: bytes that are not UTF-8 never get this far.
			return invalid("invalid_name", field, "name must not contain U+FFFD, the replacement character")
		case hiddenInName(r):
			return invalid("invalid_name", field, "name must not contain invisible or bidirectional formatting characters")
		}
	}
	return nil
}

// hiddenInName reports whether r is a character a name may not hold
// although it is no control character: a format character (category Cf:
// bidirectional overrides and isolates, which can make a name read as
// another in the dashboard, the CLI or a log viewer; zero-width spaces,
// the soft hyphen, tag characters, which hide text), or a line or
// paragraph separator. The zero-width joiner and non-joiner stay allowed:
// emoji sequences and several scripts need them.
func hiddenInName(r rune) bool {
	if r == '\u200c' || r == '\u200d' {
		return false
	}
	return unicode.Is(unicode.Cf, r) || unicode.Is(unicode.Zl, r) || unicode.Is(unicode.Zp, r)
}

func applyRetry(p *vibejobs.RetryPolicy, in *retryInput) *vibejobs.Error {
	if in.maxAttempts != nil {
		n := *in.maxAttempts
		if n < 1 || n > vibejobs.MaxMaxAttempts {
			return invalid("invalid_retry", "retry.maxAttempts", "retry.maxAttempts must be 1 to 4")
		}
		p.MaxAttempts = n
	}
	if in.minBackoff != nil {
		d, err := time.ParseDuration(*in.minBackoff)
		if err != nil || d < vibejobs.MinMinBackoff || d > vibejobs.MaxMinBackoff {
			return invalid("invalid_retry", "retry.minBackoff", "retry.minBackoff must be a duration from 1s to 1h, such as \"30s\"")
		}
		p.MinBackoff = d
	}
	if in.maxBackoff != nil {
		d, err := time.ParseDuration(*in.maxBackoff)
		if err != nil || d > vibejobs.MaxMaxBackoff || d < vibejobs.MinMinBackoff {
			return invalid("invalid_retry", "retry.maxBackoff", "retry.maxBackoff must be a duration from 1s to 24h, such as \"1h\"")
		}
		p.MaxBackoff = d
	}
	if p.MaxBackoff < p.MinBackoff {
		field := "retry.maxBackoff"
		if in.maxBackoff == nil {
			field = "retry.minBackoff"
		}
		return invalid("invalid_retry", field, "retry.maxBackoff must not be less than retry.minBackoff")
	}
	return nil
}

// scheduleErr turns a *schedule.Error into a field error; anything else gets
// the fallback code.
func scheduleErr(err error, field, fallback string) *vibejobs.Error {
	var se *schedule.Error
	if errors.As(err, &se) {
		if se.Field != "" {
			field = se.Field
		}
		return invalid(se.Code, field, se.Message)
	}
	return invalid(fallback, field, "the "+field+" is not valid")
}

// checkURL returns the URL to store: the egress policy's normal form, so the
// dispatcher and the check read the host alike. No message echoes the URL.
func (s *Server) checkURL(raw string) (string, *vibejobs.Error) {
	if len(raw) > vibejobs.MaxURLLength {
		return "", invalid("invalid_url", "url", "url is longer than 2048 characters")
	}
	v := s.urls
	if v == nil {
		v = defaultPolicy
	}
	u, err := v.ValidateURL(raw)
	if err != nil {
		code, msg := "invalid_url", "url is not a valid http(s) URL"
		var ue *egress.URLError
		if errors.As(err, &ue) {
			code, msg = ue.Code, ue.Message
			if raw != "" && strings.Contains(msg, raw) || u != nil && u.Host != "" && strings.Contains(msg, u.Host) {
				msg = "url is not allowed"
			}
		}
		return "", invalid(code, "url", msg)
	}
	return u.String(), nil
}

// defaultPolicy checks URLs when no egress policy is configured: the
// default block of private, loopback and link-local destinations applies.
var defaultPolicy URLValidator = mustDefaultPolicy()

func mustDefaultPolicy() URLValidator {
	p, err := egress.NewPolicy(nil)
	if err != nil {
		panic(err)
	}
	return p
}
