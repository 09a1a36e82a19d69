package vibejobs

import (
	"context"
	"time"
)

// Page selects one page of a list. Cursor is opaque: the NextCursor of the
// previous page, or "" for the first. Limit is 1–100 (0 means 50).
type Page struct {
	Limit  int
	Cursor string
}

// RunFilter narrows ListRuns.
type RunFilter struct {
	JobID string   // "" for every job of the project
	State RunState // "" for every state
}

// Store is the persistence of the platform. Implementations: internal/sqlite
// and internal/postgres; internal/storetest is the conformance suite both pass.
//
// Every method that takes a projectID answers ENOTFOUND for a resource of
// another project, exactly as for one that does not exist. Deleted jobs are
// not found. Errors a user can act on are *Error; anything else is internal.
type Store interface {
	Reader

	// Update runs fn in one write transaction: its writes commit together when
	// fn returns nil and roll back otherwise. fn may be called again when the
	// database asks for a retry, so it must not have side effects beyond tx.
	Update(ctx context.Context, fn func(tx Tx) error) error

	SchedulerStore
	DispatchStore
	MaintenanceStore
	SubscriptionStore
	SessionStore

	// Ping checks that the database answers reads and takes writes, on
	// every connection pool the Store works with (readiness). It is asked
	// every few seconds: it must stay cheap.
	Ping(ctx context.Context) error
	// Close releases the database. Calls that began before it finish;
	// every call after it fails at once with an EUNAVAILABLE error, code
	// database_unavailable, as when the database does not answer: a server
	// that stops closes its store under the requests that outlasted the
	// drain, and they answer 503. Closing twice does no harm.
	Close() error
}

// Reader holds the read methods, usable on a Store or inside a Tx.
type Reader interface {
	GetProject(ctx context.Context, id string) (*Project, error)
	// ListProjects returns a page of every project of the installation in
	// id order: oldest first, but for the project created at the first
	// start, whose fixed id (prj_default) sorts after generated ones.
	ListProjects(ctx context.Context, p Page) (projects []*Project, nextCursor string, err error)
	// TokenByHash returns a token, revoked or not, by the SHA-256 of its value.
	TokenByHash(ctx context.Context, hash []byte) (*Token, error)
	// ListTokens returns a page of a project's tokens, revoked ones
	// included, in id order (oldest first).
	ListTokens(ctx context.Context, projectID string, p Page) (tokens []*Token, nextCursor string, err error)
	GetToken(ctx context.Context, id string) (*Token, error)

	GetJob(ctx context.Context, projectID, id string) (*Job, error)
	// ListJobs returns a project's jobs in id order (oldest first).
	ListJobs(ctx context.Context, projectID string, p Page) (jobs []*Job, nextCursor string, err error)
	CountJobs(ctx context.Context, projectID string) (int, error)

	// GetRun returns a run with its attempts in order.
	GetRun(ctx context.Context, projectID, id string) (*Run, error)
	// ListRuns returns runs newest first (by id), without attempts.
	ListRuns(ctx context.Context, projectID string, f RunFilter, p Page) (runs []*Run, nextCursor string, err error)

	// GetIdempotencyKey returns the record of key with its Age, or
	// ENOTFOUND; expired records (ExpiresAt ≤ now) are not found.
	GetIdempotencyKey(ctx context.Context, projectID, key string, now time.Time) (*IdempotencyRecord, error)

	// ListEvents reads a project's feed after f.After in sequence order: at
	// most f.Limit events of f.Types and f.JobID among the next
	// EventScanWindow sequences. The events, Head and Next come from one
	// snapshot, in which every event up to Head is visible: sequence order
	// is commit order, so continuing from Next never misses or repeats an
	// event that retention has not pruned. A read after a sequence below
	// Oldest-1 starts at Oldest. An invalid limit is EINVALID (invalid_limit).
	ListEvents(ctx context.Context, projectID string, f EventFilter) (EventPage, error)

	// GetSubscription returns a subscription of the project, or ENOTFOUND.
	GetSubscription(ctx context.Context, projectID, id string) (*Subscription, error)
	// ListSubscriptions returns a project's subscriptions in id order.
	ListSubscriptions(ctx context.Context, projectID string) ([]*Subscription, error)
}

