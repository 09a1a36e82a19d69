// Package metrics holds the platform's Prometheus collectors. Labels carry
// states, reasons and error codes only: never a URL, secret or body. The
// series that name a project or a subscription are kept apart, for the
// installation administrator alone (InstallationHandler): anyone who can
// reach /metrics may read Handler's, and a tenant must not learn of the
// others.
package metrics

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/egress"
)

// Metrics implements the observers of the scheduler, dispatcher and
// maintenance packages. The zero value is not usable; call New.
type Metrics struct {
	reg *prometheus.Registry
	// perProject holds the series labelled with project ids.
	perProject   *prometheus.Registry
	runsCreated  *prometheus.CounterVec
	runsFinished *prometheus.CounterVec
	attempts     *prometheus.CounterVec
	duration     prometheus.Histogram
	lateness     prometheus.Histogram
	queue        *lastKnown[vibejobs.QueueStats]
	leases       prometheus.Counter
	skipped      prometheus.Counter
	secrets      prometheus.Counter
	unplannable  *lastKnown[int]
}

// New registers every collector, with the Go and process collectors, on a
// fresh registry.
func New() *Metrics {
	m := &Metrics{
		reg:        prometheus.NewRegistry(),
		perProject: prometheus.NewRegistry(),
		runsCreated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vibejobs_runs_created_total", Help: "Runs this process created, counted when the database committed them, by trigger: schedule (occurrences, created up to 2 s ahead of their time) or manual. A schedule run withdrawn before its time by a pause or a schedule change is deleted unsent and never reaches vibejobs_runs_finished_total, and its occurrence counts again if a resume creates it again."},
			[]string{"trigger"}),
		runsFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vibejobs_runs_finished_total", Help: "Runs that reached a final state, by state and reason."},
			[]string{"state", "reason"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vibejobs_attempts_total", Help: "Delivery attempts this process sent whose outcome the database recorded, counted at the commit, by the state the run moved to (succeeded, retrying, failed, or cancelled when its job was deleted meanwhile) and error code. An outcome dropped because the run's lease was lost (another process recovered the run, records the attempt as interrupted and sends it again) is not counted; vibejobs_delivery_duration_seconds counts every attempt sent."},
			[]string{"outcome", "error_code"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vibejobs_delivery_duration_seconds", Help: "Duration of delivery attempts.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}),
		lateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vibejobs_first_attempt_lateness_seconds", Help: "Start of first attempts minus scheduledFor, up to the 96 h delivery lifetime.",
			Buckets: latenessBuckets}),
		queue: newLastKnown(vibejobs.QueueStats{}, func(s vibejobs.QueueStats, ch chan<- prometheus.Metric) {
			ch <- prometheus.MustNewConstMetric(runsDueDesc, prometheus.GaugeValue, float64(s.Due))
			ch <- prometheus.MustNewConstMetric(oldestDueDesc, prometheus.GaugeValue, s.OldestDueAge.Seconds())
		}, runsDueDesc, oldestDueDesc),
		leases: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vibejobs_leases_recovered_total", Help: "Runs whose lease expired, their attempt recorded as interrupted: made claimable again, or ended when past their deadline or their job was deleted."}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vibejobs_skipped_occurrences_total", Help: "Occurrences skipped by catch-up rules, or already past the delivery lifetime when the scheduler reached them, or due and not yet planned when a pause or a schedule change skipped them."}),
		secrets: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vibejobs_secret_unavailable_total", Help: "Claims this process gave back unsent because it could not open their job's secret (sealed under a master key its key file lacks, or corrupt): no attempt is sent or recorded; the run waits 30 s and is claimed again, by any replica, until its delivery lifetime ends."}),
		unplannable: newLastKnown(0, func(n int, ch chan<- prometheus.Metric) {
			ch <- prometheus.MustNewConstMetric(unplannableDesc, prometheus.GaugeValue, float64(n))
		}, unplannableDesc),
	}
	m.knownSeries()
	m.reg.MustRegister(m.runsCreated, m.runsFinished, m.attempts, m.duration, m.lateness,
		m.queue, m.leases, m.skipped, m.secrets, m.unplannable,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// latenessBuckets are the upper bounds, in seconds, of the first-attempt
// lateness histogram: fine ones for a platform that keeps up (the lateness
// of a busy second is tens of milliseconds), then minutes, hours and days
// up to the delivery lifetime, after which no attempt starts, so that an
// outage's backlog (a run can be sent up to 96 h late) tells 11 minutes
// late from 3 days late rather than put both in +Inf.
var latenessBuckets = []float64{
	.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5, 60, 600,
	30 * 60, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 24 * 3600, 48 * 3600, 72 * 3600,
	vibejobs.DeliveryLifetime.Seconds(),
}

// attemptErrorCodes are the error codes of an attempt sent whose outcome
// is recorded (egress's codes, but interrupted: a process that shuts down
// records no outcome for the attempts it cut short, and the attempts a
// lease recovery records as interrupted are not counted).
var attemptErrorCodes = []string{egress.CodeBlocked, egress.CodeDNS, egress.CodeTimeout, egress.CodeNetwork,
	egress.CodeTLS, egress.CodeRedirect, egress.CodeHTTP4xx, egress.CodeHTTP5xx}

// knownSeries creates, at 0, every series of the labelled counters whose
// label values are known in advance. A series that first appears at 1
// hides that increment from rate() and increase(): an alert on runs
// failing, or attempts blocked, would miss the first one after a start.
func (m *Metrics) knownSeries() {
	for _, t := range []string{vibejobs.TriggerSchedule, vibejobs.TriggerManual} {
		m.runsCreated.WithLabelValues(t)
	}
	for _, e := range []vibejobs.RunEnd{
		{State: vibejobs.RunSucceeded},
		{State: vibejobs.RunFailed, Reason: vibejobs.ReasonAppRejected},
		{State: vibejobs.RunFailed, Reason: vibejobs.ReasonAttemptsExhausted},
		{State: vibejobs.RunFailed, Reason: vibejobs.ReasonDeadlineExceeded},
		{State: vibejobs.RunCancelled, Reason: vibejobs.ReasonJobDeleted},
	} {
		m.runsFinished.WithLabelValues(string(e.State), e.Reason)
	}
	m.attempts.WithLabelValues(string(vibejobs.RunSucceeded), "")
	for _, state := range []vibejobs.RunState{vibejobs.RunRetrying, vibejobs.RunFailed, vibejobs.RunCancelled} {
		for _, code := range attemptErrorCodes {
			m.attempts.WithLabelValues(string(state), code)
		}
	}
}

// Handler serves, in the Prometheus text format, the metrics that name no
// project.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// InstallationHandler serves Handler's metrics and the per-project series
// (WatchSubscriptions'), for the installation administrator.
func (m *Metrics) InstallationHandler() http.Handler {
	return promhttp.HandlerFor(prometheus.Gatherers{m.reg, m.perProject}, promhttp.HandlerOpts{})
}

// RunsCreated counts runs the scheduler created (committed): withdrawn
// ones deleted later by a pause or a schedule change included. Runs whose
// ApplyRunPlans call lost its answer after the commit are counted when
// the scheduler's next call succeeds (see scheduler.Config.OnRunsCreated).
func (m *Metrics) RunsCreated(n int) {
	m.runsCreated.WithLabelValues(string(vibejobs.TriggerSchedule)).Add(float64(n))
}

// ManualRunCreated counts a manual run created through the API.
func (m *Metrics) ManualRunCreated() {
	m.runsCreated.WithLabelValues(string(vibejobs.TriggerManual)).Inc()
}

// Skipped counts occurrences skipped by catch-up, and those a pause or a
// schedule change skipped before the scheduler reached them (see
// api.Config.OccurrencesSkipped). Those of an
// ApplyRunPlans call that lost its answer after the commit are counted
// when the scheduler's next call succeeds, if a run of their plan is
// found then (see scheduler.Config.OnSkipped).
func (m *Metrics) Skipped(n int64) { m.skipped.Add(float64(n)) }

// Unplannable sets the number of due jobs the scheduler could not plan at
// a scan that succeeded.
func (m *Metrics) Unplannable(n int) { m.unplannable.set(n) }

// UnplannableUnknown says a scan failed (the database does not answer):
// vibejobs_unplannable_jobs is absent until the next Unplannable, rather
// than frozen at the last count while due jobs go unlisted.
func (m *Metrics) UnplannableUnknown() { m.unplannable.unknown() }

// AttemptFinished measures one attempt sent: its duration, and the
// lateness of a first attempt. Its outcome is counted once the store has
// recorded it (AttemptsRecorded): the outcome decided may be dropped, or
// recorded otherwise.
func (m *Metrics) AttemptFinished(errorCode string, step vibejobs.Step, lateness time.Duration, first bool, d time.Duration) {
	m.duration.Observe(d.Seconds())
	if first {
		m.lateness.Observe(max(lateness, 0).Seconds())
	}
}

// SecretUnavailable counts a claim given back because its job's secret
// could not be opened (see dispatcher.Observer).
func (m *Metrics) SecretUnavailable() { m.secrets.Inc() }

// AttemptsRecorded counts attempts whose outcome the store committed (see
// vibejobs.AttemptsRecordedNotifier).
func (m *Metrics) AttemptsRecorded(a vibejobs.AttemptsRecorded) {
	for o, n := range a {
		m.attempts.WithLabelValues(string(o.State), o.ErrorCode).Add(float64(n))
	}
}

// RunsEnded counts runs that reached a final state, as the store committed
// them (see vibejobs.RunsEndedNotifier).
func (m *Metrics) RunsEnded(e vibejobs.RunsEnded) {
	for end, n := range e {
		m.runsFinished.WithLabelValues(string(end.State), end.Reason).Add(float64(n))
	}
}

// LeasesRecovered counts recovered leases.
func (m *Metrics) LeasesRecovered(n int) { m.leases.Add(float64(n)) }

// Queue sets the queue gauges.
func (m *Metrics) Queue(s vibejobs.QueueStats) { m.queue.set(s) }

// QueueUnknown says the queue could not be read (the database does not
// answer): the queue gauges are absent until the next Queue, rather than
// frozen at the last figures while the backlog may grow.
func (m *Metrics) QueueUnknown() { m.queue.unknown() }

var (
	runsDueDesc   = prometheus.NewDesc("vibejobs_runs_due", "Runs due and not yet claimed.", nil, nil)
	oldestDueDesc = prometheus.NewDesc("vibejobs_oldest_due_run_age_seconds",
		"Age of the oldest due, unclaimed run.", nil, nil)
)

var unplannableDesc = prometheus.NewDesc("vibejobs_unplannable_jobs",
	"Due jobs whose schedule this process could not plan at its last scan (a time zone missing from its tzdata), left due for another replica; absent while its scans fail.", nil, nil)

// lastKnown is a collector of figures read from the database: it reports
// the last ones read, through emit, while they are known, and nothing once
// a read failed (unknown) until the next one succeeds (set), rather than
// figures that no longer hold.
type lastKnown[T any] struct {
	descs []*prometheus.Desc
	emit  func(v T, ch chan<- prometheus.Metric)

	mu    sync.Mutex
	v     T
	known bool
}

func newLastKnown[T any](v T, emit func(T, chan<- prometheus.Metric), descs ...*prometheus.Desc) *lastKnown[T] {
	return &lastKnown[T]{descs: descs, emit: emit, v: v, known: true}
}

func (c *lastKnown[T]) set(v T) {
	c.mu.Lock()
	c.v, c.known = v, true
	c.mu.Unlock()
}

func (c *lastKnown[T]) unknown() {
	c.mu.Lock()
	c.known = false
	c.mu.Unlock()
}

func (c *lastKnown[T]) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *lastKnown[T]) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	v, known := c.v, c.known
	c.mu.Unlock()
	if known {
		c.emit(v, ch)
	}
}

