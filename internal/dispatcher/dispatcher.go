// Package dispatcher delivers runs: it claims due runs from the Store under a
// lease, signs and sends each attempt through the egress client, and writes
// the outcome back in batches.
//
// Concurrency is bounded overall and per destination host, so a slow or
// failing target cannot hold up other jobs' deliveries: a claimed run whose
// host is at its limit is released at once, keeping its attempt number.
package dispatcher

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/egress"
	"github.com/vibejobs/vibejobs/internal/health"
)

// Defaults of Config.
const (
	DefaultConcurrency  = 512
	DefaultPerHost      = 256
	DefaultClaimBatch   = 500
	DefaultLeaseMargin  = 5 * time.Second
	DefaultPollInterval = time.Second
	DefaultFlushBatch   = 500
	DefaultClaimAhead   = 200 * time.Millisecond
	// DefaultStoreTimeout bounds each store call: a connection gone
	// silent without a reset (a dropped route, a failover) would otherwise
	// hang the loop until TCP gives up, a quarter of an hour or more.
	DefaultStoreTimeout = 10 * time.Second
	// DefaultStopRecordTimeout bounds the writing of outcomes, and the
	// giving back of claims never sent, at a stop (see
	// Config.StopRecordTimeout).
	DefaultStopRecordTimeout = 10 * time.Second
	// SecretUnavailablePause is how long a claim whose job secret this
	// process cannot open waits, given back unsent, before it is due again
	// (see Observer.SecretUnavailable).
	SecretUnavailablePause = 30 * time.Second
)

// secretLogEvery is how often, at most, a job whose secret cannot be
// opened is logged: every claim of its runs meets it again.
const secretLogEvery = 10 * time.Minute

// workerIdle is how long a worker whose attempt finished waits for the
// next one before it ends (see Dispatcher.tasks).
const workerIdle = 15 * time.Second

// Sender sends one attempt; *egress.Client is the production one.
type Sender interface {
	Post(ctx context.Context, rawURL string, header http.Header, body []byte, timeout time.Duration) egress.Result
}

// SecretOpener decrypts a job's sealed secret.
type SecretOpener interface {
	Open(s vibejobs.SealedSecret, jobID string) (string, error)
}

// Observer receives delivery events for metrics; every method must be cheap.
type Observer interface {
	AttemptFinished(errorCode string, step vibejobs.Step, firstAttemptLateness time.Duration, first bool, d time.Duration)
	// SecretUnavailable is called for each claim given back unsent
	// because its job's secret could not be opened: sealed under a master
	// key this process's key file lacks, or corrupt. No attempt was sent
	// or recorded; the run is due again SecretUnavailablePause later,
	// under the same attempt number, for any replica, until its delivery
	// lifetime ends (deadline_exceeded).
	SecretUnavailable()
}

// Config of a Dispatcher.
type Config struct {
	Store  vibejobs.DispatchStore
	Sender Sender
	Opener SecretOpener
	// Owner names this process's leases; unique per process.
	Owner     string
	UserAgent string
	Logger    *slog.Logger
	Now       func() time.Time
	// Rand returns a uniform number in [0, 1) for retry jitter.
	Rand func() float64
	// Concurrency bounds the claims held: attempts being sent, claims
	// held until their time, and claims waiting for their host.
	Concurrency int
	// PerHost bounds the attempts being sent (or held) per host. A claim
	// whose host is full waits for one of its slots, up to LeaseMargin/2
	// after it is due (so that its attempt ends within its lease), and is
	// released if it did not get one: released at once, a host with a
	// backlog had each finishing attempt claim a batch and release all but
	// one (a burst to one host with the default limits went at half the
	// rate, for more than twice the database work per run).
	PerHost      int
	ClaimBatch   int
	LeaseMargin  time.Duration
	PollInterval time.Duration
	// ClaimAhead lets the dispatcher claim runs falling due within this
	// window and hold each until its time, so a second full of occurrences
	// costs a few claims instead of one per millisecond, and a claim held
	// up by the database (a slow commit) is not yet late. The job's
	// delivery settings are read at the claim, up to ClaimAhead before the
	// attempt starts; JobChanged withdraws the claims of an edited, paused,
	// rescheduled or deleted job, so that its attempts start with its new
	// settings and no withdrawn occurrence goes out. A negative value turns
	// it off.
	ClaimAhead time.Duration
	// StoreTimeout bounds each store call (DefaultStoreTimeout).
	StoreTimeout time.Duration
	// StopRecordTimeout bounds, once Run is stopping and the last attempt
	// in flight has finished, how long the store is waited for: the
	// outcomes it has not taken yet are retried, and the claims being
	// given back unsent (those that waited for their host's slot, or
	// were withdrawn) are waited for, each call cut at what is left of
	// it; DefaultStopRecordTimeout when zero. The claims given back as
	// the stop begins go while the attempts finish, not before Run waits
	// for them. What the store has not taken then is given up: the runs
	// stay leased, and once the leases end lease recovery records the
	// lost attempts as interrupted and sends them again under the same
	// number (at least once; the app dedupes on the run id), as after a
	// crash. Waiting longer for a database that is down would only hold
	// up the stop, and an orchestrator ends a stop that outlasts its grace
	// period with SIGKILL, to the same effect.
	StopRecordTimeout time.Duration
	Observer          Observer
}