// Tx is a write transaction. Its reads see its own writes.
type Tx interface {
	Reader

	CreateProject(ctx context.Context, p *Project) error
	UpdateProject(ctx context.Context, p *Project) error
	// CreateToken inserts t, unless t's project has limit live (not
	// revoked) tokens already: ECONFLICT too_many_tokens, decided
	// atomically against concurrent creations. An id or hash in use is
	// ECONFLICT token_exists, a missing project ENOTFOUND.
	CreateToken(ctx context.Context, t *Token, limit int) error
	RevokeToken(ctx context.Context, id string, at time.Time) error

	// CreateJob inserts j (j.ID set by the caller).
	CreateJob(ctx context.Context, j *Job) error
	// UpdateJob writes every mutable field of j: name, schedule, at, timezone,
	// url, enabled, state, retry, timeout, catchUp, scheduleAnchor, nextRunAt,
	// secret and updatedAt.
	UpdateJob(ctx context.Context, j *Job) error
	// DeleteJob removes the job from view and cancels (reason job_deleted)
	// every run of it that waits in scheduled or retrying with no attempt
	// in flight and whose deadline is not past at, appending a
	// run.cancelled event for each (the caller appends job.deleted). A run
	// in delivering finishes its attempt; RecordOutcomes then ends it
	// instead of retrying. A waiting run past its deadline is left to
	// FailExpiredRuns: the deadline is scheduledFor + DeliveryLifetime, so
	// the runs to cancel are found among the job's last DeliveryLifetime
	// of occurrences by (job, scheduledFor), never by reading the job's
	// whole history (millions of runs for a job that fires every second).
	DeleteJob(ctx context.Context, projectID, id string, at time.Time) error
	// DeleteFutureRuns deletes the job's schedule-triggered runs that no attempt
	// has started and whose scheduledFor is after t: occurrences materialised
	// ahead of time that a pause or a schedule change withdraws. A run some
	// process holds (claimed ahead of its time, no attempt recorded) stays,
	// since only its holder knows whether it went out, but is marked
	// withdrawn: given back unsent (ReleaseClaims) it is deleted then, sent
	// it is recorded as any other, and planned again first (ApplyRunPlans
	// with the same occurrence: a resume, or a new schedule sharing it) it
	// loses the mark. On PostgreSQL the commit tells every replica to give
	// back its held runs of the job.
	DeleteFutureRuns(ctx context.Context, jobID string, after time.Time) (int, error)
	// AddSkippedRuns adds n to the SkippedRuns of the live job id of
	// projectID (ENOTFOUND otherwise): occurrences due and never planned
	// that a pause or a schedule change skips for good, while the
	// scheduler was behind. It adds to the count as stored, so it counts
	// with the scheduler's own additions (ApplyRunPlans), never over them.
	AddSkippedRuns(ctx context.Context, projectID, id string, n int64) error
	// CreateRun inserts a manual run. Its job must be a live job of the
	// run's project (ENOTFOUND otherwise). A run due after its deadline is
	// refused (EINVALID, see Run.CheckDue).
	CreateRun(ctx context.Context, r *Run) error

	// InsertIdempotencyKey stores a new in-progress record, whose Age
	// starts then. A live record with the same (project, key) gives
	// ECONFLICT; an expired one is replaced.
	InsertIdempotencyKey(ctx context.Context, rec *IdempotencyRecord) error
	// CompleteIdempotencyKey stores the response of rec and marks it done,
	// only while the record is the claim in progress that was made at
	// rec.CreatedAt; otherwise (the claim was taken over by a later request,
	// or is gone) it answers ENOTFOUND and changes nothing. So of two
	// requests that held the key in turn, one completes it, and the other's
	// effect, committing with its completion, rolls back.
	CompleteIdempotencyKey(ctx context.Context, rec *IdempotencyRecord) error
	// DeleteIdempotencyKey deletes the claim of key made at createdAt while
	// it is still in progress, or answers ENOTFOUND: the claim of a request
	// that took the key over since, and a completed record, are left alone.
	// A request slower than the takeover limit may complete its claim while
	// another takes it over; deleting the completed record would let the
	// effect run again under the same key.
	DeleteIdempotencyKey(ctx context.Context, projectID, key string, createdAt time.Time) error
	// CompletedIdempotencyKeys lists up to limit completed records, expired
	// ones included, after (afterProject, afterKey) in (project, key)
	// order, for master key rotation: their stored answers are sealed.
	CompletedIdempotencyKeys(ctx context.Context, afterProject, afterKey string, limit int) ([]*IdempotencyRecord, error)
	// SetIdempotencyAnswer replaces the stored headers and body of rec's
	// completed record, only while it is the record completed from the
	// claim made at rec.CreatedAt; otherwise it answers ENOTFOUND.
	SetIdempotencyAnswer(ctx context.Context, rec *IdempotencyRecord) error

	// SecretsNotUnder lists jobs whose secret is sealed under another key than keyID
	// (deleted jobs included), for master key rotation;
	// SetJobSecret replaces one.
	SecretsNotUnder(ctx context.Context, keyID string, limit int) ([]*Job, error)
	SetJobSecret(ctx context.Context, jobID string, s SealedSecret) error
	// RecordMasterKey records keyID as the id of the database's master key
	// unless one is recorded already, and returns the recorded id. Every
	// server sharing the database checks at start that its key file holds
	// that key: servers with different key files would seal secrets the
	// others cannot open. Of concurrent first calls, one records its id
	// and the others return it.
	RecordMasterKey(ctx context.Context, keyID string) (string, error)
	// SetMasterKey records keyID as the database's master key, replacing
	// the one recorded: master key rotation, once every secret is sealed
	// under it.
	SetMasterKey(ctx context.Context, keyID string) error

	// AppendEvents appends events to their projects' feeds, numbering them
	// (Event.Sequence) in the order given; they commit with the
	// transaction or not at all. The API appends the job events with it.
	//
	// A project's feed has one counter that every appending transaction
	// holds from its append until it ends: call AppendEvents last, after
	// the transaction's other writes, so the counter is held briefly and
	// always after any row lock the transaction takes (no lock cycles).
	AppendEvents(ctx context.Context, events ...*Event) error

	// CreateSubscription inserts s with its cursor at the project's head (a
	// new subscription gets no history), unless the project has limit
	// subscriptions already: ECONFLICT too_many_subscriptions, decided
	// atomically against concurrent creations. It sets s.Cursor.
	CreateSubscription(ctx context.Context, s *Subscription, limit int) error
	// UpdateSubscription writes url, types, jobIDs, the secrets, attempts,
	// nextAttemptAt and updatedAt of s. The stored updatedAt is s.UpdatedAt,
	// or a millisecond after the one it replaces if s.UpdatedAt is not
	// later, so that every change moves it (a delivery session notices a
	// change by it); s.UpdatedAt is set to it.
	UpdateSubscription(ctx context.Context, s *Subscription) error
	DeleteSubscription(ctx context.Context, projectID, id string) error
	// ResetSubscription moves the cursor to the project's head and clears
	// the failure state (ErrorCode, Attempts, NextAttemptAt): the events
	// in between are never sent. UpdatedAt becomes at, moved on as
	// UpdateSubscription moves it. It returns the subscription as stored.
	ResetSubscription(ctx context.Context, projectID, id string, at time.Time) (*Subscription, error)
	// SubscriptionSecretsNotUnder lists subscriptions with a secret (current
	// or previous) sealed under another key than keyID, for master key
	// rotation; SetSubscriptionSecrets replaces both, and a zero previous
	// secret clears its expiry too (a subscription then has no previous
	// secret at all).
	SubscriptionSecretsNotUnder(ctx context.Context, keyID string, limit int) ([]*Subscription, error)
	SetSubscriptionSecrets(ctx context.Context, id string, current, previous SealedSecret) error
}

