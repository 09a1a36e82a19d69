package api_test

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

// TestTokenLimit: a project holds at most vibejobs.MaxTokensPerProject live
// tokens. One more is refused as the other limits are (409, an error with
// its code and a message naming the limit), whether the project's admin or
// the installation token mints it; revoking one makes room again, and the
// limit is each project's own.
func TestTokenLimit(t *testing.T) {
	e := newEnv(t)
	pid, toks := e.newProject("full") // three tokens
	admin := toks[vibejobs.RoleAdmin]
	path := "/v1/projects/" + pid + "/tokens"
	body := func(i int) map[string]any { return map[string]any{"name": "t" + strconv.Itoa(i), "role": "read"} }
	var last string
	for i := 3; i < vibejobs.MaxTokensPerProject; i++ {
		last = e.must(201, "POST", path, admin, body(i))["id"].(string)
	}
	for _, by := range []string{admin, e.admin} {
		res := e.do("POST", path, by, body(0))
		code, field := res.errorCode(t)
		if res.status != 409 || code != "too_many_tokens" || field != "" {
			t.Fatalf("a token beyond the limit: %s", res)
		}
		msg, _ := res.json(t)["error"].(map[string]any)["message"].(string)
		if !strings.Contains(msg, strconv.Itoa(vibejobs.MaxTokensPerProject)) {
			t.Errorf("the refusal does not name the limit: %q", msg)
		}
	}
	live := 0
	for _, tk := range e.must(200, "GET", path+"?limit=100", admin, nil)["tokens"].([]any) {
		if tk.(map[string]any)["revokedAt"] == nil {
			live++
		}
	}
	if live != vibejobs.MaxTokensPerProject {
		t.Errorf("%d live tokens after the refusals, want %d", live, vibejobs.MaxTokensPerProject)
	}
	// Another project has room of its own.
	e.must(201, "POST", fmt.Sprintf("/v1/projects/%s/tokens", e.project), e.admin, body(0))
	// Revoking one makes room for one.
	e.must(204, "DELETE", "/v1/tokens/"+last, admin, nil)
	e.must(201, "POST", path, admin, body(0))
	if res := e.do("POST", path, admin, body(1)); res.status != 409 {
		t.Errorf("a token beyond the limit after one revocation: %s", res)
	}
}

// TestTokenListPages: a project's tokens come a page at a time, as the
// other lists do: limit 1–100 (default 50), nextCursor to continue, null
// on the last page; every token once, revoked ones included, in id order
// (oldest first). A bad limit answers 400 invalid_limit, a cursor this
// list did not hand out 400 invalid_cursor, and another project's list 404
// whatever the cursor.
func TestTokenListPages(t *testing.T) {
	e := newEnv(t)
	pid, toks := e.newProject("paged") // three tokens
	admin := toks[vibejobs.RoleAdmin]
	path := "/v1/projects/" + pid + "/tokens"
	var otherID string
	var other map[vibejobs.Role]string
	for i := range 57 {
		e.clock.Advance(time.Millisecond) // ids of one millisecond are in random order
		if i == 10 {
			// Another project's tokens amid this one's.
			otherID, other = e.newProject("other")
			e.clock.Advance(time.Millisecond)
		}
		id := e.must(201, "POST", path, admin, map[string]any{"name": "t" + strconv.Itoa(i), "role": "read"})["id"].(string)
		if i%5 == 0 {
			e.must(204, "DELETE", "/v1/tokens/"+id, admin, nil)
		}
	}
	ids := func(page map[string]any) []string { return pageIDs(page, "tokens") }
	all := ids(e.must(200, "GET", path+"?limit=100", admin, nil))
	if len(all) != 60 || !slices.IsSorted(all) {
		t.Fatalf("limit 100: %d tokens (sorted: %v), want the 60 in id order", len(all), slices.IsSorted(all))
	}
	first := e.must(200, "GET", path, admin, nil)
	if got := ids(first); len(got) != 50 || first["nextCursor"] == nil {
		t.Errorf("default page: %d tokens, nextCursor %v; want 50 and a cursor", len(got), first["nextCursor"])
	}
	// Walked 7 at a time: each token once, in order, the last page's
	// nextCursor null.
	walked := e.walkPages(path, admin, "tokens", 7)
	if !slices.Equal(walked, all) {
		t.Errorf("walked %d tokens, want the %d listed at once, in the same order", len(walked), len(all))
	}

	cursor := first["nextCursor"].(string)
	otherCursor := e.must(200, "GET", "/v1/projects/"+otherID+"/tokens?limit=1", e.admin, nil)["nextCursor"].(string)
	jobsCursor := func() string {
		for range 2 {
			e.must(201, "POST", "/v1/jobs", e.admin, jobBody(nil))
		}
		return e.must(200, "GET", "/v1/jobs?limit=1", e.admin, nil)["nextCursor"].(string)
	}()
	bare, _, _ := strings.Cut(cursor, ".")
	e.checkListCases(path, "tokens", all[50:], []listCase{
		{"?limit=0", admin, 400, "invalid_limit", "limit"},
		{"?limit=101", admin, 400, "invalid_limit", "limit"},
		{"?limit=x", admin, 400, "invalid_limit", "limit"},
		{"?limit=1&limit=2", admin, 400, "invalid_limit", "limit"},
		{"?cursor=", admin, 400, "invalid_cursor", "cursor"},
		{"?cursor=" + strings.Repeat("A", 513), admin, 400, "invalid_cursor", "cursor"},
		{"?cursor=not-a-cursor", admin, 400, "invalid_cursor", "cursor"},
		{"?cursor=" + cursor + "x", admin, 400, "invalid_cursor", "cursor"},
		{"?cursor=" + bare, admin, 400, "invalid_cursor", "cursor"},        // never handed out unbound
		{"?cursor=" + otherCursor, admin, 400, "invalid_cursor", "cursor"}, // another project's list
		{"?cursor=" + otherCursor, e.admin, 400, "invalid_cursor", "cursor"},
		{"?cursor=" + jobsCursor, admin, 400, "invalid_cursor", "cursor"}, // another kind of list
		{"?sort=id", admin, 400, "invalid_query", "sort"},
		{"?cursor=" + cursor, other[vibejobs.RoleAdmin], 404, "project_not_found", ""},
		{"?cursor=" + otherCursor, other[vibejobs.RoleAdmin], 404, "project_not_found", ""},
		{"?cursor=" + cursor, toks[vibejobs.RoleWrite], 403, "forbidden", ""},
		{"?cursor=" + cursor, admin, 200, "", ""},
		{"?cursor=" + cursor, e.admin, 200, "", ""}, // the installation token pages the same list
	})

	// A bound cursor positioned at another project's token pages exactly
	// as one positioned just after it, where no token is: it tells nothing
	// of the other project.
	_, tag, _ := strings.Cut(cursor, ".")
	enc := func(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }
	otherToken := ids(e.must(200, "GET", "/v1/projects/"+otherID+"/tokens", e.admin, nil))[0]
	x := e.do("GET", path+"?cursor="+enc(otherToken)+"."+tag, admin, nil)
	y := e.do("GET", path+"?cursor="+enc(otherToken+"0")+"."+tag, admin, nil)
	if x.status != 200 || len(ids(x.json(t))) == 0 || x.status != y.status || !bytes.Equal(x.body, y.body) {
		t.Errorf("after another project's token: %d; after an id never created: %d (bodies equal: %v)",
			x.status, y.status, bytes.Equal(x.body, y.body))
	}
}
