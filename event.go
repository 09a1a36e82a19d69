package vibejobs

import (
	"slices"
	"time"
)

// EventType names a change in a project's feed.
type EventType string

// The event types. A run event is appended by the Store in the transaction
// that moves the run; a job event is appended by the caller of Update, in
// the transaction that changes the job (Tx.AppendEvents).
const (
	EventRunSucceeded     EventType = "run.succeeded"
	EventRunFailed        EventType = "run.failed"
	EventRunCancelled     EventType = "run.cancelled"
	EventRunRetrying      EventType = "run.retrying"
	EventJobCreated       EventType = "job.created"
	EventJobUpdated       EventType = "job.updated"
	EventJobPaused        EventType = "job.paused"
	EventJobResumed       EventType = "job.resumed"
	EventJobDeleted       EventType = "job.deleted"
	EventJobSecretRotated EventType = "job.secret_rotated"
)

// EventTypes lists every event type.
var EventTypes = []EventType{
	EventRunSucceeded, EventRunFailed, EventRunCancelled, EventRunRetrying,
	EventJobCreated, EventJobUpdated, EventJobPaused, EventJobResumed, EventJobDeleted, EventJobSecretRotated,
}

// ValidEventType reports whether s names an event type.
func ValidEventType(s string) bool { return slices.Contains(EventTypes, EventType(s)) }

// JobStateDeleted is the State of a job.deleted event.
const JobStateDeleted = "deleted"

// Event is one entry of a project's feed: a hint that something changed,
// with the ids, states, reason and times of the change. It never holds a
// secret, a URL or a body: its fields cannot.
//
// Sequence numbers a project's events 1, 2, 3… without gaps, in the order
// their transactions committed: a reader that has seen event N and reads
// after N misses nothing and sees nothing twice.
type Event struct {
	ProjectID  string
	Sequence   int64 // set by the Store when the event is appended
	Type       EventType
	OccurredAt time.Time
	JobID      string
	RunID      string // "" for a job event

	// State is the run's or the job's state after the change
	// (JobStateDeleted for job.deleted).
	State string
	// Reason is the run's failure or cancellation reason.
	Reason string
	// Attempt is the run's attempt the change concerns (0 before any).
	Attempt int
	// ErrorCode and StatusCode are those of the attempt that ended, if one did.
	ErrorCode  string
	StatusCode int
	// NextAt is a run.retrying event's next attempt, or a job event's next
	// run (nil when none).
	NextAt *time.Time
}

// JobEvent returns the event of type t about job j, as j is after the
// change, at time at.
func JobEvent(t EventType, j *Job, at time.Time) *Event {
	e := &Event{ProjectID: j.ProjectID, Type: t, OccurredAt: at, JobID: j.ID, State: string(j.State)}
	if t == EventJobDeleted {
		e.State = JobStateDeleted
	} else if j.NextRunAt != nil {
		next := *j.NextRunAt
		e.NextAt = &next
	}
	return e
}

// RunEventType is the type of the event of a run that moved to state.
// A run that is due again (retrying, or scheduled after an interrupted
// first attempt) is run.retrying.
func RunEventType(state RunState) EventType {
	switch state {
	case RunSucceeded:
		return EventRunSucceeded
	case RunFailed:
		return EventRunFailed
	case RunCancelled:
		return EventRunCancelled
	}
	return EventRunRetrying
}

// EventFilter selects events of a project for ListEvents.
type EventFilter struct {
	// After is the sequence to read after (0 for the start of the feed).
	After int64
	// Types and JobID narrow the events returned (empty: all).
	Types []EventType
	JobID string
	// Limit is 1–100 events (0 means 50).
	Limit int
}

// EventScanWindow bounds the work of one ListEvents: it looks at no more
// than this many sequences after After, so a narrow filter over a long feed
// returns fewer events (maybe none) and a Next that still moves on.
const EventScanWindow = 1000

// EventPage is one answer of ListEvents.
type EventPage struct {
	Events []*Event
	// Head is the project's latest sequence (0 before its first event).
	Head int64
	// Oldest is the lowest sequence the feed still holds: retention prunes
	// the feed from its start, so it holds every event from Oldest to Head
	// (Oldest is Head+1 when it holds none). A read after a sequence below
	// Oldest-1 starts at Oldest; its reader missed the events in between.
	Oldest int64
	// Next is where the next read continues (its After): every event up to
	// Next was looked at (or pruned). It equals After only when After ≥ Head.
	Next int64
}

