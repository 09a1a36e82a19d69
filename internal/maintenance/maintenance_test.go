package maintenance_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/maintenance"
	"github.com/vibejobs/vibejobs/internal/sqlite"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// finishedRun creates a run of j that finished at finished.
func finishedRun(t *testing.T, st vibejobs.Store, j *vibejobs.Job, id string, finished time.Time) {
	t.Helper()
	ctx := context.Background()
	r := vibejobs.NewRun(id, j, vibejobs.TriggerManual, finished.Add(-time.Second), finished.Add(-time.Second))
	if err := st.Update(ctx, func(tx vibejobs.Tx) error { return tx.CreateRun(ctx, r) }); err != nil {
		t.Fatal(err)
	}
	cs, err := st.ClaimDueRuns(ctx, "o", finished, 10, time.Second)
	if err != nil || len(cs) != 1 {
		t.Fatalf("claim: %v %d", err, len(cs))
	}
	a := vibejobs.Attempt{Number: 1, StartedAt: finished, FinishedAt: finished, StatusCode: 200}
	if err := st.RecordOutcomes(ctx, "o", []vibejobs.Outcome{{RunID: id, ClaimedAt: cs[0].ClaimedAt, Attempt: a, Step: vibejobs.Step{State: vibejobs.RunSucceeded}}}); err != nil {
		t.Fatal(err)
	}
}

