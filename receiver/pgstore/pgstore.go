// Package pgstore is the PostgreSQL store of the receiver SDK: the contract's
// accepted_runs and job_outbox tables, with lease columns added to job_outbox,
// through a pgx connection pool. Every transaction runs on one connection, every
// value is a bound parameter, and an acceptance answers only after COMMIT.
//
// Several processes may share one database: acceptance is serialized by the
// run_id primary key and claims use FOR UPDATE SKIP LOCKED. Every statement
// that writes runs READ COMMITTED whatever the database's (or role's, or
// pool's) default_transaction_isolation: under REPEATABLE READ or SERIALIZABLE
// a statement that meets a row changed by a transaction committed since it
// began fails with a serialization error (SQLSTATE 40001) where READ COMMITTED
// re-reads the row, and the store's statements are written for the latter.
package pgstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/pgurl"
	"github.com/vibejobs/vibejobs/internal/schemaversion"
	"github.com/vibejobs/vibejobs/receiver"
	"github.com/vibejobs/vibejobs/receiver/internal/lease"
)

// Store implements receiver.Store, receiver.Outbox and receiver.RetentionStore.
// It uses the tables found through the pool's search_path.
type Store struct {
	pool  *pgxpool.Pool
	owned bool
}

var (
	_ receiver.Store          = (*Store)(nil)
	_ receiver.Outbox         = (*Store)(nil)
	_ receiver.RetentionStore = (*Store)(nil)
)

// New returns a Store on pool. The caller keeps ownership of pool, which may
// have any default isolation: the Store begins its own transactions at READ
// COMMITTED and changes no session setting of pool's connections. The pool
// may use any pgx query exec mode, including "exec" and "simple_protocol".
// A Store without a pool (New(nil), a zero or nil Store) answers every call
// with an error.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// errNoPool answers the calls of a Store that has no pool.
var errNoPool = errors.New("no pool: make the Store with New(pool) or Open")

// poolOf returns s's pool, or errNoPool.
func (s *Store) poolOf() (*pgxpool.Pool, error) {
	if s == nil || s.pool == nil {
		return nil, errNoPool
	}
	return s.pool, nil
}

// Open connects a pool to the PostgreSQL URL (or keyword/value DSN) and
// returns a Store that owns it; Close closes it. Open does not migrate. A
// url that does not parse, or whose host name holds an @, is refused with
// an error that quotes none of it, so it may be logged.
func Open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgurl.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: connecting: %w", err)
	}
	return &Store{pool: pool, owned: true}, nil
}

// Pool returns the store's pool, nil for a Store without one.
func (s *Store) Pool() *pgxpool.Pool {
	if s == nil {
		return nil
	}
	return s.pool
}

// Close closes the pool if Open created it.
func (s *Store) Close() {
	if s != nil && s.owned {
		s.pool.Close()
	}
}

// migrations are applied in order, each once per schema; their index+1 is the
// version recorded in receiver_migrations. Never edit one: append.
var migrations = []string{
	// 1: the tables of the contract's durable acceptance example, as apps may
	// already have created them from it.
	`CREATE TABLE IF NOT EXISTS accepted_runs (
		run_id text PRIMARY KEY,
		accepted_at timestamptz NOT NULL DEFAULT now(),
		processed_at timestamptz,
		response_status integer NOT NULL CHECK (response_status BETWEEN 200 AND 299),
		response_body jsonb NOT NULL
	);
	CREATE TABLE IF NOT EXISTS job_outbox (
		run_id text PRIMARY KEY REFERENCES accepted_runs(run_id),
		payload jsonb NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now(),
		processed_at timestamptz
	)`,
	// 2: leases, retries and the indexes of the worker and of retention.
	`ALTER TABLE job_outbox
		ADD COLUMN IF NOT EXISTS locked_by text,
		ADD COLUMN IF NOT EXISTS locked_until timestamptz,
		ADD COLUMN IF NOT EXISTS attempts integer NOT NULL DEFAULT 0,
		ADD COLUMN IF NOT EXISTS next_attempt_at timestamptz,
		ADD COLUMN IF NOT EXISTS last_error text;
	CREATE INDEX IF NOT EXISTS job_outbox_pending ON job_outbox (created_at) WHERE processed_at IS NULL;
	CREATE INDEX IF NOT EXISTS job_outbox_processed ON job_outbox (processed_at) WHERE processed_at IS NOT NULL;
	CREATE INDEX IF NOT EXISTS accepted_runs_processed ON accepted_runs (processed_at) WHERE processed_at IS NOT NULL`,
}

