package api_test

import (
	"bufio"
	"encoding/json"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
)

// readJobBodies reads testdata/job-bodies.txt: the seed corpus of
// apifuzz.FuzzDecodeJobRequest.
func readJobBodies(t testing.TB, path string) [][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][]byte
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s, err := strconv.Unquote(line)
		if err != nil {
			t.Fatalf("%s: %q: %v", path, line, err)
		}
		out = append(out, []byte(s))
	}
	return out
}

// TestJobBodiesOnRealStore runs the fuzz seed corpus through POST /v1/jobs
// and PATCH /v1/jobs/{id} on the SQLite store: never a 5xx, always a JSON
// object. (The fuzz target itself runs on an in-memory store, see apifuzz.)
func TestJobBodiesOnRealStore(t *testing.T) {
	e := newEnv(t)
	h := e.server.Handler()
	patchPath := "/v1/jobs/" + e.createJob(e.admin, nil)["id"].(string)
	for _, body := range readJobBodies(t, "testdata/job-bodies.txt") {
		for _, method := range []string{"POST", "PATCH"} {
			path := "/v1/jobs"
			if method == "PATCH" {
				path = patchPath
			}
			r := httptest.NewRequest(method, path, strings.NewReader(string(body)))
			r.Header.Set("Authorization", "Bearer "+e.admin)
			r.Header.Set("Idempotency-Key", newKey())
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			var m map[string]any
			if w.Code >= 500 || json.Unmarshal(w.Body.Bytes(), &m) != nil {
				t.Errorf("%s %q: %d %s", method, body, w.Code, w.Body)
			}
		}
	}
}