// TestPruneHonoursProjectRetention: finished history older than each
// project's retention goes (the installation's 90 days by default, a
// project's own setting when it has one); unfinished runs always stay. The
// start of each feed goes under the same retention, up to its first recent
// event, and so do revoked tokens (live ones stay however old).
func TestPruneHonoursProjectRetention(t *testing.T) {
	ctx := context.Background()
	now := t0
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"), sqlite.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	projects := []*vibejobs.Project{{ID: "prj_default", Name: "d", CreatedAt: t0}, {ID: "prj_short", Name: "s", RetentionDays: 10, CreatedAt: t0}}
	jobs := map[string]*vibejobs.Job{}
	for _, p := range projects {
		j := &vibejobs.Job{ID: "job_" + p.Name, ProjectID: p.ID, Name: "j", Schedule: "0 0 1 1 *", Timezone: "UTC",
			URL: "http://127.0.0.1:9/", Enabled: true, State: vibejobs.JobActive, Retry: vibejobs.DefaultRetryPolicy(),
			Timeout: time.Second, CatchUp: vibejobs.CatchUpAll, ScheduleAnchor: t0, CreatedAt: t0, UpdatedAt: t0,
			Secret: vibejobs.SealedSecret{KeyID: "k", Ciphertext: []byte("x")}}
		jobs[p.ID] = j
		if err := st.Update(ctx, func(tx vibejobs.Tx) error {
			if err := tx.CreateProject(ctx, p); err != nil {
				return err
			}
			return tx.CreateJob(ctx, j)
		}); err != nil {
			t.Fatal(err)
		}
	}
	// 30 days old: gone in the 10-day project, kept in the default one.
	finishedRun(t, st, jobs["prj_default"], "run_d30", t0.AddDate(0, 0, -30))
	finishedRun(t, st, jobs["prj_short"], "run_s30", t0.AddDate(0, 0, -30))
	finishedRun(t, st, jobs["prj_short"], "run_s5", t0.AddDate(0, 0, -5))
	finishedRun(t, st, jobs["prj_default"], "run_d100", t0.AddDate(0, 0, -100))
	// An unfinished run, created long ago (for a time still to come), is
	// never pruned.
	old := vibejobs.NewRun("run_open", jobs["prj_short"], vibejobs.TriggerManual, t0.Add(time.Hour), t0.AddDate(0, 0, -50))
	if err := st.Update(ctx, func(tx vibejobs.Tx) error { return tx.CreateRun(ctx, old) }); err != nil {
		t.Fatal(err)
	}

	// Jobs deleted 20 days ago with no runs: gone in the 10-day project,
	// kept in the default one.
	for _, p := range projects {
		j := *jobs[p.ID]
		j.ID, j.Name = "job_deleted_"+p.Name, "deleted"
		if err := st.Update(ctx, func(tx vibejobs.Tx) error {
			if err := tx.CreateJob(ctx, &j); err != nil {
				return err
			}
			return tx.DeleteJob(ctx, p.ID, j.ID, t0.AddDate(0, 0, -20))
		}); err != nil {
			t.Fatal(err)
		}
	}

	// Tokens revoked 20 days ago: gone in the 10-day project, kept in the
	// default one; a live token created long ago stays in both.
	tokens := map[string]bool{} // id: kept
	for _, p := range projects {
		for i, revoked := range []bool{true, true, false} {
			tok := &vibejobs.Token{ID: "tok_" + p.Name + strconv.Itoa(i), ProjectID: p.ID, Name: "t", Role: vibejobs.RoleRead,
				Prefix: "vjt_", Hash: []byte(p.ID + strconv.Itoa(i)), CreatedAt: t0.AddDate(0, 0, -200)}
			if err := st.Update(ctx, func(tx vibejobs.Tx) error {
				if err := tx.CreateToken(ctx, tok, vibejobs.MaxTokensPerProject); err != nil || !revoked {
					return err
				}
				return tx.RevokeToken(ctx, tok.ID, t0.AddDate(0, 0, -20))
			}); err != nil {
				t.Fatal(err)
			}
			tokens[tok.ID] = !revoked || p.ID == "prj_default"
		}
	}

	m := maintenance.New(maintenance.Config{Store: st, Now: func() time.Time { return now }, Batch: 1})
	m.PruneOnce(ctx)
	for id, want := range tokens {
		_, err := st.GetToken(ctx, id)
		if got := err == nil; got != want {
			t.Errorf("token %s kept = %v, want %v (%v)", id, got, want, err)
		}
	}
	for p, want := range map[string]int{"prj_short": 0, "prj_default": 1} {
		// What PruneOnce left of the deleted jobs.
		if n, err := st.PruneDeletedJobs(ctx, p, now, 10); err != nil || n != want {
			t.Errorf("%s: deleted jobs left after PruneOnce = %d, %v; want %d", p, n, err, want)
		}
	}
	for id, want := range map[string]bool{"run_d30": true, "run_s30": false, "run_s5": true, "run_d100": false, "run_open": true} {
		p := "prj_default"
		if id[4] == 's' || id == "run_open" {
			p = "prj_short"
		}
		_, err := st.GetRun(ctx, p, id)
		if got := err == nil; got != want {
			t.Errorf("%s kept = %v, want %v (%v)", id, got, want, err)
		}
	}
	// Each finished run appended its event when it finished. The short
	// project's feed loses its 30-day-old event; the default one keeps both,
	// since its first event (30 days) is recent for it.
	for p, oldest := range map[string]int64{"prj_short": 2, "prj_default": 1} {
		page, err := st.ListEvents(ctx, p, vibejobs.EventFilter{})
		if err != nil || page.Head != 2 || page.Oldest != oldest {
			t.Errorf("%s feed: head %d, oldest %d, %v; want head 2, oldest %d", p, page.Head, page.Oldest, err, oldest)
		}
	}
}

