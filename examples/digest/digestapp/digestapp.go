// Package digestapp is the daily-digest example app of the receiver SDK: it
// receives a daily-digest job from vibejobs, accepts it durably (SQLite or
// PostgreSQL), and an outbox worker "sends" the digest, logging only the run
// id. It is a package so that tests, including the platform's end-to-end test,
// can start the whole app with Main on port 0.
package digestapp

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/receiver"
	"github.com/vibejobs/vibejobs/receiver/pgstore"
	"github.com/vibejobs/vibejobs/receiver/sqlitestore"
)

// store is what the app needs of a receiver store.
type store interface {
	receiver.Store
	receiver.Outbox
	receiver.RetentionStore
}

// Main is the app. Set the fields (or call ParseFlags), then Start; Close
// shuts it down gracefully.
type Main struct {
	Listen             string        // address to listen on, e.g. 127.0.0.1:9090 or 127.0.0.1:0
	SecretFile         string        // file holding the job secret
	PreviousSecretFile string        // optional: the secret replaced by a rotation
	PreviousWindow     time.Duration // how long the previous secret stays valid after Start
	Database           string        // SQLite path, or a postgres:// URL
	JobIDs             []string      // accepted job ids; empty accepts any
	PollInterval       time.Duration // outbox worker poll interval
	Stdout             io.Writer     // log output; nil means os.Stdout

	// OnProcessed, when set, is called after a digest was processed (for tests).
	OnProcessed func(runID string)

	log      *slog.Logger
	ln       net.Listener
	server   *http.Server
	store    store
	closeDB  func()
	cancel   context.CancelFunc
	bg       sync.WaitGroup
	serveErr chan error
}

// ParseFlags sets m's fields from command-line arguments.
func (m *Main) ParseFlags(args []string) error {
	fs := flag.NewFlagSet("digest", flag.ContinueOnError)
	fs.StringVar(&m.Listen, "listen", "127.0.0.1:9090", "address to listen on")
	fs.StringVar(&m.SecretFile, "secret-file", "", "file holding the job secret (required)")
	fs.StringVar(&m.PreviousSecretFile, "previous-secret-file", "", "file holding the previous job secret during a rotation")
	fs.DurationVar(&m.PreviousWindow, "previous-secret-window", receiver.DefaultRotationWindow, "how long the previous secret is accepted after start")
	fs.StringVar(&m.Database, "database", "digest.db", "SQLite file path or postgres:// URL")
	fs.Func("job-id", "accepted job id (repeatable; default: any)", func(s string) error {
		if !contract.ValidID(s, "job_") {
			return errors.New("not a job id (job_…)")
		}
		m.JobIDs = append(m.JobIDs, s)
		return nil
	})
	fs.DurationVar(&m.PollInterval, "poll-interval", 200*time.Millisecond, "outbox worker poll interval")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if m.SecretFile == "" {
		return errors.New("--secret-file is required")
	}
	return nil
}

// readSecret reads a secret file, ignoring surrounding whitespace such as a
// trailing newline. Errors never contain the file's content.
func readSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	if !contract.ValidSecret(s) {
		return "", fmt.Errorf("%s does not hold a job secret (vjs_ and 43 base64url characters)", path)
	}
	return s, nil
}

// Start opens the database, migrates it, and starts the HTTP server, the outbox
// worker and retention. It returns once the server is listening.
func (m *Main) Start(ctx context.Context) (err error) {
	out := m.Stdout
	if out == nil {
		out = os.Stdout
	}
	m.log = slog.New(slog.NewTextHandler(out, nil))

	secrets := receiver.Secrets{}
	if secrets.Current, err = readSecret(m.SecretFile); err != nil {
		return err
	}
	if m.PreviousSecretFile != "" {
		if secrets.Previous, err = readSecret(m.PreviousSecretFile); err != nil {
			return err
		}
		secrets.PreviousExpiresAt = time.Now().Add(m.PreviousWindow)
	}
	verifier, err := receiver.NewVerifier(secrets, nil)
	if err != nil {
		return err
	}

	if err := m.openStore(ctx); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			m.closeDB()
		}
	}()

	handler, err := receiver.NewHandler(receiver.Config{Verifier: verifier, JobIDs: m.JobIDs, Logger: m.log}, m.store)
	if err != nil {
		return err
	}
	worker, err := receiver.NewWorker(receiver.WorkerConfig{
		Outbox:       m.store,
		Process:      m.sendDigest,
		PollInterval: m.PollInterval,
		Logger:       m.log,
	})
	if err != nil {
		return err
	}
	retention, err := receiver.NewRetention(receiver.RetentionConfig{Store: m.store, Logger: m.log})
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("/", handler)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	m.server = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second, // governs slow bodies
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(m.log.Handler(), slog.LevelWarn),
	}
	if m.ln, err = net.Listen("tcp", m.Listen); err != nil {
		return err
	}

	bgctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel = cancel
	m.bg.Go(func() { worker.Run(bgctx) })
	m.bg.Go(func() { retention.Run(bgctx) })
	m.serveErr = make(chan error, 1)
	go func() { m.serveErr <- m.server.Serve(m.ln) }()
	m.log.Info("digest app listening", "addr", m.ln.Addr().String())
	return nil
}

func (m *Main) openStore(ctx context.Context) error {
	if strings.HasPrefix(m.Database, "postgres://") || strings.HasPrefix(m.Database, "postgresql://") {
		s, err := pgstore.Open(ctx, m.Database)
		if err != nil {
			return err
		}
		if err := s.Migrate(ctx); err != nil {
			s.Close()
			return err
		}
		m.store, m.closeDB = s, s.Close
		return nil
	}
	s, err := sqlitestore.Open(ctx, m.Database)
	if err != nil {
		return err
	}
	m.store, m.closeDB = s, func() { s.Close() }
	return nil
}

// sendDigest is the app's work. A real app would send the e-mail with runID as
// the provider's idempotency key.
func (m *Main) sendDigest(ctx context.Context, runID string, payload []byte) error {
	m.log.Info("daily digest sent", "run_id", runID)
	if m.OnProcessed != nil {
		m.OnProcessed(runID)
	}
	return nil
}

// Addr returns the address the server listens on (after Start).
func (m *Main) Addr() string { return m.ln.Addr().String() }

// Close stops accepting requests, waits up to 10 s for requests in flight,
// then stops the worker (an item in flight is released for a retry) and
// retention, and closes the database.
func (m *Main) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := m.server.Shutdown(ctx)
	if serr := <-m.serveErr; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	m.cancel()
	m.bg.Wait()
	m.closeDB()
	m.log.Info("digest app stopped")
	return err
}

// Run is the whole program: parse args, start, wait for ctx, shut down.
func Run(ctx context.Context, args []string, stdout io.Writer) error {
	m := &Main{Stdout: stdout}
	if err := m.ParseFlags(args); err != nil {
		return err
	}
	if err := m.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	return m.Close()
}
