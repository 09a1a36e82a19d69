package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/postgres"
	"github.com/vibejobs/vibejobs/internal/storetest"
)

// t0 is the tests' clock: the stores are given it so nothing depends on the
// wall clock.
var t0 = time.Date(2026, 10, 9, 9, 0, 0, 0, time.UTC)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func open(t testing.TB, schema string) *postgres.Store {
	t.Helper()
	return postgres.MustOpenTestWith(t, postgres.Options{Schema: schema, Logger: quiet, Now: func() time.Time { return t0 }})
}

// replicas opens n stores on one fresh schema, as n processes would.
func replicas(t testing.TB, n int) []*postgres.Store {
	t.Helper()
	schema := postgres.NewTestSchema(t)
	stores := make([]*postgres.Store, n)
	for i := range stores {
		stores[i] = open(t, schema)
	}
	return stores
}

var idSeq atomic.Int64

// id returns a unique id with prefix that sorts by creation.
func id(prefix string) string {
	return fmt.Sprintf("%s%012x%016x", prefix, t0.UnixMilli(), idSeq.Add(1))
}

func mustUpdate(t testing.TB, s *postgres.Store, fn func(tx vibejobs.Tx) error) {
	t.Helper()
	if err := s.Update(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}

func newProject(t testing.TB, s *postgres.Store) string {
	t.Helper()
	p := &vibejobs.Project{ID: id("prj_"), Name: "test", CreatedAt: t0}
	mustUpdate(t, s, func(tx vibejobs.Tx) error { return tx.CreateProject(context.Background(), p) })
	return p.ID
}

func jobFor(projectID string) *vibejobs.Job {
	next := t0
	return &vibejobs.Job{
		ID: id("job_"), ProjectID: projectID, Name: "every second", Schedule: "@every 1s", Timezone: "UTC",
		URL: "https://example.test/hook", Enabled: true, State: vibejobs.JobActive,
		Retry: vibejobs.DefaultRetryPolicy(), Timeout: 10 * time.Second, CatchUp: vibejobs.CatchUpAll,
		ScheduleAnchor: t0, NextRunAt: &next,
		Secret:    vibejobs.SealedSecret{KeyID: "k1", Ciphertext: []byte("sealed")},
		CreatedAt: t0, UpdatedAt: t0,
	}
}

func newJobs(t testing.TB, s *postgres.Store, projectID string, n int) []*vibejobs.Job {
	t.Helper()
	jobs := make([]*vibejobs.Job, n)
	mustUpdate(t, s, func(tx vibejobs.Tx) error {
		for i := range jobs {
			jobs[i] = jobFor(projectID)
			if err := tx.CreateJob(context.Background(), jobs[i]); err != nil {
				return err
			}
		}
		return nil
	})
	return jobs
}

// planFor makes the plan of job j: a run per occurrence in ats, the schedule
// continuing after the last.
func planFor(j *vibejobs.Job, ats ...time.Time) vibejobs.RunPlan {
	p := vibejobs.RunPlan{JobID: j.ID, Anchor: j.ScheduleAnchor, From: *j.NextRunAt}
	for _, at := range ats {
		p.Runs = append(p.Runs, vibejobs.NewRun(id("run_"), j, vibejobs.TriggerSchedule, at, t0))
	}
	next := ats[len(ats)-1].Add(time.Second)
	p.Next = &next
	return p
}

func wantKind(t *testing.T, err error, kind, code string) {
	t.Helper()
	var e *vibejobs.Error
	if !errors.As(err, &e) || e.Kind != kind || (code != "" && e.Code != code) {
		t.Fatalf("error = %v, want kind %s code %s", err, kind, code)
	}
}

func TestRunLifecycle(t *testing.T) {
	ctx := context.Background()
	s := open(t, "")
	prj := newProject(t, s)
	j := newJobs(t, s, prj, 1)[0]

	// Two occurrences: the first is 2 min old when claimed (late), the second on time.
	late, onTime := t0.Add(-2*time.Minute), t0
	plan := planFor(j, late, onTime)
	plan.From = *j.NextRunAt
	n, _, err := s.ApplyRunPlans(ctx, []vibejobs.RunPlan{plan}, t0)
	if err != nil || n != 2 {
		t.Fatalf("ApplyRunPlans = %d, %v; want 2", n, err)
	}
	// The same plan again: the job moved on, nothing happens.
	if n, _, err := s.ApplyRunPlans(ctx, []vibejobs.RunPlan{plan}, t0); err != nil || n != 0 {
		t.Fatalf("ApplyRunPlans again = %d, %v; want 0", n, err)
	}
	got, err := s.GetJob(ctx, prj, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !got.NextRunAt.Equal(*plan.Next) || got.LastRun != nil {
		t.Fatalf("job after plan: next %v last %v", got.NextRunAt, got.LastRun)
	}
	if at, ok, err := s.NextDueAt(ctx); err != nil || !ok || !at.Equal(late) {
		t.Fatalf("NextDueAt = %v %v %v, want %v", at, ok, err, late)
	}

	claims, err := s.ClaimDueRuns(ctx, "a", t0, 10, 5*time.Second)
	if err != nil || len(claims) != 2 {
		t.Fatalf("ClaimDueRuns = %d, %v", len(claims), err)
	}
	c := claims[0]
	if c.Run.ID != plan.Runs[0].ID || c.Run.Attempt != 1 || !c.Run.Late || c.Run.State != vibejobs.RunDelivering ||
		c.URL != j.URL || c.Timeout != j.Timeout || c.Retry != j.Retry || string(c.Secret.Ciphertext) != "sealed" {
		t.Fatalf("first claim = %+v %+v", c, c.Run)
	}
	if claims[1].Run.Late || c.Run.ScheduledFor.Location() != time.UTC {
		t.Fatalf("second claim late = %v, location %v", claims[1].Run.Late, c.Run.ScheduledFor.Location())
	}
	if more, _ := s.ClaimDueRuns(ctx, "b", t0, 10, time.Second); len(more) != 0 {
		t.Fatalf("claimed twice: %d", len(more))
	}

	// Attempt 1 of the first run fails and retries in 30 s; the second succeeds.
	retryAt := t0.Add(30 * time.Second)
	out := []vibejobs.Outcome{
		{RunID: c.Run.ID, ClaimedAt: c.ClaimedAt, Attempt: vibejobs.Attempt{Number: 1, StartedAt: t0, FinishedAt: t0.Add(time.Second),
			StatusCode: 500, ErrorCode: "http_5xx", SignatureTimestamp: t0.Unix(), ResponseSnippet: "oops\x00\xff"},
			Step: vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: &retryAt}},
		{RunID: claims[1].Run.ID, ClaimedAt: claims[1].ClaimedAt, Attempt: vibejobs.Attempt{Number: 1, StartedAt: t0, FinishedAt: t0.Add(time.Second),
			StatusCode: 200, SignatureTimestamp: t0.Unix()},
			Step: vibejobs.Step{State: vibejobs.RunSucceeded}},
	}
	if err := s.RecordOutcomes(ctx, "a", out); err != nil {
		t.Fatal(err)
	}
	// A stale copy of the same outcome (the lease is gone) changes nothing.
	if err := s.RecordOutcomes(ctx, "a", out[:1]); err != nil {
		t.Fatal(err)
	}
	r1, err := s.GetRun(ctx, prj, c.Run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r1.State != vibejobs.RunRetrying || !r1.NextAttemptAt.Equal(retryAt) || len(r1.Attempts) != 1 ||
		r1.Attempts[0].ResponseSnippet != "oops\x00\xff" || r1.Attempts[0].ErrorCode != "http_5xx" {
		t.Fatalf("run after retry = %+v", r1)
	}
	r2, _ := s.GetRun(ctx, prj, claims[1].Run.ID)
	if r2.State != vibejobs.RunSucceeded || r2.FinishedAt == nil || !r2.FinishedAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("second run = %+v", r2)
	}
	got, _ = s.GetJob(ctx, prj, j.ID)
	if got.LastRun == nil || got.LastRun.ID != r2.ID || got.LastRun.State != vibejobs.RunSucceeded {
		t.Fatalf("LastRun = %+v, want %s", got.LastRun, r2.ID)
	}

	// Attempt 2 is claimed and its process dies: the lease expires, the attempt
	// is recorded interrupted and sent again as attempt 2.
	now := retryAt
	claims, err = s.ClaimDueRuns(ctx, "a", now, 10, 5*time.Second)
	if err != nil || len(claims) != 1 || claims[0].Run.Attempt != 2 || !claims[0].Run.Late {
		t.Fatalf("claim of attempt 2 = %v %v", claims, err)
	}
	dead := claims[0]
	if n, err := s.RecoverExpiredLeases(ctx, now.Add(15*time.Second), 10); err != nil || n != 0 {
		t.Fatalf("recovered a live lease: %d %v", n, err)
	}
	now = now.Add(16 * time.Second)
	if n, err := s.RecoverExpiredLeases(ctx, now, 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v", n, err)
	}
	claims, err = s.ClaimDueRuns(ctx, "b", now, 10, 5*time.Second)
	if err != nil || len(claims) != 1 || claims[0].Run.Attempt != 2 {
		t.Fatalf("redelivery claim = %v %v", claims, err)
	}
	// The dead process's outcome arrives late: dropped.
	stale := vibejobs.Outcome{RunID: c.Run.ID, ClaimedAt: dead.ClaimedAt, Attempt: vibejobs.Attempt{Number: 2, StartedAt: retryAt, FinishedAt: now},
		Step: vibejobs.Step{State: vibejobs.RunSucceeded}}
	if err := s.RecordOutcomes(ctx, "a", []vibejobs.Outcome{stale}); err != nil {
		t.Fatal(err)
	}
	fresh := vibejobs.Outcome{RunID: c.Run.ID, ClaimedAt: claims[0].ClaimedAt, Attempt: vibejobs.Attempt{Number: 2, StartedAt: now, FinishedAt: now.Add(time.Second), StatusCode: 204},
		Step: vibejobs.Step{State: vibejobs.RunSucceeded}}
	if err := s.RecordOutcomes(ctx, "b", []vibejobs.Outcome{fresh}); err != nil {
		t.Fatal(err)
	}
	r1, _ = s.GetRun(ctx, prj, c.Run.ID)
	var codes []string
	for _, a := range r1.Attempts {
		codes = append(codes, fmt.Sprintf("%d:%s:%d", a.Number, a.ErrorCode, a.StatusCode))
	}
	if r1.State != vibejobs.RunSucceeded || fmt.Sprint(codes) != "[1:http_5xx:500 2:interrupted:0 2::204]" {
		t.Fatalf("run = %s attempts %v", r1.State, codes)
	}
	if r1.Attempts[1].StartedAt != retryAt || r1.Attempts[1].SignatureTimestamp != 0 {
		t.Fatalf("interrupted attempt = %+v", r1.Attempts[1])
	}
	if _, ok, _ := s.NextDueAt(ctx); ok {
		t.Fatal("NextDueAt found a run in an empty queue")
	}
}

func TestReleaseClaimsKeepsNumberAndRedecidesLate(t *testing.T) {
	ctx := context.Background()
	s := open(t, "")
	prj := newProject(t, s)
	j := newJobs(t, s, prj, 1)[0]
	if _, _, err := s.ApplyRunPlans(ctx, []vibejobs.RunPlan{planFor(j, t0)}, t0); err != nil {
		t.Fatal(err)
	}
	claims, err := s.ClaimDueRuns(ctx, "a", t0, 1, time.Second)
	if err != nil || len(claims) != 1 || claims[0].Run.Late {
		t.Fatalf("claim = %v %v", claims, err)
	}
	if err := s.ReleaseClaims(ctx, "b", claims, t0, t0); err != nil {
		t.Fatal(err) // another owner's release does nothing
	}
	if more, _ := s.ClaimDueRuns(ctx, "b", t0, 1, time.Second); len(more) != 0 {
		t.Fatal("a release by another owner freed the run")
	}
	later := t0.Add(2 * time.Minute)
	if err := s.ReleaseClaims(ctx, "a", claims, later, later); err != nil {
		t.Fatal(err)
	}
	// Due at once, in its place in line: at the due time of its claim.
	r, _ := s.GetRun(ctx, prj, claims[0].Run.ID)
	if r.State != vibejobs.RunScheduled || !r.NextAttemptAt.Equal(t0) || len(r.Attempts) != 0 {
		t.Fatalf("released run = %+v", r)
	}
	claims, err = s.ClaimDueRuns(ctx, "b", later, 1, time.Second)
	if err != nil || len(claims) != 1 || claims[0].Run.Attempt != 1 || !claims[0].Run.Late {
		t.Fatalf("claim after release = %+v %v", claims[0].Run, err)
	}
}

func TestDeleteJob(t *testing.T) {
	ctx := context.Background()
	s := open(t, "")
	prj := newProject(t, s)
	j := newJobs(t, s, prj, 1)[0]
	if _, _, err := s.ApplyRunPlans(ctx, []vibejobs.RunPlan{planFor(j, t0, t0.Add(time.Second))}, t0); err != nil {
		t.Fatal(err)
	}
	claims, _ := s.ClaimDueRuns(ctx, "a", t0, 1, time.Second)
	if len(claims) != 1 {
		t.Fatal("no claim")
	}
	mustUpdate(t, s, func(tx vibejobs.Tx) error { return tx.DeleteJob(ctx, prj, j.ID, t0) })
	if _, err := s.GetJob(ctx, prj, j.ID); vibejobs.ErrorKind(err) != vibejobs.ENOTFOUND {
		t.Fatalf("GetJob of a deleted job: %v", err)
	}
	if n, _ := s.CountJobs(ctx, prj); n != 0 {
		t.Fatalf("CountJobs = %d", n)
	}
	err := s.Update(ctx, func(tx vibejobs.Tx) error {
		return tx.CreateRun(ctx, vibejobs.NewRun(id("run_"), j, vibejobs.TriggerManual, t0, t0))
	})
	wantKind(t, err, vibejobs.ENOTFOUND, "job_not_found")
	runs, _, err := s.ListRuns(ctx, prj, vibejobs.RunFilter{JobID: j.ID}, vibejobs.Page{})
	if err != nil || len(runs) != 2 {
		t.Fatalf("ListRuns = %d %v", len(runs), err)
	}
	for _, r := range runs {
		if r.ID != claims[0].Run.ID && (r.State != vibejobs.RunCancelled || r.FailureReason != vibejobs.ReasonJobDeleted || r.FinishedAt == nil) {
			t.Fatalf("waiting run after delete = %+v", r)
		}
	}
	// The attempt in flight finishes; its retry becomes a cancellation.
	next := t0.Add(time.Minute)
	err = s.RecordOutcomes(ctx, "a", []vibejobs.Outcome{{RunID: claims[0].Run.ID, ClaimedAt: claims[0].ClaimedAt,
		Attempt: vibejobs.Attempt{Number: 1, StartedAt: t0, FinishedAt: t0.Add(time.Second), StatusCode: 503, ErrorCode: "http_5xx"},
		Step:    vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: &next}}})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := s.GetRun(ctx, prj, claims[0].Run.ID)
	if r.State != vibejobs.RunCancelled || r.FailureReason != vibejobs.ReasonJobDeleted || r.NextAttemptAt != nil || len(r.Attempts) != 1 {
		t.Fatalf("run after its retry on a deleted job = %+v", r)
	}
}

