package storetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

func testJobRoundTrip(t *testing.T, f *fixture) {
	f.projects()
	recurring := f.job(projectA)
	oneOff := f.job(projectA, func(j *vibejobs.Job) {
		j.Name = "one-off ✓"
		j.Schedule = ""
		j.At = ptr(T0.Add(24*time.Hour + 123*time.Millisecond))
		j.Timezone = "Australia/Lord_Howe"
		j.URL = "https://other.example.org:8443/a/b?c=d"
		j.Enabled = false
		j.State = vibejobs.JobPaused
		j.Retry = vibejobs.RetryPolicy{MaxAttempts: 2, MinBackoff: 1500 * time.Millisecond, MaxBackoff: 24 * time.Hour}
		j.Timeout = 30 * time.Second
		j.CatchUp = vibejobs.CatchUpNone
		j.ScheduleAnchor = T0.Add(-time.Millisecond)
		j.NextRunAt = nil
		j.SkippedRuns = 42
		j.Secret = vibejobs.SealedSecret{KeyID: "key2", Ciphertext: []byte{0, 0xff, 0, 1}}
		j.CreatedAt = T0.Add(-time.Minute)
		j.UpdatedAt = T0.Add(-time.Second)
	})

	for _, want := range []*vibejobs.Job{recurring, oneOff} {
		wantEqual(t, "GetJob", f.getJob(projectA, want.ID), want)
	}
	jobs, next, err := f.s.ListJobs(f.ctx, projectA, vibejobs.Page{})
	if err != nil {
		t.Fatalf("ListJobs: %v", err)
	}
	wantEqual(t, "ListJobs", jobs, []*vibejobs.Job{recurring, oneOff})
	if next != "" {
		t.Errorf("ListJobs of a short list: nextCursor %q, want none", next)
	}
	if n, err := f.s.CountJobs(f.ctx, projectA); err != nil || n != 2 {
		t.Errorf("CountJobs = %d, %v; want 2", n, err)
	}

	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
		return tx.CreateJob(f.ctx, f.newJob(projectA, func(j *vibejobs.Job) { j.ID = recurring.ID }))
	})
	wantError(t, "CreateJob with a taken id", err, vibejobs.ECONFLICT, "")
}

func testUpdateJob(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	f.job(projectA) // a neighbour that must not change
	before := f.getJob(projectA, j.ID)

	u := *before
	u.Name = "renamed"
	u.Schedule = ""
	u.At = ptr(T0.Add(time.Hour))
	u.Timezone = "America/New_York"
	u.URL = "https://new.example.test/x"
	u.Enabled = false
	u.State = vibejobs.JobPaused
	u.Retry = vibejobs.RetryPolicy{MaxAttempts: 1, MinBackoff: time.Second, MaxBackoff: 2 * time.Second}
	u.Timeout = time.Second
	u.CatchUp = vibejobs.CatchUpLatest
	u.ScheduleAnchor = T0.Add(5 * time.Minute)
	u.NextRunAt = ptr(T0.Add(time.Hour))
	u.Secret = vibejobs.SealedSecret{KeyID: "key9", Ciphertext: []byte("sealed again")}
	u.UpdatedAt = T0.Add(10 * time.Minute)
	// Not mutable through UpdateJob: they must keep their stored values.
	u.CreatedAt = T0.Add(time.Hour)
	u.SkippedRuns = 99
	f.update(func(tx vibejobs.Tx) error { return tx.UpdateJob(f.ctx, &u) })

	want := u
	want.CreatedAt = before.CreatedAt
	want.SkippedRuns = before.SkippedRuns
	wantEqual(t, "GetJob after UpdateJob", f.getJob(projectA, j.ID), &want)

	u.NextRunAt, u.At = nil, nil
	f.update(func(tx vibejobs.Tx) error { return tx.UpdateJob(f.ctx, &u) })
	got := f.getJob(projectA, j.ID)
	if got.NextRunAt != nil || got.At != nil {
		t.Errorf("UpdateJob with NextRunAt and At nil: got %v and %v, want nil", got.NextRunAt, got.At)
	}

	missing := f.newJob(projectA)
	err := f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.UpdateJob(f.ctx, missing) })
	wantNotFound(t, "UpdateJob of a missing job", err, "job")
}

// pageIDs walks a list by pages of 3 from the first, through list (which
// returns a page's ids and its next cursor), and returns every id in
// order. It fails t on an error, an empty page or one over the limit, and
// on cursors that do not end within 11 pages.
func pageIDs(t *testing.T, what string, list func(vibejobs.Page) ([]string, string, error)) []string {
	t.Helper()
	var got []string
	cursor := ""
	for page := 0; ; page++ {
		ids, next, err := list(vibejobs.Page{Limit: 3, Cursor: cursor})
		if err != nil {
			t.Fatalf("%s page %d: %v", what, page, err)
		}
		if len(ids) > 3 || len(ids) == 0 {
			t.Fatalf("%s page %d: %d items, limit 3", what, page, len(ids))
		}
		got = append(got, ids...)
		if next == "" {
			return got
		}
		if page > 10 {
			t.Fatalf("%s: cursors never end", what)
		}
		cursor = next
	}
}

