package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vibejobs/vibejobs"
)

// CreateSession stores sess and ends the token's sessions beyond max, those
// that expire first. The statement does not see its own insert, so it keeps
// max − 1 of the others; two logins of one token at the same instant may
// leave one session over the bound until the next login.
func (s *Store) CreateSession(ctx context.Context, sess *vibejobs.DashboardSession, max int) error {
	_, err := s.pool.Exec(ctx, `WITH ins AS (
		INSERT INTO dashboard_sessions (key, token_id, project_id, expires_at) VALUES ($1, $2, $3, $4)
	)
	DELETE FROM dashboard_sessions WHERE $5 > 0 AND key IN (
		SELECT key FROM dashboard_sessions WHERE token_id = $2
		ORDER BY expires_at DESC, key DESC
		OFFSET greatest($5 - 1, 0))`,
		sess.Key, sess.TokenID, sess.ProjectID, sess.ExpiresAt, max)
	return mapError(err, "creating a dashboard session")
}

// GetSession returns the session of key live at now, or ENOTFOUND.
func (s *Store) GetSession(ctx context.Context, key []byte, now time.Time) (*vibejobs.DashboardSession, error) {
	sess := vibejobs.DashboardSession{Key: key}
	err := s.pool.QueryRow(ctx, `SELECT token_id, project_id, expires_at FROM dashboard_sessions
		WHERE key = $1 AND expires_at > $2`, key, now).Scan(&sess.TokenID, &sess.ProjectID, &sess.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, vibejobs.ErrNotFound("session")
	}
	if err != nil {
		return nil, mapError(err, "reading a dashboard session")
	}
	return &sess, nil
}

// DeleteSession ends the session of key, if any.
func (s *Store) DeleteSession(ctx context.Context, key []byte) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM dashboard_sessions WHERE key = $1`, key)
	return mapError(err, "deleting a dashboard session")
}

// PruneSessions deletes up to limit sessions expired at now.
func (s *Store) PruneSessions(ctx context.Context, now time.Time, limit int) (int, error) {
	return s.pruneExpired(ctx, "dashboard_sessions", now, limit)
}
