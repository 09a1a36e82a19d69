package api_test

import (
	"encoding/base64"
	"log/slog"
	"slices"
	"testing"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/postgres"
)

// TestListCursorsBelongToTheirList: a list's nextCursor continues that list
// only: the same project, the same kind (jobs, runs or tokens) and the same
// filters (the page size may change). A cursor from another project's list,
// from another kind of list or from other filters is refused (400
// invalid_cursor) instead of silently answering a page that starts
// somewhere else. A cursor minted before cursors were bound (the bare
// position) keeps paging its own list, so a client paging across the
// upgrade is not cut off, and is refused on another project's or kind's;
// token lists, paged only since cursors were bound, take none.
func TestListCursorsBelongToTheirList(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) vibejobs.Store{
		"sqlite": func(t *testing.T) vibejobs.Store { st, _ := mustOpenStore(t); return st },
		"postgres": func(t *testing.T) vibejobs.Store {
			return postgres.MustOpenTestWith(t, postgres.Options{Logger: slog.New(slog.DiscardHandler)})
		},
	} {
		t.Run(name, func(t *testing.T) { listCursors(t, newTenantEnv(t, open(t))) })
	}
}

func listCursors(t *testing.T, e *tenantEnv) {
	aID, a := e.newProject("alpha")
	bID, b := e.newProject("beta")
	aRead, bRead := a[vibejobs.RoleRead], b[vibejobs.RoleRead]
	aAdmin, bAdmin := a[vibejobs.RoleAdmin], b[vibejobs.RoleAdmin]
	aTokens, bTokens := "/v1/projects/"+aID+"/tokens", "/v1/projects/"+bID+"/tokens"
	var aJobs, bJobs []string
	for range 3 {
		aJobs = append(aJobs, e.must(201, "POST", "/v1/jobs", a[vibejobs.RoleWrite], jobBody(nil))["id"].(string))
		bJobs = append(bJobs, e.must(201, "POST", "/v1/jobs", b[vibejobs.RoleWrite], jobBody(nil))["id"].(string))
	}
	var aRuns []string // newest first, as listed
	for range 3 {
		for _, j := range aJobs[:2] {
			aRuns = append([]string{e.must(202, "POST", "/v1/jobs/"+j+"/runs", a[vibejobs.RoleWrite], nil)["id"].(string)}, aRuns...)
			e.must(202, "POST", "/v1/jobs/"+bJobs[0]+"/runs", b[vibejobs.RoleWrite], nil)
			e.clock.Advance(1e6)
		}
	}
	next := func(path, token string) string {
		t.Helper()
		c, _ := e.must(200, "GET", path, token, nil)["nextCursor"].(string)
		if c == "" {
			t.Fatalf("GET %s: no nextCursor", path)
		}
		return c
	}
	jobsCursor := next("/v1/jobs?limit=1", aRead)
	runsCursor := next("/v1/runs?limit=1", aRead)
	jobRunsCursor := next("/v1/jobs/"+aJobs[0]+"/runs?limit=1", aRead)
	queuedCursor := next("/v1/runs?limit=1&state=scheduled", aRead)
	bJobsCursor := next("/v1/jobs?limit=1", bRead)
	tokensCursor := next(aTokens+"?limit=1", aAdmin)
	aToken := e.must(200, "GET", aTokens, aAdmin, nil)["tokens"].([]any)[0].(map[string]any)["id"].(string)
	legacy := func(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }

	for _, c := range []struct {
		path, token string
		want        int
	}{
		// Their own lists: paging goes on, at any page size.
		{"/v1/jobs?cursor=" + jobsCursor, aRead, 200},
		{"/v1/jobs?limit=100&cursor=" + jobsCursor, aRead, 200},
		{"/v1/runs?cursor=" + runsCursor, aRead, 200},
		{"/v1/jobs/" + aJobs[0] + "/runs?cursor=" + jobRunsCursor, aRead, 200},
		{"/v1/runs?jobId=" + aJobs[0] + "&cursor=" + jobRunsCursor, aRead, 200}, // the same list
		{"/v1/runs?state=scheduled&cursor=" + queuedCursor, aRead, 200},
		{"/v1/jobs?cursor=" + bJobsCursor, bRead, 200},
		{aTokens + "?cursor=" + tokensCursor, aAdmin, 200},
		{aTokens + "?limit=100&cursor=" + tokensCursor, aAdmin, 200},
		{aTokens + "?cursor=" + tokensCursor, e.admin, 200}, // the same list, asked by the installation token
		// Another project's list.
		{"/v1/jobs?cursor=" + jobsCursor, bRead, 400},
		{"/v1/jobs?cursor=" + bJobsCursor, aRead, 400},
		{"/v1/runs?cursor=" + runsCursor, bRead, 400},
		{"/v1/jobs/" + bJobs[0] + "/runs?cursor=" + jobRunsCursor, bRead, 400},
		{bTokens + "?cursor=" + tokensCursor, bAdmin, 400},
		{bTokens + "?cursor=" + tokensCursor, e.admin, 400},
		// Another kind of list.
		{"/v1/runs?cursor=" + jobsCursor, aRead, 400},
		{"/v1/jobs?cursor=" + runsCursor, aRead, 400},
		{"/v1/jobs?cursor=" + tokensCursor, aRead, 400},
		{"/v1/runs?cursor=" + tokensCursor, aRead, 400},
		{aTokens + "?cursor=" + jobsCursor, aAdmin, 400},
		{aTokens + "?cursor=" + runsCursor, aAdmin, 400},
		// Other filters.
		{"/v1/jobs/" + aJobs[1] + "/runs?cursor=" + jobRunsCursor, aRead, 400},
		{"/v1/jobs/" + aJobs[0] + "/runs?cursor=" + runsCursor, aRead, 400},
		{"/v1/runs?cursor=" + jobRunsCursor, aRead, 400},
		{"/v1/runs?state=succeeded&cursor=" + queuedCursor, aRead, 400},
		{"/v1/runs?cursor=" + queuedCursor, aRead, 400},
		// Cursors minted before the binding: their own list only.
		{"/v1/jobs?cursor=" + legacy(aJobs[0]), aRead, 200},
		{"/v1/runs?cursor=" + legacy(aRuns[0]), aRead, 200},
		{"/v1/jobs/" + aJobs[1] + "/runs?cursor=" + legacy(aRuns[0]), aRead, 200},
		{"/v1/jobs?cursor=" + legacy(aJobs[0]), bRead, 400},
		{"/v1/runs?cursor=" + legacy(aRuns[0]), bRead, 400},
		{"/v1/runs?cursor=" + legacy(aJobs[0]), aRead, 400},
		{"/v1/jobs?cursor=" + legacy(aRuns[0]), aRead, 400},
		{"/v1/jobs/" + aJobs[0] + "/runs?cursor=" + legacy(aRuns[0]), aRead, 400}, // a run of job 1
		{aTokens + "?cursor=" + legacy(aToken), aAdmin, 400},
	} {
		res := e.send("GET", c.path, c.token, "", nil)
		if res.status != c.want {
			t.Errorf("GET %s: %s, want %d", c.path, res, c.want)
			continue
		}
		if c.want == 400 {
			if code, fld := res.errorCode(t); code != "invalid_cursor" || fld != "cursor" {
				t.Errorf("GET %s: %s, want invalid_cursor (cursor)", c.path, res)
			}
		}
	}

	// A bound cursor pages exactly as before: every job once, in order.
	var seen []string
	for cursor := ""; ; {
		path := "/v1/jobs?limit=1"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		page := e.must(200, "GET", path, aRead, nil)
		for _, j := range page["jobs"].([]any) {
			seen = append(seen, j.(map[string]any)["id"].(string))
		}
		if cursor, _ = page["nextCursor"].(string); cursor == "" {
			break
		}
	}
	slices.Sort(aJobs) // listed in id order
	if !slices.Equal(seen, aJobs) {
		t.Errorf("paged %v, want %v", seen, aJobs)
	}
	// A legacy cursor continues after its position.
	page := e.must(200, "GET", "/v1/runs?limit=2&cursor="+legacy(aRuns[0]), aRead, nil)["runs"].([]any)
	if len(page) != 2 || page[0].(map[string]any)["id"] != aRuns[1] || page[1].(map[string]any)["id"] != aRuns[2] {
		t.Errorf("after a legacy cursor: %v, want %v", page, aRuns[1:3])
	}
}