func testListJobsPagination(t *testing.T, f *fixture) {
	f.projects()
	var want []string
	for i := range 7 {
		want = append(want, f.job(projectA).ID)
		if i%3 == 0 {
			f.job(projectB) // interleaved jobs of another project
		}
	}
	got := pageIDs(t, "ListJobs", func(p vibejobs.Page) ([]string, string, error) {
		jobs, next, err := f.s.ListJobs(f.ctx, projectA, p)
		return jobIDs(jobs), next, err
	})
	if !slices.Equal(got, want) {
		t.Fatalf("ListJobs pages: got %v, want %v (ascending id)", got, want)
	}
}

// Pages taken while jobs are created and deleted neither repeat a job nor
// miss one that existed throughout; new jobs come last.
func testListJobsPaginationWhileChanging(t *testing.T, f *fixture) {
	f.projects()
	var all []*vibejobs.Job
	for range 9 {
		all = append(all, f.job(projectA))
	}
	seen := map[string]int{}
	jobs, cursor, err := f.s.ListJobs(f.ctx, projectA, vibejobs.Page{Limit: 4})
	if err != nil {
		t.Fatalf("ListJobs: %v", err)
	}
	for _, j := range jobs {
		seen[j.ID]++
	}
	// Delete one job already seen and one not yet seen; add two.
	f.update(func(tx vibejobs.Tx) error {
		if err := tx.DeleteJob(f.ctx, projectA, all[1].ID, T0); err != nil {
			return err
		}
		return tx.DeleteJob(f.ctx, projectA, all[6].ID, T0)
	})
	added := []*vibejobs.Job{f.job(projectA), f.job(projectA)}
	var order []string
	for cursor != "" {
		jobs, cursor, err = f.s.ListJobs(f.ctx, projectA, vibejobs.Page{Limit: 4, Cursor: cursor})
		if err != nil {
			t.Fatalf("ListJobs: %v", err)
		}
		for _, j := range jobs {
			seen[j.ID]++
			order = append(order, j.ID)
		}
	}
	for id, n := range seen {
		if n > 1 {
			t.Errorf("job %s listed %d times", id, n)
		}
	}
	for i, j := range all {
		if i == 6 {
			if seen[j.ID] != 0 {
				t.Errorf("deleted job %s listed", j.ID)
			}
			continue
		}
		if i != 1 && seen[j.ID] != 1 {
			t.Errorf("job %s missed", j.ID)
		}
	}
	if n := len(order); n < 2 || order[n-2] != added[0].ID || order[n-1] != added[1].ID {
		t.Errorf("jobs created while paging: last listed %v, want %s and %s last", order, added[0].ID, added[1].ID)
	}
}

func testPageValidation(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	for range 54 {
		f.job(projectA)
	}
	for range 55 {
		f.run(j, T0)
	}
	for range 55 {
		if err := f.createToken(f.newToken(projectA), vibejobs.MaxTokensPerProject); err != nil {
			t.Fatalf("CreateToken: %v", err)
		}
	}
	for range 55 - 2 { // and projectA and projectB
		f.project()
	}
	listJobs := func(p vibejobs.Page) (int, string, error) {
		jobs, next, err := f.s.ListJobs(f.ctx, projectA, p)
		return len(jobs), next, err
	}
	listRuns := func(p vibejobs.Page) (int, string, error) {
		runs, next, err := f.s.ListRuns(f.ctx, projectA, vibejobs.RunFilter{}, p)
		return len(runs), next, err
	}
	listTokens := func(p vibejobs.Page) (int, string, error) {
		tokens, next, err := f.s.ListTokens(f.ctx, projectA, p)
		return len(tokens), next, err
	}
	listProjects := func(p vibejobs.Page) (int, string, error) {
		projects, next, err := f.s.ListProjects(f.ctx, p)
		return len(projects), next, err
	}
	for name, list := range map[string]func(vibejobs.Page) (int, string, error){"ListJobs": listJobs, "ListRuns": listRuns,
		"ListTokens": listTokens, "ListProjects": listProjects} {
		n, next, err := list(vibejobs.Page{})
		if err != nil || n != 50 || next == "" {
			t.Errorf("%s with limit 0: %d items, next %q, %v; want 50 and a cursor", name, n, next, err)
		}
		if n, _, err := list(vibejobs.Page{Limit: 100}); err != nil || n != 55 {
			t.Errorf("%s with limit 100: %d items, %v; want 55", name, n, err)
		}
		if n, _, err := list(vibejobs.Page{Limit: 1}); err != nil || n != 1 {
			t.Errorf("%s with limit 1: %d items, %v; want 1", name, n, err)
		}
		for _, limit := range []int{-1, 101, 1000} {
			_, _, err := list(vibejobs.Page{Limit: limit})
			wantError(t, name+" with an out-of-range limit", err, vibejobs.EINVALID, "invalid_limit")
			if e := asError(err); e.Field != "limit" {
				t.Errorf("%s with limit %d: field %q, want limit", name, limit, e.Field)
			}
		}
		for _, cursor := range []string{"***", "not a cursor", "%%%%"} {
			_, _, err := list(vibejobs.Page{Cursor: cursor})
			wantError(t, name+" with a malformed cursor", err, vibejobs.EINVALID, "invalid_cursor")
			if e := asError(err); e.Field != "cursor" {
				t.Errorf("%s with cursor %q: field %q, want cursor", name, cursor, e.Field)
			}
		}
	}
}

