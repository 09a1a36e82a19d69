package receiver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Retention bounds. Receipts must outlive the platform's history retention
// (90 days by default, at least 7) and so the 96-hour delivery lifetime: a
// receipt deleted while the platform may still retry its run would let a
// repeat through as new work.
const (
	DefaultRetention          = 90 * 24 * time.Hour
	MinRetention              = 7 * 24 * time.Hour
	DefaultRetentionBatchSize = 1000
	DefaultRetentionInterval  = time.Hour
)

// RetentionConfig configures [NewRetention].
type RetentionConfig struct {
	// Store deletes processed records. Required.
	Store RetentionStore
	// Period is how long processed records are kept after processing. Zero
	// means DefaultRetention; less than MinRetention is an error.
	Period time.Duration
	// BatchSize is the most rows one delete statement removes.
	BatchSize int
	// Interval is the wait between runs of Run.
	Interval time.Duration
	// Now is the clock. Default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Retention deletes processed records older than the retention period: only
// processed ones, never unfinished work, outbox items first, then acceptance
// records, in batches.
type Retention struct {
	store    RetentionStore
	period   time.Duration
	batch    int
	interval time.Duration
	now      func() time.Time
	log      *slog.Logger
}

// NewRetention returns a Retention for cfg, filling defaults.
func NewRetention(cfg RetentionConfig) (*Retention, error) {
	if cfg.Store == nil {
		return nil, errors.New("receiver: RetentionConfig.Store is required")
	}
	period := cmp.Or(cfg.Period, DefaultRetention)
	if period < MinRetention {
		return nil, fmt.Errorf("receiver: retention %v is shorter than the minimum %v", period, MinRetention)
	}
	if cfg.BatchSize < 0 || cfg.Interval < 0 {
		return nil, errors.New("receiver: negative RetentionConfig value")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Retention{
		store:    cfg.Store,
		period:   period,
		batch:    cmp.Or(cfg.BatchSize, DefaultRetentionBatchSize),
		interval: cmp.Or(cfg.Interval, DefaultRetentionInterval),
		now:      cfg.Now,
		log:      cmp.Or(cfg.Logger, slog.Default()),
	}, nil
}

// errRetentionNotConfigured is the error of a Retention not made with
// NewRetention (a zero Retention, a nil *Retention): it has no store.
var errRetentionNotConfigured = errors.New("receiver: the Retention was not made with NewRetention: it has no store")

// configured returns errRetentionNotConfigured unless NewRetention made r.
func (r *Retention) configured() error {
	if r == nil || r.store == nil {
		return errRetentionNotConfigured
	}
	return nil
}

// RunOnce deletes every record processed before now − Period: all such outbox
// items first, then the acceptance records left without an item. A Retention
// not made with [NewRetention] deletes nothing and returns an error.
func (r *Retention) RunOnce(ctx context.Context) (outbox, runs int, err error) {
	if err := r.configured(); err != nil {
		return 0, 0, err
	}
	cutoff := r.now().Add(-r.period)
	for {
		n, err := r.store.DeleteProcessedOutbox(ctx, cutoff, r.batch)
		outbox += n
		if err != nil {
			return outbox, runs, fmt.Errorf("deleting processed outbox items: %w", err)
		}
		if n < r.batch {
			break
		}
	}
	for {
		n, err := r.store.DeleteProcessedRuns(ctx, cutoff, r.batch)
		runs += n
		if err != nil {
			return outbox, runs, fmt.Errorf("deleting processed acceptance records: %w", err)
		}
		if n < r.batch {
			break
		}
	}
	return outbox, runs, nil
}

// Run calls RunOnce every Interval until ctx ends, then returns nil. A
// Retention not made with [NewRetention] returns an error at once.
func (r *Retention) Run(ctx context.Context) error {
	if err := r.configured(); err != nil {
		return err
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		outbox, runs, err := r.RunOnce(ctx)
		if err != nil && ctx.Err() == nil {
			r.log.LogAttrs(ctx, slog.LevelError, "retention", slog.String("error", err.Error()))
		} else if outbox+runs > 0 {
			r.log.LogAttrs(ctx, slog.LevelInfo, "retention deleted processed records", slog.Int("outbox_items", outbox), slog.Int("accepted_runs", runs))
		}
		timer.Reset(r.interval)
	}
}
