// Package subscriptions delivers a project's event feed to its subscriptions
// (webhooks): per subscription, one event at a time in sequence order, signed
// with the subscription's secret and sent through the egress client.
//
// The promise is at least once, in order, never skipping: the cursor moves
// only after the receiver answered 2xx (or past an event the filters
// exclude, without a request), so an event is sent again, under the same
// id, until it is accepted; a process that dies between the receiver's 2xx
// and the cursor write leaves the event to be sent again by whoever takes
// the subscription over. A receiver that keeps refusing one event holds its
// subscription there, retried after 12 s doubling up to 1 h (±20 %), while
// every other subscription goes on: each is worked in its own goroutine,
// and a failing one waits in the database, not in a worker.
//
// Replicas share the work through a lease on the subscription row: one
// replica at a time works a subscription, and a lease left by a dead
// process expires.
package subscriptions

import (
	"cmp"
	"context"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/egress"
	"github.com/vibejobs/vibejobs/internal/feed"
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
	// ErrorPause is how long a subscription waits after a failure on our
	// side (the database, a secret that does not open): not the receiver's
	// doing, so it is logged but not recorded as the subscription's failure.
	ErrorPause = 5 * time.Second
	// pageSize is how many events a session reads at once.
	pageSize = 100
)

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
}

// Config of a Deliverer. Store, Sender, Opener and Owner are required.
type Config struct {
	Store  Store
	Sender Sender
	Opener SecretOpener
	// Owner names this process's leases; unique per process.
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
}

// Deliverer works the subscriptions with events to send. Run loops until
// its context ends; RunOnce does one round, for tests.
type Deliverer struct {
	cfg  Config
	wake chan struct{}

	mu       sync.Mutex
	active   int
	sessions sync.WaitGroup
}

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
	cfg.UserAgent = cmp.Or(cfg.UserAgent, "vibejobs/dev")
	return &Deliverer{cfg: cfg, wake: make(chan struct{}, 1)}
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
		if err := d.claim(ctx, nil); err != nil && ctx.Err() == nil {
			d.cfg.Logger.Error("subscription.claim_failed", "error", err)
			wait = ErrorPause
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		case <-timer.C:
		}
	}
}

// RunOnce claims the subscriptions due now and works each until it is
// caught up or fails, then returns. Tests drive delivery with it.
func (d *Deliverer) RunOnce(ctx context.Context) error {
	var wg sync.WaitGroup
	err := d.claim(ctx, &wg)
	wg.Wait()
	return err
}

// claim leases what there is room for and starts a session for each. Each
// session is also counted in wg, when set.
func (d *Deliverer) claim(ctx context.Context, wg *sync.WaitGroup) error {
	d.mu.Lock()
	free := d.cfg.Concurrency - d.active
	d.mu.Unlock()
	if free <= 0 {
		return nil // a session that ends wakes us
	}
	subs, err := d.cfg.Store.ClaimSubscriptions(ctx, d.cfg.Owner, d.cfg.Now(), free, d.cfg.Lease)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.active += len(subs)
	d.mu.Unlock()
	for _, sub := range subs {
		d.sessions.Add(1)
		if wg != nil {
			wg.Add(1)
		}
		go func() {
			defer func() {
				d.mu.Lock()
				d.active--
				d.mu.Unlock()
				d.Wake()
				d.sessions.Done()
				if wg != nil {
					wg.Done()
				}
			}()
			d.work(ctx, sub)
		}()
	}
	return nil
}

// work sends sub's events after its cursor, one at a time, until it is
// caught up, a request fails, it loses the lease or ctx ends. The store
// calls and the request in flight do not end with ctx: a shutdown lets them
// finish, so the lease is left released and the cursor where it belongs.
func (d *Deliverer) work(ctx context.Context, sub *vibejobs.Subscription) {
	bg := context.WithoutCancel(ctx)
	cursor := sub.Cursor // the last event handled, possibly ahead of sub.Cursor (filtered ones)
	for {
		if ctx.Err() != nil {
			d.release(bg, sub, cursor)
			return
		}
		page, err := d.cfg.Store.ListEvents(bg, sub.ProjectID, vibejobs.EventFilter{After: cursor, Limit: pageSize})
		if err != nil {
			d.ownFailure(bg, sub, cursor, err)
			return
		}
		if len(page.Events) == 0 {
			d.release(bg, sub, cursor)
			return
		}
		for _, e := range page.Events {
			if ctx.Err() != nil {
				break // released at the top of the loop
			}
			if e.Sequence <= cursor {
				continue
			}
			if !sub.Matches(e) {
				cursor = e.Sequence
				continue
			}
			next, ok := d.deliver(bg, sub, cursor, e)
			if !ok {
				return
			}
			sub = next
			cursor = max(cursor, e.Sequence)
			if sub.Cursor > cursor {
				// Reset while we worked: go on from the head it chose.
				cursor = sub.Cursor
				break
			}
		}
	}
}

