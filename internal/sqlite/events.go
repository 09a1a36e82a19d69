package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/vibejobs/vibejobs"
)

// bumpHeadSQL reserves n sequences of a project's feed and returns the last.
const bumpHeadSQL = `INSERT INTO event_heads (project_id, head) VALUES (?1, ?2)
	ON CONFLICT (project_id) DO UPDATE SET head = head + excluded.head
	RETURNING head`

// insertEventsSQL inserts numbered events given as a JSON array of rows.
const insertEventsSQL = `INSERT INTO events (project_id, sequence, type, occurred_at, job_id, run_id, state,
		reason, attempt, error_code, status_code, next_at)
	SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, value ->> 6,
		value ->> 7, value ->> 8, value ->> 9, value ->> 10, value ->> 11
	FROM jsonb_each(?)`

// appendEvents numbers events per project, in the order given, and inserts
// them. The single write connection makes the numbering the commit order.
func appendEvents(ctx context.Context, t wtx, events []*vibejobs.Event) error {
	if len(events) == 0 {
		return nil
	}
	counts := map[string]int64{}
	var projects []string
	for _, e := range events {
		if e.RunID != "" {
			t.ended.Add(vibejobs.RunState(e.State), e.Reason, 1)
		}
		if counts[e.ProjectID] == 0 {
			projects = append(projects, e.ProjectID)
		}
		counts[e.ProjectID]++
	}
	slices.Sort(projects)
	next := make(map[string]int64, len(projects))
	for _, p := range projects {
		var head int64
		if err := t.QueryRowContext(ctx, bumpHeadSQL, p, counts[p]).Scan(&head); err != nil {
			return fmt.Errorf("appending events: %w", err)
		}
		next[p] = head - counts[p] + 1
	}
	rows := make([][12]any, len(events))
	for i, e := range events {
		e.Sequence = next[e.ProjectID]
		next[e.ProjectID]++
		rows[i] = [12]any{e.ProjectID, e.Sequence, string(e.Type), ms(e.OccurredAt), e.JobID, e.RunID, e.State,
			e.Reason, e.Attempt, e.ErrorCode, e.StatusCode, msPtr(e.NextAt)}
	}
	if _, err := t.ExecContext(ctx, insertEventsSQL, jsonArray(rows)); err != nil {
		return fmt.Errorf("appending events: %w", err)
	}
	return nil
}

// runEvent is the event of a run that moved to state at at.
func runEvent(runID, projectID, jobID string, state vibejobs.RunState, reason string, attempt int, at time.Time) *vibejobs.Event {
	return &vibejobs.Event{
		ProjectID: projectID, Type: vibejobs.RunEventType(state), OccurredAt: at, JobID: jobID, RunID: runID,
		State: string(state), Reason: reason, Attempt: attempt,
	}
}

