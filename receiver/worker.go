package receiver

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vibejobs/vibejobs/contract"
)

// ProcessFunc does the app's work for one accepted run. runID is the
// idempotency key for every external effect: an item can run more than once
// (a worker that dies after the effect and before recording success, a lease
// that expires while the function still runs), and an outbox cannot prevent
// that. payload is the delivery body, byte for byte as the platform signed it.
// ctx ends when the item's lease ends or the worker stops. An error returned
// once the worker has stopped is taken for the stop's doing: the item is
// given back for an immediate retry without counting the attempt (see
// [Worker.ProcessBatch]).
type ProcessFunc func(ctx context.Context, runID string, payload []byte) error

// Worker defaults.
const (
	DefaultLease        = time.Minute
	DefaultPollInterval = time.Second
	DefaultConcurrency  = 1
)

// storeCallTimeout bounds recording an outcome after the worker's context
// ended, so that work done during a shutdown is not lost for want of a context.
const storeCallTimeout = 10 * time.Second

// DefaultBackoff is the delay before retrying an item whose attempt-th run
// failed: 5 s doubling per attempt, at most 1 h.
func DefaultBackoff(attempt int) time.Duration {
	const base, limit = 5 * time.Second, time.Hour
	if attempt < 1 {
		attempt = 1
	}
	if attempt > 20 {
		return limit
	}
	return min(base<<(attempt-1), limit)
}

// WorkerConfig configures [NewWorker].
type WorkerConfig struct {
	// Outbox is the queue to drain. Required.
	Outbox Outbox
	// Process is the app's work. Required.
	Process ProcessFunc
	// ID names this worker in lease columns: it must be unique among every
	// Worker sharing the outbox, in this process or another, since a lease
	// is checked by its holder and two Workers with one ID could end each
	// other's leases. Each claim holds its items as ID followed by "#" and
	// the claim's sequence number in this Worker, so that an item whose
	// lease ran out and which this Worker claimed again is held by the new
	// claim alone. It must be valid UTF-8 without NUL bytes, which
	// PostgreSQL's text columns refuse. Default: host name, process id and
	// random bytes.
	ID string
	// Lease is how long a claimed item stays reserved for this worker; after it
	// any worker may claim the item again. Process must finish within it.
	Lease time.Duration
	// Concurrency is how many items one batch claims and runs in parallel.
	Concurrency int
	// PollInterval is the wait between batches when the outbox had less work
	// than Concurrency.
	PollInterval time.Duration
	// Backoff gives the delay before the next claim of an item whose attempt-th
	// run failed. Default DefaultBackoff. Items are retried until they succeed.
	Backoff func(attempt int) time.Duration
	// Now is the clock for leases and retries. Default time.Now.
	Now func() time.Time
	// Logger gets one line per item outcome: the run id and attempt, never
	// the payload, and for a failure the error the ProcessFunc returned (or
	// its panic's value), which is the app's to keep free of secrets.
	Logger *slog.Logger
}

// Worker claims outbox items and runs the app's ProcessFunc on them. Several
// workers, in one or many processes, may share one database.
type Worker struct {
	outbox      Outbox
	process     ProcessFunc
	id          string
	lease       time.Duration
	concurrency int
	poll        time.Duration
	backoff     func(int) time.Duration
	now         func() time.Time
	log         *slog.Logger
	// claims numbers this Worker's claims (see WorkerConfig.ID).
	claims atomic.Uint64
}

