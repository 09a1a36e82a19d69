package storetest

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

func testCreateAndGetRun(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	r := f.run(j, T0.Add(123*time.Millisecond))
	got := f.getRun(projectA, r.ID)
	wantEqual(t, "GetRun of a new manual run", got, r)
	if got.Late || got.Attempt != 0 || got.FinishedAt != nil || len(got.Attempts) != 0 {
		t.Errorf("new run: late %v attempt %d finished %v attempts %d; want false 0 nil 0",
			got.Late, got.Attempt, got.FinishedAt, len(got.Attempts))
	}
	err := f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.CreateRun(f.ctx, r) })
	if err == nil {
		t.Errorf("CreateRun with a taken id succeeded")
	}
}

func testManualRunsNeverMerged(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	m1 := f.run(j, T0)
	m2 := f.run(j, T0)
	sched := vibejobs.NewRun(f.id("run_"), j, vibejobs.TriggerSchedule, T0, T0)
	created, _, err := f.s.ApplyRunPlans(f.ctx, []vibejobs.RunPlan{
		{JobID: j.ID, Anchor: j.ScheduleAnchor, From: T0, Next: ptr(T0.Add(time.Minute)), Runs: []*vibejobs.Run{sched}},
	}, T0)
	if err != nil || created != 1 {
		t.Fatalf("ApplyRunPlans of an occurrence that has manual runs = %d, %v; want 1", created, err)
	}
	m3 := f.run(j, T0)
	runs, _, err := f.s.ListRuns(f.ctx, projectA, vibejobs.RunFilter{JobID: j.ID}, vibejobs.Page{})
	if err != nil {
		t.Fatalf("ListRuns: %v", err)
	}
	if got, want := runIDs(runs), []string{m3.ID, sched.ID, m2.ID, m1.ID}; !slices.Equal(got, want) {
		t.Fatalf("runs at one instant: %v, want %v", got, want)
	}
	if got := f.getRun(projectA, sched.ID); got.Trigger != vibejobs.TriggerSchedule {
		t.Errorf("scheduled run: trigger %q", got.Trigger)
	}
}

func testListRuns(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	k := f.job(projectA)
	r1 := f.run(j, T0)
	r2 := f.retryingRun(j, T0.Add(time.Hour))
	r3 := f.finishedRun(j, T0.Add(-9*time.Hour))
	r4 := f.claimOne(j, "w1").Run
	r5 := f.run(k, T0)
	r6 := f.run(k, T0.Add(time.Minute))

	cases := []struct {
		filter vibejobs.RunFilter
		want   []*vibejobs.Run
	}{
		{vibejobs.RunFilter{}, []*vibejobs.Run{r6, r5, r4, r3, r2, r1}},
		{vibejobs.RunFilter{JobID: j.ID}, []*vibejobs.Run{r4, r3, r2, r1}},
		{vibejobs.RunFilter{State: vibejobs.RunScheduled}, []*vibejobs.Run{r6, r5, r1}},
		{vibejobs.RunFilter{JobID: k.ID, State: vibejobs.RunScheduled}, []*vibejobs.Run{r6, r5}},
		{vibejobs.RunFilter{State: vibejobs.RunRetrying}, []*vibejobs.Run{r2}},
		{vibejobs.RunFilter{State: vibejobs.RunSucceeded}, []*vibejobs.Run{r3}},
		{vibejobs.RunFilter{State: vibejobs.RunDelivering}, []*vibejobs.Run{r4}},
		{vibejobs.RunFilter{State: vibejobs.RunFailed}, nil},
		{vibejobs.RunFilter{JobID: "job_missing"}, nil},
	}
	for _, tc := range cases {
		for _, limit := range []int{0, 1, 2, 4} {
			var got []string
			cursor := ""
			for page := 0; ; page++ {
				runs, next, err := f.s.ListRuns(f.ctx, projectA, tc.filter, vibejobs.Page{Limit: limit, Cursor: cursor})
				if err != nil {
					t.Fatalf("ListRuns(%+v, limit %d): %v", tc.filter, limit, err)
				}
				if limit > 0 && len(runs) > limit {
					t.Fatalf("ListRuns(%+v, limit %d): %d runs", tc.filter, limit, len(runs))
				}
				for _, r := range runs {
					if r.Attempts != nil && len(r.Attempts) > 0 {
						t.Errorf("ListRuns returned attempts")
					}
				}
				got = append(got, runIDs(runs)...)
				if next == "" {
					break
				}
				if page > 10 {
					t.Fatal("ListRuns: cursors never end")
				}
				cursor = next
			}
			if want := runIDs(tc.want); !slices.Equal(got, want) {
				t.Errorf("ListRuns(%+v, limit %d) = %v, want %v (newest first)", tc.filter, limit, got, want)
			}
		}
	}

	// ListRuns returns the same fields as GetRun, without attempts.
	runs, _, err := f.s.ListRuns(f.ctx, projectA, vibejobs.RunFilter{State: vibejobs.RunSucceeded}, vibejobs.Page{})
	if err != nil || len(runs) != 1 {
		t.Fatalf("ListRuns succeeded: %d runs, %v", len(runs), err)
	}
	full := f.getRun(projectA, r3.ID)
	full.Attempts = nil
	wantEqual(t, "ListRuns entry", runs[0], full)
}

