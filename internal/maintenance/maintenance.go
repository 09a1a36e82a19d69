// Package maintenance runs the background upkeep of the runs table: lease
// recovery after a crash, failing runs past their delivery lifetime, history
// retention, queue gauges and, where the database needs it, vacuuming the
// queue tables. Every task is safe on every replica at once.
package maintenance

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/health"
)

// Defaults of Config.
const (
	DefaultLeaseInterval = time.Second
	// DefaultDeadlineInterval is how often runs past their 96-hour lifetime
	// are failed: a few seconds late against such a lifetime tells no one
	// anything, and the check reads every run due and not yet claimed,
	// which is the whole backlog when deliveries fall behind.
	DefaultDeadlineInterval = 10 * time.Second
	DefaultPruneInterval    = 5 * time.Minute
	DefaultRetentionDays    = 90
	MinRetentionDays        = 7
	MaxRetentionDays        = 3650
	DefaultBatch            = 500
	DefaultStatsInterval    = 5 * time.Second
	DefaultVacuumInterval   = 10 * time.Second
	// DefaultStoreTimeout bounds each store call (see Config.StoreTimeout).
	DefaultStoreTimeout = 30 * time.Second
	// DefaultOutageGrace is how long lease recovery waits once the
	// database answers again after its passes failed (see
	// Config.OutageGrace): the dispatcher's lease margin, the time a lease
	// gives an attempt's outcome to be recorded after the attempt ended.
	DefaultOutageGrace = 5 * time.Second
)

// QueueVacuumer is a store whose queue tables need vacuuming from here,
// more often than the database's own vacuum does it (the PostgreSQL store).
type QueueVacuumer interface {
	VacuumQueue(ctx context.Context) error
}

// Observer receives maintenance figures for metrics.
type Observer interface {
	LeasesRecovered(n int)
	Queue(s vibejobs.QueueStats)
	// QueueUnknown says the queue figures could not be read: the last
	// ones no longer hold.
	QueueUnknown()
}

// Config of a Maintainer.
type Config struct {
	Store         vibejobs.Store
	Logger        *slog.Logger
	Now           func() time.Time
	LeaseInterval time.Duration
	// DeadlineInterval is how often runs past their deadline are failed.
	DeadlineInterval time.Duration
	PruneInterval    time.Duration
	StatsInterval    time.Duration
	// VacuumInterval is how often a QueueVacuumer store is asked to vacuum.
	VacuumInterval time.Duration
	// RetentionDays is the installation's history retention (≥ 7); a project's
	// own RetentionDays overrides it.
	RetentionDays int
	Batch         int
	Observer      Observer
	// OnRecovered is called when runs became claimable again (wakes the dispatcher).
	OnRecovered func()
	// StoreTimeout bounds each store call (a batch): a connection gone
	// silent without a reset would otherwise hang the loops until TCP
	// gives up.
	StoreTimeout time.Duration
	// OutageGrace is how long, once the database answers again after
	// lease recovery found it unreachable, recovery still waits
	// (DefaultOutageGrace). The leases that ended while the database was
	// gone are mostly those of live processes whose attempts were
	// answered meanwhile, and that record the outcomes they kept as soon
	// as it is back (see dispatcher's record loop); recovered at once,
	// their runs went out a second time, although no process crashed.
	OutageGrace time.Duration
}

// Maintainer runs the upkeep loops.
type Maintainer struct {
	cfg Config
	// recovering and expiring are the failing streaks of lease recovery
	// and of the deadline check (see FailingSince).
	recovering, expiring health.Streak

	// recoverMu serializes RecoverOnce, which keeps the outage state:
	// unreached says a recovery pass found the database unreachable and
	// none reached it since; graceEnd is when recovery resumes after the
	// database was reached again (see Config.OutageGrace).
	recoverMu sync.Mutex
	unreached bool
	graceEnd  time.Time
}

// FailingSince returns when lease recovery or the deadline check, the
// maintenance that runs depend on, began to fail against the database
// without a pass succeeding since (the earlier of the two); zero while the
// last pass of each succeeded. Pruning, statistics and vacuuming are not
// counted: a run waits on none of them.
func (m *Maintainer) FailingSince() time.Time {
	a, b := m.recovering.Since(), m.expiring.Since()
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}

