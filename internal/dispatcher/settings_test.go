package dispatcher_test

import (
	"context"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/egress"
)

// Secrets of the tests below, in the contract's format.
const (
	oldSecret = "vjs_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
	newSecret = "vjs_Hx4dHBsaGRgXFhUUExIREA8ODQwLCgkIBwYFBAMCAQA"
)

// edit gives j a new URL, secret and timeout, as a PATCH and a rotation
// committed together would.
func (e *env) edit(t *testing.T, j *vibejobs.Job, url string) {
	t.Helper()
	j.URL, j.Timeout = url, 3*time.Second
	j.Secret = vibejobs.SealedSecret{KeyID: "plain", Ciphertext: []byte(newSecret)}
	e.update(t, func(tx vibejobs.Tx) error { return tx.UpdateJob(context.Background(), j) })
}

// wantSettings fails unless x went to url, with timeout as its budget,
// signed with secret.
func (e *env) wantSettings(t *testing.T, what string, x sent, url string, timeout time.Duration, secret string) {
	t.Helper()
	if x.url != url || x.timeout != timeout {
		t.Fatalf("%s: sent to %s with a %s timeout, want %s with %s", what, x.url, x.timeout, url, timeout)
	}
	if err := contract.Verify(secret, x.header.Get("Vibe-Signature"), x.body, e.clock.Now().Unix()); err != nil {
		t.Fatalf("%s: not signed with the job's secret as it is now: %v", what, err)
	}
}

// TestRetryUsesTheSettingsOfItsStart: every attempt uses the job's URL,
// secret and timeout as they are when that attempt starts (SEMANTICS §3):
// a retry after the job was edited goes to the new URL, signed with the new
// secret, on the new timeout.
func TestRetryUsesTheSettingsOfItsStart(t *testing.T) {
	e := newEnv(t)
	j := e.job(t, "job_a", "https://a.example/old")
	j.Timeout = 7 * time.Second
	e.update(t, func(tx vibejobs.Tx) error { return tx.UpdateJob(context.Background(), j) })
	e.sender.answer[j.URL] = []egress.Result{{StatusCode: 503, ErrorCode: egress.CodeHTTP5xx}}
	r := e.run(t, j, "run_a", e.clock.Now())
	e.start(t, 8)

	e.wantSettings(t, "first attempt", e.sender.next(t), "https://a.example/old", 7*time.Second, oldSecret)
	e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunRetrying })
	e.edit(t, j, "https://b.example/new")
	e.clock.Add(30 * time.Second)
	x := e.sender.next(t)
	if x.payload["attempt"] != 2.0 {
		t.Fatalf("sent attempt %v, want the retry", x.payload["attempt"])
	}
	e.wantSettings(t, "retry after the edit", x, "https://b.example/new", 3*time.Second, newSecret)
}

// TestJobChangeWithdrawsAClaimWaitingForItsHost: a claim waiting for a slot
// of its host (Config.PerHost) has not started its attempt: when its job is
// edited meanwhile, it goes back and is sent with the job's new URL, secret
// and timeout. The claim of another job waiting for the same host stays.
func TestJobChangeWithdrawsAClaimWaitingForItsHost(t *testing.T) {
	e := newEnv(t)
	blocker := e.job(t, "job_blocker", "https://a.example/blocker")
	edited := e.job(t, "job_edited", "https://a.example/edited")
	other := e.job(t, "job_other", "https://a.example/other")
	e.blockHost(blocker.URL)
	e.run(t, blocker, "run_blocker", e.clock.Now())
	d, rc, _, _ := e.startWith(t, 1, 0)
	if x := e.sender.next(t); x.url != blocker.URL {
		t.Fatalf("first sent to %s", x.url)
	}
	r := e.run(t, edited, "run_edited", e.clock.Now())
	kept := e.run(t, other, "run_other", e.clock.Now())
	d.Wake()
	for _, id := range []string{r.ID, kept.ID} {
		e.waitRun(t, id, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunDelivering })
	}

	e.edit(t, edited, "https://b.example/edited")
	d.JobChanged(edited.ID)
	x := e.sender.next(t)
	if x.payload["runId"] != r.ID || x.payload["attempt"] != 1.0 {
		t.Fatalf("sent %v attempt %v, want the edited job's run, attempt 1", x.payload["runId"], x.payload["attempt"])
	}
	e.wantSettings(t, "the claim that waited for its host", x, "https://b.example/edited", 3*time.Second, newSecret)
	e.waitRun(t, r.ID, func(r *vibejobs.Run) bool { return r.State == vibejobs.RunSucceeded })
	if n := rc.released.Load(); n != 1 {
		t.Fatalf("%d claims released, want the edited job's only", n)
	}
	e.wantNothingSent(t, "while the host was still full")
	got, err := e.store.GetRun(context.Background(), e.project, kept.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != vibejobs.RunDelivering {
		t.Fatalf("the other job's claim, waiting for the host: run %s, want still delivering", got.State)
	}
}
