package postgres

import (
	"context"
	"testing"
	"time"

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
	conns := s.pool.AcquireAllIdle(ctx)
	if len(conns) == 0 {
		t.Fatal("no idle connection")
	}
	for _, c := range conns {
		if _, err := c.Exec(ctx, "SET default_transaction_read_only = on"); err != nil {
			t.Fatal(err)
		}
		c.Release()
	}
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
