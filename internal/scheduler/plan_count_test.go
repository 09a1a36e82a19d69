package scheduler_test

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/schedule"
	"github.com/vibejobs/vibejobs/internal/scheduler"
)

// walkPlan is the reference for Plan's catch-up arithmetic: it walks every
// occurrence from j.NextRunAt (walkOccurrences) and applies j's catch-up
// rule (applyCatchUp). It returns the times of the runs and the number
// skipped.
func walkPlan(j *vibejobs.Job, sch schedule.Schedule, now time.Time, lookahead, grace time.Duration) ([]time.Time, int64) {
	return applyCatchUp(j.CatchUp, walkOccurrences(*j.NextRunAt, sch, now, lookahead, grace))
}

// occurrences are a job's occurrences sorted by walkOccurrences.
type occurrences struct {
	expired          int64
	missed, upcoming []time.Time
}

// walkOccurrences walks every occurrence from from, one Next at a time,
// and sorts each into expired (before now − 96 h), missed (before now −
// grace) or upcoming (up to now + lookahead).
func walkOccurrences(from time.Time, sch schedule.Schedule, now time.Time, lookahead, grace time.Duration) occurrences {
	var o occurrences
	for t := from; !t.IsZero() && !t.After(now.Add(lookahead)); t = sch.Next(t) {
		switch {
		case t.Before(now.Add(-vibejobs.DeliveryLifetime)):
			o.expired++
		case t.Before(now.Add(-grace)):
			o.missed = append(o.missed, t)
		default:
			o.upcoming = append(o.upcoming, t)
		}
	}
	return o
}

// applyCatchUp keeps, of o's missed occurrences, the newest
// MaxCatchUpRuns under catchUp all, the newest under latest, none under
// none. It returns the runs' times (UTC, in milliseconds) and the number
// skipped: the expired and the missed not kept.
func applyCatchUp(catchUp vibejobs.CatchUp, o occurrences) ([]time.Time, int64) {
	keep := min(len(o.missed), vibejobs.MaxCatchUpRuns)
	switch catchUp {
	case vibejobs.CatchUpLatest:
		keep = min(keep, 1)
	case vibejobs.CatchUpNone:
		keep = 0
	}
	var runs []time.Time
	for _, t := range slices.Concat(o.missed[len(o.missed)-keep:], o.upcoming) {
		runs = append(runs, t.UTC().Truncate(time.Millisecond))
	}
	return runs, o.expired + int64(len(o.missed)-keep)
}

// TestPlanLifetimeEdgeCountedOnce: an occurrence exactly 96 h before now
// is still inside its delivery lifetime (its deadline is now), so it is a
// missed occurrence, not a skipped one; the occurrence just before it is
// skipped (with at most 96 missed, the edge is the oldest run). Every
// occurrence from NextRunAt to now + lookahead is either a run or skipped,
// none twice and none lost.
func TestPlanLifetimeEdgeCountedOnce(t *testing.T) {
	const lookahead, grace = 2 * time.Second, 5 * time.Second
	now := t0 // 12:00:00Z, on the hour, the minute and the second
	edge := now.Add(-vibejobs.DeliveryLifetime)
	cases := []struct {
		spec, tz string
		from     time.Time
		anchor   time.Time
		period   time.Duration
	}{
		{"0 * * * *", "UTC", now.Add(-200 * time.Hour), time.Time{}, time.Hour},
		{"0 0,30 * * * *", "Asia/Kathmandu", now.Add(-200*time.Hour + 15*time.Minute), time.Time{}, 30 * time.Minute}, // +05:45: fires at :15Z and :45Z
		{"0 */15 * * * *", "Asia/Kathmandu", now.Add(-200 * time.Hour), time.Time{}, 15 * time.Minute},
		{"0 0,30 * * * *", "Pacific/Chatham", now.Add(-200*time.Hour + 15*time.Minute), time.Time{}, 30 * time.Minute}, // +13:45
		{"* * * * * *", "UTC", now.Add(-100 * time.Hour), time.Time{}, time.Second},
		{"@every 1h", "UTC", now.Add(-300 * time.Hour), now.Add(-301 * time.Hour), time.Hour},
		{"@every 1h", "UTC", edge, edge.Add(-time.Hour), time.Hour}, // NextRunAt is the edge itself
		{"@every 1h", "UTC", edge.Add(-time.Hour), edge.Add(-2 * time.Hour), time.Hour},
		{"@every 1500ms", "UTC", now.Add(-97 * time.Hour), now.Add(-97*time.Hour - 1500*time.Millisecond), 1500 * time.Millisecond},
	}
	for _, c := range cases {
		for _, catchUp := range []vibejobs.CatchUp{vibejobs.CatchUpAll, vibejobs.CatchUpLatest, vibejobs.CatchUpNone} {
			from := c.from
			j := &vibejobs.Job{ID: "job_x", ProjectID: "prj_x", Schedule: c.spec, Timezone: c.tz, CatchUp: catchUp,
				NextRunAt: &from, ScheduleAnchor: c.anchor, Enabled: true, State: vibejobs.JobActive}
			sch := mustSchedule(t, j)
			p := scheduler.Plan(j, sch, now, lookahead, grace, ids())
			// The edge is a fire time of every case in UTC.
			if !sch.Next(edge.Add(-time.Nanosecond)).Equal(edge) && c.tz == "UTC" {
				t.Fatalf("%s: the edge %v is not a fire time: %v", c.spec, edge, sch.Next(edge.Add(-time.Nanosecond)))
			}
			total := int64(now.Add(lookahead).Sub(from)/c.period) + 1
			if got := int64(len(p.Runs)) + p.Skipped; got != total {
				t.Errorf("%s in %s, catch-up %s, from %v: %d runs + %d skipped = %d, want every one of %d occurrences once",
					c.spec, c.tz, catchUp, from, len(p.Runs), p.Skipped, got, total)
			}
			wantRuns, wantSkipped := walkPlan(j, sch, now, lookahead, grace)
			if !slices.EqualFunc(times(p), wantRuns, time.Time.Equal) || p.Skipped != wantSkipped {
				t.Errorf("%s in %s, catch-up %s, from %v: runs %d skipped %d, walking gives %d and %d",
					c.spec, c.tz, catchUp, from, len(p.Runs), p.Skipped, len(wantRuns), wantSkipped)
			}
			if catchUp == vibejobs.CatchUpAll && c.period >= time.Hour && from.Compare(edge) <= 0 && (len(p.Runs) == 0 || !p.Runs[0].ScheduledFor.Equal(edge)) {
				t.Errorf("%s in %s from %v: the occurrence at the lifetime's edge is not the oldest run (runs from %v)", c.spec, c.tz, from, times(p)[:1])
			}
		}
	}
}