func testProjectIsolation(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	r := f.run(j, T0)
	done := f.finishedRun(j, T0.Add(-30*24*time.Hour))
	rec := f.idempotencyRecord(projectA, "shared-key", T0)
	f.update(func(tx vibejobs.Tx) error { return tx.InsertIdempotencyKey(f.ctx, rec) })

	_, err := f.s.GetJob(f.ctx, projectB, j.ID)
	wantNotFound(t, "GetJob of another project's job", err, "job")
	other := *j
	other.ProjectID = projectB
	other.Name = "stolen"
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.UpdateJob(f.ctx, &other) })
	wantNotFound(t, "UpdateJob of another project's job", err, "job")
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.DeleteJob(f.ctx, projectB, j.ID, T0) })
	wantNotFound(t, "DeleteJob of another project's job", err, "job")
	if got := f.getJob(projectA, j.ID); got.Name != j.Name {
		t.Errorf("job changed through another project: name %q", got.Name)
	}
	if got := f.getRun(projectA, r.ID); got.State != vibejobs.RunScheduled {
		t.Errorf("run of a job deleted through another project: state %s", got.State)
	}

	_, err = f.s.GetRun(f.ctx, projectB, r.ID)
	wantNotFound(t, "GetRun of another project's run", err, "run")
	// A run of project B for project A's job: B would read A's job id and
	// its runs' place in A's history.
	stray := f.newRun(j, T0)
	stray.ProjectID = projectB
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.CreateRun(f.ctx, stray) })
	wantNotFound(t, "CreateRun in project B for project A's job", err, "job")
	if runs, _, err := f.s.ListRuns(f.ctx, projectB, vibejobs.RunFilter{}, vibejobs.Page{}); err != nil || len(runs) != 0 {
		t.Errorf("ListRuns of project B after CreateRun for A's job: %d runs, %v; want none", len(runs), err)
	}
	if jobs, _, err := f.s.ListJobs(f.ctx, projectB, vibejobs.Page{}); err != nil || len(jobs) != 0 {
		t.Errorf("ListJobs of project B: %d jobs, %v; want none", len(jobs), err)
	}
	if n, err := f.s.CountJobs(f.ctx, projectB); err != nil || n != 0 {
		t.Errorf("CountJobs of project B = %d, %v; want 0", n, err)
	}
	for _, filter := range []vibejobs.RunFilter{{}, {JobID: j.ID}, {State: vibejobs.RunScheduled}} {
		if runs, _, err := f.s.ListRuns(f.ctx, projectB, filter, vibejobs.Page{}); err != nil || len(runs) != 0 {
			t.Errorf("ListRuns(%+v) of project B: %d runs, %v; want none", filter, len(runs), err)
		}
	}

	_, err = f.s.GetIdempotencyKey(f.ctx, projectB, rec.Key, T0)
	wantNotFound(t, "GetIdempotencyKey of another project's key", err, "idempotency_key")
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
		c := *rec
		c.ProjectID = projectB
		c.ResponseStatus = 200
		return tx.CompleteIdempotencyKey(f.ctx, &c)
	})
	wantNotFound(t, "CompleteIdempotencyKey of another project's key", err, "idempotency_key")
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.DeleteIdempotencyKey(f.ctx, projectB, rec.Key, rec.CreatedAt) })
	wantNotFound(t, "DeleteIdempotencyKey of another project's key", err, "idempotency_key")
	if _, err := f.s.GetIdempotencyKey(f.ctx, projectA, rec.Key, T0); err != nil {
		t.Errorf("key of project A after project B's attempts: %v", err)
	}
	// Keys are per project: B may use the same one.
	f.update(func(tx vibejobs.Tx) error {
		return tx.InsertIdempotencyKey(f.ctx, f.idempotencyRecord(projectB, rec.Key, T0))
	})

	if n, err := f.s.PruneRuns(f.ctx, projectB, T0, 100); err != nil || n != 0 {
		t.Errorf("PruneRuns of project B = %d, %v; want 0", n, err)
	}
	f.getRun(projectA, done.ID)

	tok := &vibejobs.Token{ID: f.id("tok_"), ProjectID: projectA, Name: "a", Role: vibejobs.RoleAdmin, Prefix: "vjt_", Hash: []byte("a"), CreatedAt: T0}
	f.update(func(tx vibejobs.Tx) error { return tx.CreateToken(f.ctx, tok, vibejobs.MaxTokensPerProject) })
	if toks, _, err := f.s.ListTokens(f.ctx, projectB, vibejobs.Page{}); err != nil || len(toks) != 0 {
		t.Errorf("ListTokens of project B: %d tokens, %v; want none", len(toks), err)
	}
}

