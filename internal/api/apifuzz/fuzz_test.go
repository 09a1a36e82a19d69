// Package apifuzz_test fuzzes the management API's decoding and validation of
// job bodies. It is a package of its own so that its test binary does not
// link the SQLite driver: coverage instrumentation of that driver makes
// fuzzing crawl. The job routes run on memStore here; their seed corpus also
// runs on the real store (api.TestJobBodiesOnRealStore).
package apifuzz_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/secretbox"
)

// FuzzDecodeJobRequest sends arbitrary bodies to POST /v1/jobs and PATCH
// /v1/jobs/{id}: the answer is never a 5xx and always a JSON object, an error
// with a code for every 4xx.
func FuzzDecodeJobRequest(f *testing.F) {
	for _, b := range readSeeds(f) {
		f.Add(b)
	}
	now := time.Date(2026, 10, 9, 8, 0, 0, 0, time.UTC)
	h, token := fuzzAPI(f, &now)
	var keys atomic.Int64
	send := func(method, path string, body []byte) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(string(body)))
		r.Header.Set("Authorization", "Bearer "+token)
		r.Header.Set("Idempotency-Key", "k"+strconv.FormatInt(keys.Add(1), 10))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	w := send("POST", "/v1/jobs", []byte(`{"name":"n","schedule":"@daily","url":"https://example.test/"}`))
	var job struct{ ID string }
	if w.Code != http.StatusCreated || json.Unmarshal(w.Body.Bytes(), &job) != nil {
		f.Fatalf("creating the job to patch: %d %s", w.Code, w.Body)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, target := range []struct{ method, path string }{{"POST", "/v1/jobs"}, {"PATCH", "/v1/jobs/" + job.ID}} {
			checkBodyAnswer(t, target.method, body, send(target.method, target.path, body))
		}
	})
}

// FuzzDecodeSubscriptionRequest sends arbitrary bodies to POST
// /v1/subscriptions and PATCH /v1/subscriptions/{id}: the answer is never a
// 5xx and always a JSON object, an error with a code for every 4xx.
func FuzzDecodeSubscriptionRequest(f *testing.F) {
	for _, s := range []string{
		`{"url":"https://hooks.example.test/e"}`,
		`{"url":"https://hooks.example.test/e","types":["run.failed","run.succeeded"]}`,
		`{"url":"https://hooks.example.test/e","jobIds":["job_1"]}`,
		`{"types":[]}`, `{"jobIds":null}`, `{"types":["run.nope"]}`, `{"url":"http://127.0.0.1/"}`,
		`{"url":"https://hooks.example.test/e","url":"https://x.example.test/"}`, `{"extra":1}`, `[]`, `null`, ``,
		`{"types":["run.failed","run.failed"]}`, `{"jobIds":["job_\u0000"]}`, "{\"url\":\"https://h.example.test/\xff\"}",
	} {
		f.Add([]byte(s))
	}
	now := time.Date(2026, 10, 9, 8, 0, 0, 0, time.UTC)
	h, token, st := fuzzAPIStore(f, &now)
	st.subs["sub_1"] = &vibejobs.Subscription{ID: "sub_1", ProjectID: "prj_1", URL: "https://hooks.example.test/e",
		CreatedAt: now, UpdatedAt: now}
	var keys atomic.Int64
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, target := range []struct{ method, path string }{{"POST", "/v1/subscriptions"}, {"PATCH", "/v1/subscriptions/sub_1"}} {
			r := httptest.NewRequest(target.method, target.path, strings.NewReader(string(body)))
			r.Header.Set("Authorization", "Bearer "+token)
			r.Header.Set("Idempotency-Key", "k"+strconv.FormatInt(keys.Add(1), 10))
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			checkBodyAnswer(t, target.method, body, w)
		}
	})
}

// checkBodyAnswer fails t unless w, the answer to method with body, is no
// 5xx and a JSON object: an error with a code for every 4xx, else 200 or
// 201.
func checkBodyAnswer(t *testing.T, method string, body []byte, w *httptest.ResponseRecorder) {
	t.Helper()
	if w.Code >= 500 {
		t.Fatalf("%s %q: %d %s", method, body, w.Code, w.Body)
	}
	var m map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
		t.Fatalf("%s %q: the answer is not a JSON object: %s", method, body, w.Body)
	}
	if w.Code >= 400 {
		if e, ok := m["error"].(map[string]any); !ok || e["code"] == "" || e["code"] == "internal" {
			t.Fatalf("%s %q: error answer %s", method, body, w.Body)
		}
	} else if w.Code != http.StatusCreated && w.Code != http.StatusOK {
		t.Fatalf("%s %q: status %d", method, body, w.Code)
	}
}

func readSeeds(t testing.TB) [][]byte {
	f, err := os.Open("../testdata/job-bodies.txt")
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
			t.Fatalf("seed %q: %v", line, err)
		}
		out = append(out, []byte(s))
	}
	return out
}

