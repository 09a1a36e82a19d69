package api_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/egress"
	"github.com/vibejobs/vibejobs/internal/postgres"
)

// BenchmarkAPILatency measures create-job and get-job through the whole
// handler (auth, rate limit, strict decoding, store) on both stores, with and
// without the Idempotency-Key layer, and reports p50/p99 per request:
//
//	VIBEJOBS_TEST_POSTGRES_URL=… go test -run '^$' -bench APILatency -benchtime 2000x ./internal/api/
func BenchmarkAPILatency(b *testing.B) {
	stores := map[string]func(b *testing.B) vibejobs.Store{
		"sqlite": func(b *testing.B) vibejobs.Store { st, _ := mustOpenStore(b); return st },
		"postgres": func(b *testing.B) vibejobs.Store {
			return postgres.MustOpenTestWith(b, postgres.Options{Logger: slog.New(slog.DiscardHandler)})
		},
	}
	for _, name := range []string{"sqlite", "postgres"} {
		for _, idem := range []bool{true, false} {
			label := "idempotency"
			if !idem {
				label = "no-idempotency"
			}
			b.Run(name+"/create/"+label, func(b *testing.B) {
				h, token := benchServer(b, stores[name](b), idem)
				lat := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					body, _ := json.Marshal(map[string]any{"name": fmt.Sprintf("j%d", i), "schedule": "0 3 * * *", "url": "https://example.test/h"})
					req := httptest.NewRequest("POST", "/v1/jobs", bytes.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+token)
					var k [12]byte
					rand.Read(k[:])
					req.Header.Set("Idempotency-Key", hex.EncodeToString(k[:]))
					w := httptest.NewRecorder()
					t0 := time.Now()
					h.ServeHTTP(w, req)
					lat = append(lat, time.Since(t0))
					if w.Code != 201 {
						b.Fatalf("create: %d %s", w.Code, w.Body)
					}
				}
				reportQuantiles(b, lat)
			})
		}
		b.Run(name+"/get", func(b *testing.B) {
			h, token := benchServer(b, stores[name](b), true)
			body, _ := json.Marshal(map[string]any{"name": "g", "schedule": "0 3 * * *", "url": "https://example.test/h"})
			req := httptest.NewRequest("POST", "/v1/jobs", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Idempotency-Key", "get-bench")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			var job struct{ ID string }
			json.Unmarshal(w.Body.Bytes(), &job)
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				req := httptest.NewRequest("GET", "/v1/jobs/"+job.ID, nil)
				req.Header.Set("Authorization", "Bearer "+token)
				w := httptest.NewRecorder()
				t0 := time.Now()
				h.ServeHTTP(w, req)
				lat = append(lat, time.Since(t0))
				if w.Code != 200 {
					b.Fatalf("get: %d", w.Code)
				}
			}
			reportQuantiles(b, lat)
		})
	}
}

func benchServer(b *testing.B, st vibejobs.Store, idem bool) (http.Handler, string) {
	tok, _, err := api.Bootstrap(context.Background(), st, time.Now(), nil)
	if err != nil {
		b.Fatal(err)
	}
	policy, _ := egress.NewPolicy(nil)
	s := api.New(api.Config{Store: st, Sealer: mustKeyring(b), URLs: policy, Logger: slog.New(slog.DiscardHandler),
		MaxJobsPerProject: 10_000_000, RateLimit: api.RateLimit{PerSecond: -1}})
	if !idem {
		s.WithoutIdempotency()
	}
	return s.Handler(), tok
}

func reportQuantiles(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	q := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
}