// NewWorker returns a Worker for cfg, filling defaults.
func NewWorker(cfg WorkerConfig) (*Worker, error) {
	if cfg.Outbox == nil || cfg.Process == nil {
		return nil, errors.New("receiver: WorkerConfig.Outbox and Process are required")
	}
	if cfg.Lease < 0 || cfg.Concurrency < 0 || cfg.PollInterval < 0 {
		return nil, errors.New("receiver: negative WorkerConfig value")
	}
	if !isText(cfg.ID) {
		return nil, errors.New("receiver: WorkerConfig.ID is not UTF-8 text without NUL bytes")
	}
	id := cfg.ID
	if id == "" {
		host, _ := os.Hostname()
		var b [4]byte
		rand.Read(b[:])
		id = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if cfg.Backoff == nil {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Worker{
		outbox:      cfg.Outbox,
		process:     cfg.Process,
		id:          id,
		lease:       cmp.Or(cfg.Lease, DefaultLease),
		concurrency: cmp.Or(cfg.Concurrency, DefaultConcurrency),
		poll:        cmp.Or(cfg.PollInterval, DefaultPollInterval),
		backoff:     cfg.Backoff,
		now:         cfg.Now,
		log:         cmp.Or(cfg.Logger, slog.Default()),
	}, nil
}

// ID returns the worker's id, which the lease columns record followed by
// "#" and the number of the claim (see WorkerConfig.ID); "" for a Worker
// not made with [NewWorker].
func (w *Worker) ID() string {
	if w == nil {
		return ""
	}
	return w.id
}

// errWorkerNotConfigured is the error of a Worker not made with NewWorker
// (a zero Worker, a nil *Worker): it has no outbox to claim from and no
// function to run.
var errWorkerNotConfigured = errors.New("receiver: the Worker was not made with NewWorker: it has no Outbox or ProcessFunc")

// configured returns errWorkerNotConfigured unless NewWorker made w.
func (w *Worker) configured() error {
	if w == nil || w.outbox == nil || w.process == nil {
		return errWorkerNotConfigured
	}
	return nil
}

// ProcessBatch claims up to Concurrency due items, runs them in parallel and
// records each outcome: processed on success (even one that returned after
// ctx ended), a retry after Backoff on failure. Only an attempt that ran the
// app's function to a result counts: an item that ctx, the worker's stop, kept
// from one (ctx ended before its function began, or its function returned an
// error once ctx had ended) is given back with [Outbox.ReleaseOutbox], due
// again at once, and its next claim carries the same attempt number. It
// returns once every item it claimed is recorded, with how many it claimed and
// the errors of claiming or recording (not the app's errors, which are
// recorded on the item and logged). Calls must not overlap, nor run beside
// Run: Concurrency bounds the items a Worker runs at once. A Worker not made
// with [NewWorker] claims nothing and returns an error.
func (w *Worker) ProcessBatch(ctx context.Context) (int, error) {
	if err := w.configured(); err != nil {
		return 0, err
	}
	items, holder, end, err := w.claim(ctx, w.concurrency)
	if err != nil || len(items) == 0 {
		return len(items), err
	}
	errs := make([]error, len(items))
	var wg sync.WaitGroup
	for i, it := range items {
		wg.Go(func() { errs[i] = w.runItem(ctx, it, holder, end) })
	}
	wg.Wait()
	return len(items), errors.Join(errs...)
}

// claim leases up to limit due items and returns them with their holder,
// the name of this claim in the lease columns, and the time on this
// process's clock at which their lease ends: the app's context ends then,
// so that a function whose goroutine started late (it waited for a core)
// still stops with the lease, not that long after it. A claim that
// outlasted the lease returns the items it claimed (for the count) with an
// error, and they must not be run: it gives them back (ReleaseOutbox),
// without the attempts it counted, unless another claim holds them since.
//
// Each claim has its own holder: a function that outlives its lease (it
// ignored its context) could otherwise, on failing, end the lease of this
// Worker's next claim of the same item, and let a third claim run it beside
// the second.
func (w *Worker) claim(ctx context.Context, limit int) ([]OutboxItem, string, time.Time, error) {
	holder := w.id + "#" + strconv.FormatUint(w.claims.Add(1), 10)
	// Read before the lease's clock: with the default clock (time.Now) the
	// lease ends no earlier than end.
	start := time.Now()
	now := w.now()
	leaseUntil := now.Add(w.lease)
	items, err := w.outbox.ClaimOutbox(ctx, holder, now, leaseUntil, limit)
	if err != nil {
		return nil, "", time.Time{}, fmt.Errorf("claiming outbox items: %w", err)
	}
	// The app's context ends with the lease, which began before the claim:
	// after it another worker may claim the item. By both clocks, for
	// WorkerConfig.Now may be another than the one contexts run on.
	left := leaseUntil.Sub(w.now())
	end := start.Add(w.lease)
	if e := time.Now().Add(left); e.Before(end) {
		end = e
	}
	if !time.Now().Before(end) && len(items) > 0 {
		// The claim outlasted the lease: the items are another worker's to
		// claim already, and are left to it. Those no worker has claimed
		// since go back uncharged: their attempt never ran.
		errs := []error{fmt.Errorf("claiming outbox items took longer than the lease (%v): none run", w.lease)}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeCallTimeout)
		defer cancel()
		for _, it := range items {
			if err := w.outbox.ReleaseOutbox(sctx, it.RunID, holder); err != nil {
				errs = append(errs, fmt.Errorf("giving back run %s: %w", it.RunID, err))
			}
		}
		return items, holder, time.Time{}, errors.Join(errs...)
	}
	return items, holder, end, nil
}

// runItem runs one item, which holder's claim holds, until end, when its
// lease ends, at the latest, and records its outcome (see ProcessBatch).
func (w *Worker) runItem(ctx context.Context, it OutboxItem, holder string, end time.Time) error {
	var err error
	ran := ctx.Err() == nil
	if ran {
		pctx, cancel := context.WithDeadline(ctx, end)
		err = w.call(pctx, it.RunID, canonicalPayload(it.RunID, it.Payload))
		cancel()
	}
	// Read as soon as the function returned: a failure of its own that came
	// before a later stop still counts.
	stopped := ctx.Err() != nil

	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), storeCallTimeout)
	defer scancel()
	switch {
	case ran && err == nil:
		if err := w.outbox.CompleteOutbox(sctx, it.RunID, w.now()); err != nil {
			return fmt.Errorf("recording run %s as processed: %w", it.RunID, err)
		}
		w.log.LogAttrs(ctx, slog.LevelInfo, "outbox item processed", slog.String("run_id", it.RunID), slog.Int("attempt", it.Attempt))
	case stopped:
		attrs := []slog.Attr{slog.String("run_id", it.RunID), slog.Int("attempt", it.Attempt), slog.Bool("started", ran)}
		if err != nil {
			attrs = append(attrs, slog.String("error", err.Error()))
		}
		w.log.LogAttrs(ctx, slog.LevelInfo, "outbox item given back: the worker is stopping", attrs...)
		if rerr := w.outbox.ReleaseOutbox(sctx, it.RunID, holder); rerr != nil {
			return fmt.Errorf("giving back run %s: %w", it.RunID, rerr)
		}
	default:
		retryAt := w.now().Add(w.backoff(it.Attempt))
		w.log.LogAttrs(ctx, slog.LevelWarn, "outbox item failed", slog.String("run_id", it.RunID),
			slog.Int("attempt", it.Attempt), slog.Time("retry_at", retryAt), slog.String("error", err.Error()))
		if ferr := w.outbox.FailOutbox(sctx, it.RunID, holder, retryAt, truncate(err.Error(), 1024)); ferr != nil {
			return fmt.Errorf("recording failure of run %s: %w", it.RunID, ferr)
		}
	}
	return nil
}