// FuzzListQuery sends arbitrary raw queries to the jobs and runs lists: the
// answer is never a 5xx and always a JSON object, an error with a code for
// every 4xx. A 200 comes only for a query that parses whole (a pair the
// parser dropped would be a cursor or filter ignored) and, when it carries
// a cursor, only for a cursor of that very list.
func FuzzListQuery(f *testing.F) {
	now := time.Date(2026, 10, 9, 8, 0, 0, 0, time.UTC)
	h, token := fuzzAPI(f, &now)
	send := func(method, path, rawQuery, key string, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.URL.RawQuery = rawQuery
		r.Header.Set("Authorization", "Bearer "+token)
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	var jobID string
	for i := range 3 {
		w := send("POST", "/v1/jobs", "", "k"+strconv.Itoa(i), `{"name":"n","schedule":"@daily","url":"https://example.test/"}`)
		var job struct{ ID string }
		if w.Code != http.StatusCreated || json.Unmarshal(w.Body.Bytes(), &job) != nil {
			f.Fatalf("creating a job: %d %s", w.Code, w.Body)
		}
		jobID = job.ID
		now = now.Add(time.Millisecond)
	}
	var page struct{ NextCursor string }
	if w := send("GET", "/v1/jobs", "limit=1", "", ""); w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &page) != nil ||
		!strings.Contains(page.NextCursor, ".") {
		f.Fatalf("first page: %d %s", w.Code, w.Body)
	}
	jobsCursor := page.NextCursor
	pos, jobsTag, _ := strings.Cut(jobsCursor, ".")
	for _, q := range []string{
		"", "limit=1", "cursor=" + jobsCursor, "limit=2&cursor=" + jobsCursor, "cursor=" + pos,
		"cursor=" + pos + "%2E" + jobsTag, "cursor=" + pos + "." + jobsTag + ".", "cursor=." + jobsTag,
		"cursor=%zz", "cursor=" + jobsCursor + "%", "cursor=" + jobsCursor + ";x", "cursor=%FF", "cursor=%00",
		"cursor=" + strings.Repeat("A", 600), "cursor=a&cursor=b", "cursor=", "state=failed&cursor=" + jobsCursor,
		"jobId=" + jobID + "&cursor=" + jobsCursor, "%zz=1", "cursor=+" + pos, "cursor=" + pos + "=",
	} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, rawQuery string) {
		for _, path := range []string{"/v1/jobs", "/v1/runs", "/v1/jobs/" + jobID + "/runs"} {
			w := send("GET", path, rawQuery, "", "")
			if w.Code >= 500 {
				t.Fatalf("GET %s?%q: %d %s", path, rawQuery, w.Code, w.Body)
			}
			var m map[string]any
			if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
				t.Fatalf("GET %s?%q: the answer is not a JSON object: %s", path, rawQuery, w.Body)
			}
			if w.Code >= 400 {
				if e, ok := m["error"].(map[string]any); !ok || e["code"] == "" || e["code"] == "internal" {
					t.Fatalf("GET %s?%q: error answer %s", path, rawQuery, w.Body)
				}
				continue
			}
			if w.Code != http.StatusOK {
				t.Fatalf("GET %s?%q: status %d", path, rawQuery, w.Code)
			}
			q, err := url.ParseQuery(rawQuery)
			if err != nil {
				t.Fatalf("GET %s?%q: 200 for a query that does not parse (%v)", path, rawQuery, err)
			}
			if c := q.Get("cursor"); c != "" {
				_, tag, bound := strings.Cut(c, ".")
				if path != "/v1/jobs" || bound && tag != jobsTag {
					t.Fatalf("GET %s?%q: 200 for a cursor of another list", path, rawQuery)
				}
			}
		}
	})
}

// fuzzAPI returns the API on an in-memory store with one admin token of
// prj_1, which it returns too, and its clock reading *now; no rate limit.
func fuzzAPI(f *testing.F, now *time.Time) (http.Handler, string) {
	f.Helper()
	h, token, _ := fuzzAPIStore(f, now)
	return h, token
}

// fuzzAPIStore is fuzzAPI, also returning its store.
func fuzzAPIStore(f *testing.F, now *time.Time) (http.Handler, string, *memStore) {
	f.Helper()
	key, err := secretbox.NewKey()
	if err != nil {
		f.Fatal(err)
	}
	ring, err := secretbox.Parse([]byte(key))
	if err != nil {
		f.Fatal(err)
	}
	token := "vjt_" + strings.Repeat("A", 43)
	sum := sha256.Sum256([]byte(token))
	st := newMemStore(&vibejobs.Token{ID: "tok_1", ProjectID: "prj_1", Role: vibejobs.RoleAdmin, Hash: sum[:]})
	return api.New(api.Config{
		Store: st, Sealer: ring, Now: func() time.Time { return *now },
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		RateLimit: api.RateLimit{PerSecond: -1},
	}).Handler(), token, st
}
