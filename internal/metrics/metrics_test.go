package metrics_test

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/egress"
	"github.com/vibejobs/vibejobs/internal/metrics"
)

// scrape reads the metrics the installation administrator gets.
func scrape(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.InstallationHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

func TestSubscriptionMetrics(t *testing.T) {
	ok := time.Date(2026, 11, 30, 12, 0, 0, 500_000_000, time.UTC)
	subs := []*vibejobs.Subscription{
		{ID: "sub_a", ProjectID: "prj_1", URL: "https://secret-host.example/", LastSuccessAt: &ok},
		{ID: "sub_b", ProjectID: "prj_2", ErrorCode: "http_5xx", Attempts: 3},
	}
	var listErr error
	m := metrics.New()
	m.WatchSubscriptions(func(context.Context) ([]*vibejobs.Subscription, error) { return subs, listErr })
	out := scrape(t, m)
	for _, want := range []string{
		`vibejobs_subscription_failing{project="prj_1",subscription="sub_a"} 0`,
		`vibejobs_subscription_failing{project="prj_2",subscription="sub_b"} 1`,
		`vibejobs_subscription_last_success_timestamp_seconds{project="prj_1",subscription="sub_a"} 1.7960400005e+09`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in\n%s", want, out)
		}
	}
	if strings.Contains(out, `last_success_timestamp_seconds{project="prj_2"`) || strings.Contains(out, "secret-host") {
		t.Errorf("unexpected series:\n%s", out)
	}
	// A deleted subscription's series goes with it.
	subs = subs[:1]
	if out := scrape(t, m); strings.Contains(out, "sub_b") {
		t.Errorf("deleted subscription still reported")
	}
	// Anyone else who can reach /metrics learns of no project.
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if out := rec.Body.String(); rec.Code != 200 || !strings.Contains(out, "vibejobs_runs_due") ||
		strings.Contains(out, "prj_") || strings.Contains(out, "sub_") {
		t.Errorf("the metrics for all: %d\n%s", rec.Code, out)
	}
	// The store down: the scrape still serves every other metric.
	listErr = errors.New("database down")
	rec = httptest.NewRecorder()
	m.InstallationHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "vibejobs_runs_due") || strings.Contains(rec.Body.String(), "sub_a") {
		t.Errorf("scrape with the store down: %d\n%s", rec.Code, rec.Body)
	}
}

