package sqlite_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/sqlite"
	"github.com/vibejobs/vibejobs/internal/storetest"
)

func openAt(t *testing.T, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), path, sqlite.Options{
		Logger: slog.New(slog.DiscardHandler),
		Now:    func() time.Time { return storetest.T0 },
	})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestOpenRejectsPathsItCannotShare(t *testing.T) {
	for _, path := range []string{"", ":memory:", "file:x.db", "x.db?mode=ro"} {
		if s, err := sqlite.Open(context.Background(), path, sqlite.Options{}); err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", path)
		}
	}
}

// TestNewDatabaseIsPrivate: a new database file, and the WAL files SQLite
// makes beside it with its mode, are readable by their owner only (0644
// before): they hold the sealed secrets and every project's history.
func TestNewDatabaseIsPrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vibejobs.db")
	openAt(t, path)
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want mode 0600", filepath.Base(p), fi.Mode().Perm(), err)
		}
	}
}

// Reopening keeps the data, migrating again is a no-op, and the database is
// in WAL mode.
func TestReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "vibejobs.db")
	s := openAt(t, path)
	p := &vibejobs.Project{ID: "prj_keep", Name: "keep", CreatedAt: storetest.T0}
	if err := s.Update(ctx, func(tx vibejobs.Tx) error { return tx.CreateProject(ctx, p) }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + "-wal"); err != nil {
		t.Errorf("no write-ahead log beside the database: %v", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s = openAt(t, path)
	if _, err := s.GetProject(ctx, p.ID); err != nil {
		t.Fatalf("project after reopening: %v", err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

// Two Stores on one file stand for two processes (a restarted server and the
// one it replaces, or the CLI beside the server): their writes wait for each
// other rather than fail, and no run is claimed twice.
func TestTwoStoresOnOneFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "vibejobs.db")
	a, b := openAt(t, path), openAt(t, path)
	now := storetest.T0
	next := now
	j := &vibejobs.Job{ID: "job_shared", ProjectID: "prj_shared", Name: "shared", Schedule: "@every 1s", Timezone: "UTC",
		URL: "https://example.test/", Enabled: true, State: vibejobs.JobActive, Retry: vibejobs.DefaultRetryPolicy(),
		Timeout: time.Second, CatchUp: vibejobs.CatchUpAll, ScheduleAnchor: now, NextRunAt: &next,
		Secret: vibejobs.SealedSecret{KeyID: "k", Ciphertext: []byte("c")}, CreatedAt: now, UpdatedAt: now}
	const n = 400
	err := a.Update(ctx, func(tx vibejobs.Tx) error {
		if err := tx.CreateProject(ctx, &vibejobs.Project{ID: "prj_shared", Name: "shared", CreatedAt: now}); err != nil {
			return err
		}
		if err := tx.CreateJob(ctx, j); err != nil {
			return err
		}
		for i := range n {
			r := vibejobs.NewRun(fmt.Sprintf("run_%04d", i), j, vibejobs.TriggerManual, now.Add(-time.Duration(i)*time.Millisecond), now)
			if err := tx.CreateRun(ctx, r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		claimed = map[string]int{}
	)
	for w, s := range []*sqlite.Store{a, b, a, b} {
		owner := fmt.Sprintf("w%d", w)
		wg.Go(func() {
			for {
				cs, err := s.ClaimDueRuns(ctx, owner, now, 9, time.Second)
				if err != nil {
					t.Errorf("ClaimDueRuns: %v", err)
					return
				}
				if len(cs) == 0 {
					return
				}
				outcomes := make([]vibejobs.Outcome, len(cs))
				mu.Lock()
				for i, c := range cs {
					claimed[c.Run.ID]++
					outcomes[i] = vibejobs.Outcome{RunID: c.Run.ID, ClaimedAt: c.ClaimedAt, Step: vibejobs.Step{State: vibejobs.RunSucceeded},
						Attempt: vibejobs.Attempt{Number: c.Run.Attempt, StartedAt: now, FinishedAt: now, StatusCode: 200}}
				}
				mu.Unlock()
				if err := s.RecordOutcomes(ctx, owner, outcomes); err != nil {
					t.Errorf("RecordOutcomes: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if len(claimed) != n {
		t.Errorf("%d runs claimed, want %d", len(claimed), n)
	}
	for id, k := range claimed {
		if k != 1 {
			t.Errorf("run %s claimed %d times", id, k)
		}
	}
	runs, _, err := b.ListRuns(ctx, "prj_shared", vibejobs.RunFilter{State: vibejobs.RunSucceeded}, vibejobs.Page{Limit: 100})
	if err != nil || len(runs) != 100 {
		t.Errorf("succeeded runs seen by the other store: %d, %v", len(runs), err)
	}
}