func testListRunsPaginationWhileChanging(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	var all []*vibejobs.Run
	for i := range 9 {
		all = append(all, f.run(j, T0.Add(time.Duration(i)*time.Second)))
	}
	seen := map[string]int{}
	runs, cursor, err := f.s.ListRuns(f.ctx, projectA, vibejobs.RunFilter{}, vibejobs.Page{Limit: 4})
	if err != nil {
		t.Fatalf("ListRuns: %v", err)
	}
	for _, r := range runs {
		seen[r.ID]++
	}
	// New runs arrive and others change state between pages.
	f.run(j, T0)
	f.run(j, T0)
	f.claim("w1", T0.Add(3*time.Second), 3)
	for cursor != "" {
		runs, cursor, err = f.s.ListRuns(f.ctx, projectA, vibejobs.RunFilter{}, vibejobs.Page{Limit: 4, Cursor: cursor})
		if err != nil {
			t.Fatalf("ListRuns: %v", err)
		}
		for _, r := range runs {
			seen[r.ID]++
		}
	}
	for _, r := range all {
		if seen[r.ID] != 1 {
			t.Errorf("run %s listed %d times, want once", r.ID, seen[r.ID])
		}
	}
}

func testDueJobs(t *testing.T, f *fixture) {
	f.projects()
	at := func(d time.Duration) func(*vibejobs.Job) {
		return func(j *vibejobs.Job) { j.NextRunAt = ptr(T0.Add(d)) }
	}
	due2 := f.job(projectA, at(-time.Minute))
	due1 := f.job(projectA, at(-2*time.Minute))
	dueB := f.job(projectB, at(-30*time.Second))
	dueEdge := f.job(projectA, at(0))
	f.job(projectA, at(time.Millisecond))
	f.job(projectA, at(-time.Hour), func(j *vibejobs.Job) { j.Enabled = false })
	f.job(projectA, at(-time.Hour), func(j *vibejobs.Job) { j.Enabled, j.State = false, vibejobs.JobPaused })
	f.job(projectA, at(-time.Hour), func(j *vibejobs.Job) { j.State = vibejobs.JobPaused })
	f.job(projectA, at(-time.Hour), func(j *vibejobs.Job) { j.State = vibejobs.JobCompleted })
	f.job(projectA, func(j *vibejobs.Job) { j.NextRunAt = nil })
	deleted := f.job(projectA, at(-time.Hour))
	f.update(func(tx vibejobs.Tx) error { return tx.DeleteJob(f.ctx, projectA, deleted.ID, T0) })

	jobs, err := f.s.DueJobs(f.ctx, T0, vibejobs.DuePosition{}, 10)
	if err != nil {
		t.Fatalf("DueJobs: %v", err)
	}
	if got, want := jobIDs(jobs), jobIDs([]*vibejobs.Job{due1, due2, dueB, dueEdge}); !slices.Equal(got, want) {
		t.Fatalf("DueJobs = %v, want %v (earliest first)", got, want)
	}
	wantEqual(t, "DueJobs job", jobs[0], due1)
	jobs, err = f.s.DueJobs(f.ctx, T0, vibejobs.DuePosition{}, 2)
	if err != nil || !slices.Equal(jobIDs(jobs), jobIDs([]*vibejobs.Job{due1, due2})) {
		t.Fatalf("DueJobs with limit 2 = %v, %v", jobIDs(jobs), err)
	}
	jobs, err = f.s.DueJobs(f.ctx, T0.Add(-3*time.Minute), vibejobs.DuePosition{}, 10)
	if err != nil || len(jobs) != 0 {
		t.Fatalf("DueJobs before any is due = %v, %v", jobIDs(jobs), err)
	}
}

