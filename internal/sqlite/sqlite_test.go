package sqlite_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/sqlite"
	"github.com/vibejobs/vibejobs/internal/storetest"
)

// mustOpen opens a fresh store in t's temporary directory, closed at the
// end of t. Its clock is storetest.T0.
func mustOpen(t testing.TB) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "vibejobs.db"), sqlite.Options{
		Logger: slog.New(slog.DiscardHandler),
		Now:    func() time.Time { return storetest.T0 },
	})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) vibejobs.Store { return mustOpen(t) })
}