// RunEnd is a final state of a run and its failure reason ("" for
// succeeded).
type RunEnd struct {
	State  RunState
	Reason string
}

// RunsEnded counts the runs that reached a final state, by state and reason.
type RunsEnded map[RunEnd]int

// Add counts n more runs that ended in state with reason.
func (e RunsEnded) Add(state RunState, reason string, n int) {
	if n > 0 && state.Finished() {
		e[RunEnd{state, reason}] += n
	}
}

// RunsEndedNotifier is a Store that tells of the runs it ended: after every
// transaction that ended runs commits (outcomes recorded, claims released,
// leases recovered, expired runs failed, a deleted job's runs cancelled), it
// calls f with them. A count made from what committed is exact where one
// made from what a process asked for is not: an outcome that lost its lease
// is dropped, and a retrying step of a deleted job's run cancels it.
type RunsEndedNotifier interface {
	// OnRunsEnded sets f, for the transactions that commit from then on.
	// f must be cheap and safe for concurrent use.
	OnRunsEnded(f func(RunsEnded))
}

// AttemptOutcome is how a recorded attempt left its run: the state the
// run moved to and the attempt's error code ("" for a 2xx).
type AttemptOutcome struct {
	State     RunState
	ErrorCode string
}

// AttemptsRecorded counts the attempts RecordOutcomes recorded, by outcome.
type AttemptsRecorded map[AttemptOutcome]int