// NextAfter is where a read of a feed continues after a page of events
// read after "after" (already past the pruned start) with this limit: the
// last event of a full page, else the end of the window looked at.
func NextAfter(after, head int64, limit int, events []*Event) int64 {
	after = max(after, 0)
	if len(events) == limit {
		return events[len(events)-1].Sequence
	}
	return max(after, min(head, after+EventScanWindow))
}

// Subscription sends a project's events, one at a time in sequence order,
// to a URL (a webhook). Its cursor moves only after the receiver accepted
// an event with a 2xx, or past an event the filters exclude.
type Subscription struct {
	ID        string
	ProjectID string
	URL       string
	Types     []EventType // empty: every type
	JobIDs    []string    // empty: every job
	Secret    SealedSecret
	// PreviousSecret is the secret the last rotation replaced (KeyID ""
	// when none): requests are signed with it as well until
	// PreviousExpiresAt.
	PreviousSecret    SealedSecret
	PreviousExpiresAt *time.Time
	// Cursor is the sequence of the last event handled.
	Cursor int64
	// ErrorCode is the error of the latest attempt while the subscription
	// is failing ("" when it is not); Attempts counts the receiver's failed
	// attempts at the event after Cursor (a failure of ours that left the
	// event unsent is not one), and NextAttemptAt is when it is tried again.
	ErrorCode     string
	Attempts      int
	NextAttemptAt *time.Time
	LastSuccessAt *time.Time
	CreatedAt     time.Time
	UpdatedAt     time.Time
}

// Failing reports whether the latest attempt failed.
func (s *Subscription) Failing() bool { return s.ErrorCode != "" }

// Matches reports whether the filters of s let e through.
func (s *Subscription) Matches(e *Event) bool {
	return (len(s.Types) == 0 || slices.Contains(s.Types, e.Type)) &&
		(len(s.JobIDs) == 0 || slices.Contains(s.JobIDs, e.JobID))
}

// Limits of subscriptions.
const (
	MaxSubscriptionsPerProject = 16
	MaxSubscriptionJobIDs      = 100
	SubscriptionMinBackoff     = 12 * time.Second
	SubscriptionMaxBackoff     = time.Hour
	// DefaultRotationGrace is how long a rotated subscription secret keeps
	// signing requests next to the new one.
	DefaultRotationGrace = 24 * time.Hour
)

// SubscriptionRetryPause is the pause after n (1-based) failed attempts at
// one event, jittered by u in [0, 1): SubscriptionBackoff(n) ±20 %, but
// never under SubscriptionMinBackoff, so that a subscription has at most 5
// failed attempts a minute. A success restarts the count at the next
// event, so a receiver refusing every second event would otherwise fail
// every 9.6 s at the lowest jitter, 7 times a minute.
func SubscriptionRetryPause(n int, u float64) time.Duration {
	return max(Jitter(SubscriptionBackoff(n), u), SubscriptionMinBackoff)
}

// SubscriptionBackoff is the pause after n (1-based) failed attempts at one
// event, before jitter: 12 s doubling up to 1 h.
func SubscriptionBackoff(n int) time.Duration {
	d := SubscriptionMinBackoff
	for i := 1; i < n && d < SubscriptionMaxBackoff; i++ {
		d *= 2
	}
	return min(d, SubscriptionMaxBackoff)
}

// SubscriptionStep is what one delivery step did to a subscription.
type SubscriptionStep struct {
	ID string
	At time.Time
	// Cursor is the last event handled; the stored cursor never moves back.
	// A step that moves it forward is past the event the subscription
	// failed at, if any: the failure state clears (or, with ErrorCode,
	// starts again at one attempt), whether the event was accepted or
	// passed over because the filters changed.
	Cursor int64
	// Delivered says the receiver accepted (a 2xx) events up to Cursor
	// since the last step, the latest at At: LastSuccessAt becomes At and,
	// unless ErrorCode is set too, the failure state clears.
	Delivered bool
	// ErrorCode, when set, says the event after Cursor failed: Attempts
	// grows by one (is one, when Cursor moved forward) and the
	// subscription waits until NextAttemptAt.
	ErrorCode     string
	NextAttemptAt time.Time
	// Unsent, with ErrorCode, says the event could not be sent, for a
	// reason of ours that does not pass by itself (a secret that does not
	// open): the subscription is failing with ErrorCode until NextAttemptAt
	// like after a refusal, but Attempts, the receiver's failures that set
	// its backoff, does not grow (is zero, when Cursor moved forward).
	Unsent bool
	// LeaseUntil extends the lease; zero releases it.
	LeaseUntil time.Time
	// Seen is the subscription's UpdatedAt as the session last read it
	// (zero: unchecked). A failure is recorded only if the settings are
	// unchanged since: a reset or a new URL in between makes it moot.
	Seen time.Time
}
