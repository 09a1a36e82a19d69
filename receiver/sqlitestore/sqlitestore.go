// Package sqlitestore is the SQLite store of the receiver SDK (modernc.org/sqlite,
// no cgo), with the same tables and semantics as pgstore: the contract's
// accepted_runs and job_outbox tables plus lease columns.
//
// The database runs in WAL mode with a busy timeout and full synchronous
// commits; every writing transaction starts with BEGIN IMMEDIATE, so it holds
// the database's single write lock from its first statement and never fails
// half-way on a lock upgrade. Several processes on one host may share the file.
// Times are stored as TEXT in the contract's layout (UTC, milliseconds), which
// sorts chronologically.
package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/schemaversion"
	"github.com/vibejobs/vibejobs/receiver"
	"github.com/vibejobs/vibejobs/receiver/internal/lease"
)

// BusyTimeout is how long a transaction waits for the write lock held by
// another connection or process.
const BusyTimeout = 10 * time.Second

// Store implements receiver.Store, receiver.Outbox and receiver.RetentionStore.
// Make it with Open: a Store without a database (a zero or nil Store) answers
// every call with an error.
type Store struct {
	db    *sql.DB // the store's own single connection
	appDB *sql.DB // returned by DB, never used by the store
}

var (
	_ receiver.Store          = (*Store)(nil)
	_ receiver.Outbox         = (*Store)(nil)
	_ receiver.RetentionStore = (*Store)(nil)
)

// errNoDB answers the calls of a Store that Open did not make.
var errNoDB = errors.New("no database: make the Store with Open")

