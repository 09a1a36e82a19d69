package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vibejobs/vibejobs"
)

// appendEventsTail ends a statement whose CTE ev holds events to append, with
// the columns (project_id, ord, type, occurred_at, job_id, run_id, state,
// reason, attempt, error_code, status_code, next_at): it numbers them per
// project in ord order and inserts them. ev_heads reserves each project's
// numbers by upserting its event_heads row, which locks the row until the
// transaction ends: a later number cannot commit before an earlier one, so
// sequence order is commit order. The rows are taken in project order, so
// two transactions appending to the same projects cannot deadlock on them.
// Statements put it after their other writes (the counter is the last lock
// a transaction takes, held the shortest time); it runs once per statement
// however many events, the burst's batches included.
const appendEventsTail = `, ev_counts AS (
	SELECT project_id, count(*) AS n FROM ev GROUP BY project_id
), ev_heads AS (
	INSERT INTO event_heads AS h (project_id, head)
	SELECT project_id, n FROM ev_counts ORDER BY project_id
	ON CONFLICT (project_id) DO UPDATE SET head = h.head + EXCLUDED.head
	RETURNING h.project_id, h.head
), appended AS (
	INSERT INTO events (project_id, sequence, type, occurred_at, job_id, run_id, state, reason, attempt,
		error_code, status_code, next_at)
	SELECT ev.project_id, ev_heads.head - ev_counts.n + row_number() OVER (PARTITION BY ev.project_id ORDER BY ev.ord),
		ev.type, ev.occurred_at, ev.job_id, ev.run_id, ev.state, ev.reason, ev.attempt, ev.error_code,
		ev.status_code, ev.next_at
	FROM ev JOIN ev_counts USING (project_id) JOIN ev_heads USING (project_id)
	RETURNING 1
)`

// endedSQL is a scalar subquery of a statement whose ev CTE holds the
// events of the runs it moved (columns state and reason): the runs it
// ended, as a JSON array of {"s": state, "r": reason, "n": count}, or NULL.
const endedSQL = `(SELECT json_agg(json_build_object('s', f.state, 'r', f.reason, 'n', f.n)) FROM (
	SELECT state, reason, count(*) AS n FROM ev WHERE state IN ('succeeded', 'failed', 'cancelled')
	GROUP BY state, reason) f)`

// addEnded adds to e the runs an endedSQL value counts.
func addEnded(e vibejobs.RunsEnded, value []byte) error {
	if value == nil {
		return nil
	}
	var ends []struct {
		S string `json:"s"`
		R string `json:"r"`
		N int    `json:"n"`
	}
	if err := json.Unmarshal(value, &ends); err != nil {
		return fmt.Errorf("postgres: decoding the runs a statement ended: %w", err)
	}
	for _, x := range ends {
		e.Add(vibejobs.RunState(x.S), x.R, x.N)
	}
	return nil
}

// runEventType maps a run's new state (column state) to its event type.
const runEventType = `CASE state WHEN 'succeeded' THEN 'run.succeeded' WHEN 'failed' THEN 'run.failed'
	WHEN 'cancelled' THEN 'run.cancelled' ELSE 'run.retrying' END`

// appendEventsSQL appends events given as arrays and returns each project's
// head and count, from which the caller numbers its events.
const appendEventsSQL = `WITH ev AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[], $5::text[], $6::text[],
			$7::text[], $8::integer[], $9::text[], $10::integer[], $11::timestamptz[]) WITH ORDINALITY
		AS e(project_id, type, occurred_at, job_id, run_id, state, reason, attempt, error_code, status_code,
			next_at, ord)
)` + appendEventsTail + `
SELECT ev_heads.project_id, ev_heads.head, ev_counts.n FROM ev_heads JOIN ev_counts USING (project_id)`

