package api_test

import (
	"testing"
	"time"
)

// TestRunEndsAsTheAPIShowsThem pins what GET /v1/runs/{id} shows of the
// ends of SEMANTICS.md sections 2 and 3: a 403 fails the run at once,
// app_rejected, and rotating the secret does not revive it; the last
// attempt used up fails it, attempts_exhausted; deleting the job cancels
// its waiting runs, job_deleted. A finished run has no next attempt.
func TestRunEndsAsTheAPIShowsThem(t *testing.T) {
	e := newEnv(t)
	j := e.createJob(e.admin, map[string]any{"retry": map[string]any{"maxAttempts": 2, "minBackoff": "1s"}})
	id := j["id"].(string)
	trigger := func() string {
		t.Helper()
		return e.must(202, "POST", "/v1/jobs/"+id+"/runs", e.admin, nil)["id"].(string)
	}
	show := func(run string) map[string]any {
		t.Helper()
		return e.must(200, "GET", "/v1/runs/"+run, e.admin, nil)
	}

	rejected := trigger()
	if n := e.deliver(403); n != 1 {
		t.Fatalf("delivered %d runs", n)
	}
	e.must(200, "POST", "/v1/jobs/"+id+"/rotate-secret", e.admin, nil)
	got := show(rejected)
	checkFields(t, "after a 403", got, map[string]any{"state": "failed", "failureReason": "app_rejected", "attempt": 1.0, "nextAttemptAt": nil})
	if got["finishedAt"] == nil {
		t.Error("a failed run has no finishedAt")
	}
	if a := got["attempts"].([]any); len(a) != 1 {
		t.Errorf("attempts after a 403: %v", a)
	} else {
		checkFields(t, "the refused attempt", a[0].(map[string]any), map[string]any{"number": 1.0, "statusCode": 403.0, "errorCode": "http_4xx"})
	}

	exhausted := trigger()
	e.deliver(503)
	checkFields(t, "after one 503 of two attempts", show(exhausted), map[string]any{"state": "retrying", "attempt": 1.0})
	e.clock.Advance(time.Minute)
	e.deliver(503)
	checkFields(t, "after the second 503", show(exhausted), map[string]any{"state": "failed", "failureReason": "attempts_exhausted", "attempt": 2.0, "nextAttemptAt": nil})

	waiting := trigger()
	e.deliver(0) // a timeout: retrying
	retrying := show(waiting)
	checkFields(t, "after a timeout", retrying, map[string]any{"state": "retrying", "attempt": 1.0})
	if retrying["nextAttemptAt"] == nil {
		t.Error("a retrying run has no nextAttemptAt")
	}
	scheduled := trigger()
	if res := e.do("DELETE", "/v1/jobs/"+id, e.admin, nil); res.status != 204 {
		t.Fatalf("delete: %s", res)
	}
	for _, run := range []string{waiting, scheduled} {
		checkFields(t, "a waiting run of a deleted job", show(run), map[string]any{"state": "cancelled", "failureReason": "job_deleted", "nextAttemptAt": nil})
	}
	// Runs that had ended keep their end.
	checkFields(t, "a failed run of a deleted job", show(rejected), map[string]any{"state": "failed", "failureReason": "app_rejected"})
}
