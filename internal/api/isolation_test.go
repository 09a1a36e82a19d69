package api_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
)

// TestIsolation: with another project's tokens, every route and verb on
// project A's resources answers 404 exactly like a missing id (or 403 when the
// role forbids the verb anyway), and no answer holds anything of project A.
func TestIsolation(t *testing.T) {
	e := newEnv(t)
	// Project A: its own admin token, a job, a run and tokens.
	aID, a := e.newProject("alpha-project")
	aJob := e.createJob(a[vibejobs.RoleAdmin], map[string]any{"name": "alpha-job-name", "url": "https://alpha-target.example.test/hook"})
	aJobID := aJob["id"].(string)
	aRun := e.must(202, "POST", "/v1/jobs/"+aJobID+"/runs", a[vibejobs.RoleWrite], nil)
	aRunID := aRun["id"].(string)
	aTokens := e.must(200, "GET", "/v1/projects/"+aID+"/tokens", a[vibejobs.RoleAdmin], nil)["tokens"].([]any)
	aTokenID := aTokens[0].(map[string]any)["id"].(string)
	aSecret := aJob["secret"].(string)

	// Project B with a job of its own.
	bID, b := e.newProject("beta-project")
	bJobID := e.createJob(b[vibejobs.RoleAdmin], nil)["id"].(string)

	forbidden := []string{aID, "alpha-project", aJobID, "alpha-job-name", "alpha-target", aRunID, aTokenID, aSecret}
	for _, tk := range aTokens {
		forbidden = append(forbidden, tk.(map[string]any)["prefix"].(string))
	}

	type call struct {
		method, path, body string
		write              bool // needs the write role
		admin              bool // needs the admin role
		installation       bool // needs the installation token
		missing            string
	}
	calls := []call{
		{method: "GET", path: "/v1/jobs/" + aJobID, missing: "/v1/jobs/job_missing"},
		{method: "PATCH", path: "/v1/jobs/" + aJobID, body: `{"name":"hijacked"}`, write: true, missing: "/v1/jobs/job_missing"},
		{method: "DELETE", path: "/v1/jobs/" + aJobID, write: true, missing: "/v1/jobs/job_missing"},
		{method: "POST", path: "/v1/jobs/" + aJobID + "/pause", write: true, missing: "/v1/jobs/job_missing/pause"},
		{method: "POST", path: "/v1/jobs/" + aJobID + "/resume", write: true, missing: "/v1/jobs/job_missing/resume"},
		{method: "POST", path: "/v1/jobs/" + aJobID + "/rotate-secret", write: true, missing: "/v1/jobs/job_missing/rotate-secret"},
		{method: "POST", path: "/v1/jobs/" + aJobID + "/runs", write: true, missing: "/v1/jobs/job_missing/runs"},
		{method: "GET", path: "/v1/jobs/" + aJobID + "/runs", missing: "/v1/jobs/job_missing/runs"},
		{method: "GET", path: "/v1/jobs/" + aJobID + "/next", missing: "/v1/jobs/job_missing/next"},
		{method: "GET", path: "/v1/runs/" + aRunID, missing: "/v1/runs/run_missing"},
		{method: "GET", path: "/v1/runs?jobId=" + aJobID, missing: "/v1/runs?jobId=job_missing"},
		{method: "GET", path: "/v1/projects/" + aID + "/tokens", admin: true, missing: "/v1/projects/prj_missing/tokens"},
		{method: "POST", path: "/v1/projects/" + aID + "/tokens", body: `{"name":"mine","role":"admin"}`, admin: true, missing: "/v1/projects/prj_missing/tokens"},
		{method: "DELETE", path: "/v1/tokens/" + aTokenID, admin: true, missing: "/v1/tokens/tok_missing"},
		{method: "GET", path: "/v1/projects", installation: true},
		{method: "POST", path: "/v1/projects", body: `{"name":"x"}`, installation: true},
	}
	var all [][]byte
	for _, role := range []vibejobs.Role{vibejobs.RoleAdmin, vibejobs.RoleWrite, vibejobs.RoleRead} {
		tok := b[role]
		for _, c := range calls {
			want, code := 404, ""
			switch {
			case c.installation, c.admin && role != vibejobs.RoleAdmin, c.write && role == vibejobs.RoleRead:
				want, code = 403, "forbidden"
			}
			r := req{method: c.method, path: c.path, token: tok, body: c.body}
			if c.method == "POST" {
				r.key = keyAuto
			}
			res := e.send(r)
			all = append(all, res.body)
			if res.status != want {
				t.Errorf("%s %s as B %s: %s, want %d", c.method, c.path, role, res, want)
				continue
			}
			if code != "" {
				if got, _ := res.errorCode(t); got != code {
					t.Errorf("%s %s as B %s: code %q", c.method, c.path, role, got)
				}
				continue
			}
			// Exactly the answer for an id that does not exist.
			m := r
			m.path = c.missing
			missing := e.send(m)
			if missing.status != res.status || !bytes.Equal(missing.body, res.body) {
				t.Errorf("%s %s as B %s: %s, but a missing id gives %s", c.method, c.path, role, res, missing)
			}
		}
		// Lists show B's own things only.
		for _, p := range []string{"/v1/jobs", "/v1/runs", "/v1/jobs/" + bJobID + "/runs"} {
			res := e.send(req{method: "GET", path: p, token: tok})
			if res.status != 200 {
				t.Errorf("GET %s as B: %s", p, res)
			}
			all = append(all, res.body)
		}
		if role == vibejobs.RoleAdmin {
			res := e.send(req{method: "GET", path: "/v1/projects/" + bID + "/tokens", token: tok})
			all = append(all, res.body)
		}
	}
	for _, body := range all {
		for _, f := range forbidden {
			if strings.Contains(string(body), f) {
				t.Errorf("an answer to project B holds %q of project A: %s", f, body)
			}
		}
	}
	// Project A's job is untouched.
	j, err := e.store.GetJob(context.Background(), aID, aJobID)
	if err != nil || j.Name != "alpha-job-name" || !j.Enabled {
		t.Errorf("A's job after B's attempts: %+v, %v", j, err)
	}
	if got, _ := e.keys.Open(j.Secret, aJobID); got != aSecret {
		t.Error("A's secret was rotated by B")
	}
	tk, _ := e.store.GetToken(context.Background(), aTokenID)
	if tk.RevokedAt != nil {
		t.Error("A's token was revoked by B")
	}
	if rs := e.must(200, "GET", "/v1/jobs/"+aJobID+"/runs", a[vibejobs.RoleRead], nil)["runs"].([]any); len(rs) != 1 {
		t.Errorf("A's runs: %v", rs)
	}
}