// scanRunEvents reads rows of (id, project_id, job_id, state, failure_reason,
// attempt, next_attempt_at) into run events at at, in run id order.
func scanRunEvents(rows *sql.Rows, at time.Time, errorCode string) ([]*vibejobs.Event, error) {
	defer rows.Close()
	var events []*vibejobs.Event
	for rows.Next() {
		var id, project, job, state, reason string
		var attempt int
		var next sql.NullInt64
		if err := rows.Scan(&id, &project, &job, &state, &reason, &attempt, &next); err != nil {
			return nil, err
		}
		e := runEvent(id, project, job, vibejobs.RunState(state), reason, attempt, at)
		e.ErrorCode = errorCode
		e.NextAt = fromNullMS(next)
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	slices.SortFunc(events, func(a, b *vibejobs.Event) int { return cmp.Compare(a.RunID, b.RunID) })
	return events, nil
}

// runEventColumns are the columns scanRunEvents reads, in a RETURNING clause.
const runEventColumns = `id, project_id, job_id, state, failure_reason, attempt, next_attempt_at`

func (t *tx) AppendEvents(ctx context.Context, events ...*vibejobs.Event) error {
	return appendEvents(ctx, t.t, events)
}

// listEventsSQL reads the head, the oldest event kept and a page of events
// in one statement, so in one snapshot. A read from before the oldest event
// starts there.
const listEventsSQL = `WITH h AS (
		SELECT head, coalesce((SELECT min(sequence) FROM events WHERE project_id = ?1), head + 1) AS oldest
		FROM (SELECT coalesce((SELECT head FROM event_heads WHERE project_id = ?1), 0) AS head)
	), w AS (
		SELECT head, oldest, max(?2, oldest - 1) AS after FROM h
	)
	SELECT w.head, w.oldest, e.sequence, e.type, e.occurred_at, e.job_id, e.run_id, e.state, e.reason,
		e.attempt, e.error_code, e.status_code, e.next_at
	FROM w
	LEFT JOIN events e ON e.project_id = ?1 AND e.sequence > w.after AND e.sequence <= min(w.head, w.after + ?3)
		AND (?4 = '[]' OR e.type IN (SELECT value FROM json_each(?4)))
		AND (?5 = '' OR e.job_id = ?5)
	ORDER BY e.sequence LIMIT ?6`

func (r reader) ListEvents(ctx context.Context, projectID string, f vibejobs.EventFilter) (vibejobs.EventPage, error) {
	var page vibejobs.EventPage
	limit := cmp.Or(f.Limit, defaultLimit)
	if limit < 1 || limit > maxLimit {
		return page, vibejobs.FieldError("invalid_limit", "limit", "limit must be between 1 and %d", maxLimit)
	}
	types := make([]string, len(f.Types))
	for i, t := range f.Types {
		types[i] = string(t)
	}
	rows, err := r.q.QueryContext(ctx, listEventsSQL, projectID, max(f.After, 0), vibejobs.EventScanWindow,
		jsonArray(types), f.JobID, limit)
	if err != nil {
		return page, fmt.Errorf("listing events: %w", err)
	}
	defer rows.Close()
	page.Events = make([]*vibejobs.Event, 0, limit)
	for rows.Next() {
		var seq, occurred, attempt, status sql.NullInt64
		var typ, job, run, state, reason, code sql.NullString
		var next sql.NullInt64
		if err := rows.Scan(&page.Head, &page.Oldest, &seq, &typ, &occurred, &job, &run, &state, &reason, &attempt, &code, &status, &next); err != nil {
			return page, fmt.Errorf("listing events: %w", err)
		}
		if !seq.Valid {
			continue // the head alone: no event in range
		}
		page.Events = append(page.Events, &vibejobs.Event{
			ProjectID: projectID, Sequence: seq.Int64, Type: vibejobs.EventType(typ.String),
			OccurredAt: fromMS(occurred.Int64), JobID: job.String, RunID: run.String, State: state.String,
			Reason: reason.String, Attempt: int(attempt.Int64), ErrorCode: code.String, StatusCode: int(status.Int64),
			NextAt: fromNullMS(next),
		})
	}
	if err := rows.Err(); err != nil {
		return page, fmt.Errorf("listing events: %w", err)
	}
	page.Next = vibejobs.NextAfter(max(f.After, page.Oldest-1), page.Head, limit, page.Events)
	return page, nil
}

// PruneEvents deletes the start of projectID's feed; see
// vibejobs.MaintenanceStore.
func (s *Store) PruneEvents(ctx context.Context, projectID string, cutoff time.Time, limit int) (int, error) {
	return s.prune(ctx, "events", limit, `WITH head AS (
			SELECT sequence, occurred_at FROM events
			WHERE project_id = ?1
				AND sequence <= coalesce((SELECT min(cursor_seq) FROM subscriptions WHERE project_id = ?1),
					9223372036854775807)
			ORDER BY sequence
			LIMIT ?3
		)
		DELETE FROM events WHERE project_id = ?1 AND sequence IN (
			SELECT sequence FROM head
			WHERE sequence < coalesce((SELECT min(sequence) FROM head WHERE occurred_at >= ?2),
				9223372036854775807))`, projectID, ms(cutoff), limit)
}

// subscriptionColumns are the columns scanSubscription reads.
const subscriptionColumns = `id, project_id, url, types, job_ids, secret_key_id, secret_ciphertext,
	previous_key_id, previous_ciphertext, previous_expires_at, cursor_seq, error_code, attempts, next_attempt_at,
	last_success_at, created_at, updated_at`

func scanSubscription(sc scanner) (*vibejobs.Subscription, error) {
	var s vibejobs.Subscription
	var types, jobIDs string
	var prevExp, next, lastOK sql.NullInt64
	var created, updated int64
	if err := sc.Scan(&s.ID, &s.ProjectID, &s.URL, &types, &jobIDs, &s.Secret.KeyID, &s.Secret.Ciphertext,
		&s.PreviousSecret.KeyID, &s.PreviousSecret.Ciphertext, &prevExp, &s.Cursor, &s.ErrorCode, &s.Attempts,
		&next, &lastOK, &created, &updated); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(types), &s.Types); err != nil {
		return nil, fmt.Errorf("decoding subscription types: %w", err)
	}
	if err := json.Unmarshal([]byte(jobIDs), &s.JobIDs); err != nil {
		return nil, fmt.Errorf("decoding subscription job ids: %w", err)
	}
	if len(s.PreviousSecret.Ciphertext) == 0 {
		s.PreviousSecret.Ciphertext = nil
	}
	s.PreviousExpiresAt = fromNullMS(prevExp)
	s.NextAttemptAt = fromNullMS(next)
	s.LastSuccessAt = fromNullMS(lastOK)
	s.CreatedAt = fromMS(created)
	s.UpdatedAt = fromMS(updated)
	return &s, nil
}

