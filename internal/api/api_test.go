package api_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/scheduler"
)

func TestHealthAndReady(t *testing.T) {
	var notReady error
	e := newEnv(t, func(c *api.Config) {
		c.Ready = func(context.Context) error { return notReady }
	})
	e.must(200, "GET", "/healthz", "", nil)
	if m := e.must(200, "GET", "/readyz", "", nil); m["status"] != "ready" {
		t.Errorf("readyz = %v", m)
	}
	notReady = errors.New("scheduler not started: secret detail")
	res := e.do("GET", "/readyz", "", nil)
	if code, _ := res.errorCode(t); res.status != 503 || code != "not_ready" || res.header.Get("Retry-After") != "2" {
		t.Errorf("readyz when not ready = %s (Retry-After %q), want 503 not_ready, Retry-After 2", res, res.header.Get("Retry-After"))
	}
	if strings.Contains(string(res.body), "secret detail") {
		t.Errorf("readyz shows the internal error: %s", res.body)
	}
	e.store.Close()
	notReady = nil
	if res := e.do("GET", "/readyz", "", nil); res.status != 503 {
		t.Errorf("readyz with a closed store = %s", res)
	}
}

// TestReadyzWhileStopping: once the server stops, /readyz answers 503
// stopping, a reason a load balancer's operator can read, without asking
// the database or the loops (neither is consulted: a closed store and a
// failing Ready still give stopping); /healthz and the API answer as
// before, until the server closes its listener.
func TestReadyzWhileStopping(t *testing.T) {
	var stopping bool
	e := newEnv(t, func(c *api.Config) {
		c.Ready = func(context.Context) error { return errors.New("scheduler stalled") }
		c.Stopping = func() bool { return stopping }
	})
	if res := e.do("GET", "/readyz", "", nil); res.status != 503 {
		t.Fatalf("readyz with Ready failing = %s", res)
	} else if code, _ := res.errorCode(t); code != "not_ready" {
		t.Fatalf("readyz with Ready failing, before the stop: %s, want not_ready", res)
	}
	stopping = true
	res := e.do("GET", "/readyz", "", nil)
	if code, _ := res.errorCode(t); res.status != 503 || code != "stopping" || res.header.Get("Retry-After") != "" {
		t.Fatalf("readyz while stopping = %s (Retry-After %q), want 503 stopping, no Retry-After", res, res.header.Get("Retry-After"))
	}
	e.must(200, "GET", "/healthz", "", nil)
	e.must(200, "GET", "/v1/jobs", e.admin, nil)
	e.store.Close()
	if code, _ := e.do("GET", "/readyz", "", nil).errorCode(t); code != "stopping" {
		t.Fatalf("readyz while stopping, the store closed: %s, want stopping", code)
	}
}

// TestProbesIgnoreQuery: /healthz and /readyz answer as if the request had
// no query, however malformed: a probe that adds one of its own (a cache
// buster, a bad escape) must not read a 400 as the platform being down, nor
// a 200 as it being up.
func TestProbesIgnoreQuery(t *testing.T) {
	var notReady error
	e := newEnv(t, func(c *api.Config) {
		c.Ready = func(context.Context) error { return notReady }
	})
	queries := []string{"?%zz", "?probe=%", "?a;b=1", "?x=%00", "?%FF=1", "?t=1&t=2"}
	for _, q := range queries {
		if m := e.must(200, "GET", "/healthz"+q, "", nil); m["status"] != "ok" {
			t.Errorf("/healthz%s = %v", q, m)
		}
		if m := e.must(200, "GET", "/readyz"+q, "", nil); m["status"] != "ready" {
			t.Errorf("/readyz%s = %v", q, m)
		}
	}
	notReady = errors.New("scheduler stalled")
	for _, q := range queries {
		res := e.do("GET", "/readyz"+q, "", nil)
		if code, _ := res.errorCode(t); res.status != 503 || code != "not_ready" {
			t.Errorf("/readyz%s when not ready = %s, want 503 not_ready", q, res)
		}
	}
}

