package api_test

import (
	"context"
	"strings"
	"testing"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
)

func TestBatchCreateAllOrNone(t *testing.T) {
	e := newEnv(t)
	jobs := make([]any, 100)
	for i := range jobs {
		jobs[i] = jobBody(nil)
	}
	res := e.send(req{method: "POST", path: "/v1/jobs/batch", token: e.admin, key: keyAuto, body: map[string]any{"jobs": jobs}})
	if res.status != 201 {
		t.Fatalf("batch of 100: %d %s", res.status, res.body)
	}
	out := res.json(t)["jobs"].([]any)
	seen := map[string]bool{}
	for _, j := range out {
		m := j.(map[string]any)
		if s, _ := m["secret"].(string); len(s) != 47 || seen[m["id"].(string)] {
			t.Fatalf("job %v", m)
		}
		seen[m["id"].(string)] = true
	}
	if len(seen) != 100 {
		t.Fatalf("%d distinct jobs", len(seen))
	}

	// One bad job refuses the whole batch, naming it.
	bad := []any{jobBody(nil), jobBody(nil), jobBody(nil), jobBody(map[string]any{"url": "ftp://x"})}
	res = e.send(req{method: "POST", path: "/v1/jobs/batch", token: e.admin, key: keyAuto, body: map[string]any{"jobs": bad}})
	if res.status != 400 || !strings.Contains(string(res.body), `"field":"jobs[3].url"`) {
		t.Fatalf("bad batch: %d %s", res.status, res.body)
	}
	n, err := e.store.CountJobs(context.Background(), e.project)
	if err != nil || n != 100 {
		t.Fatalf("jobs after a refused batch: %d %v", n, err)
	}
	for _, body := range []string{`{"jobs":[]}`, `{"jobs":{}}`, `{}`, `{"jobs":[1]}`, `{"jobs":[{}],"x":1}`} {
		if res := e.send(req{method: "POST", path: "/v1/jobs/batch", token: e.admin, key: keyAuto, body: body}); res.status != 400 {
			t.Errorf("%s: %d %s", body, res.status, res.body)
		}
	}
	over := make([]any, 101)
	for i := range over {
		over[i] = jobBody(nil)
	}
	if res := e.send(req{method: "POST", path: "/v1/jobs/batch", token: e.admin, key: keyAuto, body: map[string]any{"jobs": over}}); res.status != 400 {
		t.Errorf("101 jobs: %d", res.status)
	}
	_ = vibejobs.EINVALID
}

// TestBatchTakesLongURLs: a batch of 100 jobs whose URLs are near the
// longest allowed fits its body limit, far above a single request's 64 KiB;
// a body over the batch limit is refused with 413 before it is parsed.
func TestBatchTakesLongURLs(t *testing.T) {
	e := newEnv(t)
	url := "https://example.test/hooks/report?sig=" + strings.Repeat("a&b", 650)
	jobs := make([]any, api.MaxBatchJobs)
	for i := range jobs {
		jobs[i] = jobBody(map[string]any{"url": url})
	}
	res := e.send(req{method: "POST", path: "/v1/jobs/batch", token: e.admin, key: keyAuto, body: map[string]any{"jobs": jobs}})
	if res.status != 201 || len(res.body) < 64<<10 {
		t.Fatalf("batch of 100 jobs with %d-byte URLs: %d %.300s", len(url), res.status, res.body)
	}
	for _, j := range res.json(t)["jobs"].([]any) {
		if got := j.(map[string]any)["url"]; got != url {
			t.Fatalf("stored URL %q, want the one sent", got)
		}
	}
	big := `{"jobs":[` + strings.Repeat(" ", api.MaxBatchBodyBytes) + `]}`
	res = e.send(req{method: "POST", path: "/v1/jobs/batch", token: e.admin, key: keyAuto, body: big})
	if res.status != 413 || !strings.Contains(string(res.body), `"body_too_large"`) {
		t.Fatalf("a batch body over %d bytes: %d %.300s", api.MaxBatchBodyBytes, res.status, res.body)
	}
}
