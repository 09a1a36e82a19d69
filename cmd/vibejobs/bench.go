package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/egress"
	"github.com/vibejobs/vibejobs/internal/procstat"
)

// bench runs the benchmarks the issues name, on demand (never in CI):
//
//	vibejobs bench burst    [--runs 20000] [--database URL] [--raw|--raw-only] [--per-host N] [--receiver-delay D] [--cpuprofile FILE]
//	vibejobs bench lateness [--jobs 1000] [--duration 60s] [--database URL] [--replicas N]
//	vibejobs bench scale    [--jobs 1000000] [--concurrency 64] [--database URL]
//	vibejobs bench events   [--jobs 200] [--duration 30s] [--subscriptions 1] [--burst 0] [--database URL]
//
// Everything is on this machine: the platform and a loopback receiver that
// answers 200, in one process. The receiver answers at once; in the burst
// (and its raw loop) --receiver-delay makes it answer after that long, the
// time a slower app takes to do its work.
func bench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && isHelp(args[0]) {
		fmt.Fprintln(stdout, "Usage: vibejobs bench burst|lateness|scale|events [flags]; \"vibejobs bench burst -h\" lists the flags.")
		return nil
	}
	if len(args) == 0 {
		return fmt.Errorf("%w: bench burst|lateness|scale|events [flags]", errUsage)
	}
	fs := flag.NewFlagSet("vibejobs bench "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	runs := fs.Int("runs", 20000, "burst: runs due at the same instant")
	jobs := fs.Int("jobs", 1000, "lateness: jobs @every 1s")
	dur := fs.Duration("duration", 60*time.Second, "lateness: how long to run")
	database := fs.String("database", "", "postgres://… to bench PostgreSQL; default a fresh SQLite")
	raw := fs.Bool("raw", false, "burst: also measure a plain sign-and-POST loop with no database")
	rawOnly := fs.Bool("raw-only", false, "burst: measure only the plain sign-and-POST loop")
	plain := fs.Bool("plain-client", false, "burst: deliver through a plain HTTP client instead of the egress client (prices the egress policy)")
	replicas := fs.Int("replicas", 1, "lateness: server processes sharing the database (PostgreSQL for more than one)")
	conc := fs.Int("concurrency", 512, "delivery concurrency; scale: API client workers")
	perHost := fs.Int("per-host", 0, "burst: delivery attempts in flight to the receiver at most (--per-host of serve); default the concurrency")
	subs := fs.Int("subscriptions", 1, "events: subscriptions receiving every run event")
	burst := fs.Int("burst", 0, "events: then this many runs due at once, and how fast their events drain")
	cpuprofile := fs.String("cpuprofile", "", "burst: write a CPU profile of the delivery window to this file")
	delay := fs.Duration("receiver-delay", 0, "burst: the receiver answers each request after this long (an app doing its work)")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q (the counts are flags: --runs, --jobs)", errUsage, fs.Arg(0))
	}
	switch {
	case *runs < 1, *jobs < 1, *conc < 1, *replicas < 1, *subs < 0, *burst < 0, *perHost < 0:
		return fmt.Errorf("%w: --runs, --jobs, --concurrency and --replicas must be at least 1, --subscriptions, --burst and --per-host at least 0", errUsage)
	case *dur <= 0:
		return fmt.Errorf("%w: --duration must be positive", errUsage)
	case *delay < 0 || *delay > time.Minute:
		return fmt.Errorf("%w: --receiver-delay must be from 0 to 1m", errUsage)
	}
	switch args[0] {
	case "burst":
		if *rawOnly {
			return benchRaw(stdout, *runs, *conc, *delay)
		}
		return benchBurst(ctx, stdout, *runs, *database, *raw, *plain, *conc, cmp.Or(*perHost, *conc), *delay, *cpuprofile)
	case "lateness":
		return benchLateness(ctx, stdout, *jobs, *dur, *database, *replicas)
	case "scale":
		return benchScale(ctx, stdout, *jobs, *conc, *database)
	case "events":
		if !isSet(fs, "jobs") {
			*jobs = 200
		}
		if !isSet(fs, "duration") {
			*dur = 30 * time.Second
		}
		return benchEvents(ctx, stdout, *jobs, *dur, *subs, *burst, *database, *conc)
	}
	return fmt.Errorf("%w: bench burst|lateness|scale|events", errUsage)
}