func TestJobLifecycle(t *testing.T) {
	e := newEnv(t)
	now := e.clock.Now()

	// Create with defaults.
	res := e.send(req{method: "POST", path: "/v1/jobs", token: e.admin, key: "create-1", body: jobBody(nil)})
	if res.status != 201 {
		t.Fatalf("create: %s", res)
	}
	created := res.json(t)
	id := created["id"].(string)
	if got := res.header.Get("Location"); got != "/v1/jobs/"+id {
		t.Errorf("Location = %q", got)
	}
	if !contract.ValidID(id, "job_") {
		t.Errorf("id %q", id)
	}
	secret, _ := created["secret"].(string)
	if !contract.ValidSecret(secret) {
		t.Errorf("secret %q has not the contract's format", secret)
	}
	want := map[string]any{
		"name": "nightly report", "schedule": "*/5 * * * *", "at": nil, "timezone": "UTC",
		"url": "https://example.test/hooks/report", "enabled": true, "state": "active",
		"retry":   map[string]any{"maxAttempts": 4.0, "minBackoff": "30s", "maxBackoff": "1h"},
		"timeout": "10s", "catchUp": "all", "nextRunAt": "2026-10-09T08:05:00.000Z", "lastRun": nil,
		"skippedRuns": 0.0, "createdAt": "2026-10-09T08:00:00.000Z", "updatedAt": "2026-10-09T08:00:00.000Z",
	}
	checkFields(t, "created job", created, want)
	if e.wakes != 1 {
		t.Errorf("wakes after create = %d", e.wakes)
	}

	// The sealed secret opens to the one returned.
	stored, err := e.store.GetJob(context.Background(), e.project, id)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := e.keys.Open(stored.Secret, id); err != nil || got != secret {
		t.Errorf("stored secret opens to %q, %v", got, err)
	}
	if !stored.ScheduleAnchor.Equal(now) {
		t.Errorf("anchor = %v", stored.ScheduleAnchor)
	}

	// Get and list show it without its secret.
	got := e.must(200, "GET", "/v1/jobs/"+id, e.admin, nil)
	delete(created, "secret")
	checkFields(t, "get", got, created)
	list := e.must(200, "GET", "/v1/jobs", e.admin, nil)
	if jobs := list["jobs"].([]any); len(jobs) != 1 || list["nextCursor"] != nil {
		t.Errorf("list = %v", list)
	}

	// Next fire times.
	next := e.must(200, "GET", "/v1/jobs/"+id+"/next?count=3", e.admin, nil)
	wantTimes := []any{"2026-10-09T08:05:00.000Z", "2026-10-09T08:10:00.000Z", "2026-10-09T08:15:00.000Z"}
	if !slices.Equal(next["times"].([]any), wantTimes) {
		t.Errorf("next = %v", next["times"])
	}
	if n := e.must(200, "GET", "/v1/jobs/"+id+"/next", e.admin, nil); len(n["times"].([]any)) != 5 {
		t.Errorf("default count: %v", n)
	}

	// PATCH: a schedule change counts from now; an @every anchors at now.
	e.clock.Advance(90 * time.Second)
	patched := e.must(200, "PATCH", "/v1/jobs/"+id, e.admin, map[string]any{
		"name": "every minute", "schedule": "@every 1m", "retry": map[string]any{"maxAttempts": 2, "minBackoff": "2s", "maxBackoff": "90m"},
		"timeout": "5s", "catchUp": "latest", "timezone": "Europe/Paris",
	})
	checkFields(t, "patched", patched, map[string]any{
		"name": "every minute", "schedule": "@every 1m", "timezone": "Europe/Paris", "timeout": "5s", "catchUp": "latest",
		"retry":     map[string]any{"maxAttempts": 2.0, "minBackoff": "2s", "maxBackoff": "1h30m"},
		"nextRunAt": "2026-10-09T08:02:30.000Z", "updatedAt": "2026-10-09T08:01:30.000Z", "createdAt": "2026-10-09T08:00:00.000Z",
	})
	if _, ok := patched["secret"]; ok {
		t.Error("PATCH answer holds the secret")
	}
	// @every ignores the time zone: a new zone alone keeps its grid.
	e.clock.Advance(20 * time.Second)
	rezoned := e.must(200, "PATCH", "/v1/jobs/"+id, e.admin, map[string]any{"timezone": "Asia/Tokyo"})
	checkFields(t, "rezoned", rezoned, map[string]any{"timezone": "Asia/Tokyo", "nextRunAt": "2026-10-09T08:02:30.000Z"})
	// Nor with the same schedule sent again beside it, as a client sending
	// every setting back does.
	rezoned = e.must(200, "PATCH", "/v1/jobs/"+id, e.admin, map[string]any{"timezone": "Europe/Paris", "schedule": "@every 1m"})
	checkFields(t, "rezoned with its schedule", rezoned, map[string]any{"timezone": "Europe/Paris", "nextRunAt": "2026-10-09T08:02:30.000Z"})

	// Pause, then resume: occurrences while paused are skipped.
	paused := e.must(200, "POST", "/v1/jobs/"+id+"/pause", e.admin, nil)
	checkFields(t, "paused", paused, map[string]any{"enabled": false, "state": "paused", "nextRunAt": nil})
	e.clock.Advance(10*time.Minute - 20*time.Second) // 10 min after the PATCH
	resumed := e.must(200, "POST", "/v1/jobs/"+id+"/resume", e.admin, "{}")
	checkFields(t, "resumed", resumed, map[string]any{"enabled": true, "state": "active", "nextRunAt": "2026-10-09T08:12:30.000Z"})
	// PATCH enabled is the same as pause/resume.
	checkFields(t, "patch enabled=false", e.must(200, "PATCH", "/v1/jobs/"+id, e.admin, map[string]any{"enabled": false}),
		map[string]any{"enabled": false, "state": "paused"})
	checkFields(t, "patch enabled=true", e.must(200, "PATCH", "/v1/jobs/"+id, e.admin, map[string]any{"enabled": true}),
		map[string]any{"enabled": true, "state": "active"})

	// Manual run: 202, trigger manual, due now.
	wakes := e.wakes
	res = e.do("POST", "/v1/jobs/"+id+"/runs", e.admin, nil)
	if res.status != 202 {
		t.Fatalf("trigger: %s", res)
	}
	run := res.json(t)
	runID := run["id"].(string)
	if res.header.Get("Location") != "/v1/runs/"+runID || !contract.ValidID(runID, "run_") {
		t.Errorf("run id %q, Location %q", runID, res.header.Get("Location"))
	}
	checkFields(t, "manual run", run, map[string]any{
		"jobId": id, "trigger": "manual", "scheduledFor": "2026-10-09T08:11:30.000Z", "deadlineAt": "2026-10-13T08:11:30.000Z",
		"late": false, "state": "scheduled", "attempt": 0.0, "nextAttemptAt": "2026-10-09T08:11:30.000Z",
		"failureReason": nil, "createdAt": "2026-10-09T08:11:30.000Z", "finishedAt": nil,
	})
	if e.wakes != wakes+1 {
		t.Errorf("trigger did not wake the dispatcher")
	}
	// A second manual run in the same millisecond is a run of its own.
	run2 := e.must(202, "POST", "/v1/jobs/"+id+"/runs", e.admin, nil)
	if run2["id"] == runID {
		t.Error("manual runs merged")
	}

	// Deliveries: the first attempt fails (500), then the run is gone through.
	if n := e.deliver(500); n != 2 {
		t.Fatalf("delivered %d runs", n)
	}
	detail := e.must(200, "GET", "/v1/runs/"+runID, e.admin, nil)
	checkFields(t, "run after a 500", detail, map[string]any{"state": "retrying", "attempt": 1.0})
	attempts := detail["attempts"].([]any)
	if len(attempts) != 1 {
		t.Fatalf("attempts = %v", attempts)
	}
	checkFields(t, "attempt", attempts[0].(map[string]any), map[string]any{
		"number": 1.0, "startedAt": "2026-10-09T08:11:30.000Z", "finishedAt": "2026-10-09T08:11:30.120Z",
		"durationMs": 120.0, "statusCode": 500.0, "errorCode": "http_5xx", "signatureTimestamp": float64(e.clock.Now().Unix()),
		"responseSnippet": "ok",
	})
	e.clock.Advance(time.Minute)
	e.deliver(200)
	detail = e.must(200, "GET", "/v1/runs/"+runID, e.admin, nil)
	checkFields(t, "run after a 200", detail, map[string]any{"state": "succeeded", "attempt": 2.0, "failureReason": nil})
	if detail["finishedAt"] == nil || len(detail["attempts"].([]any)) != 2 {
		t.Errorf("finished run: %v", detail)
	}
	// Its job shows it as the last run.
	j := e.must(200, "GET", "/v1/jobs/"+id, e.admin, nil)
	if lr, _ := j["lastRun"].(map[string]any); lr == nil || lr["state"] == nil {
		t.Errorf("lastRun = %v", j["lastRun"])
	}

	// Runs of the job, filtered by state; the project's runs.
	runs := e.must(200, "GET", "/v1/jobs/"+id+"/runs", e.admin, nil)["runs"].([]any)
	if len(runs) != 2 {
		t.Errorf("runs of the job: %v", runs)
	}
	if _, ok := runs[0].(map[string]any)["attempts"]; ok {
		t.Error("a listed run holds its attempts")
	}
	succeeded := e.must(200, "GET", "/v1/jobs/"+id+"/runs?state=succeeded&limit=10", e.admin, nil)["runs"].([]any)
	if len(succeeded) != 2 {
		t.Errorf("succeeded runs: %v", succeeded)
	}
	if rs := e.must(200, "GET", "/v1/jobs/"+id+"/runs?state=failed", e.admin, nil)["runs"].([]any); len(rs) != 0 {
		t.Errorf("failed runs: %v", rs)
	}
	if rs := e.must(200, "GET", "/v1/runs?jobId="+id, e.admin, nil)["runs"].([]any); len(rs) != 2 {
		t.Errorf("/v1/runs?jobId: %v", rs)
	}
	if rs := e.must(200, "GET", "/v1/runs", e.admin, nil)["runs"].([]any); len(rs) != 2 {
		t.Errorf("/v1/runs: %v", rs)
	}

	// Rotate: a new secret, once; the runs are untouched.
	rot := e.must(200, "POST", "/v1/jobs/"+id+"/rotate-secret", e.admin, nil)
	newSecret, _ := rot["secret"].(string)
	if !contract.ValidSecret(newSecret) || newSecret == secret {
		t.Errorf("rotated secret %q", newSecret)
	}
	stored, _ = e.store.GetJob(context.Background(), e.project, id)
	if got, err := e.keys.Open(stored.Secret, id); err != nil || got != newSecret {
		t.Errorf("stored secret after rotation opens to %q, %v", got, err)
	}

	// Delete: 204, then 404 everywhere; its waiting runs are cancelled.
	e.must(202, "POST", "/v1/jobs/"+id+"/runs", e.admin, nil)
	if res := e.do("DELETE", "/v1/jobs/"+id, e.admin, nil); res.status != 204 || len(res.body) != 0 {
		t.Fatalf("delete: %s", res)
	}
	for _, p := range []string{"/v1/jobs/" + id, "/v1/jobs/" + id + "/next", "/v1/jobs/" + id + "/runs"} {
		res := e.do("GET", p, e.admin, nil)
		if code, _ := res.errorCode(t); res.status != 404 || code != "job_not_found" {
			t.Errorf("GET %s after delete: %s", p, res)
		}
	}
	if res := e.do("DELETE", "/v1/jobs/"+id, e.admin, nil); res.status != 404 {
		t.Errorf("second delete: %s", res)
	}
}

