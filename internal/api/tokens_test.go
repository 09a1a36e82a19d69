package api_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

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
	for _, tk := range e.must(200, "GET", path, admin, nil)["tokens"].([]any) {
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
