package api_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestProjectListPages: the installation's projects come a page at a time,
// as the other lists do: limit 1–100 (default 50), nextCursor to continue,
// null on the last page; every project once, in id order. A
// bad limit answers 400 invalid_limit, a cursor this list did not hand out
// 400 invalid_cursor; only the installation token lists projects.
func TestProjectListPages(t *testing.T) {
	e := newEnv(t) // the bootstrap project
	var admin string
	for i := range 56 {
		e.clock.Advance(time.Millisecond) // ids of one millisecond are in random order
		id := e.must(201, "POST", "/v1/projects", e.admin, map[string]any{"name": "p" + strconv.Itoa(i)})["id"].(string)
		if i == 0 {
			admin = e.must(201, "POST", "/v1/projects/"+id+"/tokens", e.admin,
				map[string]any{"name": "admin", "role": "admin"})["token"].(string)
		}
	}
	ids := func(page map[string]any) []string { return pageIDs(page, "projects") }
	all := ids(e.must(200, "GET", "/v1/projects?limit=100", e.admin, nil))
	if len(all) != 57 || !slices.IsSorted(all) || !slices.Contains(all, e.project) {
		t.Fatalf("limit 100: %d projects (sorted: %v), want the 57 in id order, the bootstrap one among them", len(all), slices.IsSorted(all))
	}
	first := e.must(200, "GET", "/v1/projects", e.admin, nil)
	if got := ids(first); len(got) != 50 || first["nextCursor"] == nil {
		t.Errorf("default page: %d projects, nextCursor %v; want 50 and a cursor", len(got), first["nextCursor"])
	}
	// Walked 7 at a time: each project once, in order, the last page's
	// nextCursor null.
	walked := e.walkPages("/v1/projects", e.admin, "projects", 7)
	if !slices.Equal(walked, all) {
		t.Errorf("walked %d projects, want the %d listed at once, in the same order", len(walked), len(all))
	}

	cursor := first["nextCursor"].(string)
	e.must(201, "POST", "/v1/projects/"+e.project+"/tokens", e.admin, map[string]any{"name": "second", "role": "read"})
	tokensCursor := e.must(200, "GET", "/v1/projects/"+e.project+"/tokens?limit=1", e.admin, nil)["nextCursor"].(string)
	bare, _, _ := strings.Cut(cursor, ".")
	e.checkListCases("/v1/projects", "projects", all[50:], []listCase{
		{"?limit=0", e.admin, 400, "invalid_limit", "limit"},
		{"?limit=101", e.admin, 400, "invalid_limit", "limit"},
		{"?limit=x", e.admin, 400, "invalid_limit", "limit"},
		{"?limit=1&limit=2", e.admin, 400, "invalid_limit", "limit"},
		{"?cursor=", e.admin, 400, "invalid_cursor", "cursor"},
		{"?cursor=" + strings.Repeat("A", 513), e.admin, 400, "invalid_cursor", "cursor"},
		{"?cursor=not-a-cursor", e.admin, 400, "invalid_cursor", "cursor"},
		{"?cursor=" + cursor + "x", e.admin, 400, "invalid_cursor", "cursor"},
		{"?cursor=" + bare, e.admin, 400, "invalid_cursor", "cursor"},         // never handed out unbound
		{"?cursor=" + tokensCursor, e.admin, 400, "invalid_cursor", "cursor"}, // another list
		{"?sort=id", e.admin, 400, "invalid_query", "sort"},
		{"?cursor=" + cursor, admin, 403, "forbidden", ""}, // a project's admin
		{"?cursor=" + cursor, e.admin, 200, "", ""},
		{"?limit=100&cursor=" + cursor, e.admin, 200, "", ""},
	})
	// A cursor of this list continues no project's list of tokens.
	res := e.do("GET", "/v1/projects/"+e.project+"/tokens?cursor="+cursor, e.admin, nil)
	if code, _ := res.errorCode(t); res.status != 400 || code != "invalid_cursor" {
		t.Errorf("a projects cursor on a tokens list: %d %s, want 400 invalid_cursor", res.status, code)
	}
}
