// Command river is the River baseline of the burst benchmark (issue 3): a
// River v0.51.2 deliverer on the same PostgreSQL, one River job per run and a
// worker that signs and POSTs, tuned fairly (200 workers, FetchCooldown 5 ms).
// It lives in its own module so River never enters the main module.
//
//	go run . --database postgres://postgres@127.0.0.1:5432/test?sslmode=disable --runs 20000
//
// All 20,000 jobs are inserted available before the client starts (River's
// scheduled-job promotion runs on an interval, which would only handicap it),
// and the clock runs from Start to the last job recorded completed.
// Completions are counted from River's job_completed events, which it sends
// once a batch of completions is stored, so the count costs the database
// nothing (polling the job table every few milliseconds did, on the same
// two cores).
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/procstat"
)

type deliverArgs struct {
	JobID        string    `json:"job_id"`
	RunID        string    `json:"run_id"`
	ScheduledFor time.Time `json:"scheduled_for"`
	URL          string    `json:"url"`
}

func (deliverArgs) Kind() string { return "deliver" }

type deliverWorker struct {
	river.WorkerDefaults[deliverArgs]
	client *http.Client
	secret string
}

func (w *deliverWorker) Work(ctx context.Context, job *river.Job[deliverArgs]) error {
	a := job.Args
	body := contract.Body(contract.Payload{JobID: a.JobID, RunID: a.RunID, ScheduledFor: a.ScheduledFor,
		Attempt: job.Attempt, Trigger: contract.TriggerSchedule})
	req, err := http.NewRequestWithContext(ctx, "POST", a.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header = http.Header{
		"Content-Type": {contract.ContentType}, "X-Vibe-Caller-Kind": {"schedule"},
		"Vibe-Signature": {contract.Sign(w.secret, time.Now().Unix(), body)},
		"User-Agent":     {"vibejobs-river-bench"}, "Idempotency-Key": {a.RunID},
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

func main() {
	database := flag.String("database", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL (a database river_bench is created beside it)")
	n := flag.Int("runs", 20000, "jobs to deliver")
	workers := flag.Int("workers", 200, "River MaxWorkers")
	flag.Parse()
	if err := run(context.Background(), *database, *n, *workers); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, database string, n, workers int) error {
	// A database of its own, so River's tables never meet vibejobs'.
	admin, err := pgx.Connect(ctx, database)
	if err != nil {
		return err
	}
	_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS river_bench WITH (FORCE)")
	if _, err := admin.Exec(ctx, "CREATE DATABASE river_bench"); err != nil {
		return err
	}
	admin.Close(ctx)
	cfg, err := pgxpool.ParseConfig(database)
	if err != nil {
		return err
	}
	cfg.ConnConfig.Database = "river_bench"
	cfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return err
	}

	var received atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		received.Add(1)
		w.WriteHeader(200)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/"

	secret, _ := contract.NewSecret(nil)
	tr := &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers, Proxy: nil}
	ws := river.NewWorkers()
	river.AddWorker(ws, &deliverWorker{client: &http.Client{Transport: tr, Timeout: 10 * time.Second}, secret: secret})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		FetchCooldown: 5 * time.Millisecond,
		Workers:       ws,
		Logger:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	due := time.Now().UTC().Truncate(time.Millisecond)
	for start := 0; start < n; start += 1000 {
		params := make([]river.InsertManyParams, 0, 1000)
		for i := start; i < min(start+1000, n); i++ {
			params = append(params, river.InsertManyParams{Args: deliverArgs{
				JobID: "job_river", RunID: fmt.Sprintf("run_%d", i), ScheduledFor: due, URL: url}})
		}
		if _, err := client.InsertMany(ctx, params); err != nil {
			return err
		}
	}
	// A buffer for every event: River drops the events a full channel
	// cannot take.
	completed, unsubscribe := client.SubscribeConfig(&river.SubscribeConfig{
		Kinds: []river.EventKind{river.EventKindJobCompleted}, ChanSize: n})
	defer unsubscribe()
	selfAt, pgAt := procstat.CPU(os.Getpid()), procstat.PostgresCPU()
	begin := time.Now()
	if err := client.Start(ctx); err != nil {
		return err
	}
	var allReceived time.Duration
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(5 * time.Minute)
	for done := 0; done < n; {
		select {
		case <-completed:
			done++
		case <-tick.C:
		case <-timeout:
			return fmt.Errorf("only %d of %d completed in 5 minutes", done, n)
		}
		if allReceived == 0 && received.Load() >= int64(n) {
			allReceived = time.Since(begin)
		}
	}
	total := time.Since(begin)
	self, pg := procstat.CPU(os.Getpid())-selfAt, procstat.PostgresCPU()-pgAt
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = client.Stop(stopCtx)
	perRun := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	fmt.Printf("river v0.51.2 (%d workers, FetchCooldown 5ms): %d jobs; all received in %v (%.0f/s); all completed in %v (%.0f runs/s end to end)\n",
		workers, n, allReceived.Round(time.Millisecond), float64(n)/allReceived.Seconds(), total.Round(time.Millisecond), float64(n)/total.Seconds())
	fmt.Printf("  cpu from start to the last completion: this process %.0f µs/run, postgres processes %.0f µs/run (10 ms ticks)\n",
		perRun(self), perRun(pg))
	return nil
}
