package api_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
)

func TestRateLimit(t *testing.T) {
	e := newEnv(t, func(c *api.Config) { c.RateLimit = api.RateLimit{PerSecond: 0.5, Burst: 3} })
	other := mintInStore(t, e)
	for range 3 {
		e.must(200, "GET", "/v1/jobs", e.admin, nil)
	}
	res := e.do("GET", "/v1/jobs", e.admin, nil)
	if code, _ := res.errorCode(t); res.status != 429 || code != "rate_limited" || res.header.Get("Retry-After") != "2" {
		t.Fatalf("over the limit: %s, Retry-After %q", res, res.header.Get("Retry-After"))
	}
	// Another token has a bucket of its own.
	e.must(200, "GET", "/v1/jobs", other, nil)
	// Refilled at 0.5/s: one request after 2 s.
	e.clock.Advance(2 * time.Second)
	e.must(200, "GET", "/v1/jobs", e.admin, nil)
	if res := e.do("GET", "/v1/jobs", e.admin, nil); res.status != 429 {
		t.Errorf("bucket refilled too much: %s", res)
	}
	// Health checks need no token and are not limited.
	for range 10 {
		e.must(200, "GET", "/healthz", "", nil)
	}
}

// TestRateLimitClockBack: the API reads the wall clock (its instants carry
// no monotonic reading), which NTP or an operator may step back. A token's
// bucket then refills again from the new time on, as it would have going
// forward, instead of staying empty until the clock has caught up with the
// last request (an hour's step would shut the token out for an hour).
func TestRateLimitClockBack(t *testing.T) {
	e := newEnv(t, func(c *api.Config) { c.RateLimit = api.RateLimit{PerSecond: 0.5, Burst: 3} })
	for range 3 {
		e.must(200, "GET", "/v1/jobs", e.admin, nil)
	}
	e.clock.Advance(-time.Hour)
	if res := e.do("GET", "/v1/jobs", e.admin, nil); res.status != 429 {
		t.Fatalf("a step back refilled the bucket: %s", res)
	}
	e.clock.Advance(2 * time.Second)
	e.must(200, "GET", "/v1/jobs", e.admin, nil)
	if res := e.do("GET", "/v1/jobs", e.admin, nil); res.status != 429 {
		t.Errorf("bucket refilled too much after the step back: %s", res)
	}
}

// mintInStore creates a read token of the default project through the
// store, so the test's setup does not spend the admin's bucket.
func mintInStore(t *testing.T, e *env) string {
	t.Helper()
	var b [32]byte
	rand.Read(b[:])
	value := "vjt_" + base64.RawURLEncoding.EncodeToString(b[:])
	sum := sha256.Sum256([]byte(value))
	tok := &vibejobs.Token{ID: vibejobs.NewID("tok_", e.clock.Now(), nil), ProjectID: e.project, Name: "direct",
		Role: vibejobs.RoleRead, Prefix: value[:12], Hash: sum[:], CreatedAt: e.clock.Now()}
	if err := e.store.Update(t.Context(), func(tx vibejobs.Tx) error { return tx.CreateToken(t.Context(), tok, vibejobs.MaxTokensPerProject) }); err != nil {
		t.Fatal(err)
	}
	return value
}

// TestNoSecretAtRest creates jobs and rotates secrets, then scans every
// answer, the log and the database files for any secret: only the create and
// rotate answers may hold one, and API tokens appear only in the answer that
// minted them.
func TestNoSecretAtRest(t *testing.T) {
	e := newEnv(t)
	var secrets, tokens []string
	var allowed [][]byte
	for i := range 5 {
		res := e.do("POST", "/v1/jobs", e.admin, jobBody(map[string]any{"name": "job " + string(rune('a'+i))}))
		j := res.json(t)
		secrets = append(secrets, j["secret"].(string))
		allowed = append(allowed, res.body)
		id := j["id"].(string)
		// Replays of the create answer (read back from the store) may hold it too.
		e.must(202, "POST", "/v1/jobs/"+id+"/runs", e.admin, nil)
		res = e.do("POST", "/v1/jobs/"+id+"/rotate-secret", e.admin, nil)
		secrets = append(secrets, res.json(t)["secret"].(string))
		allowed = append(allowed, res.body)
		e.must(200, "GET", "/v1/jobs/"+id, e.admin, nil)
		e.must(200, "PATCH", "/v1/jobs/"+id, e.admin, map[string]any{"name": "renamed"})
		e.must(200, "GET", "/v1/jobs/"+id+"/runs", e.admin, nil)
	}
	r := req{method: "POST", path: "/v1/jobs", token: e.admin, key: "replayed", body: jobBody(nil)}
	first := e.send(r)
	secrets = append(secrets, first.json(t)["secret"].(string))
	allowed = append(allowed, first.body)
	e.send(r) // a replay, read back from the database
	pid, toks := e.newProject("p")
	for _, v := range toks {
		tokens = append(tokens, v)
	}
	tokens = append(tokens, e.admin)
	e.must(200, "GET", "/v1/jobs", e.admin, nil)
	e.must(200, "GET", "/v1/projects/"+pid+"/tokens", e.admin, nil)
	e.must(200, "GET", "/v1/projects", e.admin, nil)

	isAllowed := func(body string) bool {
		for _, a := range allowed {
			if string(a) == body {
				return true
			}
		}
		return false
	}
	e.mu.Lock()
	bodies := append([]string(nil), e.bodies...)
	e.mu.Unlock()
	for _, body := range bodies {
		for _, s := range secrets {
			if strings.Contains(body, s) && !isAllowed(body) {
				t.Errorf("an answer other than create/rotate holds a secret: %s", body)
			}
		}
		if strings.Contains(body, "vjs_") && !isAllowed(body) {
			t.Errorf("an answer holds something like a secret: %s", body)
		}
	}
	logs := e.logs.String()
	if logs == "" {
		t.Fatal("nothing logged")
	}
	for _, s := range append(secrets, tokens...) {
		if strings.Contains(logs, s) {
			t.Errorf("the log holds a secret or token")
		}
	}
	for _, word := range []string{"vjs_", "vjt_", "example.test", "replayed"} {
		if strings.Contains(logs, word) {
			t.Errorf("the log holds %q", word)
		}
	}
	// The database files (WAL included) hold no secret or token in clear.
	e.store.Close()
	files, _ := filepath.Glob(e.dbPath + "*")
	if len(files) == 0 {
		t.Fatal("no database file")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range append(secrets, tokens...) {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s holds a secret or token in clear", filepath.Base(f))
			}
		}
		if bytes.Contains(b, []byte("vjs_")) {
			t.Errorf("%s holds something like a secret", filepath.Base(f))
		}
	}
}

// TestRequestLog: one line per request with method, route pattern, status,
// duration, project and ids; nothing else of the request.
func TestRequestLog(t *testing.T) {
	e := newEnv(t)
	j := e.createJob(e.admin, nil)
	id := j["id"].(string)
	e.must(200, "GET", "/v1/jobs/"+id, e.admin, nil)
	var found bool
	for _, line := range strings.Split(strings.TrimSpace(e.logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["route"] == "GET /v1/jobs/{id}" {
			found = true
			for _, k := range []string{"method", "status", "duration_ms", "project", "token_id", "job"} {
				if _, ok := m[k]; !ok {
					t.Errorf("log line without %s: %s", k, line)
				}
			}
			if m["job"] != id || m["project"] != e.project || m["status"] != 200.0 {
				t.Errorf("log line %s", line)
			}
		}
	}
	if !found {
		t.Errorf("no log line for the get: %s", e.logs.String())
	}
}
