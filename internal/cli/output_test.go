package cli

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// fakeAPI answers each "METHOD /path" in routes (the query ignored) with its
// status and body, and 404 to anything else. It stands for a server, or a
// tenant's data, the CLI should not trust with the operator's terminal.
func fakeAPI(t *testing.T, routes map[string]fakeAnswer) *testAPI {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := routes[r.Method+" "+r.URL.Path]
		if !ok {
			a = fakeAnswer{404, `{"error":{"code":"not_found","message":"no route"}}`}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		w.Write([]byte(a.body))
	}))
	t.Cleanup(srv.Close)
	return &testAPI{url: srv.URL, token: "vjt_test", srv: srv}
}

type fakeAnswer struct {
	status int
	body   string
}

// unsafeRune reports a rune a terminal acts on or that reorders or hides
// text: C0 and C1 controls and DEL, the bidi embeddings, overrides and
// isolates and marks, and the line and paragraph separators.
func unsafeRune(r rune) bool {
	switch {
	case r < 0x20 && r != '\n', r >= 0x7f && r <= 0x9f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == 0x200e, r == 0x200f, r == 0x061c:
		return true
	case r == 0x2028, r == 0x2029:
		return true
	}
	return false
}

func assertTerminalSafe(t *testing.T, what, s string) {
	t.Helper()
	if !utf8.ValidString(s) {
		t.Errorf("%s: invalid UTF-8 reaches the terminal: %q", what, s)
	}
	for _, r := range s {
		if unsafeRune(r) {
			t.Errorf("%s: %U reaches the terminal unescaped: %q", what, r, s)
			return
		}
	}
}

// TestServerTextIsEscaped: every text the server sends (names, schedules,
// states, failure reasons, error codes, messages, cursors) reaches the
// terminal with its control, bidi and invalid bytes escaped where one can
// see them, while --json stays the server's bytes exactly.
func TestServerTextIsEscaped(t *testing.T) {
	const (
		job = `{"id":"job_1","name":"report\u202Eexe.pdf","schedule":"*/5\t* * * *","timezone":"UTC\u001b[2J",` +
			`"url":"https://example.test/\u009b31m","enabled":true,"state":"active\u0007","retry":{"maxAttempts":4,"minBackoff":"30s","maxBackoff":"1h"},` +
			`"timeout":"10s","catchUp":"all","nextRunAt":null,"lastRun":{"id":"run_1","state":"failed\u2066","scheduledFor":"x"},` +
			`"skippedRuns":0,"createdAt":"c","updatedAt":"u","secret":"vjs_\u001b]0;owned\u0007"}`
		run = `{"id":"run_1","jobId":"job_1","trigger":"manual","scheduledFor":"s","deadlineAt":"d","late":false,"state":"failed",` +
			`"attempt":1,"nextAttemptAt":null,"failureReason":"refused\u001b[8m","createdAt":"c","finishedAt":"f",` +
			`"attempts":[{"number":1,"startedAt":"s","finishedAt":"f","durationMs":5,"statusCode":403,"errorCode":"http_status\u2028x"}]}`
	)
	invalidUTF8 := "{\"projects\":[{\"id\":\"prj_1\",\"name\":\"bad \xff\xfe byte\",\"createdAt\":\"c\"}],\"nextCursor\":null}"
	subscriptions := `{"subscriptions":[{"id":"sub_1","url":"https://example.test/` + "\xff\xfe" + `","types":["run.failed\u202D"],` +
		`"jobIds":[],"cursor":1,"failing":true,"errorCode":"timeout\u001b[5m","attempts":2,"createdAt":"c","updatedAt":"u"}]}`
	a := fakeAPI(t, map[string]fakeAnswer{
		"GET /v1/jobs":                      {200, `{"jobs":[` + job + `],"nextCursor":"cur\u001b[1A"}`},
		"GET /v1/jobs/job_1":                {200, job},
		"POST /v1/jobs/job_1/rotate-secret": {200, job},
		"GET /v1/jobs/job_x":                {404, `{"error":{"code":"job_not_found\u001b[2J","message":"no \u001b]8;;https://evil/\u0007job","field":"id\u202E"}}`},
		"GET /v1/runs/run_1":                {200, run},
		"GET /v1/runs":                      {200, `{"runs":[` + run + `],"nextCursor":null}`},
		"GET /v1/projects":                  {200, invalidUTF8},
		"GET /v1/projects/prj_1/tokens": {200, `{"tokens":[{"id":"tok_1","projectId":"prj_1","name":"ci\r\u001b[K","role":"admin",` +
			`"prefix":"vjt_ab","createdAt":"c","revokedAt":null}]}`},
		"GET /v1/subscriptions": {200, subscriptions},
		"GET /v1/events": {200, `{"items":[{"sequence":1,"type":"run.failed","occurredAt":"o","jobId":"job_1\u001b[0m","runId":"run_1",` +
			`"data":{"state":"failed","reason":"refused\u001b]52;c;aGk=\u0007"}}],"head":1,"oldest":1,"next":1}`},
	})
	for _, args := range [][]string{
		{"jobs", "list"},
		{"jobs", "get", "job_1"},
		{"jobs", "rotate-secret", "job_1"},
		{"jobs", "get", "job_x"},
		{"runs", "get", "run_1"},
		{"runs", "list"},
		{"projects", "list"},
		{"tokens", "list", "--project", "prj_1"},
		{"subscriptions", "list"},
		{"events", "tail", "--after", "0", "--follow=false"},
	} {
		what := strings.Join(args, " ")
		out, errOut, err := a.cli(t, args...)
		assertTerminalSafe(t, what+" stdout", out)
		assertTerminalSafe(t, what+" stderr", errOut)
		if err != nil {
			assertTerminalSafe(t, what+" error", err.Error())
		}
	}

	// The escapes show what was there.
	out := a.ok(t, "jobs", "get", "job_1")
	for _, want := range []string{`report\u202eexe.pdf`, `*/5\t* * * *`, `UTC\x1b[2J`, `\u009b31m`, `active\a`, `failed\u2066`} {
		if !strings.Contains(out, want) {
			t.Errorf("jobs get lacks %q:\n%s", want, out)
		}
	}
	if out := a.ok(t, "jobs", "rotate-secret", "job_1"); !strings.Contains(out, `secret: vjs_\x1b]0;owned\a`) {
		t.Errorf("rotate-secret:\n%s", out)
	}
	_, _, err := a.cli(t, "jobs", "get", "job_x")
	if err == nil || err.Error() != `job_not_found\x1b[2J: no \x1b]8;;https://evil/\ajob (id\u202e)` {
		t.Errorf("error text: %v", err)
	}
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 404 {
		t.Errorf("the escaped error is no longer an *APIError: %#v", err)
	}

	// --json is the server's answer, byte for byte.
	if out := a.ok(t, "jobs", "get", "job_1", "--json"); out != job+"\n" {
		t.Errorf("jobs get --json changed the answer:\n got %q\nwant %q", out, job+"\n")
	}
	if out := a.ok(t, "subscriptions", "list", "--json"); out != subscriptions+"\n" {
		t.Errorf("subscriptions list --json changed the answer: %q", out)
	}
	// A list that pages keeps each item's bytes.
	if out := a.ok(t, "projects", "list", "--json"); !strings.Contains(out, "\"name\":\"bad \xff\xfe byte\"") {
		t.Errorf("projects list --json changed an item: %q", out)
	}
}