func scanSubscriptions(rows *sql.Rows, err error) ([]*vibejobs.Subscription, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	subs := []*vibejobs.Subscription{}
	for rows.Next() {
		s, err := scanSubscription(rows)
		if err != nil {
			return nil, err
		}
		subs = append(subs, s)
	}
	return subs, rows.Err()
}

func (r reader) GetSubscription(ctx context.Context, projectID, id string) (*vibejobs.Subscription, error) {
	s, err := scanSubscription(r.q.QueryRowContext(ctx,
		`SELECT `+subscriptionColumns+` FROM subscriptions WHERE id = ? AND project_id = ?`, id, projectID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, vibejobs.ErrNotFound("subscription")
	}
	if err != nil {
		return nil, fmt.Errorf("getting subscription: %w", err)
	}
	return s, nil
}

func (r reader) ListSubscriptions(ctx context.Context, projectID string) ([]*vibejobs.Subscription, error) {
	subs, err := scanSubscriptions(r.q.QueryContext(ctx,
		`SELECT `+subscriptionColumns+` FROM subscriptions WHERE project_id = ? ORDER BY id`, projectID))
	if err != nil {
		return nil, fmt.Errorf("listing subscriptions: %w", err)
	}
	return subs, nil
}

// AllSubscriptions lists every subscription, by project then id.
func (s *Store) AllSubscriptions(ctx context.Context) ([]*vibejobs.Subscription, error) {
	subs, err := scanSubscriptions(s.q.QueryContext(ctx,
		`SELECT `+subscriptionColumns+` FROM subscriptions ORDER BY project_id, id`))
	if err != nil {
		return nil, fmt.Errorf("listing subscriptions: %w", err)
	}
	return subs, nil
}

func filterJSON(s *vibejobs.Subscription) (types, jobIDs string) {
	t := make([]string, len(s.Types))
	for i, x := range s.Types {
		t[i] = string(x)
	}
	return jsonArray(t), jsonArray(append([]string{}, s.JobIDs...))
}

// CreateSubscription counts and inserts under the single writer, so the
// limit holds against concurrent creations.
func (t *tx) CreateSubscription(ctx context.Context, s *vibejobs.Subscription, limit int) error {
	var n int
	var head int64
	err := t.t.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM subscriptions WHERE project_id = ?1),
		coalesce((SELECT head FROM event_heads WHERE project_id = ?1), 0)`, s.ProjectID).Scan(&n, &head)
	if err != nil {
		return fmt.Errorf("creating subscription: %w", err)
	}
	if n >= limit {
		return tooManySubscriptions(limit)
	}
	types, jobIDs := filterJSON(s)
	_, err = t.t.ExecContext(ctx, `INSERT INTO subscriptions (id, project_id, url, types, job_ids, secret_key_id,
			secret_ciphertext, previous_key_id, previous_ciphertext, previous_expires_at, cursor_seq, next_attempt_at,
			created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		s.ID, s.ProjectID, s.URL, types, jobIDs, s.Secret.KeyID, nonNil(s.Secret.Ciphertext),
		s.PreviousSecret.KeyID, nonNil(s.PreviousSecret.Ciphertext), msPtr(s.PreviousExpiresAt), head,
		msPtr(s.NextAttemptAt), ms(s.CreatedAt), ms(s.UpdatedAt))
	switch {
	case isUniqueViolation(err):
		return vibejobs.Errorf(vibejobs.ECONFLICT, "subscription_exists", "a subscription with this id exists")
	case isForeignKeyViolation(err):
		return vibejobs.ErrNotFound("project")
	case err != nil:
		return fmt.Errorf("creating subscription: %w", err)
	}
	s.Cursor = head
	return nil
}

