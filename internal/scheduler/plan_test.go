package scheduler_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/schedule"
	"github.com/vibejobs/vibejobs/internal/scheduler"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func everyMinuteJob(catchUp vibejobs.CatchUp, next time.Time) *vibejobs.Job {
	return &vibejobs.Job{ID: "job_x", ProjectID: "prj_x", Schedule: "* * * * *", Timezone: "UTC", CatchUp: catchUp, NextRunAt: &next, Enabled: true, State: vibejobs.JobActive}
}

func mustSchedule(t *testing.T, j *vibejobs.Job) schedule.Schedule {
	t.Helper()
	s, err := scheduler.JobSchedule(j)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ids() func(time.Time) string {
	n := 0
	return func(time.Time) string { n++; return fmt.Sprintf("run_%d", n) }
}

func times(p vibejobs.RunPlan) []time.Time {
	var out []time.Time
	for _, r := range p.Runs {
		out = append(out, r.ScheduledFor)
	}
	return out
}

func TestPlanOnTimeMaterialisesAhead(t *testing.T) {
	j := everyMinuteJob(vibejobs.CatchUpAll, t0.Add(time.Minute))
	// 1.5 s before the occurrence with a 2 s lookahead: the run exists ahead.
	p := scheduler.Plan(j, mustSchedule(t, j), t0.Add(time.Minute-1500*time.Millisecond), 2*time.Second, 5*time.Second, ids())
	if len(p.Runs) != 1 || !p.Runs[0].ScheduledFor.Equal(t0.Add(time.Minute)) || p.Skipped != 0 {
		t.Fatalf("plan %v skipped %d", times(p), p.Skipped)
	}
	r := p.Runs[0]
	if r.State != vibejobs.RunScheduled || r.Trigger != "schedule" || !r.DeadlineAt.Equal(r.ScheduledFor.Add(96*time.Hour)) || !r.NextAttemptAt.Equal(r.ScheduledFor) {
		t.Fatalf("run %+v", r)
	}
	if !p.Next.Equal(t0.Add(2*time.Minute)) || !p.From.Equal(t0.Add(time.Minute)) {
		t.Fatalf("next %v from %v", p.Next, p.From)
	}
	// 3 s before: nothing yet.
	p = scheduler.Plan(j, mustSchedule(t, j), t0.Add(time.Minute-3*time.Second), 2*time.Second, 5*time.Second, ids())
	if len(p.Runs) != 0 || !p.Next.Equal(t0.Add(time.Minute)) {
		t.Fatalf("early plan %v next %v", times(p), p.Next)
	}
}

func TestPlanCatchUp(t *testing.T) {
	// The platform was down for 10 minutes: occurrences at t0+1m … t0+10m
	// were missed; t0+11m is upcoming within the lookahead.
	now := t0.Add(11*time.Minute - time.Second)
	cases := []struct {
		catchUp     vibejobs.CatchUp
		wantRuns    []time.Duration
		wantSkipped int64
	}{
		{vibejobs.CatchUpAll, []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 0},
		{vibejobs.CatchUpLatest, []time.Duration{10, 11}, 9},
		{vibejobs.CatchUpNone, []time.Duration{11}, 10},
	}
	for _, c := range cases {
		j := everyMinuteJob(c.catchUp, t0.Add(time.Minute))
		p := scheduler.Plan(j, mustSchedule(t, j), now, 2*time.Second, 5*time.Second, ids())
		got := times(p)
		if len(got) != len(c.wantRuns) || p.Skipped != c.wantSkipped {
			t.Fatalf("%s: runs %v skipped %d", c.catchUp, got, p.Skipped)
		}
		for i, m := range c.wantRuns {
			if !got[i].Equal(t0.Add(m * time.Minute)) {
				t.Fatalf("%s: run %d at %v, want t0+%dm", c.catchUp, i, got[i], m)
			}
		}
	}
}

func TestPlanCatchUpCapAndLifetime(t *testing.T) {
	// Down for 100 h on an every-minute schedule: 6,000 occurrences, of which
	// those older than 96 h are never run and only the newest 100 of the rest are.
	now := t0.Add(100 * time.Hour)
	j := everyMinuteJob(vibejobs.CatchUpAll, t0.Add(time.Minute))
	p := scheduler.Plan(j, mustSchedule(t, j), now, 2*time.Second, 5*time.Second, ids())
	got := times(p)
	// The occurrence at now is within the grace: on time. The missed ones are
	// the 5,999 before it; 239 are older than 96 h; the newest 100 run.
	if len(got) != 101 {
		t.Fatalf("runs %d, want 101", len(got))
	}
	if !got[len(got)-1].Equal(now) || !got[0].Equal(now.Add(-100*time.Minute)) {
		t.Fatalf("first %v last %v", got[0], got[len(got)-1])
	}
	total := int64(100 * 60) // occurrences t0+1m … t0+100h
	if p.Skipped != total-101 {
		t.Fatalf("skipped %d, want %d", p.Skipped, total-101)
	}
	for i := 1; i < len(got); i++ {
		if !got[i].After(got[i-1]) {
			t.Fatal("caught-up runs not in scheduledFor order")
		}
	}
	// Everything older than 96 h, with latest: only the newest missed one.
	j = everyMinuteJob(vibejobs.CatchUpLatest, t0.Add(time.Minute))
	p = scheduler.Plan(j, mustSchedule(t, j), now, 2*time.Second, 5*time.Second, ids())
	if len(p.Runs) != 2 || p.Skipped != total-2 {
		t.Fatalf("latest: runs %v skipped %d", times(p), p.Skipped)
	}
	// A one-off job missed by more than 96 h is skipped and completes.
	at := t0
	one := &vibejobs.Job{ID: "job_o", At: &at, NextRunAt: &at, CatchUp: vibejobs.CatchUpAll}
	p = scheduler.Plan(one, mustSchedule(t, one), t0.Add(97*time.Hour), 2*time.Second, 5*time.Second, ids())
	if len(p.Runs) != 0 || p.Skipped != 1 || !p.Complete || p.Next != nil {
		t.Fatalf("expired one-off: %+v", p)
	}
	// Missed by one hour, it runs once and completes.
	p = scheduler.Plan(one, mustSchedule(t, one), t0.Add(time.Hour), 2*time.Second, 5*time.Second, ids())
	if len(p.Runs) != 1 || !p.Complete || p.Next != nil {
		t.Fatalf("one-off: %+v", p)
	}
}

// TestPlanCountsEverySkippedOccurrenceOfLongDowntime: every skipped
// occurrence is counted on the job, however long the platform was down. A
// plan used to walk 2 million occurrences at most and jump to the 96 h
// lifetime without counting the rest: a per-second schedule down for more
// than 27 days (23 days of occurrences, then the 96 h) lost some.
func TestPlanCountsEverySkippedOccurrenceOfLongDowntime(t *testing.T) {
	const lookahead, grace = 2 * time.Second, 5 * time.Second
	for _, spec := range []string{"* * * * * *", "@every 1s", "*/2 * * * * *"} {
		for _, down := range []time.Duration{20 * 24 * time.Hour, 25 * 24 * time.Hour, 40 * 24 * time.Hour, 60 * 24 * time.Hour} {
			now := t0
			from := now.Add(-down)
			j := &vibejobs.Job{ID: "job_x", ProjectID: "prj_x", Schedule: spec, Timezone: "UTC", CatchUp: vibejobs.CatchUpNone,
				NextRunAt: &from, ScheduleAnchor: from.Add(-time.Second), Enabled: true, State: vibejobs.JobActive}
			if spec == "@every 1s" {
				j.Timezone = "Europe/Paris" // ignored: absolute time, across the change of October 25
			}
			p := scheduler.Plan(j, mustSchedule(t, j), now, lookahead, grace, ids())
			period := time.Second
			if spec == "*/2 * * * * *" {
				period = 2 * time.Second
			}
			// Occurrences from, from+period, …, now+lookahead: those from
			// now−grace on run, every one before is skipped.
			total := int64((down+lookahead)/period) + 1
			runs := int64((grace+lookahead)/period) + 1
			if int64(len(p.Runs)) != runs || p.Skipped != total-runs {
				t.Errorf("%s down for %v: %d runs, %d skipped; want %d and %d", spec, down, len(p.Runs), p.Skipped, runs, total-runs)
			}
		}
	}
}

// TestPlanCatchUpMatchesAWalk: Plan, which counts the older missed
// occurrences instead of walking them, plans the runs and counts the skipped
// occurrences that walking every occurrence with Next gives, for dense and
// sparse schedules, across DST changes, and for downtimes on either side of
// the catch-up cap and of the delivery lifetime.
func TestPlanCatchUpMatchesAWalk(t *testing.T) {
	specs := []string{"* * * * * *", "@every 1s", "@every 1290ms", "@every 2570ms", "*/7 * * * * *", "* * * * *", "*/3 2 * * *", "0 * * * *", "0 0 * * *", "0,30 * 0-3 * * *"}
	nows := []time.Time{
		t0, // UTC noon; Paris away from any change
		time.Date(2026, 10, 25, 3, 17, 41, 5e8, time.UTC),   // Paris went back at 01:00 UTC
		time.Date(2026, 4, 5, 16, 2, 0, 0, time.UTC),        // Lord Howe, the half hour repeated at 15:00 UTC
		time.Date(2026, 10, 4, 15, 59, 59, 999e6, time.UTC), // Lord Howe, the half hour skipped at 15:30 UTC
	}
	for _, tz := range []string{"UTC", "Europe/Paris", "Australia/Lord_Howe"} {
		for _, spec := range specs {
			for _, now := range nows {
				for _, down := range []time.Duration{3 * time.Second, 90 * time.Second, 101 * time.Second, 3 * time.Hour} {
					checkPlanAgainstWalk(t, spec, tz, now, down)
				}
			}
		}
	}
	// Dense schedules down for most of the lifetime, and past it, with the
	// change of October 25 inside.
	for _, spec := range []string{"* * * * * *", "@every 1s"} {
		for _, down := range []time.Duration{95 * time.Hour, 100 * time.Hour} {
			checkPlanAgainstWalk(t, spec, "Europe/Paris", time.Date(2026, 10, 27, 0, 0, 0, 0, time.UTC), down)
		}
	}
}

// checkPlanAgainstWalk compares Plan, for a job down since now − down, with
// the runs and skipped count that walking its occurrences gives, under each
// catch-up rule.
func checkPlanAgainstWalk(t *testing.T, spec, tz string, now time.Time, down time.Duration) {
	t.Helper()
	const lookahead, grace = 2 * time.Second, 5 * time.Second
	j := &vibejobs.Job{ID: "job_x", ProjectID: "prj_x", Schedule: spec, Timezone: tz,
		ScheduleAnchor: now.Add(-200 * time.Hour).Add(-300 * time.Millisecond), Enabled: true, State: vibejobs.JobActive}
	sch := mustSchedule(t, j)
	from := sch.Next(now.Add(-down))
	j.NextRunAt = &from

	// The walk: every occurrence up to the horizon, once for the three rules.
	o := walkOccurrences(from, sch, now, lookahead, grace)
	for _, catchUp := range []vibejobs.CatchUp{vibejobs.CatchUpAll, vibejobs.CatchUpLatest, vibejobs.CatchUpNone} {
		j.CatchUp = catchUp
		p := scheduler.Plan(j, sch, now, lookahead, grace, ids())
		want, skipped := applyCatchUp(catchUp, o)
		got := times(p)
		if !slices.EqualFunc(got, want, time.Time.Equal) || p.Skipped != skipped {
			t.Errorf("%q in %s, %s at %s after %v down: %d runs (%v…), %d skipped; walking gives %d runs (%v…), %d skipped",
				spec, tz, catchUp, now.Format(time.RFC3339Nano), down, len(got), head(got), p.Skipped, len(want), head(want), skipped)
		}
	}
}

func head(ts []time.Time) []time.Time { return ts[:min(len(ts), 2)] }

// BenchmarkPlanAfterLongOutage plans a job down for 95 h: 342,000 missed
// occurrences of a per-second schedule, of which the newest 100 run.
func BenchmarkPlanAfterLongOutage(b *testing.B) {
	for _, spec := range []string{"* * * * * *", "@every 1s", "* * * * *"} {
		b.Run(spec, func(b *testing.B) {
			from := t0.Add(-95 * time.Hour)
			j := &vibejobs.Job{ID: "job_x", ProjectID: "prj_x", Schedule: spec, Timezone: "Europe/Paris", CatchUp: vibejobs.CatchUpAll,
				NextRunAt: &from, ScheduleAnchor: from.Add(-time.Second), Enabled: true, State: vibejobs.JobActive}
			sch, err := scheduler.JobSchedule(j)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				scheduler.Plan(j, sch, t0, 2*time.Second, 5*time.Second, ids())
			}
		})
	}
}

