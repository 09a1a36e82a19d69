package postgres

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/internal/syncbuf"
)

// TestClockSkew: a Store measures how far the database's clock stands from
// this process's, at Open and then at every check, and warns once when it
// goes beyond ClockSkewLimit and once when it comes back.
func TestClockSkew(t *testing.T) {
	var offset atomic.Int64 // this process's clock minus the real one
	offset.Store(int64(-10 * time.Second))
	var logs syncbuf.Buffer
	s := MustOpenTestWith(t, Options{
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		clock:  func() time.Time { return time.Now().Add(time.Duration(offset.Load())) },
	})
	ctx := context.Background()

	// Open checked: the local clock is 10 s behind, so the database's
	// stands 10 s ahead of it.
	skew, ok := s.ClockSkew()
	if !ok || skew < 9*time.Second || skew > 11*time.Second {
		t.Fatalf("ClockSkew with the local clock 10 s behind = %v, %v; want about 10 s", skew, ok)
	}
	if n := strings.Count(logs.String(), "postgres.clock_skew "); n != 1 || !strings.Contains(logs.String(), "level=WARN") {
		t.Fatalf("logs after Open, want one warning of the skew:\n%s", logs.String())
	}
	s.checkClock(ctx) // still off: no second warning
	if n := strings.Count(logs.String(), "postgres.clock_skew "); n != 1 {
		t.Fatalf("logs after a second check, want the one warning still:\n%s", logs.String())
	}

	// Ahead by as much: the sign turns.
	offset.Store(int64(10 * time.Second))
	s.checkClock(ctx)
	if skew, ok := s.ClockSkew(); !ok || skew > -9*time.Second || skew < -11*time.Second {
		t.Fatalf("ClockSkew with the local clock 10 s ahead = %v, %v; want about -10 s", skew, ok)
	}

	// In step again: one line says so.
	offset.Store(0)
	s.checkClock(ctx)
	if skew, ok := s.ClockSkew(); !ok || skew.Abs() > ClockSkewLimit {
		t.Fatalf("ClockSkew in step = %v, %v; want under %v", skew, ok, ClockSkewLimit)
	}
	if n := strings.Count(logs.String(), "postgres.clock_skew_resolved"); n != 1 {
		t.Fatalf("logs once in step, want one line saying so:\n%s", logs.String())
	}
	s.checkClock(ctx)
	if n := strings.Count(logs.String(), "postgres.clock_skew"); n != 2 {
		t.Fatalf("logs after a check in step, want no more lines:\n%s", logs.String())
	}

	// A read that fails leaves the skew unknown.
	failed, cancel := context.WithCancel(ctx)
	cancel()
	s.checkClock(failed)
	if _, ok := s.ClockSkew(); ok {
		t.Fatal("ClockSkew after a failed read: known")
	}
}