// testDueJobsAfter: a list continues after any position in (NextRunAt, ID)
// order, whether or not a job holds it, so a scheduler can pass the due
// jobs it cannot plan (they stay due) and reach the ones behind them.
func testDueJobsAfter(t *testing.T, f *fixture) {
	f.projects()
	at := func(d time.Duration) func(*vibejobs.Job) {
		return func(j *vibejobs.Job) { j.NextRunAt = ptr(T0.Add(d)) }
	}
	// Three jobs due at one instant (ids in creation order), then two more.
	tie1 := f.job(projectA, at(-2*time.Minute))
	tie2 := f.job(projectB, at(-2*time.Minute))
	tie3 := f.job(projectA, at(-2*time.Minute))
	mid := f.job(projectA, at(-time.Minute))
	last := f.job(projectB, at(0))
	f.job(projectA, at(time.Millisecond))                                                     // not due
	f.job(projectA, at(-time.Minute), func(j *vibejobs.Job) { j.State = vibejobs.JobPaused }) // not active
	all := []*vibejobs.Job{tie1, tie2, tie3, mid, last}
	pos := func(j *vibejobs.Job) vibejobs.DuePosition {
		return vibejobs.DuePosition{NextRunAt: *j.NextRunAt, JobID: j.ID}
	}

	cases := []struct {
		name  string
		after vibejobs.DuePosition
		limit int
		want  []*vibejobs.Job
	}{
		{"the zero position", vibejobs.DuePosition{}, 10, all},
		{"the first of a tie", pos(tie1), 10, all[1:]},
		{"the last of a tie", pos(tie3), 10, all[3:]},
		{"the last of a tie, limited", pos(tie2), 2, []*vibejobs.Job{tie3, mid}},
		{"an instant with no id", vibejobs.DuePosition{NextRunAt: T0.Add(-time.Minute)}, 10, all[3:]},
		{"between two jobs", vibejobs.DuePosition{NextRunAt: T0.Add(-90 * time.Second), JobID: tie1.ID}, 10, all[3:]},
		{"the last due job", pos(last), 10, nil},
	}
	for _, c := range cases {
		jobs, err := f.s.DueJobs(f.ctx, T0, c.after, c.limit)
		if err != nil {
			t.Fatalf("DueJobs after %s: %v", c.name, err)
		}
		if got, want := jobIDs(jobs), jobIDs(c.want); !slices.Equal(got, want) {
			t.Errorf("DueJobs after %s = %v, want %v", c.name, got, want)
		}
	}

	// Continuing from the last job of each page lists every due job once,
	// jobs left due (not advanced) included.
	var walked []*vibejobs.Job
	after := vibejobs.DuePosition{}
	for range len(all) + 1 {
		page, err := f.s.DueJobs(f.ctx, T0, after, 2)
		if err != nil {
			t.Fatalf("DueJobs: %v", err)
		}
		if len(page) == 0 {
			break
		}
		walked = append(walked, page...)
		after = pos(page[len(page)-1])
	}
	if got, want := jobIDs(walked), jobIDs(all); !slices.Equal(got, want) {
		t.Fatalf("DueJobs walked in pages of 2 = %v, want %v", got, want)
	}
}

func (f *fixture) schedRun(j *vibejobs.Job, at time.Time) *vibejobs.Run {
	return vibejobs.NewRun(f.id("run_"), j, vibejobs.TriggerSchedule, at, T0.Add(-time.Minute))
}

// apply applies plans, wants want runs created, and returns the skipped
// occurrences ApplyRunPlans reports.
func (f *fixture) apply(want int, plans ...vibejobs.RunPlan) (skipped int64) {
	f.t.Helper()
	n, skipped, err := f.s.ApplyRunPlans(f.ctx, plans, T0)
	if err != nil {
		f.t.Fatalf("ApplyRunPlans: %v", err)
	}
	if n != want {
		f.t.Fatalf("ApplyRunPlans created %d runs, want %d", n, want)
	}
	return skipped
}

