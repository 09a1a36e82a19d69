// Package subscriptions delivers a project's event feed to its subscriptions
// (webhooks): per subscription, one event at a time in sequence order, signed
// with the subscription's secret and sent through the egress client.
//
// The promise is at least once, in order, never skipping: the cursor moves
// only after the receiver answered 2xx (or past an event the filters
// exclude, without a request), so an event is sent again, under the same
// id, until it is accepted; a process that dies between the receiver's 2xx
// and the cursor write leaves the event to be sent again by whoever takes
// the subscription over (a streaming session writes its cursor at least
// every 100 ms and after each page of 100 events, not after every event).
// A receiver that keeps refusing one event holds its subscription there,
// retried after 12 s doubling up to 1 h (±20 %, but never under 12 s: at
// most 5 failed attempts a minute), while every other
// subscription goes on: each is worked in its own goroutine, and a failing
// one waits in the database, not in a worker. A failure of ours (the
// database) is retried after ErrorPause; one that needs an operator (a
// secret that does not open) is too, and marks the subscription failing.
//
// Replicas share the work through a lease on the subscription row: one
// session at a time works a subscription, and a lease left by a dead
// process expires. Each claim leases under a name of its own, so a session
// whose lease was taken over, even by its own process, stops at its next
// step. A session works its subscription for one turn (Config.Turn) at
// most: with events still to send when the turn is over, it writes its
// cursor, gives the lease back and ends, and claims take the subscription
// served least recently first. So with more subscriptions with work than
// sessions, each gets a turn in order, however steady the stream of
// another.
package subscriptions

import (
	"cmp"
	"context"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/egress"
	"github.com/vibejobs/vibejobs/internal/feed"
	"github.com/vibejobs/vibejobs/internal/health"
)

// Defaults of Config.
const (
	// DefaultConcurrency bounds the subscriptions one replica works at once.
	DefaultConcurrency = 64
	// DefaultLease is how long a claim (and each step after it) holds a
	// subscription: longer than one request's budget.
	DefaultLease = 30 * time.Second
	// DefaultPollInterval is how often a replica looks for subscriptions
	// with new events when nothing woke it.
	DefaultPollInterval = 250 * time.Millisecond
	// DefaultTimeout is one request's budget (name resolution to response
	// headers).
	DefaultTimeout = 10 * time.Second
	// DefaultStoreTimeout bounds each store call (see Config.StoreTimeout).
	DefaultStoreTimeout = 10 * time.Second
	// DefaultTurn is how long a session may work a subscription that still
	// has events to send before it yields: it writes its cursor, gives the
	// lease back and ends, and the next claim takes whoever was served
	// least recently (this subscription goes to the back of the line).
	// With more subscriptions with work than Concurrency, each then waits
	// about (subscriptions with work / Concurrency − 1) turns between its
	// turns, not until another is caught up (never, for a steady stream).
	//
	// One second, so the wait stays short, while a yield costs little: a
	// streaming session writes its cursor every cursorWriteEvery anyway,
	// and a yield adds one claim and one read of the feed per ten of those
	// writes: yields add at most Concurrency claims a second per replica,
	// however fast events come (a fast receiver takes hundreds in a turn). A
	// session yields only after an event was accepted in it, so every
	// claim delivers; only a receiver that takes more than a turn per
	// request gets a claim per event, a small cost next to that request.
	DefaultTurn = time.Second
	// ErrorPause is how long a subscription waits after a failure on our
	// side (the database, a secret that does not open): not the receiver's
	// doing, so it does not count in the receiver's backoff. A database
	// failure is logged but not recorded as the subscription's; a secret
	// that does not open is (CodeSecretUnavailable), as it will not pass
	// without an operator.
	ErrorPause = 5 * time.Second
	// pageSize is how many events a session reads at once.
	pageSize = 100
)

// CodeSecretUnavailable is the ErrorCode of a subscription whose secret
// (or, during a rotation's grace window, previous secret) does not open:
// sealed under a master key the key file no longer holds, or corrupted. No
// request can be signed until an operator restores the key.
const CodeSecretUnavailable = "secret_unavailable"

