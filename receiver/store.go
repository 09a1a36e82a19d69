package receiver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// ErrInvalidRunID is the error, wrapped, with which a Store's Accept
// refuses a run id that no delivery carries (see [Store]). It quotes no part
// of the id, which may be anything.
var ErrInvalidRunID = errors.New(`run id is not a contract run id ("run_" and then letters, digits, '_' or '-', 128 bytes at most)`)

// ErrInvalidWorker is the error, wrapped, with which an Outbox's ClaimOutbox
// refuses a worker name that cannot hold a lease: an empty one, which would
// hold items under no name, or one that is not UTF-8 text without NUL bytes,
// which PostgreSQL's text columns refuse. It quotes no part of the name.
var ErrInvalidWorker = errors.New("worker name is empty, or not UTF-8 text without NUL bytes")

// CheckClaim returns the error with which an Outbox refuses a claim (see
// [Outbox]), or nil for one it may take: ErrInvalidWorker for a worker name
// that cannot hold a lease, and an error for a lease that does not end
// after now or a limit below one. A store calls it before it asks its
// database, so that every store refuses alike.
func CheckClaim(worker string, now, leaseUntil time.Time, limit int) error {
	switch {
	case worker == "" || !isText(worker):
		return ErrInvalidWorker
	case !leaseUntil.After(now):
		return errors.New("the lease does not end after now")
	case limit < 1:
		return fmt.Errorf("limit %d is not positive", limit)
	}
	return nil
}

// isText reports whether s is UTF-8 text without NUL bytes, as a name that
// PostgreSQL's text columns store must be.
func isText(s string) bool {
	return utf8.ValidString(s) && !strings.Contains(s, "\x00")
}

// AcceptedStatus and AcceptedBody are the response a store records for a newly
// accepted run and returns for every repeat of it.
const (
	AcceptedStatus = 202
	AcceptedBody   = `{"accepted":true}`
)

// Store durably accepts deliveries. All handler replicas of an app must use the
// same database.
type Store interface {
	// Accept atomically records runID as accepted with the response
	// (AcceptedStatus, AcceptedBody) and enqueues payload as an outbox item,
	// unless runID was already accepted; then it creates nothing. Either way it
	// returns the stored response, read after the write so that a concurrent
	// winner's receipt is seen, and returns only after the transaction has
	// committed. On error the caller must not answer 2xx. An error does not
	// prove that nothing was committed: a connection lost after the COMMIT
	// was sent leaves the outcome unknown, and pgstore may report a failure
	// to read its answer after the COMMIT. Either way the acceptance is
	// whole or absent, never half done, and a later delivery of the run
	// finds the receipt if there is one. A runID that is not a contract run
	// id (contract.ValidID with the prefix "run_", the rule by which
	// ValidatePayload, and so the Handler, checks a delivery's runId) is
	// refused with an error wrapping ErrInvalidRunID, and nothing is stored.
	Accept(ctx context.Context, runID string, payload []byte) (status int, body []byte, err error)
}

// OutboxItem is one claimed unit of work.
type OutboxItem struct {
	RunID string
	// Payload is the accepted delivery body (JSON). Stores may hand back an
	// equivalent document (PostgreSQL's jsonb reorders keys); the Worker
	// restores the contract's exact bytes before calling the app.
	Payload []byte
	// Attempt counts the attempts at this item, this one included. A claim
	// counts one; a Worker that stops gives it back (ReleaseOutbox) when the
	// app's function had not run the item to a result, so an item is not
	// charged, in its backoff, for the worker's restarts. An attempt cut
	// short by a crash or by the end of its lease stays counted: the function
	// may have run, and nothing is left to say that it did not.
	Attempt int
}

// Outbox is the work queue side of a store. Times come from the caller's clock,
// so every process sharing a database must keep its clock synchronized.
//
// CompleteOutbox, FailOutbox and ReleaseOutbox take a run id that ClaimOutbox
// returned. They do not hold it to the contract's rule as Accept does: they
// store no new id, one that names no item changes nothing, and an item
// accepted under an id that Accept now refuses (stored before it checked)
// must still be completed, failed or given back, not run again at the end of
// every lease.
type Outbox interface {
	// ClaimOutbox leases up to limit unprocessed items that are due at now (no
	// retry pending after now) and not leased by a live lease (locked_until
	// after now) to worker until leaseUntil, and counts the attempt. An item is
	// never handed to two callers for overlapping leases. A claim that
	// CheckClaim refuses (an empty or non-text worker name, a lease that ends
	// no later than now, a limit below 1) is refused with its error, and
	// nothing is claimed.
	ClaimOutbox(ctx context.Context, worker string, now, leaseUntil time.Time, limit int) ([]OutboxItem, error)
	// CompleteOutbox marks the item and its acceptance record processed at at.
	// Completing an already processed item is a no-op.
	CompleteOutbox(ctx context.Context, runID string, at time.Time) error
	// FailOutbox releases the item leased by worker for a new claim at retryAt
	// and records reason. It does nothing when worker no longer holds the item.
	FailOutbox(ctx context.Context, runID, worker string, retryAt time.Time, reason string) error
	// ReleaseOutbox gives back the item leased by worker unprocessed, without
	// the attempt its claim counted: the next claim of the item carries the
	// same Attempt. The item is due again at once (it was due when claimed,
	// and its retry time is left as it was), and its last recorded error is
	// kept, since no attempt replaced it. It does nothing when worker no
	// longer holds the item.
	ReleaseOutbox(ctx context.Context, runID, worker string) error
}

// RetentionStore deletes processed records. A limit below 1 is refused with
// an error, and nothing is deleted.
type RetentionStore interface {
	// DeleteProcessedOutbox deletes up to limit outbox items processed before
	// before and returns how many it deleted.
	DeleteProcessedOutbox(ctx context.Context, before time.Time, limit int) (int, error)
	// DeleteProcessedRuns deletes up to limit acceptance records processed before
	// before that have no outbox item left, and returns how many it deleted.
	DeleteProcessedRuns(ctx context.Context, before time.Time, limit int) (int, error)
}
