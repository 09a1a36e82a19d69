package maintenance_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/maintenance"
	"github.com/vibejobs/vibejobs/internal/metrics"
	"github.com/vibejobs/vibejobs/internal/sqlite"
)

// statsStore answers QueueStats with stats, or err when set.
type statsStore struct {
	vibejobs.Store
	stats vibejobs.QueueStats
	err   error
}

func (s *statsStore) QueueStats(ctx context.Context, now time.Time) (vibejobs.QueueStats, error) {
	return s.stats, s.err
}

// TestQueueGaugesGoWhenTheDatabaseDoesNotAnswer: the queue gauges report
// what the database last said only while it answers; once a read fails they
// are absent (as the subscription metrics are) rather than frozen at the
// last value: a backlog growing through a database outage, or on a replica
// cut off from it, must not read as the short queue seen before.
func TestQueueGaugesGoWhenTheDatabaseDoesNotAnswer(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := &statsStore{Store: st, stats: vibejobs.QueueStats{Due: 3, OldestDueAge: 42 * time.Second}}
	met := metrics.New()
	m := maintenance.New(maintenance.Config{Store: s, Observer: met, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	scrape := func() string {
		rec := httptest.NewRecorder()
		met.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	m.StatsOnce(ctx)
	out := scrape()
	for _, want := range []string{"vibejobs_runs_due 3", "vibejobs_oldest_due_run_age_seconds 42"} {
		if !strings.Contains(out, want) {
			t.Fatalf("database answering: no %q in\n%s", want, out)
		}
	}
	s.err = errors.New("database unavailable")
	m.StatsOnce(ctx)
	out = scrape()
	for _, stale := range []string{"vibejobs_runs_due ", "vibejobs_oldest_due_run_age_seconds "} {
		if strings.Contains(out, stale) {
			t.Errorf("database not answering: still reports %q", line(out, stale))
		}
	}
	s.err, s.stats = nil, vibejobs.QueueStats{}
	m.StatsOnce(ctx)
	if out := scrape(); !strings.Contains(out, "vibejobs_runs_due 0") || !strings.Contains(out, "vibejobs_oldest_due_run_age_seconds 0") {
		t.Errorf("database answering again: gauges not back:\n%s", out)
	}
}

// line returns the line of text that starts with prefix.
func line(text, prefix string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// recoveryStore fails lease recovery (and Ping) or the deadline check
// while the matching error is set, and keeps the times lease recovery was
// called with.
type recoveryStore struct {
	vibejobs.Store
	recoverErr, expireErr error
	recovered             []time.Time
}

func (s *recoveryStore) RecoverExpiredLeases(ctx context.Context, now time.Time, limit int) (int, error) {
	s.recovered = append(s.recovered, now)
	return 0, s.recoverErr
}

func (s *recoveryStore) Ping(ctx context.Context) error { return s.recoverErr }

func (s *recoveryStore) FailExpiredRuns(ctx context.Context, now time.Time, limit int) (int, error) {
	return 0, s.expireErr
}

// newRecoveryMaintainer returns a recoveryStore and a Maintainer of it
// whose clock reads *now.
func newRecoveryMaintainer(now *time.Time) (*recoveryStore, *maintenance.Maintainer) {
	s := &recoveryStore{}
	return s, maintenance.New(maintenance.Config{Store: s, Now: func() time.Time { return *now },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

// TestFailingSince: maintenance reports when lease recovery or the
// deadline check began to fail, the earlier of the two, until each
// succeeds again; a pass cut short by shutdown counts as neither.
func TestFailingSince(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	s, m := newRecoveryMaintainer(&now)
	step := func(d time.Duration) { now = now.Add(d) }
	want := func(what string, at time.Time) {
		t.Helper()
		if got := m.FailingSince(); !got.Equal(at) {
			t.Errorf("%s: failing since %v, want %v", what, got, at)
		}
	}
	m.RecoverOnce(ctx)
	m.ExpireOnce(ctx)
	want("both succeed", time.Time{})

	s.recoverErr = errors.New("database unavailable")
	t1 := now
	m.RecoverOnce(ctx)
	step(time.Second)
	m.RecoverOnce(ctx)
	want("recovery fails", t1)
	s.expireErr = errors.New("database unavailable")
	m.ExpireOnce(ctx)
	step(time.Second)
	want("both fail", t1)
	s.recoverErr = nil
	m.RecoverOnce(ctx)
	want("recovery succeeds again, the deadline check still fails", t1.Add(time.Second))
	s.expireErr = nil
	m.ExpireOnce(ctx)
	want("both succeed again", time.Time{})

	s.recoverErr = errors.New("database unavailable")
	step(maintenance.DefaultOutageGrace) // recovery resumed
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	m.RecoverOnce(canceled)
	want("a pass cut short by shutdown", time.Time{})
}

// TestRecoveryWaitsOutAnOutage: once lease recovery found the database
// unreachable, it recovers nothing until OutageGrace after the database
// answers again (its passes meanwhile only ping it): the leases that ended
// while it was gone are mostly those of live replicas, whose attempts were
// answered during the outage and whose outcomes wait to be recorded.
// Recovered by the first pass that reached the database, their runs were
// sent a second time although no process had crashed.
func TestRecoveryWaitsOutAnOutage(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	s, m := newRecoveryMaintainer(&now)
	pass := func(what string, want ...time.Time) {
		t.Helper()
		s.recovered = nil
		m.RecoverOnce(ctx)
		if len(s.recovered) != len(want) || len(want) == 1 && !s.recovered[0].Equal(want[0]) {
			t.Errorf("%s: recovery called at %v, want %v", what, s.recovered, want)
		}
		now = now.Add(time.Second)
	}
	pass("database up", now)
	// Refused, not unreachable: the owners were not cut off.
	s.recoverErr = errors.New("deadlock detected")
	pass("a pass refused", now)
	s.recoverErr = nil
	pass("the next pass", now)
	s.recoverErr = vibejobs.Errorf(vibejobs.EUNAVAILABLE, "database_unavailable", "database unavailable")
	pass("the outage begins", now)
	pass("database still gone")
	s.recoverErr = nil
	back := now
	pass("database back")
	if !m.FailingSince().IsZero() {
		t.Errorf("failing since %v once the database answered again", m.FailingSince())
	}
	for now.Before(back.Add(maintenance.DefaultOutageGrace)) {
		pass("within the grace")
	}
	pass("the grace over", now)
	pass("as usual", now)
}