// New returns a Maintainer with defaults filled in.
func New(cfg Config) *Maintainer {
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.LeaseInterval = cmp.Or(cfg.LeaseInterval, DefaultLeaseInterval)
	cfg.DeadlineInterval = cmp.Or(cfg.DeadlineInterval, DefaultDeadlineInterval)
	cfg.PruneInterval = cmp.Or(cfg.PruneInterval, DefaultPruneInterval)
	cfg.StatsInterval = cmp.Or(cfg.StatsInterval, DefaultStatsInterval)
	cfg.VacuumInterval = cmp.Or(cfg.VacuumInterval, DefaultVacuumInterval)
	cfg.StoreTimeout = cmp.Or(cfg.StoreTimeout, DefaultStoreTimeout)
	cfg.OutageGrace = cmp.Or(cfg.OutageGrace, DefaultOutageGrace)
	cfg.RetentionDays = min(max(cmp.Or(cfg.RetentionDays, DefaultRetentionDays), MinRetentionDays), MaxRetentionDays)
	cfg.Batch = cmp.Or(cfg.Batch, DefaultBatch)
	return &Maintainer{cfg: cfg}
}

// Run loops until ctx is done, and returns once every task has stopped.
//
// Pruning has a loop of its own: a pass over a large history (a retention
// just lowered on a busy installation) takes thousands of batches, and
// lease recovery, the deadline check, the gauges and the queue vacuum must
// keep their intervals meanwhile.
func (m *Maintainer) Run(ctx context.Context) {
	pruned := make(chan struct{})
	go func() {
		defer close(pruned)
		m.pruneLoop(ctx)
	}()
	defer func() { <-pruned }()
	lease := time.NewTicker(m.cfg.LeaseInterval)
	deadline := time.NewTicker(m.cfg.DeadlineInterval)
	stats := time.NewTicker(m.cfg.StatsInterval)
	vacuum := time.NewTicker(m.cfg.VacuumInterval)
	defer lease.Stop()
	defer deadline.Stop()
	defer stats.Stop()
	defer vacuum.Stop()
	m.RecoverOnce(ctx)
	m.ExpireOnce(ctx)
	m.StatsOnce(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-lease.C:
			m.RecoverOnce(ctx)
		case <-deadline.C:
			m.ExpireOnce(ctx)
		case <-stats.C:
			m.StatsOnce(ctx)
		case <-vacuum.C:
			m.VacuumOnce(ctx)
		}
	}
}

// pruneLoop prunes every PruneInterval until ctx is done.
func (m *Maintainer) pruneLoop(ctx context.Context) {
	prune := time.NewTicker(m.cfg.PruneInterval)
	defer prune.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-prune.C:
			m.PruneOnce(ctx)
		}
	}
}

// RecoverOnce recovers expired leases. After a pass found the database
// unreachable, the next passes only ping it, until it answers, and then
// recover nothing for Config.OutageGrace: the owners of the leases that
// ended meanwhile record their outcomes first.
func (m *Maintainer) RecoverOnce(ctx context.Context) {
	m.recoverMu.Lock()
	defer m.recoverMu.Unlock()
	now := m.cfg.Now()
	if m.unreached {
		sctx, cancel := m.storeCtx(ctx)
		err := m.cfg.Store.Ping(sctx)
		cancel()
		m.recovering.Pass(now, err, ctx.Err())
		if err != nil {
			m.logErr(ctx, "maintenance.recover_failed", err)
			return
		}
		m.unreached = false
		m.graceEnd = now.Add(m.cfg.OutageGrace)
	}
	if now.Before(m.graceEnd) {
		return
	}
	total := 0
	for {
		sctx, cancel := m.storeCtx(ctx)
		n, err := m.cfg.Store.RecoverExpiredLeases(sctx, now, m.cfg.Batch)
		cancel()
		m.recovering.Pass(now, err, ctx.Err())
		if err != nil {
			// Unreachable, not refusing (as the dispatcher's record loop
			// tells them apart): only then were the owners cut off too.
			m.unreached = ctx.Err() == nil &&
				(vibejobs.ErrorKind(err) == vibejobs.EUNAVAILABLE || errors.Is(err, context.DeadlineExceeded))
			m.logErr(ctx, "maintenance.recover_failed", err)
			break
		}
		total += n
		if n < m.cfg.Batch {
			break
		}
	}
	if total > 0 {
		m.cfg.Logger.Warn("maintenance.leases_recovered", "runs", total)
		if m.cfg.Observer != nil {
			m.cfg.Observer.LeasesRecovered(total)
		}
		if m.cfg.OnRecovered != nil {
			m.cfg.OnRecovered()
		}
	}
}

// ExpireOnce fails the waiting runs past their deadline.
func (m *Maintainer) ExpireOnce(ctx context.Context) {
	now := m.cfg.Now()
	err := m.inBatches(ctx, "maintenance.expire_failed", func(ctx context.Context, limit int) (int, error) {
		return m.cfg.Store.FailExpiredRuns(ctx, now, limit)
	})
	m.expiring.Pass(now, err, ctx.Err())
}

