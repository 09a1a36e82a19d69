package postgres

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Backoff between reconnections of a Notifications listener.
const (
	listenMinBackoff = 100 * time.Millisecond
	listenMaxBackoff = 5 * time.Second
	// listenKeepalive is how long a listener waits quietly before checking
	// that its connection is alive.
	listenKeepalive = 15 * time.Second
)

// Notifications listens on NotifyChannel and JobsChannel on a dedicated
// connection.
//
// wakeups signals when runs became claimable in this Store's schema, by any
// replica. Signals coalesce: the channel holds at most one, so a slow
// reader sees one signal for many notifications.
//
// jobs receives, in order, the id of each job of this Store's schema whose
// delivery settings changed or that was deleted, by any replica, once
// committed. The caller must keep reading it: the listener waits for it.
//
// Each time a session starts listening, wakeups signals and jobs receives
// "": the notifications sent before it listened are lost (the caller's
// polling is the fallback for runs), whether the caller acted before the
// first session listened or while a lost one was replaced. A lost
// connection is re-established with backoff, and so is one whose server
// takes no writes (see errListenReadOnly). Both channels are closed when ctx
// is done or the Store is closed.
func (s *Store) Notifications(ctx context.Context) (wakeups <-chan struct{}, jobs <-chan string) {
	out := make(chan struct{}, 1)
	changes := make(chan string, 64)
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.closing, cancel)
	s.listeners.Add(1)
	go func() {
		defer s.listeners.Done()
		defer close(out)
		defer close(changes)
		defer stop()
		defer cancel()
		s.listen(ctx, out, changes)
	}()
	return out, changes
}

func signal(out chan<- struct{}) {
	select {
	case out <- struct{}{}:
	default:
	}
}

// listen runs listening sessions until ctx is done.
func (s *Store) listen(ctx context.Context, out chan<- struct{}, jobs chan<- string) {
	backoff := listenMinBackoff
	for ctx.Err() == nil {
		listening, err := s.listenOnce(ctx, out, jobs, func() {
			// Notifications sent before this session listened went unheard,
			// while the reader may have claimed: the dispatcher starts
			// claiming as the first session connects, and a session that
			// ended took with it what was sent until the next one listens.
			// Wake the reader, and say that any job may have changed.
			signal(out)
			send(ctx, jobs, "")
			backoff = listenMinBackoff
		})
		if ctx.Err() != nil {
			return
		}
		if listening {
			s.logger.Warn("postgres.listen_lost", "channel", NotifyChannel, "error", err)
		} else {
			s.logger.Warn("postgres.listen_failed", "channel", NotifyChannel, "error", err, "retry_in", backoff)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, listenMaxBackoff)
	}
}

// send hands v to ch unless ctx ends first.
func send(ctx context.Context, ch chan<- string, v string) {
	select {
	case ch <- v:
	case <-ctx.Done():
	}
}

// jobPayload is the JobsChannel payload announcing job id.
func (s *Store) jobPayload(id string) string { return id + " " + s.schema }

// errListenReadOnly ends a listening session on a server that takes no
// writes (see writable): the NOTIFYs of a failover's new primary never reach
// it, so the listener connects again, to wherever the address leads now.
var errListenReadOnly = errors.New("postgres: the server takes no writes (a standby, or fenced): listening elsewhere")

// listenOnce connects, LISTENs, calls ready, and forwards this schema's
// notifications until the connection fails or ctx is done. listening reports
// whether it got as far as ready.
func (s *Store) listenOnce(ctx context.Context, out chan<- struct{}, jobs chan<- string, ready func()) (listening bool, err error) {
	conn, err := pgx.ConnectConfig(ctx, s.listenConfig())
	if err != nil {
		return false, mapError(err, "connecting to listen")
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if !writable(conn) {
		return false, errListenReadOnly
	}
	for _, channel := range []string{NotifyChannel, JobsChannel} {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
			return false, mapError(err, "listening")
		}
	}
	ready()
	for {
		waitCtx, cancel := context.WithTimeout(ctx, listenKeepalive)
		n, err := conn.WaitForNotification(waitCtx)
		cancel()
		if err != nil && ctx.Err() == nil && pgconn.Timeout(err) {
			// Quiet for a while: make sure the session is still there, since a
			// connection lost without a reset would otherwise wait forever.
			pingCtx, cancel := context.WithTimeout(ctx, listenKeepalive)
			err = conn.Ping(pingCtx)
			cancel()
			if err == nil && !writable(conn) {
				err = errListenReadOnly
			}
			if err == nil {
				continue
			}
		}
		if err != nil {
			return true, mapError(err, "waiting for notifications")
		}
		switch n.Channel {
		case NotifyChannel:
			if n.Payload == s.schema {
				signal(out)
			}
		case JobsChannel:
			// A job id holds no space; the schema may.
			if id, schema, ok := strings.Cut(n.Payload, " "); ok && schema == s.schema {
				send(ctx, jobs, id)
			}
		}
	}
}

// listenConfig is the configuration of a listener connection: the pool's,
// named in pg_stat_activity (unless the URL names its connections) so an
// operator can tell listeners from pooled sessions.
func (s *Store) listenConfig() *pgx.ConnConfig {
	cc := s.connConfig.Copy()
	if cc.RuntimeParams["application_name"] == "" {
		cc.RuntimeParams["application_name"] = strings.TrimSpace("vibejobs listener " + s.schema)
	}
	return cc
}