func testDeleteJob(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA, func(j *vibejobs.Job) { j.NextRunAt = ptr(T0.Add(-time.Minute)) })
	keep := f.job(projectA, func(j *vibejobs.Job) { j.NextRunAt = ptr(T0.Add(-time.Minute)) })

	done := f.finishedRun(j, T0.Add(-9*time.Hour))
	inFlight := f.claimOne(j, "w1")
	inFlight2 := f.claimOne(j, "w1")
	unsent := f.claimOne(j, "w1")
	retry := f.retryingRun(j, T0.Add(time.Hour))
	waiting := f.run(j, T0.Add(time.Minute))
	other := f.run(keep, T0.Add(time.Minute))
	at := T0.Add(30 * time.Second)
	// A waiting run whose deadline is at itself is still cancelled; one
	// whose deadline passed (the platform was down) is left to
	// FailExpiredRuns: DeleteJob looks for runs to cancel only among the
	// job's last DeliveryLifetime of occurrences.
	lastDay := f.run(j, at.Add(-vibejobs.DeliveryLifetime))
	expired := f.run(j, at.Add(-vibejobs.DeliveryLifetime-time.Millisecond))

	f.update(func(tx vibejobs.Tx) error { return tx.DeleteJob(f.ctx, projectA, j.ID, at) })

	_, err := f.s.GetJob(f.ctx, projectA, j.ID)
	wantNotFound(t, "GetJob of a deleted job", err, "job")
	jobs, _, err := f.s.ListJobs(f.ctx, projectA, vibejobs.Page{})
	if err != nil || !slices.Equal(jobIDs(jobs), []string{keep.ID}) {
		t.Errorf("ListJobs after delete: %v, %v; want only %s", jobIDs(jobs), err, keep.ID)
	}
	if n, err := f.s.CountJobs(f.ctx, projectA); err != nil || n != 1 {
		t.Errorf("CountJobs after delete = %d, %v; want 1", n, err)
	}
	due, err := f.s.DueJobs(f.ctx, T0, vibejobs.DuePosition{}, 10)
	if err != nil || !slices.Equal(jobIDs(due), []string{keep.ID}) {
		t.Errorf("DueJobs after delete: %v, %v; want only %s", jobIDs(due), err, keep.ID)
	}
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.DeleteJob(f.ctx, projectA, j.ID, at) })
	wantNotFound(t, "DeleteJob of a deleted job", err, "job")
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.UpdateJob(f.ctx, j) })
	wantNotFound(t, "UpdateJob of a deleted job", err, "job")
	late := f.newRun(j, T0.Add(time.Hour))
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.CreateRun(f.ctx, late) })
	wantNotFound(t, "CreateRun of a deleted job", err, "job")

	// Runs stay visible; waiting ones are cancelled.
	for _, r := range []*vibejobs.Run{waiting, retry, lastDay} {
		got := f.getRun(projectA, r.ID)
		if got.State != vibejobs.RunCancelled || got.FailureReason != vibejobs.ReasonJobDeleted ||
			got.FinishedAt == nil || !got.FinishedAt.Equal(at) {
			t.Errorf("waiting run after DeleteJob: state %s reason %q finished %v; want cancelled job_deleted at %s",
				got.State, got.FailureReason, got.FinishedAt, at)
		}
	}
	if got := f.getRun(projectA, done.ID); got.State != vibejobs.RunSucceeded {
		t.Errorf("finished run after DeleteJob: state %s, want succeeded", got.State)
	}
	if got := f.getRun(projectA, other.ID); got.State != vibejobs.RunScheduled {
		t.Errorf("another job's run after DeleteJob: state %s, want scheduled", got.State)
	}
	if got := f.getRun(projectA, expired.ID); got.State != vibejobs.RunScheduled {
		t.Errorf("expired run after DeleteJob: state %s, want scheduled (left to FailExpiredRuns)", got.State)
	}
	if n, err := f.s.FailExpiredRuns(f.ctx, at, 10); err != nil || n != 1 {
		t.Errorf("FailExpiredRuns after DeleteJob = %d, %v; want the expired run", n, err)
	} else if got := f.getRun(projectA, expired.ID); got.State != vibejobs.RunFailed || got.FailureReason != vibejobs.ReasonDeadlineExceeded {
		t.Errorf("expired run of a deleted job: state %s reason %q, want failed deadline_exceeded", got.State, got.FailureReason)
	}
	for _, c := range []*vibejobs.Claim{inFlight, inFlight2, unsent} {
		if got := f.getRun(projectA, c.Run.ID); got.State != vibejobs.RunDelivering {
			t.Errorf("run in flight after DeleteJob: state %s, want delivering", got.State)
		}
	}

	// A claim released unsent has no attempt in flight any more: cancelled.
	rel := T0.Add(35 * time.Second)
	if err := f.s.ReleaseClaims(f.ctx, "w1", []*vibejobs.Claim{unsent}, rel, rel); err != nil {
		t.Fatalf("ReleaseClaims: %v", err)
	}
	f.wantEnded("released claim of a deleted job", f.getRun(projectA, unsent.Run.ID), vibejobs.RunCancelled, vibejobs.ReasonJobDeleted, rel)

	// The attempt in flight finishes; no further attempt follows.
	fin := T0.Add(40 * time.Second)
	f.record("w1",
		retrying(inFlight, inFlight.Run.ScheduledFor, fin, T0.Add(time.Hour)),
		succeeded(inFlight2, inFlight2.Run.ScheduledFor, fin))
	got := f.getRun(projectA, inFlight.Run.ID)
	if got.State != vibejobs.RunCancelled || got.FailureReason != vibejobs.ReasonJobDeleted || got.FinishedAt == nil || len(got.Attempts) != 1 {
		t.Errorf("retrying outcome of a deleted job's run: state %s reason %q finished %v, %d attempts; want cancelled job_deleted, 1 attempt",
			got.State, got.FailureReason, got.FinishedAt, len(got.Attempts))
	}
	if got := f.getRun(projectA, inFlight2.Run.ID); got.State != vibejobs.RunSucceeded {
		t.Errorf("succeeded outcome of a deleted job's run: state %s, want succeeded", got.State)
	}
	if cs := f.claim("w2", T0.Add(2*time.Hour), 100); !slices.Equal(claimedIDs(cs), []string{other.ID}) {
		t.Errorf("claim after DeleteJob: %v, want only %s", claimedIDs(cs), other.ID)
	}
	runs, _, err := f.s.ListRuns(f.ctx, projectA, vibejobs.RunFilter{JobID: j.ID}, vibejobs.Page{})
	if err != nil || len(runs) != 8 {
		t.Errorf("ListRuns of the deleted job: %d runs, %v; want 8", len(runs), err)
	}
}