// Headers of a delivery besides Vibe-Signature.
const (
	HeaderEventID   = "X-Vibe-Event-Id"
	HeaderEventType = "X-Vibe-Event-Type"
)

// Sender sends one request; *egress.Client is the production one.
type Sender interface {
	Post(ctx context.Context, rawURL string, header http.Header, body []byte, timeout time.Duration) egress.Result
}

// SecretOpener decrypts a subscription's sealed secret (AAD: its id).
type SecretOpener interface {
	Open(s vibejobs.SealedSecret, id string) (string, error)
}

// Store is what delivery needs of a vibejobs.Store.
type Store interface {
	vibejobs.SubscriptionStore
	ListEvents(ctx context.Context, projectID string, f vibejobs.EventFilter) (vibejobs.EventPage, error)
	GetSubscription(ctx context.Context, projectID, id string) (*vibejobs.Subscription, error)
}

// Config of a Deliverer. Store, Sender, Opener and Owner are required.
type Config struct {
	Store  Store
	Sender Sender
	Opener SecretOpener
	// Owner names this process's leases; unique per process. Each claim
	// leases under Owner and a number of its own, so that a subscription
	// claimed again, by this process too, is no longer the former
	// session's to write.
	Owner     string
	UserAgent string
	Logger    *slog.Logger
	Now       func() time.Time
	// Rand returns a uniform number in [0, 1) for the retry jitter.
	Rand         func() float64
	Concurrency  int
	Lease        time.Duration
	PollInterval time.Duration
	Timeout      time.Duration
	// StoreTimeout bounds each store call: a connection gone silent
	// without a reset would otherwise hang a session, and its slot, until
	// TCP gives up.
	StoreTimeout time.Duration
	// Turn bounds a session on a subscription not yet caught up (see
	// DefaultTurn), counted from its claim; a session always sends at
	// least one event, whatever the turn.
	Turn time.Duration
}

// Deliverer works the subscriptions with events to send. Run loops until
// its context ends; RunOnce does one round, for tests.
type Deliverer struct {
	cfg  Config
	wake chan struct{}

	mu       sync.Mutex
	active   int
	sessions sync.WaitGroup
	claims   atomic.Uint64 // numbers each claim's lease owner

	failing health.Streak // of Run's claim passes (see FailingSince)
}

// FailingSince returns when Run's claim passes began to fail against the
// database without one succeeding since; zero while the last one
// succeeded.
func (d *Deliverer) FailingSince() time.Time { return d.failing.Since() }

// New returns a Deliverer with the defaults filled in.
func New(cfg Config) *Deliverer {
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	cfg.Concurrency = cmp.Or(cfg.Concurrency, DefaultConcurrency)
	cfg.Lease = cmp.Or(cfg.Lease, DefaultLease)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, DefaultPollInterval)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.Turn = cmp.Or(cfg.Turn, DefaultTurn)
	cfg.UserAgent = cmp.Or(cfg.UserAgent, "vibejobs/dev")
	cfg.Store = boundedStore{Store: cfg.Store, timeout: cmp.Or(cfg.StoreTimeout, DefaultStoreTimeout)}
	return &Deliverer{cfg: cfg, wake: make(chan struct{}, 1)}
}

// boundedStore bounds each call the Deliverer makes by timeout.
type boundedStore struct {
	Store
	timeout time.Duration
}

func (b boundedStore) ClaimSubscriptions(ctx context.Context, owner string, now time.Time, limit int, lease time.Duration) ([]*vibejobs.Subscription, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.Store.ClaimSubscriptions(ctx, owner, now, limit, lease)
}

func (b boundedStore) RecordSubscriptionStep(ctx context.Context, owner string, st vibejobs.SubscriptionStep) (*vibejobs.Subscription, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.Store.RecordSubscriptionStep(ctx, owner, st)
}

func (b boundedStore) ListEvents(ctx context.Context, projectID string, f vibejobs.EventFilter) (vibejobs.EventPage, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.Store.ListEvents(ctx, projectID, f)
}

