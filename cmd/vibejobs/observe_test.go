package main

import (
	"cmp"
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/internal/syncbuf"
)

// TestDeliveriesMeasuredAndLoggedSafelyOnBothStores: on SQLite and on
// PostgreSQL, a manual run the app accepts and one it refuses (401) are
// counted in the metrics the README lists, by trigger, state, reason,
// outcome and error code; and the JSON log of the server, at debug level,
// holds no target URL, no part of its query, no response body, no secret,
// no token and not the database's password, while it logs the failed
// attempt and the failing webhook (the paths where a URL or a body could
// slip in).
func TestDeliveriesMeasuredAndLoggedSafelyOnBothStores(t *testing.T) {
	const (
		queryCanary = "QUERYCANARY"
		bodyCanary  = "BODYCANARY"
	)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			w.WriteHeader(200)
		case "/no":
			w.WriteHeader(401)
		default:
			w.WriteHeader(500)
		}
		w.Write([]byte(bodyCanary))
	}))
	defer app.Close()
	for _, store := range []string{"sqlite", "postgres"} {
		t.Run(store, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			cfg.LogFormat, cfg.LogLevel = "json", "debug"
			password := ""
			if store == "postgres" {
				database, _ := pgReplicaURL(t, "")
				u, err := url.Parse(database)
				if err != nil {
					t.Fatal(err)
				}
				// A password the log must never hold: the test server's,
				// or one it ignores (trust authentication).
				var ok bool
				if u.User != nil {
					password, ok = u.User.Password()
				}
				if !ok {
					password = "PASSWORDCANARY"
					u.User = url.UserPassword(cmp.Or(u.User.Username(), "postgres"), password)
				}
				cfg.Database = u.String()
			}
			logs := &syncbuf.Buffer{}
			m := NewMain(&syncbuf.Buffer{}, logs)
			m.Config = cfg
			if err := m.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			api := apiClient{t: t, base: "http://" + m.Addr(), token: m.AdminToken}
			secrets := []string{m.AdminToken}
			runOf := func(path string) string {
				code, job := api.do("POST", "/v1/jobs", map[string]any{"name": path, "schedule": "0 0 1 1 *",
					"url": app.URL + path + "?token=" + queryCanary})
				if code != 201 {
					t.Fatalf("create: %d %v", code, job)
				}
				secrets = append(secrets, job["secret"].(string))
				code, run := api.do("POST", "/v1/jobs/"+job["id"].(string)+"/runs", nil)
				if code != 202 {
					t.Fatalf("trigger: %d %v", code, run)
				}
				return run["id"].(string)
			}
			code, sub := api.do("POST", "/v1/subscriptions", map[string]any{"url": app.URL + "/hook?token=" + queryCanary})
			if code != 201 {
				t.Fatalf("subscription: %d %v", code, sub)
			}
			secrets = append(secrets, sub["secret"].(string))
			waitRunState(t, api, runOf("/ok"), "succeeded")
			waitRunState(t, api, runOf("/no"), "failed")

			is := func(want float64) func(float64) bool { return func(v float64) bool { return v == want } }
			for series, want := range map[string]float64{
				`vibejobs_runs_created_total{trigger="manual"}`:                      2,
				`vibejobs_runs_finished_total{reason="",state="succeeded"}`:          1,
				`vibejobs_runs_finished_total{reason="app_rejected",state="failed"}`: 1,
				`vibejobs_attempts_total{error_code="",outcome="succeeded"}`:         1,
				`vibejobs_attempts_total{error_code="http_4xx",outcome="failed"}`:    1,
				`vibejobs_delivery_duration_seconds_count`:                           2,
				`vibejobs_first_attempt_lateness_seconds_count`:                      2,
				`vibejobs_leases_recovered_total`:                                    0,
				`vibejobs_runs_due`:                                                  0,
			} {
				waitMetric(t, api.base, series, is(want), 15*time.Second)
			}
			// The database's clock, against the process's on the same host:
			// PostgreSQL only, and in step.
			if store == "postgres" {
				waitMetric(t, api.base, "vibejobs_database_clock_skew_seconds",
					func(v float64) bool { return math.Abs(v) < 1 }, 15*time.Second)
			} else if strings.Contains(get(t, api.base+"/metrics", ""), "vibejobs_database_clock_skew_seconds") {
				t.Fatal("a clock skew on SQLite, whose clock is the process's own")
			}
			// The webhook failed at least once (its step is recorded, then
			// logged): Close waits for the log.
			for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if _, got := api.do("GET", "/v1/subscriptions/"+sub["id"].(string), nil); got["failing"] == true {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the webhook never failed")
				}
			}
			m.Close()

			text := logs.String()
			for _, want := range []string{`"msg":"run.attempt_failed"`, `"msg":"subscription.step_failed"`, `"msg":"api request"`} {
				if !strings.Contains(text, want) {
					t.Fatalf("no %s in the log: the scan would prove nothing", want)
				}
			}
			needles := append(secrets, strings.TrimPrefix(app.URL, "http://"), queryCanary, bodyCanary)
			if password != "" {
				needles = append(needles, password)
			}
			for _, s := range needles {
				if strings.Contains(text, s) {
					t.Errorf("the log holds %.12q…", s)
				}
			}
		})
	}
}
