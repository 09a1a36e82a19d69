package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

// TestSnippetCannotDriveATerminal: a response snippet is whatever the
// receiver answered, and people read the API's JSON in a terminal (curl,
// "vibejobs runs get --json"). encoding/json escapes the C0 controls (ESC
// among them) but leaves DEL and the C1 controls raw, and terminals such as
// VTE, screen and mosh take a UTF-8 U+009B as CSI and U+009D as OSC, as
// they take ESC [ and ESC ]. Every control must reach the client escaped,
// and decode back to the bytes the receiver sent.
func TestSnippetCannotDriveATerminal(t *testing.T) {
	e := newEnv(t)
	id := e.createJob(e.admin, nil)["id"].(string)
	runID := e.must(202, "POST", "/v1/jobs/"+id+"/runs", e.admin, nil)["id"].(string)

	snippet := "\u009b2J\u009d0;owned\u009c \x1b[31mred\x7f \u0085 é £\u00a0ok"
	ctx := context.Background()
	now := e.clock.Now()
	claims, err := e.store.ClaimDueRuns(ctx, "test", now, 10, time.Second)
	if err != nil || len(claims) != 1 || claims[0].Run.ID != runID {
		t.Fatalf("ClaimDueRuns: %v, %d claims", err, len(claims))
	}
	c := claims[0]
	a := vibejobs.Attempt{Number: c.Run.Attempt, StartedAt: now, FinishedAt: now.Add(time.Millisecond),
		StatusCode: 500, ErrorCode: "http_5xx", ResponseSnippet: snippet}
	res := vibejobs.AttemptResult{StatusCode: 500, ErrorCode: "http_5xx"}
	if err := e.store.RecordOutcomes(ctx, "test", []vibejobs.Outcome{{RunID: runID, ClaimedAt: c.ClaimedAt, Attempt: a,
		Step: vibejobs.NextStep(c.Retry, c.Run.Attempt, res, c.Run.DeadlineAt, a.FinishedAt, 0.5)}}); err != nil {
		t.Fatal(err)
	}

	got := e.do("GET", "/v1/runs/"+runID, e.admin, nil)
	if got.status != 200 {
		t.Fatalf("GET run: %s", got)
	}
	for _, r := range []rune{0x1b, 0x7f, 0x85, 0x9b, 0x9c, 0x9d} {
		if bytes.ContainsRune(got.body, r) {
			t.Errorf("the answer carries U+%04X raw: %q", r, got.body)
		}
	}
	var run struct {
		Attempts []struct {
			ResponseSnippet string `json:"responseSnippet"`
		} `json:"attempts"`
	}
	if err := json.Unmarshal(got.body, &run); err != nil || len(run.Attempts) != 1 {
		t.Fatalf("decoding the run: %v, %s", err, got.body)
	}
	if run.Attempts[0].ResponseSnippet != snippet {
		t.Errorf("snippet decodes to %q, want %q", run.Attempts[0].ResponseSnippet, snippet)
	}
}