func testApplyRunPlans(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA, func(j *vibejobs.Job) { j.SkippedRuns = 1 })
	r1, r2 := f.schedRun(j, T0.Add(-time.Minute)), f.schedRun(j, T0)
	if sk := f.apply(2, vibejobs.RunPlan{JobID: j.ID, Anchor: j.ScheduleAnchor, From: T0, Next: ptr(T0.Add(time.Minute)), Runs: []*vibejobs.Run{r1, r2}, Skipped: 3}); sk != 3 {
		t.Errorf("ApplyRunPlans reported %d skipped occurrences, want 3", sk)
	}

	got := f.getJob(projectA, j.ID)
	if got.NextRunAt == nil || !got.NextRunAt.Equal(T0.Add(time.Minute)) || got.SkippedRuns != 4 || got.State != vibejobs.JobActive {
		t.Fatalf("job after a plan: next %v skipped %d state %s; want %s, 4, active",
			got.NextRunAt, got.SkippedRuns, got.State, T0.Add(time.Minute))
	}
	for _, r := range []*vibejobs.Run{r1, r2} {
		wantEqual(t, "planned run", f.getRun(projectA, r.ID), r)
	}

	// An occurrence that has its run is skipped, the rest of the plan applies.
	dup := f.schedRun(j, T0)
	r3 := f.schedRun(j, T0.Add(time.Minute))
	f.apply(1, vibejobs.RunPlan{JobID: j.ID, Anchor: j.ScheduleAnchor, From: T0.Add(time.Minute), Next: ptr(T0.Add(2 * time.Minute)), Runs: []*vibejobs.Run{dup, r3}, Skipped: 2})
	_, err := f.s.GetRun(f.ctx, projectA, dup.ID)
	wantNotFound(t, "GetRun of a duplicate occurrence", err, "run")
	got = f.getJob(projectA, j.ID)
	if !got.NextRunAt.Equal(T0.Add(2*time.Minute)) || got.SkippedRuns != 6 {
		t.Fatalf("job after a plan with a duplicate: next %v skipped %d; want %s, 6", got.NextRunAt, got.SkippedRuns, T0.Add(2*time.Minute))
	}

	// Several jobs in one call.
	m1 := f.job(projectA)
	m2 := f.job(projectB)
	f.apply(4,
		vibejobs.RunPlan{JobID: m1.ID, Anchor: m1.ScheduleAnchor, From: T0, Next: ptr(T0.Add(time.Hour)), Runs: []*vibejobs.Run{f.schedRun(m1, T0), f.schedRun(m1, T0.Add(-time.Hour))}},
		vibejobs.RunPlan{JobID: m2.ID, Anchor: m2.ScheduleAnchor, From: T0, Next: ptr(T0.Add(time.Hour)), Runs: []*vibejobs.Run{f.schedRun(m2, T0), f.schedRun(m2, T0.Add(-time.Hour))}},
	)
	f.apply(0)

	// A plan without runs still moves the job (everything skipped).
	f.apply(0, vibejobs.RunPlan{JobID: m1.ID, Anchor: m1.ScheduleAnchor, From: T0.Add(time.Hour), Next: ptr(T0.Add(2 * time.Hour)), Skipped: 1})
	if got := f.getJob(projectA, m1.ID); !got.NextRunAt.Equal(T0.Add(2*time.Hour)) || got.SkippedRuns != 1 {
		t.Fatalf("job after a plan without runs: next %v skipped %d", got.NextRunAt, got.SkippedRuns)
	}
}