func tooManySubscriptions(limit int) error {
	return vibejobs.Errorf(vibejobs.ECONFLICT, "too_many_subscriptions",
		"this project has reached its limit of %d subscriptions; delete one first", limit)
}

// laterUpdatedAt is the updated_at of a change at ?: that instant, or a
// millisecond after the stored one when it is not later (two changes in
// one millisecond, a clock stepped back), so that every change moves it.
const laterUpdatedAt = `max(?, updated_at + 1)`

func (t *tx) UpdateSubscription(ctx context.Context, s *vibejobs.Subscription) error {
	types, jobIDs := filterJSON(s)
	var updated int64
	err := t.t.QueryRowContext(ctx, `UPDATE subscriptions SET url = ?, types = ?, job_ids = ?,
			secret_key_id = ?, secret_ciphertext = ?, previous_key_id = ?, previous_ciphertext = ?,
			previous_expires_at = ?, attempts = ?, next_attempt_at = ?, updated_at = `+laterUpdatedAt+`
		WHERE id = ? AND project_id = ?
		RETURNING updated_at`,
		s.URL, types, jobIDs, s.Secret.KeyID, nonNil(s.Secret.Ciphertext), s.PreviousSecret.KeyID,
		nonNil(s.PreviousSecret.Ciphertext), msPtr(s.PreviousExpiresAt), s.Attempts, msPtr(s.NextAttemptAt), ms(s.UpdatedAt),
		s.ID, s.ProjectID).Scan(&updated)
	if errors.Is(err, sql.ErrNoRows) {
		return vibejobs.ErrNotFound("subscription")
	}
	if err != nil {
		return fmt.Errorf("updating subscription: %w", err)
	}
	s.UpdatedAt = fromMS(updated)
	return nil
}

func (t *tx) DeleteSubscription(ctx context.Context, projectID, id string) error {
	n, err := changed(t.t.ExecContext(ctx, `DELETE FROM subscriptions WHERE id = ? AND project_id = ?`, id, projectID))
	if err != nil {
		return fmt.Errorf("deleting subscription: %w", err)
	}
	if n == 0 {
		return vibejobs.ErrNotFound("subscription")
	}
	return nil
}

func (t *tx) ResetSubscription(ctx context.Context, projectID, id string, at time.Time) (*vibejobs.Subscription, error) {
	s, err := scanSubscription(t.t.QueryRowContext(ctx, `UPDATE subscriptions SET
			cursor_seq = max(cursor_seq, coalesce((SELECT head FROM event_heads h WHERE h.project_id = ?2), 0)),
			error_code = '', attempts = 0, next_attempt_at = NULL, updated_at = max(?3, updated_at + 1)
		WHERE id = ?1 AND project_id = ?2
		RETURNING `+subscriptionColumns, id, projectID, ms(at)))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, vibejobs.ErrNotFound("subscription")
	}
	if err != nil {
		return nil, fmt.Errorf("resetting subscription: %w", err)
	}
	return s, nil
}

func (t *tx) SubscriptionSecretsNotUnder(ctx context.Context, keyID string, limit int) ([]*vibejobs.Subscription, error) {
	subs, err := scanSubscriptions(t.t.QueryContext(ctx, `SELECT `+subscriptionColumns+` FROM subscriptions
		WHERE secret_key_id <> ?1 OR (previous_key_id <> '' AND previous_key_id <> ?1) ORDER BY id LIMIT ?2`,
		keyID, limit))
	if err != nil {
		return nil, fmt.Errorf("listing subscription secrets to reseal: %w", err)
	}
	return subs, nil
}

func (t *tx) SetSubscriptionSecrets(ctx context.Context, id string, current, previous vibejobs.SealedSecret) error {
	n, err := changed(t.t.ExecContext(ctx, `UPDATE subscriptions SET secret_key_id = ?1, secret_ciphertext = ?2,
		previous_key_id = ?3, previous_ciphertext = ?4,
		previous_expires_at = CASE WHEN ?3 = '' THEN NULL ELSE previous_expires_at END WHERE id = ?5`,
		current.KeyID, nonNil(current.Ciphertext), previous.KeyID, nonNil(previous.Ciphertext), id))
	if err != nil {
		return fmt.Errorf("setting subscription secrets: %w", err)
	}
	if n == 0 {
		return vibejobs.ErrNotFound("subscription")
	}
	return nil
}