func testDeleteFutureRuns(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	k := f.job(projectA)
	sched := func(job *vibejobs.Job, at time.Time, due time.Time) *vibejobs.Run {
		r := vibejobs.NewRun(f.id("run_"), job, vibejobs.TriggerSchedule, at, T0.Add(-time.Hour))
		r.NextAttemptAt = &due
		return r
	}
	atCut := sched(j, T0, T0)
	future1 := sched(j, T0.Add(time.Minute), T0.Add(time.Minute))
	future2 := sched(j, T0.Add(2*time.Minute), T0.Add(2*time.Minute))
	started := sched(j, T0.Add(3*time.Minute), T0.Add(-5*time.Hour)) // due early so it can be claimed alone
	otherJob := sched(k, T0.Add(time.Minute), T0.Add(time.Minute))
	created, _, err := f.s.ApplyRunPlans(f.ctx, []vibejobs.RunPlan{
		{JobID: j.ID, Anchor: j.ScheduleAnchor, From: T0, Next: ptr(T0.Add(4 * time.Minute)), Runs: []*vibejobs.Run{atCut, future1, future2, started}},
		{JobID: k.ID, Anchor: k.ScheduleAnchor, From: T0, Next: ptr(T0.Add(4 * time.Minute)), Runs: []*vibejobs.Run{otherJob}},
	}, T0)
	if err != nil || created != 5 {
		t.Fatalf("ApplyRunPlans = %d, %v; want 5", created, err)
	}
	c := f.claimIDs("w1", T0.Add(-5*time.Hour), 1, started)[0]
	f.record("w1", retrying(c, T0.Add(-5*time.Hour), T0.Add(-5*time.Hour+time.Second), T0.Add(time.Hour)))
	manual := f.run(j, T0.Add(5*time.Minute))

	var n int
	f.update(func(tx vibejobs.Tx) error {
		var err error
		n, err = tx.DeleteFutureRuns(f.ctx, j.ID, T0)
		return err
	})
	if n != 2 {
		t.Errorf("DeleteFutureRuns = %d, want 2", n)
	}
	for _, r := range []*vibejobs.Run{future1, future2} {
		_, err := f.s.GetRun(f.ctx, projectA, r.ID)
		wantNotFound(t, "GetRun of a withdrawn future run", err, "run")
	}
	for _, r := range []*vibejobs.Run{atCut, started, manual, otherJob} {
		f.getRun(projectA, r.ID)
	}

	// The withdrawn occurrence can be planned again.
	again := sched(j, T0.Add(time.Minute), T0.Add(time.Minute))
	created, _, err = f.s.ApplyRunPlans(f.ctx, []vibejobs.RunPlan{
		{JobID: j.ID, Anchor: j.ScheduleAnchor, From: T0.Add(4 * time.Minute), Next: ptr(T0.Add(5 * time.Minute)), Runs: []*vibejobs.Run{again}},
	}, T0)
	if err != nil || created != 1 {
		t.Fatalf("ApplyRunPlans of a withdrawn occurrence = %d, %v; want 1", created, err)
	}
}

