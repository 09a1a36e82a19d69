package digestapp_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/examples/digest/digestapp"
	"github.com/vibejobs/vibejobs/internal/syncbuf"
)

const (
	secret   = "vjs_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
	previous = "vjs_ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8"
)

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func deliver(t *testing.T, addr, key, runID string) (int, string) {
	t.Helper()
	body := contract.Body(contract.Payload{JobID: "job_digest", RunID: runID, ScheduledFor: time.Now().UTC().Truncate(time.Millisecond), Attempt: 1, Trigger: "schedule"})
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/jobs/daily-digest", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(contract.HeaderCallerKind, contract.CallerKindSchedule)
	req.Header.Set(contract.HeaderSignature, contract.Sign(key, time.Now().Unix(), body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestDigestApp(t *testing.T) {
	for _, db := range []struct {
		name string
		dsn  func(t *testing.T) string
	}{
		{"sqlite", func(t *testing.T) string { return filepath.Join(t.TempDir(), "digest.db") }},
		{"postgres", postgresSchema},
	} {
		t.Run(db.name, func(t *testing.T) {
			var logs syncbuf.Buffer
			processed := make(chan string, 10)
			m := &digestapp.Main{Stdout: &logs, OnProcessed: func(runID string) { processed <- runID }}
			if err := m.ParseFlags([]string{
				"--listen", "127.0.0.1:0",
				"--secret-file", writeFile(t, "secret", secret+"\n"),
				"--previous-secret-file", writeFile(t, "previous", previous),
				"--database", db.dsn(t),
				"--job-id", "job_digest",
				"--poll-interval", "20ms",
			}); err != nil {
				t.Fatal(err)
			}
			if err := m.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			closed := false
			defer func() {
				if !closed {
					m.Close()
				}
			}()

			for _, key := range []string{secret, secret, previous} { // a repeat, then the rotated-out key
				runID := "run_today"
				if key == previous {
					runID = "run_rotated"
				}
				if code, body := deliver(t, m.Addr(), key, runID); code != 202 || body != `{"accepted":true}` {
					t.Fatalf("delivery of %s: %d %s", runID, code, body)
				}
			}
			if code, _ := deliver(t, m.Addr(), "vjs_"+strings.Repeat("A", 43), "run_forged"); code != 401 {
				t.Fatalf("forged delivery: %d", code)
			}
			got := map[string]bool{}
			timeout := time.After(30 * time.Second)
			for len(got) < 2 {
				select {
				case id := <-processed:
					if got[id] {
						t.Fatalf("%s processed twice", id)
					}
					got[id] = true
				case <-timeout:
					t.Fatalf("processed only %v", got)
				}
			}
			closed = true
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			select {
			case id := <-processed:
				t.Fatalf("%s processed again", id)
			default:
			}
			out := logs.String()
			if !strings.Contains(out, "daily digest sent") || !strings.Contains(out, "run_id=run_today") {
				t.Fatalf("logs:\n%s", out)
			}
			for _, s := range []string{secret, previous, "scheduled_job.run"} {
				if strings.Contains(out, s) {
					t.Fatalf("logs contain %q", s)
				}
			}
		})
	}
}

func TestRunRejectsBadConfiguration(t *testing.T) {
	ctx := context.Background()
	bad := writeFile(t, "bad", "vjs_not-a-secret\n")
	for _, args := range [][]string{
		{},
		{"--secret-file", filepath.Join(t.TempDir(), "missing")},
		{"--secret-file", bad},
		{"--secret-file", bad, "--job-id", "digest"},
		{"--secret-file", writeFile(t, "s", secret), "extra"},
	} {
		err := digestapp.Run(ctx, args, io.Discard)
		if err == nil {
			t.Fatalf("Run(%q) succeeded", args)
		}
		if strings.Contains(err.Error(), "not-a-secret") {
			t.Fatalf("error shows the secret file's content: %v", err)
		}
	}
}

func TestRunStopsWhenContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out syncbuf.Buffer
	done := make(chan error, 1)
	go func() {
		done <- digestapp.Run(ctx, []string{
			"--listen", "127.0.0.1:0",
			"--secret-file", writeFile(t, "secret", secret),
			"--database", filepath.Join(t.TempDir(), "digest.db"),
		}, &out)
	}()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for !strings.Contains(out.String(), "digest app listening") {
		select {
		case err := <-done:
			t.Fatalf("Run returned early: %v\n%s", err, out.String())
		case <-deadline:
			t.Fatalf("not listening:\n%s", out.String())
		case <-tick.C:
		}
	}
	cancel()
	if err := <-done; err != nil || !strings.Contains(out.String(), "digest app stopped") {
		t.Fatalf("Run = %v\n%s", err, out.String())
	}
}

// postgresSchema returns a URL of the test database whose connections use a
// fresh schema, dropped when t ends. Without VIBEJOBS_TEST_POSTGRES_URL the
// test is skipped, or fails when CI is set.
func postgresSchema(t *testing.T) string {
	base := os.Getenv("VIBEJOBS_TEST_POSTGRES_URL")
	if base == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("VIBEJOBS_TEST_POSTGRES_URL is not set; CI must run the PostgreSQL tests")
		}
		t.Skip("PostgreSQL test skipped: set VIBEJOBS_TEST_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable)")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var b [6]byte
	rand.Read(b[:])
	schema := "digest_test_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, base)
		if err == nil {
			conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
			conn.Close(ctx)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
