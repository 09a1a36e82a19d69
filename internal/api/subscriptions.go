package api

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
)

// subscriptionJSON is the wire form of a subscription. It never holds the
// secret; see subscriptionWithSecret.
type subscriptionJSON struct {
	ID      string   `json:"id"`
	URL     string   `json:"url"`
	Types   []string `json:"types"`
	JobIDs  []string `json:"jobIds"`
	Cursor  int64    `json:"cursor"`
	Failing bool     `json:"failing"`
	// ErrorCode is the latest attempt's error while failing.
	ErrorCode     *string  `json:"errorCode"`
	Attempts      int      `json:"attempts"`
	NextAttemptAt *apiTime `json:"nextAttemptAt"`
	LastSuccessAt *apiTime `json:"lastSuccessAt"`
	// PreviousSecretExpiresAt is the end of a rotation's grace window, while
	// requests are signed with the previous secret as well.
	PreviousSecretExpiresAt *apiTime `json:"previousSecretExpiresAt"`
	CreatedAt               apiTime  `json:"createdAt"`
	UpdatedAt               apiTime  `json:"updatedAt"`
}

// subscriptionWithSecret is the answer of create and rotate-secret: the
// only two answers that carry a subscription's secret.
type subscriptionWithSecret struct {
	subscriptionJSON
	Secret string `json:"secret"`
}

// subscriptionResetJSON is a subscription as reset, with the events it
// skipped: never sent, read with GET /v1/events?after=<after>.
type subscriptionResetJSON struct {
	subscriptionJSON
	Skipped *skippedJSON `json:"skipped"`
}

type skippedJSON struct {
	After   int64 `json:"after"`
	Through int64 `json:"through"`
}

type subscriptionListJSON struct {
	Subscriptions []subscriptionJSON `json:"subscriptions"`
}

func (s *Server) subscriptionView(sub *vibejobs.Subscription) subscriptionJSON {
	v := subscriptionJSON{
		ID: sub.ID, URL: sub.URL, Types: make([]string, 0, len(sub.Types)), JobIDs: append([]string{}, sub.JobIDs...),
		Cursor: sub.Cursor, Failing: sub.Failing(), ErrorCode: strPtr(sub.ErrorCode), Attempts: sub.Attempts,
		NextAttemptAt: timePtr(sub.NextAttemptAt), LastSuccessAt: timePtr(sub.LastSuccessAt),
		CreatedAt: apiTime(sub.CreatedAt), UpdatedAt: apiTime(sub.UpdatedAt),
	}
	for _, t := range sub.Types {
		v.Types = append(v.Types, string(t))
	}
	if sub.PreviousSecret.KeyID != "" && sub.PreviousExpiresAt != nil && s.now().Before(*sub.PreviousExpiresAt) {
		v.PreviousSecretExpiresAt = timePtr(sub.PreviousExpiresAt)
	}
	return v
}

// subscriptionInput is a create or PATCH body: a nil field was not given.
type subscriptionInput struct {
	url    *string
	types  *[]vibejobs.EventType
	jobIDs *[]string
}

func parseSubscriptionInput(body []byte) (*subscriptionInput, *vibejobs.Error) {
	o, e := decodeObject(body, "")
	if e != nil {
		return nil, e
	}
	if e := o.only("url", "types", "jobIds"); e != nil {
		return nil, e
	}
	in := &subscriptionInput{}
	if in.url, e = o.str("url"); e != nil {
		return nil, e
	}
	types, e := o.stringList("types", len(vibejobs.EventTypes))
	if e != nil {
		return nil, e
	}
	if types != nil {
		ts := []vibejobs.EventType{}
		for _, t := range *types {
			if !vibejobs.ValidEventType(t) {
				return nil, invalid("invalid_type", "types", "every type must be one of "+eventTypeList())
			}
			if !containsType(ts, vibejobs.EventType(t)) {
				ts = append(ts, vibejobs.EventType(t))
			}
		}
		in.types = &ts
	}
	ids, e := o.stringList("jobIds", vibejobs.MaxSubscriptionJobIDs)
	if e != nil {
		return nil, e
	}
	if ids != nil {
		seen := []string{}
		for _, id := range *ids {
			if !contract.ValidID(id, "job_") || len(id) > 128 {
				return nil, invalid("invalid_job_id", "jobIds", "every job id must be a job id (job_…)")
			}
			if !containsString(seen, id) {
				seen = append(seen, id)
			}
		}
		in.jobIDs = &seen
	}
	return in, nil
}

