package api_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/api"
)

// feedLines reads the whole feed as token and returns "type job run" lines.
func (e *env) feedLines(token string, after int) []string {
	e.t.Helper()
	var out []string
	for {
		m := e.must(200, "GET", fmt.Sprintf("/v1/events?after=%d&limit=100", after), token, nil)
		for _, it := range m["items"].([]any) {
			item := it.(map[string]any)
			run, _ := item["runId"].(string)
			out = append(out, strings.TrimSpace(item["type"].(string)+" "+item["jobId"].(string)+" "+run))
		}
		next := int(m["next"].(float64))
		if next == after {
			return out
		}
		after = next
	}
}

func TestJobEvents(t *testing.T) {
	e := newEnv(t)
	id := e.createJob(e.admin, nil)["id"].(string)
	e.must(200, "PATCH", "/v1/jobs/"+id, e.admin, map[string]any{"name": "renamed"})
	e.must(200, "PATCH", "/v1/jobs/"+id, e.admin, map[string]any{"name": "renamed"}) // no change, no event
	e.must(200, "POST", "/v1/jobs/"+id+"/pause", e.admin, nil)
	e.must(200, "POST", "/v1/jobs/"+id+"/pause", e.admin, nil) // paused already
	e.must(200, "POST", "/v1/jobs/"+id+"/resume", e.admin, nil)
	e.must(200, "PATCH", "/v1/jobs/"+id, e.admin, map[string]any{"enabled": false, "schedule": "@hourly"})
	e.must(200, "POST", "/v1/jobs/"+id+"/rotate-secret", e.admin, nil)
	e.must(200, "POST", "/v1/jobs/"+id+"/resume", e.admin, nil)
	run := e.must(202, "POST", "/v1/jobs/"+id+"/runs", e.admin, nil)["id"].(string)
	e.deliver(503)
	e.clock.Advance(time.Second) // the next run's id sorts after
	waiting := e.must(202, "POST", "/v1/jobs/"+id+"/runs", e.admin, nil)["id"].(string)
	e.must(204, "DELETE", "/v1/jobs/"+id, e.admin, nil)

	got := e.feedLines(e.admin, 0)
	want := []string{
		"job.created " + id, "job.updated " + id, "job.paused " + id, "job.resumed " + id,
		"job.updated " + id, "job.paused " + id, "job.secret_rotated " + id, "job.resumed " + id,
		"run.retrying " + id + " " + run,
	}
	cancelled := []string{"run.cancelled " + id + " " + run, "run.cancelled " + id + " " + waiting}
	want = append(append(want, cancelled...), "job.deleted "+id)
	if !slices.Equal(got, want) {
		t.Fatalf("feed:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	m := e.must(200, "GET", "/v1/events?after=8&limit=2", e.admin, nil)
	items := m["items"].([]any)
	retry := items[0].(map[string]any)
	checkFields(t, "run.retrying", retry, map[string]any{
		"sequence": 9.0, "type": "run.retrying", "occurredAt": "2026-10-09T08:00:00.120Z", "jobId": id, "runId": run,
		"data": map[string]any{"state": "retrying", "attempt": 1.0, "errorCode": "http_5xx", "statusCode": 503.0,
			"nextAttemptAt": "2026-10-09T08:00:30.120Z"},
	})
	if m["head"] != 12.0 || m["next"] != 10.0 || m["oldest"] != 1.0 {
		t.Errorf("head %v next %v oldest %v, want 12 10 1", m["head"], m["next"], m["oldest"])
	}
	first := e.must(200, "GET", "/v1/events?limit=1", e.admin, nil)["items"].([]any)[0].(map[string]any)
	checkFields(t, "job.created", first, map[string]any{
		"sequence": 1.0, "type": "job.created", "jobId": id, "runId": nil,
		"data": map[string]any{"state": "active", "nextRunAt": "2026-10-09T08:05:00.000Z"},
	})
	last := e.must(200, "GET", "/v1/events?after=11", e.admin, nil)["items"].([]any)[0].(map[string]any)
	checkFields(t, "job.deleted", last, map[string]any{"data": map[string]any{"state": "deleted"}})

	// Filters.
	m = e.must(200, "GET", "/v1/events?type=job.paused&type=job.resumed", e.admin, nil)
	if n := len(m["items"].([]any)); n != 4 || m["next"] != 12.0 {
		t.Errorf("paused and resumed: %d events, next %v", n, m["next"])
	}
	m = e.must(200, "GET", "/v1/events?type=run.cancelled,run.retrying&jobId="+id, e.admin, nil)
	if n := len(m["items"].([]any)); n != 3 {
		t.Errorf("run events of the job: %d", n)
	}
	if m := e.must(200, "GET", "/v1/events?after=12", e.admin, nil); m["next"] != 12.0 || m["head"] != 12.0 {
		t.Errorf("at the head: %v", m)
	}
	m = e.must(200, "GET", "/v1/events?jobId=job_other", e.admin, nil)
	if n := len(m["items"].([]any)); n != 0 || m["next"] != 12.0 {
		t.Errorf("another job: %d events, next %v", n, m["next"])
	}
	for q, code := range map[string]string{
		"after=-1": "invalid_after", "after=x": "invalid_after", "after=1&after=2": "invalid_after",
		// Beyond the head (12): not a cursor of this feed; answered as
		// caught up, its reader would wait for ever.
		"after=13": "invalid_after", "after=9223372036854775807": "invalid_after",
		"limit=0": "invalid_limit", "limit=101": "invalid_limit",
		"type=run.nope": "invalid_type", "type=": "invalid_type", "jobId=": "invalid_job_id",
	} {
		res := e.do("GET", "/v1/events?"+q, e.admin, nil)
		if c, _ := res.errorCode(t); res.status != 400 || c != code {
			t.Errorf("%s: %s, want 400 %s", q, res, code)
		}
	}

	// The feed never holds a URL or a secret.
	e.mu.Lock()
	bodies := slices.Clone(e.bodies)
	e.mu.Unlock()
	for _, b := range bodies {
		if strings.Contains(b, `"items"`) && (strings.Contains(b, "example.test") || strings.Contains(b, "vjs_")) {
			t.Errorf("a feed page holds a URL or a secret: %s", b)
		}
	}
}

// TestEventsOnce: a replayed create appends nothing; a refused one nothing
// either; a batch appends one event per job.
func TestEventsOnce(t *testing.T) {
	e := newEnv(t, func(c *api.Config) { c.MaxJobsPerProject = 3 })
	r := req{method: "POST", path: "/v1/jobs", token: e.admin, key: "once", body: jobBody(nil)}
	e.send(r)
	e.send(r)
	e.must(400, "POST", "/v1/jobs", e.admin, jobBody(map[string]any{"schedule": "bogus"}))
	e.must(201, "POST", "/v1/jobs/batch", e.admin, map[string]any{"jobs": []any{jobBody(nil), jobBody(nil)}})
	e.must(409, "POST", "/v1/jobs", e.admin, jobBody(nil))
	if got := e.feedLines(e.admin, 0); len(got) != 3 {
		t.Fatalf("feed: %v, want 3 job.created", got)
	}
}

func TestEventsIsolation(t *testing.T) {
	e := newEnv(t)
	e.createJob(e.admin, nil)
	_, toks := e.newProject("other")
	for _, tok := range toks {
		m := e.must(200, "GET", "/v1/events", tok, nil)
		if len(m["items"].([]any)) != 0 || m["head"] != 0.0 {
			t.Errorf("another project's token sees %v", m)
		}
	}
	e.createJob(toks[vibejobs.RoleWrite], nil)
	if got := e.feedLines(toks[vibejobs.RoleRead], 0); len(got) != 1 {
		t.Errorf("the other project's feed: %v", got)
	}
	if got := e.feedLines(e.admin, 0); len(got) != 1 {
		t.Errorf("the first project's feed: %v", got)
	}
}

func TestSubscriptionsAPI(t *testing.T) {
	e := newEnv(t)
	id := e.createJob(e.admin, nil)["id"].(string)
	e.must(200, "POST", "/v1/jobs/"+id+"/pause", e.admin, nil)

	res := e.send(req{method: "POST", path: "/v1/subscriptions", token: e.admin, key: "sub-1",
		body: map[string]any{"url": "https://hooks.example.test/vj", "types": []string{"run.failed", "run.failed", "job.paused"}, "jobIds": []string{id}}})
	if res.status != 201 {
		t.Fatalf("create: %s", res)
	}
	created := res.json(t)
	subID := created["id"].(string)
	secret := created["secret"].(string)
	if !contract.ValidSecret(secret) || res.header.Get("Location") != "/v1/subscriptions/"+subID {
		t.Errorf("secret %q location %q", secret, res.header.Get("Location"))
	}
	checkFields(t, "created subscription", created, map[string]any{
		"url": "https://hooks.example.test/vj", "types": []any{"run.failed", "job.paused"}, "jobIds": []any{id},
		"cursor": 2.0, "failing": false, "errorCode": nil, "attempts": 0.0, "nextAttemptAt": nil, "lastSuccessAt": nil,
		"previousSecretExpiresAt": nil, "createdAt": "2026-10-09T08:00:00.000Z",
	})
	again := e.send(req{method: "POST", path: "/v1/subscriptions", token: e.admin, key: "sub-1",
		body: map[string]any{"url": "https://hooks.example.test/vj", "types": []string{"run.failed", "run.failed", "job.paused"}, "jobIds": []string{id}}})
	if !bytes.Equal(again.body, res.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %s", again)
	}

	// Sealed at rest under the master key, bound to the subscription id.
	stored, err := e.store.GetSubscription(context.Background(), e.project, subID)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := e.keys.Open(stored.Secret, subID); err != nil || got != secret {
		t.Errorf("stored secret opens to %q, %v", got, err)
	}
	if _, err := e.keys.Open(stored.Secret, id); err == nil {
		t.Error("the sealed secret opens under another id")
	}

	got := e.must(200, "GET", "/v1/subscriptions/"+subID, e.admin, nil)
	if _, ok := got["secret"]; ok {
		t.Error("GET shows the secret")
	}
	list := e.must(200, "GET", "/v1/subscriptions", e.admin, nil)["subscriptions"].([]any)
	if len(list) != 1 || strings.Contains(fmt.Sprint(list), secret) {
		t.Errorf("list: %v", list)
	}

	// Rotation keeps the old secret signing for the grace window.
	e.clock.Advance(time.Minute)
	rot := e.must(200, "POST", "/v1/subscriptions/"+subID+"/rotate-secret", e.admin, nil)
	if rot["secret"] == secret || !contract.ValidSecret(rot["secret"].(string)) ||
		rot["previousSecretExpiresAt"] != "2026-10-10T08:01:00.000Z" {
		t.Errorf("rotate: %v", rot)
	}
	stored, _ = e.store.GetSubscription(context.Background(), e.project, subID)
	if old, err := e.keys.Open(stored.PreviousSecret, subID); err != nil || old != secret {
		t.Errorf("previous secret %q, %v", old, err)
	}
	e.clock.Advance(24 * time.Hour)
	if g := e.must(200, "GET", "/v1/subscriptions/"+subID, e.admin, nil); g["previousSecretExpiresAt"] != nil {
		t.Errorf("after the grace window: %v", g["previousSecretExpiresAt"])
	}

	// PATCH and reset.
	p := e.must(200, "PATCH", "/v1/subscriptions/"+subID, e.admin, map[string]any{"types": []string{}, "url": "https://other.example.test/"})
	if len(p["types"].([]any)) != 0 || p["url"] != "https://other.example.test/" || len(p["jobIds"].([]any)) != 1 {
		t.Errorf("patched: %v", p)
	}
	e.must(200, "POST", "/v1/jobs/"+id+"/resume", e.admin, nil)
	before := e.must(200, "GET", "/v1/subscriptions/"+subID, e.admin, nil)["cursor"]
	r := e.must(200, "POST", "/v1/subscriptions/"+subID+"/reset", e.admin, nil)
	if r["cursor"] != 3.0 {
		t.Errorf("reset cursor %v, want the head 3", r["cursor"])
	}
	// The answer names what the reset skipped, to be read from the feed.
	if sk, _ := r["skipped"].(map[string]any); before == 3.0 || sk == nil || sk["after"] != before || sk["through"] != 3.0 {
		t.Errorf("reset from cursor %v skipped %v, want after it through 3", before, r["skipped"])
	}
	if r := e.must(200, "POST", "/v1/subscriptions/"+subID+"/reset", e.admin, nil); r["skipped"] != nil {
		t.Errorf("a reset at the head skipped %v, want null", r["skipped"])
	}

	// Refusals.
	for _, c := range []struct {
		body       any
		code, fld  string
		wantStatus int
	}{
		{map[string]any{"url": "http://10.1.2.3/hook"}, "url_not_allowed", "url", 400},
		{map[string]any{"url": "ftp://example.test/"}, "invalid_url", "url", 400},
		{map[string]any{}, "invalid_url", "url", 400},
		{map[string]any{"url": "https://example.test/", "types": []string{"run.nope"}}, "invalid_type", "types", 400},
		{map[string]any{"url": "https://example.test/", "types": nil}, "invalid_json", "types", 400},
		{map[string]any{"url": "https://example.test/", "jobIds": []string{"run_x"}}, "invalid_job_id", "jobIds", 400},
		{map[string]any{"url": "https://example.test/", "jobIds": []any{1}}, "invalid_json", "jobIds", 400},
		{map[string]any{"url": "https://example.test/", "secret": "x"}, "unknown_field", "secret", 400},
	} {
		res := e.do("POST", "/v1/subscriptions", e.admin, c.body)
		if code, fld := res.errorCode(t); res.status != c.wantStatus || code != c.code || fld != c.fld {
			t.Errorf("%v: %s, want %d %s (%s)", c.body, res, c.wantStatus, c.code, c.fld)
		}
	}
	_, toks := e.newProject("other")
	e.must(403, "POST", "/v1/subscriptions", toks[vibejobs.RoleRead], map[string]any{"url": "https://example.test/"})
	e.must(404, "GET", "/v1/subscriptions/"+subID, toks[vibejobs.RoleAdmin], nil)
	e.must(404, "POST", "/v1/subscriptions/"+subID+"/reset", toks[vibejobs.RoleAdmin], nil)
	e.must(404, "DELETE", "/v1/subscriptions/"+subID, toks[vibejobs.RoleAdmin], nil)
}

func TestSubscriptionLimit(t *testing.T) {
	e := newEnv(t)
	var ids []string
	for i := range vibejobs.MaxSubscriptionsPerProject {
		m := e.must(201, "POST", "/v1/subscriptions", e.admin, map[string]any{"url": fmt.Sprintf("https://example.test/%d", i)})
		ids = append(ids, m["id"].(string))
	}
	res := e.do("POST", "/v1/subscriptions", e.admin, map[string]any{"url": "https://example.test/17"})
	if code, _ := res.errorCode(t); res.status != 409 || code != "too_many_subscriptions" {
		t.Fatalf("a 17th subscription: %s", res)
	}
	_, toks := e.newProject("other")
	e.must(201, "POST", "/v1/subscriptions", toks[vibejobs.RoleWrite], map[string]any{"url": "https://example.test/"})
	e.must(204, "DELETE", "/v1/subscriptions/"+ids[0], e.admin, nil)
	e.must(404, "DELETE", "/v1/subscriptions/"+ids[0], e.admin, nil)
	e.must(201, "POST", "/v1/subscriptions", e.admin, map[string]any{"url": "https://example.test/17"})
}

func TestSubscriptionSecretNotAtRest(t *testing.T) {
	e := newEnv(t)
	var secrets []string
	m := e.must(201, "POST", "/v1/subscriptions", e.admin, map[string]any{"url": "https://example.test/"})
	secrets = append(secrets, m["secret"].(string))
	m = e.must(200, "POST", "/v1/subscriptions/"+m["id"].(string)+"/rotate-secret", e.admin, nil)
	secrets = append(secrets, m["secret"].(string))
	e.store.Close()
	files, _ := filepath.Glob(e.dbPath + "*")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range secrets {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s holds a subscription secret in clear", filepath.Base(f))
			}
		}
	}
	if strings.Contains(e.logs.String(), "vjs_") {
		t.Error("the log holds a secret")
	}
}

