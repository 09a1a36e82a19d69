package scheduler_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/scheduler"
	"github.com/vibejobs/vibejobs/internal/sqlite"
)

// racingStore runs other, once, between reading the due jobs and applying
// their plans: another replica's scheduler pass in between.
type racingStore struct {
	vibejobs.SchedulerStore
	other func()
}

func (s *racingStore) DueJobs(ctx context.Context, before time.Time, after vibejobs.DuePosition, limit int) ([]*vibejobs.Job, error) {
	jobs, err := s.SchedulerStore.DueJobs(ctx, before, after, limit)
	if s.other != nil {
		s.other()
		s.other = nil
	}
	return jobs, err
}

// openStore opens a SQLite store in a temporary directory holding project
// prj_x and jobs, created as they are (a schedule no replica could plan
// included: the store does not parse schedules).
func openStore(t *testing.T, jobs ...*vibejobs.Job) *sqlite.Store {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"), sqlite.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	err = st.Update(ctx, func(tx vibejobs.Tx) error {
		if err := tx.CreateProject(ctx, &vibejobs.Project{ID: "prj_x", Name: "x", CreatedAt: t0.Add(-time.Hour)}); err != nil {
			return err
		}
		for _, j := range jobs {
			if err := tx.CreateJob(ctx, j); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// storedJob returns an every-minute job of prj_x in UTC, due at next, with
// everything a store needs set.
func storedJob(id string, catchUp vibejobs.CatchUp, next time.Time) *vibejobs.Job {
	return &vibejobs.Job{ID: id, ProjectID: "prj_x", Name: "x", Schedule: "* * * * *", Timezone: "UTC",
		URL: "https://example.test/", Enabled: true, State: vibejobs.JobActive, Retry: vibejobs.DefaultRetryPolicy(),
		Timeout: 10 * time.Second, CatchUp: catchUp, ScheduleAnchor: t0.Add(-time.Hour), NextRunAt: &next,
		Secret: vibejobs.SealedSecret{KeyID: "k", Ciphertext: []byte{1}}, CreatedAt: t0.Add(-time.Hour), UpdatedAt: t0.Add(-time.Hour)}
}

// TestSkippedCountedOnceAcrossReplicas: two replicas plan the same missed
// occurrences; one applies its plan, the other's is stale. The skipped
// occurrences are counted once, on the job and in the metric.
func TestSkippedCountedOnceAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	now := t0
	st := openStore(t, storedJob("job_x", vibejobs.CatchUpNone, now.Add(-10*time.Minute))) // down for ten minutes
	var metric int64
	config := func(s vibejobs.SchedulerStore) scheduler.Config {
		return scheduler.Config{Store: s, Now: func() time.Time { return now }, OnSkipped: func(n int64) { metric += n }}
	}
	b := scheduler.New(config(st))
	a := scheduler.New(config(&racingStore{SchedulerStore: st, other: func() {
		if _, err := b.RunOnce(ctx); err != nil {
			t.Error(err)
		}
	}}))
	if _, err := a.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := st.GetJob(ctx, "prj_x", "job_x")
	if err != nil {
		t.Fatal(err)
	}
	if got.SkippedRuns != 10 || metric != 10 {
		t.Fatalf("skipped occurrences: %d on the job, %d in the metric; want 10 and 10", got.SkippedRuns, metric)
	}
}

// unknownZoneJobs returns n jobs due at next in a time zone no tzdata has.
func unknownZoneJobs(n int, next time.Time) []*vibejobs.Job {
	jobs := make([]*vibejobs.Job, n)
	for i := range jobs {
		jobs[i] = storedJob(fmt.Sprintf("job_unknown_zone_%d", i), vibejobs.CatchUpAll, next)
		jobs[i].Timezone = "Nowhere/Atlantis"
	}
	return jobs
}

// boundedStore fails DueJobs after max calls: a scan that lists the same
// batch again and again never ends.
type boundedStore struct {
	vibejobs.SchedulerStore
	calls, max int
}

func (s *boundedStore) DueJobs(ctx context.Context, before time.Time, after vibejobs.DuePosition, limit int) ([]*vibejobs.Job, error) {
	if s.calls++; s.calls > s.max {
		return nil, fmt.Errorf("DueJobs called %d times in one scan", s.calls)
	}
	return s.SchedulerStore.DueJobs(ctx, before, after, limit)
}

// TestUnplannableJobsDoNotHideOthers: jobs whose time zone this replica
// does not know keep their NextRunAt, for a replica that knows it, and so
// stay first in due order. More of them than a batch holds must not keep
// the scheduler from a job due behind them.
func TestUnplannableJobsDoNotHideOthers(t *testing.T) {
	ctx := context.Background()
	now := t0
	jobs := append(unknownZoneJobs(4, now.Add(-time.Hour)), storedJob("job_ok", vibejobs.CatchUpAll, now))
	st := openStore(t, jobs...)
	sched := scheduler.New(scheduler.Config{Store: &boundedStore{SchedulerStore: st, max: 10}, Now: func() time.Time { return now },
		BatchSize: 3, Logger: slog.New(slog.DiscardHandler)})
	for range 2 {
		if n, err := sched.RunOnce(ctx); err != nil {
			t.Fatalf("RunOnce = %d, %v", n, err)
		}
	}

	runs, _, err := st.ListRuns(ctx, "prj_x", vibejobs.RunFilter{}, vibejobs.Page{})
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || runs[0].JobID != "job_ok" || !runs[0].ScheduledFor.Equal(now) {
		t.Fatalf("runs %+v; want job_ok's at %v alone", runs, now)
	}
	for _, want := range jobs[:4] {
		got, err := st.GetJob(ctx, "prj_x", want.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.NextRunAt == nil || !got.NextRunAt.Equal(*want.NextRunAt) || got.SkippedRuns != 0 || got.State != vibejobs.JobActive {
			t.Errorf("job %s with an unknown zone: next %v, skipped %d, %s; want it untouched", got.ID, got.NextRunAt, got.SkippedRuns, got.State)
		}
	}
}

// TestUnplannableJobsLoggedOnceInAWhile: every scan meets the jobs it cannot
// plan again. Each scan counts them (a gauge); each job is logged when
// first met and then once per ten minutes, not on every scan.
func TestUnplannableJobsLoggedOnceInAWhile(t *testing.T) {
	ctx := context.Background()
	now := t0
	st := openStore(t, unknownZoneJobs(4, now.Add(-time.Hour))...)
	var logs bytes.Buffer
	gauge := -1
	sched := scheduler.New(scheduler.Config{Store: st, Now: func() time.Time { return now }, BatchSize: 3,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), OnUnplannable: func(n int) { gauge = n }})
	scan := func(wantLogged int) {
		t.Helper()
		gauge = -1
		if _, err := sched.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(logs.String(), "scheduler.bad_schedule"); got != wantLogged || gauge != 4 {
			t.Fatalf("at %v: %d unplannable jobs logged in all, %d counted by the scan; want %d and 4", now, got, gauge, wantLogged)
		}
	}
	scan(4)
	now = now.Add(time.Minute)
	scan(4)
	now = now.Add(9*time.Minute - time.Millisecond)
	scan(4)
	now = now.Add(time.Millisecond)
	scan(8)
}

// failingStore fails DueJobs, as a database that refuses the scheduler's
// statements does, while fail is set.
type failingStore struct {
	vibejobs.SchedulerStore
	fail bool
}

func (s *failingStore) DueJobs(ctx context.Context, before time.Time, after vibejobs.DuePosition, limit int) ([]*vibejobs.Job, error) {
	if s.fail {
		return nil, vibejobs.Errorf(vibejobs.EUNAVAILABLE, "database_unavailable", "database unavailable")
	}
	return s.SchedulerStore.DueJobs(ctx, before, after, limit)
}

// TestFailingSince: the scheduler tells, for readiness, since when every
// pass has failed against the store: from the first failure of the
// current streak, until a pass succeeds. A pass that finds nothing due
// succeeds (an idle scheduler is not stalled), and one cut short by a
// shutdown counts as neither.
func TestFailingSince(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	fs := &failingStore{SchedulerStore: st}
	s := scheduler.New(scheduler.Config{Store: fs, Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return now }})
	want := func(since time.Time, what string) {
		t.Helper()
		if got := s.FailingSince(); !got.Equal(since) {
			t.Fatalf("%s: FailingSince = %v, want %v", what, got, since)
		}
	}
	want(time.Time{}, "before the first pass")
	fs.fail = true
	if _, err := s.RunOnce(ctx); err == nil {
		t.Fatal("a pass against the failing store: no error")
	}
	first := now
	want(first, "after a failed pass")
	now = now.Add(time.Minute)
	if _, err := s.RunOnce(ctx); err == nil {
		t.Fatal("a pass against the failing store: no error")
	}
	want(first, "after a second failed pass")
	fs.fail = false
	if _, err := s.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	want(time.Time{}, "after a pass that found nothing due")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.RunOnce(cancelled); err == nil {
		t.Fatal("a pass with its context ended: no error")
	}
	want(time.Time{}, "after a pass cut short by its context")
}