func TestOneOffJob(t *testing.T) {
	e := newEnv(t)
	at := "2026-10-09T10:30:00+02:00" // 08:30Z
	j := e.createJob(e.admin, map[string]any{"schedule": nil, "at": at, "timezone": "Europe/Berlin"})
	checkFields(t, "one-off", j, map[string]any{"schedule": nil, "at": "2026-10-09T08:30:00.000Z", "nextRunAt": "2026-10-09T08:30:00.000Z", "state": "active"})
	id := j["id"].(string)
	if n := e.must(200, "GET", "/v1/jobs/"+id+"/next?count=10", e.admin, nil); !slices.Equal(n["times"].([]any), []any{"2026-10-09T08:30:00.000Z"}) {
		t.Errorf("next of a one-off: %v", n)
	}

	// The scheduler completes it once its run exists.
	e.clock.Advance(30 * time.Minute)
	ctx := context.Background()
	job, _ := e.store.GetJob(ctx, e.project, id)
	r := vibejobs.NewRun(vibejobs.NewID("run_", e.clock.Now(), nil), job, vibejobs.TriggerSchedule, *job.At, e.clock.Now())
	if _, _, err := e.store.ApplyRunPlans(ctx, []vibejobs.RunPlan{{JobID: id, Anchor: job.ScheduleAnchor, From: *job.NextRunAt, Runs: []*vibejobs.Run{r}, Complete: true}}, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	checkFields(t, "completed", e.must(200, "GET", "/v1/jobs/"+id, e.admin, nil), map[string]any{"state": "completed", "nextRunAt": nil})
	if n := e.must(200, "GET", "/v1/jobs/"+id+"/next", e.admin, nil); len(n["times"].([]any)) != 0 {
		t.Errorf("next of a completed job: %v", n)
	}

	// It cannot be resumed, nor enabled back, without a new at.
	for _, r := range []req{
		{method: "POST", path: "/v1/jobs/" + id + "/resume", key: keyAuto},
		{method: "PATCH", path: "/v1/jobs/" + id, body: map[string]any{"enabled": true, "name": "again"}},
	} {
		r.token = e.admin
		res := e.send(r)
		if code, _ := res.errorCode(t); res.status != 409 || code != "job_completed" {
			t.Errorf("%s %s on a completed job: %s", r.method, r.path, res)
		}
	}
	// Pausing it keeps it completed; other fields may change.
	checkFields(t, "paused completed", e.must(200, "POST", "/v1/jobs/"+id+"/pause", e.admin, nil), map[string]any{"state": "completed", "enabled": false})
	checkFields(t, "renamed", e.must(200, "PATCH", "/v1/jobs/"+id, e.admin, map[string]any{"name": "renamed"}), map[string]any{"state": "completed", "name": "renamed"})
	// A new at (with enabled) makes it active again.
	revived := e.must(200, "PATCH", "/v1/jobs/"+id, e.admin, map[string]any{"at": "2026-10-10T00:00:00Z", "enabled": true})
	checkFields(t, "revived", revived, map[string]any{"state": "active", "enabled": true, "nextRunAt": "2026-10-10T00:00:00.000Z"})
	// ...and a schedule turns it into a recurring job.
	rec := e.must(200, "PATCH", "/v1/jobs/"+id, e.admin, map[string]any{"schedule": "@hourly"})
	checkFields(t, "recurring", rec, map[string]any{"at": nil, "schedule": "@hourly", "nextRunAt": "2026-10-09T09:00:00.000Z"})

	// A one-off paused past its instant is completed when resumed.
	j2 := e.createJob(e.admin, map[string]any{"schedule": nil, "at": "2026-10-09T09:00:00Z", "enabled": false})
	checkFields(t, "created paused", j2, map[string]any{"state": "paused", "enabled": false, "nextRunAt": nil})
	e.clock.Advance(time.Hour)
	checkFields(t, "resumed late", e.must(200, "POST", "/v1/jobs/"+j2["id"].(string)+"/resume", e.admin, nil),
		map[string]any{"state": "completed", "nextRunAt": nil})
}

func TestPauseWithdrawsMaterialisedRuns(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	j := e.createJob(e.admin, map[string]any{"schedule": "@every 10s"})
	id := j["id"].(string)
	// The scheduler materialised the next occurrence ahead of its time.
	job, _ := e.store.GetJob(ctx, e.project, id)
	r := vibejobs.NewRun(vibejobs.NewID("run_", e.clock.Now(), nil), job, vibejobs.TriggerSchedule, *job.NextRunAt, e.clock.Now())
	next := job.NextRunAt.Add(10 * time.Second)
	if _, _, err := e.store.ApplyRunPlans(ctx, []vibejobs.RunPlan{{JobID: id, Anchor: job.ScheduleAnchor, From: *job.NextRunAt, Next: &next, Runs: []*vibejobs.Run{r}}}, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if rs := e.must(200, "GET", "/v1/jobs/"+id+"/runs", e.admin, nil)["runs"].([]any); len(rs) != 1 {
		t.Fatalf("runs before pause: %v", rs)
	}
	e.must(200, "POST", "/v1/jobs/"+id+"/pause", e.admin, nil)
	if rs := e.must(200, "GET", "/v1/jobs/"+id+"/runs", e.admin, nil)["runs"].([]any); len(rs) != 0 {
		t.Errorf("a future run survived the pause: %v", rs)
	}
}

// TestPauseWithdrawsAOneOffRunAhead: the scheduler creates a one-off job's
// run up to its lookahead before the instant and marks the job completed.
// Paused in between, the job had not run, yet its run stayed and fired; and
// given a new at and resumed, it fired at both instants. A one-off run
// ahead is withdrawn by a pause as a recurring job's occurrence is.
func TestPauseWithdrawsAOneOffRunAhead(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sch := scheduler.New(scheduler.Config{Store: e.store, Now: e.clock.Now, Logger: slog.New(slog.DiscardHandler)})
	fired := func() (at []string) {
		t.Helper()
		if _, err := sch.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		claims, err := e.store.ClaimDueRuns(ctx, "test", e.clock.Now(), 100, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range claims {
			at = append(at, c.Run.ScheduledFor.UTC().Format("15:04:05"))
		}
		return at
	}
	paused := e.createJob(e.admin, map[string]any{"schedule": nil, "at": "2026-10-09T08:00:30Z"})["id"].(string)
	moved := e.createJob(e.admin, map[string]any{"schedule": nil, "at": "2026-10-09T08:00:30Z"})["id"].(string)
	e.clock.Advance(29 * time.Second) // 08:00:29: both runs are created
	if got := fired(); len(got) != 0 {
		t.Fatalf("fired before the instant: %v", got)
	}
	checkFields(t, "paused before its instant", e.must(200, "POST", "/v1/jobs/"+paused+"/pause", e.admin, nil),
		map[string]any{"state": "paused", "enabled": false})
	e.must(200, "POST", "/v1/jobs/"+moved+"/pause", e.admin, nil)
	checkFields(t, "given a new at", e.must(200, "PATCH", "/v1/jobs/"+moved, e.admin,
		map[string]any{"at": "2026-10-09T08:10:00Z", "enabled": true}),
		map[string]any{"state": "active", "nextRunAt": "2026-10-09T08:10:00.000Z"})
	e.clock.Advance(2 * time.Second)
	if got := fired(); len(got) != 0 {
		t.Errorf("at the old instant, after the pause and the move: fired %v", got)
	}
	e.clock.Advance(10 * time.Minute)
	if got := fired(); !slices.Equal(got, []string{"08:10:00"}) {
		t.Errorf("at the new instant: fired %v, want the moved job once", got)
	}
	// Resumed before its instant, the paused one would run then; past it,
	// it is completed (see TestOneOffJob).
	checkFields(t, "resumed past its instant", e.must(200, "POST", "/v1/jobs/"+paused+"/resume", e.admin, nil),
		map[string]any{"state": "completed", "nextRunAt": nil})
}

// TestNextOfAOneOffRunAhead: the scheduler creates a one-off job's run up
// to its lookahead before the instant and marks the job completed. Until
// the instant the run has not fired, and the preview still shows it: a
// preview that said "no more fire times" disagreed with the run that then
// went out.
func TestNextOfAOneOffRunAhead(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sch := scheduler.New(scheduler.Config{Store: e.store, Now: e.clock.Now, Logger: slog.New(slog.DiscardHandler)})
	id := e.createJob(e.admin, map[string]any{"schedule": nil, "at": "2026-10-09T08:00:30Z"})["id"].(string)
	e.clock.Advance(29 * time.Second) // 08:00:29: the run is created ahead
	if n, err := sch.RunOnce(ctx); err != nil || n != 1 {
		t.Fatalf("RunOnce = %d, %v; want the one-off's run", n, err)
	}
	checkFields(t, "run created ahead", e.must(200, "GET", "/v1/jobs/"+id, e.admin, nil), map[string]any{"state": "completed"})
	if n := e.must(200, "GET", "/v1/jobs/"+id+"/next", e.admin, nil); !slices.Equal(n["times"].([]any), []any{"2026-10-09T08:00:30.000Z"}) ||
		n["state"] != "completed" || n["willRun"] != true {
		t.Errorf("next of a one-off whose run waits for its instant: %v, want [2026-10-09T08:00:30.000Z], completed, willRun", n)
	}
	e.clock.Advance(time.Second)
	claims, err := e.store.ClaimDueRuns(ctx, "test", e.clock.Now(), 10, time.Second)
	if err != nil || len(claims) != 1 || !claims[0].Run.ScheduledFor.Equal(time.Date(2026, 10, 9, 8, 0, 30, 0, time.UTC)) {
		t.Fatalf("claims at the instant: %v, %v; want the one-off's run", claims, err)
	}
	if n := e.must(200, "GET", "/v1/jobs/"+id+"/next", e.admin, nil); len(n["times"].([]any)) != 0 {
		t.Errorf("next of a one-off past its instant: %v, want none", n["times"])
	}
}

func TestPagination(t *testing.T) {
	e := newEnv(t)
	want := map[string]bool{}
	for i := range 120 {
		j := e.createJob(e.admin, map[string]any{"name": "job " + string(rune('a'+i%26))})
		want[j["id"].(string)] = true
	}
	seen := map[string]bool{}
	cursor, pages := "", 0
	for {
		path := "/v1/jobs?limit=25"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		page := e.must(200, "GET", path, e.admin, nil)
		pages++
		for _, j := range page["jobs"].([]any) {
			id := j.(map[string]any)["id"].(string)
			if seen[id] {
				t.Errorf("job %s listed twice", id)
			}
			seen[id] = true
		}
		nc, _ := page["nextCursor"].(string)
		if nc == "" {
			break
		}
		cursor = nc
		if pages > 10 {
			t.Fatal("pagination does not end")
		}
	}
	if len(seen) != len(want) || pages != 5 {
		t.Errorf("walked %d pages, saw %d of %d jobs", pages, len(seen), len(want))
	}
	for id := range want {
		if !seen[id] {
			t.Errorf("job %s missed", id)
		}
	}
	// Default page size is 50.
	if page := e.must(200, "GET", "/v1/jobs", e.admin, nil); len(page["jobs"].([]any)) != 50 {
		t.Errorf("default page: %d jobs", len(page["jobs"].([]any)))
	}

	// Runs page the same way.
	id := e.createJob(e.admin, nil)["id"].(string)
	for range 7 {
		e.must(202, "POST", "/v1/jobs/"+id+"/runs", e.admin, nil)
		e.clock.Advance(time.Millisecond)
	}
	seen = map[string]bool{}
	cursor = ""
	for {
		path := "/v1/jobs/" + id + "/runs?limit=3"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		page := e.must(200, "GET", path, e.admin, nil)
		for _, r := range page["runs"].([]any) {
			seen[r.(map[string]any)["id"].(string)] = true
		}
		nc, _ := page["nextCursor"].(string)
		if nc == "" {
			break
		}
		cursor = nc
	}
	if len(seen) != 7 {
		t.Errorf("walked %d runs of 7", len(seen))
	}
}

func TestMaxJobsPerProject(t *testing.T) {
	e := newEnv(t, func(c *api.Config) { c.MaxJobsPerProject = 2 })
	e.createJob(e.admin, nil)
	id := e.createJob(e.admin, nil)["id"].(string)
	res := e.do("POST", "/v1/jobs", e.admin, jobBody(nil))
	if code, _ := res.errorCode(t); res.status != 409 || code != "too_many_jobs" {
		t.Errorf("third job: %s", res)
	}
	e.must(204, "DELETE", "/v1/jobs/"+id, e.admin, nil)
	e.createJob(e.admin, nil)
}

func TestUnknownRoutesAndMethods(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/v1/nothing", 404, "not_found"},
		{"GET", "/", 404, "not_found"},
		{"GET", "/v1/jobs/", 404, "not_found"},
		// Unclean paths are not redirected to the route they clean to.
		{"GET", "//v1/jobs", 404, "not_found"},
		{"GET", "/v1//jobs", 404, "not_found"},
		{"POST", "/v1/jobs/../projects", 404, "not_found"},
		{"GET", "/v1/./jobs", 404, "not_found"},
		{"GET", "/v1/../healthz", 404, "not_found"},
		{"PUT", "/v1/jobs", 405, "method_not_allowed"},
		{"DELETE", "/v1/jobs", 405, "method_not_allowed"},
		{"POST", "/v1/jobs/job_x", 405, "method_not_allowed"},
		{"POST", "/healthz", 405, "method_not_allowed"},
		// A method is any token the client likes: the answer repeats none.
		{"VJ_MARKER_METHOD", "/v1/jobs", 405, "method_not_allowed"},
		{"X-Token_vjt_123.abc~", "/healthz", 405, "method_not_allowed"},
	} {
		res := e.do(tc.method, tc.path, e.admin, nil)
		if code, _ := res.errorCode(t); res.status != tc.status || code != tc.code {
			t.Errorf("%s %s: %s", tc.method, tc.path, res)
		}
		if tc.status == 405 && strings.Contains(string(res.body), tc.method) {
			t.Errorf("%s %s: the answer repeats the method: %s", tc.method, tc.path, res.body)
		}
		if ct := res.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: Content-Type %q", tc.method, tc.path, ct)
		}
		if tc.status == 405 && res.header.Get("Allow") == "" {
			t.Errorf("%s %s: no Allow header", tc.method, tc.path)
		}
	}

	// Extra serves paths outside the API; the API's own stay JSON.
	e2 := newEnv(t, func(c *api.Config) {
		c.Extra = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("dashboard")) })
		c.Metrics = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("metrics")) })
	})
	if res := e2.do("GET", "/", "", nil); res.status != 200 || string(res.body) != "dashboard" {
		t.Errorf("Extra: %s", res)
	}
	if res := e2.do("GET", "/v1/nothing", "", nil); res.status != 404 {
		t.Errorf("/v1 path with Extra: %s", res)
	}
	if res := e2.do("GET", "/metrics", "", nil); res.status != 200 || string(res.body) != "metrics" {
		t.Errorf("metrics: %s", res)
	}
}