var loopFailingDesc = prometheus.NewDesc("vibejobs_loop_failing_seconds",
	"How long a background loop of this process has failed every pass against the database, 0 while its last pass succeeded: "+
		"scheduler (plans occurrences), dispatcher (claims runs and records attempts), maintenance (recovers expired leases and fails runs past their deadline), "+
		"webhooks (claims subscriptions with events to send). /readyz turns not ready after 30 s of it for the scheduler and the dispatcher only; "+
		"alert on the others, which hold no API request.",
	[]string{"loop"}, nil)

// Loop is a background loop WatchLoops reports: its name and how it tells
// when its passes began to fail (zero while its last pass succeeded).
type Loop struct {
	Name         string
	FailingSince func() time.Time
}

// loopCollector reports vibejobs_loop_failing_seconds at every scrape.
type loopCollector struct {
	now   func() time.Time
	loops []Loop
}

func (c loopCollector) Describe(ch chan<- *prometheus.Desc) { ch <- loopFailingDesc }

func (c loopCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	for _, l := range c.loops {
		failing := 0.0
		if since := l.FailingSince(); !since.IsZero() {
			failing = max(now.Sub(since).Seconds(), 0)
		}
		ch <- prometheus.MustNewConstMetric(loopFailingDesc, prometheus.GaugeValue, failing, l.Name)
	}
}

