package postgres

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vibejobs/vibejobs"
)

// TestPingRefusesAReadOnlyServer: a server that takes no writes (the old
// primary, a standby now, that the pool's connections reach during a
// failover; here sessions made read-only) fails every write as
// unavailable, so Ping, which /readyz asks, must say so too, rather than
// keep traffic on a replica whose every change answers 503.
func TestPingRefusesAReadOnlyServer(t *testing.T) {
	s := MustOpenTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping on a writable server: %v", err)
	}
	// Every session of the pool now starts read-only, as on a standby.
	cfg := s.pool.Config()
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	ro, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	writablePool := s.pool
	s.pool = ro
	t.Cleanup(func() { ro.Close(); s.pool = writablePool })
	werr := s.Update(ctx, func(tx vibejobs.Tx) error {
		return tx.CreateProject(ctx, &vibejobs.Project{ID: "prj_ro", Name: "ro", CreatedAt: time.Now()})
	})
	if vibejobs.ErrorKind(werr) != vibejobs.EUNAVAILABLE {
		t.Fatalf("a write on the read-only server: %v, want unavailable", werr)
	}
	if err := s.Ping(ctx); vibejobs.ErrorKind(err) != vibejobs.EUNAVAILABLE {
		t.Errorf("Ping on a server that takes no writes: %v, want unavailable", err)
	}
}

// TestPingAsksTheQueuePool: the queue pool makes every claim and records
// every outcome, so a replica whose queue pool gets no working connection
// delivers nothing: Ping must fail then, although the main pool answers.
// Here its sessions reach a server that takes no writes (a failover's old
// primary), or it can give out no connection at all (closed).
func TestPingAsksTheQueuePool(t *testing.T) {
	s := MustOpenTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		pool func(cfg *pgxpool.Config) *pgxpool.Pool
		kind string // "" for any error
	}{
		{"read-only sessions", func(cfg *pgxpool.Config) *pgxpool.Pool {
			cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
			p, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			return p
		}, vibejobs.EUNAVAILABLE},
		{"no connection", func(cfg *pgxpool.Config) *pgxpool.Pool {
			p, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			p.Close()
			return p
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			broken := tc.pool(s.queue.Config())
			queue := s.queue
			s.queue = broken
			defer func() { s.queue = queue; broken.Close() }()
			if err := s.pool.Ping(ctx); err != nil {
				t.Fatalf("the main pool: %v", err)
			}
			err := s.Ping(ctx)
			if err == nil {
				t.Fatal("Ping with a broken queue pool: nil, want an error")
			}
			if tc.kind != "" && vibejobs.ErrorKind(err) != tc.kind {
				t.Errorf("Ping with a broken queue pool: %v, want %s", err, tc.kind)
			}
		})
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping with the queue pool back: %v", err)
	}
}

// TestReadOnlySessionsAreNotKept: a pooled connection whose server turned
// read-only (the old primary, fenced in a failover) is closed when given
// back, on both pools, so the next use dials again, to the new primary,
// instead of failing every write until the connection's lifetime ends.
func TestReadOnlySessionsAreNotKept(t *testing.T) {
	s := MustOpenTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for name, pool := range map[string]*pgxpool.Pool{"main": s.pool, "queue": s.queue} {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pid := c.Conn().PgConn().PID()
		if _, err := c.Exec(ctx, "SET default_transaction_read_only = on"); err != nil {
			t.Fatal(err)
		}
		c.Release()
		for _, idle := range pool.AcquireAllIdle(ctx) {
			if idle.Conn().PgConn().PID() == pid {
				t.Errorf("%s pool: the read-only session is still pooled", name)
			}
			idle.Release()
		}
	}
	if err := s.Update(ctx, func(tx vibejobs.Tx) error {
		return tx.CreateProject(ctx, &vibejobs.Project{ID: "prj_rw", Name: "rw", CreatedAt: time.Now()})
	}); err != nil {
		t.Fatalf("a write after the read-only session went: %v", err)
	}
	if _, _, err := s.NextDueAt(ctx); err != nil {
		t.Fatalf("a queue read after the read-only session went: %v", err)
	}
}

// TestListenerLeavesAReadOnlyServer: the listener does not LISTEN on a
// server that takes no writes: after a failover the new primary's NOTIFYs
// never reach the old one, so it connects again instead (and says then that
// any job may have changed). Here its sessions start read-only.
func TestListenerLeavesAReadOnlyServer(t *testing.T) {
	s := MustOpenTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.connConfig.RuntimeParams["default_transaction_read_only"] = "on"
	ready := false
	listening, err := s.listenOnce(ctx, make(chan struct{}, 1), make(chan string, 1), func() { ready = true })
	if !errors.Is(err, errListenReadOnly) || listening || ready {
		t.Fatalf("listening on a read-only server: listening %v, ready %v, %v; want errListenReadOnly", listening, ready, err)
	}
}

// TestListenerSaysAnyJobMayHaveChangedAfterAFailedFirstSession: a listener
// whose first session never got to listen (here it reached a server that
// takes no writes, as in a failover; a refused connection is alike) missed
// the job changes committed meanwhile, while the dispatcher, started at the
// same time, claimed: once it listens, it must say that any job may have
// changed, before the changes it hears from then on.
func TestListenerSaysAnyJobMayHaveChangedAfterAFailedFirstSession(t *testing.T) {
	s := MustOpenTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var sessions atomic.Int32
	s.connConfig.AfterConnect = func(ctx context.Context, c *pgconn.PgConn) error {
		if sessions.Add(1) > 1 {
			return nil
		}
		// The first session only: read-only, as on the fenced old primary.
		return c.Exec(ctx, "SET default_transaction_read_only = on").Close()
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	_, jobs := s.Notifications(wctx)
	for {
		if _, err := s.pool.Exec(ctx, "SELECT pg_notify($1, $2)", JobsChannel, s.jobPayload("job_x")); err != nil {
			t.Fatal(err)
		}
		select {
		case id := <-jobs:
			if sessions.Load() < 2 {
				t.Fatalf("job change %q heard on the read-only session", id)
			}
			if id != "" {
				t.Fatalf("first job change after the failed first session: %q, want \"\" (any job may have changed)", id)
			}
			return
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("the listener never listened")
		}
	}
}