// benchReceiver counts deliveries and keeps, per request, the receive time
// minus scheduledFor of first attempts. It answers each request delay after
// reading it.
type benchReceiver struct {
	srv      *http.Server
	url      string
	count    atomic.Int64
	mu       sync.Mutex
	last     time.Time
	lateness []time.Duration
}

func newBenchReceiver(delay time.Duration) (*benchReceiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	br := &benchReceiver{url: "http://" + ln.Addr().String() + "/"}
	br.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		now := time.Now()
		br.count.Add(1)
		if i := bytes.Index(body, []byte(`"scheduledFor":"`)); i >= 0 && bytes.Contains(body, []byte(`"attempt":1,`)) {
			s := body[i+16 : i+16+24]
			if at, err := time.Parse(contract.ScheduledForLayout, string(s)); err == nil {
				br.mu.Lock()
				br.lateness = append(br.lateness, now.Sub(at))
				br.last = now
				br.mu.Unlock()
			}
		}
		if delay > 0 && sleepCtx(r.Context(), delay) != nil {
			return
		}
		w.WriteHeader(200)
	}), MaxHeaderBytes: 8 << 10}
	go br.srv.Serve(ln)
	return br, nil
}

// recordCounter counts outcomes recorded as succeeded.
type recordCounter struct {
	vibejobs.DispatchStore
	succeeded atomic.Int64
	last      atomic.Int64 // unix nanos of the last successful record
	// Statement counts and the rows they carried: the batching the
	// dispatcher achieved.
	claimCalls, claimed, recordCalls, recorded atomic.Int64
	claimNanos, recordNanos                    atomic.Int64
}

func (c *recordCounter) ClaimDueRuns(ctx context.Context, owner string, now time.Time, limit int, margin time.Duration) ([]*vibejobs.Claim, error) {
	start := time.Now()
	claims, err := c.DispatchStore.ClaimDueRuns(ctx, owner, now, limit, margin)
	c.claimNanos.Add(int64(time.Since(start)))
	c.claimCalls.Add(1)
	c.claimed.Add(int64(len(claims)))
	return claims, err
}

// batching describes the claim and record statements made so far.
func (c *recordCounter) batching() string {
	mean := func(rows, calls int64) float64 { return float64(rows) / float64(max(calls, 1)) }
	return fmt.Sprintf("%d claims (%.1f runs each, %v in all), %d records (%.1f outcomes each, %v in all)",
		c.claimCalls.Load(), mean(c.claimed.Load(), c.claimCalls.Load()), time.Duration(c.claimNanos.Load()).Round(time.Millisecond),
		c.recordCalls.Load(), mean(c.recorded.Load(), c.recordCalls.Load()), time.Duration(c.recordNanos.Load()).Round(time.Millisecond))
}

func (c *recordCounter) RecordOutcomes(ctx context.Context, owner string, o []vibejobs.Outcome) error {
	start := time.Now()
	err := c.DispatchStore.RecordOutcomes(ctx, owner, o)
	c.recordNanos.Add(int64(time.Since(start)))
	c.recordCalls.Add(1)
	c.recorded.Add(int64(len(o)))
	if err == nil {
		n := 0
		for _, x := range o {
			if x.Step.State == vibejobs.RunSucceeded {
				n++
			}
		}
		c.succeeded.Add(int64(n))
		c.last.Store(time.Now().UnixNano())
	}
	return err
}

// sendLateness collects the platform's own first-attempt start − scheduledFor.
type sendLateness struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sendLateness) AttemptFinished(_ string, _ vibejobs.Step, late time.Duration, first bool, _ time.Duration) {
	if first {
		s.mu.Lock()
		s.d = append(s.d, late)
		s.mu.Unlock()
	}
}

func (s *sendLateness) SecretUnavailable() {}