// PruneOnce deletes finished history older than each project's retention
// (runs with their attempts, the start of the event feed, jobs deleted
// before it that no run refers to any more, and tokens revoked before it),
// in small batches, and expired idempotency records and dashboard sessions.
func (m *Maintainer) PruneOnce(ctx context.Context) {
	now := m.cfg.Now()
	// The projects a page at a time: an installation may hold many.
	page := vibejobs.Page{Limit: projectsPage}
	for {
		sctx, cancel := m.storeCtx(ctx)
		projects, next, err := m.cfg.Store.ListProjects(sctx, page)
		cancel()
		if err != nil {
			m.logErr(ctx, "maintenance.prune_failed", err)
			return
		}
		for _, p := range projects {
			m.pruneProject(ctx, p, now)
		}
		if next == "" || ctx.Err() != nil {
			break
		}
		page.Cursor = next
	}
	for _, prune := range []func(context.Context, time.Time, int) (int, error){
		m.cfg.Store.PruneIdempotencyKeys, m.cfg.Store.PruneSessions,
	} {
		m.inBatches(ctx, "maintenance.prune_failed", func(ctx context.Context, limit int) (int, error) {
			return prune(ctx, now, limit)
		})
	}
}

// projectsPage is the page of projects PruneOnce reads at a time (the
// largest a store answers).
const projectsPage = 100

// pruneProject deletes p's history older than its retention at now.
func (m *Maintainer) pruneProject(ctx context.Context, p *vibejobs.Project, now time.Time) {
	days := m.cfg.RetentionDays
	if p.RetentionDays > 0 {
		days = max(p.RetentionDays, MinRetentionDays)
	}
	// Days of 24 hours, counted in UTC: on the calendar of a zone with
	// summer time (now is in the host's zone), a week back across its
	// start was 167 hours, under the retention promised.
	cutoff := now.UTC().AddDate(0, 0, -days)
	m.inBatches(ctx, "maintenance.prune_failed", func(ctx context.Context, limit int) (int, error) {
		return m.cfg.Store.PruneRuns(ctx, p.ID, cutoff, limit)
	})
	m.inBatches(ctx, "maintenance.prune_failed", func(ctx context.Context, limit int) (int, error) {
		return m.cfg.Store.PruneEvents(ctx, p.ID, cutoff, limit)
	})
	// After the runs: a deleted job goes with its last run.
	m.inBatches(ctx, "maintenance.prune_failed", func(ctx context.Context, limit int) (int, error) {
		return m.cfg.Store.PruneDeletedJobs(ctx, p.ID, cutoff, limit)
	})
	// A revoked token is kept for the record as long as the history
	// it may appear beside; live tokens are never pruned.
	m.inBatches(ctx, "maintenance.prune_failed", func(ctx context.Context, limit int) (int, error) {
		return m.cfg.Store.PruneRevokedTokens(ctx, p.ID, cutoff, limit)
	})
}

// inBatches calls task with the batch size until a batch comes back short,
// an error (logged as failEvent, and returned) or the end of ctx.
func (m *Maintainer) inBatches(ctx context.Context, failEvent string, task func(ctx context.Context, limit int) (int, error)) error {
	for ctx.Err() == nil {
		sctx, cancel := m.storeCtx(ctx)
		n, err := task(sctx, m.cfg.Batch)
		cancel()
		if err != nil {
			m.logErr(ctx, failEvent, err)
			return err
		}
		if n < m.cfg.Batch {
			return nil
		}
	}
	return nil
}

// VacuumOnce asks the store to vacuum its queue tables, when it is a
// QueueVacuumer.
func (m *Maintainer) VacuumOnce(ctx context.Context) {
	v, ok := m.cfg.Store.(QueueVacuumer)
	if !ok {
		return
	}
	sctx, cancel := m.storeCtx(ctx)
	defer cancel()
	if err := v.VacuumQueue(sctx); err != nil {
		m.logErr(ctx, "maintenance.vacuum_failed", err)
	}
}

// StatsOnce reports the queue gauges, or that they are unknown when the
// store does not answer.
func (m *Maintainer) StatsOnce(ctx context.Context) {
	if m.cfg.Observer == nil {
		return
	}
	sctx, cancel := m.storeCtx(ctx)
	s, err := m.cfg.Store.QueueStats(sctx, m.cfg.Now())
	cancel()
	if err != nil {
		m.cfg.Observer.QueueUnknown()
		m.logErr(ctx, "maintenance.stats_failed", err)
		return
	}
	m.cfg.Observer.Queue(s)
}

// storeCtx bounds a store call by Config.StoreTimeout.
func (m *Maintainer) storeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, m.cfg.StoreTimeout)
}

func (m *Maintainer) logErr(ctx context.Context, msg string, err error) {
	if ctx.Err() != nil {
		return
	}
	m.cfg.Logger.Error(msg, "error", err)
}