func testApplyRunPlansSkipped(t *testing.T, f *fixture) {
	f.projects()
	stale := f.job(projectA)
	disabled := f.job(projectA, func(j *vibejobs.Job) { j.Enabled, j.State = false, vibejobs.JobPaused })
	paused := f.job(projectA, func(j *vibejobs.Job) { j.State = vibejobs.JobPaused })
	deleted := f.job(projectA)
	f.update(func(tx vibejobs.Tx) error { return tx.DeleteJob(f.ctx, projectA, deleted.ID, T0) })
	noNext := f.job(projectA, func(j *vibejobs.Job) { j.NextRunAt = nil })
	ok := f.job(projectA)
	// Its schedule changed after the plan was made, its next time did not
	// (hourly to every three hours, at a time both have): the plan, of the
	// old schedule, is stale.
	rescheduled := f.job(projectA)
	planned := *rescheduled
	rescheduled.Schedule, rescheduled.ScheduleAnchor = "0 */3 * * *", T0.Add(-time.Second)
	f.update(func(tx vibejobs.Tx) error { return tx.UpdateJob(f.ctx, rescheduled) })

	plan := func(j *vibejobs.Job, from time.Time) vibejobs.RunPlan {
		return vibejobs.RunPlan{JobID: j.ID, Anchor: j.ScheduleAnchor, From: from, Next: ptr(T0.Add(time.Minute)), Runs: []*vibejobs.Run{f.schedRun(j, from)}, Skipped: 1}
	}
	// Each plan skips one occurrence; only ok's counts.
	skipped := f.apply(1,
		plan(stale, T0.Add(-time.Minute)),
		plan(disabled, T0),
		plan(paused, T0),
		plan(deleted, T0),
		plan(noNext, T0),
		plan(&planned, T0),
		plan(ok, T0),
		vibejobs.RunPlan{JobID: "job_missing", From: T0, Next: ptr(T0.Add(time.Minute))},
	)
	if skipped != 1 {
		t.Errorf("ApplyRunPlans reported %d skipped occurrences, want 1 (of the one plan applied)", skipped)
	}
	for _, j := range []*vibejobs.Job{stale, disabled, paused, noNext, rescheduled} {
		got := f.getJob(projectA, j.ID)
		wantEqual(t, "skipped job's NextRunAt", got.NextRunAt, j.NextRunAt)
		if got.SkippedRuns != 0 || got.State != j.State {
			t.Errorf("skipped plan changed job: skipped %d state %s", got.SkippedRuns, got.State)
		}
		runs, _, err := f.s.ListRuns(f.ctx, projectA, vibejobs.RunFilter{JobID: j.ID}, vibejobs.Page{})
		if err != nil || len(runs) != 0 {
			t.Errorf("skipped plan created %d runs, %v", len(runs), err)
		}
	}
	runs, _, err := f.s.ListRuns(f.ctx, projectA, vibejobs.RunFilter{JobID: deleted.ID}, vibejobs.Page{})
	if err != nil || len(runs) != 0 {
		t.Errorf("plan of a deleted job created %d runs, %v", len(runs), err)
	}
}

func testApplyRunPlansCompletesOneOff(t *testing.T, f *fixture) {
	f.projects()
	o := f.job(projectA, func(j *vibejobs.Job) { j.Schedule, j.At = "", ptr(T0) })
	r := f.schedRun(o, T0)
	f.apply(1, vibejobs.RunPlan{JobID: o.ID, Anchor: o.ScheduleAnchor, From: T0, Runs: []*vibejobs.Run{r}, Complete: true})
	got := f.getJob(projectA, o.ID)
	if got.State != vibejobs.JobCompleted || got.NextRunAt != nil {
		t.Fatalf("one-off job after its plan: state %s next %v; want completed, nil", got.State, got.NextRunAt)
	}
	if jobs, err := f.s.DueJobs(f.ctx, T0.Add(time.Hour), vibejobs.DuePosition{}, 10); err != nil || len(jobs) != 0 {
		t.Fatalf("DueJobs after completion: %v, %v", jobIDs(jobs), err)
	}
	f.apply(0, vibejobs.RunPlan{JobID: o.ID, Anchor: o.ScheduleAnchor, From: T0, Runs: []*vibejobs.Run{f.schedRun(o, T0)}, Complete: true})
}

