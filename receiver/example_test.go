package receiver_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/receiver"
	"github.com/vibejobs/vibejobs/receiver/sqlitestore"
)

func ExampleVerifier_Verify() {
	v, err := receiver.NewVerifier(receiver.Secrets{
		Current: "vjs_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8",
	}, func() time.Time { return time.Unix(1791536400, 0) }) // the vector's clock; nil in production
	if err != nil {
		log.Fatal(err)
	}
	body := []byte(`{"type":"scheduled_job.run","jobId":"job_vector","runId":"run_vector","scheduledFor":"2026-10-09T09:00:00.000Z","attempt":1,"late":false,"trigger":"schedule"}`)
	fmt.Println(v.Verify("t=1791536400,v1=47f5954d1810b796a982c0eb461a948f4e80d531212cac1a4668321d24ea3008", body))
	fmt.Println(v.Verify("t=1791536400,v1=47F5954D1810B796A982C0EB461A948F4E80D531212CAC1A4668321D24EA3008", body))
	// Output:
	// <nil>
	// contract: malformed signature header
}

func ExampleVerifier_Rotate() {
	v, _ := receiver.NewVerifier(receiver.Secrets{Current: "vjs_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"}, nil)
	// The platform returned a new secret: attempts signed with the old one in
	// the last minutes still verify for DefaultRotationWindow.
	if err := v.Rotate("vjs_ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8", 0); err != nil {
		log.Fatal(err)
	}
	fmt.Println(v.Secrets().Previous == "vjs_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8")
	// Output: true
}

// A complete receiver: verify, accept durably in SQLite, answer 202, and let an
// outbox worker do the work.
func ExampleNewHandler() {
	dir, _ := os.MkdirTemp("", "receiver-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	secret := "vjs_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8" // from protected configuration
	v, _ := receiver.NewVerifier(receiver.Secrets{Current: secret}, nil)
	h, err := receiver.NewHandler(receiver.Config{
		Verifier: v,
		JobIDs:   []string{"job_digest"},
		Logger:   slog.New(slog.DiscardHandler),
	}, store)
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(h) // in production: an http.Server with ReadHeaderTimeout and ReadTimeout
	defer srv.Close()

	// What the platform sends.
	body := contract.Body(contract.Payload{JobID: "job_digest", RunID: "run_1", ScheduledFor: time.Now().UTC(), Attempt: 1, Trigger: "schedule"})
	for range 2 { // the second delivery of the same run gets the same answer
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Vibe-Caller-Kind", "schedule")
		req.Header.Set("Vibe-Signature", contract.Sign(secret, time.Now().Unix(), body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(answer))
	}

	w, _ := receiver.NewWorker(receiver.WorkerConfig{
		Outbox: store,
		Logger: slog.New(slog.DiscardHandler),
		Process: func(ctx context.Context, runID string, payload []byte) error {
			fmt.Println("sending the digest, idempotency key", runID)
			return nil
		},
	})
	n, err := w.ProcessBatch(ctx) // in production: go w.Run(ctx)
	fmt.Println(n, err)
	// Output:
	// 202 {"accepted":true}
	// 202 {"accepted":true}
	// sending the digest, idempotency key run_1
	// 1 <nil>
}

func ExampleValidatePayload() {
	_, err := receiver.ValidatePayload([]byte(`{"type":"scheduled_job.run","jobId":"job_a","runId":"run_b","scheduledFor":"2026-10-09T09:00:00.000Z","attempt":5,"late":false,"trigger":"schedule"}`))
	fmt.Println(err)
	// Output: receiver: invalid payload: attempt: not an integer from 1 to 4
}

func ExampleVerifyEvent() {
	body := []byte(`{"event":"run.succeeded"}`)
	oldSecret := "vjs_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
	newSecret := "vjs_ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8"
	now := time.Unix(1791536400, 0)
	// During a rotation the sender signs with both secrets.
	header := contract.Sign(newSecret, now.Unix(), body) + ",v1=" + strings.TrimPrefix(contract.Sign(oldSecret, now.Unix(), body), "t=1791536400,v1=")
	fmt.Println(receiver.VerifyEvent(header, body, now, oldSecret))
	// Output: <nil>
}

func ExampleNewRetention() {
	dir, _ := os.MkdirTemp("", "receiver-example")
	defer os.RemoveAll(dir)
	store, _ := sqlitestore.Open(context.Background(), filepath.Join(dir, "app.db"))
	defer store.Close()
	_, err := receiver.NewRetention(receiver.RetentionConfig{Store: store, Period: 24 * time.Hour})
	fmt.Println(err)
	r, _ := receiver.NewRetention(receiver.RetentionConfig{Store: store}) // 90 days
	fmt.Println(r.RunOnce(context.Background()))
	// Output:
	// receiver: retention 24h0m0s is shorter than the minimum 168h0m0s
	// 0 0 <nil>
}