// AppendEvents appends events in one statement and numbers them.
func (t *tx) AppendEvents(ctx context.Context, events ...*vibejobs.Event) error {
	if len(events) == 0 {
		return nil
	}
	n := len(events)
	var (
		projects = make([]string, n)
		types    = make([]string, n)
		times    = make([]time.Time, n)
		jobs     = make([]string, n)
		runs     = make([]string, n)
		states   = make([]string, n)
		reasons  = make([]string, n)
		attempts = make([]int32, n)
		codes    = make([]string, n)
		statuses = make([]int32, n)
		nexts    = make([]*time.Time, n)
	)
	for i, e := range events {
		projects[i], types[i], times[i], jobs[i], runs[i] = e.ProjectID, string(e.Type), e.OccurredAt, e.JobID, e.RunID
		states[i], reasons[i], attempts[i], codes[i], statuses[i], nexts[i] = e.State, e.Reason, int32(e.Attempt), e.ErrorCode, int32(e.StatusCode), e.NextAt
	}
	rows, err := t.q.Query(ctx, appendEventsSQL, projects, types, times, jobs, runs, states, reasons, attempts,
		codes, statuses, nexts)
	if err != nil {
		return mapError(err, "appending events")
	}
	next := map[string]int64{}
	_, err = collect(rows, func(row rowScanner) (struct{}, error) {
		var p string
		var head, count int64
		err := row.Scan(&p, &head, &count)
		next[p] = head - count + 1
		return struct{}{}, err
	})
	if err != nil {
		return mapError(err, "appending events")
	}
	for _, e := range events {
		e.Sequence = next[e.ProjectID]
		next[e.ProjectID]++
	}
	return nil
}

// listEventsSQL reads the head, the oldest event kept and a page of events
// in one statement, so in one snapshot: every event up to the head it reads
// is visible to it. A read from before the oldest event starts there. The
// window ends at upto, the head or $3 sequences after after, whichever is
// first, computed so that it cannot overflow for any after (an index bound,
// so a read with filters stops there).
const listEventsSQL = `WITH h AS (
	SELECT head, coalesce((SELECT min(sequence) FROM events WHERE project_id = $1), head + 1) AS oldest
	FROM (SELECT coalesce((SELECT head FROM event_heads WHERE project_id = $1), 0) AS head) h
), a AS (
	SELECT head, oldest, greatest($2, oldest - 1) AS after FROM h
), w AS MATERIALIZED (
	SELECT head, oldest, after, least(head, after + least($3::bigint, 9223372036854775807 - after)) AS upto FROM a
)
SELECT w.head, w.oldest, e.sequence, e.type, e.occurred_at, e.job_id, e.run_id, e.state, e.reason, e.attempt,
	e.error_code, e.status_code, e.next_at
FROM w LEFT JOIN LATERAL (
	SELECT * FROM events e
	WHERE e.project_id = $1 AND e.sequence > w.after AND e.sequence <= w.upto
		AND (cardinality($4::text[]) = 0 OR e.type = ANY($4::text[]))
		AND ($5 = '' OR e.job_id = $5)
	ORDER BY e.sequence
	LIMIT $6) e ON true
ORDER BY e.sequence`

// ListEvents reads a page of a project's feed; see vibejobs.Reader.
func (r reader) ListEvents(ctx context.Context, projectID string, f vibejobs.EventFilter) (vibejobs.EventPage, error) {
	var page vibejobs.EventPage
	limit := f.Limit
	if limit == 0 {
		limit = defaultLimit
	}
	if limit < 1 || limit > maxLimit {
		return page, vibejobs.FieldError("invalid_limit", "limit", "limit must be between 1 and %d", maxLimit)
	}
	types := make([]string, len(f.Types))
	for i, t := range f.Types {
		types[i] = string(t)
	}
	after := max(f.After, 0)
	rows, err := r.q.Query(ctx, listEventsSQL, projectID, after, int64(vibejobs.EventScanWindow), types, f.JobID, limit)
	if err != nil {
		return page, mapError(err, "listing events")
	}
	page.Events = make([]*vibejobs.Event, 0, limit)
	_, err = collect(rows, func(row rowScanner) (struct{}, error) {
		var (
			seq                               *int64
			typ, job, run, state, reason, ecd *string
			at, next                          *time.Time
			attempt, status                   *int32
		)
		if err := row.Scan(&page.Head, &page.Oldest, &seq, &typ, &at, &job, &run, &state, &reason, &attempt, &ecd, &status, &next); err != nil {
			return struct{}{}, err
		}
		if seq == nil {
			return struct{}{}, nil // the head alone: no event in range
		}
		page.Events = append(page.Events, &vibejobs.Event{
			ProjectID: projectID, Sequence: *seq, Type: vibejobs.EventType(*typ), OccurredAt: *at, JobID: *job,
			RunID: *run, State: *state, Reason: *reason, Attempt: int(*attempt), ErrorCode: *ecd,
			StatusCode: int(*status), NextAt: next,
		})
		return struct{}{}, nil
	})
	if err != nil {
		return page, mapError(err, "listing events")
	}
	page.Next = vibejobs.NextAfter(max(after, page.Oldest-1), page.Head, limit, page.Events)
	return page, nil
}