func startBenchMain(ctx context.Context, database string, conc int, opts ...func(*Main)) (*Main, *recordCounter, *sendLateness, func(), error) {
	dir, err := os.MkdirTemp("", "vibejobs-bench-")
	if err != nil {
		return nil, nil, nil, nil, err
	}
	m := NewMain(io.Discard, io.Discard)
	// Every benchmark sends to one receiver: the per-host limit is the
	// concurrency, so that the host's limit is not what is measured. With
	// the default 256, 2,000 runs due at one instant on one host wait for
	// slots: the lateness p99 was 51–79 ms in four runs, against 20–69 ms
	// (median 44) in ten of eleven at 512 (the eleventh, 544 ms, came with
	// a stall of the whole machine).
	m.Config = Config{Listen: "127.0.0.1:0", DataDir: dir, Database: database, AllowPrivate: "127.0.0.0/8",
		LogFormat: "text", LogLevel: "error", Concurrency: conc, PerHost: conc, RetentionDays: 90, MaxJobsPerProject: 10_000_000}
	rc := &recordCounter{}
	sl := &sendLateness{}
	m.WrapDispatchStore = func(s vibejobs.DispatchStore) vibejobs.DispatchStore { rc.DispatchStore = s; return rc }
	m.Observer = sl
	for _, o := range opts {
		o(m)
	}
	if err := m.Run(ctx); err != nil {
		return nil, nil, nil, nil, err
	}
	cleanup := func() { m.Close(); os.RemoveAll(dir) }
	return m, rc, sl, cleanup, nil
}

