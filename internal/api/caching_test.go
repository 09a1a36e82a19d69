package api_test

import "testing"

// TestAnswersAreNotStored: every answer says Cache-Control: no-store. A job's
// creation and a secret's rotation show the secret once, and a browser or a
// proxy keeping the page would show it again; the other answers hold a
// tenant's data. And nosniff: no browser reads an answer as another type.
func TestAnswersAreNotStored(t *testing.T) {
	e := newEnv(t)
	created := e.send(req{method: "POST", path: "/v1/jobs", token: e.admin, key: "k1", body: jobBody(nil)})
	if created.status != 201 {
		t.Fatalf("create: %s", created)
	}
	id, _ := created.json(t)["id"].(string)
	for name, res := range map[string]*result{
		"create":        created,
		"replay":        e.send(req{method: "POST", path: "/v1/jobs", token: e.admin, key: "k1", body: jobBody(nil)}),
		"rotate":        e.do("POST", "/v1/jobs/"+id+"/rotate-secret", e.admin, nil),
		"get":           e.do("GET", "/v1/jobs/"+id, e.admin, nil),
		"list":          e.do("GET", "/v1/jobs", e.admin, nil),
		"missing job":   e.do("GET", "/v1/jobs/job_missing", e.admin, nil),
		"no token":      e.do("GET", "/v1/jobs", "", nil),
		"unknown route": e.do("GET", "/v1/nothing", e.admin, nil),
		"wrong method":  e.do("PUT", "/v1/jobs", e.admin, nil),
	} {
		if got := res.header.Get("Cache-Control"); got != "no-store" {
			t.Errorf("%s (%d): Cache-Control %q, want no-store", name, res.status, got)
		}
		if got := res.header.Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("%s (%d): X-Content-Type-Options %q, want nosniff", name, res.status, got)
		}
	}
}