// Open opens (creating if needed) the database file at path and migrates it.
// Several processes may open the same new file at once. path is a file name,
// taken as it is: '%', '?' and '#' in it are part of the name.
func Open(ctx context.Context, path string) (*Store, error) {
	q := url.Values{}
	q.Set("_txlock", "immediate")
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", BusyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", "foreign_keys(1)")
	dsn := fileURI(path) + "?" + q.Encode()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: opening: %w", err)
	}
	// SQLite has one writer and nearly every statement here writes: one
	// connection lets this process queue its transactions in Go instead of in
	// SQLite's sleeping busy handler. Other processes wait in the busy handler.
	db.SetMaxOpenConns(1)
	// The app gets its own pool: sharing the store's only connection would let
	// an app transaction or unclosed rows stall (or, if the app waits for the
	// store meanwhile, deadlock) every acceptance and claim, and let the app's
	// session state (a PRAGMA, a stray BEGIN) reach the store's writes.
	appDB, err := sql.Open("sqlite", dsn)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlitestore: opening: %w", err)
	}
	s := &Store{db: db, appDB: appDB}
	if err := s.migrateOnOpen(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// uriPath escapes a file name for the path of a "file:" URI, in which SQLite
// decodes %XX and the driver and SQLite end the path at '?' or '#'.
var uriPath = strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23")

// fileURI returns the "file:" URI of the file name path. An absolute path
// gets an empty authority ("file://" + path): after a bare "file:", a path
// that starts with "//" (which POSIX reads as "/") would have SQLite take
// its first component for an authority and refuse it.
func fileURI(path string) string {
	if strings.HasPrefix(path, "/") {
		return "file://" + uriPath.Replace(path)
	}
	return "file:" + uriPath.Replace(path)
}

// migrateOnOpen is Migrate, which opens the store's connection, retried for
// up to BusyTimeout while it fails with SQLITE_BUSY. The first connection to
// a new file switches it to WAL, and SQLite answers a switch that meets
// another connection's lock (another process opening the same new file)
// with SQLITE_BUSY at once, without waiting in the busy handler. Once the
// file is in WAL mode, which it keeps, the switch takes no lock.
func (s *Store) migrateOnOpen(ctx context.Context) error {
	deadline := time.Now().Add(BusyTimeout)
	pause := 5 * time.Millisecond
	for {
		err := s.Migrate(ctx)
		if err == nil || !isBusy(err) || time.Now().Add(pause).After(deadline) {
			return err
		}
		if busyRetryHook != nil {
			busyRetryHook()
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		pause = min(2*pause, 200*time.Millisecond)
	}
}

// busyRetryHook, when set (by tests), is called before each wait of
// migrateOnOpen.
var busyRetryHook func()

// isBusy reports whether err is SQLite's SQLITE_BUSY (any extended code).
func isBusy(err error) bool {
	const sqliteBusy = 5
	var e interface{ Code() int }
	return errors.As(err, &e) && e.Code()&0xff == sqliteBusy
}

// DB returns a handle on the store's database file for the app's own tables
// and queries. It is a pool of its own: the store writes on a separate
// connection, so the app's transactions, open rows and session settings
// (PRAGMAs) neither hold nor change it. Its connections are set up like the
// store's (WAL, busy timeout BusyTimeout, foreign keys, full synchronous
// commits), and every transaction that is not ReadOnly begins IMMEDIATE:
// it holds the database's single write lock until it ends, and a store write
// (an acceptance, a claim) waits for it at most BusyTimeout and then fails,
// which the handler answers 503 and the platform retries. Keep write
// transactions short, read in ReadOnly transactions or outside one, and never
// wait for the store inside a write transaction. Close closes it. A Store
// without a database returns nil.
func (s *Store) DB() *sql.DB {
	if s == nil {
		return nil
	}
	return s.appDB
}

// Close closes the store's connection and the pool returned by DB. A Store
// without a database has nothing to close and returns nil.
func (s *Store) Close() error {
	if s == nil || s.db == nil {
		return nil
	}
	return errors.Join(s.db.Close(), s.appDB.Close())
}

// now is SQLite's current time in the store's layout.
const nowSQL = `(strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))`

// migrations are applied in order, each once per database file; their
// index+1 is the version recorded in receiver_migrations. Never edit one:
// append. The version is not kept in PRAGMA user_version: the file is the
// app's too (DB), and user_version is where apps commonly keep their own
// schema version. Stores before receiver_migrations set user_version to 1;
// migration 1 creates only what is missing, so on such a file it is recorded
// and changes nothing.
var migrations = []string{
	`CREATE TABLE IF NOT EXISTS accepted_runs (
		run_id TEXT PRIMARY KEY,
		accepted_at TEXT NOT NULL DEFAULT ` + nowSQL + `,
		processed_at TEXT,
		response_status INTEGER NOT NULL CHECK (response_status BETWEEN 200 AND 299),
		response_body TEXT NOT NULL CHECK (json_valid(response_body))
	);
	CREATE TABLE IF NOT EXISTS job_outbox (
		run_id TEXT PRIMARY KEY REFERENCES accepted_runs(run_id),
		payload TEXT NOT NULL CHECK (json_valid(payload)),
		created_at TEXT NOT NULL DEFAULT ` + nowSQL + `,
		processed_at TEXT,
		locked_by TEXT,
		locked_until TEXT,
		attempts INTEGER NOT NULL DEFAULT 0,
		next_attempt_at TEXT,
		last_error TEXT
	);
	CREATE INDEX IF NOT EXISTS job_outbox_pending ON job_outbox (created_at) WHERE processed_at IS NULL;
	CREATE INDEX IF NOT EXISTS job_outbox_processed ON job_outbox (processed_at) WHERE processed_at IS NOT NULL;
	CREATE INDEX IF NOT EXISTS accepted_runs_processed ON accepted_runs (processed_at) WHERE processed_at IS NOT NULL`,
}

// Migrate creates or upgrades the store's tables; Open calls it. Concurrent
// calls from several processes are serialized by the write lock. It leaves
// PRAGMA user_version, the app's, as it is. Tables that a newer build of the
// SDK migrated further are refused with an error.
func (s *Store) Migrate(ctx context.Context) error {
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS receiver_migrations (
			version INTEGER PRIMARY KEY,
			applied_at TEXT NOT NULL DEFAULT `+nowSQL+`
		)`); err != nil {
			return err
		}
		var have int
		if err := tx.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM receiver_migrations`).Scan(&have); err != nil {
			return err
		}
		if have > len(migrations) {
			return schemaversion.NewerError("the receiver schema", int64(have), int64(len(migrations)), "the SDK")
		}
		for i := have; i < len(migrations); i++ {
			if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
				return fmt.Errorf("migration %d: %w", i+1, err)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO receiver_migrations (version) VALUES (?)`, i+1); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("sqlitestore: migrating: %w", err)
	}
	return nil
}

// inTx runs fn in a BEGIN IMMEDIATE transaction and commits, or rolls back
// when fn or the commit fails. Every call of the store goes through it, and
// a Store without a database gets errNoDB here.
func (s *Store) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	if s == nil || s.db == nil {
		return errNoDB
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

func ts(t time.Time) string { return t.UTC().Format(contract.ScheduledForLayout) }

// Accept implements receiver.Store. The write lock taken by BEGIN IMMEDIATE
// makes the insert of the receipt and of the outbox item one atomic step for
// every process; the response is returned only after COMMIT. A runID that is
// not a contract run id is refused before the database is asked.
func (s *Store) Accept(ctx context.Context, runID string, payload []byte) (status int, body []byte, err error) {
	if !contract.ValidID(runID, "run_") {
		return 0, nil, fmt.Errorf("sqlitestore: accepting run: %w", receiver.ErrInvalidRunID)
	}
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO accepted_runs (run_id, response_status, response_body)
			VALUES (?, 202, '{"accepted":true}')
			ON CONFLICT (run_id) DO NOTHING`, runID)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 1 {
			// string: stored as TEXT, which json_valid checks as JSON text.
			if _, err := tx.ExecContext(ctx, `INSERT INTO job_outbox (run_id, payload) VALUES (?, ?)`, runID, string(payload)); err != nil {
				return err
			}
		}
		var b string
		if err := tx.QueryRowContext(ctx, `SELECT response_status, response_body FROM accepted_runs WHERE run_id = ?`, runID).Scan(&status, &b); err != nil {
			return err
		}
		body = []byte(b)
		return nil
	})
	if err != nil {
		return 0, nil, fmt.Errorf("sqlitestore: accepting run: %w", err)
	}
	return status, body, nil
}