// TestPlanMatchesWalk compares Plan, which counts the occurrences past the
// lifetime with Schedule.Count, with walking them, over random downtimes
// of schedules of every kind in zones with DST changes, 30- and 45-minute
// offsets, negative DST and a skipped day.
func TestPlanMatchesWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	specs := []string{"*/7 * * * *", "0 * * * *", "30 2 * * *", "0 0 * * *", "15,45 0-2 * * *", "0 0 1,15 * 3",
		"*/13 */11 0-3 * * *", "@every 97s", "@every 1h1m1s", "@every 4h59m59.999s", "@hourly", "@weekly"}
	zones := []string{"UTC", "Europe/Paris", "America/New_York", "America/Santiago", "Australia/Lord_Howe",
		"Asia/Kathmandu", "Pacific/Chatham", "Europe/Dublin", "Pacific/Apia", "America/Havana", "Asia/Tehran"}
	base := time.Date(2011, 12, 20, 0, 0, 0, 0, time.UTC)
	n := 300
	if testing.Short() {
		n = 60
	}
	for range n {
		spec, tz := specs[rng.IntN(len(specs))], zones[rng.IntN(len(zones))]
		now := base.Add(time.Duration(rng.Int64N(int64(16 * 365 * 24 * time.Hour)))).Truncate(time.Millisecond)
		down := time.Duration(rng.Int64N(int64(20 * 24 * time.Hour)))
		anchor := now.Add(-down - time.Duration(rng.Int64N(int64(time.Hour)))).Truncate(time.Millisecond)
		j := &vibejobs.Job{ID: "job_x", ProjectID: "prj_x", Schedule: spec, Timezone: tz, CatchUp: vibejobs.CatchUp([]string{"all", "latest", "none"}[rng.IntN(3)]),
			ScheduleAnchor: anchor, Enabled: true, State: vibejobs.JobActive}
		sch := mustSchedule(t, j)
		from := sch.Next(now.Add(-down))
		j.NextRunAt = &from
		p := scheduler.Plan(j, sch, now, 2*time.Second, 5*time.Second, ids())
		wantRuns, wantSkipped := walkPlan(j, sch, now, 2*time.Second, 5*time.Second)
		if !slices.EqualFunc(times(p), wantRuns, time.Time.Equal) || p.Skipped != wantSkipped {
			t.Errorf("%q in %s, now %v, from %v: %d runs, %d skipped; walking gives %d and %d",
				spec, tz, now, from, len(p.Runs), p.Skipped, len(wantRuns), wantSkipped)
		}
	}
}