// TestAttemptsCountWhatTheStoreRecorded: vibejobs_attempts_total counts
// the attempts whose outcome the database committed, by the state the run
// moved to, as the store tells it (vibejobs.AttemptsRecordedNotifier), not
// the outcome the dispatcher decided when the attempt ended: an outcome
// whose lease was lost meanwhile is dropped (another replica recovered the
// run, recorded the attempt as interrupted and sent it again, and counts
// its own), and a retrying step of a deleted job's run cancels it. Counted
// as decided, a run sent once more after a lease recovery counted two
// successes across replicas.
func TestAttemptsCountWhatTheStoreRecorded(t *testing.T) {
	m := metrics.New()
	next := time.Date(2026, 11, 30, 12, 0, 30, 0, time.UTC)
	// Sent, but not (yet) recorded: measured, not counted.
	m.AttemptFinished("", vibejobs.Step{State: vibejobs.RunSucceeded}, time.Second, true, 10*time.Millisecond)
	m.AttemptFinished("http_5xx", vibejobs.Step{State: vibejobs.RunRetrying, NextAttemptAt: &next}, 0, false, 10*time.Millisecond)
	out := scrape(t, m)
	if counted := nonZero(out, "vibejobs_attempts_total{"); len(counted) > 0 {
		t.Errorf("attempts counted before the store recorded them: %q", counted)
	}
	if !strings.Contains(out, "vibejobs_delivery_duration_seconds_count 2") {
		t.Errorf("every attempt sent is measured:\n%s", out)
	}
	m.AttemptsRecorded(vibejobs.AttemptsRecorded{
		{State: vibejobs.RunSucceeded}:                        2,
		{State: vibejobs.RunCancelled, ErrorCode: "http_5xx"}: 1,
	})
	out = scrape(t, m)
	for _, want := range []string{
		`vibejobs_attempts_total{error_code="",outcome="succeeded"} 2`,
		`vibejobs_attempts_total{error_code="http_5xx",outcome="cancelled"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in\n%s", want, out)
		}
	}
	for _, line := range nonZero(out, "vibejobs_attempts_total{") {
		if strings.Contains(line, `outcome="retrying"`) {
			t.Errorf("the outcome decided is counted: %s", line)
		}
	}
}

// nonZero returns the lines of the scrape out that start with prefix and
// give a value other than 0.
func nonZero(out, prefix string) []string {
	var lines []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, prefix) && !strings.HasSuffix(line, " 0") {
			lines = append(lines, line)
		}
	}
	return lines
}

// TestKnownSeriesStartAtZero: every series of the labelled counters whose
// labels are known in advance is there from the start, at 0. They
// appeared at their first increment, which rate() and increase() cannot
// see: an alert on the first run failed, or the first attempt blocked,
// after a start never fired. No series holds a label value beyond the
// documented states, reasons and error codes.
func TestKnownSeriesStartAtZero(t *testing.T) {
	out := scrape(t, metrics.New())
	want := []string{
		`vibejobs_runs_created_total{trigger="schedule"} 0`,
		`vibejobs_runs_created_total{trigger="manual"} 0`,
		`vibejobs_runs_finished_total{reason="",state="succeeded"} 0`,
		`vibejobs_runs_finished_total{reason="app_rejected",state="failed"} 0`,
		`vibejobs_runs_finished_total{reason="attempts_exhausted",state="failed"} 0`,
		`vibejobs_runs_finished_total{reason="deadline_exceeded",state="failed"} 0`,
		`vibejobs_runs_finished_total{reason="job_deleted",state="cancelled"} 0`,
		`vibejobs_attempts_total{error_code="",outcome="succeeded"} 0`,
	}
	for _, code := range []string{egress.CodeBlocked, egress.CodeDNS, egress.CodeTimeout, egress.CodeNetwork,
		egress.CodeTLS, egress.CodeRedirect, egress.CodeHTTP4xx, egress.CodeHTTP5xx} {
		for _, outcome := range []string{"retrying", "failed", "cancelled"} {
			want = append(want, `vibejobs_attempts_total{error_code="`+code+`",outcome="`+outcome+`"} 0`)
		}
	}
	for _, w := range want {
		if !strings.Contains(out, "\n"+w+"\n") {
			t.Errorf("no %s in a fresh scrape", w)
		}
	}
	for _, prefix := range []string{"vibejobs_runs_created_total{", "vibejobs_runs_finished_total{", "vibejobs_attempts_total{"} {
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, prefix) && !slices.Contains(want, line) {
				t.Errorf("unexpected series %s", line)
			}
		}
	}
}

// TestUnplannableUnknown: vibejobs_unplannable_jobs is absent while the
// scheduler's scans fail, not the count of the last one that succeeded.
func TestUnplannableUnknown(t *testing.T) {
	m := metrics.New()
	if out := scrape(t, m); !strings.Contains(out, "\nvibejobs_unplannable_jobs 0\n") {
		t.Fatalf("before the first scan: no vibejobs_unplannable_jobs 0 in\n%s", out)
	}
	m.Unplannable(3)
	if out := scrape(t, m); !strings.Contains(out, "\nvibejobs_unplannable_jobs 3\n") {
		t.Fatalf("after a scan: no vibejobs_unplannable_jobs 3 in\n%s", out)
	}
	m.UnplannableUnknown()
	if out := scrape(t, m); strings.Contains(out, "vibejobs_unplannable_jobs") || !strings.Contains(out, "vibejobs_runs_due") {
		t.Fatalf("after a failed scan: want vibejobs_unplannable_jobs absent, the rest present, in\n%s", out)
	}
	m.Unplannable(1)
	if out := scrape(t, m); !strings.Contains(out, "\nvibejobs_unplannable_jobs 1\n") {
		t.Fatalf("after a scan that succeeded again: no vibejobs_unplannable_jobs 1 in\n%s", out)
	}
}

// TestLoopFailing: each loop's gauge is 0 while its last pass succeeded,
// and otherwise how long its passes have failed, by the clock given.
func TestLoopFailing(t *testing.T) {
	m := metrics.New()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var since time.Time
	m.WatchLoops(func() time.Time { return now },
		metrics.Loop{Name: "scheduler", FailingSince: func() time.Time { return time.Time{} }},
		metrics.Loop{Name: "maintenance", FailingSince: func() time.Time { return since }})
	for _, tc := range []struct {
		since time.Time
		want  string
	}{
		{time.Time{}, `vibejobs_loop_failing_seconds{loop="maintenance"} 0`},
		{now.Add(-90 * time.Second), `vibejobs_loop_failing_seconds{loop="maintenance"} 90`},
		{time.Time{}, `vibejobs_loop_failing_seconds{loop="maintenance"} 0`},
	} {
		since = tc.since
		out := scrape(t, m)
		if !strings.Contains(out, tc.want+"\n") || !strings.Contains(out, `vibejobs_loop_failing_seconds{loop="scheduler"} 0`+"\n") {
			t.Errorf("failing since %v: no %q (and the scheduler at 0) in\n%s", tc.since, tc.want, out)
		}
	}
}

// TestClockSkew: the gauge gives the skew the store measured, and is
// absent while it is unknown.
func TestClockSkew(t *testing.T) {
	m := metrics.New()
	skew, known := -1500*time.Millisecond, true
	m.WatchClockSkew(func() (time.Duration, bool) { return skew, known })
	if out := scrape(t, m); !strings.Contains(out, "\nvibejobs_database_clock_skew_seconds -1.5\n") {
		t.Fatalf("a skew of -1.5 s: no vibejobs_database_clock_skew_seconds -1.5 in\n%s", out)
	}
	known = false
	if out := scrape(t, m); strings.Contains(out, "vibejobs_database_clock_skew_seconds") || !strings.Contains(out, "vibejobs_runs_due") {
		t.Fatalf("skew unknown: want the gauge absent, the rest present, in\n%s", out)
	}
}

// lowestBucket returns the upper bound (the le label) of the lowest bucket
// of the histogram name that counts an observation in the scrape out of a
// histogram holding one: "+Inf" when no finite bucket does.
func lowestBucket(t *testing.T, out, name string) string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		rest, ok := strings.CutPrefix(line, name+`_bucket{le="`)
		if !ok {
			continue
		}
		le, count, _ := strings.Cut(rest, `"} `)
		if count == "1" {
			return le
		}
	}
	t.Fatalf("no bucket of %s counts the observation in\n%s", name, out)
	return ""
}

// TestLatenessBucketsReachTheDeliveryLifetime: a first attempt may start
// up to 96 h (the delivery lifetime) after its scheduledFor, as after an
// outage, and the lateness histogram tells minutes, hours and days apart
// up to there, within its finite buckets; the fine buckets stay for the
// lateness of a platform that keeps up. A top bucket at 600 s put 11
// minutes late and 3 days late in +Inf together.
func TestLatenessBucketsReachTheDeliveryLifetime(t *testing.T) {
	first := func(late time.Duration) string {
		m := metrics.New()
		m.AttemptFinished("", vibejobs.Step{State: vibejobs.RunSucceeded}, late, true, 10*time.Millisecond)
		return lowestBucket(t, scrape(t, m), "vibejobs_first_attempt_lateness_seconds")
	}
	seen := map[string]time.Duration{}
	for _, late := range []time.Duration{
		3 * time.Millisecond, 11 * time.Minute, 2 * time.Hour, 50 * time.Hour, 75 * time.Hour,
	} {
		le := first(late)
		if le == "+Inf" {
			t.Errorf("lateness %v: only in +Inf", late)
			continue
		}
		if other, ok := seen[le]; ok {
			t.Errorf("lateness %v and %v: both first in the bucket le=%s", other, late, le)
		}
		seen[le] = late
	}
	if le := first(3 * time.Millisecond); le != "0.005" {
		t.Errorf("lateness 3ms: first in le=%s, want the fine bucket 0.005", le)
	}
	if le := first(vibejobs.DeliveryLifetime); le == "+Inf" {
		t.Errorf("lateness of the whole delivery lifetime: only in +Inf")
	}
}