// Migrate creates or upgrades the store's tables in the current schema. It is
// safe to call from several processes at once: a transaction-scoped advisory
// lock per schema serializes them. The transaction is READ COMMITTED so that
// the one that waited for the lock reads the versions the other recorded; a
// REPEATABLE READ or SERIALIZABLE snapshot, taken before the wait, would not.
// Tables that a newer build of the SDK migrated further are refused with an
// error.
func (s *Store) Migrate(ctx context.Context) error {
	pool, err := s.poolOf()
	if err != nil {
		return fmt.Errorf("pgstore: migrating: %w", err)
	}
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('vibejobs.receiver.migrate.' || current_schema()))`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS receiver_migrations (
			version integer PRIMARY KEY,
			applied_at timestamptz NOT NULL DEFAULT now()
		)`); err != nil {
			return err
		}
		var have int
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM receiver_migrations`).Scan(&have); err != nil {
			return err
		}
		if have > len(migrations) {
			return schemaversion.NewerError("the receiver schema", int64(have), int64(len(migrations)), "the SDK")
		}
		for i := have; i < len(migrations); i++ {
			if _, err := tx.Exec(ctx, migrations[i]); err != nil {
				return fmt.Errorf("migration %d: %w", i+1, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO receiver_migrations (version) VALUES ($1)`, i+1); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("pgstore: migrating: %w", err)
	}
	return nil
}

// The acceptance statements of the contract. The SELECT is a separate
// statement so that, under READ COMMITTED, it sees the receipt of a concurrent
// transaction that won the insert.
const (
	acceptInsertSQL = `WITH accepted AS (
		INSERT INTO accepted_runs (run_id, response_status, response_body)
		VALUES ($1, 202, '{"accepted":true}'::jsonb)
		ON CONFLICT (run_id) DO NOTHING
		RETURNING run_id
	)
	INSERT INTO job_outbox (run_id, payload)
	SELECT run_id, $2::jsonb FROM accepted`
	acceptSelectSQL = `SELECT response_status, response_body FROM accepted_runs WHERE run_id = $1`
)

// Accept implements receiver.Store. The insert and the select are one READ
// COMMITTED transaction sent in one round trip (see readCommitted); the
// response is returned only once the server has confirmed the COMMIT. READ
// COMMITTED matters here beyond the package's rule: a repeat that waited for a
// concurrent winner's receipt must read it, not fail, or the platform would
// get an error for a run already accepted. On any error no response is
// returned. A runID that is not a contract run id is refused before the
// database is asked.
func (s *Store) Accept(ctx context.Context, runID string, payload []byte) (status int, body []byte, err error) {
	if !contract.ValidID(runID, "run_") {
		return 0, nil, fmt.Errorf("pgstore: accepting run: %w", receiver.ErrInvalidRunID)
	}
	err = s.readCommitted(ctx, func(b *pgx.Batch) {
		// A string, not the []byte: without a described statement (the
		// "exec" and "simple_protocol" modes a pooler may require) pgx
		// encodes an argument by its Go type alone, and a []byte goes out
		// in bytea's hex form (\x7b22…), which is not JSON: every delivery
		// would be answered 503. A string is the JSON text in every mode.
		b.Queue(acceptInsertSQL, runID, string(payload))
		b.Queue(acceptSelectSQL, runID)
	}, func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		return br.QueryRow().Scan(&status, &body)
	})
	if err != nil {
		return 0, nil, fmt.Errorf("pgstore: accepting run: %w", err)
	}
	var compact bytes.Buffer
	// jsonb prints {"accepted": true}; every answer is compacted the same way.
	if err := json.Compact(&compact, body); err != nil {
		return 0, nil, fmt.Errorf("pgstore: stored response body: %w", err)
	}
	return status, compact.Bytes(), nil
}

// readCommitted runs the statements that queue adds to a batch as one READ
// COMMITTED transaction on one connection, and reads their results with read.
// BEGIN, the statements and COMMIT go to the server in one round trip (a
// pipeline), so the explicit isolation costs no round trip over a bare
// statement. It returns nil only once the server has confirmed the COMMIT. A
// statement the server refuses rolls the transaction back (explicitly when
// the connection is still usable; by the server when it is not). Another
// error may come after the transaction committed: read's own (a result that
// does not scan), since the COMMIT went with the statements, or a connection
// lost before the COMMIT's answer came back.
func (s *Store) readCommitted(ctx context.Context, queue func(*pgx.Batch), read func(pgx.BatchResults) error) error {
	pool, err := s.poolOf()
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// A connection released inside a transaction is destroyed by the pool.
	defer conn.Release()

	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	queue(b)
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	err = readTx(br, read)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if tx := br.Tx(); tx != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = tx.Rollback(rctx) // ErrTxClosed when the server already ended it
			cancel()
		}
		return err
	}
	return nil
}

// readTx reads the results of a batch queued by readCommitted: BEGIN, the
// statements' (with read), then COMMIT's.
func readTx(br pgx.BatchResults, read func(pgx.BatchResults) error) error {
	if _, err := br.Exec(); err != nil { // BEGIN
		return err
	}
	if err := read(br); err != nil {
		return err
	}
	tag, err := br.Exec()
	if err != nil {
		return err
	}
	if tag.String() != "COMMIT" {
		return errors.New("transaction did not commit")
	}
	return nil
}

// execReadCommitted executes one statement as a READ COMMITTED transaction
// (see readCommitted) and returns its command tag.
func (s *Store) execReadCommitted(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	var tag pgconn.CommandTag
	err := s.readCommitted(ctx, func(b *pgx.Batch) { b.Queue(sql, args...) }, func(br pgx.BatchResults) error {
		var err error
		tag, err = br.Exec()
		return err
	})
	return tag, err
}