// deliver sends e and records the step. It returns the subscription as
// stored after a 2xx, or false when the session ends (a failure, lost
// lease, deleted subscription).
func (d *Deliverer) deliver(ctx context.Context, sub *vibejobs.Subscription, cursor int64, e *vibejobs.Event) (*vibejobs.Subscription, bool) {
	body := feed.Body(e)
	header, err := d.sign(sub, e, body, d.cfg.Now())
	if err != nil {
		d.ownFailure(ctx, sub, cursor, err)
		return nil, false
	}
	res := d.cfg.Sender.Post(ctx, sub.URL, header, body, d.cfg.Timeout)
	now := d.cfg.Now()
	if res.ErrorCode == "" {
		next, err := d.cfg.Store.RecordSubscriptionStep(ctx, d.cfg.Owner, vibejobs.SubscriptionStep{
			ID: sub.ID, At: now, Cursor: e.Sequence, Delivered: true, LeaseUntil: now.Add(d.cfg.Lease),
		})
		if err != nil {
			// The receiver has the event but the cursor did not move: it
			// is sent again, under the same id, once the lease expires.
			d.logStepFailed(sub, e.Sequence, "unavailable", 0, sub.Attempts, nil, err)
			return nil, false
		}
		if next == nil {
			return nil, false // deleted, or the lease went to another replica
		}
		if sub.Failing() {
			d.cfg.Logger.Info("subscription.recovered", "subscription", sub.ID, "project", sub.ProjectID,
				"sequence", e.Sequence, "failed_attempts", sub.Attempts)
		}
		return next, true
	}
	attempts := sub.Attempts + 1
	retryAt := now.Add(vibejobs.Jitter(vibejobs.SubscriptionBackoff(attempts), d.cfg.Rand()))
	_, err = d.cfg.Store.RecordSubscriptionStep(ctx, d.cfg.Owner, vibejobs.SubscriptionStep{
		ID: sub.ID, At: now, Cursor: cursor, ErrorCode: res.ErrorCode, NextAttemptAt: retryAt,
	})
	d.logStepFailed(sub, e.Sequence, res.ErrorCode, res.StatusCode, attempts, &retryAt, err)
	return nil, false
}

// sign returns the headers of e's request, signed at now with the current
// secret and, during a rotation's grace window, the previous one as a
// second v1= value.
func (d *Deliverer) sign(sub *vibejobs.Subscription, e *vibejobs.Event, body []byte, now time.Time) (http.Header, error) {
	secret, err := d.cfg.Opener.Open(sub.Secret, sub.ID)
	if err != nil {
		return nil, err
	}
	ts := now.Unix()
	sig := contract.AppendSignature(make([]byte, 0, 180), secret, ts, body)
	if sub.PreviousSecret.KeyID != "" && sub.PreviousExpiresAt != nil && now.Before(*sub.PreviousExpiresAt) {
		prev, err := d.cfg.Opener.Open(sub.PreviousSecret, sub.ID)
		if err != nil {
			return nil, err
		}
		if prev != secret {
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

// release writes the cursor past filtered events and gives the lease back.
func (d *Deliverer) release(ctx context.Context, sub *vibejobs.Subscription, cursor int64) {
	_, err := d.cfg.Store.RecordSubscriptionStep(ctx, d.cfg.Owner, vibejobs.SubscriptionStep{
		ID: sub.ID, At: d.cfg.Now(), Cursor: cursor,
	})
	if err != nil {
		d.cfg.Logger.Error("subscription.release_failed", "subscription", sub.ID, "project", sub.ProjectID, "error", err)
	}
}

// ownFailure ends a session on a failure of ours: it is logged, not recorded
// as the subscription's, and the subscription is tried again after
// ErrorPause (its lease is kept until then, so no replica spins on it).
func (d *Deliverer) ownFailure(ctx context.Context, sub *vibejobs.Subscription, cursor int64, err error) {
	code := "internal"
	if vibejobs.ErrorKind(err) == vibejobs.EUNAVAILABLE {
		code = "unavailable"
	}
	d.logStepFailed(sub, cursor+1, code, 0, sub.Attempts, nil, err)
	now := d.cfg.Now()
	_, _ = d.cfg.Store.RecordSubscriptionStep(ctx, d.cfg.Owner, vibejobs.SubscriptionStep{
		ID: sub.ID, At: now, Cursor: cursor, LeaseUntil: now.Add(ErrorPause),
	})
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
