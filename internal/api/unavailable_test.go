package api_test

import (
	"strings"
	"testing"

	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/storetest"
)

// TestDatabaseUnavailableIs503: while the database does not answer or takes
// no writes (a failover), the API answers 503 database_unavailable, as the
// README and the OpenAPI document say, not 500 internal: the fault is
// passing, and a client or a load balancer should try again. The answer
// names no cause; the log does. A POST refused so is not the answer to its
// Idempotency-Key: sent again once the database answers, it does its work.
func TestDatabaseUnavailableIs503(t *testing.T) {
	e, st := newOutageEnv(t)
	doc := loadOpenAPI(t, e)
	post := req{method: "POST", path: "/v1/jobs", token: e.admin, key: "during-outage", body: jobBody(nil)}
	for _, tc := range []struct {
		name string
		down string
		r    req
	}{
		{"token lookup", "TokenByHash", req{method: "GET", path: "/v1/jobs", token: e.admin}},
		{"read", "ListJobs", req{method: "GET", path: "/v1/jobs", token: e.admin}},
		{"write", "Update", post},
	} {
		st.Set(tc.down)
		res := e.send(tc.r)
		if code, _ := res.errorCode(t); res.status != 503 || code != "database_unavailable" {
			t.Errorf("%s while the database is down: %s, want 503 database_unavailable", tc.name, res)
		}
		if h := res.header.Get("Retry-After"); h != "2" {
			t.Errorf("%s: a 503 with Retry-After %q, want 2", tc.name, h)
		}
		if strings.Contains(string(res.body), "/var/lib") || strings.Contains(string(res.body), "I/O") {
			t.Errorf("%s: the answer shows the cause: %s", tc.name, res.body)
		}
		if h := res.header.Get("WWW-Authenticate"); h != "" {
			t.Errorf("%s: a 503 challenges the token: WWW-Authenticate %q", tc.name, h)
		}
		route := tc.r.method + " " + tc.r.path
		if responses, _ := doc.operation(route)["responses"].(map[string]any); responses["503"] == nil {
			t.Errorf("the OpenAPI document does not give %s a 503", route)
		}
	}
	if !strings.Contains(e.logs.String(), "disk I/O error") {
		t.Error("the cause of a 503 is not logged")
	}
	st.Set()
	if res := e.send(post); res.status != 201 || res.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("the POST sent again once the database answers: %s", res)
	}
}

// newOutageEnv is newEnv with its store behind a storetest.Outage, which
// the test turns on to make the database stop answering.
func newOutageEnv(t *testing.T) (*env, *storetest.Outage) {
	t.Helper()
	var outage *storetest.Outage
	e := newEnv(t, func(c *api.Config) {
		outage = &storetest.Outage{Store: c.Store}
		c.Store = outage
	})
	return e, outage
}

// TestClosedStoreIs503: requests that reach the API after its store was
// closed (a server stopping closes it under the handlers that outlasted
// the drain) answer 503 database_unavailable, as for a database that does
// not answer, not 500 internal: the client retries, elsewhere.
func TestClosedStoreIs503(t *testing.T) {
	e := newEnv(t)
	id := e.createJob(e.admin, nil)["id"].(string)
	if err := e.store.Close(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []req{
		{method: "GET", path: "/v1/jobs", token: e.admin},
		{method: "GET", path: "/v1/jobs/" + id, token: e.admin},
		{method: "POST", path: "/v1/jobs", token: e.admin, key: keyAuto, body: jobBody(nil)},
	} {
		res := e.send(r)
		if code, _ := res.errorCode(t); res.status != 503 || code != "database_unavailable" || res.header.Get("Retry-After") != "2" {
			t.Errorf("%s %s on a closed store: %s (Retry-After %q), want 503 database_unavailable", r.method, r.path, res, res.header.Get("Retry-After"))
		}
	}
}