// The installation token manages every project; a project admin only its own.
func TestTokensAndProjects(t *testing.T) {
	e := newEnv(t)
	pID, p := e.newProject("team")
	list := e.must(200, "GET", "/v1/projects", e.admin, nil)["projects"].([]any)
	if len(list) != 2 {
		t.Errorf("projects: %v", list)
	}
	// A project admin mints and lists its own project's tokens.
	tk := e.must(201, "POST", "/v1/projects/"+pID+"/tokens", p[vibejobs.RoleAdmin], map[string]any{"name": "ci", "role": "write"})
	value := tk["token"].(string)
	if len(value) != 47 || !strings.HasPrefix(value, "vjt_") || tk["prefix"] != value[:12] || tk["projectId"] != pID {
		t.Errorf("minted token %v", tk)
	}
	toks := e.must(200, "GET", "/v1/projects/"+pID+"/tokens", p[vibejobs.RoleAdmin], nil)["tokens"].([]any)
	if len(toks) != 4 {
		t.Errorf("tokens: %d", len(toks))
	}
	for _, x := range toks {
		if _, ok := x.(map[string]any)["token"]; ok {
			t.Errorf("a listed token shows its value")
		}
	}
	// Only the hash is stored.
	st, err := e.store.GetToken(context.Background(), tk["id"].(string))
	if err != nil || len(st.Hash) != 32 || bytes.Contains(st.Hash, []byte(value)) {
		t.Errorf("stored token %+v %v", st, err)
	}
	// Revocation takes effect at once.
	e.must(200, "GET", "/v1/jobs", value, nil)
	e.must(204, "DELETE", "/v1/tokens/"+tk["id"].(string), p[vibejobs.RoleAdmin], nil)
	res := e.do("GET", "/v1/jobs", value, nil)
	if code, _ := res.errorCode(t); res.status != 401 || code != "unauthorized" {
		t.Errorf("revoked token: %s", res)
	}
	e.must(204, "DELETE", "/v1/tokens/"+tk["id"].(string), p[vibejobs.RoleAdmin], nil) // again: no change
	revokedList := e.must(200, "GET", "/v1/projects/"+pID+"/tokens", e.admin, nil)["tokens"].([]any)
	for _, x := range revokedList {
		if m := x.(map[string]any); m["id"] == tk["id"] && m["revokedAt"] == nil {
			t.Error("revoked token shows no revokedAt")
		}
	}
	// A project admin of "default" cannot revoke the installation token.
	dAdmin := e.must(201, "POST", "/v1/projects/"+e.project+"/tokens", e.admin, map[string]any{"name": "d", "role": "admin"})["token"].(string)
	instTokens := e.must(200, "GET", "/v1/projects/"+e.project+"/tokens", dAdmin, nil)["tokens"].([]any)
	var instID string
	for _, x := range instTokens {
		if m := x.(map[string]any); m["installation"] == true {
			instID = m["id"].(string)
		}
	}
	if res := e.do("DELETE", "/v1/tokens/"+instID, dAdmin, nil); res.status != 403 {
		t.Errorf("admin revoking the installation token: %s", res)
	}
	// Only the installation token mints installation tokens.
	if res := e.do("POST", "/v1/projects/"+e.project+"/tokens", dAdmin, map[string]any{"name": "x", "role": "admin", "installation": true}); res.status != 403 {
		t.Errorf("admin minting an installation token: %s", res)
	}
	inst2 := e.must(201, "POST", "/v1/projects/"+e.project+"/tokens", e.admin, map[string]any{"name": "x", "role": "admin", "installation": true})
	e.must(200, "GET", "/v1/projects", inst2["token"].(string), nil)
	// Bootstrap does nothing on a store with a project.
	if tok, created, err := apiBootstrapAgain(e); err != nil || created || tok != "" {
		t.Errorf("second bootstrap: %q %v %v", tok, created, err)
	}
}

