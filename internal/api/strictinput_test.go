package api_test

import (
	"strings"
	"testing"
)

// TestTextThatIsNotUTF8IsRefused: a body's strings are stored as sent or
// refused, never rewritten. encoding/json takes bytes that are not UTF-8,
// and a \u escape of half a surrogate pair, as U+FFFD: a target URL with a
// stray byte was stored as another URL (…%EF%BF%BD) and answered 201.
func TestTextThatIsNotUTF8IsRefused(t *testing.T) {
	e := newEnv(t)
	id := e.createJob(e.admin, nil)["id"].(string)
	for _, r := range []req{
		{method: "POST", path: "/v1/jobs", key: keyAuto,
			body: "{\"name\":\"n\",\"schedule\":\"@daily\",\"url\":\"https://example.test/h\xff\"}"},
		{method: "POST", path: "/v1/jobs", key: keyAuto,
			body: `{"name":"n","schedule":"@daily","url":"https://example.test/h?q=\ud800"}`},
		{method: "POST", path: "/v1/jobs", key: keyAuto,
			body: `{"name":"n\udc00","schedule":"@daily","url":"https://example.test/h"}`},
		{method: "POST", path: "/v1/jobs", key: keyAuto, // a high half followed by another high half
			body: `{"name":"n\ud800\ud800","schedule":"@daily","url":"https://example.test/h"}`},
		{method: "PATCH", path: "/v1/jobs/" + id, body: "{\"url\":\"https://example.test/z\xff\"}"},
		{method: "POST", path: "/v1/subscriptions", key: keyAuto, body: "{\"url\":\"https://example.test/s\xff\"}"},
		{method: "POST", path: "/v1/jobs/batch", key: keyAuto,
			body: "{\"jobs\":[{\"name\":\"n\",\"schedule\":\"@daily\",\"url\":\"https://example.test/b\xff\"}]}"},
	} {
		r.token = e.admin
		res := e.send(r)
		if res.status != 400 || !strings.Contains(string(res.body), `"invalid_json"`) {
			t.Errorf("%s %s %q: got %s, want 400 invalid_json", r.method, r.path, r.body, res)
		}
	}
	// A whole pair is a character, and an escaped backslash before "u"
	// escapes nothing more.
	for _, name := range []string{`smile \ud83d\ude00`, `path \\ud800`} {
		res := e.send(req{method: "POST", path: "/v1/jobs", token: e.admin, key: keyAuto,
			body: `{"name":"` + name + `","schedule":"@daily","url":"https://example.test/h"}`})
		if res.status != 201 {
			t.Errorf("name %s: got %s, want 201", name, res)
		}
	}
}

// TestQueryThatWouldBeDroppedIsRefused: a query the handlers would read as
// something else answers 400 invalid_query: past Go's limit on query
// parameters (URL.Query then comes back empty, every filter dropped), or
// naming a parameter the operation does not take (a misspelt filter
// listed everything; a made-up option was ignored).
func TestQueryThatWouldBeDroppedIsRefused(t *testing.T) {
	e := newEnv(t)
	a := e.createJob(e.admin, nil)["id"].(string)
	b := e.createJob(e.admin, nil)["id"].(string)
	e.must(202, "POST", "/v1/jobs/"+a+"/runs", e.admin, nil)
	e.must(202, "POST", "/v1/jobs/"+b+"/runs", e.admin, nil)
	for _, r := range []req{
		{method: "GET", path: "/v1/runs?jobId=" + a + "&" + strings.Repeat("x=1&", 10001)},
		{method: "GET", path: "/v1/runs?jobid=" + a}, // jobid, not jobId
		{method: "GET", path: "/v1/jobs?limit=5&state=failed"},
		{method: "GET", path: "/v1/jobs/" + a + "?verbose=1"},
		{method: "GET", path: "/v1/events?after=0&job=" + a},
		{method: "POST", path: "/v1/jobs?dryRun=true", key: keyAuto, body: jobBody(nil)},
	} {
		r.token = e.admin
		res := e.send(r)
		if res.status != 400 || !strings.Contains(string(res.body), `"invalid_query"`) {
			t.Errorf("%s %.80s: got %.200s, want 400 invalid_query", r.method, r.path, res)
		}
	}
	if n := len(e.must(200, "GET", "/v1/jobs", e.admin, nil)["jobs"].([]any)); n != 2 {
		t.Errorf("jobs after the refused POST ?dryRun=true: %d, want 2", n)
	}
	// The parameters each operation documents still work.
	for _, p := range []string{"/v1/runs?jobId=" + a + "&state=scheduled&limit=5", "/v1/jobs/" + a + "/runs?state=scheduled&limit=5",
		"/v1/jobs?limit=5", "/v1/jobs/" + a + "/next?count=3", "/v1/events?after=0&limit=5&type=run.succeeded&jobId=" + a} {
		e.must(200, "GET", p, e.admin, nil)
	}
}

// TestEventsJobFilterIsAJobID: GET /v1/events?jobId= takes a job id's
// shape only (a deleted job's events stay in the feed): anything else was
// answered 200 with no events, and `events tail --job <typo>` waited for
// ever.
func TestEventsJobFilterIsAJobID(t *testing.T) {
	e := newEnv(t)
	e.createJob(e.admin, nil)
	for _, q := range []string{"not-a-job-id", "%20", "run_01a11fad1800b9faf5a9e6234ae2", ""} {
		res := e.send(req{method: "GET", path: "/v1/events?after=0&jobId=" + q, token: e.admin})
		if res.status != 400 || !strings.Contains(string(res.body), `"invalid_job_id"`) {
			t.Errorf("GET /v1/events?jobId=%s: got %s, want 400 invalid_job_id", q, res)
		}
	}
	e.must(200, "GET", "/v1/events?after=0&jobId=job_deletedlongago", e.admin, nil)
}

// TestErrorsSayWhatIsWrong: a name holding U+FFFD is not said to hold a
// control character, and a batch item that is not an object is told so,
// not that the request body must be one JSON object.
func TestErrorsSayWhatIsWrong(t *testing.T) {
	e := newEnv(t)
	res := e.send(req{method: "POST", path: "/v1/jobs", token: e.admin, key: keyAuto,
		body: `{"name":"a\ufffdb","url":"https://example.test/h","schedule":"@daily"}`})
	if res.status != 400 || strings.Contains(string(res.body), "control characters") || !strings.Contains(string(res.body), "U+FFFD") {
		t.Errorf("name with U+FFFD: %s", res)
	}
	res = e.send(req{method: "POST", path: "/v1/jobs/batch", token: e.admin, key: keyAuto, body: `{"jobs":[1]}`})
	if res.status != 400 || strings.Contains(string(res.body), "request body") || !strings.Contains(string(res.body), `"jobs[0]"`) {
		t.Errorf(`{"jobs":[1]}: %s, want jobs[0] must be a JSON object`, res)
	}
}