func TestPagesAndErrors(t *testing.T) {
	ctx := context.Background()
	s := open(t, "")
	prj := newProject(t, s)
	jobs := newJobs(t, s, prj, 5)
	var seen []string
	cursor := ""
	for {
		page, next, err := s.ListJobs(ctx, prj, vibejobs.Page{Limit: 2, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range page {
			seen = append(seen, j.ID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if len(seen) != 5 || seen[0] != jobs[0].ID || seen[4] != jobs[4].ID {
		t.Fatalf("pages = %v", seen)
	}
	_, _, err := s.ListJobs(ctx, prj, vibejobs.Page{Limit: 101})
	wantKind(t, err, vibejobs.EINVALID, "invalid_limit")
	_, _, err = s.ListRuns(ctx, prj, vibejobs.RunFilter{}, vibejobs.Page{Limit: -1})
	wantKind(t, err, vibejobs.EINVALID, "invalid_limit")
	_, _, err = s.ListJobs(ctx, prj, vibejobs.Page{Cursor: "not a cursor!"})
	wantKind(t, err, vibejobs.EINVALID, "invalid_cursor")
	_, err = s.GetJob(ctx, "prj_other", jobs[0].ID)
	wantKind(t, err, vibejobs.ENOTFOUND, "job_not_found")
	_, err = s.GetRun(ctx, prj, "run_nope")
	wantKind(t, err, vibejobs.ENOTFOUND, "run_not_found")
	// Text PostgreSQL cannot hold is the caller's error, not an internal one.
	_, err = s.GetRun(ctx, prj, "run_\x00")
	wantKind(t, err, vibejobs.EINVALID, "invalid_text")
	bad := jobFor(prj)
	bad.Name = "not \xff UTF-8"
	err = s.Update(ctx, func(tx vibejobs.Tx) error { return tx.CreateJob(ctx, bad) })
	wantKind(t, err, vibejobs.EINVALID, "invalid_text")
	err = s.Update(ctx, func(tx vibejobs.Tx) error { return tx.CreateJob(ctx, jobs[0]) })
	wantKind(t, err, vibejobs.ECONFLICT, "job_exists")
	// A conflict leaves the transaction usable, as on SQLite.
	extra := jobFor(prj)
	mustUpdate(t, s, func(tx vibejobs.Tx) error {
		if err := tx.CreateJob(ctx, jobs[0]); vibejobs.ErrorKind(err) != vibejobs.ECONFLICT {
			return fmt.Errorf("duplicate CreateJob: %v", err)
		}
		return tx.CreateJob(ctx, extra)
	})
	if _, err := s.GetJob(ctx, prj, extra.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(ctx, func(tx vibejobs.Tx) error { return tx.CreateJob(ctx, jobFor("prj_missing")) }); vibejobs.ErrorKind(err) != vibejobs.ENOTFOUND {
		t.Fatalf("CreateJob in a missing project: %v", err)
	}
	mustUpdate(t, s, func(tx vibejobs.Tx) error { return tx.DeleteJob(ctx, prj, extra.ID, t0) })

	// Runs list newest first.
	var plans []vibejobs.RunPlan
	for _, j := range jobs {
		plans = append(plans, planFor(j, t0))
	}
	if n, _, err := s.ApplyRunPlans(ctx, plans, t0); err != nil || n != 5 {
		t.Fatalf("ApplyRunPlans = %d %v", n, err)
	}
	runs, next, err := s.ListRuns(ctx, prj, vibejobs.RunFilter{State: vibejobs.RunScheduled}, vibejobs.Page{Limit: 3})
	if err != nil || len(runs) != 3 || next == "" || runs[0].ID != plans[4].Runs[0].ID {
		t.Fatalf("ListRuns = %d %q %v", len(runs), next, err)
	}
	runs, next, err = s.ListRuns(ctx, prj, vibejobs.RunFilter{State: vibejobs.RunScheduled}, vibejobs.Page{Limit: 3, Cursor: next})
	if err != nil || len(runs) != 2 || next != "" || runs[1].ID != plans[0].Runs[0].ID {
		t.Fatalf("ListRuns page 2 = %d %q %v", len(runs), next, err)
	}
}

func TestIdempotencyKeys(t *testing.T) {
	ctx := context.Background()
	s := open(t, "")
	prj := newProject(t, s)
	rec := &vibejobs.IdempotencyRecord{ProjectID: prj, Key: "k", RequestHash: []byte{1}, CreatedAt: t0, ExpiresAt: t0.Add(24 * time.Hour)}
	mustUpdate(t, s, func(tx vibejobs.Tx) error { return tx.InsertIdempotencyKey(ctx, rec) })
	err := s.Update(ctx, func(tx vibejobs.Tx) error {
		if err := tx.InsertIdempotencyKey(ctx, rec); err != nil {
			return err
		}
		return errors.New("unreachable")
	})
	wantKind(t, err, vibejobs.ECONFLICT, "idempotency_key_exists")
	rec.ResponseStatus, rec.ResponseHeaders, rec.ResponseBody = 201, map[string]string{"Location": "/v1/jobs/x\u0000"}, []byte("{}")
	mustUpdate(t, s, func(tx vibejobs.Tx) error { return tx.CompleteIdempotencyKey(ctx, rec) })
	got, err := s.GetIdempotencyKey(ctx, prj, "k", t0)
	if err != nil || !got.Done || got.ResponseStatus != 201 || got.ResponseHeaders["Location"] != "/v1/jobs/x\u0000" {
		t.Fatalf("GetIdempotencyKey = %+v %v", got, err)
	}
	_, err = s.GetIdempotencyKey(ctx, prj, "k", t0.Add(24*time.Hour))
	wantKind(t, err, vibejobs.ENOTFOUND, "")
	// Expired: replaced by a new record.
	rec2 := &vibejobs.IdempotencyRecord{ProjectID: prj, Key: "k", RequestHash: []byte{2}, CreatedAt: t0.Add(25 * time.Hour), ExpiresAt: t0.Add(49 * time.Hour)}
	mustUpdate(t, s, func(tx vibejobs.Tx) error { return tx.InsertIdempotencyKey(ctx, rec2) })
	got, err = s.GetIdempotencyKey(ctx, prj, "k", rec2.CreatedAt)
	if err != nil || got.Done || got.RequestHash[0] != 2 {
		t.Fatalf("replaced record = %+v %v", got, err)
	}
	if n, err := s.PruneIdempotencyKeys(ctx, t0.Add(50*time.Hour), 10); err != nil || n != 1 {
		t.Fatalf("PruneIdempotencyKeys = %d %v", n, err)
	}
}

// keyClaim is an in-progress claim of key "k" of prj made at "at".
func keyClaim(prj string, at time.Time) *vibejobs.IdempotencyRecord {
	return &vibejobs.IdempotencyRecord{ProjectID: prj, Key: "k", RequestHash: []byte{1}, CreatedAt: at, ExpiresAt: at.Add(24 * time.Hour)}
}

// takeover is what the API's takeover of a claim of key "k" saw.
type takeover struct {
	read                time.Time // creation time of the claim it read
	readDone            bool      // the claim it read was completed
	delErr, insErr, err error
}

// takeOverKey is the API's takeover of an abandoned claim of key "k", in
// one transaction on s at "at": read the claim, delete it by its creation
// time, insert its own. held runs just before the commit.
func takeOverKey(s *postgres.Store, prj string, at time.Time, held func()) (o takeover) {
	ctx := context.Background()
	o.err = s.Update(ctx, func(tx vibejobs.Tx) error {
		rec, err := tx.GetIdempotencyKey(ctx, prj, "k", at)
		if err != nil {
			return err
		}
		o.read, o.readDone = rec.CreatedAt, rec.Done
		o.delErr = tx.DeleteIdempotencyKey(ctx, prj, "k", rec.CreatedAt)
		if o.insErr = tx.InsertIdempotencyKey(ctx, keyClaim(prj, at)); o.insErr != nil {
			return o.insErr
		}
		held()
		return nil
	})
	return o
}

// commitGate holds a transaction just before its commit (hold, called in
// it) until open is called, or the test ends: a failing test must not leave
// the transaction open.
type commitGate struct {
	reached, commit chan struct{}
	once            sync.Once
}

func newCommitGate(t *testing.T) *commitGate {
	g := &commitGate{reached: make(chan struct{}, 1), commit: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

func (g *commitGate) hold() {
	g.reached <- struct{}{}
	<-g.commit
}

func (g *commitGate) open() { g.once.Do(func() { close(g.commit) }) }

// TestIdempotencyTakeoverRace: two requests take one abandoned claim over
// at once, as the API does. The slower one waits on the faster one's
// delete, then finds nothing left to delete and meets the faster one's
// claim (ECONFLICT), which the API answers as in progress. The faster one's
// claim stands.
func TestIdempotencyTakeoverRace(t *testing.T) {
	ctx := context.Background()
	schema := postgres.NewTestSchema(t)
	a, b := open(t, schema), open(t, schema)
	prj := newProject(t, a)
	mustUpdate(t, a, func(tx vibejobs.Tx) error { return tx.InsertIdempotencyKey(ctx, keyClaim(prj, t0)) })
	faster, slower := t0.Add(61*time.Second), t0.Add(62*time.Second)

	gate := newCommitGate(t)
	firstDone, secondDone := make(chan takeover, 1), make(chan takeover, 1)
	go func() { firstDone <- takeOverKey(a, prj, faster, gate.hold) }()
	waitSignal(t, gate.reached, "the faster takeover")
	go func() { secondDone <- takeOverKey(b, prj, slower, func() {}) }()
	// The slower delete waits for the faster transaction's row lock.
	waitForLockWait(t, a, "DELETE FROM idempotency_keys", "the slower takeover never waited for the faster one")
	gate.open()
	if first := <-firstDone; first.err != nil || first.delErr != nil {
		t.Fatalf("faster takeover: %v (delete: %v)", first.err, first.delErr)
	}
	second := <-secondDone
	if !second.read.Equal(t0) {
		t.Errorf("the slower takeover read the claim of %s, want the abandoned one of %s", second.read, t0)
	}
	wantKind(t, second.delErr, vibejobs.ENOTFOUND, "")
	wantKind(t, second.err, vibejobs.ECONFLICT, "idempotency_key_exists")
	got, err := a.GetIdempotencyKey(ctx, prj, "k", slower)
	if err != nil || !got.CreatedAt.Equal(faster) || got.Done {
		t.Fatalf("the key after the race = %+v, %v; want the faster claim, in progress", got, err)
	}
}

// TestIdempotencyTakeoverOfACompletingClaim: a request slower than the
// takeover limit completes its claim (with its effect, in one transaction)
// while another request with the key takes the claim over. The takeover's
// delete waits for the completing transaction's row lock and, once that
// commits, must leave the completed record alone: deleting it would let
// the takeover run the effect a second time under the same key.
func TestIdempotencyTakeoverOfACompletingClaim(t *testing.T) {
	ctx := context.Background()
	schema := postgres.NewTestSchema(t)
	a, b := open(t, schema), open(t, schema)
	prj := newProject(t, a)
	claim := keyClaim(prj, t0)
	mustUpdate(t, a, func(tx vibejobs.Tx) error { return tx.InsertIdempotencyKey(ctx, claim) })

	gate := newCommitGate(t)
	slowDone := make(chan error, 1)
	go func() {
		slowDone <- a.Update(ctx, func(tx vibejobs.Tx) error {
			done := *claim
			done.Done, done.ResponseStatus, done.ResponseBody = true, 201, []byte(`{"id":"job_1"}`)
			if err := tx.CompleteIdempotencyKey(ctx, &done); err != nil {
				return err
			}
			gate.hold()
			return nil
		})
	}()
	waitSignal(t, gate.reached, "the slow request's completion")

	at := t0.Add(61 * time.Second)
	takeoverDone := make(chan takeover, 1)
	go func() { takeoverDone <- takeOverKey(b, prj, at, func() {}) }()
	waitForLockWait(t, a, "DELETE FROM idempotency_keys", "the takeover never waited for the completing transaction")
	gate.open()
	if err := <-slowDone; err != nil {
		t.Fatalf("completing the slow request's claim: %v", err)
	}
	o := <-takeoverDone
	if !o.read.Equal(t0) || o.readDone {
		t.Errorf("the takeover read the claim of %s (completed: %v), want the slow request's of %s, in progress", o.read, o.readDone, t0)
	}
	wantKind(t, o.delErr, vibejobs.ENOTFOUND, "")
	wantKind(t, o.err, vibejobs.ECONFLICT, "idempotency_key_exists")
	got, err := a.GetIdempotencyKey(ctx, prj, "k", at)
	if err != nil || !got.Done || got.ResponseStatus != 201 || !got.CreatedAt.Equal(t0) {
		t.Fatalf("the key after the race = %+v, %v; want the slow request's completed record", got, err)
	}
}

// TestIdempotencyAgeOnTheDatabaseClock: a claim's Age is the database
// server's clock since the claim, and nothing else. Two replicas whose
// clocks are ten minutes apart, both months away from the server's (t0),
// read a claim one of them just made as fresh, in and out of a
// transaction; measured on their clocks against CreatedAt, the one ahead
// took it for ten minutes old and took over a request still in progress.
// Once the server's clock says 61 s passed, both read it as 61 s old,
// whatever their clocks say. A claim replacing an expired record starts
// afresh.
func TestIdempotencyAgeOnTheDatabaseClock(t *testing.T) {
	ctx := context.Background()
	schema := postgres.NewTestSchema(t)
	a, b := open(t, schema), open(t, schema)
	prj := newProject(t, a)
	claim := keyClaim(prj, t0) // made by a, its clock at t0
	mustUpdate(t, a, func(tx vibejobs.Tx) error { return tx.InsertIdempotencyKey(ctx, claim) })

	type read struct {
		what string
		s    *postgres.Store
		now  time.Time
		inTx bool
	}
	reads := []read{
		{"the claiming replica", a, t0, false},
		{"a replica 10 min ahead", b, t0.Add(10 * time.Minute), false},
		{"a replica 10 min ahead, in a transaction", b, t0.Add(10 * time.Minute), true},
		{"a replica 10 min behind", b, t0.Add(-10 * time.Minute), false},
	}
	wantAge := func(when string, key *vibejobs.IdempotencyRecord, min, max time.Duration) {
		t.Helper()
		for _, r := range reads {
			var rec *vibejobs.IdempotencyRecord
			var err error
			if r.inTx {
				err = r.s.Update(ctx, func(tx vibejobs.Tx) error {
					rec, err = tx.GetIdempotencyKey(ctx, prj, "k", r.now)
					return err
				})
			} else {
				rec, err = r.s.GetIdempotencyKey(ctx, prj, "k", r.now)
			}
			if err != nil {
				t.Fatalf("%s: reading the claim as %s: %v", when, r.what, err)
			}
			if !rec.CreatedAt.Equal(key.CreatedAt) || rec.Age < min || rec.Age >= max {
				t.Errorf("%s: %s read the claim of %s, Age %v; want the claim of %s, Age in [%v, %v)",
					when, r.what, rec.CreatedAt, rec.Age, key.CreatedAt, min, max)
			}
		}
	}
	wantAge("just claimed", claim, 0, 10*time.Second)
	postgres.AgeIdempotencyClaim(t, a, prj, "k", 61*time.Second)
	wantAge("61 s later by the server's clock", claim, 61*time.Second, 71*time.Second)

	// Once the record expires (expiry still goes by the replicas' clocks),
	// a new claim replaces it, and its age counts from the replacement.
	fresh := keyClaim(prj, claim.ExpiresAt)
	mustUpdate(t, b, func(tx vibejobs.Tx) error { return tx.InsertIdempotencyKey(ctx, fresh) })
	for i := range reads {
		reads[i].now = reads[i].now.Add(24 * time.Hour)
	}
	wantAge("just replaced", fresh, 0, 10*time.Second)
}

// waitForLockWait waits until a statement of s's database that starts with
// prefix waits for a lock, or fails with msg after 10 s.
func waitForLockWait(t *testing.T, s *postgres.Store, prefix, msg string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !lockWaiting(t, s, prefix); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
	}
}

// lockWaiting reports whether a statement of s's database that starts with
// prefix waits for a lock.
func lockWaiting(t *testing.T, s *postgres.Store, prefix string) bool {
	t.Helper()
	var waiting int
	err := s.Pool().QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND starts_with(query, $1)`, prefix).Scan(&waiting)
	if err != nil {
		t.Fatal(err)
	}
	return waiting > 0
}

// TestClaimExclusive: 8 claimers on two Stores (replicas) share 3,000 due
// runs; SKIP LOCKED hands each run to exactly one of them.
func TestClaimExclusive(t *testing.T) {
	ctx := context.Background()
	schema := postgres.NewTestSchema(t)
	a, b := open(t, schema), open(t, schema)
	prj := newProject(t, a)
	jobs := newJobs(t, a, prj, 30)
	var plans []vibejobs.RunPlan
	for _, j := range jobs {
		var ats []time.Time
		for i := range 100 {
			ats = append(ats, t0.Add(time.Duration(i-100)*time.Second))
		}
		plans = append(plans, planFor(j, ats...))
	}
	if n, _, err := a.ApplyRunPlans(ctx, plans, t0); err != nil || n != 3000 {
		t.Fatalf("ApplyRunPlans = %d %v", n, err)
	}
	var (
		mu      sync.Mutex
		claimed = map[string]string{}
		wg      sync.WaitGroup
	)
	for w := range 8 {
		s := []*postgres.Store{a, b}[w%2]
		owner := fmt.Sprintf("w%d", w)
		wg.Go(func() {
			for {
				claims, err := s.ClaimDueRuns(ctx, owner, t0, 37, time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				if len(claims) == 0 {
					return
				}
				mu.Lock()
				for _, c := range claims {
					if prev, ok := claimed[c.Run.ID]; ok {
						t.Errorf("run %s claimed by %s and %s", c.Run.ID, prev, owner)
					}
					claimed[c.Run.ID] = owner
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(claimed) != 3000 {
		t.Fatalf("claimed %d runs, want 3000", len(claimed))
	}
}

// TestApplyRunPlansConcurrent: two Stores plan the same due jobs at once,
// over and over, with different run ids; every occurrence gets exactly one run.
func TestApplyRunPlansConcurrent(t *testing.T) {
	ctx := context.Background()
	schema := postgres.NewTestSchema(t)
	stores := []*postgres.Store{open(t, schema), open(t, schema)}
	prj := newProject(t, stores[0])
	newJobs(t, stores[0], prj, 50)
	const rounds = 20
	var (
		wg      sync.WaitGroup
		created atomic.Int64
	)
	for w := range 4 {
		s := stores[w%2]
		wg.Go(func() {
			for range rounds * 3 {
				due, err := s.DueJobs(ctx, t0.Add(rounds*time.Second), vibejobs.DuePosition{}, 100)
				if err != nil {
					t.Error(err)
					return
				}
				if len(due) == 0 {
					return
				}
				var plans []vibejobs.RunPlan
				for _, j := range due {
					plans = append(plans, planFor(j, *j.NextRunAt))
				}
				n, _, err := s.ApplyRunPlans(ctx, plans, t0)
				if err != nil {
					t.Error(err)
					return
				}
				created.Add(int64(n))
			}
		})
	}
	wg.Wait()
	var total, distinct int
	err := stores[0].Pool().QueryRow(ctx, `SELECT count(*), count(DISTINCT (job_id, scheduled_for)) FROM runs`).Scan(&total, &distinct)
	if err != nil {
		t.Fatal(err)
	}
	want := 50 * (rounds + 1)
	if total != want || distinct != want || created.Load() != int64(want) {
		t.Fatalf("runs %d, distinct occurrences %d, reported created %d; want %d", total, distinct, created.Load(), want)
	}

	// The unique constraint, not the From check, stops a second run of an
	// occurrence: rewind a job and apply its plan again.
	j := jobFor(prj)
	mustUpdate(t, stores[0], func(tx vibejobs.Tx) error { return tx.CreateJob(ctx, j) })
	if n, _, _ := stores[0].ApplyRunPlans(ctx, []vibejobs.RunPlan{planFor(j, t0)}, t0); n != 1 {
		t.Fatalf("first plan created %d", n)
	}
	mustUpdate(t, stores[0], func(tx vibejobs.Tx) error { return tx.UpdateJob(ctx, j) }) // NextRunAt back to t0
	p := planFor(j, t0, t0.Add(time.Second))
	if n, _, err := stores[1].ApplyRunPlans(ctx, []vibejobs.RunPlan{p}, t0); err != nil || n != 1 {
		t.Fatalf("rewound plan created %d, %v; want 1 (the existing occurrence skipped)", n, err)
	}
	err = stores[0].Update(ctx, func(tx vibejobs.Tx) error {
		return tx.CreateRun(ctx, vibejobs.NewRun(id("run_"), j, vibejobs.TriggerSchedule, t0, t0))
	})
	wantKind(t, err, vibejobs.ECONFLICT, "run_exists")
	for range 2 { // manual runs are never merged
		mustUpdate(t, stores[0], func(tx vibejobs.Tx) error {
			return tx.CreateRun(ctx, vibejobs.NewRun(id("run_"), j, vibejobs.TriggerManual, t0, t0))
		})
	}
}

// TestConcurrentMigrate: four replicas start at once on an empty schema.
func TestConcurrentMigrate(t *testing.T) {
	schema := postgres.NewTestSchema(t)
	url := postgres.TestURL(t)
	var wg sync.WaitGroup
	stores := make([]*postgres.Store, 4)
	for i := range stores {
		wg.Go(func() {
			s, err := postgres.Open(context.Background(), url, postgres.Options{Schema: schema, Logger: quiet})
			if err != nil {
				t.Error(err)
				return
			}
			stores[i] = s
			if err := s.Migrate(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for _, s := range stores {
		if s != nil {
			defer s.Close()
		}
	}
	if t.Failed() {
		return
	}
	var applied, distinct int
	err := stores[0].Pool().QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT version_id) FROM goose_db_version WHERE version_id > 0`).Scan(&applied, &distinct)
	if err != nil || applied != distinct || applied == 0 {
		t.Fatalf("goose_db_version: %d rows, %d versions, %v", applied, distinct, err)
	}
}

func waitSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case _, ok := <-ch:
		if !ok {
			t.Fatalf("%s: wakeups closed", what)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no wakeup", what)
	}
}

// nothingOn fails t if ch delivers within 300 ms: what must wake no
// listener, with a wake-up (struct{}) or a job change (its id).
func nothingOn[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case got := <-ch:
		t.Fatalf("%s: unexpected notification %#v", what, got)
	case <-time.After(300 * time.Millisecond):
	}
}

func TestWakeups(t *testing.T) {
	ctx := context.Background()
	schema := postgres.NewTestSchema(t)
	a, b := open(t, schema), open(t, schema)
	other := open(t, "")
	prj := newProject(t, b)
	j := newJobs(t, b, prj, 1)[0]
	oprj := newProject(t, other)
	oj := newJobs(t, other, oprj, 1)[0]

	wctx, cancel := context.WithCancel(ctx)
	wake, _ := a.Notifications(wctx)
	listener := waitListening(t, a, schema)
	waitSignal(t, wake, "once listening")
	nothingOn(t, wake, "idle")

	if _, _, err := b.ApplyRunPlans(ctx, []vibejobs.RunPlan{planFor(j, t0)}, t0); err != nil {
		t.Fatal(err)
	}
	waitSignal(t, wake, "after ApplyRunPlans on another replica")

	if _, _, err := other.ApplyRunPlans(ctx, []vibejobs.RunPlan{planFor(oj, t0)}, t0); err != nil {
		t.Fatal(err)
	}
	nothingOn(t, wake, "runs created in another schema")

	mustUpdate(t, b, func(tx vibejobs.Tx) error {
		for range 3 {
			if err := tx.CreateRun(ctx, vibejobs.NewRun(id("run_"), j, vibejobs.TriggerManual, t0, t0)); err != nil {
				return err
			}
		}
		return nil
	})
	waitSignal(t, wake, "after CreateRun")
	nothingOn(t, wake, "coalesced")

	// Cut the listener's connection: it reconnects, signals, and listens again.
	_, err := b.Pool().Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, listener)
	if err != nil {
		t.Fatal(err)
	}
	waitSignal(t, wake, "after reconnecting")
	claims, err := b.ClaimDueRuns(ctx, "b", t0, 10, time.Second)
	if err != nil || len(claims) == 0 {
		t.Fatalf("claim: %v %v", claims, err)
	}
	nothingOn(t, wake, "claims wake nobody")
	if err := b.ReleaseClaims(ctx, "b", claims[:1], t0, t0); err != nil {
		t.Fatal(err)
	}
	waitSignal(t, wake, "after ReleaseClaims")

	cancel()
	for range wake {
	}
}

// waitListening waits until store schema's listener session is there
// (listening starts asynchronously) and returns its application name.
func waitListening(t *testing.T, s *postgres.Store, schema string) string {
	t.Helper()
	listener := "vibejobs listener " + schema
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		err := s.Pool().QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, listener).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return listener
		}
		if time.Now().After(deadline) {
			t.Fatal("listener never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func wantJobChange(t *testing.T, ch <-chan string, want, what string) {
	t.Helper()
	select {
	case got, ok := <-ch:
		if !ok || got != want {
			t.Fatalf("%s: job change %q (open %v), want %q", what, got, ok, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no job change", what)
	}
}

// TestJobChangeNotifications: a change to a job's delivery settings, or its
// deletion, reaches every replica of the schema once committed, and nothing
// else does; the first session, and one replacing a lost connection,
// report that changes may have been missed.
func TestJobChangeNotifications(t *testing.T) {
	ctx := context.Background()
	schema := postgres.NewTestSchema(t)
	a, b := open(t, schema), open(t, schema)
	other := open(t, "")
	prj := newProject(t, b)
	jobs := newJobs(t, b, prj, 2)
	oj := newJobs(t, other, newProject(t, other), 1)[0]

	wctx, cancel := context.WithCancel(ctx)
	_, changes := a.Notifications(wctx)
	listener := waitListening(t, a, schema)
	// Changes committed before the listener listened went unheard.
	wantJobChange(t, changes, "", "once listening")
	update := func(s *postgres.Store, j *vibejobs.Job, edit func(*vibejobs.Job)) {
		t.Helper()
		edit(j)
		mustUpdate(t, s, func(tx vibejobs.Tx) error { return tx.UpdateJob(ctx, j) })
	}
	j := jobs[0]
	update(b, j, func(j *vibejobs.Job) { j.Name = "renamed"; j.Enabled = false })
	nothingOn(t, changes, "rename and pause")
	update(b, j, func(j *vibejobs.Job) { j.URL = "https://example.test/other" })
	wantJobChange(t, changes, j.ID, "URL changed on another replica")
	update(b, j, func(j *vibejobs.Job) { j.Timeout = 20 * time.Second })
	wantJobChange(t, changes, j.ID, "timeout changed")
	update(b, j, func(j *vibejobs.Job) { j.Retry.MaxAttempts = 2 })
	wantJobChange(t, changes, j.ID, "retry changed")
	update(b, j, func(j *vibejobs.Job) { j.Secret.Ciphertext = []byte("resealed") })
	wantJobChange(t, changes, j.ID, "secret changed")
	update(other, oj, func(j *vibejobs.Job) { j.URL = "https://example.test/other" })
	nothingOn(t, changes, "a job of another schema")
	// Rolled back: nothing.
	err := b.Update(ctx, func(tx vibejobs.Tx) error {
		jobs[1].URL = "https://example.test/rolled-back"
		if err := tx.UpdateJob(ctx, jobs[1]); err != nil {
			return err
		}
		return errors.New("roll back")
	})
	if err == nil {
		t.Fatal("Update did not fail")
	}
	nothingOn(t, changes, "rolled back")
	mustUpdate(t, b, func(tx vibejobs.Tx) error { return tx.DeleteJob(ctx, prj, jobs[1].ID, t0) })
	wantJobChange(t, changes, jobs[1].ID, "deleted")

	if _, err := b.Pool().Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, listener); err != nil {
		t.Fatal(err)
	}
	wantJobChange(t, changes, "", "after reconnecting")
	update(b, j, func(j *vibejobs.Job) { j.URL = "https://example.test/again" })
	wantJobChange(t, changes, j.ID, "listening again")

	cancel()
	for range changes {
	}
}

// TestConnectionLossIsUnavailable: a server that refuses connections, and
// sessions cut under the pool, give EUNAVAILABLE, never an internal error.
func TestConnectionLossIsUnavailable(t *testing.T) {
	ctx := context.Background()
	postgres.TestURL(t)
	_, err := postgres.Open(ctx, "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2", postgres.Options{Logger: quiet})
	wantKind(t, err, vibejobs.EUNAVAILABLE, "database_unavailable")

	// A pool of four sessions, every one held and cut from another
	// connection, which waits until each server process has ended. Once all
	// four are back in the pool, each next statement takes one of them, which
	// fails that statement (or, idle over a second, fails the pool's ping and
	// is replaced): after four the pool has none left to fail with.
	const sessions = 4
	s := postgres.MustOpenTestWith(t, postgres.Options{Logger: quiet, Now: func() time.Time { return t0 }, MaxConns: sessions})
	prj := newProject(t, s)
	var (
		held []*pgxpool.Conn
		pids []uint32
	)
	for range sessions {
		c, err := s.Pool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		pids = append(pids, c.Conn().PgConn().PID())
	}
	killer, err := pgx.Connect(ctx, postgres.TestURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer killer.Close(ctx)
	var ended int
	if err := killer.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000))
		FROM unnest($1::int[]) AS pid`, pids).Scan(&ended); err != nil {
		t.Fatal(err)
	}
	if ended != sessions {
		t.Fatalf("%d of the %d server processes ended within 10 s", ended, sessions)
	}
	for _, c := range held {
		c.Release()
	}
	// The pool's AfterRelease hook puts each session back from a goroutine
	// of its own, and nothing signals when it has: until then a statement
	// could open a fifth session and leave a dead one for later.
	for deadline := time.Now().Add(10 * time.Second); s.Pool().Stat().IdleConns() != sessions; {
		if time.Now().After(deadline) {
			t.Fatalf("the pool holds %d idle sessions, not %d", s.Pool().Stat().IdleConns(), sessions)
		}
		runtime.Gosched()
	}
	failed := 0
	for range sessions {
		_, err := s.GetProject(ctx, prj)
		if err == nil {
			continue
		}
		if vibejobs.ErrorKind(err) != vibejobs.EUNAVAILABLE {
			t.Fatalf("after the connections were cut: %v (kind %s)", err, vibejobs.ErrorKind(err))
		}
		failed++
	}
	if failed == 0 {
		t.Fatal("no statement met a cut session")
	}
	if _, err := s.GetProject(ctx, prj); err != nil {
		t.Fatalf("the pool did not recover: %v", err)
	}
}

// TestStore runs the conformance suite shared with the SQLite store. The
// Store's clock is the suite's T0 (NextDueAt leaves out runs whose deadline
// passed by it).
func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) vibejobs.Store {
		return postgres.MustOpenTestWith(t, postgres.Options{Logger: quiet, Now: func() time.Time { return storetest.T0 }})
	})
}

// TestTokenLimitHoldsAgainstARace: two replicas mint a project's last
// token at once. The second waits for the first's lock on the project,
// then counts the first's token and is refused. Counted without the lock,
// each saw room for one and both committed.
func TestTokenLimitHoldsAgainstARace(t *testing.T) {
	ctx := context.Background()
	schema := postgres.NewTestSchema(t)
	a, b := open(t, schema), open(t, schema)
	prj := newProject(t, a)
	newToken := func() *vibejobs.Token {
		tid := id("tok_")
		return &vibejobs.Token{ID: tid, ProjectID: prj, Name: "t", Role: vibejobs.RoleRead, Prefix: "vjt_",
			Hash: []byte(tid), CreatedAt: t0}
	}
	gate := newCommitGate(t)
	firstDone := make(chan error, 1)
	go func() {
		firstDone <- a.Update(ctx, func(tx vibejobs.Tx) error {
			if err := tx.CreateToken(ctx, newToken(), 1); err != nil {
				return err
			}
			gate.hold()
			return nil
		})
	}()
	waitSignal(t, gate.reached, "the first creation")
	secondDone := make(chan error, 1)
	go func() {
		secondDone <- b.Update(ctx, func(tx vibejobs.Tx) error { return tx.CreateToken(ctx, newToken(), 1) })
	}()
	for deadline := time.Now().Add(10 * time.Second); !lockWaiting(t, a, "SELECT 1 FROM projects"); time.Sleep(5 * time.Millisecond) {
		select {
		case err := <-secondDone:
			t.Fatalf("the second creation ended (%v) while the first was still open", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the second creation never waited for the first")
		}
	}
	gate.open()
	if err := <-firstDone; err != nil {
		t.Fatalf("the first creation: %v", err)
	}
	wantKind(t, <-secondDone, vibejobs.ECONFLICT, "too_many_tokens")
}

// TestSubscriptionEditLocksItsRow: the API reads a subscription and writes
// the row back from what it read in one transaction; a change committed in
// between (a concurrent rotation, reset or delivery step) was written over,
// a secret another rotation had just handed out dropped at once. The read
// locks the row: another transaction's change waits for the edit.
func TestSubscriptionEditLocksItsRow(t *testing.T) {
	ctx := context.Background()
	schema := postgres.NewTestSchema(t)
	a, b := open(t, schema), open(t, schema)
	prj := newProject(t, a)
	sub := &vibejobs.Subscription{ID: "sub_locked", ProjectID: prj, URL: "https://hooks.example.test/",
		Secret: vibejobs.SealedSecret{KeyID: "k", Ciphertext: []byte{1}}, CreatedAt: t0, UpdatedAt: t0}
	mustUpdate(t, a, func(tx vibejobs.Tx) error { return tx.CreateSubscription(ctx, sub, 16) })
	mustUpdate(t, a, func(tx vibejobs.Tx) error {
		cur, err := tx.GetSubscription(ctx, prj, sub.ID)
		if err != nil {
			return err
		}
		// A reset from another transaction must wait for this one.
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		err = b.Update(wctx, func(tx vibejobs.Tx) error {
			_, err := tx.ResetSubscription(wctx, prj, sub.ID, t0.Add(time.Minute))
			return err
		})
		if err == nil {
			t.Error("a reset committed between an edit's read of the subscription and its write")
		}
		cur.URL, cur.UpdatedAt = "https://hooks.example.test/new", t0.Add(time.Second)
		return tx.UpdateSubscription(ctx, cur)
	})
	got, err := a.GetSubscription(ctx, prj, sub.ID)
	if err != nil || got.URL != "https://hooks.example.test/new" {
		t.Fatalf("after the edit: %+v, %v", got, err)
	}
}

// TestJobEditLocksOutTheScheduler: an edit reads the job and writes the
// whole row back in one transaction. A scheduler step between the two
// would be written over (NextRunAt moved back, its skipped occurrences
// counted again on the next step), so the read locks the job and the
// scheduler skips it until the edit commits.
func TestJobEditLocksOutTheScheduler(t *testing.T) {
	ctx := context.Background()
	schema := postgres.NewTestSchema(t)
	a, b := open(t, schema), open(t, schema)
	prj := newProject(t, a)
	j := newJobs(t, a, prj, 1)[0]
	step := func() int {
		p := planFor(j, *j.NextRunAt)
		p.Skipped = 10
		n, _, err := b.ApplyRunPlans(ctx, []vibejobs.RunPlan{p}, t0)
		if err != nil {
			t.Fatalf("ApplyRunPlans: %v", err)
		}
		return n
	}
	mustUpdate(t, a, func(tx vibejobs.Tx) error {
		cur, err := tx.GetJob(ctx, prj, j.ID)
		if err != nil {
			return err
		}
		if n := step(); n != 0 {
			t.Errorf("the scheduler applied a plan to a job being edited (%d runs)", n)
		}
		cur.Name, cur.UpdatedAt = "renamed", t0
		return tx.UpdateJob(ctx, cur)
	})
	if n := step(); n != 1 {
		t.Fatalf("the scheduler's step after the edit created %d runs, want 1", n)
	}
	got, err := a.GetJob(ctx, prj, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "renamed" || got.SkippedRuns != 10 || got.NextRunAt == nil || !got.NextRunAt.After(*j.NextRunAt) {
		t.Fatalf("job after the edit and one scheduler step: name %q, skipped %d, next %v; want renamed, 10, after %v",
			got.Name, got.SkippedRuns, got.NextRunAt, j.NextRunAt)
	}
}

// TestDeleteJobRacesTheRunInFlight: a job is deleted on one replica while
// another ends its run's attempt in flight: records a retrying outcome,
// releases the claim unsent, or recovers its expired lease. Each of those
// decides whether the job was deleted; DeleteJob skips the run, which is
// leased. Were the job read from a snapshot older than the deletion, the
// run would go back to waiting for a deleted job and be sent again. Each
// racer here takes its snapshot, then waits on a lock held by a third
// session while the deletion goes ahead.
func TestDeleteJobRacesTheRunInFlight(t *testing.T) {
	ctx := context.Background()
	for _, racer := range []struct {
		name, prefix string
		// hold takes the lock the racer will wait on, in tx.
		hold func(tx pgx.Tx, prj, runID string) error
		run  func(s *postgres.Store, c *vibejobs.Claim) error
	}{{
		name: "retrying outcome", prefix: "WITH o AS",
		hold: holdRun,
		run: func(s *postgres.Store, c *vibejobs.Claim) error {
			next := t0.Add(time.Minute)
			return s.RecordOutcomes(ctx, "a", []vibejobs.Outcome{{RunID: c.Run.ID, ClaimedAt: c.ClaimedAt,
				Attempt: vibejobs.Attempt{Number: 1, StartedAt: t0, FinishedAt: t0.Add(time.Second), StatusCode: 503, ErrorCode: "http_5xx"},
				Step:    vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: &next}}})
		},
	}, {
		name: "release", prefix: "WITH held AS",
		hold: holdRun,
		run: func(s *postgres.Store, c *vibejobs.Claim) error {
			return s.ReleaseClaims(ctx, "a", []*vibejobs.Claim{c}, t0, t0)
		},
	}, {
		name: "lease recovery", prefix: "WITH expired AS",
		// Recovery skips a locked run: it waits on the project's feed
		// counter instead, after it moved the run.
		hold: func(tx pgx.Tx, prj, _ string) error {
			_, err := tx.Exec(ctx, `INSERT INTO event_heads (project_id, head) VALUES ($1, 0)`, prj)
			return err
		},
		run: func(s *postgres.Store, _ *vibejobs.Claim) error {
			_, err := s.RecoverExpiredLeases(ctx, t0.Add(time.Minute), 10)
			return err
		},
	}} {
		t.Run(racer.name, func(t *testing.T) {
			schema := postgres.NewTestSchema(t)
			a, b := open(t, schema), open(t, schema)
			prj := newProject(t, a)
			j := newJobs(t, a, prj, 1)[0]
			if _, _, err := a.ApplyRunPlans(ctx, []vibejobs.RunPlan{planFor(j, t0)}, t0); err != nil {
				t.Fatal(err)
			}
			claims, err := a.ClaimDueRuns(ctx, "a", t0, 1, time.Second)
			if err != nil || len(claims) != 1 {
				t.Fatalf("claim = %v %v", claims, err)
			}
			locker, err := a.Pool().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer locker.Rollback(ctx)
			if err := racer.hold(locker, prj, claims[0].Run.ID); err != nil {
				t.Fatal(err)
			}
			raced := make(chan error, 1)
			go func() { raced <- racer.run(a, claims[0]) }()
			waitForLockWait(t, a, racer.prefix, "the racer never waited for the lock held")

			// The deletion commits, or waits for the racer's lock on the job.
			deleted := make(chan error, 1)
			go func() {
				deleted <- b.Update(ctx, func(tx vibejobs.Tx) error { return tx.DeleteJob(ctx, prj, j.ID, t0) })
			}()
			for deadline := time.Now().Add(10 * time.Second); len(deleted) == 0 && !lockWaiting(t, a, "UPDATE jobs SET deleted_at"); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the deletion neither committed nor waited")
				}
			}
			if err := locker.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-raced; err != nil {
				t.Fatal(err)
			}
			if err := <-deleted; err != nil {
				t.Fatal(err)
			}
			r, err := a.GetRun(ctx, prj, claims[0].Run.ID)
			if err != nil {
				t.Fatal(err)
			}
			if r.State != vibejobs.RunCancelled || r.FailureReason != vibejobs.ReasonJobDeleted {
				t.Errorf("run of the deleted job: %s (%s), want cancelled (job_deleted)", r.State, r.FailureReason)
			}
			if again, err := b.ClaimDueRuns(ctx, "b", t0.Add(time.Hour), 10, time.Second); err != nil || len(again) != 0 {
				t.Errorf("the deleted job's run claimed again: %d claims, %v", len(again), err)
			}
		})
	}
}

// holdRun locks the run's row in tx.
func holdRun(tx pgx.Tx, _, runID string) error {
	_, err := tx.Exec(context.Background(), `SELECT 1 FROM runs WHERE id = $1 FOR UPDATE`, runID)
	return err
}

// TestResealWaitsForASecretRotation: "master-key rotate" reads the secrets
// to re-seal and writes them back in one transaction. A job or subscription
// secret rotated through the API meanwhile (committed after the read began)
// must reach the re-seal as rotated, or the re-seal writes the secret from
// before the rotation back over it.
func TestResealWaitsForASecretRotation(t *testing.T) {
	ctx := context.Background()
	schema := postgres.NewTestSchema(t)
	a, b := open(t, schema), open(t, schema)
	prj := newProject(t, a)
	j := newJobs(t, a, prj, 1)[0]
	sub := &vibejobs.Subscription{ID: id("sub_"), ProjectID: prj, URL: "https://hooks.example.test/x",
		Secret: vibejobs.SealedSecret{KeyID: "old", Ciphertext: []byte("s0")}, CreatedAt: t0, UpdatedAt: t0}
	mustUpdate(t, a, func(tx vibejobs.Tx) error { return tx.CreateSubscription(ctx, sub, 10) })
	rotated := vibejobs.SealedSecret{KeyID: "old", Ciphertext: []byte("rotated")}

	for _, c := range []struct {
		name, prefix string
		rotate       func(tx pgx.Tx) error
		read         func(tx vibejobs.Tx) ([]byte, error)
	}{{
		name: "job", prefix: "SELECT j.id",
		rotate: func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE jobs SET secret_ciphertext = $2 WHERE id = $1`, j.ID, rotated.Ciphertext)
			return err
		},
		read: func(tx vibejobs.Tx) ([]byte, error) {
			jobs, err := tx.SecretsNotUnder(ctx, "new", 10)
			if err != nil || len(jobs) != 1 {
				return nil, fmt.Errorf("SecretsNotUnder = %d jobs, %v", len(jobs), err)
			}
			return jobs[0].Secret.Ciphertext, nil
		},
	}, {
		name: "subscription", prefix: "SELECT id",
		rotate: func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE subscriptions SET secret_ciphertext = $2 WHERE id = $1`, sub.ID, rotated.Ciphertext)
			return err
		},
		read: func(tx vibejobs.Tx) ([]byte, error) {
			subs, err := tx.SubscriptionSecretsNotUnder(ctx, "new", 10)
			if err != nil || len(subs) != 1 {
				return nil, fmt.Errorf("SubscriptionSecretsNotUnder = %d subscriptions, %v", len(subs), err)
			}
			return subs[0].Secret.Ciphertext, nil
		},
	}} {
		t.Run(c.name, func(t *testing.T) {
			// The API's rotation, caught before its commit.
			api, err := a.Pool().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer api.Rollback(ctx)
			if err := c.rotate(api); err != nil {
				t.Fatal(err)
			}
			var got []byte
			read := make(chan error, 1)
			go func() {
				read <- b.Update(ctx, func(tx vibejobs.Tx) error {
					var err error
					got, err = c.read(tx)
					return err
				})
			}()
			waitForLockWait(t, a, c.prefix, "the re-seal's read never waited for the rotation")
			if err := api.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-read; err != nil {
				t.Fatal(err)
			}
			if string(got) != string(rotated.Ciphertext) {
				t.Fatalf("the re-seal read the secret %q, from before the rotation; want %q", got, rotated.Ciphertext)
			}
		})
	}
}

// TestDeleteJobRacesMaterialisation: a job deleted while another replica
// materialises its runs and a user triggers it never keeps a waiting run.
func TestDeleteJobRacesMaterialisation(t *testing.T) {
	ctx := context.Background()
	schema := postgres.NewTestSchema(t)
	a, b := open(t, schema), open(t, schema)
	prj := newProject(t, a)
	jobs := newJobs(t, a, prj, 40)
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Go(func() {
			if err := a.Update(ctx, func(tx vibejobs.Tx) error { return tx.DeleteJob(ctx, prj, j.ID, t0) }); err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			if _, _, err := b.ApplyRunPlans(ctx, []vibejobs.RunPlan{planFor(j, t0, t0.Add(time.Second))}, t0); err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			err := b.Update(ctx, func(tx vibejobs.Tx) error {
				return tx.CreateRun(ctx, vibejobs.NewRun(id("run_"), j, vibejobs.TriggerManual, t0, t0))
			})
			if err != nil && vibejobs.ErrorKind(err) != vibejobs.ENOTFOUND {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	var waiting int
	if err := a.Pool().QueryRow(ctx, `SELECT count(*) FROM runs WHERE state IN ('scheduled', 'retrying')`).Scan(&waiting); err != nil || waiting != 0 {
		t.Fatalf("%d runs of deleted jobs still waiting (%v)", waiting, err)
	}
}

// TestSchemaFromURL: a search_path in the URL names the schema: created,
// migrated there, and used as the notification payload.
func TestSchemaFromURL(t *testing.T) {
	schema := postgres.NewTestSchema(t)
	url := postgres.TestURL(t)
	if strings.Contains(url, "?") {
		url += "&search_path=" + schema
	} else {
		url += "?search_path=" + schema
	}
	s, err := postgres.Open(context.Background(), url, postgres.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Schema() != schema {
		t.Fatalf("Schema() = %q, want %q", s.Schema(), schema)
	}
	var n int
	err = s.Pool().QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'runs'`, schema).Scan(&n)
	if err != nil || n != 1 {
		t.Fatalf("runs table in %s: %d, %v", schema, n, err)
	}
}