// AttemptsRecordedNotifier is a Store that tells of the attempts whose
// outcome it recorded: after every transaction of RecordOutcomes that
// recorded attempts commits, it calls f with them, each by the state its
// run moved to (succeeded, failed, retrying; cancelled for a retrying step
// of a deleted job's run, failed for one whose next attempt falls after the
// deadline) and its error code. An outcome dropped for a lost lease is not
// told of (the process that recovered the run records the attempt as
// interrupted and sends it again); one committed whose RecordOutcomes
// failed after the commit (its answer lost) is told of once, by the call
// that sends it again, which the caller makes only after a call that
// failed. The attempts RecoverExpiredLeases
// records as interrupted are not told of. Counted from what committed, as
// RunsEndedNotifier's, the attempts of a run sum to one per attempt
// recorded, over every replica.
type AttemptsRecordedNotifier interface {
	// OnAttemptsRecorded sets f, for the transactions that commit from
	// then on. f must be cheap and safe for concurrent use.
	OnAttemptsRecorded(f func(AttemptsRecorded))
}

// RunPlan is what the scheduler decided for one due job: the runs to create
// and where its schedule continues.
type RunPlan struct {
	JobID string
	// From is the job's NextRunAt the plan was computed from. The plan applies
	// only while the job still has it (so two replicas cannot both apply one).
	From time.Time
	// Anchor is the job's ScheduleAnchor the plan was computed from. A change
	// of schedule, time zone or at sets a new anchor, and the plan then no
	// longer applies, even when the new schedule's next time is From.
	Anchor time.Time
	// Next is the job's new NextRunAt; nil when the schedule has no more occurrences.
	Next *time.Time
	// Runs to create; one that already exists for (job, scheduledFor) is skipped.
	Runs []*Run
	// Skipped occurrences (catch-up) to add to the job's SkippedRuns.
	Skipped int64
	// Complete marks a one-off job completed.
	Complete bool
	// Resent marks a plan sent again because every call that sent it
	// before failed: one of them may have committed it and lost its
	// answer (a connection cut after the commit, a timeout), so neither
	// told of the runs it created. A resent plan is never applied, nor
	// checked (its job, if no call committed it, is planned afresh);
	// those of its Runs that exist, found by ID, are the runs such a call
	// created, and ApplyRunPlans counts them in created. A run ID is
	// never reused, so a run another caller created for one of its
	// occurrences is not among them. A resent plan with such a run was
	// applied by that call, and ApplyRunPlans counts its Skipped in
	// skipped too (see CountResent). A caller sends a plan again only
	// while every call that sent it failed: once one succeeded, its runs
	// have been told of, and would be counted twice. It need not send
	// again a plan it knows no call applied: one whose job it read, after
	// every call that sent the plan had failed, still at the plan's From
	// and Anchor (applied, the plan would have moved the job on).
	Resent bool
}

// DuePosition is a job's place in the order of DueJobs: by NextRunAt, then
// by ID. The zero DuePosition comes before every job.
type DuePosition struct {
	NextRunAt time.Time
	JobID     string
}

