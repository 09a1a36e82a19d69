package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vibejobs/vibejobs/internal/procstat"
)

// benchScale registers many daily jobs through the API of a server running
// as a child process, then measures the server's idle CPU and RSS and the
// latency of paging through GET /v1/jobs.
func benchScale(ctx context.Context, out io.Writer, n, workers int, database string) error {
	dir, err := os.MkdirTemp("", "vibejobs-scale-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// Jobs that fall due during the run are delivered to a loopback
	// receiver: a benchmark never sends traffic anywhere else.
	br, err := newBenchReceiver(0)
	if err != nil {
		return err
	}
	defer br.srv.Close()
	srv, err := startBenchServer(ctx, dir, database, n+1)
	if err != nil {
		return err
	}
	defer srv.stop()
	base := srv.base
	token, err := adminToken(dir)
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, Proxy: nil}}

	const batch = 100 // jobs per POST /v1/jobs/batch
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				last := next.Add(batch)
				first := last - batch + 1
				if first > int64(n) {
					return
				}
				last = min(last, int64(n))
				jobs := make([]map[string]any, 0, batch)
				for i := first; i <= last; i++ {
					h, _ := rand.Int(rand.Reader, big.NewInt(24))
					m, _ := rand.Int(rand.Reader, big.NewInt(60))
					jobs = append(jobs, map[string]any{"name": fmt.Sprintf("daily-%d", i),
						"schedule": fmt.Sprintf("%d %d * * *", m, h), "url": br.url})
				}
				body, _ := json.Marshal(map[string]any{"jobs": jobs})
				req, _ := http.NewRequest("POST", base+"/v1/jobs/batch", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+token)
				req.Header.Set("Content-Type", "application/json")
				var k [12]byte
				rand.Read(k[:])
				req.Header.Set("Idempotency-Key", hex.EncodeToString(k[:]))
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 201 {
					if failed.Add(last-first+1) < 5 {
						fmt.Fprintf(os.Stderr, "create: status %d\n", resp.StatusCode)
					}
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	fmt.Fprintf(out, "scale: created %d daily jobs through POST /v1/jobs/batch (100 a request) in %v: %.0f jobs/s (%d workers, %d failed)\n",
		n, el.Round(time.Millisecond), float64(n)/el.Seconds(), workers, failed.Load())

	// Idle: no job is due for hours on average; measure CPU over 20 s.
	cpu0 := procstat.CPU(srv.cmd.Process.Pid)
	if err := sleepCtx(ctx, 20*time.Second); err != nil {
		return err
	}
	cpu1 := procstat.CPU(srv.cmd.Process.Pid)
	fmt.Fprintf(out, "  idle CPU over 20 s: %.2f %% of one core\n", 100*(cpu1-cpu0).Seconds()/20)

	// Page through the jobs: latency of each GET /v1/jobs page of 100.
	var lat []time.Duration
	cursor := ""
	for pages := 0; pages < 2000; pages++ {
		q := "/v1/jobs?limit=100"
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		req, _ := http.NewRequest("GET", base+q, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		t0 := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		var page struct {
			NextCursor string `json:"nextCursor"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		lat = append(lat, time.Since(t0))
		if err != nil || resp.StatusCode != 200 {
			return fmt.Errorf("listing jobs: status %d: %v", resp.StatusCode, err)
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	fmt.Fprintf(out, "  GET /v1/jobs pages of 100: %s\n", quantiles(lat))
	fmt.Fprintf(out, "  server max RSS: %s\n", procstat.PeakRSS(srv.cmd.Process.Pid))
	return nil
}
