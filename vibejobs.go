package vibejobs

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"strings"
	"time"
	"unicode/utf8"
)

// JobState is the state a job shows.
type JobState string

const (
	JobActive    JobState = "active"
	JobPaused    JobState = "paused"
	JobCompleted JobState = "completed" // a one-off job whose run exists
)

// CatchUp says what happens to occurrences missed while the platform was down.
type CatchUp string

const (
	CatchUpAll    CatchUp = "all"
	CatchUpLatest CatchUp = "latest"
	CatchUpNone   CatchUp = "none"
)

// RunState is the state of a run.
type RunState string

const (
	RunScheduled  RunState = "scheduled"
	RunDelivering RunState = "delivering"
	RunRetrying   RunState = "retrying"
	RunSucceeded  RunState = "succeeded"
	RunFailed     RunState = "failed"
	RunCancelled  RunState = "cancelled"
)

// Finished reports whether s is terminal.
func (s RunState) Finished() bool {
	return s == RunSucceeded || s == RunFailed || s == RunCancelled
}

// ValidRunState reports whether s names a run state.
func ValidRunState(s string) bool {
	switch RunState(s) {
	case RunScheduled, RunDelivering, RunRetrying, RunSucceeded, RunFailed, RunCancelled:
		return true
	}
	return false
}

// Trigger values of a run.
const (
	TriggerSchedule = "schedule"
	TriggerManual   = "manual"
)

// Failure and cancellation reasons of a run.
const (
	ReasonAppRejected       = "app_rejected"
	ReasonAttemptsExhausted = "attempts_exhausted"
	ReasonDeadlineExceeded  = "deadline_exceeded"
	ReasonJobDeleted        = "job_deleted"
)

// ErrorCodeInterrupted marks an attempt whose process died while it was in flight.
const ErrorCodeInterrupted = "interrupted"

// Limits and defaults of the delivery rules (SEMANTICS.md sections 2–4).
const (
	DeliveryLifetime   = 96 * time.Hour
	LateThreshold      = 60 * time.Second
	DefaultMaxAttempts = 4
	MaxMaxAttempts     = 4
	DefaultMinBackoff  = 30 * time.Second
	DefaultMaxBackoff  = time.Hour
	MinMinBackoff      = time.Second
	MaxMinBackoff      = time.Hour
	MaxMaxBackoff      = 24 * time.Hour
	DefaultTimeout     = 10 * time.Second
	MinTimeout         = time.Second
	MaxTimeout         = 30 * time.Second
	MaxCatchUpRuns     = 100
	MaxURLLength       = 2048
	MaxNameLength      = 200
	// SnippetBytes of the response body are kept with an attempt.
	SnippetBytes = 1024
)

// RetryPolicy bounds the attempts of a run.
type RetryPolicy struct {
	MaxAttempts int
	MinBackoff  time.Duration
	MaxBackoff  time.Duration
}

// DefaultRetryPolicy is the policy of a job that sets none.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{MaxAttempts: DefaultMaxAttempts, MinBackoff: DefaultMinBackoff, MaxBackoff: DefaultMaxBackoff}
}

// SealedSecret is a job secret encrypted under the master key KeyID. The
// plaintext secret never reaches a Store.
type SealedSecret struct {
	KeyID      string
	Ciphertext []byte
}

// Project is a tenant: every job, run, token and event belongs to one.
type Project struct {
	ID            string
	Name          string
	RetentionDays int // 0: the installation default
	CreatedAt     time.Time
}

// Role of an API token.
type Role string

const (
	RoleAdmin Role = "admin"
	RoleWrite Role = "write"
	RoleRead  Role = "read"
)

// Token is an API token. Only the SHA-256 hash of the token is stored; Prefix is
// the readable start of the token so a leaked one can be recognised.
type Token struct {
	ID           string
	ProjectID    string
	Name         string
	Role         Role
	Installation bool // installation administrator: manages projects
	Prefix       string
	Hash         []byte
	CreatedAt    time.Time
	RevokedAt    *time.Time
}

// MaxTokensPerProject bounds a project's live tokens: those not revoked,
// installation tokens included. Minting one more is refused (ECONFLICT
// too_many_tokens) until one is revoked; revoked tokens are kept for the
// record, as long as the project's history (MaintenanceStore.
// PruneRevokedTokens), and do not count.
const MaxTokensPerProject = 100

// RunRef is the short form of a run shown on its job.
type RunRef struct {
	ID           string
	State        RunState
	ScheduledFor time.Time
}