// WatchLoops registers vibejobs_loop_failing_seconds (label loop) for
// loops, read at every scrape by the clock now.
func (m *Metrics) WatchLoops(now func() time.Time, loops ...Loop) {
	m.reg.MustRegister(loopCollector{now: now, loops: loops})
}

var clockSkewDesc = prometheus.NewDesc("vibejobs_database_clock_skew_seconds",
	"The database's clock minus this process's, measured every 5 s (PostgreSQL only; absent while the database does not answer). "+
		"Replicas claim runs and take over leases by their own clocks: keep this within ±1 s, past which the process logs postgres.clock_skew.",
	nil, nil)

// clockSkewCollector reports vibejobs_database_clock_skew_seconds at every
// scrape, while skew knows it.
type clockSkewCollector struct {
	skew func() (time.Duration, bool)
}

func (c clockSkewCollector) Describe(ch chan<- *prometheus.Desc) { ch <- clockSkewDesc }

func (c clockSkewCollector) Collect(ch chan<- prometheus.Metric) {
	if d, ok := c.skew(); ok {
		ch <- prometheus.MustNewConstMetric(clockSkewDesc, prometheus.GaugeValue, d.Seconds())
	}
}

// WatchClockSkew registers vibejobs_database_clock_skew_seconds, read from
// skew (the database's clock minus this process's, and whether it is
// known) at every scrape.
func (m *Metrics) WatchClockSkew(skew func() (time.Duration, bool)) {
	m.reg.MustRegister(clockSkewCollector{skew: skew})
}