// TestRotatingAnUnopenableSubscriptionSecret: rotate-secret is how an
// operator revives a subscription whose secret no longer opens (sealed
// under a master key the key file lost). Such a secret cannot sign, so it is
// not kept as the previous one: the answer shows no grace window, and the
// row holds no secret that a later master key rotation could not re-seal.
func TestRotatingAnUnopenableSubscriptionSecret(t *testing.T) {
	e := newEnv(t)
	subID := e.must(201, "POST", "/v1/subscriptions", e.admin, map[string]any{"url": "https://example.test/"})["id"].(string)
	lost := mustKeyring(t)
	old, _ := contract.NewSecret(nil)
	sealed, err := lost.Seal(old, subID)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.Update(context.Background(), func(tx vibejobs.Tx) error {
		return tx.SetSubscriptionSecrets(context.Background(), subID, sealed, vibejobs.SealedSecret{})
	}); err != nil {
		t.Fatal(err)
	}
	rot := e.must(200, "POST", "/v1/subscriptions/"+subID+"/rotate-secret", e.admin, nil)
	if rot["previousSecretExpiresAt"] != nil {
		t.Errorf("rotating an unopenable secret: previousSecretExpiresAt %v, want null", rot["previousSecretExpiresAt"])
	}
	stored, err := e.store.GetSubscription(context.Background(), e.project, subID)
	if err != nil {
		t.Fatal(err)
	}
	if stored.PreviousSecret.KeyID != "" || stored.PreviousExpiresAt != nil {
		t.Errorf("the unopenable secret was kept as the previous one (key %q, until %v)",
			stored.PreviousSecret.KeyID, stored.PreviousExpiresAt)
	}
	if s, err := e.keys.Open(stored.Secret, subID); err != nil || s != rot["secret"] {
		t.Errorf("the new secret does not open as answered: %v", err)
	}
}