// TestUnplanned counts the occurrences due by now that a job's NextRunAt
// has not passed yet: the ones a change moving it on skips.
func TestUnplanned(t *testing.T) {
	for _, c := range []struct {
		what string
		job  *vibejobs.Job
		now  time.Time
		want int64
	}{
		{"on time", everyMinuteJob(vibejobs.CatchUpAll, t0.Add(time.Minute)), t0, 0},
		{"just before", everyMinuteJob(vibejobs.CatchUpAll, t0.Add(time.Minute)), t0.Add(time.Minute - time.Millisecond), 0},
		{"at its instant", everyMinuteJob(vibejobs.CatchUpAll, t0.Add(time.Minute)), t0.Add(time.Minute), 1},
		{"behind", everyMinuteJob(vibejobs.CatchUpAll, t0.Add(time.Minute)), t0.Add(10*time.Minute + 30*time.Second), 10},
		{"a week behind", everyMinuteJob(vibejobs.CatchUpNone, t0), t0.Add(7 * 24 * time.Hour), 7*24*60 + 1},
		{"paused", &vibejobs.Job{Schedule: "* * * * *", Timezone: "UTC"}, t0, 0},
		{"a one-off", &vibejobs.Job{At: &t0, NextRunAt: &t0}, t0.Add(time.Hour), 1},
		{"a schedule that does not parse here", &vibejobs.Job{Schedule: "* * * * *", Timezone: "Nowhere/Gone", NextRunAt: &t0},
			t0.Add(time.Hour), 1},
	} {
		if got := scheduler.Unplanned(c.job, c.now); got != c.want {
			t.Errorf("%s: Unplanned = %d, want %d", c.what, got, c.want)
		}
	}
}