// Subscription metrics, read from the store at every scrape so every
// replica reports the same values and a deleted subscription's series
// disappears with it. A project has at most 16 subscriptions, which bounds
// the series.
var (
	subscriptionFailingDesc = prometheus.NewDesc("vibejobs_subscription_failing",
		"1 while the subscription's latest delivery attempt failed: it holds at that event until the receiver accepts it.",
		[]string{"subscription", "project"}, nil)
	subscriptionLastSuccessDesc = prometheus.NewDesc("vibejobs_subscription_last_success_timestamp_seconds",
		"When the receiver last accepted an event of the subscription (absent before the first).",
		[]string{"subscription", "project"}, nil)
)

// subscriptionCollector reports the subscriptions' delivery state.
type subscriptionCollector struct {
	list func(ctx context.Context) ([]*vibejobs.Subscription, error)
}

func (c subscriptionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- subscriptionFailingDesc
	ch <- subscriptionLastSuccessDesc
}

func (c subscriptionCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	subs, err := c.list(ctx)
	if err != nil {
		// The database is down: the other metrics still matter (and say
		// so); these series are absent until it answers again.
		return
	}
	for _, s := range subs {
		failing := 0.0
		if s.Failing() {
			failing = 1
		}
		ch <- prometheus.MustNewConstMetric(subscriptionFailingDesc, prometheus.GaugeValue, failing, s.ID, s.ProjectID)
		if s.LastSuccessAt != nil {
			ch <- prometheus.MustNewConstMetric(subscriptionLastSuccessDesc, prometheus.GaugeValue,
				float64(s.LastSuccessAt.UnixMilli())/1000, s.ID, s.ProjectID)
		}
	}
}

// WatchSubscriptions registers vibejobs_subscription_failing and
// vibejobs_subscription_last_success_timestamp_seconds (labels subscription,
// project), read with list at every scrape: per-project series, served by
// InstallationHandler only.
func (m *Metrics) WatchSubscriptions(list func(ctx context.Context) ([]*vibejobs.Subscription, error)) {
	m.perProject.MustRegister(subscriptionCollector{list: list})
}