// termColumns is the width a terminal gives s, for the test's own strings:
// CJK ideographs, kana and fullwidth forms take two columns.
func termColumns(s string) int {
	n := 0
	for _, r := range s {
		if unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana) || r >= 0xff01 && r <= 0xff60 {
			n += 2
		} else {
			n++
		}
	}
	return n
}

// TestTableColumnsLineUp: a cell with a tab, a newline, another line-breaking
// or spacing control, or wide (east-asian) characters leaves every row one
// line and every column starting at the same terminal column.
func TestTableColumnsLineUp(t *testing.T) {
	jobJSON := func(id, name, schedule string) string {
		b, err := json.Marshal(map[string]any{"id": id, "name": name, "schedule": schedule, "timezone": "UTC",
			"state": "active", "nextRunAt": "N"})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	a := fakeAPI(t, map[string]fakeAnswer{
		"GET /v1/jobs": {200, `{"jobs":[` + strings.Join([]string{
			jobJSON("job_1", "plain", "@daily"),
			jobJSON("job_2", "日本語のジョブ", "@hourly"),
			jobJSON("job_3", "two\nlines", "*/5\t* * * *"),
			jobJSON("job_4", "vt\u000bff\u000cnel\u0085ls\u2028end", "@daily"),
			jobJSON("job_5", "ｆｕｌｌｗｉｄｔｈ", "@daily"),
		}, ",") + `],"nextCursor":null}`},
	})
	out := a.ok(t, "jobs", "list")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 6 {
		t.Fatalf("%d lines for 5 jobs and a header:\n%s", len(lines), out)
	}
	// The TZ column holds "TZ" and then "UTC" on every row: it must start at
	// one terminal column everywhere.
	col := -1
	for i, l := range lines {
		want := "UTC"
		if i == 0 {
			want = "TZ"
		}
		at := strings.Index(l, " "+want+" ")
		if at < 0 {
			t.Fatalf("line %d lacks %q: %q", i, want, l)
		}
		w := termColumns(l[:at+1])
		if col < 0 {
			col = w
		} else if w != col {
			t.Errorf("line %d: the TZ column starts at terminal column %d, the header's at %d:\n%s", i, w, col, out)
		}
	}
}