// checkFields compares the fields of want with got.
func checkFields(t *testing.T, what string, got, want map[string]any) {
	t.Helper()
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("%s: no field %q", what, k)
			continue
		}
		if !equalJSON(g, w) {
			t.Errorf("%s: %s = %#v, want %#v", what, k, g, w)
		}
	}
}

func equalJSON(a, b any) bool {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok || len(av) != len(bv) {
			return false
		}
		for k := range av {
			if !equalJSON(av[k], bv[k]) {
				return false
			}
		}
		return true
	case []any:
		bv, ok := b.([]any)
		return ok && slices.EqualFunc(av, bv, equalJSON)
	}
	return a == b
}

// TestJobChangedAfterSettingsCommit: JobChanged names a job once a change to
// its URL, timeout, retry policy or secret, a pause or a schedule change, or
// its deletion, committed, and not for a change that leaves its delivery
// and its occurrences alone or is refused.
func TestJobChangedAfterSettingsCommit(t *testing.T) {
	var mu sync.Mutex
	var changed []string
	e := newEnv(t, func(c *api.Config) {
		c.JobChanged = func(id string) { mu.Lock(); changed = append(changed, id); mu.Unlock() }
	})
	take := func() []string { mu.Lock(); defer mu.Unlock(); out := changed; changed = nil; return out }
	id := e.createJob(e.admin, nil)["id"].(string)
	for _, tc := range []struct {
		what, method, path string
		body               any
		status             int
		want               []string
	}{
		{"rename", "PATCH", "/v1/jobs/" + id, map[string]any{"name": "renamed"}, 200, nil},
		{"pause", "POST", "/v1/jobs/" + id + "/pause", nil, 200, []string{id}},
		{"pause again", "POST", "/v1/jobs/" + id + "/pause", nil, 200, nil},
		{"resume", "POST", "/v1/jobs/" + id + "/resume", nil, 200, nil},
		{"schedule", "PATCH", "/v1/jobs/" + id, map[string]any{"schedule": "@hourly"}, 200, []string{id}},
		{"refused URL", "PATCH", "/v1/jobs/" + id, map[string]any{"url": "ftp://x"}, 400, nil},
		{"URL", "PATCH", "/v1/jobs/" + id, map[string]any{"url": "http://127.0.0.1:9/other"}, 200, []string{id}},
		{"timeout", "PATCH", "/v1/jobs/" + id, map[string]any{"timeout": "20s"}, 200, []string{id}},
		{"retry", "PATCH", "/v1/jobs/" + id, map[string]any{"retry": map[string]any{"maxAttempts": 2}}, 200, []string{id}},
		{"secret", "POST", "/v1/jobs/" + id + "/rotate-secret", nil, 200, []string{id}},
		{"delete", "DELETE", "/v1/jobs/" + id, nil, 204, []string{id}},
	} {
		if res := e.do(tc.method, tc.path, e.admin, tc.body); res.status != tc.status {
			t.Fatalf("%s: %s", tc.what, res)
		}
		if got := take(); !slices.Equal(got, tc.want) {
			t.Errorf("%s: JobChanged(%v), want %v", tc.what, got, tc.want)
		}
	}
}