// A resent plan (RunPlan.Resent) is never applied, nor refused; ApplyRunPlans
// counts those of its runs that exist, by ID: the runs an earlier call
// that sent it created, its answer lost. Runs another caller created for
// its occurrences, under their own IDs, are not counted. A resent plan
// with a run that exists was applied by that call: its skipped
// occurrences are counted too, once; one with none, not at all.
func testApplyRunPlansResent(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	sent := vibejobs.RunPlan{JobID: j.ID, Anchor: j.ScheduleAnchor, From: T0, Next: ptr(T0.Add(time.Hour)),
		Runs: []*vibejobs.Run{f.schedRun(j, T0), f.schedRun(j, T0.Add(time.Minute))}, Skipped: 2}
	f.apply(2, sent) // as a call that lost its answer
	resent := sent
	resent.Resent = true
	// Its runs exist: the failed call applied it. Sent again it is not
	// applied again, and tells of the runs and the skips that call did.
	if sk := f.apply(2, resent); sk != 2 {
		t.Errorf("a resent plan whose runs exist reported %d skipped occurrences, want its 2", sk)
	}
	if got := f.getJob(projectA, j.ID); !got.NextRunAt.Equal(T0.Add(time.Hour)) || got.SkippedRuns != 2 {
		t.Errorf("job after its plan resent: next %v skipped %d; want %s, 2", got.NextRunAt, got.SkippedRuns, T0.Add(time.Hour))
	}
	// One of its runs gone (withdrawn): the other still tells of the
	// plan's skips, once.
	f.update(func(tx vibejobs.Tx) error {
		_, err := tx.DeleteFutureRuns(f.ctx, j.ID, T0)
		return err
	})
	if sk := f.apply(1, resent); sk != 2 {
		t.Errorf("a resent plan with one run left reported %d skipped occurrences, want its 2", sk)
	}

	// A resent plan whose job is still at its From is not applied: no call
	// committed it, and the job is planned afresh. Nor is it refused for a
	// run due after its deadline.
	k := f.job(projectA)
	late := f.schedRun(k, T0.Add(time.Minute))
	late.NextAttemptAt = ptr(late.DeadlineAt.Add(time.Millisecond))
	unsent := vibejobs.RunPlan{JobID: k.ID, Anchor: k.ScheduleAnchor, From: T0, Next: ptr(T0.Add(2 * time.Minute)),
		Runs: []*vibejobs.Run{f.schedRun(k, T0), late}, Skipped: 5, Resent: true}
	if sk := f.apply(0, unsent); sk != 0 {
		t.Errorf("a resent plan no call applied reported %d skipped occurrences, want 0", sk)
	}
	if got := f.getJob(projectA, k.ID); !got.NextRunAt.Equal(T0) || got.SkippedRuns != 0 {
		t.Errorf("a resent plan moved its job to %v, skipped %d", got.NextRunAt, got.SkippedRuns)
	}
	// The plan of k made afresh, in the same call, creates the run of an
	// occurrence the resent plan names under another ID: counted once,
	// and the skips of the fresh plan alone.
	if sk := f.apply(1, unsent, vibejobs.RunPlan{JobID: k.ID, Anchor: k.ScheduleAnchor, From: T0, Next: ptr(T0.Add(time.Minute)),
		Runs: []*vibejobs.Run{f.schedRun(k, T0)}, Skipped: 1}); sk != 1 {
		t.Errorf("a resent plan and its job's fresh one reported %d skipped occurrences, want the fresh one's 1", sk)
	}
	for _, r := range unsent.Runs {
		_, err := f.s.GetRun(f.ctx, projectA, r.ID)
		wantNotFound(t, "GetRun of a resent plan's run", err, "run")
	}

	// Resent plans count once in a call that applies two plans of one
	// job, one after the other; the skips of the one a call applied
	// only.
	sk := f.apply(1+2, resent, unsent,
		vibejobs.RunPlan{JobID: k.ID, Anchor: k.ScheduleAnchor, From: T0.Add(time.Minute), Next: ptr(T0.Add(2 * time.Minute)),
			Runs: []*vibejobs.Run{f.schedRun(k, T0.Add(time.Minute))}},
		vibejobs.RunPlan{JobID: k.ID, Anchor: k.ScheduleAnchor, From: T0.Add(2 * time.Minute), Next: ptr(T0.Add(3 * time.Minute)),
			Runs: []*vibejobs.Run{f.schedRun(k, T0.Add(2*time.Minute))}})
	if sk != 2 {
		t.Errorf("resent plans, one applied by the call that lost its answer: %d skipped occurrences, want its 2", sk)
	}
	if got := f.getJob(projectA, k.ID); !got.NextRunAt.Equal(T0.Add(3 * time.Minute)) {
		t.Errorf("job after two plans in one call: next %v, want %s", got.NextRunAt, T0.Add(3*time.Minute))
	}
}