func (b boundedStore) GetSubscription(ctx context.Context, projectID, id string) (*vibejobs.Subscription, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.Store.GetSubscription(ctx, projectID, id)
}

// Wake asks the Deliverer to look for new events now.
func (d *Deliverer) Wake() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Run claims and works subscriptions until ctx is done. Then it claims no
// more, lets the requests in flight finish within their budget, records
// their steps and returns.
func (d *Deliverer) Run(ctx context.Context) {
	defer d.sessions.Wait()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		wait := d.cfg.PollInterval
		err := d.claim(ctx, nil)
		d.failing.Pass(d.cfg.Now(), err, ctx.Err())
		if err != nil && ctx.Err() == nil {
			d.cfg.Logger.Error("subscription.claim_failed", "error", err)
			wait = ErrorPause
		}
		timer.Reset(wait) // Go ≥ 1.23: no stale tick survives a Reset
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		case <-timer.C:
		}
	}
}

// RunOnce claims the subscriptions due now and works each until it is
// caught up or fails, then returns. While a session yielded at the end of
// its turn, it claims again (least recently served first, so those left
// out by the first claim may go before). Tests drive delivery with it.
func (d *Deliverer) RunOnce(ctx context.Context) error {
	for {
		var r round
		err := d.claim(ctx, &r)
		r.wg.Wait()
		if err != nil || !r.yielded.Load() || ctx.Err() != nil {
			return err
		}
	}
}

// round is what RunOnce waits for: the sessions of one claim, and whether
// one of them yielded at the end of its turn.
type round struct {
	wg      sync.WaitGroup
	yielded atomic.Bool
}

// claim leases what there is room for and starts a session for each. Each
// session is also counted in r, when set.
func (d *Deliverer) claim(ctx context.Context, r *round) error {
	d.mu.Lock()
	free := d.cfg.Concurrency - d.active
	d.mu.Unlock()
	if free <= 0 {
		return nil // a session that ends wakes us
	}
	// A lease owner of this claim alone: a session whose lease expired
	// (its database calls were slow) while it still worked finds, at its
	// next step, that the lease is no longer its own, and stops, though
	// the new claim was this process's.
	owner := d.cfg.Owner + "/" + strconv.FormatUint(d.claims.Add(1), 10)
	now := d.cfg.Now()
	subs, err := d.cfg.Store.ClaimSubscriptions(ctx, owner, now, free, d.cfg.Lease)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.active += len(subs)
	d.mu.Unlock()
	for _, sub := range subs {
		d.sessions.Add(1)
		if r != nil {
			r.wg.Add(1)
		}
		go func() {
			var yielded bool
			defer func() {
				d.mu.Lock()
				d.active--
				d.mu.Unlock()
				d.Wake()
				d.sessions.Done()
				if r != nil {
					if yielded {
						r.yielded.Store(true)
					}
					r.wg.Done()
				}
			}()
			yielded = d.work(ctx, sub, owner, now)
		}()
	}
	return nil
}