// PruneEvents deletes the start of projectID's feed; see
// vibejobs.MaintenanceStore. Replicas pruning at once compute the same
// start (without SKIP LOCKED, so none can skip a kept event and cut a hole
// in the feed): the later one waits for the earlier one's deletes, finds
// those rows gone and deletes nothing more.
func (s *Store) PruneEvents(ctx context.Context, projectID string, cutoff time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, `WITH head AS (
		SELECT sequence, occurred_at FROM events
		WHERE project_id = $1
			AND sequence <= coalesce((SELECT min(cursor_seq) FROM subscriptions WHERE project_id = $1),
				9223372036854775807)
		ORDER BY sequence
		LIMIT $3
	), kept AS (
		SELECT min(sequence) AS sequence FROM head WHERE occurred_at >= $2
	)
	DELETE FROM events WHERE project_id = $1 AND sequence = ANY(ARRAY(
		SELECT sequence FROM head
		WHERE sequence < coalesce((SELECT sequence FROM kept), 9223372036854775807)))`,
		projectID, cutoff, limit)
	if err != nil {
		return 0, mapError(err, "pruning events")
	}
	return int(tag.RowsAffected()), nil
}

const subscriptionColumns = `id, project_id, url, types, job_ids, secret_key_id, secret_ciphertext,
	previous_key_id, previous_ciphertext, previous_expires_at, cursor_seq, error_code, attempts, next_attempt_at,
	last_success_at, created_at, updated_at`

func scanSubscription(row rowScanner) (*vibejobs.Subscription, error) {
	var s vibejobs.Subscription
	var types []string
	if err := row.Scan(&s.ID, &s.ProjectID, &s.URL, &types, &s.JobIDs, &s.Secret.KeyID, &s.Secret.Ciphertext,
		&s.PreviousSecret.KeyID, &s.PreviousSecret.Ciphertext, &s.PreviousExpiresAt, &s.Cursor, &s.ErrorCode,
		&s.Attempts, &s.NextAttemptAt, &s.LastSuccessAt, &s.CreatedAt, &s.UpdatedAt); err != nil {
		return nil, err
	}
	for _, t := range types {
		s.Types = append(s.Types, vibejobs.EventType(t))
	}
	if len(s.JobIDs) == 0 {
		s.JobIDs = nil
	}
	if len(s.PreviousSecret.Ciphertext) == 0 {
		s.PreviousSecret.Ciphertext = nil
	}
	return &s, nil
}

func collectSubscriptions(rows pgx.Rows, err error) ([]*vibejobs.Subscription, error) {
	if err != nil {
		return nil, err
	}
	subs, err := collect(rows, scanSubscription)
	if subs == nil {
		subs = []*vibejobs.Subscription{}
	}
	return subs, err
}

// GetSubscription returns the subscription id of projectID, or ENOTFOUND.
func (r reader) GetSubscription(ctx context.Context, projectID, id string) (*vibejobs.Subscription, error) {
	return r.getSubscription(ctx, projectID, id, "")
}