// checkJobIDs refuses a jobIds filter naming a job that is not a live job
// of the project: such a filter would send nothing, silently. Malformed,
// deleted, never created and another project's ids all get the same answer
// (400 invalid_job_id), so a tenant learns nothing of another's ids. Ids in
// held (the subscription's filter before a PATCH) pass unchecked: a client
// may send back the filter it read, though some of its jobs were deleted
// since (their runs' last events may still come).
func checkJobIDs(ctx context.Context, tx vibejobs.Reader, projectID string, ids, held []string) error {
	for _, id := range ids {
		if containsString(held, id) {
			continue
		}
		if _, err := tx.GetJob(ctx, projectID, id); vibejobs.ErrorKind(err) == vibejobs.ENOTFOUND {
			return invalid("invalid_job_id", "jobIds", "jobIds names "+id+", which is not a job of this project")
		} else if err != nil {
			return err
		}
	}
	return nil
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// stringList returns the array-of-strings member key (nil when absent), of
// at most max elements.
func (o *object) stringList(key string, max int) (*[]string, *vibejobs.Error) {
	raw, ok := o.get(key)
	if !ok {
		return nil, nil
	}
	if isNull(raw) {
		return nil, invalid("invalid_json", o.prefix+key, "must not be null; send [] for none")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || items == nil {
		return nil, o.wrongType(key, "an array of strings")
	}
	if len(items) > max {
		return nil, invalid("invalid_json", o.prefix+key, "must hold at most "+strconv.Itoa(max)+" values")
	}
	out := make([]string, 0, len(items))
	for _, it := range items {
		var s string
		if len(it) == 0 || it[0] != '"' || json.Unmarshal(it, &s) != nil {
			return nil, o.wrongType(key, "an array of strings")
		}
		out = append(out, s)
	}
	return &out, nil
}

// createSubscription adds a subscription at the head of the feed: it gets
// the events appended from now on, none before.
func (s *Server) createSubscription(ctx context.Context, c *call, tx vibejobs.Tx) (*response, error) {
	in, e := parseSubscriptionInput(c.body)
	if e != nil {
		return nil, e
	}
	if in.url == nil {
		return nil, invalid("invalid_url", "url", "url is required")
	}
	u, e := s.checkURL(*in.url)
	if e != nil {
		return nil, e
	}
	sub := &vibejobs.Subscription{
		ID: vibejobs.NewID("sub_", c.now, s.rand), ProjectID: c.projectID(), URL: u,
		CreatedAt: c.now, UpdatedAt: c.now,
	}
	if in.types != nil {
		sub.Types = *in.types
	}
	if in.jobIDs != nil {
		if err := checkJobIDs(ctx, tx, c.projectID(), *in.jobIDs, nil); err != nil {
			return nil, err
		}
		sub.JobIDs = *in.jobIDs
	}
	secret, err := contract.NewSecret(s.rand)
	if err != nil {
		return nil, err
	}
	if sub.Secret, err = s.sealer.Seal(secret, sub.ID); err != nil {
		return nil, err
	}
	if err := tx.CreateSubscription(ctx, sub, vibejobs.MaxSubscriptionsPerProject); err != nil {
		return nil, err
	}
	c.wake = true
	return jsonResponse(http.StatusCreated, subscriptionWithSecret{s.subscriptionView(sub), secret}).
		with("Location", "/v1/subscriptions/"+sub.ID), nil
}

func (s *Server) listSubscriptions(ctx context.Context, c *call) (*response, error) {
	subs, err := s.store.ListSubscriptions(ctx, c.projectID())
	if err != nil {
		return nil, err
	}
	out := subscriptionListJSON{Subscriptions: make([]subscriptionJSON, 0, len(subs))}
	for _, sub := range subs {
		out.Subscriptions = append(out.Subscriptions, s.subscriptionView(sub))
	}
	return jsonResponse(http.StatusOK, out), nil
}

func (s *Server) getSubscription(ctx context.Context, c *call) (*response, error) {
	sub, err := s.store.GetSubscription(ctx, c.projectID(), c.r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	return jsonResponse(http.StatusOK, s.subscriptionView(sub)), nil
}

// patchSubscription changes url, types or jobIds. A new URL or new filters
// are tried at once, even by a subscription waiting for its next retry:
// either may be the fix for the event it is stuck at (filters that exclude
// it pass over it without a request). A new URL also restarts the count of
// failed attempts, and so the backoff: a refusal of the new receiver is a
// first one, retried after the first pause, not after the old receiver's
// hour.
func (s *Server) patchSubscription(ctx context.Context, c *call) (*response, error) {
	in, e := parseSubscriptionInput(c.body)
	if e != nil {
		return nil, e
	}
	var out *vibejobs.Subscription
	err := s.update(ctx, func(tx vibejobs.Tx) error {
		sub, err := tx.GetSubscription(ctx, c.projectID(), c.r.PathValue("id"))
		if err != nil {
			return err
		}
		if in.url != nil {
			u, e := s.checkURL(*in.url)
			if e != nil {
				return e
			}
			if u != sub.URL {
				// A new receiver: the refusals that set the backoff
				// were the old one's, so its count starts again.
				sub.URL, sub.NextAttemptAt, sub.Attempts = u, nil, 0
			}
		}
		if in.types != nil {
			if !slices.Equal(*in.types, sub.Types) {
				sub.NextAttemptAt = nil
			}
			sub.Types = *in.types
		}
		if in.jobIDs != nil {
			if err := checkJobIDs(ctx, tx, c.projectID(), *in.jobIDs, sub.JobIDs); err != nil {
				return err
			}
			if !slices.Equal(*in.jobIDs, sub.JobIDs) {
				sub.NextAttemptAt = nil
			}
			sub.JobIDs = *in.jobIDs
		}
		sub.UpdatedAt = c.now
		out = sub
		return tx.UpdateSubscription(ctx, sub)
	})
	if err != nil {
		return nil, err
	}
	c.wake = true
	return jsonResponse(http.StatusOK, s.subscriptionView(out)), nil
}

func (s *Server) deleteSubscription(ctx context.Context, c *call) (*response, error) {
	err := s.update(ctx, func(tx vibejobs.Tx) error {
		return tx.DeleteSubscription(ctx, c.projectID(), c.r.PathValue("id"))
	})
	if err != nil {
		return nil, err
	}
	return emptyResponse(http.StatusNoContent), nil
}

// rotateSubscriptionSecret gives the subscription a new secret. Requests go
// on being signed with the replaced one too, as a second v1= value, for the
// rotation grace window, so a receiver can switch secrets without losing an
// event; a secret replaced before that is dropped at once. So is a replaced
// secret that does not open (sealed under a master key the key file lost:
// the subscription is failing with secret_unavailable, and rotating is how
// the operator revives it): it cannot sign, and kept it would only block a
// later master key rotation, which re-seals every previous secret.
//
// Like a new URL, a new secret is tried at once, even by a subscription
// waiting for its next retry, and restarts the count of failed attempts:
// it is how an operator revives one failing with secret_unavailable, and
// may be the fix for a receiver that refused the old signature.
func (s *Server) rotateSubscriptionSecret(ctx context.Context, c *call, tx vibejobs.Tx) (*response, error) {
	if e := decodeEmpty(c.body); e != nil {
		return nil, e
	}
	sub, err := tx.GetSubscription(ctx, c.projectID(), c.r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	secret, err := contract.NewSecret(s.rand)
	if err != nil {
		return nil, err
	}
	sealed, err := s.sealer.Seal(secret, sub.ID)
	if err != nil {
		return nil, err
	}
	until := c.now.Add(s.rotationGrace)
	sub.PreviousSecret, sub.PreviousExpiresAt = sub.Secret, &until
	if _, err := s.sealer.Open(sub.Secret, sub.ID); err != nil {
		sub.PreviousSecret, sub.PreviousExpiresAt = vibejobs.SealedSecret{}, nil
	}
	sub.Secret, sub.NextAttemptAt, sub.Attempts, sub.UpdatedAt = sealed, nil, 0, c.now
	if err := tx.UpdateSubscription(ctx, sub); err != nil {
		return nil, err
	}
	c.wake = true
	return jsonResponse(http.StatusOK, subscriptionWithSecret{s.subscriptionView(sub), secret}), nil
}

// resetSubscription jumps the cursor to the head of the feed and clears the
// failure state: the way out for an event the receiver can never accept.
// The events skipped are never sent; the answer names them (skipped), and
// GET /v1/events?after=<skipped.after> still reads them.
func (s *Server) resetSubscription(ctx context.Context, c *call, tx vibejobs.Tx) (*response, error) {
	if e := decodeEmpty(c.body); e != nil {
		return nil, e
	}
	before, err := tx.GetSubscription(ctx, c.projectID(), c.r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	sub, err := tx.ResetSubscription(ctx, c.projectID(), before.ID, c.now)
	if err != nil {
		return nil, err
	}
	out := subscriptionResetJSON{subscriptionJSON: s.subscriptionView(sub)}
	if sub.Cursor > before.Cursor {
		out.Skipped = &skippedJSON{After: before.Cursor, Through: sub.Cursor}
	}
	return jsonResponse(http.StatusOK, out), nil
}