// refusingStore refuses every plan it is asked to apply, as a database
// that takes the scheduler's reads but not its writes does; a batch with
// nothing to apply succeeds.
type refusingStore struct{ vibejobs.SchedulerStore }

func (s refusingStore) ApplyRunPlans(ctx context.Context, plans []vibejobs.RunPlan, now time.Time) (int, int64, error) {
	if len(plans) > 0 {
		return 0, 0, vibejobs.Errorf(vibejobs.EUNAVAILABLE, "database_unavailable", "database unavailable")
	}
	return s.SchedulerStore.ApplyRunPlans(ctx, plans, now)
}

// TestFailingSinceCountsScans: a pass is a scan. One whose first batch
// succeeds and whose later one fails has failed, and does not end the
// streak: here a batch of jobs this replica cannot plan (nothing to apply)
// heads every scan, and the batch behind it fails every time. The streak
// began at the first scan, however many batches succeeded since.
func TestFailingSinceCountsScans(t *testing.T) {
	now := t0
	st := openStore(t, append(unknownZoneJobs(3, now.Add(-time.Hour)), storedJob("job_ok", vibejobs.CatchUpAll, now))...)
	s := scheduler.New(scheduler.Config{Store: refusingStore{st}, Now: func() time.Time { return now }, BatchSize: 3,
		Logger: slog.New(slog.DiscardHandler)})
	for range 2 {
		if _, err := s.RunOnce(context.Background()); err == nil {
			t.Fatal("a scan whose second batch the store refuses: no error")
		}
		if got := s.FailingSince(); !got.Equal(t0) {
			t.Fatalf("after failed scans until %v: FailingSince = %v, want the first failure %v", now, got, t0)
		}
		now = now.Add(time.Minute)
	}
}

