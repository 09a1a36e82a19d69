// Package schemaversion refuses a database whose schema a newer build
// migrated further than this build knows: its statements could break the
// newer schema's promises (a claim of each build could send one run twice),
// and goose, asked to migrate such a database, applies nothing and says
// nothing.
package schemaversion

import (
	"context"
	"fmt"

	"github.com/pressly/goose/v3"
)

// NewerError is the error of subject (say "the database schema") found at
// version current, beyond known, the newest migration this build of builder
// (say "vibejobs") has.
func NewerError(subject string, current, known int64, builder string) error {
	return fmt.Errorf("%s is at version %d, newer than this build of %s knows (%d): "+
		"a newer build migrated it; run that version or a later one", subject, current, builder, known)
}

// Check returns known, the newest migration of p's sources, once p's
// database is no further: NewerError (builder "vibejobs") when a newer
// build migrated subject beyond it. Call it after p.Up.
func Check(ctx context.Context, p *goose.Provider, subject string) (known int64, err error) {
	current, known, err := p.GetVersions(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading the version of %s: %w", subject, err)
	}
	if current > known {
		return 0, NewerError(subject, current, known, "vibejobs")
	}
	return known, nil
}