// TestSubscriptionJobIDsMustBeJobsOfTheProject: a filter naming no live job
// of the project would silently send nothing, so it is refused (400
// invalid_job_id, field jobIds): a malformed id, a deleted job's, and
// another project's job, answered exactly as an id never given out, so that
// a tenant learns nothing of another's ids. A repeated id is kept once, as
// a repeated type is. A PATCH may send back the ids the subscription
// already holds, though their jobs were deleted since (their last runs'
// events may still come).
func TestSubscriptionJobIDsMustBeJobsOfTheProject(t *testing.T) {
	e := newEnv(t)
	live := e.createJob(e.admin, nil)["id"].(string)
	deleted := e.createJob(e.admin, nil)["id"].(string)
	later := e.createJob(e.admin, nil)["id"].(string)
	e.must(204, "DELETE", "/v1/jobs/"+deleted, e.admin, nil)
	_, toks := e.newProject("other")
	theirs := e.createJob(toks[vibejobs.RoleWrite], nil)["id"].(string)
	const never = "job_01a0000000000000000000000000"

	refusal := func(method, path string, body map[string]any, id string) string {
		t.Helper()
		res := e.do(method, path, e.admin, body)
		if code, fld := res.errorCode(t); res.status != 400 || code != "invalid_job_id" || fld != "jobIds" {
			t.Errorf("%s %s with jobIds %v: %s, want 400 invalid_job_id (jobIds)", method, path, body["jobIds"], res)
		}
		return strings.ReplaceAll(string(res.body), id, "<id>")
	}
	for _, path := range []string{"/v1/subscriptions", ""} {
		method := "POST"
		if path == "" {
			method = "PATCH"
			path = "/v1/subscriptions/" + e.must(201, "POST", "/v1/subscriptions", e.admin,
				map[string]any{"url": "https://example.test/"})["id"].(string)
		}
		body := func(id string) map[string]any {
			return map[string]any{"url": "https://example.test/", "jobIds": []string{live, id}}
		}
		refusal(method, path, body("job_bad!"), "job_bad!")
		refusal(method, path, body(deleted), deleted)
		if a, b := refusal(method, path, body(theirs), theirs), refusal(method, path, body(never), never); a != b {
			t.Errorf("%s %s: another project's job answers %s, a job that never was %s", method, path, a, b)
		}
	}

	sub := e.must(201, "POST", "/v1/subscriptions", e.admin,
		map[string]any{"url": "https://example.test/", "jobIds": []string{live, later, live}})
	if ids := sub["jobIds"].([]any); len(ids) != 2 || ids[0] != live || ids[1] != later {
		t.Errorf("jobIds %v, want [%s %s]", ids, live, later)
	}
	e.must(204, "DELETE", "/v1/jobs/"+later, e.admin, nil)
	patched := e.must(200, "PATCH", "/v1/subscriptions/"+sub["id"].(string), e.admin,
		map[string]any{"types": []string{"run.failed"}, "jobIds": []string{live, later}})
	if ids := patched["jobIds"].([]any); len(ids) != 2 {
		t.Errorf("jobIds after a PATCH sending them back: %v", ids)
	}
	refusal("PATCH", "/v1/subscriptions/"+sub["id"].(string), map[string]any{"jobIds": []string{live, later, deleted}}, deleted)
}
