package api_test

import (
	"bytes"
	"encoding/base64"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

// TestCursorsTellNothingOfAnotherProject: no cursor a client can make up
// tells an id of another project from one never created. A bare (legacy)
// cursor naming another project's job or run is refused exactly as one
// naming nothing; a bound cursor positioned at another project's id pages
// exactly as one positioned just after it, where no id is.
func TestCursorsTellNothingOfAnotherProject(t *testing.T) {
	st, _ := mustOpenStore(t)
	e := newTenantEnv(t, st)
	_, a := e.newProject("alpha")
	_, b := e.newProject("beta")
	var aJobs []string
	var bJob string // created amid A's, so that pages after it are not empty
	for i := range 3 {
		aJobs = append(aJobs, e.must(201, "POST", "/v1/jobs", a[vibejobs.RoleWrite], jobBody(nil))["id"].(string))
		e.clock.Advance(time.Millisecond)
		if i == 0 {
			bJob = e.must(201, "POST", "/v1/jobs", b[vibejobs.RoleWrite], jobBody(nil))["id"].(string)
			e.clock.Advance(time.Millisecond)
		}
	}
	// Each run in a millisecond of its own: ids of one millisecond are in
	// random order, and aJobs[0] needs a run on either side of B's.
	e.must(202, "POST", "/v1/jobs/"+aJobs[0]+"/runs", a[vibejobs.RoleWrite], nil)
	e.clock.Advance(time.Millisecond)
	bRun := e.must(202, "POST", "/v1/jobs/"+bJob+"/runs", b[vibejobs.RoleWrite], nil)["id"].(string)
	e.clock.Advance(time.Millisecond)
	e.must(202, "POST", "/v1/jobs/"+aJobs[1]+"/runs", a[vibejobs.RoleWrite], nil)
	e.clock.Advance(time.Millisecond)
	e.must(202, "POST", "/v1/jobs/"+aJobs[0]+"/runs", a[vibejobs.RoleWrite], nil)
	aRead := a[vibejobs.RoleRead]
	tagOf := func(path string) string {
		c, _ := e.must(200, "GET", path+"?limit=1", aRead, nil)["nextCursor"].(string)
		_, tag, ok := strings.Cut(c, ".")
		if !ok {
			t.Fatalf("GET %s: nextCursor %q is not bound", path, c)
		}
		return tag
	}
	enc := func(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }
	// never is an id of the same shape as id that was never created.
	never := func(id string) string { return id[:len(id)-4] + "zzzz" }
	for _, l := range []struct{ path, other string }{
		{"/v1/jobs", bJob},
		{"/v1/runs", bRun},
		{"/v1/jobs/" + aJobs[0] + "/runs", bRun},
	} {
		tag := tagOf(l.path)
		for _, pair := range [][2]string{
			{enc(l.other), enc(never(l.other))},                      // legacy
			{enc(l.other) + "." + tag, enc(l.other+"0") + "." + tag}, // bound
		} {
			x := e.send("GET", l.path+"?cursor="+pair[0], aRead, "", nil)
			y := e.send("GET", l.path+"?cursor="+pair[1], aRead, "", nil)
			if x.status != y.status || !bytes.Equal(x.body, y.body) {
				t.Errorf("GET %s: another project's id answers %s, an id never created %s", l.path, x, y)
			}
			if x.status >= 500 {
				t.Errorf("GET %s: %s", l.path, x)
			}
			if strings.Contains(pair[0], ".") && (x.status != 200 || !bytes.Contains(x.body, []byte(`"id"`))) {
				t.Errorf("GET %s after another project's id: %s, want a page of this project's", l.path, x)
			}
		}
	}
}

// TestCursorPagesAcrossDeletesAndCreates: a bound cursor keeps paging after
// the job it points at (and the next one) was deleted, skips what was
// deleted and reaches the jobs created since, each once.
func TestCursorPagesAcrossDeletesAndCreates(t *testing.T) {
	st, _ := mustOpenStore(t)
	e := newTenantEnv(t, st)
	_, a := e.newProject("alpha")
	w := a[vibejobs.RoleWrite]
	var jobs []string
	for range 5 {
		jobs = append(jobs, e.must(201, "POST", "/v1/jobs", w, jobBody(nil))["id"].(string))
		e.clock.Advance(time.Millisecond)
	}
	page := e.must(200, "GET", "/v1/jobs?limit=2", w, nil)
	cursor := page["nextCursor"].(string)
	e.must(204, "DELETE", "/v1/jobs/"+jobs[1], w, nil)
	e.must(204, "DELETE", "/v1/jobs/"+jobs[2], w, nil)
	jobs = append(jobs, e.must(201, "POST", "/v1/jobs", w, jobBody(nil))["id"].(string))
	var seen []string
	for cursor != "" {
		page = e.must(200, "GET", "/v1/jobs?limit=1&cursor="+cursor, w, nil)
		for _, j := range page["jobs"].([]any) {
			seen = append(seen, j.(map[string]any)["id"].(string))
		}
		cursor, _ = page["nextCursor"].(string)
	}
	if want := []string{jobs[3], jobs[4], jobs[5]}; !slices.Equal(seen, want) {
		t.Errorf("paged %v, want %v", seen, want)
	}
}

// TestCallerTokenShowsOnlyItself: GET /v1/token answers every role, and the
// installation token, with its own token and project: never the token's
// value, its hash or another project.
func TestCallerTokenShowsOnlyItself(t *testing.T) {
	st, _ := mustOpenStore(t)
	e := newTenantEnv(t, st)
	aID, a := e.newProject("alpha")
	bID, b := e.newProject("beta")
	install := e.must(200, "GET", "/v1/token", e.admin, nil)
	if install["installation"] != true || install["role"] != "admin" {
		t.Errorf("installation token: %v", install)
	}
	for _, c := range []struct {
		token, project string
		role           vibejobs.Role
		install        bool
	}{
		{e.admin, install["projectId"].(string), vibejobs.RoleAdmin, true},
		{a[vibejobs.RoleAdmin], aID, vibejobs.RoleAdmin, false},
		{a[vibejobs.RoleWrite], aID, vibejobs.RoleWrite, false},
		{a[vibejobs.RoleRead], aID, vibejobs.RoleRead, false},
		{b[vibejobs.RoleRead], bID, vibejobs.RoleRead, false},
	} {
		res := e.send("GET", "/v1/token", c.token, "", nil)
		if res.status != 200 {
			t.Fatalf("GET /v1/token (%s): %s", c.role, res)
		}
		m := res.json(t)
		if m["projectId"] != c.project || m["role"] != string(c.role) || m["installation"] != c.install {
			t.Errorf("GET /v1/token (%s of %s): %v", c.role, c.project, m)
		}
		for _, k := range []string{"token", "hash", "value"} {
			if _, ok := m[k]; ok {
				t.Errorf("GET /v1/token (%s) holds %q: %v", c.role, k, m)
			}
		}
		body := string(res.body)
		if strings.Contains(body, c.token) || strings.Contains(body, c.token[len("vjt_"):]) {
			t.Errorf("GET /v1/token (%s) holds the token's value", c.role)
		}
		for _, p := range []string{aID, bID} {
			if p != c.project && strings.Contains(body, p) {
				t.Errorf("GET /v1/token (%s of %s) names project %s", c.role, c.project, p)
			}
		}
	}
	// Revoked: 401, as any route.
	tk := e.must(201, "POST", "/v1/projects/"+aID+"/tokens", e.admin, map[string]any{"name": "gone", "role": "read"})
	e.must(204, "DELETE", "/v1/tokens/"+tk["id"].(string), e.admin, nil)
	if res := e.send("GET", "/v1/token", tk["token"].(string), "", nil); res.status != 401 {
		t.Errorf("revoked token: %s", res)
	}
}