// ClaimOutbox implements receiver.Outbox. Rows locked by a concurrent claim are
// skipped, so workers never wait for each other; rows a concurrent claim took
// after this one began are re-read and skipped, never an error.
func (s *Store) ClaimOutbox(ctx context.Context, worker string, now, leaseUntil time.Time, limit int) ([]receiver.OutboxItem, error) {
	if err := receiver.CheckClaim(worker, now, leaseUntil, limit); err != nil {
		return nil, fmt.Errorf("pgstore: claiming outbox items: %w", err)
	}
	var items []receiver.OutboxItem
	err := s.readCommitted(ctx, func(b *pgx.Batch) {
		b.Queue(`UPDATE job_outbox AS o
		SET locked_by = $1, locked_until = $3, attempts = o.attempts + 1
		FROM (
			SELECT run_id FROM job_outbox
			WHERE processed_at IS NULL
				AND (next_attempt_at IS NULL OR next_attempt_at <= $2)
				AND (locked_until IS NULL OR locked_until <= $2)
			ORDER BY created_at, run_id
			LIMIT $4
			FOR UPDATE SKIP LOCKED
		) AS due
		WHERE o.run_id = due.run_id
		RETURNING o.run_id, o.payload, o.attempts`, worker, now, lease.Until(leaseUntil, time.Microsecond), limit)
	}, func(br pgx.BatchResults) error {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		items, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (receiver.OutboxItem, error) {
			var it receiver.OutboxItem
			err := row.Scan(&it.RunID, &it.Payload, &it.Attempt)
			return it, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: claiming outbox items: %w", err)
	}
	return items, nil
}

// CompleteOutbox implements receiver.Outbox; one statement updates both tables.
func (s *Store) CompleteOutbox(ctx context.Context, runID string, at time.Time) error {
	_, err := s.execReadCommitted(ctx, `WITH done AS (
			UPDATE job_outbox
			SET processed_at = $2, locked_by = NULL, locked_until = NULL, last_error = NULL
			WHERE run_id = $1 AND processed_at IS NULL
			RETURNING run_id
		)
		UPDATE accepted_runs SET processed_at = $2
		WHERE run_id IN (SELECT run_id FROM done)`, runID, at)
	if err != nil {
		return fmt.Errorf("pgstore: completing outbox item: %w", err)
	}
	return nil
}

// FailOutbox implements receiver.Outbox.
func (s *Store) FailOutbox(ctx context.Context, runID, worker string, retryAt time.Time, reason string) error {
	_, err := s.execReadCommitted(ctx, `UPDATE job_outbox
		SET locked_by = NULL, locked_until = NULL, next_attempt_at = $3, last_error = $4
		WHERE run_id = $1 AND locked_by = $2 AND processed_at IS NULL`, runID, worker,
		lease.Until(retryAt, time.Microsecond), reason)
	if err != nil {
		return fmt.Errorf("pgstore: recording outbox failure: %w", err)
	}
	return nil
}

// ReleaseOutbox implements receiver.Outbox.
func (s *Store) ReleaseOutbox(ctx context.Context, runID, worker string) error {
	_, err := s.execReadCommitted(ctx, `UPDATE job_outbox
		SET locked_by = NULL, locked_until = NULL, attempts = greatest(attempts - 1, 0)
		WHERE run_id = $1 AND locked_by = $2 AND processed_at IS NULL`, runID, worker)
	if err != nil {
		return fmt.Errorf("pgstore: giving back outbox item: %w", err)
	}
	return nil
}

// DeleteProcessedOutbox implements receiver.RetentionStore.
func (s *Store) DeleteProcessedOutbox(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit < 1 {
		return 0, fmt.Errorf("pgstore: deleting processed outbox items: limit %d is not positive", limit)
	}
	tag, err := s.execReadCommitted(ctx, `DELETE FROM job_outbox WHERE run_id IN (
		SELECT run_id FROM job_outbox
		WHERE processed_at < $1
		ORDER BY processed_at
		LIMIT $2
		FOR UPDATE SKIP LOCKED)`, before, limit)
	if err != nil {
		return 0, fmt.Errorf("pgstore: deleting processed outbox items: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// DeleteProcessedRuns implements receiver.RetentionStore.
func (s *Store) DeleteProcessedRuns(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit < 1 {
		return 0, fmt.Errorf("pgstore: deleting processed acceptance records: limit %d is not positive", limit)
	}
	tag, err := s.execReadCommitted(ctx, `DELETE FROM accepted_runs WHERE run_id IN (
		SELECT a.run_id FROM accepted_runs AS a
		WHERE a.processed_at < $1
			AND NOT EXISTS (SELECT 1 FROM job_outbox AS o WHERE o.run_id = a.run_id)
		ORDER BY a.processed_at
		LIMIT $2
		FOR UPDATE SKIP LOCKED)`, before, limit)
	if err != nil {
		return 0, fmt.Errorf("pgstore: deleting processed acceptance records: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