// SchedulerStore turns due occurrences into runs.
type SchedulerStore interface {
	// DueJobs returns up to limit active, enabled jobs whose NextRunAt ≤
	// before and whose position comes after after, earliest first (by
	// NextRunAt, then ID). Continuing from the last job returned passes
	// jobs that stay due: a job whose schedule the caller cannot plan keeps
	// its NextRunAt, and would otherwise head every list.
	DueJobs(ctx context.Context, before time.Time, after DuePosition, limit int) ([]*Job, error)
	// ApplyRunPlans applies each plan atomically (runs inserted, job advanced),
	// skipping a plan whose job moved on (NextRunAt ≠ From), whose schedule
	// changed (ScheduleAnchor ≠ Anchor), or that was paused or deleted.
	// At most one schedule-triggered run exists per (job, scheduledFor): a
	// unique constraint, not a check-then-insert.
	// A plan with a run due after its deadline is refused as a whole
	// (EINVALID, see Run.CheckDue), before any plan is applied. It returns the
	// runs created and the skipped occurrences of the plans it applied (one it
	// skipped counts neither: another replica applied it, or it is stale).
	// The runs created include those of resent plans (RunPlan.Resent) that
	// exist: a call that failed created them, and did not tell of them;
	// and the skipped occurrences include those of each resent plan with
	// a run that exists, which that call applied (see CountResent). So
	// the runs a caller is told of sum to the runs its calls committed,
	// once each, provided it resends the plans of every call that failed
	// (but those it knows no call applied) with its next call, until a
	// call succeeds; but for a run deleted in between (withdrawn by a
	// pause or a schedule change), which is found no more. The skipped
	// occurrences it is told of sum likewise to those its calls applied,
	// but for those of a plan that a failed call applied and that left
	// no run of its own behind: nothing tells that plan's application
	// from another caller's plan of the same job and From.
	ApplyRunPlans(ctx context.Context, plans []RunPlan, now time.Time) (created int, skipped int64, err error)
}

// Claim is a run moved to delivering under a lease, with the job's delivery
// settings as they are at this attempt's start.
type Claim struct {
	Run *Run // Run.Attempt is the number of this attempt; Run.Late is decided
	// ClaimedAt is when this claim was made, as the store keeps it: it tells
	// this claim from an earlier one of the run by the same owner with the
	// same attempt number (a redelivery after the first lease expired).
	ClaimedAt time.Time
	// LateDecided says that Run.Late was decided by an earlier claim, not
	// this one: so for every attempt after the first, and for a first
	// attempt sent again after its claim's lease was recovered. Only a
	// first attempt this claim decided is a first attempt for the
	// first-attempt lateness it reports.
	LateDecided bool
	// DueAt is when the run was due: its NextAttemptAt as the claim found
	// it. A claim made ahead of time is held until then.
	DueAt   time.Time
	URL     string
	Secret  SealedSecret
	Timeout time.Duration
	Retry   RetryPolicy
}

// Outcome is a finished attempt and the run's next step.
type Outcome struct {
	RunID string
	// ClaimedAt is the ClaimedAt of the claim the attempt was sent under.
	ClaimedAt time.Time
	Attempt   Attempt
	Step      Step
}

// ClaimReader is a DispatchStore that can read back a claim whose answer was
// lost. ClaimDueRuns may fail after its statement committed (a connection
// cut, a timeout on the way back): its runs are then leased to an owner that
// does not know of them, and would wait for lease recovery (the attempt's
// timeout and the lease margin) to be sent, with an interrupted attempt
// recorded that never went out. A dispatcher whose claim failed reads them
// back instead and sends them as the claim would have.
type ClaimReader interface {
	// ReadClaims returns the claims that owner's ClaimDueRuns at now made
	// and that still hold their lease, as ClaimDueRuns returned them (the
	// attempt number and lateness the claim decided, its DueAt and
	// LateDecided), with the job's delivery settings as they are now, in
	// DueAt order; none when that claim did not commit, or when its leases
	// ended since. now is the time given to ClaimDueRuns.
	ReadClaims(ctx context.Context, owner string, now time.Time) ([]*Claim, error)
}

