package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/procstat"
)

// benchLateness registers n jobs "@every 1s" on `replicas` server processes
// sharing one database and lets them run for d. The loopback receiver, in
// this process, measures each first attempt's arrival minus its
// scheduledFor, counts duplicates (one occurrence delivered as two runs, or a
// run delivered twice) and missed occurrences.
func benchLateness(ctx context.Context, out io.Writer, n int, d time.Duration, database string, replicas int) error {
	if replicas > 1 && !isPostgresURL(database) {
		return fmt.Errorf("%w: several replicas need --database postgres://…", errUsage)
	}
	type key struct {
		job string
		at  string
	}
	var mu sync.Mutex
	var window struct{ from, to time.Time } // guarded by mu
	lateness := []time.Duration{}
	worst := map[int64]time.Duration{} // second of scheduledFor (unix) → its worst lateness
	runsOf := map[key]map[string]int{} // occurrence → run id → deliveries
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	recv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		now := time.Now()
		var p struct {
			JobID, RunID, ScheduledFor string
			Attempt                    int
		}
		if json.Unmarshal(body, &p) == nil {
			mu.Lock()
			k := key{p.JobID, p.ScheduledFor}
			if runsOf[k] == nil {
				runsOf[k] = map[string]int{}
			}
			runsOf[k][p.RunID]++
			if at, err := time.Parse(contract.ScheduledForLayout, p.ScheduledFor); err == nil && p.Attempt == 1 && runsOf[k][p.RunID] == 1 &&
				!window.from.IsZero() && !at.Before(window.from) && (window.to.IsZero() || !at.After(window.to)) {
				lateness = append(lateness, now.Sub(at))
				worst[at.Unix()] = max(worst[at.Unix()], now.Sub(at))
			}
			mu.Unlock()
		}
		w.WriteHeader(200)
	})}
	go recv.Serve(ln)
	defer recv.Close()
	url := "http://" + ln.Addr().String() + "/"

	dir, err := os.MkdirTemp("", "vibejobs-lateness-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var servers []*benchServer
	defer func() {
		for _, s := range servers {
			s.stop()
		}
	}()
	for i := 0; i < replicas; i++ {
		s, err := startBenchServer(ctx, dir, database, n+1)
		if err != nil {
			return err
		}
		servers = append(servers, s)
	}
	token, err := adminToken(dir)
	if err != nil {
		return err
	}
	for start := 0; start < n; start += 100 {
		jobs := []map[string]any{}
		for i := start; i < min(start+100, n); i++ {
			jobs = append(jobs, map[string]any{"name": fmt.Sprintf("tick-%d", i), "schedule": "@every 1s", "url": url})
		}
		body, _ := json.Marshal(map[string]any{"jobs": jobs})
		req, _ := http.NewRequest("POST", servers[(start/100)%len(servers)].base+"/v1/jobs/batch", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		var k [12]byte
		rand.Read(k[:])
		req.Header.Set("Idempotency-Key", hex.EncodeToString(k[:]))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 201 {
			return fmt.Errorf("creating jobs: status %d", resp.StatusCode)
		}
	}
	// Warm-up: the first occurrences of 1,000s of just-created jobs are not
	// what the benchmark is about; measure the d that follows.
	time.Sleep(3 * time.Second)
	mu.Lock()
	from := time.Now()
	window.from = from
	mu.Unlock()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
	}
	mu.Lock()
	to := time.Now()
	window.to = to
	mu.Unlock()
	time.Sleep(3 * time.Second) // the last occurrences land
	mu.Lock()
	defer mu.Unlock()
	samples := append([]time.Duration(nil), lateness...)
	dupRuns, dupDeliveries, occurrences := 0, 0, 0
	perJob := map[string][]time.Time{}
	for k, runs := range runsOf {
		at, _ := time.Parse(contract.ScheduledForLayout, k.at)
		perJob[k.job] = append(perJob[k.job], at)
		if at.Before(from) || at.After(to) {
			continue
		}
		occurrences++
		if len(runs) > 1 {
			dupRuns++
		}
		for _, c := range runs {
			if c > 1 {
				dupDeliveries++
			}
		}
	}
	// Missed: in each job's window [from, to], every second must be there.
	missed := 0
	for _, ats := range perJob {
		seen := map[int64]bool{}
		var anchor time.Time
		for _, a := range ats {
			seen[a.UnixMilli()] = true
			anchor = a
		}
		for t := anchor; t.After(from); t = t.Add(-time.Second) {
			if !t.After(to) && !seen[t.UnixMilli()] {
				missed++
			}
		}
		for t := anchor.Add(time.Second); !t.After(to); t = t.Add(time.Second) {
			if !seen[t.UnixMilli()] {
				missed++
			}
		}
	}
	store := "sqlite"
	if database != "" {
		store = "postgres"
	}
	fmt.Fprintf(out, "lateness (%s, %d replica(s)): %d jobs @every 1s for %v: %d occurrences delivered in the window\n",
		store, replicas, n, d, occurrences)
	fmt.Fprintf(out, "  first attempt received − scheduledFor: %s\n", quantiles(samples))
	fmt.Fprintf(out, "  duplicate runs for one occurrence: %d; runs delivered more than once: %d; missed occurrences: %d\n", dupRuns, dupDeliveries, missed)
	fmt.Fprintf(out, "  worst seconds (UTC, to set beside the database's log): %s\n", worstSeconds(worst, 5))
	for i, s := range servers {
		fmt.Fprintf(out, "  replica %d max RSS: %s\n", i+1, procstat.PeakRSS(s.cmd.Process.Pid))
	}
	return nil
}

// worstSeconds lists the n seconds with the highest worst lateness, worst
// first.
func worstSeconds(worst map[int64]time.Duration, n int) string {
	secs := slices.Collect(maps.Keys(worst))
	slices.SortFunc(secs, func(a, b int64) int { return cmp.Compare(worst[b], worst[a]) })
	var sb strings.Builder
	for i, s := range secs[:min(n, len(secs))] {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "%s %v", time.Unix(s, 0).UTC().Format(time.TimeOnly), worst[s].Round(time.Millisecond))
	}
	return sb.String()
}