// ClaimOutbox implements receiver.Outbox. The write lock serializes claims, so
// a plain UPDATE … RETURNING cannot hand an item to two workers.
func (s *Store) ClaimOutbox(ctx context.Context, worker string, now, leaseUntil time.Time, limit int) ([]receiver.OutboxItem, error) {
	// Before the database: SQLite would read a negative LIMIT as none, and
	// lease every due item.
	if err := receiver.CheckClaim(worker, now, leaseUntil, limit); err != nil {
		return nil, fmt.Errorf("sqlitestore: claiming outbox items: %w", err)
	}
	var items []receiver.OutboxItem
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `UPDATE job_outbox
			SET locked_by = ?1, locked_until = ?3, attempts = attempts + 1
			WHERE run_id IN (
				SELECT run_id FROM job_outbox
				WHERE processed_at IS NULL
					AND (next_attempt_at IS NULL OR next_attempt_at <= ?2)
					AND (locked_until IS NULL OR locked_until <= ?2)
				ORDER BY created_at, run_id
				LIMIT ?4)
			RETURNING run_id, payload, attempts`, worker, ts(now), ts(lease.Until(leaseUntil, time.Millisecond)), limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var it receiver.OutboxItem
			var payload string
			if err := rows.Scan(&it.RunID, &payload, &it.Attempt); err != nil {
				return err
			}
			it.Payload = []byte(payload)
			items = append(items, it)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: claiming outbox items: %w", err)
	}
	return items, nil
}

// CompleteOutbox implements receiver.Outbox.
func (s *Store) CompleteOutbox(ctx context.Context, runID string, at time.Time) error {
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE job_outbox
			SET processed_at = ?2, locked_by = NULL, locked_until = NULL, last_error = NULL
			WHERE run_id = ?1 AND processed_at IS NULL`, runID, ts(at))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE accepted_runs SET processed_at = ?2 WHERE run_id = ?1`, runID, ts(at))
		return err
	})
	if err != nil {
		return fmt.Errorf("sqlitestore: completing outbox item: %w", err)
	}
	return nil
}

// FailOutbox implements receiver.Outbox.
func (s *Store) FailOutbox(ctx context.Context, runID, worker string, retryAt time.Time, reason string) error {
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE job_outbox
			SET locked_by = NULL, locked_until = NULL, next_attempt_at = ?3, last_error = ?4
			WHERE run_id = ?1 AND locked_by = ?2 AND processed_at IS NULL`, runID, worker,
			ts(lease.Until(retryAt, time.Millisecond)), reason)
		return err
	})
	if err != nil {
		return fmt.Errorf("sqlitestore: recording outbox failure: %w", err)
	}
	return nil
}

// ReleaseOutbox implements receiver.Outbox.
func (s *Store) ReleaseOutbox(ctx context.Context, runID, worker string) error {
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE job_outbox
			SET locked_by = NULL, locked_until = NULL, attempts = max(attempts - 1, 0)
			WHERE run_id = ?1 AND locked_by = ?2 AND processed_at IS NULL`, runID, worker)
		return err
	})
	if err != nil {
		return fmt.Errorf("sqlitestore: giving back outbox item: %w", err)
	}
	return nil
}

// DeleteProcessedOutbox implements receiver.RetentionStore.
func (s *Store) DeleteProcessedOutbox(ctx context.Context, before time.Time, limit int) (int, error) {
	n, err := s.deleteBatch(ctx, `DELETE FROM job_outbox WHERE run_id IN (
		SELECT run_id FROM job_outbox
		WHERE processed_at < ?1
		ORDER BY processed_at
		LIMIT ?2)`, before, limit)
	if err != nil {
		return n, fmt.Errorf("sqlitestore: deleting processed outbox items: %w", err)
	}
	return n, nil
}

// DeleteProcessedRuns implements receiver.RetentionStore.
func (s *Store) DeleteProcessedRuns(ctx context.Context, before time.Time, limit int) (int, error) {
	n, err := s.deleteBatch(ctx, `DELETE FROM accepted_runs WHERE run_id IN (
		SELECT a.run_id FROM accepted_runs AS a
		WHERE a.processed_at < ?1
			AND NOT EXISTS (SELECT 1 FROM job_outbox AS o WHERE o.run_id = a.run_id)
		ORDER BY a.processed_at
		LIMIT ?2)`, before, limit)
	if err != nil {
		return n, fmt.Errorf("sqlitestore: deleting processed acceptance records: %w", err)
	}
	return n, nil
}

func (s *Store) deleteBatch(ctx context.Context, query string, before time.Time, limit int) (int, error) {
	if limit < 1 {
		// SQLite reads a negative LIMIT as none.
		return 0, fmt.Errorf("limit %d is not positive", limit)
	}
	var n int64
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, query, ts(before), limit)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return int(n), err
}