// DispatchStore is the runs table used as the queue.
type DispatchStore interface {
	// ClaimDueRuns moves up to limit runs in scheduled or retrying with
	// NextAttemptAt ≤ now and DeadlineAt ≥ now to delivering, in NextAttemptAt
	// order, leased to owner until now + the job's timeout + leaseMargin. The
	// attempt number grows by one, except for a run redelivered after an
	// interruption, which keeps its number. Late is decided at the first
	// attempt and kept.
	ClaimDueRuns(ctx context.Context, owner string, now time.Time, limit int, leaseMargin time.Duration) ([]*Claim, error)
	// NextDueAt returns the earliest NextAttemptAt of a claimable run.
	NextDueAt(ctx context.Context) (t time.Time, ok bool, err error)
	// RecordOutcomes records each attempt and moves its run to the outcome's
	// step, only while the run is still delivering under the lease of the
	// claim the outcome names (owner, attempt number and ClaimedAt): an
	// outcome that lost its lease is dropped, even when the same owner has
	// claimed the run again since. A retrying step of a deleted
	// job's run becomes cancelled (job_deleted), and one whose next attempt
	// (NextAttemptAt, or the attempt's end when nil) falls after the run's
	// deadline fails (deadline_exceeded). Each run moved gets its
	// event (run.succeeded, run.failed, run.cancelled or run.retrying) in
	// the same transaction; one call takes each project's feed counter once.
	RecordOutcomes(ctx context.Context, owner string, outcomes []Outcome) error
	// ReleaseClaims puts the runs of owner's claims, never sent, back to be
	// claimed again from due (NextAttemptAt; one after the run's deadline is
	// taken as the deadline, or now if that passed). A due at or before now
	// makes a run claimable at once in its place in line: due at its
	// claim's DueAt, or now if that is later, so that runs due after it do
	// not overtake it (caught-up occurrences go out in order). Only while
	// the run is still delivering under the lease of that claim (owner and
	// ClaimedAt): a
	// claim whose lease expired and was recovered is left alone with the
	// run, even when the same owner has claimed the run again since
	// (released, that newer claim's attempt would be sent twice). Late is
	// decided again only for a first attempt no claim ever sent (no attempt
	// recorded). A released run's Attempt goes back to the last attempt
	// started (0 for none), whose successor its next claim takes again; a
	// redelivery (its number went out before and was interrupted) keeps its
	// number, to be sent again. A run of a deleted job is cancelled instead, finished at
	// now, with its run.cancelled event occurring at now: now is the time of
	// the release, due only when the run may go out again (a run given back
	// to wait, as for a secret this process cannot open). A run whose
	// attempt number is beyond its job's MaxAttempts as it is at the
	// release (lowered since the run's last attempt) fails instead
	// (attempts_exhausted), finished at now with its run.failed event, its
	// Attempt back to the last attempt recorded. A run never sent that
	// DeleteFutureRuns marked withdrawn is deleted.
	ReleaseClaims(ctx context.Context, owner string, claims []*Claim, now, due time.Time) error
}

// DashboardSession is one dashboard login. It lives in the database, so
// every replica behind a load balancer knows it. Key is the SHA-256 of the
// session id the browser holds; the id itself is never stored.
type DashboardSession struct {
	Key       []byte
	TokenID   string
	ProjectID string
	ExpiresAt time.Time
}

// SessionStore keeps dashboard logins.
type SessionStore interface {
	// CreateSession stores s; then, when s's token has more than max
	// sessions, it ends the ones that expire first (max ≤ 0: no bound).
	CreateSession(ctx context.Context, s *DashboardSession, max int) error
	// GetSession returns the session of key while it is live at now
	// (ExpiresAt > now), else ENOTFOUND.
	GetSession(ctx context.Context, key []byte, now time.Time) (*DashboardSession, error)
	// DeleteSession ends the session of key; ending none is not an error.
	DeleteSession(ctx context.Context, key []byte) error
	// PruneSessions deletes up to limit sessions expired at now.
	PruneSessions(ctx context.Context, now time.Time, limit int) (int, error)
}

