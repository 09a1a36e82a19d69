package sqlite

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

// clock is a fake clock the test moves by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func openClocked(t *testing.T) (*Store, *clock) {
	t.Helper()
	c := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "vibejobs.db"), Options{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, c
}

// refuseWrites makes the write connection refuse every change, as a file
// turned read-only does (SQLITE_READONLY), while reads go on; refuse false
// undoes it.
func refuseWrites(t *testing.T, s *Store, refuse bool) {
	t.Helper()
	v := "0"
	if refuse {
		v = "1"
	}
	if _, err := s.w.ExecContext(context.Background(), "PRAGMA query_only = "+v); err != nil {
		t.Fatal(err)
	}
}

func createProject(s *Store, id string, now time.Time) error {
	ctx := context.Background()
	return s.Update(ctx, func(tx vibejobs.Tx) error {
		return tx.CreateProject(ctx, &vibejobs.Project{ID: id, Name: id, CreatedAt: now})
	})
}

// TestPingNeedsWrites: a database that answers reads but takes no writes
// (a file turned read-only, a full disk, an I/O error) creates no run and
// records no outcome: Ping, which /readyz asks, must fail, whether a write
// just failed or the server is idle, and succeed again once writes do.
func TestPingNeedsWrites(t *testing.T) {
	ctx := context.Background()
	s, c := openClocked(t)
	if err := createProject(s, "prj_before", c.Now()); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}

	// A write fails: the commit before it no longer vouches for writes.
	refuseWrites(t, s, true)
	if err := createProject(s, "prj_refused", c.Now()); vibejobs.ErrorKind(err) != vibejobs.EUNAVAILABLE {
		t.Fatalf("a write the database refuses: %v, want unavailable", err)
	}
	if err := s.Ping(ctx); err == nil {
		t.Fatal("Ping right after a write the database could not take: nil, want an error")
	}
	if _, err := s.GetProject(ctx, "prj_before"); err != nil {
		t.Fatalf("reads go on: %v", err)
	}

	// Writes work again: Ping finds out by itself, no other write needed.
	refuseWrites(t, s, false)
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping once writes work again: %v", err)
	}

	// Idle: no write failed, but none committed lately either.
	refuseWrites(t, s, true)
	c.Add(writeProbeAfter)
	if err := s.Ping(ctx); err == nil {
		t.Fatal("Ping on an idle database that takes no writes: nil, want an error")
	}
}

// TestPingTrustsARecentCommit: Ping writes only when no write committed
// within writeProbeAfter, so a load balancer's probes every few seconds
// cost a busy server no write and no wait for the write connection, and an
// idle one a small write every writeProbeAfter.
func TestPingTrustsARecentCommit(t *testing.T) {
	// A Ping that waited for the busy write connection below fails at
	// this deadline rather than hanging the test.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, c := openClocked(t)
	t0 := c.Now()
	probedAt := func() time.Time {
		t.Helper()
		var v int64
		if err := s.r.QueryRowContext(ctx, "SELECT probed_at FROM write_probe").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return fromMS(v)
	}
	ping := func() {
		t.Helper()
		if err := s.Ping(ctx); err != nil {
			t.Fatalf("Ping: %v", err)
		}
	}
	ping() // nothing committed since Open: a probe
	if got := probedAt(); !got.Equal(t0) {
		t.Fatalf("first probe at %v, want %v", got, t0)
	}
	c.Add(writeProbeAfter / 2)
	ping() // the probe's own commit vouches
	if err := createProject(s, "prj_a", c.Now()); err != nil {
		t.Fatal(err)
	}
	c.Add(writeProbeAfter - time.Millisecond)
	// The write connection is busy: a Ping that needed it would wait.
	busy, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ping() // the project's commit vouches
	busy.Rollback()
	if got := probedAt(); !got.Equal(t0) {
		t.Fatalf("probed at %v within %v of a commit, want no probe after the first (%v)", got, writeProbeAfter, t0)
	}
	c.Add(time.Millisecond)
	ping()
	if got, want := probedAt(), c.Now(); !got.Equal(want) {
		t.Fatalf("probed at %v, want %v: the last commit is %v old", got, want, writeProbeAfter)
	}
}

// TestPingAfterTheClockWentBack: a commit is remembered by the wall clock,
// which may be set back (an NTP step, a restored VM) after it. Seen from
// the new time the commit lies ahead; it was not made within
// writeProbeAfter before now, so it proves nothing: Ping must write to find
// out, not trust it until the clock has caught up with it.
func TestPingAfterTheClockWentBack(t *testing.T) {
	ctx := context.Background()
	s, c := openClocked(t)
	if err := createProject(s, "prj_a", c.Now()); err != nil {
		t.Fatal(err)
	}
	refuseWrites(t, s, true) // no write of the Store's fails: it is idle
	c.Add(-time.Hour)
	if err := s.Ping(ctx); err == nil {
		t.Fatal("Ping on a database that takes no writes, its last commit an hour ahead of the clock: nil, want an error")
	}
	refuseWrites(t, s, false)
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping once writes work again: %v", err)
	}
}