// call runs the app's function, turning a panic into an error so that one bad
// item cannot stop the worker.
func (w *Worker) call(ctx context.Context, runID string, payload []byte) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return w.process(ctx, runID, payload)
}

// Run processes items until ctx ends, then waits for the items in flight,
// whose contexts end too, records them as ProcessBatch does (an item stopped
// short of a result is given back without counting its attempt), and returns
// nil. It keeps up to Concurrency items running: when one finishes, the next
// due item is claimed at once while the outbox had more work than was asked
// for at the last claim, and after PollInterval otherwise, so one slow item
// never holds up the others. Errors of the store are logged and retried
// after PollInterval. One Run per Worker, and no ProcessBatch beside it: for
// more parallelism raise Concurrency, or start more Workers. A Worker not
// made with [NewWorker] returns an error at once.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.configured(); err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	finished := make(chan struct{}, w.concurrency)
	running := 0
	// more: the last claim got all it asked for, so the outbox may hold
	// more due work; polling: the timer is set for the next poll.
	more, polling := false, true
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-finished:
			running--
			if !more && polling {
				continue // no more work at the last claim: wait for the poll
			}
		case <-timer.C:
			polling = false
		}
		for drained := false; !drained; {
			select {
			case <-finished:
				running--
			default:
				drained = true
			}
		}
		free := w.concurrency - running
		if free == 0 {
			continue // the first item to finish claims again
		}
		items, holder, end, err := w.claim(ctx, free)
		if err != nil {
			if ctx.Err() == nil {
				w.log.LogAttrs(ctx, slog.LevelError, "outbox worker", slog.String("error", err.Error()))
			}
			items = nil
		}
		for _, it := range items {
			running++
			wg.Go(func() {
				defer func() { finished <- struct{}{} }()
				if err := w.runItem(ctx, it, holder, end); err != nil {
					w.log.LogAttrs(ctx, slog.LevelError, "outbox worker", slog.String("error", err.Error()))
				}
			})
		}
		more = err == nil && len(items) == free
		if !more && !polling {
			timer.Reset(w.poll)
			polling = true
		}
	}
}

// canonicalPayload returns the contract's exact bytes for a stored payload
// that a store handed back reformatted (jsonb), or b unchanged.
func canonicalPayload(runID string, b []byte) []byte {
	if _, err := ValidatePayload(b); err == nil {
		return b
	}
	var v struct {
		Type         string `json:"type"`
		JobID        string `json:"jobId"`
		RunID        string `json:"runId"`
		ScheduledFor string `json:"scheduledFor"`
		Attempt      int    `json:"attempt"`
		Late         bool   `json:"late"`
		Trigger      string `json:"trigger"`
	}
	if json.Unmarshal(b, &v) != nil || v.RunID != runID || v.Type != contract.BodyType {
		return b
	}
	at, ok := parseScheduledFor(v.ScheduledFor)
	if !ok {
		return b
	}
	c := contract.Body(contract.Payload{JobID: v.JobID, RunID: v.RunID, ScheduledFor: at, Attempt: v.Attempt, Late: v.Late, Trigger: v.Trigger})
	if p, err := ValidatePayload(c); err != nil || p.RunID != runID {
		return b
	}
	return c
}

// truncate shortens s to at most n bytes of valid UTF-8 without NUL bytes
// (text columns reject anything else: PostgreSQL refuses NUL too).
func truncate(s string, n int) string {
	if len(s) > n {
		s = s[:n]
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, ""), "\x00", "")
}
