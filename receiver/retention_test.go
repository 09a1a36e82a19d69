package receiver_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs/receiver"
)

type fakeRetentionStore struct {
	outbox, runs int // rows left to delete
	calls        []string
}

func (f *fakeRetentionStore) DeleteProcessedOutbox(_ context.Context, before time.Time, limit int) (int, error) {
	n := min(limit, f.outbox)
	f.outbox -= n
	f.calls = append(f.calls, fmt.Sprintf("outbox<%s:%d", before.Format(time.DateOnly), n))
	return n, nil
}

func (f *fakeRetentionStore) DeleteProcessedRuns(_ context.Context, before time.Time, limit int) (int, error) {
	n := min(limit, f.runs)
	f.runs -= n
	f.calls = append(f.calls, fmt.Sprintf("runs<%s:%d", before.Format(time.DateOnly), n))
	return n, nil
}

func TestRetentionBatchesOutboxFirst(t *testing.T) {
	now := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	f := &fakeRetentionStore{outbox: 5, runs: 4}
	r, err := receiver.NewRetention(receiver.RetentionConfig{Store: f, BatchSize: 2, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	outbox, runs, err := r.RunOnce(context.Background())
	if err != nil || outbox != 5 || runs != 4 {
		t.Fatalf("RunOnce = %d, %d, %v", outbox, runs, err)
	}
	want := "[outbox<2030-03-03:2 outbox<2030-03-03:2 outbox<2030-03-03:1 runs<2030-03-03:2 runs<2030-03-03:2 runs<2030-03-03:0]"
	if got := fmt.Sprint(f.calls); got != want {
		t.Fatalf("calls %s, want %s (90 days back, outbox first)", got, want)
	}
}

func TestRetentionPeriodBounds(t *testing.T) {
	f := &fakeRetentionStore{}
	for _, c := range []struct {
		period time.Duration
		ok     bool
	}{
		{0, true}, {receiver.MinRetention, true}, {365 * 24 * time.Hour, true},
		{receiver.MinRetention - time.Second, false}, {24 * time.Hour, false}, {-time.Hour, false},
	} {
		_, err := receiver.NewRetention(receiver.RetentionConfig{Store: f, Period: c.period})
		if (err == nil) != c.ok {
			t.Errorf("period %v: err %v", c.period, err)
		}
	}
}

// A Retention not made with NewRetention answers an error, never a nil
// pointer panic, and Run returns it at once rather than logging it forever.
func TestZeroRetentionErrors(t *testing.T) {
	for name, r := range map[string]*receiver.Retention{"zero": {}, "nil": nil} {
		if o, n, err := r.RunOnce(context.Background()); err == nil || o != 0 || n != 0 ||
			!strings.Contains(err.Error(), "NewRetention") {
			t.Errorf("%s Retention: RunOnce = %d, %d, %v; want an error naming NewRetention", name, o, n, err)
		}
		if err := r.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "NewRetention") {
			t.Errorf("%s Retention: Run = %v; want an error naming NewRetention", name, err)
		}
	}
}
