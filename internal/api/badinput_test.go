package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
)

// TestBadInput sends every kind of bad input the issues list: each gets a
// 4xx with its specific code and field, never a 500.
func TestBadInput(t *testing.T) {
	e := newEnv(t, func(c *api.Config) { c.MaxJobsPerProject = 3 })
	jobID := e.createJob(e.admin, nil)["id"].(string)
	_, other := e.newProject("other")
	otherJob := e.createJob(other[vibejobs.RoleAdmin], nil)["id"].(string)
	_, readTok := func() (string, string) {
		tk := e.must(201, "POST", "/v1/projects/"+e.project+"/tokens", e.admin, map[string]any{"name": "reader", "role": "read"})
		return tk["id"].(string), tk["token"].(string)
	}()
	writeTk := e.must(201, "POST", "/v1/projects/"+e.project+"/tokens", e.admin, map[string]any{"name": "writer", "role": "write"})
	writeTok := writeTk["token"].(string)
	revoked := e.must(201, "POST", "/v1/projects/"+e.project+"/tokens", e.admin, map[string]any{"name": "gone", "role": "admin"})
	e.must(204, "DELETE", "/v1/tokens/"+revoked["id"].(string), e.admin, nil)

	const badURL = "ftp://user:pw@files.example.test/secret-path"
	big := `{"name":"` + strings.Repeat("x", 64<<10) + `"}`
	type tc struct {
		name   string
		r      req
		status int
		code   string
		field  string
	}
	create := func(name, body string, status int, code, field string) tc {
		return tc{name, req{method: "POST", path: "/v1/jobs", body: body, key: keyAuto}, status, code, field}
	}
	patch := func(name, body string, status int, code, field string) tc {
		return tc{name, req{method: "PATCH", path: "/v1/jobs/" + jobID, body: body}, status, code, field}
	}
	valid := `"name":"n","url":"https://example.test/h"`
	cases := []tc{
		// JSON form.
		create("empty body", "", 400, "invalid_json", ""),
		create("not JSON", "{name", 400, "invalid_json", ""),
		create("array", `[]`, 400, "invalid_json", ""),
		create("null body", `null`, 400, "invalid_json", ""),
		create("string body", `"job"`, 400, "invalid_json", ""),
		create("truncated", `{"name":"n"`, 400, "invalid_json", ""),
		create("trailing data", `{`+valid+`,"schedule":"@daily"} x`, 400, "invalid_json", ""),
		create("two values", `{`+valid+`,"schedule":"@daily"}{}`, 400, "invalid_json", ""),
		create("duplicate field", `{`+valid+`,"schedule":"@daily","name":"m"}`, 400, "invalid_json", "name"),
		create("unknown field", `{`+valid+`,"schedule":"@daily","secret":"x"}`, 400, "unknown_field", "secret"),
		create("long unknown field", `{"`+strings.Repeat("k", 1000)+`":1}`, 400, "unknown_field", strings.Repeat("k", 64)+"…"),
		create("unknown retry field", `{`+valid+`,"schedule":"@daily","retry":{"max":3}}`, 400, "unknown_field", "retry.max"),
		create("wrong type name", `{"name":5,"url":"https://example.test/h","schedule":"@daily"}`, 400, "invalid_json", "name"),
		create("wrong type enabled", `{`+valid+`,"schedule":"@daily","enabled":"yes"}`, 400, "invalid_json", "enabled"),
		create("wrong type retry", `{`+valid+`,"schedule":"@daily","retry":[]}`, 400, "invalid_json", "retry"),
		create("wrong type maxAttempts", `{`+valid+`,"schedule":"@daily","retry":{"maxAttempts":"4"}}`, 400, "invalid_json", "retry.maxAttempts"),
		create("fractional maxAttempts", `{`+valid+`,"schedule":"@daily","retry":{"maxAttempts":2.5}}`, 400, "invalid_json", "retry.maxAttempts"),
		create("huge maxAttempts", `{`+valid+`,"schedule":"@daily","retry":{"maxAttempts":1e40}}`, 400, "invalid_json", "retry.maxAttempts"),
		create("numeric timeout", `{`+valid+`,"schedule":"@daily","timeout":10}`, 400, "invalid_json", "timeout"),
		create("null name", `{"name":null,"url":"https://example.test/h","schedule":"@daily"}`, 400, "invalid_json", "name"),
		create("null schedule", `{`+valid+`,"schedule":null}`, 400, "invalid_json", "schedule"),
		create("null retry", `{`+valid+`,"schedule":"@daily","retry":null}`, 400, "invalid_json", "retry"),
		create("null enabled", `{`+valid+`,"schedule":"@daily","enabled":null}`, 400, "invalid_json", "enabled"),
		{"body too large", req{method: "POST", path: "/v1/jobs", body: big, key: keyAuto}, 413, "body_too_large", ""},
		// Fields.
		create("missing name", `{"url":"https://example.test/h","schedule":"@daily"}`, 400, "invalid_name", "name"),
		create("blank name", `{"name":"  ","url":"https://example.test/h","schedule":"@daily"}`, 400, "invalid_name", "name"),
		create("long name", `{"name":"`+strings.Repeat("é", 201)+`","url":"https://example.test/h","schedule":"@daily"}`, 400, "invalid_name", "name"),
		create("control in name", `{"name":"a\u0007b","url":"https://example.test/h","schedule":"@daily"}`, 400, "invalid_name", "name"),
		create("bidi override in name", `{"name":"invoice\u202egpj.exe","url":"https://example.test/h","schedule":"@daily"}`, 400, "invalid_name", "name"),
		create("bidi isolate in name", `{"name":"a\u2067b","url":"https://example.test/h","schedule":"@daily"}`, 400, "invalid_name", "name"),
		create("zero-width space in name", `{"name":"a\u200bb","url":"https://example.test/h","schedule":"@daily"}`, 400, "invalid_name", "name"),
		create("tag character in name", `{"name":"a\udb40\udc41b","url":"https://example.test/h","schedule":"@daily"}`, 400, "invalid_name", "name"),
		create("line separator in name", `{"name":"a\u2028b","url":"https://example.test/h","schedule":"@daily"}`, 400, "invalid_name", "name"),
		create("no schedule", `{`+valid+`}`, 400, "schedule_required", "schedule"),
		create("schedule and at", `{`+valid+`,"schedule":"@daily","at":"2026-10-10T00:00:00Z"}`, 400, "schedule_conflict", "schedule"),
		create("bad cron", `{`+valid+`,"schedule":"61 * * * *"}`, 400, "invalid_schedule", "schedule"),
		create("empty schedule", `{`+valid+`,"schedule":""}`, 400, "invalid_schedule", "schedule"),
		create("every too short", `{`+valid+`,"schedule":"@every 500ms"}`, 400, "every_too_short", "schedule"),
		create("unknown zone", `{`+valid+`,"schedule":"@daily","timezone":"Mars/Olympus"}`, 400, "invalid_timezone", "timezone"),
		create("Local zone", `{`+valid+`,"schedule":"@daily","timezone":"Local"}`, 400, "invalid_timezone", "timezone"),
		create("bad at", `{`+valid+`,"at":"tomorrow"}`, 400, "invalid_at", "at"),
		create("at in past", `{`+valid+`,"at":"2026-10-09T07:59:59Z"}`, 400, "at_in_past", "at"),
		create("at now", `{`+valid+`,"at":"2026-10-09T08:00:00Z"}`, 400, "at_in_past", "at"),
		create("at too far", `{`+valid+`,"at":"2027-10-09T08:00:00.001Z"}`, 400, "at_too_far", "at"),
		create("missing url", `{"name":"n","schedule":"@daily"}`, 400, "invalid_url", "url"),
		create("ftp url with credentials", `{"name":"n","schedule":"@daily","url":"`+badURL+`"}`, 400, "invalid_url", "url"),
		create("url with credentials", `{"name":"n","schedule":"@daily","url":"https://u:p@example.test/"}`, 400, "invalid_url", "url"),
		create("url with fragment", `{"name":"n","schedule":"@daily","url":"https://example.test/#frag"}`, 400, "invalid_url", "url"),
		create("url too long", `{"name":"n","schedule":"@daily","url":"https://example.test/`+strings.Repeat("a", 2048)+`"}`, 400, "invalid_url", "url"),
		create("relative url", `{"name":"n","schedule":"@daily","url":"/hook"}`, 400, "invalid_url", "url"),
		create("private url", `{"name":"n","schedule":"@daily","url":"https://10.1.2.3/hook"}`, 400, "url_not_allowed", "url"),
		create("metadata url", `{"name":"n","schedule":"@daily","url":"http://169.254.169.254/latest"}`, 400, "url_not_allowed", "url"),
		create("maxAttempts 0", `{`+valid+`,"schedule":"@daily","retry":{"maxAttempts":0}}`, 400, "invalid_retry", "retry.maxAttempts"),
		create("maxAttempts 5", `{`+valid+`,"schedule":"@daily","retry":{"maxAttempts":5}}`, 400, "invalid_retry", "retry.maxAttempts"),
		create("minBackoff 500ms", `{`+valid+`,"schedule":"@daily","retry":{"minBackoff":"500ms"}}`, 400, "invalid_retry", "retry.minBackoff"),
		create("minBackoff 2h", `{`+valid+`,"schedule":"@daily","retry":{"minBackoff":"2h","maxBackoff":"3h"}}`, 400, "invalid_retry", "retry.minBackoff"),
		create("minBackoff not a duration", `{`+valid+`,"schedule":"@daily","retry":{"minBackoff":"soon"}}`, 400, "invalid_retry", "retry.minBackoff"),
		create("maxBackoff 25h", `{`+valid+`,"schedule":"@daily","retry":{"maxBackoff":"25h"}}`, 400, "invalid_retry", "retry.maxBackoff"),
		create("maxBackoff < minBackoff", `{`+valid+`,"schedule":"@daily","retry":{"minBackoff":"10m","maxBackoff":"1m"}}`, 400, "invalid_retry", "retry.maxBackoff"),
		create("timeout 0", `{`+valid+`,"schedule":"@daily","timeout":"0s"}`, 400, "invalid_timeout", "timeout"),
		create("timeout 31s", `{`+valid+`,"schedule":"@daily","timeout":"31s"}`, 400, "invalid_timeout", "timeout"),
		create("timeout words", `{`+valid+`,"schedule":"@daily","timeout":"ten"}`, 400, "invalid_timeout", "timeout"),
		create("catchUp", `{`+valid+`,"schedule":"@daily","catchUp":"some"}`, 400, "invalid_catch_up", "catchUp"),
		// PATCH.
		patch("patch unknown field", `{"id":"job_x"}`, 400, "unknown_field", "id"),
		patch("patch schedule and at", `{"schedule":"@daily","at":"2026-10-10T00:00:00Z"}`, 400, "schedule_conflict", "schedule"),
		patch("patch bad schedule", `{"schedule":"@sometimes"}`, 400, "invalid_schedule", "schedule"),
		patch("patch zone", `{"timezone":"Nowhere/City"}`, 400, "invalid_timezone", "timezone"),
		patch("patch max < current min", `{"retry":{"maxBackoff":"10s"}}`, 400, "invalid_retry", "retry.maxBackoff"),
		patch("patch null", `{"url":null}`, 400, "invalid_json", "url"),
		patch("patch empty name", `{"name":""}`, 400, "invalid_name", "name"),
		patch("patch bidi name", `{"name":"a\u202eb"}`, 400, "invalid_name", "name"),
		{"pause with a body", req{method: "POST", path: "/v1/jobs/" + jobID + "/pause", body: `{"enabled":false}`, key: keyAuto}, 400, "unknown_field", "enabled"},
		{"trigger with garbage", req{method: "POST", path: "/v1/jobs/" + jobID + "/runs", body: `nope`, key: keyAuto}, 400, "invalid_json", ""},
		// Query parameters.
		{"count 0", req{method: "GET", path: "/v1/jobs/" + jobID + "/next?count=0"}, 400, "invalid_count", "count"},
		{"count 101", req{method: "GET", path: "/v1/jobs/" + jobID + "/next?count=101"}, 400, "invalid_count", "count"},
		{"count words", req{method: "GET", path: "/v1/jobs/" + jobID + "/next?count=five"}, 400, "invalid_count", "count"},
		{"limit 0", req{method: "GET", path: "/v1/jobs?limit=0"}, 400, "invalid_limit", "limit"},
		{"limit 101", req{method: "GET", path: "/v1/jobs?limit=101"}, 400, "invalid_limit", "limit"},
		{"limit words", req{method: "GET", path: "/v1/jobs/" + jobID + "/runs?limit=x"}, 400, "invalid_limit", "limit"},
		{"cursor garbage", req{method: "GET", path: "/v1/jobs?cursor=%25%25%25"}, 400, "invalid_cursor", "cursor"},
		{"cursor empty", req{method: "GET", path: "/v1/jobs?cursor="}, 400, "invalid_cursor", "cursor"},
		{"run cursor garbage", req{method: "GET", path: "/v1/runs?cursor=!!"}, 400, "invalid_cursor", "cursor"},
		{"state", req{method: "GET", path: "/v1/jobs/" + jobID + "/runs?state=done"}, 400, "invalid_state", "state"},
		{"state on all runs", req{method: "GET", path: "/v1/runs?state=SUCCEEDED"}, 400, "invalid_state", "state"},
		// Missing things, and another project's things.
		{"job not found", req{method: "GET", path: "/v1/jobs/job_0000"}, 404, "job_not_found", ""},
		{"other project's job", req{method: "GET", path: "/v1/jobs/" + otherJob}, 404, "job_not_found", ""},
		{"patch missing job", req{method: "PATCH", path: "/v1/jobs/job_0000", body: `{}`}, 404, "job_not_found", ""},
		{"trigger missing job", req{method: "POST", path: "/v1/jobs/job_0000/runs", key: keyAuto}, 404, "job_not_found", ""},
		{"runs of missing job", req{method: "GET", path: "/v1/runs?jobId=job_0000"}, 404, "job_not_found", ""},
		{"run not found", req{method: "GET", path: "/v1/runs/run_0000"}, 404, "run_not_found", ""},
		{"project not found", req{method: "GET", path: "/v1/projects/prj_0000/tokens"}, 404, "project_not_found", ""},
		{"token not found", req{method: "DELETE", path: "/v1/tokens/tok_0000"}, 404, "token_not_found", ""},
		// Text no stored value can hold (see TestBadTextOnPostgres).
		{"job id with NUL", req{method: "GET", path: "/v1/jobs/job_%00"}, 404, "job_not_found", ""},
		{"run id not UTF-8", req{method: "GET", path: "/v1/runs/%FF"}, 404, "run_not_found", ""},
		{"subscription id not UTF-8", req{method: "DELETE", path: "/v1/subscriptions/sub_%C3%28"}, 404, "subscription_not_found", ""},
		{"project id with NUL", req{method: "GET", path: "/v1/projects/%00/tokens"}, 404, "project_not_found", ""},
		{"jobId with NUL", req{method: "GET", path: "/v1/runs?jobId=job_%00"}, 400, "invalid_query", "jobId"},
		{"query name not UTF-8", req{method: "GET", path: "/v1/events?%FF=1"}, 400, "invalid_query", ""},
		// A query Go's parser would drop a pair of: the cursor (or a filter)
		// would be ignored and the answer would start another list.
		{"cursor badly percent-encoded", req{method: "GET", path: "/v1/jobs?cursor=%zz"}, 400, "invalid_query", "cursor"},
		{"cursor with a stray %", req{method: "GET", path: "/v1/runs?limit=1&cursor=YWJj%"}, 400, "invalid_query", "cursor"},
		{"cursor after a ;", req{method: "GET", path: "/v1/runs?cursor=YWJj;x=1"}, 400, "invalid_query", "cursor"},
		{"state badly percent-encoded", req{method: "GET", path: "/v1/runs?state=failed%2"}, 400, "invalid_query", "state"},
		{"query name badly percent-encoded", req{method: "GET", path: "/v1/jobs?%zz=1"}, 400, "invalid_query", ""},
		{"unknown route", req{method: "GET", path: "/v1/widgets"}, 404, "not_found", ""},
		{"wrong method", req{method: "PUT", path: "/v1/jobs/" + jobID}, 405, "method_not_allowed", ""},
		// Tokens and roles.
		{"no token", req{method: "GET", path: "/v1/jobs", token: "-"}, 401, "unauthorized", ""},
		{"unknown token", req{method: "GET", path: "/v1/jobs", token: "vjt_" + strings.Repeat("A", 43)}, 401, "unauthorized", ""},
		{"malformed token", req{method: "GET", path: "/v1/jobs", token: "hunter2"}, 401, "unauthorized", ""},
		{"basic auth", req{method: "GET", path: "/v1/jobs", token: "-", header: map[string]string{"Authorization": "Basic dXNlcjpwYXNz"}}, 401, "unauthorized", ""},
		{"revoked token", req{method: "GET", path: "/v1/jobs", token: revoked["token"].(string)}, 401, "unauthorized", ""},
		{"read token creates", req{method: "POST", path: "/v1/jobs", token: readTok, body: jobBody(nil), key: keyAuto}, 403, "forbidden", ""},
		{"read token deletes", req{method: "DELETE", path: "/v1/jobs/" + jobID, token: readTok}, 403, "forbidden", ""},
		{"write token mints", req{method: "POST", path: "/v1/projects/" + e.project + "/tokens", token: writeTok, body: `{"name":"x","role":"read"}`, key: keyAuto}, 403, "forbidden", ""},
		{"admin creates project", req{method: "POST", path: "/v1/projects", token: other[vibejobs.RoleAdmin], body: `{"name":"x"}`, key: keyAuto}, 403, "forbidden", ""},
		{"bad role", req{method: "POST", path: "/v1/projects/" + e.project + "/tokens", body: `{"name":"x","role":"owner"}`, key: keyAuto}, 400, "invalid_role", "role"},
		{"bad project name", req{method: "POST", path: "/v1/projects", body: `{"name":""}`, key: keyAuto}, 400, "invalid_name", "name"},
		{"bidi project name", req{method: "POST", path: "/v1/projects", body: `{"name":"a\u202eb"}`, key: keyAuto}, 400, "invalid_name", "name"},
		// Idempotency-Key.
		{"no key", req{method: "POST", path: "/v1/jobs", body: jobBody(nil)}, 400, "idempotency_key_required", "Idempotency-Key"},
		{"no key on pause", req{method: "POST", path: "/v1/jobs/" + jobID + "/pause"}, 400, "idempotency_key_required", "Idempotency-Key"},
		{"key too long", req{method: "POST", path: "/v1/jobs", body: jobBody(nil), key: strings.Repeat("k", 256)}, 400, "invalid_idempotency_key", "Idempotency-Key"},
		{"key with space", req{method: "POST", path: "/v1/jobs", body: jobBody(nil), key: "a b"}, 400, "invalid_idempotency_key", "Idempotency-Key"},
		{"key not ASCII", req{method: "POST", path: "/v1/jobs", body: jobBody(nil), key: "clé"}, 400, "invalid_idempotency_key", "Idempotency-Key"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := c.r
			switch r.token {
			case "":
				r.token = e.admin
			case "-":
				r.token = ""
			}
			res := e.send(r)
			if res.status != c.status {
				t.Fatalf("got %s, want %d %s", res, c.status, c.code)
			}
			code, field := res.errorCode(t)
			if code != c.code || field != c.field {
				t.Errorf("got code %q field %q, want %q %q: %s", code, field, c.code, c.field, res.body)
			}
			if res.status == 401 && !strings.HasPrefix(res.header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("401 without WWW-Authenticate: Bearer")
			}
			for _, leak := range []string{badURL, "files.example.test", "secret-path", "user:pw", r.token} {
				if leak != "" && strings.Contains(string(res.body), leak) {
					t.Errorf("the answer echoes %q: %s", leak, res.body)
				}
			}
		})
	}

	// The limit of jobs per project (3; one exists).
	e.createJob(e.admin, nil)
	e.createJob(e.admin, nil)
	res := e.do("POST", "/v1/jobs", e.admin, jobBody(nil))
	if code, _ := res.errorCode(t); res.status != 409 || code != "too_many_jobs" {
		t.Errorf("too many jobs: %s", res)
	}
	// A chunked body over the limit (no Content-Length).
	hr, _ := http.NewRequest("POST", e.http.URL+"/v1/jobs", strings.NewReader(big))
	hr.ContentLength = -1
	hr.Header.Set("Authorization", "Bearer "+e.admin)
	hr.Header.Set("Idempotency-Key", newKey())
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Errorf("chunked body too large: %d", resp.StatusCode)
	}
}