// work sends sub's events after its cursor, one at a time, until it is
// caught up, a request fails, it loses the lease, its turn is over or ctx
// ends, and reports whether it yielded at the end of its turn (sub has
// events left to send). The store calls and the request in flight do not
// end with ctx: a shutdown lets them finish, so the lease is left released
// and the cursor where it belongs.
func (d *Deliverer) work(ctx context.Context, sub *vibejobs.Subscription, owner string, claimedAt time.Time) (yielded bool) {
	ss := &session{d: d, ctx: context.WithoutCancel(ctx), owner: owner, leaseUntil: claimedAt.Add(d.cfg.Lease),
		turnEnds: claimedAt.Add(d.cfg.Turn), sub: sub, cursor: sub.Cursor, written: sub.Cursor, lastWrite: d.cfg.Now()}
	for {
		if ctx.Err() != nil {
			ss.release()
			return false
		}
		page, err := d.cfg.Store.ListEvents(ss.ctx, sub.ProjectID, vibejobs.EventFilter{After: ss.cursor, Limit: pageSize})
		if err != nil {
			ss.ownFailure(err)
			return false
		}
		if len(page.Events) == 0 {
			if page.Next > ss.cursor {
				// Sequences without events (none are, but a feed with a
				// hole must not hold the subscription): move past them.
				ss.cursor = page.Next
				continue
			}
			ss.release()
			return false
		}
		for _, e := range page.Events {
			if ctx.Err() != nil {
				break // released at the top of the loop
			}
			if e.Sequence <= ss.cursor {
				continue
			}
			if !ss.sub.Matches(e) {
				ss.cursor = e.Sequence // passed over without a request
				continue
			}
			if ss.accepted > 0 && !d.cfg.Now().Before(ss.turnEnds) {
				// Turn over, with e still to send: write the cursor and
				// give the lease back in one step, then send nothing more,
				// so whoever claims next (another subscription first, as
				// the claim takes the least recently served) starts where
				// this session stopped and never alongside it. A failed
				// write leaves the lease ours until it expires: no one
				// sends meanwhile, and the events after the cursor last
				// written go again.
				ss.release()
				return true
			}
			if !ss.deliver(e) {
				return false
			}
			if ss.sub.Cursor > ss.cursor {
				// Reset while we worked: go on from the head it chose.
				ss.cursor = ss.sub.Cursor
				break
			}
		}
		// A page done: the cursor is written before the next is read.
		if ss.cursor > ss.written && !ss.flush() {
			return false
		}
	}
}

// cursorWriteEvery bounds how long accepted events may wait for their
// cursor write while a session streams: the cursor is written after the
// first success of a failing subscription, at least this often, at the end
// of each page and when the session ends. A crash in between sends those
// events again under the same ids (at least once); writing after every
// event would cost a commit per event and, in a burst, compete with the
// run deliveries' own writes.
const cursorWriteEvery = 100 * time.Millisecond

// session is one claim of a subscription: the events handled (cursor) run
// ahead of what is written (written) by at most a page or cursorWriteEvery.
type session struct {
	d          *Deliverer
	ctx        context.Context
	owner      string                 // the lease owner of the claim
	leaseUntil time.Time              // the end of the lease as last written
	turnEnds   time.Time              // when the session yields, if it has events left
	accepted   int                    // events the receiver accepted in this session
	sub        *vibejobs.Subscription // as last read or written
	cursor     int64                  // the last event handled: accepted, or passed over by the filters
	written    int64                  // the cursor as last written
	delivered  bool                   // an event was accepted since the last write
	lastWrite  time.Time
}

// deliver sends e; after a 2xx it moves the cursor (and writes it when due)
// and reports true; on a failure it records the step, releasing the lease,
// and reports false, as it does when the session must end otherwise.
func (ss *session) deliver(e *vibejobs.Event) bool {
	d := ss.d
	if cur, err := d.cfg.Store.GetSubscription(ss.ctx, ss.sub.ProjectID, ss.sub.ID); err != nil || !cur.UpdatedAt.Equal(ss.sub.UpdatedAt) {
		// Deleted or changed (reset, new URL, filters, secret) since the
		// session read it: write what was handled and let a fresh claim
		// go on with the subscription as it is now.
		if err == nil || vibejobs.ErrorKind(err) == vibejobs.ENOTFOUND {
			ss.release()
		} else {
			ss.ownFailure(err)
		}
		return false
	}
	if d.cfg.Now().Add(d.cfg.Timeout).After(ss.leaseUntil) {
		// The lease could end while the request is in flight, and another
		// replica, claiming the subscription then, send the same events
		// alongside: renew it first (slow database calls used it up). A
		// change that lands meanwhile ends the session, as above.
		seen := ss.sub.UpdatedAt
		if !ss.flush() {
			return false
		}
		if !ss.sub.UpdatedAt.Equal(seen) {
			ss.release()
			return false
		}
	}
	body := feed.Body(e)
	header, err := d.sign(ss.sub, e, body, d.cfg.Now())
	if err != nil {
		ss.secretUnavailable(e.Sequence, err)
		return false
	}
	res := d.cfg.Sender.Post(ss.ctx, ss.sub.URL, header, body, d.cfg.Timeout)
	now := d.cfg.Now()
	if res.ErrorCode != "" {
		// A failure after events accepted or passed over is the first at
		// its event (the store restarts the count when the cursor moves).
		attempts := 1
		if ss.cursor <= ss.sub.Cursor {
			attempts = ss.sub.Attempts + 1
		}
		retryAt := now.Add(vibejobs.SubscriptionRetryPause(attempts, d.cfg.Rand()))
		_, err := d.cfg.Store.RecordSubscriptionStep(ss.ctx, ss.owner, vibejobs.SubscriptionStep{
			ID: ss.sub.ID, At: now, Cursor: ss.cursor, Delivered: ss.delivered,
			ErrorCode: res.ErrorCode, NextAttemptAt: retryAt, Seen: ss.sub.UpdatedAt,
		})
		d.logStepFailed(ss.sub, e.Sequence, res.ErrorCode, res.StatusCode, attempts, &retryAt, err)
		return false
	}
	ss.cursor, ss.delivered = e.Sequence, true
	ss.accepted++
	if ss.sub.Failing() || now.Sub(ss.lastWrite) >= cursorWriteEvery {
		return ss.flush()
	}
	return true
}