// Dispatcher claims and delivers runs. Run loops until its context ends.
type Dispatcher struct {
	cfg  Config
	wake chan struct{}

	mu sync.Mutex
	// inflight counts the claims this dispatcher holds: attempts being
	// sent, claims held until their time and claims waiting for their host.
	inflight int
	// perHost counts, per host, the attempts being sent or held until
	// their time: the host's taken slots.
	perHost map[string]int
	// waiting holds, per host, oldest first, the claims that found their
	// host full; a finishing attempt of the host hands its slot to the
	// first, and the claim loop releases those past their deadline.
	waiting map[string][]waiter
	// held has the claims held until their time by their deliver
	// goroutine, until a withdrawal (see JobChanged) takes them out or
	// their attempt finishes.
	held map[*vibejobs.Claim]*heldClaim
	// toRelease holds claims taken out of inflight that the claim loop is
	// to release: waiting claims a finishing attempt found past their
	// deadline, and withdrawn ones.
	toRelease []waiter
	// starved says the claim loop waits for a free slot: the next attempt
	// to finish wakes it.
	starved bool
	// claiming says a ClaimDueRuns is on its way: its claims, committed,
	// are in neither held nor waiting yet, so a withdrawal meanwhile keeps
	// its match in missed, for acquire to apply to them (see claim).
	claiming bool
	missed   []func(*vibejobs.Claim) bool

	// backlog says the last claim for runs due now came back full; only
	// the claim loop uses it.
	backlog bool
	// claimTimes holds the times of this dispatcher's claims of the last
	// claimTimesKept (in microseconds, as stores keep them; claimOrder in
	// the order made, to forget them by), so that a claim is read back
	// (see readBack) only when no other claim of this owner, whose leases
	// could still hold, was made at the same time. Only the claim loop
	// uses them.
	claimTimes map[int64]bool
	claimOrder []int64

	outcomes chan vibejobs.Outcome
	// wg counts the tasks of workers, each until its worker has handed
	// over its outcome; attempting counts them until their attempt ended,
	// before that hand-over, which waits for the record loop. The stop's
	// budget starts when attempting falls to zero (see waitAttempts): a
	// worker waiting to hand over its outcome while the record loop
	// retries a database that does not take them waits for that budget.
	wg         sync.WaitGroup
	attempting atomic.Int64
	// attemptsIdle, set by waitAttempts, is closed when attempting falls
	// to zero; guarded by mu.
	attemptsIdle chan struct{}
	// tasks hands an attempt to an idle worker, one whose attempt finished
	// and that waits workerIdle for another, so that the stack the HTTP
	// client grew serves the next attempt. A goroutine per attempt grew a
	// fresh stack each time: stack copies were about 5 % of the process's
	// CPU in a burst. Unbuffered: a send succeeds only to a worker waiting,
	// and otherwise a new worker starts.
	tasks chan task
	// stopping is closed when Run's context ends: idle workers end.
	stopping chan struct{}
	// writes bounds the store calls that hand back what the dispatcher
	// holds: the record loop's, and the releases of claims never sent. It
	// ends StopRecordTimeout after Run, stopping, saw its last attempt
	// finish; the record loop then gives up what it could not write (see
	// recordLoop), and a release in progress is cut. endWrites ends it.
	writes    context.Context
	endWrites context.CancelFunc
	// retryWait is the pause before the record loop's retry number
	// attempt+1.
	retryWait func(attempt int) time.Duration

	// secretLogged holds when each job whose secret could not be opened
	// was last logged (see secretLogEvery); guarded by mu.
	secretLogged map[string]time.Time

	// claimFailing and recordFailing are the failing streaks of the claim
	// loop's passes and of the record loop's writes (see FailingSince),
	// apart: claims that succeed do not vouch for outcomes that cannot be
	// written.
	claimFailing, recordFailing health.Streak
}

// New returns a Dispatcher with the defaults filled in.
func New(cfg Config) *Dispatcher {
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	cfg.Concurrency = cmp.Or(cfg.Concurrency, DefaultConcurrency)
	cfg.PerHost = min(cmp.Or(cfg.PerHost, DefaultPerHost), cfg.Concurrency)
	cfg.ClaimBatch = cmp.Or(cfg.ClaimBatch, DefaultClaimBatch)
	cfg.LeaseMargin = cmp.Or(cfg.LeaseMargin, DefaultLeaseMargin)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, DefaultPollInterval)
	cfg.StoreTimeout = cmp.Or(cfg.StoreTimeout, DefaultStoreTimeout)
	cfg.StopRecordTimeout = cmp.Or(cfg.StopRecordTimeout, DefaultStopRecordTimeout)
	cfg.UserAgent = cmp.Or(cfg.UserAgent, "vibejobs/dev")
	// A claim waits for its host until LeaseMargin/2 after its hold (see
	// waiter): the hold must leave the attempt room within the lease.
	cfg.ClaimAhead = min(max(cmp.Or(cfg.ClaimAhead, DefaultClaimAhead), 0), cfg.LeaseMargin/4)
	writes, endWrites := context.WithCancel(context.Background())
	return &Dispatcher{
		writes:    writes,
		endWrites: endWrites,
		cfg:       cfg,
		wake:      make(chan struct{}, 1),
		perHost:   map[string]int{},
		waiting:   map[string][]waiter{},
		held:      map[*vibejobs.Claim]*heldClaim{},

		secretLogged: map[string]time.Time{},
		outcomes:     make(chan vibejobs.Outcome, cfg.Concurrency),
		tasks:        make(chan task),
		stopping:     make(chan struct{}),
		retryWait: func(attempt int) time.Duration {
			return min(time.Duration(attempt+1)*100*time.Millisecond, 2*time.Second)
		},
	}
}

