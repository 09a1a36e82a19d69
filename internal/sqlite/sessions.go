package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/vibejobs/vibejobs"
)

// CreateSession stores sess and ends the token's sessions beyond max, those
// that expire first, in one transaction.
func (s *Store) CreateSession(ctx context.Context, sess *vibejobs.DashboardSession, max int) error {
	err := s.write(ctx, func(t wtx) error {
		if max > 0 {
			if _, err := t.ExecContext(ctx, `DELETE FROM dashboard_sessions WHERE key IN (
				SELECT key FROM dashboard_sessions WHERE token_id = ?
				ORDER BY expires_at DESC, key DESC LIMIT -1 OFFSET ?)`, sess.TokenID, max-1); err != nil {
				return err
			}
		}
		_, err := t.ExecContext(ctx, `INSERT INTO dashboard_sessions (key, token_id, project_id, expires_at)
			VALUES (?, ?, ?, ?)`, sess.Key, sess.TokenID, sess.ProjectID, ms(sess.ExpiresAt))
		return err
	})
	if err != nil {
		return fmt.Errorf("creating a dashboard session: %w", err)
	}
	return nil
}

// GetSession returns the session of key live at now, or ENOTFOUND.
func (s *Store) GetSession(ctx context.Context, key []byte, now time.Time) (*vibejobs.DashboardSession, error) {
	sess := vibejobs.DashboardSession{Key: key}
	var expires int64
	err := s.reader.q.QueryRowContext(ctx, `SELECT token_id, project_id, expires_at FROM dashboard_sessions
		WHERE key = ? AND expires_at > ?`, key, ms(now)).Scan(&sess.TokenID, &sess.ProjectID, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, vibejobs.ErrNotFound("session")
	}
	if err != nil {
		return nil, fmt.Errorf("reading a dashboard session: %w", err)
	}
	sess.ExpiresAt = fromMS(expires)
	return &sess, nil
}

// DeleteSession ends the session of key, if any.
func (s *Store) DeleteSession(ctx context.Context, key []byte) error {
	err := s.write(ctx, func(t wtx) error {
		_, err := t.ExecContext(ctx, `DELETE FROM dashboard_sessions WHERE key = ?`, key)
		return err
	})
	if err != nil {
		return fmt.Errorf("deleting a dashboard session: %w", err)
	}
	return nil
}

// PruneSessions deletes up to limit sessions expired at now.
func (s *Store) PruneSessions(ctx context.Context, now time.Time, limit int) (int, error) {
	return s.pruneExpired(ctx, "dashboard_sessions", "key", now, limit)
}