// Eight schedulers apply overlapping plans for one job at once: each
// occurrence gets exactly one run.
func testApplyRunPlansConcurrent(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	const occurrences = 20
	end := T0.Add(occurrences * time.Minute)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		created int
	)
	for range 8 {
		wg.Go(func() {
			for range 10 * occurrences {
				cur, err := f.s.GetJob(f.ctx, projectA, j.ID)
				if err != nil {
					t.Errorf("GetJob: %v", err)
					return
				}
				from := *cur.NextRunAt
				if !from.Before(end) {
					return
				}
				// Every plan repeats the three occurrences before its own.
				var runs []*vibejobs.Run
				for at := from.Add(-3 * time.Minute); !at.After(from); at = at.Add(time.Minute) {
					if !at.Before(T0) {
						runs = append(runs, f.schedRun(j, at))
					}
				}
				n, _, err := f.s.ApplyRunPlans(f.ctx, []vibejobs.RunPlan{{JobID: j.ID, Anchor: j.ScheduleAnchor, From: from, Next: ptr(from.Add(time.Minute)), Runs: runs}}, T0)
				if err != nil {
					t.Errorf("ApplyRunPlans: %v", err)
					return
				}
				mu.Lock()
				created += n
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if created != occurrences {
		t.Errorf("runs created = %d, want %d", created, occurrences)
	}
	runs, _, err := f.s.ListRuns(f.ctx, projectA, vibejobs.RunFilter{JobID: j.ID}, vibejobs.Page{Limit: 100})
	if err != nil {
		t.Fatalf("ListRuns: %v", err)
	}
	per := map[time.Time]int{}
	for _, r := range runs {
		per[r.ScheduledFor.UTC()]++
	}
	for i := range occurrences {
		at := T0.Add(time.Duration(i) * time.Minute)
		if per[at] != 1 {
			t.Errorf("occurrence %s has %d runs, want 1", at.Format(time.RFC3339), per[at])
		}
	}
	if len(runs) != occurrences {
		t.Errorf("%d runs, want %d", len(runs), occurrences)
	}
	if got := f.getJob(projectA, j.ID); !got.NextRunAt.Equal(end) {
		t.Errorf("NextRunAt = %s, want %s", got.NextRunAt, end)
	}
}

// A run never waits for an attempt due after its deadline (see
// Run.CheckDue): CreateRun and ApplyRunPlans refuse one.
func testRunDueAfterDeadlineRefused(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	r := f.newRun(j, T0)
	r.NextAttemptAt = ptr(r.DeadlineAt.Add(time.Millisecond))
	err := f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.CreateRun(f.ctx, r) })
	wantError(t, "CreateRun of a run due after its deadline", err, vibejobs.EINVALID, "run_due_after_deadline")
	_, err = f.s.GetRun(f.ctx, projectA, r.ID)
	wantNotFound(t, "GetRun of the refused run", err, "run")

	ok := f.schedRun(j, T0)
	late := f.schedRun(j, T0.Add(time.Minute))
	late.NextAttemptAt = ptr(late.DeadlineAt.Add(time.Millisecond))
	created, _, err := f.s.ApplyRunPlans(f.ctx, []vibejobs.RunPlan{
		{JobID: j.ID, Anchor: j.ScheduleAnchor, From: *j.NextRunAt, Next: ptr(j.NextRunAt.Add(time.Hour)), Runs: []*vibejobs.Run{ok, late}},
	}, T0)
	if created != 0 {
		t.Errorf("ApplyRunPlans with a run due after its deadline created %d runs", created)
	}
	wantError(t, "ApplyRunPlans with a run due after its deadline", err, vibejobs.EINVALID, "run_due_after_deadline")
	_, err = f.s.GetRun(f.ctx, projectA, ok.ID)
	wantNotFound(t, "GetRun of a run in the refused plan", err, "run")
	if got := f.getJob(projectA, j.ID); !got.NextRunAt.Equal(*j.NextRunAt) {
		t.Errorf("job after a refused plan: next %v, want %v", got.NextRunAt, j.NextRunAt)
	}

	// At its deadline exactly is allowed.
	edge := f.newRun(j, T0)
	edge.NextAttemptAt = ptr(edge.DeadlineAt)
	f.update(func(tx vibejobs.Tx) error { return tx.CreateRun(f.ctx, edge) })
	f.wantRun("run due at its deadline", edge.ID, vibejobs.RunScheduled, 0, ptr(edge.DeadlineAt))
}