// TestUnplannableJobsNotParsedOnEveryScan: a job whose schedule this
// replica cannot plan is remembered, not parsed again on every scan (a
// zone gone from tzdata costs a search of the zone files each time); it
// is tried again once its schedule or time zone changes, and once per ten
// minutes besides (the host's tzdata may be updated under the process).
func TestUnplannableJobsNotParsedOnEveryScan(t *testing.T) {
	ctx := context.Background()
	now := t0
	jobs := unknownZoneJobs(4, now.Add(-time.Hour))
	st := openStore(t, jobs...)
	gauge := -1
	sched := scheduler.New(scheduler.Config{Store: st, Now: func() time.Time { return now }, BatchSize: 3,
		Logger: slog.New(slog.DiscardHandler), OnUnplannable: func(n int) { gauge = n }})
	parsed := make(map[string]int)
	scheduler.ObserveJobSchedule(sched, func(j *vibejobs.Job) { parsed[j.ID]++ })
	scan := func(wantGauge int, want ...int) {
		t.Helper()
		gauge = -1
		if _, err := sched.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		for i, j := range jobs {
			if parsed[j.ID] != want[i] {
				t.Errorf("at %v: %s parsed %d times in all, want %d", now, j.ID, parsed[j.ID], want[i])
			}
		}
		if gauge != wantGauge {
			t.Errorf("at %v: %d unplannable jobs counted by the scan, want %d", now, gauge, wantGauge)
		}
	}
	scan(4, 1, 1, 1, 1)
	for range 3 {
		now = now.Add(time.Minute)
		scan(4, 1, 1, 1, 1)
	}

	// Job 0 moves to another zone this replica does not know, job 1 to one
	// it knows: each is parsed again, and job 1 is planned.
	edit := func(id, tz string) {
		t.Helper()
		err := st.Update(ctx, func(tx vibejobs.Tx) error {
			j, err := tx.GetJob(ctx, "prj_x", id)
			if err != nil {
				return err
			}
			j.Timezone, j.UpdatedAt = tz, now
			return tx.UpdateJob(ctx, j)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	edit(jobs[0].ID, "Nowhere/Lemuria")
	edit(jobs[1].ID, "UTC")
	now = now.Add(time.Minute)
	scan(3, 2, 2, 1, 1)
	if got, err := st.GetJob(ctx, "prj_x", jobs[1].ID); err != nil || got.NextRunAt == nil || !got.NextRunAt.After(now) {
		t.Fatalf("job moved to UTC: %+v, %v; want it planned", got, err)
	}
	now = now.Add(time.Minute) // job 1, plannable, is parsed at each of its occurrences
	scan(3, 2, 3, 1, 1)

	// Ten minutes after they were parsed, jobs 2 and 3 are tried again;
	// job 0, parsed again at 12:04, is not yet.
	now = t0.Add(10 * time.Minute)
	scan(3, 2, 4, 2, 2)
}

// TestUnplannableUnknownWhileScansFail: while scans fail against the store,
// the number of unplannable jobs is unknown (the jobs not listed may be
// unplannable, or fixed), and the scheduler says so after each failed
// scan rather than leave the count of the last good one standing; the
// next scan that succeeds counts again. A scan cut short by a shutdown
// says neither.
func TestUnplannableUnknownWhileScansFail(t *testing.T) {
	ctx := context.Background()
	now := t0
	fs := &failingStore{SchedulerStore: openStore(t, unknownZoneJobs(2, now.Add(-time.Hour))...)}
	var reports []string
	s := scheduler.New(scheduler.Config{Store: fs, Now: func() time.Time { return now }, Logger: slog.New(slog.DiscardHandler),
		OnUnplannable:        func(n int) { reports = append(reports, fmt.Sprint(n)) },
		OnUnplannableUnknown: func() { reports = append(reports, "unknown") }})
	scan := func(ctx context.Context, fail bool) {
		t.Helper()
		fs.fail = fail
		if _, err := s.RunOnce(ctx); (err != nil) != (fail || ctx.Err() != nil) {
			t.Fatalf("RunOnce with the store failing %v: %v", fail, err)
		}
		now = now.Add(time.Second)
	}
	scan(ctx, false)
	scan(ctx, true)
	scan(ctx, true)
	scan(ctx, false)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	scan(cancelled, false)
	if got, want := strings.Join(reports, " "), "2 unknown unknown 2"; got != want {
		t.Fatalf("reports after each scan: %q, want %q", got, want)
	}
}