// flush writes the cursor and renews the lease. It reports false when the
// session must end: the write failed, the lease was lost or the
// subscription deleted.
func (ss *session) flush() bool {
	d := ss.d
	now := d.cfg.Now()
	wasFailing := ss.sub.Failing()
	next, err := d.cfg.Store.RecordSubscriptionStep(ss.ctx, ss.owner, vibejobs.SubscriptionStep{
		ID: ss.sub.ID, At: now, Cursor: ss.cursor, Delivered: ss.delivered, LeaseUntil: now.Add(d.cfg.Lease),
	})
	if err != nil {
		// The receiver has the events but the cursor did not move: they
		// are sent again, under the same ids, once the lease expires.
		d.logStepFailed(ss.sub, ss.cursor, errorCodeOf(err), 0, ss.sub.Attempts, nil, err)
		return false
	}
	if next == nil {
		return false // deleted, or the lease went to another claim
	}
	if next.Cursor > ss.cursor {
		// Reset while we worked: the events up to the head it chose are
		// skipped for good; go on from there.
		ss.cursor = next.Cursor
	}
	if wasFailing && ss.delivered {
		d.cfg.Logger.Info("subscription.recovered", "subscription", ss.sub.ID, "project", ss.sub.ProjectID,
			"sequence", ss.cursor, "failed_attempts", ss.sub.Attempts)
	}
	ss.sub, ss.written, ss.delivered, ss.lastWrite = next, ss.cursor, false, now
	ss.leaseUntil = now.Add(d.cfg.Lease)
	return true
}

// release writes the cursor and gives the lease back.
func (ss *session) release() {
	d := ss.d
	_, err := d.cfg.Store.RecordSubscriptionStep(ss.ctx, ss.owner, vibejobs.SubscriptionStep{
		ID: ss.sub.ID, At: d.cfg.Now(), Cursor: ss.cursor, Delivered: ss.delivered,
	})
	if err != nil {
		d.cfg.Logger.Error("subscription.release_failed", "subscription", ss.sub.ID, "project", ss.sub.ProjectID, "error", err)
	}
}

// ownFailure ends a session on a failure of ours: it is logged, not recorded
// as the subscription's, and the subscription is tried again after
// ErrorPause (its lease is kept until then, so no replica spins on it).
func (ss *session) ownFailure(err error) {
	d := ss.d
	d.logStepFailed(ss.sub, ss.cursor+1, errorCodeOf(err), 0, ss.sub.Attempts, nil, err)
	now := d.cfg.Now()
	_, _ = d.cfg.Store.RecordSubscriptionStep(ss.ctx, ss.owner, vibejobs.SubscriptionStep{
		ID: ss.sub.ID, At: now, Cursor: ss.cursor, Delivered: ss.delivered, LeaseUntil: now.Add(ErrorPause),
	})
}