// GetSubscription reads the subscription as Store.GetSubscription does and
// locks its row until the transaction ends. A transaction reads it to
// change it (the API's edits, rotations and resets write the row back from
// what they read): a rotation, reset or delivery step committed between the
// read and the write would be written over, a secret just handed out
// dropped at once, a reset's retry time put back.
func (t *tx) GetSubscription(ctx context.Context, projectID, id string) (*vibejobs.Subscription, error) {
	return t.getSubscription(ctx, projectID, id, " FOR UPDATE")
}

func (r reader) getSubscription(ctx context.Context, projectID, id, lock string) (*vibejobs.Subscription, error) {
	s, err := scanSubscription(r.q.QueryRow(ctx, `SELECT `+subscriptionColumns+` FROM subscriptions
		WHERE id = $1 AND project_id = $2`+lock, id, projectID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, vibejobs.ErrNotFound("subscription")
	}
	return s, mapError(err, "reading a subscription")
}

// ListSubscriptions returns projectID's subscriptions in id order.
func (r reader) ListSubscriptions(ctx context.Context, projectID string) ([]*vibejobs.Subscription, error) {
	subs, err := collectSubscriptions(r.q.Query(ctx, `SELECT `+subscriptionColumns+` FROM subscriptions
		WHERE project_id = $1 ORDER BY id`, projectID))
	return subs, mapError(err, "listing subscriptions")
}

// AllSubscriptions lists every subscription, by project then id.
func (s *Store) AllSubscriptions(ctx context.Context) ([]*vibejobs.Subscription, error) {
	subs, err := collectSubscriptions(s.pool.Query(ctx, `SELECT `+subscriptionColumns+` FROM subscriptions
		ORDER BY project_id, id`))
	return subs, mapError(err, "listing subscriptions")
}

func typeStrings(ts []vibejobs.EventType) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = string(t)
	}
	return out
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// CreateSubscription counts the project's subscriptions under lockProject
// and refuses one past limit.
func (t *tx) CreateSubscription(ctx context.Context, s *vibejobs.Subscription, limit int) error {
	if err := t.lockProject(ctx, s.ProjectID, "creating a subscription"); err != nil {
		return err
	}
	var n int
	var head int64
	err := t.q.QueryRow(ctx, `SELECT (SELECT count(*) FROM subscriptions WHERE project_id = $1),
		coalesce((SELECT head FROM event_heads WHERE project_id = $1), 0)`, s.ProjectID).Scan(&n, &head)
	if err != nil {
		return mapError(err, "creating a subscription")
	}
	if n >= limit {
		return vibejobs.Errorf(vibejobs.ECONFLICT, "too_many_subscriptions",
			"this project has reached its limit of %d subscriptions; delete one first", limit)
	}
	tag, err := t.q.Exec(ctx, `INSERT INTO subscriptions (id, project_id, url, types, job_ids, secret_key_id,
			secret_ciphertext, previous_key_id, previous_ciphertext, previous_expires_at, cursor_seq, next_attempt_at,
			created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
		ON CONFLICT DO NOTHING`,
		s.ID, s.ProjectID, s.URL, typeStrings(s.Types), nonNilStrings(s.JobIDs), s.Secret.KeyID,
		nonNil(s.Secret.Ciphertext), s.PreviousSecret.KeyID, nonNil(s.PreviousSecret.Ciphertext), s.PreviousExpiresAt,
		head, s.NextAttemptAt, s.CreatedAt, s.UpdatedAt)
	if err != nil {
		return mapError(err, "creating a subscription")
	}
	if tag.RowsAffected() == 0 {
		return vibejobs.Errorf(vibejobs.ECONFLICT, "subscription_exists", "a subscription with this id exists")
	}
	s.Cursor = head
	return nil
}

// laterUpdatedAt is the updated_at of a change at $n: that instant, or a
// millisecond after the stored one when it is not later (two changes in
// one millisecond, a clock stepped back), so that every change moves it.
func laterUpdatedAt(n string) string {
	return `greatest(` + n + `::timestamptz, updated_at + interval '1 millisecond')`
}