func TestIdempotencyKeyInProgress(t *testing.T) {
	e := newEnv(t)
	body := []byte(`{"name":"n","url":"https://example.test/h","schedule":"@daily"}`)
	hr, _ := http.NewRequest("POST", "/v1/jobs", nil)
	tokens, _, err := e.store.ListTokens(context.Background(), e.project, vibejobs.Page{})
	if err != nil || len(tokens) != 1 {
		t.Fatalf("the bootstrap token: %v, %v", tokens, err)
	}
	rec := &vibejobs.IdempotencyRecord{ProjectID: e.project, Key: "busy", RequestHash: api.RequestHash(hr, tokens[0].ID, body),
		CreatedAt: e.clock.Now(), ExpiresAt: e.clock.Now().Add(24 * time.Hour)}
	if err := e.store.Update(context.Background(), func(tx vibejobs.Tx) error { return tx.InsertIdempotencyKey(context.Background(), rec) }); err != nil {
		t.Fatal(err)
	}
	r := req{method: "POST", path: "/v1/jobs", token: e.admin, key: "busy", body: body}
	res := e.send(r)
	if code, _ := res.errorCode(t); res.status != 409 || code != "idempotency_key_in_progress" || res.header.Get("Retry-After") != "1" {
		t.Fatalf("in progress: %s (Retry-After %q)", res, res.header.Get("Retry-After"))
	}
	// Another request with the key is a reuse, in progress or not.
	r2 := r
	r2.body = `{"name":"other","url":"https://example.test/h","schedule":"@daily"}`
	if res := e.send(r2); res.status != 422 {
		t.Errorf("reuse while in progress: %s", res)
	}
	// A claim older than 60 s was abandoned (its process died): taken over.
	e.clock.Advance(59 * time.Second)
	if res := e.send(r); res.status != 409 {
		t.Errorf("59 s later: %s", res)
	}
	e.clock.Advance(time.Second)
	res = e.send(r)
	if res.status != 201 {
		t.Fatalf("after 60 s: %s", res)
	}
	replay := e.send(r)
	if replay.status != 201 || string(replay.body) != string(res.body) || replay.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay after takeover: %s", replay)
	}
	// The first request was slow, not dead. Its completion, which commits
	// with its effect, now fails, so its effect rolls back; the release
	// after its failure leaves the new answer alone.
	ctx := context.Background()
	late := *rec
	late.Done, late.ResponseStatus, late.ResponseBody = true, 201, []byte(`{"id":"job_late"}`)
	err = e.store.Update(ctx, func(tx vibejobs.Tx) error { return tx.CompleteIdempotencyKey(ctx, &late) })
	if vibejobs.ErrorKind(err) != vibejobs.ENOTFOUND {
		t.Errorf("completion by the request whose claim was taken over: %v, want ENOTFOUND", err)
	}
	err = e.store.Update(ctx, func(tx vibejobs.Tx) error { return tx.DeleteIdempotencyKey(ctx, e.project, "busy", rec.CreatedAt) })
	if vibejobs.ErrorKind(err) != vibejobs.ENOTFOUND {
		t.Errorf("release by the request whose claim was taken over: %v, want ENOTFOUND", err)
	}
	if replay := e.send(r); replay.status != 201 || string(replay.body) != string(res.body) {
		t.Errorf("replay after the first request's late completion: %s", replay)
	}
}

// TestIntegerPastInt32SaysItsRange: a whole number too large for any
// integer field is refused with the range it missed, not as if it were no
// integer at all.
func TestIntegerPastInt32SaysItsRange(t *testing.T) {
	e := newEnv(t)
	res := e.send(req{method: "POST", path: "/v1/jobs", token: e.admin, key: keyAuto,
		body: `{"name":"n","url":"https://example.test/h","schedule":"@daily","retry":{"maxAttempts":99999999999}}`})
	if res.status != 400 || !strings.Contains(string(res.body), "2147483647") {
		t.Fatalf("got %s, want 400 naming the integer range", res)
	}
}

// Names in any script are kept as sent, with the joiners that emoji
// sequences and several scripts need; only the characters that hide or
// reorder text are refused (TestBadInput).
func TestNamesKeepJoiners(t *testing.T) {
	e := newEnv(t)
	for _, name := range []string{"👩\u200d💻 déploiement", "نیم\u200cفاصله", "日報 🇯🇵", "a\u0301ccent"} {
		got := e.createJob(e.admin, map[string]any{"name": name})
		if got["name"] != name {
			t.Errorf("created %q, got back %q", name, got["name"])
		}
	}
}
