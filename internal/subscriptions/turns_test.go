package subscriptions_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/egress"
	"github.com/vibejobs/vibejobs/internal/subscriptions"
)

// streamSender accepts every request and appends an event to the feed
// with each, so every subscription of the project always has work; each
// request takes 250 ms of the fake clock. After n requests it calls stop.
type streamSender struct {
	e    *env
	n    int
	stop context.CancelFunc

	mu   sync.Mutex
	sent []sentEvent // in the order sent
	err  error       // of the first append that failed
}

type sentEvent struct {
	url string
	seq int64
}

func (s *streamSender) Post(ctx context.Context, rawURL string, header http.Header, body []byte, timeout time.Duration) egress.Result {
	var ev struct {
		Sequence int64 `json:"sequence"`
	}
	err := json.Unmarshal(body, &ev)
	s.e.clock.Add(250 * time.Millisecond)
	if err == nil {
		err = s.e.store.Update(ctx, func(tx vibejobs.Tx) error {
			return tx.AppendEvents(ctx, vibejobs.JobEvent(vibejobs.EventJobUpdated, s.e.job, s.e.clock.Now()))
		})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, sentEvent{rawURL, ev.Sequence})
	if err != nil && s.err == nil {
		s.err = err
	}
	if len(s.sent) == s.n {
		s.stop()
	}
	return egress.Result{StatusCode: http.StatusOK}
}

// claimCounter counts the claims that leased a subscription.
type claimCounter struct {
	subscriptions.Store
	mu     sync.Mutex
	claims int
}

func (c *claimCounter) ClaimSubscriptions(ctx context.Context, owner string, now time.Time, limit int, lease time.Duration) ([]*vibejobs.Subscription, error) {
	subs, err := c.Store.ClaimSubscriptions(ctx, owner, now, limit, lease)
	c.mu.Lock()
	c.claims += len(subs)
	c.mu.Unlock()
	return subs, err
}

// TestOverloadServesEverySubscriptionInTurn: one session for two
// subscriptions that always have work (every request appends an event).
// A session that kept its subscription until it was caught up would hold
// the only session for good, the other never served; instead each yields
// after its turn (1 s of the clock, 4 requests here) and the claim takes
// the other, served less recently. Each receiver still gets its events in
// order, none twice and none skipped, and a turn is worth more than one
// claim.
func TestOverloadServesEverySubscriptionInTurn(t *testing.T) {
	e := newEnv(t)
	a, _ := e.subscribe("http://127.0.0.1:1/a")
	b, _ := e.subscribe("http://127.0.0.1:1/b")
	e.emit(e.job, vibejobs.EventJobUpdated)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sender := &streamSender{e: e, n: 40, stop: cancel}
	store := &claimCounter{Store: e.store}
	d := subscriptions.New(subscriptions.Config{
		Store: store, Sender: sender, Opener: e.keys, Owner: "w1", Now: e.clock.Now,
		Logger: slog.New(slog.NewJSONHandler(e.logs, nil)), Concurrency: 1, PollInterval: 10 * time.Millisecond,
	})
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second): // a hang guard, not a measure
		cancel()
		<-done
		t.Fatal("Run did not send 40 events")
	}

	sender.mu.Lock()
	defer sender.mu.Unlock()
	if sender.err != nil {
		t.Fatal(sender.err)
	}
	got := map[string][]int64{}
	longest, streak := 0, 0
	for i, x := range sender.sent {
		got[x.url] = append(got[x.url], x.seq)
		if i > 0 && x.url == sender.sent[i-1].url {
			streak++
		} else {
			streak = 1
		}
		longest = max(longest, streak)
	}
	for _, sub := range []*vibejobs.Subscription{a, b} {
		seqs := got[sub.URL]
		if len(seqs) < 10 {
			t.Errorf("%s got %d of the 40 requests: starved", sub.URL[len(sub.URL)-1:], len(seqs))
			continue
		}
		for i, seq := range seqs {
			if seq != sub.Cursor+1+int64(i) {
				t.Fatalf("%s received %v: not each event once, in order", sub.URL[len(sub.URL)-1:], seqs)
			}
		}
		// Each yield wrote the cursor: the next session started right
		// after it, and the last one left it at its last event.
		if c := e.get(sub.ID).Cursor; c != seqs[len(seqs)-1] {
			t.Errorf("%s: cursor %d after its last event %d", sub.URL[len(sub.URL)-1:], c, seqs[len(seqs)-1])
		}
	}
	if longest > 4 {
		t.Errorf("one subscription got %d requests in a row; a turn is 1 s, 4 requests", longest)
	}
	store.mu.Lock()
	claims := store.claims
	store.mu.Unlock()
	if claims*2 > len(sender.sent) {
		t.Errorf("%d claims for %d events: a claim per event", claims, len(sender.sent))
	}
}
