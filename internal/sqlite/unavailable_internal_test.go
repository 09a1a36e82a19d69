package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

// TestFullDiskIsUnavailable: a write the database has no room for is an
// outage the caller can wait out (EUNAVAILABLE), not a fault of the write.
// The disk fills at max_page_count, set on the one write connection.
func TestFullDiskIsUnavailable(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "vibejobs.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var pages int
	if err := s.w.QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if _, err := s.w.ExecContext(ctx, fmt.Sprintf("PRAGMA max_page_count = %d", pages)); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i := 0; i < 10_000; i++ {
		err = s.Update(ctx, func(tx vibejobs.Tx) error {
			return tx.CreateProject(ctx, &vibejobs.Project{ID: vibejobs.NewID("prj_", now, nil),
				Name: fmt.Sprintf("project %d with a name long enough to fill pages soon", i), CreatedAt: now})
		})
		if err != nil {
			break
		}
	}
	if kind := vibejobs.ErrorKind(err); kind != vibejobs.EUNAVAILABLE {
		t.Fatalf("a write to a full database: kind %q (%v), want %q", kind, err, vibejobs.EUNAVAILABLE)
	}
}