// testAddSkippedRuns: occurrences an API change skips add to those the
// scheduler counted, on a live job of the project only.
func testAddSkippedRuns(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	f.apply(0, vibejobs.RunPlan{JobID: j.ID, Anchor: j.ScheduleAnchor, From: T0, Next: ptr(T0.Add(time.Hour)), Skipped: 3})
	f.update(func(tx vibejobs.Tx) error { return tx.AddSkippedRuns(f.ctx, projectA, j.ID, 4) })
	if got := f.getJob(projectA, j.ID).SkippedRuns; got != 7 {
		t.Errorf("SkippedRuns = %d, want 3 from a plan and 4 added", got)
	}
	err := f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.AddSkippedRuns(f.ctx, projectB, j.ID, 1) })
	wantNotFound(t, "AddSkippedRuns of another project's job", err, "job")
	f.update(func(tx vibejobs.Tx) error { return tx.DeleteJob(f.ctx, projectA, j.ID, T0) })
	err = f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.AddSkippedRuns(f.ctx, projectA, j.ID, 1) })
	wantNotFound(t, "AddSkippedRuns of a deleted job", err, "job")
}

// testWithdrawHeldRuns: a run claimed ahead of its time when a pause or a
// schedule change withdraws its occurrence stays with its holder. Given back
// unsent, it is deleted, as an unheld one was; sent, its outcome is
// recorded; planned again before it is given back, it is claimed again; its
// holder dead, it is recovered and sent, since it may have gone out.
func testWithdrawHeldRuns(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	released := f.schedRun(j, T0.Add(1*time.Second))
	sent := f.schedRun(j, T0.Add(2*time.Second))
	wanted := f.schedRun(j, T0.Add(3*time.Second))
	orphaned := f.schedRun(j, T0.Add(4*time.Second))
	atCut := f.schedRun(j, T0)
	f.apply(5, vibejobs.RunPlan{JobID: j.ID, Anchor: j.ScheduleAnchor, From: T0, Next: ptr(T0.Add(time.Hour)),
		Runs: []*vibejobs.Run{atCut, released, sent, wanted, orphaned}})
	// Claimed ahead: the latest is due 4 s after the claim.
	cs := f.claimIDs("w1", T0.Add(4*time.Second), 10, atCut, released, sent, wanted, orphaned)

	var n int
	f.update(func(tx vibejobs.Tx) error {
		var err error
		n, err = tx.DeleteFutureRuns(f.ctx, j.ID, T0)
		return err
	})
	if n != 0 {
		t.Errorf("DeleteFutureRuns deleted %d held runs, want 0", n)
	}
	for _, r := range []*vibejobs.Run{atCut, released, sent, wanted, orphaned} {
		if got := f.getRun(projectA, r.ID); got.State != vibejobs.RunDelivering {
			t.Errorf("held run at %s after DeleteFutureRuns: %s, want delivering", r.ScheduledFor.Format(time.TimeOnly), got.State)
		}
	}

	// Given back unsent: gone. The run at the cut was not withdrawn: it is
	// given back as usual.
	if err := f.s.ReleaseClaims(f.ctx, "w1", []*vibejobs.Claim{cs[0], cs[1]}, T0, T0); err != nil {
		t.Fatalf("ReleaseClaims: %v", err)
	}
	_, err := f.s.GetRun(f.ctx, projectA, released.ID)
	wantNotFound(t, "GetRun of a withdrawn run given back", err, "run")
	f.wantRun("the run at the cut, given back", atCut.ID, vibejobs.RunScheduled, 0, ptr(T0))

	// Sent: recorded.
	f.record("w1", succeeded(cs[2], sent.ScheduledFor, sent.ScheduledFor.Add(time.Second)))
	f.wantRun("a withdrawn run whose attempt went out", sent.ID, vibejobs.RunSucceeded, 1, nil)

	// Planned again (a resume sets the next occurrence after its time),
	// then given back: claimable again.
	resumed := f.getJob(projectA, j.ID)
	resumed.NextRunAt = ptr(wanted.ScheduledFor)
	f.update(func(tx vibejobs.Tx) error { return tx.UpdateJob(f.ctx, resumed) })
	f.apply(0, vibejobs.RunPlan{JobID: j.ID, Anchor: j.ScheduleAnchor, From: wanted.ScheduledFor,
		Next: ptr(T0.Add(time.Hour)), Runs: []*vibejobs.Run{f.schedRun(j, wanted.ScheduledFor)}})
	if err := f.s.ReleaseClaims(f.ctx, "w1", []*vibejobs.Claim{cs[3]}, T0.Add(3*time.Second), T0.Add(3*time.Second)); err != nil {
		t.Fatalf("ReleaseClaims: %v", err)
	}
	f.wantRun("a withdrawn run planned again, given back", wanted.ID, vibejobs.RunScheduled, 0, ptr(T0.Add(3*time.Second)))

	// Its holder dead: recovered, to be sent again.
	lease := T0.Add(4*time.Second + cs[4].Timeout + Margin)
	if n, err := f.s.RecoverExpiredLeases(f.ctx, lease.Add(time.Millisecond), 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v; want 1", n, err)
	}
	if got := f.getRun(projectA, orphaned.ID); got.State != vibejobs.RunScheduled {
		t.Errorf("a withdrawn run whose holder died, recovered: %s, want scheduled", got.State)
	}
}

