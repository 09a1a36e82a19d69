package scheduler_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/scheduler"
)

// TestNewOccurrenceWhileAnEarlierRunRetries: runs of one job are
// independent (SEMANTICS.md section 3): the next occurrence becomes a run
// on time while the run of the one before is still retrying.
func TestNewOccurrenceWhileAnEarlierRunRetries(t *testing.T) {
	ctx := context.Background()
	now := t0
	st := openStore(t, storedJob("job_x", vibejobs.CatchUpAll, now))
	sched := scheduler.New(scheduler.Config{Store: st, Now: func() time.Time { return now }})
	if n, err := sched.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("RunOnce at the first occurrence = %d, %v", n, err)
	}
	claims, err := st.ClaimDueRuns(ctx, "w", now, 10, 5*time.Second)
	if err != nil || len(claims) != 1 {
		t.Fatalf("ClaimDueRuns = %d, %v", len(claims), err)
	}
	retryAt := now.Add(10 * time.Minute)
	err = st.RecordOutcomes(ctx, "w", []vibejobs.Outcome{{RunID: claims[0].Run.ID, ClaimedAt: claims[0].ClaimedAt,
		Attempt: vibejobs.Attempt{Number: 1, StartedAt: now, FinishedAt: now, StatusCode: 503, ErrorCode: "http_5xx"},
		Step:    vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: &retryAt}}})
	if err != nil {
		t.Fatal(err)
	}

	now = now.Add(time.Minute - time.Second)
	if n, err := sched.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("RunOnce at the next occurrence = %d, %v", n, err)
	}
	runs, _, err := st.ListRuns(ctx, "prj_x", vibejobs.RunFilter{JobID: "job_x"}, vibejobs.Page{})
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[1].State != vibejobs.RunRetrying || runs[0].State != vibejobs.RunScheduled ||
		!runs[0].ScheduledFor.Equal(t0.Add(time.Minute)) {
		for _, r := range runs {
			t.Logf("run %s at %v: %s", r.ID, r.ScheduledFor, r.State)
		}
		t.Fatalf("want the retrying run and the next occurrence's, scheduled")
	}
}

// TestOccurrencesAroundDSTChangesThroughTheScheduler runs the scheduler as
// its loop does, pass after pass on a clock moving by its lookahead, across New York's
// changes of 2026, and checks the runs it creates against SEMANTICS.md
// section 4: a repeated hour fires at its first occurrence only, an
// occurrence inside the skipped hour fires once at the end of the gap, and
// no occurrence gets two runs.
func TestOccurrencesAroundDSTChangesThroughTheScheduler(t *testing.T) {
	cases := []struct {
		name, spec string
		from, to   time.Time
		want       []string
	}{
		{"fall back", "*/30 * * * *", utc("2026-11-01T04:50:00Z"), utc("2026-11-01T07:40:00Z"),
			// 01:00 and 01:30 EDT; their repeats at 01:00 and 01:30 EST do not
			// fire; then 02:00 and 02:30 EST.
			[]string{"2026-11-01T05:00:00Z", "2026-11-01T05:30:00Z", "2026-11-01T07:00:00Z", "2026-11-01T07:30:00Z"}},
		{"set in the second pass of the repeated hour", "*/30 * * * *", utc("2026-11-01T06:10:00Z"), utc("2026-11-01T07:40:00Z"),
			// Created or resumed at 01:10 EST: 01:30 fired as EDT already.
			[]string{"2026-11-01T07:00:00Z", "2026-11-01T07:30:00Z"}},
		{"spring forward", "30 2 * * *", utc("2026-03-08T06:50:00Z"), utc("2026-03-08T08:00:00Z"),
			// 02:30 does not exist on March 8: it fires at 03:00 EDT.
			[]string{"2026-03-08T07:00:00Z"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			now := c.from
			j := storedJob("job_x", vibejobs.CatchUpAll, now)
			j.Schedule, j.Timezone = c.spec, "America/New_York"
			sch, err := scheduler.JobSchedule(j)
			if err != nil {
				t.Fatal(err)
			}
			first := sch.Next(now).UTC() // as the API sets it (see api.plan)
			j.NextRunAt = &first
			st := openStore(t, j)
			sched := scheduler.New(scheduler.Config{Store: st, Now: func() time.Time { return now }})
			for ; now.Before(c.to); now = now.Add(scheduler.DefaultLookahead) {
				if _, err := sched.RunOnce(ctx); err != nil {
					t.Fatal(err)
				}
			}
			runs, _, err := st.ListRuns(ctx, "prj_x", vibejobs.RunFilter{}, vibejobs.Page{Limit: 100})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range slices.Backward(runs) {
				got = append(got, r.ScheduledFor.UTC().Format(time.RFC3339))
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("runs at %v, want %v", got, c.want)
			}
		})
	}
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}