// Job is a registered schedule and target.
type Job struct {
	ID        string
	ProjectID string
	Name      string
	// Schedule is a cron expression, macro or "@every <duration>"; empty for a one-off job.
	Schedule string
	// At is the instant of a one-off job; nil for a recurring one.
	At       *time.Time
	Timezone string
	URL      string
	Enabled  bool
	State    JobState
	Retry    RetryPolicy
	Timeout  time.Duration
	CatchUp  CatchUp
	// ScheduleAnchor is when the schedule was last set; "@every" fires at anchor + k·d.
	ScheduleAnchor time.Time
	// NextRunAt is the next occurrence not yet turned into a run; nil when none remains.
	NextRunAt   *time.Time
	LastRun     *RunRef // filled on read
	SkippedRuns int64
	Secret      SealedSecret
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// Attempt is one delivery attempt of a run.
type Attempt struct {
	Number             int
	StartedAt          time.Time
	FinishedAt         time.Time
	StatusCode         int    // 0 when no response
	ErrorCode          string // "" on success
	SignatureTimestamp int64  // 0 when the request was never signed (interrupted before sending)
	ResponseSnippet    string
}

// Duration of the attempt.
func (a Attempt) Duration() time.Duration { return a.FinishedAt.Sub(a.StartedAt) }

// Run is one occurrence of a job (or a manual trigger) and its delivery.
type Run struct {
	ID            string
	JobID         string
	ProjectID     string
	Trigger       string
	ScheduledFor  time.Time
	DeadlineAt    time.Time
	Late          bool // decided at the first attempt
	State         RunState
	Attempt       int // number of the latest attempt started; 0 before the first
	NextAttemptAt *time.Time
	FailureReason string
	CreatedAt     time.Time
	FinishedAt    *time.Time
	Attempts      []Attempt // filled by GetRun only
}

// NewRun returns a run in state scheduled, due at scheduledFor.
func NewRun(id string, j *Job, trigger string, scheduledFor, now time.Time) *Run {
	due := scheduledFor
	return &Run{
		ID: id, JobID: j.ID, ProjectID: j.ProjectID, Trigger: trigger,
		ScheduledFor: scheduledFor, DeadlineAt: scheduledFor.Add(DeliveryLifetime),
		State: RunScheduled, NextAttemptAt: &due, CreatedAt: now,
	}
}

// CheckDue returns an EINVALID error when r waits for an attempt due after
// its deadline. No attempt starts after the deadline, so no waiting run is
// due after it; the stores rely on that to find expired runs among those
// already due (see MaintenanceStore.FailExpiredRuns).
func (r *Run) CheckDue() error {
	if r.NextAttemptAt != nil && r.NextAttemptAt.After(r.DeadlineAt) {
		return Errorf(EINVALID, "run_due_after_deadline", "run %s is due at %s, after its deadline %s",
			r.ID, r.NextAttemptAt.Format(time.RFC3339Nano), r.DeadlineAt.Format(time.RFC3339Nano))
	}
	return nil
}

// CheckPlans returns the error of Run.CheckDue for the first run of plans
// that fails it. Resent plans are not checked: they are never applied, and
// one refused when first sent must not make every later call fail.
func CheckPlans(plans []RunPlan) error {
	for _, p := range plans {
		if p.Resent {
			continue
		}
		for _, r := range p.Runs {
			if err := r.CheckDue(); err != nil {
				return err
			}
		}
	}
	return nil
}

// CountResent returns what the resent plans of plans (RunPlan.Resent) add
// to ApplyRunPlans' answer, given found, the IDs of their runs that exist
// (a store reads them in the call's own transaction): those runs, which a
// failed call created and did not tell of, and the skipped occurrences of
// each resent plan with a run among them. A run is inserted only by the
// statement that applies its plan, and a run ID is never reused, so such
// a plan was applied by that failed call, its skips added to the job and
// told of by no one. A resent plan with no run found tells nothing: never
// applied, or applied with every run met by one that existed or withdrawn
// since; its skips, if any were applied, go uncounted.
func CountResent(plans []RunPlan, found []string) (created int, skipped int64) {
	if len(found) == 0 {
		return 0, 0
	}
	exists := make(map[string]bool, len(found))
	for _, id := range found {
		exists[id] = true
	}
	for _, p := range plans {
		if !p.Resent {
			continue
		}
		for _, r := range p.Runs {
			if exists[r.ID] {
				skipped += p.Skipped
				break
			}
		}
	}
	return len(exists), skipped
}

// IdempotencyRecord is a stored Idempotency-Key of the management API.
type IdempotencyRecord struct {
	ProjectID   string
	Key         string
	RequestHash []byte // hash of method, path and body: a reuse with another request is refused
	// Done is false while the first request is in progress.
	Done            bool
	ResponseStatus  int
	ResponseHeaders map[string]string
	ResponseBody    []byte
	// CreatedAt, the claiming request's time, identifies the claim: a
	// completion or release names it, and a claim taken over since is
	// another one.
	CreatedAt time.Time
	ExpiresAt time.Time
	// Age is set by GetIdempotencyKey (writes ignore it): how long before
	// the read the key was claimed, by the store's own clock. On
	// PostgreSQL that is the database server's clock, both for the claim
	// and the read, so replicas whose clocks disagree agree on a claim's
	// age; the now they pass and CreatedAt play no part in it. On SQLite,
	// whose writers share one machine's clock, it is the reader's now less
	// CreatedAt. The API takes an in-progress claim over once it is a
	// minute old.
	Age time.Duration
}

// NewID returns an id with prefix (for example "job_") followed by the time
// now in milliseconds (12 hex digits, so ids sort by it) and 16 random hex
// digits. It uses only [a-z0-9_]. now is the creation time, except for a
// scheduled run, whose id carries its occurrence's time (see the scheduler).
func NewID(prefix string, now time.Time, r io.Reader) string {
	if r == nil {
		r = rand.Reader
	}
	var b [14]byte
	ms := uint64(now.UnixMilli())
	for i := 5; i >= 0; i-- {
		b[i] = byte(ms)
		ms >>= 8
	}
	if _, err := io.ReadFull(r, b[6:]); err != nil {
		panic("vibejobs: reading random id bytes: " + err.Error())
	}
	var sb strings.Builder
	sb.Grow(len(prefix) + 28)
	sb.WriteString(prefix)
	sb.WriteString(hex.EncodeToString(b[:]))
	return sb.String()
}

// StorableText reports whether every store can hold s as text: valid UTF-8
// without NUL bytes (PostgreSQL refuses both, SQLite takes them). Input
// that fails it names nothing stored, so a lookup by it finds nothing on
// every store.
func StorableText(s string) bool { return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 }

// ValidIdempotencyKey reports whether the management API takes key as an
// Idempotency-Key: 1 to 255 printable ASCII characters, no space.
func ValidIdempotencyKey(key string) bool {
	if len(key) < 1 || len(key) > 255 {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return false
		}
	}
	return true
}