// testRecoverWithdrawnRunOfDeletedJob: a run claimed ahead, withdrawn by a
// pause, then its job deleted, and its holder dead. Its attempt may have
// gone out, but no further attempt may follow a deletion (SEMANTICS.md
// section 3): recovery ends it, cancelled (job_deleted), and never puts it
// back to be sent, whatever the withdrawal mark says.
func testRecoverWithdrawnRunOfDeletedJob(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	r := f.schedRun(j, T0.Add(time.Second))
	f.apply(1, vibejobs.RunPlan{JobID: j.ID, Anchor: j.ScheduleAnchor, From: T0, Next: ptr(T0.Add(time.Hour)),
		Runs: []*vibejobs.Run{r}})
	c := f.claimIDs("w1", r.ScheduledFor, 1, r)[0]
	f.update(func(tx vibejobs.Tx) error {
		_, err := tx.DeleteFutureRuns(f.ctx, j.ID, T0)
		return err
	})
	f.update(func(tx vibejobs.Tx) error { return tx.DeleteJob(f.ctx, projectA, j.ID, T0.Add(500*time.Millisecond)) })

	now := r.ScheduledFor.Add(c.Timeout + Margin + time.Millisecond)
	if n, err := f.s.RecoverExpiredLeases(f.ctx, now, 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v; want 1", n, err)
	}
	got := f.getRun(projectA, r.ID)
	f.wantEnded("recovered withdrawn run of a deleted job", got, vibejobs.RunCancelled, vibejobs.ReasonJobDeleted, now)
	f.wantAttempts("recovered withdrawn run of a deleted job", got, "1:interrupted")
	if cs := f.claim("w2", now.Add(time.Hour), 10); len(cs) != 0 {
		t.Errorf("claim after recovery: %v, want none", claimedIDs(cs))
	}
}

func testLastRun(t *testing.T, f *fixture) {
	f.projects()
	j := f.job(projectA)
	if got := f.getJob(projectA, j.ID); got.LastRun != nil {
		t.Fatalf("LastRun of a job without runs: %+v, want nil", got.LastRun)
	}
	// A run materialised ahead of time and not started is not the last run.
	f.run(j, T0.Add(time.Hour))
	if got := f.getJob(projectA, j.ID); got.LastRun != nil {
		t.Fatalf("LastRun with only an unstarted future run: %+v, want nil", got.LastRun)
	}

	first := f.claimOne(j, "w1")
	wantLast := func(what string, r *vibejobs.Run, state vibejobs.RunState) {
		t.Helper()
		want := &vibejobs.RunRef{ID: r.ID, State: state, ScheduledFor: r.ScheduledFor}
		wantEqual(t, what+": GetJob LastRun", f.getJob(projectA, j.ID).LastRun, want)
		jobs, _, err := f.s.ListJobs(f.ctx, projectA, vibejobs.Page{})
		if err != nil || len(jobs) != 1 {
			t.Fatalf("ListJobs: %d jobs, %v", len(jobs), err)
		}
		wantEqual(t, what+": ListJobs LastRun", jobs[0].LastRun, want)
	}
	wantLast("one run in flight", first.Run, vibejobs.RunDelivering)

	second := f.claimOne(j, "w1")
	f.record("w1", succeeded(second, second.Run.ScheduledFor, second.Run.ScheduledFor.Add(time.Second)))
	wantLast("a later run succeeded", second.Run, vibejobs.RunSucceeded)

	// The latest scheduledFor wins, not the latest created or started.
	early := f.run(j, T0.Add(-20*time.Hour))
	f.claimIDs("w1", T0.Add(-20*time.Hour), 1, early)
	wantLast("an earlier occurrence started late", second.Run, vibejobs.RunSucceeded)
}