// TestPruneEveryProject: PruneOnce reads the projects a page at a time,
// and prunes the history of every one of them, however many there are.
func TestPruneEveryProject(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"), sqlite.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const n = 250 // more than two pages of projects
	revoked := t0.AddDate(0, 0, -100)
	if err := st.Update(ctx, func(tx vibejobs.Tx) error {
		for i := range n {
			p := &vibejobs.Project{ID: fmt.Sprintf("prj_%03d", i), Name: "p", CreatedAt: t0.AddDate(0, 0, -200)}
			tok := &vibejobs.Token{ID: fmt.Sprintf("tok_%03d", i), ProjectID: p.ID, Name: "t", Role: vibejobs.RoleRead,
				Prefix: "vjt_", Hash: []byte(p.ID), CreatedAt: p.CreatedAt}
			if err := tx.CreateProject(ctx, p); err != nil {
				return err
			}
			if err := tx.CreateToken(ctx, tok, vibejobs.MaxTokensPerProject); err != nil {
				return err
			}
			if err := tx.RevokeToken(ctx, tok.ID, revoked); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	maintenance.New(maintenance.Config{Store: st, Now: func() time.Time { return t0 }}).PruneOnce(ctx)
	left := 0
	for i := range n {
		if _, err := st.GetToken(ctx, fmt.Sprintf("tok_%03d", i)); err == nil {
			left++
		}
	}
	if left != 0 {
		t.Errorf("%d of %d projects kept their token revoked 100 days ago", left, n)
	}
}

// vacuumingStore counts the vacuums asked of it.
type vacuumingStore struct {
	vibejobs.Store
	vacuums int
	err     error
}

func (v *vacuumingStore) VacuumQueue(context.Context) error {
	v.vacuums++
	return v.err
}

// TestVacuumOnceAsksAStoreThatVacuums: a store that vacuums its queue
// tables is asked to on each VacuumOnce, a failure is logged (not fatal),
// and a store that does not is left alone.
func TestVacuumOnceAsksAStoreThatVacuums(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	v := &vacuumingStore{Store: st}
	var logs bytes.Buffer
	m := maintenance.New(maintenance.Config{Store: v, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	m.VacuumOnce(ctx)
	v.err = errors.New("boom")
	m.VacuumOnce(ctx)
	if v.vacuums != 2 {
		t.Errorf("VacuumQueue called %d times, want 2", v.vacuums)
	}
	if !strings.Contains(logs.String(), "maintenance.vacuum_failed") {
		t.Errorf("a failed vacuum was not logged: %q", logs.String())
	}
	maintenance.New(maintenance.Config{Store: st}).VacuumOnce(ctx) // SQLite: nothing to do
}

// countingStore signals each lease recovery and each deadline check asked
// of it.
type countingStore struct {
	vibejobs.Store
	recoveries, expiries chan struct{}
}

func (c *countingStore) RecoverExpiredLeases(ctx context.Context, now time.Time, limit int) (int, error) {
	c.recoveries <- struct{}{}
	return 0, nil
}

func (c *countingStore) FailExpiredRuns(ctx context.Context, now time.Time, limit int) (int, error) {
	c.expiries <- struct{}{}
	return 0, nil
}

// runUntil runs a Maintainer with cfg over c until want signals came from
// one of its tasks (the deadline check if expiries, else lease recovery),
// stops it, and returns how many of each it asked for in all.
func runUntil(t *testing.T, c *countingStore, cfg maintenance.Config, expiries bool, want int) (nRecover, nExpire int) {
	t.Helper()
	cfg.Store = c
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		maintenance.New(cfg).Run(ctx)
	}()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case <-c.recoveries:
			nRecover++
		case <-c.expiries:
			nExpire++
		case <-done:
			return nRecover, nExpire
		case <-timeout:
			t.Fatalf("after 10 s: %d lease recoveries, %d deadline checks", nRecover, nExpire)
		}
		if (expiries && nExpire == want) || (!expiries && nRecover == want) {
			cancel() // and take what the Maintainer still sends until it stops
		}
	}
}

// TestDeadlinesCheckedOnTheirOwnInterval: lease recovery runs every
// LeaseInterval and the deadline check (which reads the whole backlog of
// due runs) every DeadlineInterval, each also once at the start.
func TestDeadlinesCheckedOnTheirOwnInterval(t *testing.T) {
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	counting := func() *countingStore {
		return &countingStore{Store: st, recoveries: make(chan struct{}), expiries: make(chan struct{})}
	}
	rare := maintenance.Config{PruneInterval: time.Hour, StatsInterval: time.Hour, VacuumInterval: time.Hour}

	cfg := rare
	cfg.LeaseInterval, cfg.DeadlineInterval = time.Millisecond, time.Hour
	if r, e := runUntil(t, counting(), cfg, false, 10); r < 10 || e != 1 {
		t.Errorf("lease every 1 ms, deadlines every hour: %d lease recoveries and %d deadline checks; want 10 or more and 1", r, e)
	}
	cfg.LeaseInterval, cfg.DeadlineInterval = time.Hour, time.Millisecond
	if r, e := runUntil(t, counting(), cfg, true, 10); e < 10 || r != 1 {
		t.Errorf("lease every hour, deadlines every 1 ms: %d lease recoveries and %d deadline checks; want 1 and 10 or more", r, e)
	}
}

// backlogStore has a history to prune that never ends: each PruneRuns
// deletes a full batch, once pruning was signalled.
type backlogStore struct {
	*countingStore
	pruning chan struct{}
}

func (b *backlogStore) ListProjects(context.Context, vibejobs.Page) ([]*vibejobs.Project, string, error) {
	return []*vibejobs.Project{{ID: "prj_busy", Name: "busy", CreatedAt: t0}}, "", nil
}

func (b *backlogStore) PruneRuns(ctx context.Context, projectID string, cutoff time.Time, limit int) (int, error) {
	select {
	case b.pruning <- struct{}{}:
	default:
	}
	return limit, ctx.Err()
}

// TestLongPruneHoldsUpNoRecovery: pruning a large history (a retention
// just lowered on a busy installation: millions of runs, thousands of
// batches) goes on in its own time; lease recovery and the deadline check
// keep their intervals meanwhile. On the same loop, runs of a crashed
// replica waited until every replica had finished pruning, and runs past
// their lifetime stayed unfailed.
func TestLongPruneHoldsUpNoRecovery(t *testing.T) {
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c := &countingStore{Store: st, recoveries: make(chan struct{}), expiries: make(chan struct{})}
	b := &backlogStore{countingStore: c, pruning: make(chan struct{})}
	m := maintenance.New(maintenance.Config{Store: b, Now: func() time.Time { return t0 },
		LeaseInterval: time.Millisecond, DeadlineInterval: time.Millisecond, PruneInterval: time.Millisecond,
		StatsInterval: time.Hour, VacuumInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	defer func() {
		cancel()
		for {
			select {
			case <-done:
				return
			case <-c.recoveries:
			case <-c.expiries:
			case <-b.pruning:
			}
		}
	}()
	timeout := time.After(10 * time.Second)
	wait := func(ch chan struct{}, what string) {
		t.Helper()
		for {
			select {
			case <-ch:
				return
			case <-c.recoveries: // the other tasks' signals, meanwhile
			case <-c.expiries:
			case <-timeout:
				t.Fatalf("no %s within 10 s", what)
			}
		}
	}
	wait(b.pruning, "prune")
	// Pruning goes on; both must still come, several times.
	for range 3 {
		wait(c.recoveries, "lease recovery while pruning")
		wait(c.expiries, "deadline check while pruning")
	}
}

// cutoffStore tells the cutoff each PruneRuns is asked with, and has one
// project, of retention days.
type cutoffStore struct {
	vibejobs.Store
	days    int
	cutoffs []time.Time
}

func (c *cutoffStore) ListProjects(context.Context, vibejobs.Page) ([]*vibejobs.Project, string, error) {
	return []*vibejobs.Project{{ID: "prj_week", Name: "week", RetentionDays: c.days, CreatedAt: t0}}, "", nil
}

func (c *cutoffStore) PruneRuns(ctx context.Context, projectID string, cutoff time.Time, limit int) (int, error) {
	c.cutoffs = append(c.cutoffs, cutoff)
	return 0, nil
}

// TestRetentionIsWholeDaysWhateverTheZone: a retention of n days keeps
// the history of the last n × 24 h, whatever the zone of the clock's
// times. time.Now reads in the host's zone: counted back on that zone's
// calendar, a week across the start of summer time was 167 hours, and
// runs 7 days old less an hour were pruned under the 7-day minimum.
func TestRetentionIsWholeDaysWhateverTheZone(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"), sqlite.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	// Two days after the clocks went forward on 8 March 2026.
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, ny)
	for _, days := range []int{maintenance.MinRetentionDays, 30} {
		c := &cutoffStore{Store: st, days: days}
		maintenance.New(maintenance.Config{Store: c, Now: func() time.Time { return now }}).PruneOnce(ctx)
		want := now.Add(-time.Duration(days) * 24 * time.Hour)
		if len(c.cutoffs) != 1 || !c.cutoffs[0].Equal(want) {
			t.Errorf("retention %d days at %s: PruneRuns cutoffs %v, want [%s] (%d × 24 h before)",
				days, now, c.cutoffs, want, days)
		}
	}
}