// createJobs inserts n jobs straight into the store (the API's per-request
// cost is not what these benchmarks measure).
func createJobs(ctx context.Context, m *Main, n int, mk func(i int, j *vibejobs.Job)) error {
	projects, _, err := m.store.ListProjects(ctx, vibejobs.Page{Limit: 1})
	if err != nil || len(projects) == 0 {
		return fmt.Errorf("no project: %v", err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	for start := 0; start < n; start += 1000 {
		err := m.store.Update(ctx, func(tx vibejobs.Tx) error {
			for i := start; i < min(start+1000, n); i++ {
				j := &vibejobs.Job{
					ID: vibejobs.NewID("job_", now, rand.Reader), ProjectID: projects[0].ID,
					Name: fmt.Sprintf("bench-%d", i), Timezone: "UTC", Enabled: true, State: vibejobs.JobActive,
					Retry: vibejobs.DefaultRetryPolicy(), Timeout: vibejobs.DefaultTimeout, CatchUp: vibejobs.CatchUpAll,
					ScheduleAnchor: now, CreatedAt: now, UpdatedAt: now,
				}
				mk(i, j)
				secret, _ := contract.NewSecret(nil)
				sealed, err := m.sealer.Seal(secret, j.ID)
				if err != nil {
					return err
				}
				j.Secret = sealed
				if err := tx.CreateJob(ctx, j); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func benchBurst(ctx context.Context, out io.Writer, n int, database string, raw, plain bool, conc, perHost int, delay time.Duration, cpuprofile string) error {
	br, err := newBenchReceiver(delay)
	if err != nil {
		return err
	}
	defer br.srv.Close()
	if raw {
		if err := measureRaw(out, br.url, n, conc); err != nil {
			return err
		}
		br.count.Store(0)
	}
	opts := []func(*Main){func(m *Main) { m.Config.PerHost = perHost }}
	client := "egress client"
	if plain {
		client = "plain client"
		opts = append(opts, func(m *Main) { m.RunSender = newPlainSender(conc) })
	}
	m, rc, _, cleanup, err := startBenchMain(ctx, database, conc, opts...)
	if err != nil {
		return err
	}
	defer cleanup()
	due, err := planBurst(ctx, m, n, br.url)
	if err != nil {
		return err
	}
	if time.Now().After(due) {
		return errors.New("planning the runs took longer than 10 s; is the machine busy?")
	}
	if cpuprofile != "" {
		stop, err := profileFrom(due, cpuprofile)
		if err != nil {
			return err
		}
		defer stop()
	}
	// The database's CPU only on PostgreSQL: reading it walks /proc, which
	// would only add to a SQLite burst's own window.
	serverCPU := func() time.Duration { return 0 }
	if database != "" {
		serverCPU = procstat.PostgresCPU
	}
	cpuAtDue := make(chan [2]time.Duration, 1)
	go func() {
		time.Sleep(time.Until(due))
		cpuAtDue <- [2]time.Duration{procstat.CPU(os.Getpid()), serverCPU()}
	}()
	deadline := due.Add(5 * time.Minute)
	for rc.succeeded.Load() < int64(n) {
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d runs succeeded in 5 minutes", rc.succeeded.Load(), n)
		}
		if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
	br.mu.Lock()
	lastRecv := br.last
	br.mu.Unlock()
	lastRec := time.Unix(0, rc.last.Load())
	store := "sqlite"
	if database != "" {
		store = "postgres"
	}
	answers := "at once"
	if delay > 0 {
		answers = "after " + delay.String()
	}
	fmt.Fprintf(out, "burst (%s, %s, %d per host, receiver answers %s): %d runs due at once; received %d; all received in %v (%.0f runs/s); all recorded succeeded in %v (%.0f runs/s end to end); max RSS %s\n",
		store, client, perHost, answers, n, br.count.Load(), lastRecv.Sub(due).Round(time.Millisecond), float64(n)/lastRecv.Sub(due).Seconds(),
		lastRec.Sub(due).Round(time.Millisecond), float64(n)/lastRec.Sub(due).Seconds(), maxRSS())
	fmt.Fprintf(out, "  statements: %s\n", rc.batching())
	self, pg := procstat.CPU(os.Getpid()), serverCPU()
	at := <-cpuAtDue
	perRun := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	cpu := fmt.Sprintf("this process %.0f µs/run", perRun(self-at[0]))
	if database != "" {
		cpu += fmt.Sprintf(", postgres processes %.0f µs/run", perRun(pg-at[1]))
	}
	fmt.Fprintf(out, "  cpu from due to the last record: %s (10 ms ticks)\n", cpu)
	// Every recorded outcome appended its event in the same transaction.
	if ps, _, err := m.store.ListProjects(ctx, vibejobs.Page{Limit: 1}); err == nil && len(ps) > 0 {
		if p, err := m.store.ListEvents(ctx, ps[0].ID, vibejobs.EventFilter{After: 1 << 62}); err == nil {
			fmt.Fprintf(out, "  feed: %d events appended alongside (%.0f events/s)\n", p.Head, float64(p.Head)/lastRec.Sub(due).Seconds())
		}
	}
	return nil
}

// profileFrom waits until at, then starts a CPU profile written to path; the
// returned func stops it.
func profileFrom(at time.Time, path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	time.Sleep(time.Until(at))
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// sleepCtx waits d, or until ctx ends, and then returns ctx's error: an
// interrupted benchmark (Ctrl-C, which main's context catches) stops at once
// and removes what it made, rather than running on to its end or its
// deadline, minutes later.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// isSet reports whether the flag name was given.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func quantiles(d []time.Duration) string {
	if len(d) == 0 {
		return "no samples"
	}
	slices.Sort(d)
	q := func(p float64) time.Duration { return d[min(len(d)-1, int(p*float64(len(d))))] }
	return fmt.Sprintf("n=%d p50=%v p90=%v p99=%v max=%v", len(d), q(.5).Round(time.Microsecond),
		q(.9).Round(time.Microsecond), q(.99).Round(time.Microsecond), d[len(d)-1].Round(time.Microsecond))
}

// benchRaw measures the plain sign-and-POST loop alone, with conc workers.
func benchRaw(out io.Writer, n, conc int, delay time.Duration) error {
	br, err := newBenchReceiver(delay)
	if err != nil {
		return err
	}
	defer br.srv.Close()
	return measureRaw(out, br.url, n, conc)
}

// measureRaw runs rawLoop against url and prints its rate.
func measureRaw(out io.Writer, url string, n, conc int) error {
	rate, err := rawLoop(url, n, conc)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "raw sign+POST loop: %d requests, %.0f req/s (concurrency %d)\n", n, rate, conc)
	return nil
}

// rawLoop signs and POSTs n requests to url with conc workers and no database:
// the ceiling for end-to-end delivery on this machine.
func rawLoop(url string, n, conc int) (float64, error) {
	tr := &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc, Proxy: nil}
	client := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()
	secret, _ := contract.NewSecret(nil)
	var next atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				body := contract.Body(contract.Payload{JobID: "job_raw", RunID: fmt.Sprintf("run_%d", i),
					ScheduledFor: start, Attempt: 1, Trigger: contract.TriggerSchedule})
				req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
				req.Header = http.Header{
					"Content-Type": {contract.ContentType}, "X-Vibe-Caller-Kind": {"schedule"},
					"Vibe-Signature": {contract.Sign(secret, time.Now().Unix(), body)},
					"User-Agent":     {"vibejobs/raw"}, "Idempotency-Key": {fmt.Sprintf("run_%d", i)},
				}
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		return 0, fmt.Errorf("raw loop: %d requests failed", f)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// maxRSS is the peak resident set of this process.
func maxRSS() string {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%.0f MiB", float64(ru.Maxrss)/1024)
}

// plainSender delivers through a plain http.Client: no resolution check, no
// dial control, no redirect or size policy. Only the egress benchmark uses it,
// to price what the policy costs.
type plainSender struct{ c *http.Client }

func newPlainSender(conns int) *plainSender {
	return &plainSender{c: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, Proxy: nil}}}
}

func (p *plainSender) Post(ctx context.Context, url string, h http.Header, body []byte, timeout time.Duration) egress.Result {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(body))
	if err != nil {
		return egress.Result{ErrorCode: egress.CodeNetwork, Err: err}
	}
	req.Header = h
	resp, err := p.c.Do(req)
	if err != nil {
		return egress.Result{ErrorCode: egress.CodeNetwork, Err: err}
	}
	defer resp.Body.Close()
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	res := egress.Result{StatusCode: resp.StatusCode, Snippet: snippet}
	if resp.StatusCode/100 != 2 {
		res.ErrorCode = egress.CodeHTTP5xx
	}
	return res
}

// planBurst creates n jobs and one run of each, all due at one instant about
// 10 s ahead, which it returns. The jobs exist first (yearly, not due); then
// the runs are planned as the scheduler would, so creating thousands of jobs
// never eats into the measured window.
func planBurst(ctx context.Context, m *Main, n int, url string) (time.Time, error) {
	far := time.Date(time.Now().Year()+1, 1, 1, 0, 0, 0, 0, time.UTC)
	var created []*vibejobs.Job
	if err := createJobs(ctx, m, n, func(i int, j *vibejobs.Job) {
		j.Schedule = "0 0 1 1 *"
		j.URL = url
		j.NextRunAt = &far
		created = append(created, j)
	}); err != nil {
		return time.Time{}, err
	}
	due := time.Now().Add(10 * time.Second).UTC().Truncate(time.Millisecond)
	plans := make([]vibejobs.RunPlan, 0, len(created))
	for _, j := range created {
		next := far
		plans = append(plans, vibejobs.RunPlan{JobID: j.ID, Anchor: j.ScheduleAnchor, From: far, Next: &next,
			Runs: []*vibejobs.Run{vibejobs.NewRun(vibejobs.NewID("run_", due, rand.Reader), j, vibejobs.TriggerSchedule, due, time.Now())}})
	}
	for start := 0; start < len(plans); start += 2000 {
		if _, _, err := m.store.ApplyRunPlans(ctx, plans[start:min(start+2000, len(plans))], time.Now()); err != nil {
			return time.Time{}, err
		}
	}
	// On a running server autovacuum's analyze has seen the queue; a bench
	// schema is new, and on a server with autovacuum off never analyzed.
	if a, ok := m.store.(interface{ Analyze(context.Context) error }); ok {
		if err := a.Analyze(ctx); err != nil {
			return time.Time{}, err
		}
	}
	return due, nil
}
