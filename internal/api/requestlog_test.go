package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/vibejobs/vibejobs/internal/api"
)

// TestRequestLogTakesOnlyIDs: the request log names the job or run a
// request concerns only by an id of ours. A path segment or a jobId filter
// holds whatever the client put there: a job secret or a token pasted in
// the wrong place must not reach the log (SEMANTICS.md section 1), nor a
// megabyte of text per request.
func TestRequestLogTakesOnlyIDs(t *testing.T) {
	e := newEnv(t)
	e.createJob(e.admin, nil)
	secret := "vjs_" + strings.Repeat("S", 43)
	token := "vjt_" + strings.Repeat("T", 43)
	long := "job_" + strings.Repeat("L", 64<<10)
	for _, bad := range []string{secret, token, long} {
		for _, r := range []struct{ method, path string }{
			{"GET", "/v1/jobs/" + bad},
			{"PATCH", "/v1/jobs/" + bad},
			{"DELETE", "/v1/jobs/" + bad},
			{"POST", "/v1/jobs/" + bad + "/pause"},
			{"POST", "/v1/jobs/" + bad + "/rotate-secret"},
			{"POST", "/v1/jobs/" + bad + "/runs"},
			{"GET", "/v1/jobs/" + bad + "/runs"},
			{"GET", "/v1/jobs/" + bad + "/next"},
			{"GET", "/v1/runs/" + bad},
			{"GET", "/v1/runs?jobId=" + bad},
		} {
			var body any
			if r.method == "PATCH" {
				body = "{}"
			}
			if res := e.do(r.method, r.path, e.admin, body); res.status != http.StatusNotFound {
				t.Errorf("%s %.40s…: %d, want 404", r.method, r.path, res.status)
			}
		}
	}
	logs := e.logs.String()
	for _, bad := range []string{"SSSSSSSS", "TTTTTTTT", "LLLLLLLL"} {
		if strings.Contains(logs, bad) {
			t.Errorf("the log holds what a client put in place of an id (%s…)", bad)
		}
	}
	if !strings.Contains(logs, `"status":404`) {
		t.Errorf("no request was logged:\n%.2000s", logs)
	}
}

// TestRequestLogTakesOnlyKnownMethods: the request log names a request's
// method only when it is one of HTTP's. A method is any token the client
// sends, up to the header limit: a secret given to curl -X by mistake, or a
// megabyte of text, must not reach the log.
func TestRequestLogTakesOnlyKnownMethods(t *testing.T) {
	e := newEnv(t)
	secret := "vjs_" + strings.Repeat("S", 43)
	long := strings.Repeat("L", 64<<10)
	for _, r := range []struct{ method, path string }{
		{secret, "/v1/jobs"},
		{secret, "/v1/nowhere"},
		{secret, "/healthz"},
		// Not where the 405 answer names the method: 64 KiB of it would
		// reach the client before the request is logged.
		{long, "/v1/nowhere"},
	} {
		if res := e.do(r.method, r.path, e.admin, nil); res.status < 400 {
			t.Errorf("%.20s… %s: %d, want an error", r.method, r.path, res.status)
		}
	}
	logs := e.logs.String()
	for _, bad := range []string{"SSSSSSSS", "LLLLLLLL"} {
		if strings.Contains(logs, bad) {
			t.Errorf("the log holds the method a client sent (%s…)", bad)
		}
	}
	if n := strings.Count(logs, `"method":"other"`); n != 4 {
		t.Errorf("%d requests logged with method other, want 4:\n%.2000s", n, logs)
	}
	e.must(200, "GET", "/v1/jobs", e.admin, nil)
	if !strings.Contains(e.logs.String(), `"method":"GET"`) {
		t.Errorf("a GET is not logged as one:\n%.2000s", e.logs.String())
	}
}

// TestReadyzWhileStoppingLogsAtDebug: the answers /readyz gives while the
// server stops are logged at debug, as passing probes are; they were each
// an info line, one per probe every few seconds of a stop that can last a
// job's timeout, saying again what the server logs once as it begins to
// stop. A probe that finds the platform not ready is still logged as an
// error, with its cause.
func TestReadyzWhileStoppingLogsAtDebug(t *testing.T) {
	var stopping bool
	e := newEnv(t, func(c *api.Config) {
		c.Ready = func(context.Context) error { return errors.New("scheduler stalled") }
		c.Stopping = func() bool { return stopping }
	})
	e.do("GET", "/readyz", "", nil)
	stopping = true
	for range 3 {
		if res := e.do("GET", "/readyz", "", nil); res.status != 503 {
			t.Fatalf("readyz while stopping = %s", res)
		}
	}
	var levels []string
	for line := range strings.Lines(e.logs.String()) {
		var l struct {
			Level, Msg, Route, Error string
			Status                   int
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if l.Msg == "api request" && l.Route == "GET /readyz" {
			levels = append(levels, fmt.Sprintf("%d %s %s", l.Status, l.Level, l.Error))
		}
	}
	want := []string{"503 ERROR scheduler stalled", "503 DEBUG ", "503 DEBUG ", "503 DEBUG "}
	if !slices.Equal(levels, want) {
		t.Errorf("/readyz logged as %q; want %q (not ready, then stopping three times)", levels, want)
	}
}
