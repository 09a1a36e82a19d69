package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/internal/syncbuf"
)

func TestEventsTail(t *testing.T) {
	a := startAPI(t, nil)
	if out := a.ok(t, "events", "tail", "--follow=false"); out != "" {
		t.Errorf("tail from the head of an empty feed: %q", out)
	}
	id := a.okJSON(t, "jobs", "create", "--name", "n", "--schedule", "@daily", "--url", "https://example.test/")["id"].(string)
	a.ok(t, "jobs", "pause", id)
	a.ok(t, "jobs", "resume", id)

	out := a.ok(t, "events", "tail", "--after", "0", "--follow=false")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "job.created") || !strings.Contains(lines[1], "job.paused") ||
		!strings.HasPrefix(lines[2], "3 ") || !strings.Contains(lines[2], "next run 2026-10-10T00:00:00.000Z") {
		t.Errorf("tail:\n%s", out)
	}
	if strings.Contains(out, "example.test") {
		t.Errorf("an event shows the URL:\n%s", out)
	}
	out = a.ok(t, "events", "tail", "--after", "0", "--follow=false", "--type", "job.paused,job.resumed", "--job", id, "--json")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("filtered tail --json:\n%s", out)
	}
	var e map[string]any
	if err := json.Unmarshal([]byte(lines[1]), &e); err != nil || e["type"] != "job.resumed" || e["sequence"] != 3.0 {
		t.Errorf("NDJSON line %q: %v", lines[1], err)
	}
	if _, _, err := a.cli(t, "events", "tail", "--type", "run.nope", "--follow=false"); err == nil || !strings.Contains(err.Error(), "invalid_type") {
		t.Errorf("bad type: %v", err)
	}

	// Following: new events appear, then an interrupt ends the tail cleanly.
	ctx, cancel := context.WithCancel(context.Background())
	var buf syncbuf.Buffer
	done := make(chan error, 1)
	go func() {
		getenv := func(k string) string {
			return map[string]string{"VIBEJOBS_SERVER": a.url, "VIBEJOBS_TOKEN": a.token}[k]
		}
		done <- run(ctx, []string{"events", "tail", "--after", "3", "--interval", "100ms"}, getenv, &buf, &bytes.Buffer{}, nil)
	}()
	a.ok(t, "jobs", "pause", id)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), "job.paused") {
		if time.Now().After(deadline) {
			t.Fatalf("tail did not follow: %q", buf.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("interrupted tail: %v", err)
	}
	if got := buf.String(); strings.Count(got, "\n") != 1 || !strings.HasPrefix(got, "4 ") {
		t.Errorf("following printed %q", got)
	}
}

func TestSubscriptionCommands(t *testing.T) {
	a := startAPI(t, nil)
	out := a.ok(t, "subscriptions", "create", "--url", "https://hooks.example.test/vj", "--types", "run.failed,job.paused")
	for _, want := range []string{"FIELD", "https://hooks.example.test/vj", "run.failed,job.paused", "all", "status", "ok", "secret: vjs_"} {
		if !strings.Contains(out, want) {
			t.Errorf("create lacks %q:\n%s", want, out)
		}
	}
	// A subscription's jobIds must name jobs of the project.
	jobA := a.okJSON(t, "jobs", "create", "--name", "a", "--schedule", "@daily", "--url", "https://example.test/a")["id"].(string)
	jobB := a.okJSON(t, "jobs", "create", "--name", "b", "--schedule", "@daily", "--url", "https://example.test/b")["id"].(string)
	s := a.okJSON(t, "subscriptions", "create", "--url", "https://hooks.example.test/2", "--jobs", jobA+","+jobB)
	id := s["id"].(string)
	if sec, _ := s["secret"].(string); !strings.HasPrefix(sec, "vjs_") {
		t.Errorf("create --json: %v", s)
	}
	out = a.ok(t, "subscriptions", "list")
	for _, want := range []string{"ID", "URL", "TYPES", "CURSOR", "STATUS", id, jobA + "," + jobB} {
		if !strings.Contains(out, want) {
			t.Errorf("list lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "vjs_") {
		t.Errorf("list shows a secret:\n%s", out)
	}
	if l := a.okJSON(t, "subscriptions", "list"); len(l["subscriptions"].([]any)) != 2 {
		t.Errorf("list --json: %v", l)
	}
	if g := a.okJSON(t, "subscriptions", "get", id); g["id"] != id || g["secret"] != nil {
		t.Errorf("get: %v", g)
	}
	if u := a.okJSON(t, "subscriptions", "update", id, "--jobs", "", "--types", "run.failed"); len(u["jobIds"].([]any)) != 0 || len(u["types"].([]any)) != 1 {
		t.Errorf("update: %v", u)
	}
	out = a.ok(t, "subscriptions", "rotate-secret", id)
	if !strings.Contains(out, "secret: vjs_") || !strings.Contains(out, "old secret signs until") {
		t.Errorf("rotate-secret:\n%s", out)
	}
	if r := a.okJSON(t, "subscriptions", "reset", id); r["cursor"] != 2.0 || r["failing"] != false { // after the two jobs' job.created
		t.Errorf("reset: %v", r)
	}
	// A reset past events names them, and how to read them.
	a.okJSON(t, "jobs", "create", "--name", "after-reset", "--schedule", "@daily", "--url", "https://example.test/")
	if out := a.ok(t, "subscriptions", "reset", id); !strings.Contains(out, "skipped events 3 to 3") ||
		!strings.Contains(out, "events tail --after 2") {
		t.Errorf("reset past an event:\n%s", out)
	}
	if out := a.ok(t, "subscriptions", "delete", id); !strings.Contains(out, "deleted subscription "+id) {
		t.Errorf("delete: %q", out)
	}
	if _, _, err := a.cli(t, "subscriptions", "get", id); err == nil || !strings.Contains(err.Error(), "subscription_not_found") {
		t.Errorf("get after delete: %v", err)
	}
	if _, errOut, err := a.cli(t, "subscriptions", "create"); err == nil || !strings.Contains(errOut, "Usage: vibejobs subscriptions create") {
		t.Errorf("create without --url: %v %q", err, errOut)
	}
}

// TestEventsTailSaysWhatRetentionPruned: a tail that starts before the
// feed's oldest kept event says on stderr which sequences it missed, and
// prints the rest as usual.
func TestEventsTailSaysWhatRetentionPruned(t *testing.T) {
	a := startAPI(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/events" {
				h.ServeHTTP(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"items":[{"sequence":5,"type":"job.paused","occurredAt":"2026-10-09T08:00:00.000Z",`+
				`"jobId":"job_x","runId":null,"data":{"state":"paused"}}],"head":5,"oldest":5,"next":5}`)
		})
	})
	out, errOut, err := a.cli(t, "events", "tail", "--after", "0", "--follow=false")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "5 ") || strings.Count(out, "\n") != 1 {
		t.Errorf("stdout %q, want the one event kept", out)
	}
	if !strings.Contains(errOut, "events 1 to 4 were pruned by retention") {
		t.Errorf("stderr %q does not name the pruned events", errOut)
	}
	if _, errOut, _ := a.cli(t, "events", "tail", "--after", "4", "--follow=false"); errOut != "" {
		t.Errorf("a tail from the oldest kept event says %q", errOut)
	}
}