// UpdateSubscription writes the settings and secrets of s, and sets
// s.UpdatedAt as stored.
func (t *tx) UpdateSubscription(ctx context.Context, s *vibejobs.Subscription) error {
	err := t.q.QueryRow(ctx, `UPDATE subscriptions SET url = $3, types = $4, job_ids = $5, secret_key_id = $6,
			secret_ciphertext = $7, previous_key_id = $8, previous_ciphertext = $9, previous_expires_at = $10,
			next_attempt_at = $11, updated_at = `+laterUpdatedAt("$12")+`, attempts = $13
		WHERE id = $1 AND project_id = $2
		RETURNING updated_at`,
		s.ID, s.ProjectID, s.URL, typeStrings(s.Types), nonNilStrings(s.JobIDs), s.Secret.KeyID,
		nonNil(s.Secret.Ciphertext), s.PreviousSecret.KeyID, nonNil(s.PreviousSecret.Ciphertext), s.PreviousExpiresAt,
		s.NextAttemptAt, s.UpdatedAt, s.Attempts).Scan(&s.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return vibejobs.ErrNotFound("subscription")
	}
	return mapError(err, "updating a subscription")
}

// DeleteSubscription deletes the subscription, or answers ENOTFOUND.
func (t *tx) DeleteSubscription(ctx context.Context, projectID, id string) error {
	tag, err := t.q.Exec(ctx, `DELETE FROM subscriptions WHERE id = $1 AND project_id = $2`, id, projectID)
	if err != nil {
		return mapError(err, "deleting a subscription")
	}
	if tag.RowsAffected() == 0 {
		return vibejobs.ErrNotFound("subscription")
	}
	return nil
}

// ResetSubscription moves the cursor to the head and clears the failure state.
func (t *tx) ResetSubscription(ctx context.Context, projectID, id string, at time.Time) (*vibejobs.Subscription, error) {
	s, err := scanSubscription(t.q.QueryRow(ctx, `UPDATE subscriptions SET
			cursor_seq = greatest(cursor_seq, coalesce((SELECT head FROM event_heads WHERE project_id = $2), 0)),
			error_code = '', attempts = 0, next_attempt_at = NULL, updated_at = `+laterUpdatedAt("$3")+`
		WHERE id = $1 AND project_id = $2
		RETURNING `+subscriptionColumns, id, projectID, at))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, vibejobs.ErrNotFound("subscription")
	}
	return s, mapError(err, "resetting a subscription")
}

// SubscriptionSecretsNotUnder lists subscriptions with a secret sealed under
// another key than keyID, in id order.
func (t *tx) SubscriptionSecretsNotUnder(ctx context.Context, keyID string, limit int) ([]*vibejobs.Subscription, error) {
	// Locked, as in SecretsNotUnder.
	subs, err := collectSubscriptions(t.q.Query(ctx, `SELECT `+subscriptionColumns+` FROM subscriptions
		WHERE secret_key_id <> $1 OR (previous_key_id <> '' AND previous_key_id <> $1) ORDER BY id LIMIT $2
		FOR UPDATE`, keyID, limit))
	return subs, mapError(err, "listing subscription secrets to re-seal")
}

// SetSubscriptionSecrets replaces both sealed secrets of a subscription.
func (t *tx) SetSubscriptionSecrets(ctx context.Context, id string, current, previous vibejobs.SealedSecret) error {
	tag, err := t.q.Exec(ctx, `UPDATE subscriptions SET secret_key_id = $2, secret_ciphertext = $3,
		previous_key_id = $4, previous_ciphertext = $5,
		previous_expires_at = CASE WHEN $4 = '' THEN NULL ELSE previous_expires_at END WHERE id = $1`,
		id, current.KeyID, nonNil(current.Ciphertext), previous.KeyID, nonNil(previous.Ciphertext))
	if err != nil {
		return mapError(err, "setting subscription secrets")
	}
	if tag.RowsAffected() == 0 {
		return vibejobs.ErrNotFound("subscription")
	}
	return nil
}