// SubscriptionStore is the subscriptions table used by the delivery loop of
// every replica. A subscription is worked by one owner at a time, under a
// lease on its row.
type SubscriptionStore interface {
	// ClaimSubscriptions leases to owner, until now + lease, up to limit
	// subscriptions that have events after their cursor, are not waiting
	// for a retry (NextAttemptAt ≤ now) and are not leased (or the lease
	// expired), least recently served first: those never leased, then by
	// when their last lease ended (the At of the step that released it,
	// or its expiry), ties in id order. Failing or not makes no
	// difference once a retry is due, so under overload every
	// subscription with work is served in turn.
	ClaimSubscriptions(ctx context.Context, owner string, now time.Time, limit int, lease time.Duration) ([]*Subscription, error)
	// RecordSubscriptionStep applies st while owner holds the
	// subscription's lease and returns the subscription as it is then; it
	// returns nil and no error when owner lost the lease or the
	// subscription was deleted. A failed step releases the lease, as does
	// one with a zero LeaseUntil; either way st.At is when the lease
	// ended, for ClaimSubscriptions' order.
	RecordSubscriptionStep(ctx context.Context, owner string, st SubscriptionStep) (*Subscription, error)
	// AllSubscriptions lists every project's subscriptions (for metrics).
	AllSubscriptions(ctx context.Context) ([]*Subscription, error)
}

// QueueStats are gauges of the queue.
type QueueStats struct {
	Due          int           // claimable now and not claimed
	OldestDueAge time.Duration // now − NextAttemptAt of the oldest of them
}

// MaintenanceStore holds the background tasks; each is safe to run on every
// replica at once.
type MaintenanceStore interface {
	// RecoverExpiredLeases ends the attempts of runs in delivering whose lease
	// expired before now as interrupted and makes the runs claimable again
	// under the same attempt number (or failed, deadline_exceeded, when their
	// deadline passed). It returns how many runs it recovered. Each gets its
	// event: run.retrying (error code interrupted, next attempt now), or
	// run.failed / run.cancelled when it ended.
	RecoverExpiredLeases(ctx context.Context, now time.Time, limit int) (int, error)
	// FailExpiredRuns fails (deadline_exceeded) runs waiting in scheduled or
	// retrying whose deadline passed, each with its run.failed event. A
	// store may look for them among the runs due by now only: a waiting
	// run is due by its deadline (see Run.CheckDue, RecordOutcomes and
	// ReleaseClaims), or by the time it was put back after it
	// (ReleaseClaims, RecoverExpiredLeases).
	FailExpiredRuns(ctx context.Context, now time.Time, limit int) (int, error)
	// PruneRuns deletes up to limit finished runs (and their attempts) that
	// finished before cutoff; an unfinished run is never pruned.
	PruneRuns(ctx context.Context, projectID string, cutoff time.Time, limit int) (int, error)
	// PruneDeletedJobs deletes up to limit of the project's jobs deleted
	// before cutoff that no run refers to any more (their runs were
	// pruned). A deleted job is already invisible; this bounds the rows
	// that a project creating and deleting jobs leaves behind.
	PruneDeletedJobs(ctx context.Context, projectID string, cutoff time.Time, limit int) (int, error)
	// PruneRevokedTokens deletes up to limit of the project's tokens
	// revoked before cutoff, the earliest revoked first. A live token is
	// never pruned, so the live tokens MaxTokensPerProject counts are the
	// same before and after. Revoked tokens are kept for the record (they
	// are listed, and a request carrying one is told it was revoked) as
	// long as the project's history; this bounds the rows a project
	// minting and revoking tokens leaves behind.
	PruneRevokedTokens(ctx context.Context, projectID string, cutoff time.Time, limit int) (int, error)
	// PruneEvents deletes up to limit of the project's events from the start
	// of its feed, in sequence order, that occurred before cutoff and that
	// every subscription of the project has passed (its cursor is at or
	// after them). It stops at the first event that is not so, so the feed
	// keeps every event from its Oldest to its Head.
	PruneEvents(ctx context.Context, projectID string, cutoff time.Time, limit int) (int, error)
	// PruneIdempotencyKeys deletes up to limit records expired before now.
	PruneIdempotencyKeys(ctx context.Context, now time.Time, limit int) (int, error)
	QueueStats(ctx context.Context, now time.Time) (QueueStats, error)
}