func testSecretRotation(t *testing.T, f *fixture) {
	f.projects()
	j1 := f.job(projectA, func(j *vibejobs.Job) { j.Secret.KeyID = "old" })
	j2 := f.job(projectB, func(j *vibejobs.Job) { j.Secret.KeyID = "new" })
	j3 := f.job(projectA, func(j *vibejobs.Job) { j.Secret.KeyID = "older" })
	f.update(func(tx vibejobs.Tx) error { return tx.DeleteJob(f.ctx, projectA, j3.ID, T0) })
	_ = j2

	var got []*vibejobs.Job
	f.update(func(tx vibejobs.Tx) error {
		var err error
		got, err = tx.SecretsNotUnder(f.ctx, "new", 10)
		return err
	})
	ids := jobIDs(got)
	slices.Sort(ids)
	if want := []string{j1.ID, j3.ID}; !slices.Equal(ids, want) {
		t.Fatalf("SecretsNotUnder(new) = %v, want %v (deleted jobs included)", ids, want)
	}
	for _, j := range got {
		if j.ID == j1.ID {
			wantEqual(t, "secret listed for rotation", j.Secret, j1.Secret)
		}
	}
	f.update(func(tx vibejobs.Tx) error {
		one, err := tx.SecretsNotUnder(f.ctx, "new", 1)
		if len(one) != 1 {
			t.Errorf("SecretsNotUnder with limit 1: %d jobs", len(one))
		}
		return err
	})

	resealed := vibejobs.SealedSecret{KeyID: "new", Ciphertext: []byte{9, 0, 9}}
	f.update(func(tx vibejobs.Tx) error {
		if err := tx.SetJobSecret(f.ctx, j1.ID, resealed); err != nil {
			return err
		}
		return tx.SetJobSecret(f.ctx, j3.ID, resealed)
	})
	wantEqual(t, "secret after SetJobSecret", f.getJob(projectA, j1.ID).Secret, resealed)
	f.update(func(tx vibejobs.Tx) error {
		left, err := tx.SecretsNotUnder(f.ctx, "new", 10)
		if len(left) != 0 {
			t.Errorf("SecretsNotUnder after resealing: %v", jobIDs(left))
		}
		return err
	})
	err := f.s.Update(f.ctx, func(tx vibejobs.Tx) error { return tx.SetJobSecret(f.ctx, "job_missing", resealed) })
	wantNotFound(t, "SetJobSecret of a missing job", err, "job")
}

// testMasterKey: the first RecordMasterKey records its key and later ones
// return it, also when they race; a rolled-back record leaves none; and
// SetMasterKey replaces the recorded key.
func testMasterKey(t *testing.T, f *fixture) {
	record := func(keyID string) (string, error) {
		var got string
		err := f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
			var err error
			got, err = tx.RecordMasterKey(f.ctx, keyID)
			return err
		})
		return got, err
	}
	err := f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
		if _, err := tx.RecordMasterKey(f.ctx, "rolledback"); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("Update returned %v, want the error of fn", err)
	}

	const n = 8
	var wg sync.WaitGroup
	got := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { got[i], errs[i] = record(fmt.Sprintf("key%d", i)) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("RecordMasterKey(key%d): %v", i, errs[i])
		}
		if got[i] != got[0] || !strings.HasPrefix(got[0], "key") {
			t.Fatalf("concurrent first RecordMasterKey calls returned %q: want one of their keys, the same for all", got)
		}
	}
	if id, err := record("other"); err != nil || id != got[0] {
		t.Fatalf("RecordMasterKey(other) once %s is recorded = %q, %v", got[0], id, err)
	}
	f.update(func(tx vibejobs.Tx) error { return tx.SetMasterKey(f.ctx, "rotated") })
	if id, err := record("other"); err != nil || id != "rotated" {
		t.Fatalf("RecordMasterKey(other) after SetMasterKey(rotated) = %q, %v", id, err)
	}
}

// testCountJobs: CountJobs counts a project's live jobs through creates and
// deletes, in and after their transaction, and not a rolled-back create or
// another project's jobs.
func testCountJobs(t *testing.T, f *fixture) {
	f.projects()
	count := func(r vibejobs.Reader, what string, want int) {
		t.Helper()
		if n, err := r.CountJobs(f.ctx, projectA); err != nil || n != want {
			t.Errorf("CountJobs %s = %d, %v; want %d", what, n, err, want)
		}
	}
	count(f.s, "of a new project", 0)
	jobs := []*vibejobs.Job{f.job(projectA), f.job(projectA), f.job(projectA)}
	f.job(projectB)
	count(f.s, "after three creates", 3)
	f.update(func(tx vibejobs.Tx) error {
		if err := tx.DeleteJob(f.ctx, projectA, jobs[0].ID, T0); err != nil {
			return err
		}
		count(tx, "in the deleting transaction", 2)
		if err := tx.CreateJob(f.ctx, f.newJob(projectA)); err != nil {
			return err
		}
		count(tx, "after a create in the same transaction", 3)
		return nil
	})
	count(f.s, "after the delete and the create", 3)
	rollback := errors.New("roll back")
	if err := f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
		if err := tx.CreateJob(f.ctx, f.newJob(projectA)); err != nil {
			return err
		}
		return rollback
	}); !errors.Is(err, rollback) {
		t.Fatalf("Update = %v, want the rollback", err)
	}
	count(f.s, "after a rolled-back create", 3)
	if err := f.s.Update(f.ctx, func(tx vibejobs.Tx) error {
		return tx.DeleteJob(f.ctx, projectA, jobs[0].ID, T0)
	}); err == nil {
		t.Fatalf("deleting a deleted job succeeded")
	}
	count(f.s, "after deleting a deleted job", 3)
}