// TestCloseEndsWakeups: Close stops the listeners and closes their channels.
func TestCloseEndsWakeups(t *testing.T) {
	s, err := postgres.Open(context.Background(), postgres.TestURL(t), postgres.Options{Schema: postgres.NewTestSchema(t), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	wake, _ := s.Notifications(context.Background())
	done := make(chan struct{})
	go func() {
		for range wake {
		}
		close(done)
	}()
	s.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Notifications still open after Close")
	}
}

// TestJobCountsUnderConcurrentCreates checks project_job_counts against the
// jobs themselves after concurrent creating transactions: each adds its
// count just before it commits (the conformance suite covers deletes and
// rollbacks).
func TestJobCountsUnderConcurrentCreates(t *testing.T) {
	ctx := context.Background()
	s := open(t, "")
	prj := newProject(t, s)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 5 {
				if err := s.Update(ctx, func(tx vibejobs.Tx) error {
					for range 3 {
						if err := tx.CreateJob(ctx, jobFor(prj)); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	var live int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM jobs WHERE project_id = $1 AND deleted_at IS NULL`, prj).Scan(&live); err != nil {
		t.Fatal(err)
	}
	if n, err := s.CountJobs(ctx, prj); err != nil || n != live || live != 60 {
		t.Fatalf("CountJobs = %d, %v; the project has %d live jobs, want 60", n, err, live)
	}
}

// TestRecordOutcomesOfOneRunTwiceDoesNotDeadlock: a batch of outcomes can
// hold two of one run (a claim whose lease was recovered while its outcome
// waited, and this owner's newer claim of the run). Recorded in several
// statements of one transaction, the first took the project's feed counter
// and kept it while the next waited for a job an API edit held; the edit,
// appending its events, waited for the counter: a deadlock, and the batch
// failed.
func TestRecordOutcomesOfOneRunTwiceDoesNotDeadlock(t *testing.T) {
	ctx := context.Background()
	s := open(t, "")
	prj := newProject(t, s)
	jobs := newJobs(t, s, prj, 2)
	if _, _, err := s.ApplyRunPlans(ctx, []vibejobs.RunPlan{planFor(jobs[0], t0), planFor(jobs[1], t0.Add(30*time.Second))}, t0); err != nil {
		t.Fatal(err)
	}
	stale, err := s.ClaimDueRuns(ctx, "a", t0, 10, time.Second)
	if err != nil || len(stale) != 1 {
		t.Fatalf("first claim = %v %v", stale, err)
	}
	if n, err := s.RecoverExpiredLeases(ctx, t0.Add(20*time.Second), 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases = %d, %v", n, err)
	}
	at := t0.Add(30 * time.Second)
	claims, err := s.ClaimDueRuns(ctx, "a", at, 10, time.Second)
	if err != nil || len(claims) != 2 || claims[0].Run.ID != stale[0].Run.ID {
		t.Fatalf("second claim = %v %v", claims, err)
	}
	outcome := func(c *vibejobs.Claim, step vibejobs.Step) vibejobs.Outcome {
		return vibejobs.Outcome{RunID: c.Run.ID, ClaimedAt: c.ClaimedAt, Step: step,
			Attempt: vibejobs.Attempt{Number: c.Run.Attempt, StartedAt: at, FinishedAt: at.Add(time.Second), StatusCode: 503, ErrorCode: "http_5xx"}}
	}
	next := at.Add(time.Minute)
	retry := vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: &next}
	outcomes := []vibejobs.Outcome{outcome(claims[0], retry), outcome(stale[0], retry), outcome(claims[1], retry)}

	// An API edit of the second job holds it.
	edit, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer edit.Rollback(ctx)
	if _, err := edit.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, jobs[1].ID); err != nil {
		t.Fatal(err)
	}
	recorded := make(chan error, 1)
	go func() { recorded <- s.RecordOutcomes(ctx, "a", outcomes) }()
	waitForLockWait(t, s, "WITH o AS", "the record never waited for the job being edited")
	// The edit appends its event.
	if _, err := edit.Exec(ctx, `INSERT INTO event_heads AS h (project_id, head) VALUES ($1, 1)
		ON CONFLICT (project_id) DO UPDATE SET head = h.head + 1`, prj); err != nil {
		t.Errorf("the edit's event: %v", err)
	}
	if err := edit.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-recorded; err != nil {
		t.Fatalf("RecordOutcomes: %v", err)
	}
	for _, c := range claims {
		r, err := s.GetRun(ctx, prj, c.Run.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r.State != vibejobs.RunRetrying || r.Attempt != 1 || r.NextAttemptAt == nil || !r.NextAttemptAt.Equal(next) {
			t.Errorf("run %s: %s attempt %d next %v, want retrying attempt 1 next %v", r.ID, r.State, r.Attempt, r.NextAttemptAt, next)
		}
	}
}

// TestPruneRunsTakesTheirAttempts: attempts carry no foreign key to their
// run (migration 00004), so PruneRuns deletes them itself: a pruned run
// leaves no attempt row behind, and a run kept keeps its attempts.
func TestPruneRunsTakesTheirAttempts(t *testing.T) {
	ctx := context.Background()
	s := open(t, "")
	prj := newProject(t, s)
	j := newJobs(t, s, prj, 1)[0]
	plan := planFor(j, t0.Add(-time.Second), t0)
	if n, _, err := s.ApplyRunPlans(ctx, []vibejobs.RunPlan{plan}, t0); err != nil || n != 2 {
		t.Fatalf("ApplyRunPlans = %d, %v; want 2", n, err)
	}
	claims, err := s.ClaimDueRuns(ctx, "a", t0, 10, 5*time.Second)
	if err != nil || len(claims) != 2 {
		t.Fatalf("ClaimDueRuns = %d, %v", len(claims), err)
	}
	retryAt := t0.Add(time.Hour)
	done, retrying := claims[0], claims[1]
	if err := s.RecordOutcomes(ctx, "a", []vibejobs.Outcome{
		{RunID: done.Run.ID, ClaimedAt: done.ClaimedAt, Attempt: vibejobs.Attempt{Number: 1, StartedAt: t0, FinishedAt: t0, StatusCode: 200},
			Step: vibejobs.Step{State: vibejobs.RunSucceeded}},
		{RunID: retrying.Run.ID, ClaimedAt: retrying.ClaimedAt, Attempt: vibejobs.Attempt{Number: 1, StartedAt: t0, FinishedAt: t0, StatusCode: 503, ErrorCode: "http_5xx"},
			Step: vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: &retryAt}},
	}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PruneRuns(ctx, prj, t0.Add(time.Minute), 10); err != nil || n != 1 {
		t.Fatalf("PruneRuns = %d, %v; want the finished run", n, err)
	}
	for runID, want := range map[string]int{done.Run.ID: 0, retrying.Run.ID: 1} {
		var n int
		if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM attempts WHERE run_id = $1`, runID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Errorf("run %s: %d attempt rows after pruning, want %d", runID, n, want)
		}
	}
}