// claimSubscriptionsSQL leases the subscriptions that have work, least
// recently served first: lease_expires_at is when the last lease ended
// (released or expired; NULL: never leased), so one that keeps getting
// events goes behind every other with work each time it is served, a
// failing one whose retry is due included.
const claimSubscriptionsSQL = `UPDATE subscriptions SET lease_owner = ?2, lease_expires_at = ?3
	WHERE id IN (SELECT s.id FROM subscriptions s JOIN event_heads h ON h.project_id = s.project_id
		WHERE s.cursor_seq < h.head AND (s.next_attempt_at IS NULL OR s.next_attempt_at <= ?1)
			AND (s.lease_owner IS NULL OR s.lease_expires_at < ?1)
		ORDER BY s.lease_expires_at NULLS FIRST, s.id LIMIT ?4)
	RETURNING ` + subscriptionColumns

func (s *Store) ClaimSubscriptions(ctx context.Context, owner string, now time.Time, limit int, lease time.Duration) ([]*vibejobs.Subscription, error) {
	if limit <= 0 {
		return nil, nil
	}
	var subs []*vibejobs.Subscription
	err := s.write(ctx, func(t wtx) error {
		var err error
		subs, err = scanSubscriptions(t.QueryContext(ctx, claimSubscriptionsSQL, ms(now), owner, ms(now.Add(lease)), limit))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claiming subscriptions: %w", err)
	}
	slices.SortFunc(subs, func(a, b *vibejobs.Subscription) int { return cmp.Compare(a.ID, b.ID) })
	return subs, nil
}

// recordStepSQL applies a SubscriptionStep while owner holds the lease. A
// step that releases the lease keeps its time (?7) in lease_expires_at, as
// the end of the lease that claims order by; lease_owner NULL alone makes
// the row claimable.
const recordStepSQL = `UPDATE subscriptions SET
		cursor_seq = max(cursor_seq, ?3),
		error_code = CASE WHEN ?4 <> '' AND (?9 IS NULL OR updated_at = ?9) THEN ?4
			WHEN ?5 OR ?3 > cursor_seq THEN '' ELSE error_code END,
		attempts = CASE WHEN ?4 <> '' AND (?9 IS NULL OR updated_at = ?9) THEN
				CASE WHEN ?3 > cursor_seq THEN 0 ELSE attempts END + CASE WHEN ?10 THEN 0 ELSE 1 END
			WHEN ?5 OR ?3 > cursor_seq THEN 0 ELSE attempts END,
		next_attempt_at = CASE WHEN ?4 <> '' AND (?9 IS NULL OR updated_at = ?9) THEN ?6
			WHEN ?5 OR ?3 > cursor_seq THEN NULL ELSE next_attempt_at END,
		last_success_at = CASE WHEN ?5 THEN ?7 ELSE last_success_at END,
		lease_owner = CASE WHEN ?8 IS NULL THEN NULL ELSE lease_owner END,
		lease_expires_at = coalesce(?8, ?7)
	WHERE id = ?1 AND lease_owner = ?2
	RETURNING ` + subscriptionColumns

func (s *Store) RecordSubscriptionStep(ctx context.Context, owner string, st vibejobs.SubscriptionStep) (*vibejobs.Subscription, error) {
	var lease, next, seen any
	if !st.Seen.IsZero() {
		seen = ms(st.Seen)
	}
	if !st.LeaseUntil.IsZero() && st.ErrorCode == "" {
		lease = ms(st.LeaseUntil)
	}
	if st.ErrorCode != "" {
		next = ms(st.NextAttemptAt)
	}
	var sub *vibejobs.Subscription
	err := s.write(ctx, func(t wtx) error {
		var err error
		sub, err = scanSubscription(t.QueryRowContext(ctx, recordStepSQL, st.ID, owner, st.Cursor, st.ErrorCode,
			st.Delivered, next, ms(st.At), lease, seen, st.Unsent))
		if errors.Is(err, sql.ErrNoRows) {
			sub, err = nil, nil
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("recording subscription step: %w", err)
	}
	return sub, nil
}