// storeCtx bounds a store call by Config.StoreTimeout.
func (d *Dispatcher) storeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d.cfg.StoreTimeout)
}

// FailingSince returns when the dispatcher began to fail against the
// store: since then every pass of its claim loop failed, or every write of
// the outcomes it holds (the earlier, when both). It is zero while the
// last pass and the last write succeeded (a pass that found nothing due
// included), or before the first; a record loop that gave up a batch
// refused for good is not failing either.
func (d *Dispatcher) FailingSince() time.Time {
	c, r := d.claimFailing.Since(), d.recordFailing.Since()
	if c.IsZero() || (!r.IsZero() && r.Before(c)) {
		return r
	}
	return c
}

// Wake asks the dispatcher to look for due runs now.
func (d *Dispatcher) Wake() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Run claims and delivers until ctx is done. Then it stops claiming, gives
// back the claims not sent while the attempts in flight finish within their
// own budget, records their outcomes and returns; what the store has not
// taken Config.StopRecordTimeout after the last attempt finished is given up.
func (d *Dispatcher) Run(ctx context.Context) {
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		d.recordLoop()
	}()
	defer func() {
		close(d.stopping)
		// Claims still waiting for their host go back to the queue while
		// the attempts in flight finish: a database that does not answer
		// holds up neither, and the stop's budget bounds the wait.
		released := make(chan struct{})
		go func() {
			defer close(released)
			d.expireWaiting(d.cfg.Now(), true)
		}()
		d.waitAttempts()
		giveUp := time.AfterFunc(d.cfg.StopRecordTimeout, d.endWrites)
		// Workers still handing over their outcomes: the record loop
		// takes them, or drops them once writes ends.
		d.wg.Wait()
		<-released
		// And those withdrawn while the attempts finished.
		d.expireWaiting(d.cfg.Now(), true)
		close(d.outcomes)
		<-flushed
		giveUp.Stop()
		d.endWrites()
	}()

	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		wait, err := d.dispatchOnce(ctx)
		d.claimFailing.Pass(d.cfg.Now(), err, ctx.Err())
		if err != nil && ctx.Err() == nil {
			d.cfg.Logger.Error("dispatcher.claim_failed", "error", err)
			wait = d.cfg.PollInterval
		}
		if ctx.Err() != nil {
			return
		}
		if wait == 0 {
			continue
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

// dispatchOnce claims what it has room for and starts the attempts. It
// returns how long to wait before the next call: 0 to call again at once.
//
// It asks for the next due time first, a cheap read, and claims only when a
// run falls due within ClaimAhead: a wake-up for runs materialised seconds
// ahead, or one that another replica has already served, then costs no
// claim. While claims for runs due now come back full (a backlog), it
// claims again without asking. A claim for runs due now comes before one
// for runs about to fall due, so that a run already due is judged late
// against the true time.
func (d *Dispatcher) dispatchOnce(ctx context.Context) (time.Duration, error) {
	deadline := d.expireWaiting(d.cfg.Now(), false)
	wait, err := d.claimOnce(ctx)
	if !deadline.IsZero() {
		wait = min(wait, max(deadline.Sub(d.cfg.Now()), time.Millisecond))
	}
	return wait, err
}

// claimOnce is dispatchOnce without the waiting claims.
func (d *Dispatcher) claimOnce(ctx context.Context) (time.Duration, error) {
	d.mu.Lock()
	free := d.cfg.Concurrency - d.inflight
	d.starved = free <= 0
	d.mu.Unlock()
	if free <= 0 {
		return d.cfg.PollInterval, nil // a finishing attempt wakes us sooner
	}
	now := d.cfg.Now()
	dueNow := d.backlog
	if !dueNow {
		sctx, cancel := d.storeCtx(ctx)
		next, ok, err := d.cfg.Store.NextDueAt(sctx)
		cancel()
		if err != nil {
			return 0, err
		}
		if !ok {
			return d.cfg.PollInterval, nil
		}
		now = d.cfg.Now()
		if wait := next.Sub(now) - d.cfg.ClaimAhead; wait > 0 {
			return min(wait, d.cfg.PollInterval), nil
		}
		dueNow = !next.After(now)
	}
	want := min(free, d.cfg.ClaimBatch)
	var claims []*vibejobs.Claim
	if dueNow {
		var err error
		claims, err = d.claim(ctx, now, want)
		if err != nil {
			d.backlog = false
			return 0, err
		}
		d.backlog = len(claims) == want
		d.start(claims, now, time.Time{})
	}
	if len(claims) < want && d.cfg.ClaimAhead > 0 && ctx.Err() == nil {
		// Nothing else is due now: take what falls due within the window
		// (unless the stop began: a claim no longer ends with it).
		// These are first attempts not yet due (late is false for them)
		// or retries due by now+ahead; each is held until its time.
		ahead := now.Add(d.cfg.ClaimAhead)
		more, err := d.claim(ctx, ahead, want-len(claims))
		if err != nil {
			return 0, err
		}
		d.start(more, now, ahead)
		claims = append(claims, more...)
	}
	if len(claims) == 0 {
		// The due run is held by another replica's claim, about to
		// commit: look again shortly rather than at once.
		return min(d.cfg.PollInterval, retakePause), nil
	}
	return 0, nil
}

// retakePause is how long dispatchOnce waits after finding a run due but
// claiming none.
const retakePause = 5 * time.Millisecond

// claim claims up to limit runs due by at. The claims are committed before
// they come back, and a job change committing meanwhile (a pause that
// marked a claimed run withdrawn, waiting for the claim's lock on it) may
// call JobChanged before start holds them: the withdrawal is then kept for
// start, which must follow, to apply (see acquire), so that such a claim
// too is given back unsent.
func (d *Dispatcher) claim(ctx context.Context, at time.Time, limit int) ([]*vibejobs.Claim, error) {
	d.mu.Lock()
	d.claiming = true
	d.mu.Unlock()
	// Not cut by a stop (ctx ending): a claim that committed while its
	// answer was on the way would leave its runs leased to no one who knew
	// of them, until the lease ended and another process recorded an
	// interrupted attempt never sent. Claimed, they are sent and recorded
	// before Run returns; the store's timeout still bounds the wait.
	alone := d.noteClaimTime(at)
	sctx, cancel := d.storeCtx(context.WithoutCancel(ctx))
	claims, err := d.cfg.Store.ClaimDueRuns(sctx, d.cfg.Owner, at, limit, d.cfg.LeaseMargin)
	cancel()
	if err != nil {
		if alone {
			if got := d.readBack(ctx, at); len(got) > 0 {
				return got, nil
			}
		}
		d.endClaim()
	}
	return claims, err
}

// claimTimesKept is how long noteClaimTime remembers a claim's time:
// longer than any lease (the longest job timeout, 30 s, and the lease
// margin), after which no run is leased under it any more.
const claimTimesKept = 2 * time.Minute

// noteClaimTime records a claim at at and reports whether it is the only
// recent claim of this dispatcher at that time (to the microsecond). Two
// claims a pass (one for the runs due now, one ahead of it) and clocks
// that read the same twice (a clock of tests) can meet; a real one seldom
// does, but a claim read back by its time alone would then take the other
// claim's runs too, and send them twice.
func (d *Dispatcher) noteClaimTime(at time.Time) bool {
	us := at.UnixMicro()
	for len(d.claimOrder) > 0 && d.claimOrder[0] < us-claimTimesKept.Microseconds() {
		delete(d.claimTimes, d.claimOrder[0])
		d.claimOrder = d.claimOrder[1:]
	}
	if d.claimTimes[us] {
		return false
	}
	if d.claimTimes == nil {
		d.claimTimes = map[int64]bool{}
	}
	d.claimTimes[us] = true
	d.claimOrder = append(d.claimOrder, us)
	return true
}

// readBack returns the claims that a failed claim at at made all the same
// (its statement committed and its answer was lost), when the store can
// read them back (vibejobs.ClaimReader): they are sent as the claim's,
// rather than left leased to no one who knows of them until lease recovery
// sends them again with an interrupted attempt that never went out. None
// when the claim did not commit, or when the store cannot tell (the read
// failed too; lease recovery then takes them as before).
func (d *Dispatcher) readBack(ctx context.Context, at time.Time) []*vibejobs.Claim {
	r, ok := d.cfg.Store.(vibejobs.ClaimReader)
	if !ok {
		return nil
	}
	sctx, cancel := d.storeCtx(context.WithoutCancel(ctx))
	defer cancel()
	claims, err := r.ReadClaims(sctx, d.cfg.Owner, at)
	if err != nil || len(claims) == 0 {
		return nil
	}
	d.cfg.Logger.Warn("dispatcher.claim_read_back", "runs", len(claims),
		"effect", "a claim failed after it committed; its runs are sent as claimed")
	return claims
}

// endClaim ends what claim began, once its claims are held or waiting.
func (d *Dispatcher) endClaim() {
	d.mu.Lock()
	d.claiming, d.missed = false, nil
	d.mu.Unlock()
}

// start begins the attempts of claims made at now; a claim whose host is
// full waits for a slot (see Config.PerHost). A claim made ahead of time
// (ahead is not zero) is held until it is due (Claim.DueAt, at most ahead),
// and a first attempt until its scheduledFor too.
func (d *Dispatcher) start(claims []*vibejobs.Claim, now, ahead time.Time) {
	// The claims' leases and late were reckoned from now, before the
	// claim's statement: a slow one (a database stalling on its commit)
	// can have used up a claim's deadline already.
	back := d.cfg.Now()
	for _, c := range claims {
		// Config.PerHost counts a destination as the egress client's pool
		// does, so the claims let through never wait inside the client for
		// a connection (a wait their attempt's timeout would count).
		host := egress.HostKey(c.URL)
		var hold time.Time
		if !ahead.IsZero() {
			// Its due time, not ahead: held until ahead, a retry went
			// out up to ClaimAhead late, and a first attempt given back
			// for later than its scheduledFor (see secretUnavailable) up
			// to ClaimAhead early.
			hold = c.DueAt
			if c.Run.Attempt == 1 && c.Run.ScheduledFor.After(hold) {
				hold = c.Run.ScheduledFor
			}
			if hold.After(ahead) {
				hold = ahead
			}
		}
		// No attempt starts after the run's deadline: a claim still waiting
		// then goes back, for FailExpiredRuns to end.
		deadline := latest(now, hold).Add(d.cfg.LeaseMargin / 2)
		if c.Run.DeadlineAt.Before(deadline) {
			deadline = c.Run.DeadlineAt
		}
		// A first attempt the claim found on time must start on time: a
		// claim still waiting then goes back, and the next claim decides
		// late again (a release keeps it if the attempt was ever sent). A
		// claim made after that moment found late decided before; it waits
		// as any other.
		onTime := c.Run.ScheduledFor.Add(vibejobs.LateThreshold)
		if c.Run.Attempt == 1 && !c.Run.Late && now.Before(onTime) && onTime.Before(deadline) {
			deadline = onTime
		}
		d.acquire(host, waiter{c: c, hold: hold, deadline: deadline}, back)
	}
	d.endClaim()
}

// latest returns the later of a and b.
func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// release puts the runs of claims back in the queue at now, claimable again
// from due (a deleted job's run is cancelled at now, not at due). A claim whose
// lease ran out while it waited (the claim loop held up by a slow database)
// may have had its run recovered and claimed again by this dispatcher: the
// store releases only the claim named, not that newer one. The call is
// bounded by StoreTimeout and, at a stop, by the stop's budget (see
// Config.StopRecordTimeout); a release that fails leaves the runs leased,
// for lease recovery.
func (d *Dispatcher) release(claims []*vibejobs.Claim, now, due time.Time) {
	if len(claims) == 0 {
		return
	}
	sctx, cancel := d.storeCtx(d.writes)
	defer cancel()
	if err := d.cfg.Store.ReleaseClaims(sctx, d.cfg.Owner, claims, now, due); err != nil {
		d.cfg.Logger.Error("dispatcher.release_failed", "error", err, "runs", len(claims))
	}
}

// waiter is a claim waiting for a slot of its host.
type waiter struct {
	c    *vibejobs.Claim
	hold time.Time // as for deliver
	// deadline is LeaseMargin/2 after the claim is due, or the run's
	// deadline, or for a first attempt found on time the moment it would be
	// late, if earlier: a claim not started by then is released, so that
	// the attempt of a claim that waited still ends well within its lease
	// (its hold is at most ClaimAhead, and New keeps that under
	// LeaseMargin/2), no attempt starts after the run's deadline, and late
	// says when the first attempt started.
	deadline time.Time
}

// heldClaim is a claim held until its time. Its deliver goroutine and a
// withdrawal race for it on state, without d.mu: at the top of a busy
// second hundreds of held claims fall due at once, and taking the lock each
// made them queue for it (the median lateness grew by about 2.5 ms).
type heldClaim struct {
	hold     time.Time
	withdraw chan struct{} // closed when the claim is withdrawn
	state    atomic.Int32  // claimHeld, then claimStarted or claimWithdrawn
}

// States of a heldClaim.
const (
	claimHeld = iota
	claimStarted
	claimWithdrawn
)

// acquire starts w on a slot of host, or queues it for the host's next one;
// a claim whose deadline is not after now goes back unsent instead.
func (d *Dispatcher) acquire(host string, w waiter, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, match := range d.missed {
		if match(w.c) {
			// Withdrawn while it was being claimed (see claim): it goes
			// back once due, as a withdrawn held claim does.
			d.toRelease = append(d.toRelease, w)
			return
		}
	}
	if !w.deadline.After(now) {
		// Its claim came back past the deadline, as a waiting claim
		// can: sent now, its attempt could outlast its lease (and
		// another replica send the run beside it), or a first attempt
		// go out on time that started late. It goes back, and its next
		// claim reckons both again.
		d.toRelease = append(d.toRelease, w)
		return
	}
	d.inflight++
	if d.perHost[host] < d.cfg.PerHost {
		d.perHost[host]++
		d.startLocked(host, w)
		return
	}
	d.waiting[host] = append(d.waiting[host], w)
}

// startLocked starts the attempt of w, which holds a slot of host, on an
// idle worker or a new one. d.mu is held.
func (d *Dispatcher) startLocked(host string, w waiter) {
	t := d.taskLocked(host, w)
	select {
	case d.tasks <- t:
	default:
		go d.worker(t)
	}
}

// taskLocked counts the attempt of w, which holds a slot of host, in d.wg
// and returns it as a task; a claim held until its time is registered in
// held first, so that it can be withdrawn until its attempt starts. d.mu is
// held.
func (d *Dispatcher) taskLocked(host string, w waiter) task {
	var h *heldClaim
	if !w.hold.IsZero() {
		h = &heldClaim{hold: w.hold, withdraw: make(chan struct{})}
		d.held[w.c] = h
	}
	d.wg.Add(1)
	d.attempting.Add(1)
	return task{c: w.c, host: host, h: h}
}

// task is an attempt for a worker: deliver's arguments.
type task struct {
	c    *vibejobs.Claim
	host string
	h    *heldClaim
}

// worker delivers t, then the claim its slot goes to (see releaseSlot), or
// each task handed to it, until none comes for workerIdle or Run is
// stopping.
func (d *Dispatcher) worker(t task) {
	var idle *time.Timer
	for {
		d.deliver(t.c, t.host, t.h)
		next, ok := d.releaseSlot(t.host, t.c)
		d.wg.Done() // after the next attempt is counted: never a zero count in between
		if ok {
			t = next
			continue
		}
		if idle == nil {
			idle = time.NewTimer(workerIdle)
		} else {
			idle.Reset(workerIdle) // Go ≥ 1.23: no stale tick survives a Reset
		}
		select {
		case t = <-d.tasks:
		case <-idle.C:
			return
		case <-d.stopping:
			idle.Stop()
			return
		}
	}
}

// JobChanged withdraws the claims of job jobID whose attempt has not
// started (held until their time, or waiting for their host): they go back
// to the database, and are claimed again with the job's new settings,
// cancelled if it was deleted, or deleted if a pause or a schedule change
// withdrew their occurrence (see vibejobs.Tx.DeleteFutureRuns). Call it
// once a change to the job's URL, secret, timeout or retry policy, a pause,
// a schedule change or its deletion has committed: an attempt then starts
// with the settings it has when it starts, as the spec wants, although
// claims read them up to ClaimAhead ahead. Attempts already sent finish.
func (d *Dispatcher) JobChanged(jobID string) {
	d.withdraw(func(c *vibejobs.Claim) bool { return c.Run.JobID == jobID })
}

// WithdrawAll withdraws every claim whose attempt has not started, as
// JobChanged does: for when job changes may have gone unseen (the
// database's notifications were lost with their connection).
func (d *Dispatcher) WithdrawAll() {
	d.withdraw(func(*vibejobs.Claim) bool { return true })
}

// withdraw takes out the unstarted claims that match and hands them to the
// claim loop to release. A held claim's deliver goroutine sees its channel
// closed and ends without sending, freeing its slot.
func (d *Dispatcher) withdraw(match func(*vibejobs.Claim) bool) {
	d.mu.Lock()
	if d.claiming {
		d.missed = append(d.missed, match)
	}
	n := len(d.toRelease)
	for c, h := range d.held {
		if match(c) && h.state.CompareAndSwap(claimHeld, claimWithdrawn) {
			delete(d.held, c)
			close(h.withdraw)
			d.toRelease = append(d.toRelease, waiter{c: c, hold: h.hold})
		}
	}
	for host, q := range d.waiting {
		kept := q[:0]
		for _, w := range q {
			if match(w.c) {
				d.toRelease = append(d.toRelease, w)
				d.inflight--
			} else {
				kept = append(kept, w)
			}
		}
		if len(kept) == 0 {
			delete(d.waiting, host)
		} else {
			d.waiting[host] = kept
		}
	}
	withdrawn := len(d.toRelease) > n
	d.mu.Unlock()
	if withdrawn {
		d.Wake()
	}
}

// releaseSlot frees the slot of c's attempt: it goes to the first claim
// waiting for the host, if any (those past their deadline are left to the
// claim loop, which is woken to release them), whose attempt it returns
// for the caller, c's worker, to make; and the claim loop is woken when it
// was waiting for a slot.
func (d *Dispatcher) releaseSlot(host string, c *vibejobs.Claim) (next task, ok bool) {
	now := d.cfg.Now()
	d.mu.Lock()
	delete(d.held, c)
	d.inflight--
	q := d.waiting[host]
	expired := false
	for len(q) > 0 && !q[0].deadline.After(now) {
		d.toRelease = append(d.toRelease, q[0])
		d.inflight--
		q = q[1:]
		expired = true
	}
	var first *waiter
	if len(q) > 0 {
		first, q = &q[0], q[1:]
	}
	if len(q) > 0 {
		d.waiting[host] = q
	} else {
		delete(d.waiting, host)
	}
	if first != nil {
		next, ok = d.taskLocked(host, *first), true
	} else if d.perHost[host]--; d.perHost[host] <= 0 {
		delete(d.perHost, host)
	}
	wake := d.starved || expired
	d.starved = false
	d.mu.Unlock()
	if wake {
		d.Wake()
	}
	return next, ok
}

// expireWaiting releases the waiting claims whose deadline is not after now,
// and the claims in toRelease whose hold is not after now (a withdrawn claim
// goes back once due, so that it is neither due early nor, for a deleted
// job, cancelled at a time still to come), or all of them; it returns the
// earliest deadline or hold of those left (zero if none).
func (d *Dispatcher) expireWaiting(now time.Time, all bool) time.Time {
	var (
		next    time.Time
		release []waiter
	)
	earliest := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	d.mu.Lock()
	kept := d.toRelease[:0]
	for _, w := range d.toRelease {
		if all || !w.hold.After(now) {
			release = append(release, w)
		} else {
			kept = append(kept, w)
			earliest(w.hold)
		}
	}
	clear(d.toRelease[len(kept):])
	d.toRelease = kept
	for host, q := range d.waiting {
		i := 0
		for ; i < len(q) && (all || !q[i].deadline.After(now)); i++ {
			release = append(release, q[i])
			d.inflight--
		}
		if i == len(q) {
			delete(d.waiting, host)
			continue
		}
		d.waiting[host] = q[i:]
		earliest(q[i].deadline)
	}
	d.mu.Unlock()
	d.releaseHeld(release, now)
	return next
}

// releaseHeld releases claims, each no earlier than its hold: a claim made
// ahead of its time and released at now (a shutdown) must not become due
// before it (a first attempt before its scheduledFor). All go back at now;
// those already due are claimable at once, the others from the latest of
// their holds, at most ClaimAhead away (a deleted job's run among them is
// cancelled at now, not then).
func (d *Dispatcher) releaseHeld(ws []waiter, now time.Time) {
	var due, ahead []*vibejobs.Claim
	later := now
	for _, w := range ws {
		if !w.hold.After(now) {
			due = append(due, w.c)
			continue
		}
		ahead = append(ahead, w.c)
		later = latest(later, w.hold)
	}
	d.release(due, now, now)
	d.release(ahead, now, later)
}

// deliver makes one attempt of a claimed run, after holding it until its
// hold when h is not nil; a claim withdrawn meanwhile ends unsent (the
// withdrawal releases it). The attempt is not cancelled by shutdown: it
// ends within its own timeout.
func (d *Dispatcher) deliver(c *vibejobs.Claim, host string, h *heldClaim) {
	attemptEnded := false
	endAttempt := func() {
		if !attemptEnded {
			attemptEnded = true
			d.endAttempt()
		}
	}
	defer endAttempt()
	if h != nil {
		if wait := h.hold.Sub(d.cfg.Now()); wait > 0 {
			t := time.NewTimer(wait) // at most ClaimAhead
			select {
			case <-t.C:
			case <-h.withdraw:
				t.Stop()
			}
		}
		if !h.state.CompareAndSwap(claimHeld, claimStarted) {
			return // withdrawn before its attempt started
		}
	}
	r := c.Run
	if r.Attempt > c.Retry.MaxAttempts {
		// The job's maxAttempts was lowered after the run's last attempt:
		// its attempts are used up, and none more goes out. Given back,
		// the run fails attempts_exhausted (see ReleaseClaims), unless the
		// limit was raised again since the claim read it.
		now := d.cfg.Now()
		d.release([]*vibejobs.Claim{c}, now, now)
		return
	}
	secret, err := d.cfg.Opener.Open(c.Secret, r.JobID)
	if err != nil {
		d.secretUnavailable(c, err)
		return
	}
	start := d.cfg.Now()
	body := contract.Body(contract.Payload{
		JobID: r.JobID, RunID: r.ID, ScheduledFor: r.ScheduledFor,
		Attempt: r.Attempt, Late: r.Late, Trigger: r.Trigger,
	})
	ts := d.cfg.Now().Unix()
	header := http.Header{
		"Content-Type":       {contract.ContentType},
		"X-Vibe-Caller-Kind": {contract.CallerKindSchedule},
		"Vibe-Signature":     {contract.Sign(secret, ts, body)},
		"User-Agent":         {d.cfg.UserAgent},
		"Idempotency-Key":    {r.ID},
	}
	res := d.cfg.Sender.Post(context.Background(), c.URL, header, body, c.Timeout)
	end := d.cfg.Now()
	step := vibejobs.NextStep(c.Retry, r.Attempt, vibejobs.AttemptResult{
		StatusCode: res.StatusCode, ErrorCode: res.ErrorCode, RetryAfter: res.RetryAfter,
	}, r.DeadlineAt, end, d.cfg.Rand())
	if res.ErrorCode != "" {
		// The cause never names the URL or the address (egress guarantees it).
		d.cfg.Logger.Info("run.attempt_failed", "run_id", r.ID, "job_id", r.JobID, "attempt", r.Attempt,
			"status", res.StatusCode, "error_code", res.ErrorCode, "next_state", string(step.State))
	}
	if d.cfg.Observer != nil {
		// A first attempt sent again after an interruption was measured
		// when it first went out.
		first := r.Attempt == 1 && !c.LateDecided
		d.cfg.Observer.AttemptFinished(res.ErrorCode, step, start.Sub(r.ScheduledFor), first, end.Sub(start))
	}
	snippet := res.Snippet
	if len(snippet) > vibejobs.SnippetBytes {
		snippet = snippet[:vibejobs.SnippetBytes]
	}
	// Ended: what remains, the hand-over, waits for the record loop.
	endAttempt()
	d.outcomes <- vibejobs.Outcome{
		RunID:     r.ID,
		ClaimedAt: c.ClaimedAt,
		Attempt: vibejobs.Attempt{
			Number: r.Attempt, StartedAt: start, FinishedAt: end,
			StatusCode: res.StatusCode, ErrorCode: res.ErrorCode,
			SignatureTimestamp: ts, ResponseSnippet: strings.ToValidUTF8(string(snippet), "\uFFFD"),
		},
		Step: step,
	}
}

// endAttempt counts an attempt ended (or a task that ended without one),
// and closes attemptsIdle when it was the last.
func (d *Dispatcher) endAttempt() {
	if d.attempting.Add(-1) != 0 {
		return
	}
	d.mu.Lock()
	// Unless a task counted since (see taskLocked, under mu).
	if d.attemptsIdle != nil && d.attempting.Load() == 0 {
		close(d.attemptsIdle)
		d.attemptsIdle = nil
	}
	d.mu.Unlock()
}

// waitAttempts waits, once Run is stopping, until no attempt is in flight
// (see Dispatcher.attempting).
func (d *Dispatcher) waitAttempts() {
	d.mu.Lock()
	if d.attempting.Load() == 0 {
		d.mu.Unlock()
		return
	}
	idle := make(chan struct{})
	d.attemptsIdle = idle
	d.mu.Unlock()
	<-idle
}

// secretUnavailable gives back unsent the claim c, whose job's secret
// could not be opened (err): a fault of this process's key file, or of the
// stored ciphertext, not of the app, so it is no attempt. No error code
// of the spec fits, and an attempt recorded as network (as it was) told
// the owner their app failed and spent the run's attempts while the
// operator's fix, the key put back in the file, was still to come. The run
// keeps its attempt number and waits SecretUnavailablePause (capped at its
// deadline by ReleaseClaims, after which FailExpiredRuns fails it
// deadline_exceeded), so that a replica that holds the key, or this one
// once its file is mended, sends it, and a run whose secret stays
// unreadable does not spin. Each such claim is counted
// (Observer.SecretUnavailable); each job is logged once per
// secretLogEvery, with ids and the key id, never the ciphertext.
func (d *Dispatcher) secretUnavailable(c *vibejobs.Claim, err error) {
	now := d.cfg.Now()
	d.mu.Lock()
	last, logged := d.secretLogged[c.Run.JobID]
	log := !logged || now.Sub(last) >= secretLogEvery
	if log {
		for id, at := range d.secretLogged {
			if now.Sub(at) >= secretLogEvery {
				delete(d.secretLogged, id)
			}
		}
		d.secretLogged[c.Run.JobID] = now
	}
	d.mu.Unlock()
	if log {
		d.cfg.Logger.Error("dispatcher.secret_unavailable", "job_id", c.Run.JobID, "run_id", c.Run.ID,
			"key_id", c.Secret.KeyID, "error", err)
	}
	if d.cfg.Observer != nil {
		d.cfg.Observer.SecretUnavailable()
	}
	// The store caps the due time at the run's deadline.
	d.release([]*vibejobs.Claim{c}, now, now.Add(SecretUnavailablePause))
}

// recordLoop writes outcomes in batches until the channel closes. A batch
// the database cannot take (unavailable, or no answer within StoreTimeout)
// is retried for as long as the dispatcher runs: the runs stay leased to us
// meanwhile, and an outcome written late, even after its lease ended, still
// counts unless another process took the run over. Dropped, the outcome of
// an attempt the app accepted would have the run sent again once its lease
// ended, after a database outage as short as 21 s. While a batch waits, the
// outcomes behind it fill the channel and hold their slots, so no more is
// claimed. A batch refused for another reason, which retrying will not
// mend, is given up after 20 retries (about 20 s): its runs go to lease
// recovery. Once Run is stopping and its last attempt has finished, every
// batch not written within Config.StopRecordTimeout is given up, the call
// in progress then cut; until then, a stop changes nothing here.
func (d *Dispatcher) recordLoop() {
	batch := make([]vibejobs.Outcome, 0, DefaultFlushBatch)
	// drop gives the batch up, for lease recovery; reason is "refused" or
	// "stopping".
	drop := func(reason string) {
		d.cfg.Logger.Error("dispatcher.outcomes_dropped", "outcomes", len(batch), "reason", reason)
		d.recordFailing.Clear() // nothing left to fail: idle until the next outcome
	}
	flush := func() {
		left := 20 // retries of a refused batch
		for attempt := 0; len(batch) > 0; attempt++ {
			if d.writes.Err() != nil {
				drop("stopping")
				break
			}
			ctx, cancel := d.storeCtx(d.writes)
			err := d.cfg.Store.RecordOutcomes(ctx, d.cfg.Owner, batch)
			cancel()
			if err == nil {
				d.recordFailing.Clear()
				break
			}
			d.cfg.Logger.Error("dispatcher.record_failed", "error", err, "outcomes", len(batch))
			d.recordFailing.Fail(d.cfg.Now())
			outage := vibejobs.ErrorKind(err) == vibejobs.EUNAVAILABLE || errors.Is(err, context.DeadlineExceeded)
			if !outage {
				if left--; left < 0 {
					drop("refused")
					break
				}
			}
			pause := time.NewTimer(d.retryWait(attempt))
			select {
			case <-pause.C:
			case <-d.writes.Done():
				pause.Stop()
			}
		}
		batch = batch[:0]
	}
	for o := range d.outcomes {
		batch = append(batch, o)
	drain:
		for len(batch) < DefaultFlushBatch {
			select {
			case o, ok := <-d.outcomes:
				if !ok {
					break drain
				}
				batch = append(batch, o)
			default:
				break drain
			}
		}
		flush()
	}
	flush()
}
