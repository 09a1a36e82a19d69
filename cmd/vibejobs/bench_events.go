package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/feed"
)

// eventBenchReceiver is a loopback subscriber: per subscription (its URL
// path), it keeps each run event's receive time minus its occurredAt (the
// moment the run finished) and counts repeats.
type eventBenchReceiver struct {
	srv     *http.Server
	url     string
	mu      sync.Mutex
	delays  []time.Duration
	seen    map[string]bool // path + event id
	repeats int
	last    time.Time
}

func newEventBenchReceiver() (*eventBenchReceiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	er := &eventBenchReceiver{url: "http://" + ln.Addr().String(), seen: map[string]bool{}}
	er.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		now := time.Now()
		var e struct {
			ID         string `json:"id"`
			RunID      string `json:"runId"`
			OccurredAt string `json:"occurredAt"`
		}
		if json.Unmarshal(body, &e) == nil {
			at, err := time.Parse(feed.TimeLayout, e.OccurredAt)
			er.mu.Lock()
			k := r.URL.Path + " " + e.ID
			switch {
			case er.seen[k]:
				er.repeats++
			case err == nil && e.RunID != "":
				er.seen[k] = true
				er.delays = append(er.delays, now.Sub(at))
				er.last = now
			default:
				er.seen[k] = true
			}
			er.mu.Unlock()
		}
		w.WriteHeader(204)
	}), MaxHeaderBytes: 8 << 10}
	go er.srv.Serve(ln)
	return er, nil
}

func (er *eventBenchReceiver) received() (n int, repeats int, last time.Time) {
	er.mu.Lock()
	defer er.mu.Unlock()
	return len(er.delays), er.repeats, er.last
}

// subscribe creates a subscription to url through m's API.
func subscribe(m *Main, url string, types []string) error {
	b, _ := json.Marshal(map[string]any{"url": url, "types": types})
	req, _ := http.NewRequest("POST", "http://"+m.Addr()+"/v1/subscriptions", bytes.NewReader(b))
	var k [16]byte
	_, _ = rand.Read(k[:])
	req.Header.Set("Authorization", "Bearer "+m.AdminToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", hex.EncodeToString(k[:]))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 201 {
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("creating a subscription: %d %s", resp.StatusCode, body)
	}
	return nil
}

// benchEvents measures the delay from a run finishing to its event reaching
// a subscriber: n jobs @every 1s for d, every run event sent to subs
// subscriptions on a loopback receiver. Then, with burst > 0, burst runs
// due at once, and how fast one subscription drains their events.
func benchEvents(ctx context.Context, out io.Writer, n int, d time.Duration, subs, burst int, database string, conc int) error {
	er, err := newEventBenchReceiver()
	if err != nil {
		return err
	}
	defer er.srv.Close()
	br, err := newBenchReceiver(0)
	if err != nil {
		return err
	}
	defer br.srv.Close()
	m, rc, _, cleanup, err := startBenchMain(ctx, database, conc)
	if err != nil {
		return err
	}
	defer cleanup()
	for i := range subs {
		if err := subscribe(m, fmt.Sprintf("%s/s%d", er.url, i), []string{"run.succeeded", "run.failed", "run.retrying", "run.cancelled"}); err != nil {
			return err
		}
	}
	store := "sqlite"
	if database != "" {
		store = "postgres"
	}

	start := time.Now().Add(3 * time.Second).UTC().Truncate(time.Second)
	if err := createJobs(ctx, m, n, func(i int, j *vibejobs.Job) {
		j.Schedule = "@every 1s"
		j.URL = br.url
		j.ScheduleAnchor = start.Add(-time.Second)
		first := start
		j.NextRunAt = &first
	}); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(start.Add(d))):
	}
	// Stop the schedules, then let the last events land.
	projects, _, err := m.store.ListProjects(ctx, vibejobs.Page{Limit: 1})
	if err != nil {
		return err
	}
	if err := pauseBenchJobs(ctx, m, projects[0].ID); err != nil {
		return err
	}
	ran := rc.succeeded.Load()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, _, _ := er.received()
		if int64(got) >= ran*int64(subs) || time.Now().After(deadline) {
			break
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
	got, repeats, _ := er.received()
	er.mu.Lock()
	delays := slices.Clone(er.delays)
	er.mu.Unlock()
	fmt.Fprintf(out, "events (%s): %d jobs @every 1s for %v, %d subscriptions: %d runs succeeded, %d run events received (%d repeats)\n",
		store, n, d, subs, ran, got, repeats)
	fmt.Fprintf(out, "  run finished → event at the subscriber: %s\n", quantiles(delays))

	if burst <= 0 {
		fmt.Fprintf(out, "  max RSS %s\n", maxRSS())
		return nil
	}
	// A burst: every event of it goes, one at a time, to each subscription.
	er.mu.Lock()
	er.delays = er.delays[:0]
	er.mu.Unlock()
	rc.succeeded.Store(0)
	due, err := planBurst(ctx, m, burst, br.url)
	if err != nil {
		return err
	}
	deadline = due.Add(10 * time.Minute)
	for {
		got, _, _ := er.received()
		if got >= burst*subs {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d burst events arrived in 10 minutes", got, burst*subs)
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
	lastRec := time.Unix(0, rc.last.Load())
	_, _, lastEvent := er.received()
	er.mu.Lock()
	delays = slices.Clone(er.delays)
	er.mu.Unlock()
	fmt.Fprintf(out, "  burst of %d runs: all recorded in %v (%.0f runs/s); their %d events delivered to each of %d subscriptions in %v (%.0f events/s per subscription)\n",
		burst, lastRec.Sub(due).Round(time.Millisecond), float64(burst)/lastRec.Sub(due).Seconds(),
		burst, subs, lastEvent.Sub(due).Round(time.Millisecond), float64(burst)/lastEvent.Sub(due).Seconds())
	fmt.Fprintf(out, "  burst run finished → event at the subscriber: %s\n", quantiles(delays))
	fmt.Fprintf(out, "  max RSS %s\n", maxRSS())
	return nil
}

// pauseBenchJobs disables every job of the project (straight in the store).
func pauseBenchJobs(ctx context.Context, m *Main, projectID string) error {
	cursor := ""
	for {
		jobs, next, err := m.store.ListJobs(ctx, projectID, vibejobs.Page{Limit: 100, Cursor: cursor})
		if err != nil {
			return err
		}
		err = m.store.Update(ctx, func(tx vibejobs.Tx) error {
			for _, j := range jobs {
				j.Enabled, j.State, j.NextRunAt = false, vibejobs.JobPaused, nil
				if err := tx.UpdateJob(ctx, j); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil || next == "" {
			return err
		}
		cursor = next
	}
}