// TestProjectLocation: the Location of a created project answers it: to the
// installation token any project, to a project's admin its own only (another
// project is not found, as a missing one), to other roles nothing.
func TestProjectLocation(t *testing.T) {
	e := newEnv(t)
	created := e.do("POST", "/v1/projects", e.admin, map[string]any{"name": "loc"})
	if created.status != 201 {
		t.Fatalf("create project: %s", created)
	}
	loc := created.header.Get("Location")
	if got := e.do("GET", loc, e.admin, nil); got.status != 200 || got.json(t)["name"] != "loc" {
		t.Fatalf("GET Location %q of a created project: %s", loc, got)
	}
	id, tokens := e.newProject("other")
	if got := e.do("GET", "/v1/projects/"+id, tokens[vibejobs.RoleAdmin], nil); got.status != 200 || got.json(t)["id"] != id {
		t.Errorf("GET of its own project by its admin: %s", got)
	}
	if got := e.do("GET", loc, tokens[vibejobs.RoleAdmin], nil); got.status != 404 {
		t.Errorf("GET of another project by an admin: %s, want 404", got)
	}
	if got := e.do("GET", "/v1/projects/"+id, tokens[vibejobs.RoleRead], nil); got.status != 403 {
		t.Errorf("GET of its project by a read token: %s, want 403", got)
	}
	if got := e.do("GET", "/v1/projects/prj_missing", e.admin, nil); got.status != 404 {
		t.Errorf("GET of a missing project: %s, want 404", got)
	}
}

// TestMetricsNameProjectsToTheInstallationOnly: /metrics answers everyone
// with the series that name no project; the per-project ones go to the
// installation administrator's token alone, so a tenant that can reach
// the server learns nothing of the others. A token that is not valid is
// refused, as anywhere.
func TestMetricsNameProjectsToTheInstallationOnly(t *testing.T) {
	e := newEnv(t, func(c *api.Config) {
		c.Metrics = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("for all")) })
		c.InstallationMetrics = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("per project")) })
	})
	projectAdmin := e.must(201, "POST", "/v1/projects/"+e.project+"/tokens", e.admin, map[string]any{"name": "d", "role": "admin"})["token"].(string)
	for _, c := range []struct {
		who, token string
		status     int
		body       string
	}{
		{"no token", "", 200, "for all"},
		{"the installation token", e.admin, 200, "per project"},
		{"a project admin's token", projectAdmin, 200, "for all"},
		{"a token that is not valid", "vjt_" + strings.Repeat("x", 43), 401, ""},
	} {
		res := e.do("GET", "/metrics", c.token, nil)
		if res.status != c.status || (c.body != "" && string(res.body) != c.body) {
			t.Errorf("%s: %s", c.who, res)
		}
	}
}