// claimSubscriptionsSQL leases subscriptions with work, least recently
// served first: lease_expires_at is when the last lease ended (released or
// expired; NULL: never leased), so a subscription that keeps getting events
// goes to the back of the line each time it is served, behind every other
// with work, a failing one whose retry is due included. SKIP LOCKED lets
// replicas claim at once without taking the same subscription or waiting;
// the join does not lock event_heads, so a claim never waits for an
// appending transaction.
const claimSubscriptionsSQL = `UPDATE subscriptions s SET lease_owner = $2, lease_expires_at = $3
WHERE s.id IN (
	SELECT c.id FROM subscriptions c JOIN event_heads h ON h.project_id = c.project_id
	WHERE c.cursor_seq < h.head AND (c.next_attempt_at IS NULL OR c.next_attempt_at <= $1)
		AND (c.lease_owner IS NULL OR c.lease_expires_at < $1)
	ORDER BY c.lease_expires_at NULLS FIRST, c.id
	LIMIT $4
	FOR UPDATE OF c SKIP LOCKED)
RETURNING ` + subscriptionColumns

// ClaimSubscriptions leases subscriptions with work to owner; see
// vibejobs.SubscriptionStore.
func (s *Store) ClaimSubscriptions(ctx context.Context, owner string, now time.Time, limit int, lease time.Duration) ([]*vibejobs.Subscription, error) {
	if limit <= 0 {
		return nil, nil
	}
	subs, err := collectSubscriptions(s.pool.Query(ctx, claimSubscriptionsSQL, now, owner, now.Add(lease), limit))
	if err != nil {
		return nil, mapError(err, "claiming subscriptions")
	}
	slices.SortFunc(subs, func(a, b *vibejobs.Subscription) int { return cmpString(a.ID, b.ID) })
	return subs, nil
}

// RecordSubscriptionStep applies st while owner holds the lease. A step
// that releases the lease keeps st.At in lease_expires_at, as the end of
// the lease that claims order by; lease_owner NULL alone makes the row
// claimable.
func (s *Store) RecordSubscriptionStep(ctx context.Context, owner string, st vibejobs.SubscriptionStep) (*vibejobs.Subscription, error) {
	var lease, next, seen *time.Time
	if !st.Seen.IsZero() {
		seen = &st.Seen
	}
	if !st.LeaseUntil.IsZero() && st.ErrorCode == "" {
		lease = &st.LeaseUntil
	}
	if st.ErrorCode != "" {
		next = &st.NextAttemptAt
	}
	sub, err := scanSubscription(s.pool.QueryRow(ctx, `UPDATE subscriptions SET
			cursor_seq = greatest(cursor_seq, $3),
			error_code = CASE WHEN $4 <> '' AND ($9::timestamptz IS NULL OR updated_at = $9) THEN $4
				WHEN $5 OR $3 > cursor_seq THEN '' ELSE error_code END,
			attempts = CASE WHEN $4 <> '' AND ($9::timestamptz IS NULL OR updated_at = $9) THEN
					CASE WHEN $3 > cursor_seq THEN 0 ELSE attempts END + CASE WHEN $10 THEN 0 ELSE 1 END
				WHEN $5 OR $3 > cursor_seq THEN 0 ELSE attempts END,
			next_attempt_at = CASE WHEN $4 <> '' AND ($9::timestamptz IS NULL OR updated_at = $9) THEN $6::timestamptz
				WHEN $5 OR $3 > cursor_seq THEN NULL ELSE next_attempt_at END,
			last_success_at = CASE WHEN $5 THEN $7::timestamptz ELSE last_success_at END,
			lease_owner = CASE WHEN $8::timestamptz IS NULL THEN NULL ELSE lease_owner END,
			lease_expires_at = coalesce($8::timestamptz, $7::timestamptz)
		WHERE id = $1 AND lease_owner = $2
		RETURNING `+subscriptionColumns, st.ID, owner, st.Cursor, st.ErrorCode, st.Delivered, next, st.At, lease, seen, st.Unsent))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, mapError(err, "recording a subscription step")
	}
	return sub, nil
}
