package egress_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/internal/egress"
)

// BenchmarkPost measures a delivery burst to one loopback receiver, with the
// egress client and with a plain net/http client tuned the same way (pool size,
// timeout per request, at most 4 KiB read). The ratio of the two is the cost
// of the policy; cpu-ns/op (client and server CPU per request) is steadier
// than ns/op on a shared machine:
//
//	go test -run '^$' -bench BenchmarkPost -benchtime 20000x -count 6 ./internal/egress/
func BenchmarkPost(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	}))
	defer srv.Close()
	body := []byte(`{"type":"scheduled_job.run","jobId":"job_bench","runId":"run_bench","scheduledFor":"2026-10-09T09:00:00.000Z","attempt":1,"late":false,"trigger":"schedule"}`)
	header := http.Header{
		"Content-Type":    {"application/json"},
		"Vibe-Signature":  {"t=1791536400,v1=47f5954d1810b796a982c0eb461a948f4e80d531212cac1a4668321d24ea3008"},
		"Idempotency-Key": {"run_bench:1"},
	}
	const timeout = 10 * time.Second
	// A burst: many deliveries in flight at once, as the dispatcher sends them.
	const burstWorkersPerCPU = 16

	b.Run("egress", func(b *testing.B) {
		c, _ := mustClient(b, egress.Config{Policy: mustPolicy(b, loopbackOpen...)})
		b.ReportAllocs()
		b.SetParallelism(burstWorkersPerCPU)
		defer reportCPU(b, processCPUTime())
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if res := c.Post(context.Background(), srv.URL+"/hook", header, body, timeout); res.ErrorCode != "" {
					b.Errorf("post: %+v", res)
				}
			}
		})
	})

	b.Run("plain", func(b *testing.B) {
		g := &loopbackGuard{t: b}
		tr := &http.Transport{
			DialContext:         g.DialContext,
			MaxConnsPerHost:     egress.DefaultMaxConnsPerHost,
			MaxIdleConnsPerHost: egress.DefaultMaxConnsPerHost,
			DisableCompression:  true,
		}
		defer tr.CloseIdleConnections()
		client := &http.Client{Transport: tr}
		b.ReportAllocs()
		b.SetParallelism(burstWorkersPerCPU)
		defer reportCPU(b, processCPUTime())
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := plainPost(client, srv.URL+"/hook", header, body, timeout); err != nil {
					b.Errorf("post: %v", err)
				}
			}
		})
	})
}

// reportCPU adds the process CPU time per request (client and server), a
// steadier measure than wall time when other work shares the machine.
func reportCPU(b *testing.B, start time.Duration) {
	if used := processCPUTime() - start; used > 0 {
		b.ReportMetric(float64(used.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

func plainPost(client *http.Client, url string, header http.Header, body []byte, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header = header.Clone()
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, egress.MaxResponseRead))
	return err
}