// secretUnavailable ends a session whose secret does not open (sign's only
// failure). It is ours, retried after ErrorPause and not counted in the
// receiver's attempts, but it will not pass by itself: the subscription is
// marked failing with CodeSecretUnavailable, where the API and the metrics
// show it, and the log says so once, when the subscription starts failing
// so, not at every retry.
func (ss *session) secretUnavailable(seq int64, err error) {
	d := ss.d
	if ss.sub.ErrorCode != CodeSecretUnavailable {
		// Secretbox errors name no secret and no key.
		d.cfg.Logger.Error("subscription.secret_unavailable", "subscription", ss.sub.ID, "project", ss.sub.ProjectID,
			"sequence", seq, "error", err.Error())
	}
	now := d.cfg.Now()
	_, err = d.cfg.Store.RecordSubscriptionStep(ss.ctx, ss.owner, vibejobs.SubscriptionStep{
		ID: ss.sub.ID, At: now, Cursor: ss.cursor, Delivered: ss.delivered,
		ErrorCode: CodeSecretUnavailable, Unsent: true, NextAttemptAt: now.Add(ErrorPause), Seen: ss.sub.UpdatedAt,
	})
	if err != nil {
		d.logStepFailed(ss.sub, seq, errorCodeOf(err), 0, ss.sub.Attempts, nil, err)
	}
}

// errorCodeOf names a failure of ours in the log: unavailable (the
// database) or internal.
func errorCodeOf(err error) string {
	if vibejobs.ErrorKind(err) == vibejobs.EUNAVAILABLE {
		return "unavailable"
	}
	return "internal"
}

// sign returns the headers of e's request, signed at now with the current
// secret and, during a rotation's grace window, the previous one as a
// second v1= value. Its only error is a current secret that does not open.
// A previous secret that does not open is left out: it is a courtesy to
// receivers still switching, and the usual reason for it is the one a
// rotation repairs (a secret sealed under a master key the key file lost),
// so failing on it would hold a subscription the operator just revived
// for the whole grace window. Secrets are re-sealed together, so a
// previous secret fails alone only once its key is gone for good.
func (d *Deliverer) sign(sub *vibejobs.Subscription, e *vibejobs.Event, body []byte, now time.Time) (http.Header, error) {
	secret, err := d.cfg.Opener.Open(sub.Secret, sub.ID)
	if err != nil {
		return nil, err
	}
	ts := now.Unix()
	sig := contract.AppendSignature(make([]byte, 0, 180), secret, ts, body)
	if sub.PreviousSecret.KeyID != "" && sub.PreviousExpiresAt != nil && now.Before(*sub.PreviousExpiresAt) {
		if prev, err := d.cfg.Opener.Open(sub.PreviousSecret, sub.ID); err == nil && prev != secret {
			other := contract.Sign(prev, ts, body)
			sig = append(sig, other[strings.Index(other, ",v1="):]...)
		}
	}
	return http.Header{
		"Content-Type":   {contract.ContentType},
		"User-Agent":     {d.cfg.UserAgent},
		HeaderEventID:    {feed.EventID(e)},
		HeaderEventType:  {string(e.Type)},
		"Vibe-Signature": {string(sig)},
	}, nil
}

// logStepFailed logs a failed step: ids, codes and counts only, never the
// URL, the secret or a body (egress errors name neither URL nor address).
func (d *Deliverer) logStepFailed(sub *vibejobs.Subscription, seq int64, code string, status, attempts int, next *time.Time, err error) {
	attrs := []any{"subscription", sub.ID, "project", sub.ProjectID, "sequence", seq, "error_code", code,
		"attempts", attempts}
	if status != 0 {
		attrs = append(attrs, "status", status)
	}
	if next != nil {
		attrs = append(attrs, "next_attempt_at", next.UTC().Format(time.RFC3339))
	}
	if err != nil {
		// Store and secretbox errors name no URL, secret or body.
		attrs = append(attrs, "error", err.Error())
	}
	d.cfg.Logger.Warn("subscription.step_failed", attrs...)
}
