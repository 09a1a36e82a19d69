package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/egress"
	"github.com/vibejobs/vibejobs/internal/postgres"
	"github.com/vibejobs/vibejobs/internal/secretbox"
)

// tenantEnv is the API on any Store, answered in process (no listener), for
// the cross-project audit that both stores must pass.
type tenantEnv struct {
	t     *testing.T
	st    vibejobs.Store
	keys  *secretbox.Keyring
	clock *clock
	h     http.Handler
	admin string // the installation administrator token (project "default")
}

func newTenantEnv(t *testing.T, st vibejobs.Store) *tenantEnv {
	t.Helper()
	e := &tenantEnv{t: t, st: st, keys: mustKeyring(t), clock: &clock{t: t0}}
	tok, created, err := api.Bootstrap(context.Background(), st, e.clock.Now(), nil)
	if err != nil || !created {
		t.Fatalf("Bootstrap: %v, created %v", err, created)
	}
	e.admin = tok
	policy, err := egress.NewPolicy(nil)
	if err != nil {
		t.Fatal(err)
	}
	e.h = api.New(api.Config{Store: st, Sealer: e.keys, URLs: policy, Now: e.clock.Now,
		Logger: slog.New(slog.DiscardHandler), RateLimit: api.RateLimit{PerSecond: -1}}).Handler()
	return e
}

// send answers one request; key "" sends no Idempotency-Key.
func (e *tenantEnv) send(method, path, token, key string, body any) *result {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	r := httptest.NewRequest(method, path, rd)
	r.Header.Set("Authorization", "Bearer "+token)
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	if rd != nil {
		r.Header.Set("Content-Type", "application/json")
	}
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	return &result{status: w.Code, header: w.Header(), body: w.Body.Bytes()}
}

// must sends with a fresh key on a POST and fails the test on another status.
func (e *tenantEnv) must(want int, method, path, token string, body any) map[string]any {
	e.t.Helper()
	key := ""
	if method == http.MethodPost {
		key = newKey()
	}
	res := e.send(method, path, token, key, body)
	if res.status != want {
		e.t.Fatalf("%s %s: %s, want %d", method, path, res, want)
	}
	if len(res.body) == 0 {
		return nil
	}
	return res.json(e.t)
}

func (e *tenantEnv) newProject(name string) (string, map[vibejobs.Role]string) {
	e.t.Helper()
	id := e.must(201, "POST", "/v1/projects", e.admin, map[string]any{"name": name})["id"].(string)
	toks := map[vibejobs.Role]string{}
	for _, role := range []vibejobs.Role{vibejobs.RoleAdmin, vibejobs.RoleWrite, vibejobs.RoleRead} {
		toks[role] = e.must(201, "POST", "/v1/projects/"+id+"/tokens", e.admin,
			map[string]any{"name": name + "-" + string(role), "role": role})["token"].(string)
	}
	return id, toks
}

// deliverAll claims every due run and records one attempt answered 200
// with snippet.
func (e *tenantEnv) deliverAll(snippet string) {
	e.t.Helper()
	ctx, now := context.Background(), e.clock.Now()
	claims, err := e.st.ClaimDueRuns(ctx, "test", now, 100, time.Second)
	if err != nil {
		e.t.Fatal(err)
	}
	var outs []vibejobs.Outcome
	for _, c := range claims {
		a := vibejobs.Attempt{Number: c.Run.Attempt, StartedAt: now, FinishedAt: now.Add(50 * time.Millisecond),
			StatusCode: 200, SignatureTimestamp: now.Unix(), ResponseSnippet: snippet}
		outs = append(outs, vibejobs.Outcome{RunID: c.Run.ID, ClaimedAt: c.ClaimedAt, Attempt: a,
			Step: vibejobs.NextStep(c.Retry, c.Run.Attempt, vibejobs.AttemptResult{StatusCode: 200}, c.Run.DeadlineAt, a.FinishedAt, 0.5)})
	}
	if err := e.st.RecordOutcomes(ctx, "test", outs); err != nil {
		e.t.Fatal(err)
	}
}

func TestCrossProjectAudit(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) vibejobs.Store{
		"sqlite": func(t *testing.T) vibejobs.Store { st, _ := mustOpenStore(t); return st },
		"postgres": func(t *testing.T) vibejobs.Store {
			return postgres.MustOpenTestWith(t, postgres.Options{Logger: slog.New(slog.DiscardHandler)})
		},
	} {
		t.Run(name, func(t *testing.T) { crossProjectAudit(t, newTenantEnv(t, open(t))) })
	}
}

// crossProjectAudit: project B's tokens, of every role, try every route of
// the API on project A's things. Each answer is exactly the answer for an id
// that does not exist (404, or 403 when the role forbids the route anyway);
// lists, filters and cursors minted in A show B's things only; an
// Idempotency-Key A used is new to B, whatever the request; no answer to B
// holds anything of A; and A's things are as they were.
func crossProjectAudit(t *testing.T, e *tenantEnv) {
	ctx := context.Background()

	// Project A: two jobs, runs with attempts, a subscription, events.
	aID, a := e.newProject("alpha-project")
	aJob := e.must(201, "POST", "/v1/jobs", a[vibejobs.RoleAdmin], jobBody(map[string]any{
		"name": "alpha-job-one", "url": "https://alpha-target.example.test/hook"}))
	aJobID, aSecret := aJob["id"].(string), aJob["secret"].(string)
	aJob2ID := e.must(201, "POST", "/v1/jobs", a[vibejobs.RoleWrite], jobBody(map[string]any{
		"name": "alpha-job-two", "url": "https://alpha-target.example.test/two"}))["id"].(string)
	aRunID := e.must(202, "POST", "/v1/jobs/"+aJobID+"/runs", a[vibejobs.RoleWrite], nil)["id"].(string)
	e.clock.Advance(time.Second)
	e.must(202, "POST", "/v1/jobs/"+aJobID+"/runs", a[vibejobs.RoleWrite], nil)
	e.deliverAll("alpha-snippet")
	aSub := e.must(201, "POST", "/v1/subscriptions", a[vibejobs.RoleAdmin], map[string]any{
		"url": "https://alpha-hooks.example.test/feed", "jobIds": []string{aJobID}})
	aSubID, aSubSecret := aSub["id"].(string), aSub["secret"].(string)
	aTokens := e.must(200, "GET", "/v1/projects/"+aID+"/tokens", a[vibejobs.RoleAdmin], nil)["tokens"].([]any)
	aTokenID := aTokens[0].(map[string]any)["id"].(string)
	// Cursors minted in A.
	aJobsCursor := e.must(200, "GET", "/v1/jobs?limit=1", a[vibejobs.RoleRead], nil)["nextCursor"].(string)
	aRunsCursor := e.must(200, "GET", "/v1/runs?limit=1", a[vibejobs.RoleRead], nil)["nextCursor"].(string)
	aJobRunsCursor := e.must(200, "GET", "/v1/jobs/"+aJobID+"/runs?limit=1", a[vibejobs.RoleRead], nil)["nextCursor"].(string)
	aFeed := e.must(200, "GET", "/v1/events", a[vibejobs.RoleRead], nil)
	if len(aFeed["items"].([]any)) == 0 {
		t.Fatalf("project A's feed is empty: %v", aFeed)
	}
	aHead := int64(aFeed["head"].(float64))
	// The installation token, of project "default".
	var bootstrapTokenID string
	for _, x := range e.must(200, "GET", "/v1/projects/"+api.BootstrapProjectID+"/tokens", e.admin, nil)["tokens"].([]any) {
		if m := x.(map[string]any); m["installation"] == true {
			bootstrapTokenID = m["id"].(string)
		}
	}

	// Project B, with a job and a subscription of its own.
	bID, b := e.newProject("beta-project")
	bJobID := e.must(201, "POST", "/v1/jobs", b[vibejobs.RoleAdmin], jobBody(map[string]any{"name": "beta-job"}))["id"].(string)
	e.must(202, "POST", "/v1/jobs/"+bJobID+"/runs", b[vibejobs.RoleWrite], nil)
	bSubID := e.must(201, "POST", "/v1/subscriptions", b[vibejobs.RoleAdmin], map[string]any{"url": "https://beta-hooks.example.test/feed"})["id"].(string)

	forbidden := []string{aID, "alpha-", aJobID, aJob2ID, aRunID, aSubID, aSecret, aSubSecret, aTokenID, bootstrapTokenID}
	for _, tk := range aTokens {
		forbidden = append(forbidden, tk.(map[string]any)["id"].(string), tk.(map[string]any)["prefix"].(string))
	}
	var toB []*result // every answer to project B, scanned at the end
	sendB := func(method, path, token, key string, body any) *result {
		t.Helper()
		res := e.send(method, path, token, key, body)
		toB = append(toB, res)
		return res
	}

	type role int
	const (
		read role = iota
		write
		admin
		installation
	)
	patchJob := map[string]any{"name": "hijacked", "url": "https://evil.example.test/x"}
	patchSub := map[string]any{"url": "https://evil.example.test/feed", "types": []string{"run.failed"}}
	newToken := map[string]any{"name": "backdoor", "role": "admin"}
	cases := []struct {
		method, path, missing string
		body                  any
		needs                 role
		want                  int // as B's admin (when the role allows)
	}{
		{"GET", "/v1/jobs/" + aJobID, "/v1/jobs/job_missing", nil, read, 404},
		{"PATCH", "/v1/jobs/" + aJobID, "/v1/jobs/job_missing", patchJob, write, 404},
		{"PATCH", "/v1/jobs/" + aJobID, "/v1/jobs/job_missing", `{"enabled":true}`, write, 404},
		{"DELETE", "/v1/jobs/" + aJob2ID, "/v1/jobs/job_missing", nil, write, 404},
		{"POST", "/v1/jobs/" + aJobID + "/pause", "/v1/jobs/job_missing/pause", nil, write, 404},
		{"POST", "/v1/jobs/" + aJobID + "/resume", "/v1/jobs/job_missing/resume", nil, write, 404},
		{"POST", "/v1/jobs/" + aJobID + "/rotate-secret", "/v1/jobs/job_missing/rotate-secret", nil, write, 404},
		{"POST", "/v1/jobs/" + aJobID + "/runs", "/v1/jobs/job_missing/runs", nil, write, 404},
		{"GET", "/v1/jobs/" + aJobID + "/runs", "/v1/jobs/job_missing/runs", nil, read, 404},
		{"GET", "/v1/jobs/" + aJobID + "/runs?state=succeeded&limit=1", "/v1/jobs/job_missing/runs?state=succeeded&limit=1", nil, read, 404},
		{"GET", "/v1/jobs/" + aJobID + "/runs?cursor=" + aJobRunsCursor, "/v1/jobs/job_missing/runs?cursor=" + aJobRunsCursor, nil, read, 404},
		{"GET", "/v1/jobs/" + aJobID + "/next", "/v1/jobs/job_missing/next", nil, read, 404},
		{"GET", "/v1/jobs/" + aJobID + "/next?count=3", "/v1/jobs/job_missing/next?count=3", nil, read, 404},
		{"GET", "/v1/runs/" + aRunID, "/v1/runs/run_missing", nil, read, 404},
		{"GET", "/v1/runs?jobId=" + aJobID, "/v1/runs?jobId=job_missing", nil, read, 404},
		{"GET", "/v1/runs?jobId=" + aJobID + "&state=succeeded", "/v1/runs?jobId=job_missing&state=succeeded", nil, read, 404},
		{"GET", "/v1/events?jobId=" + aJobID, "/v1/events?jobId=job_missing", nil, read, 200},
		{"GET", "/v1/subscriptions/" + aSubID, "/v1/subscriptions/sub_missing", nil, read, 404},
		{"PATCH", "/v1/subscriptions/" + aSubID, "/v1/subscriptions/sub_missing", patchSub, write, 404},
		{"POST", "/v1/subscriptions/" + aSubID + "/rotate-secret", "/v1/subscriptions/sub_missing/rotate-secret", nil, write, 404},
		{"POST", "/v1/subscriptions/" + aSubID + "/reset", "/v1/subscriptions/sub_missing/reset", nil, write, 404},
		{"DELETE", "/v1/subscriptions/" + aSubID, "/v1/subscriptions/sub_missing", nil, write, 404},
		{"GET", "/v1/projects/" + aID, "/v1/projects/prj_missing", nil, admin, 404},
		{"GET", "/v1/projects/" + api.BootstrapProjectID, "/v1/projects/prj_missing", nil, admin, 404},
		{"GET", "/v1/projects/" + aID + "/tokens", "/v1/projects/prj_missing/tokens", nil, admin, 404},
		{"POST", "/v1/projects/" + aID + "/tokens", "/v1/projects/prj_missing/tokens", newToken, admin, 404},
		{"POST", "/v1/projects/" + aID + "/tokens", "/v1/projects/prj_missing/tokens", map[string]any{"name": "x", "role": "admin", "installation": true}, admin, 404},
		{"DELETE", "/v1/tokens/" + aTokenID, "/v1/tokens/tok_missing", nil, admin, 404},
		{"DELETE", "/v1/tokens/" + bootstrapTokenID, "/v1/tokens/tok_missing", nil, admin, 404},
		{"GET", "/v1/projects", "", nil, installation, 0},
		{"POST", "/v1/projects", "", map[string]any{"name": "x"}, installation, 0},
	}
	for _, r := range []vibejobs.Role{vibejobs.RoleAdmin, vibejobs.RoleWrite, vibejobs.RoleRead} {
		has := map[vibejobs.Role]role{vibejobs.RoleRead: read, vibejobs.RoleWrite: write, vibejobs.RoleAdmin: admin}[r]
		for _, c := range cases {
			key := ""
			if c.method == "POST" {
				key = newKey()
			}
			theirs := sendB(c.method, c.path, b[r], key, c.body)
			want := c.want
			if c.needs > has {
				want = 403
			}
			if theirs.status != want {
				t.Errorf("%s %s as B's %s token: %s, want %d", c.method, c.path, r, theirs, want)
				continue
			}
			if c.missing == "" {
				continue
			}
			if key != "" {
				key = newKey()
			}
			missing := sendB(c.method, c.missing, b[r], key, c.body)
			if missing.status != theirs.status || !bytes.Equal(missing.body, theirs.body) {
				t.Errorf("%s %s as B's %s token: %s, but a missing id gives %s", c.method, c.path, r, theirs, missing)
			}
		}
	}

	// Lists show B's things only; cursors minted in A are refused.
	bRead := b[vibejobs.RoleRead]
	for _, p := range []string{
		"/v1/jobs", "/v1/runs", "/v1/runs?state=succeeded", "/v1/jobs/" + bJobID + "/runs",
		"/v1/subscriptions", "/v1/subscriptions/" + bSubID,
		"/v1/events", "/v1/events?after=0&limit=100", "/v1/events?type=run.succeeded",
	} {
		if res := sendB("GET", p, bRead, "", nil); res.status != 200 {
			t.Errorf("GET %s as B: %s", p, res)
		}
	}
	for _, p := range []string{
		"/v1/jobs?cursor=" + aJobsCursor, "/v1/jobs?cursor=" + aJobRunsCursor,
		"/v1/runs?cursor=" + aRunsCursor, "/v1/runs?cursor=" + aJobsCursor,
		"/v1/jobs/" + bJobID + "/runs?cursor=" + aJobRunsCursor,
	} {
		if res := sendB("GET", p, bRead, "", nil); res.status != 400 {
			t.Errorf("GET %s as B: %s, want 400", p, res)
		} else if code, _ := res.errorCode(t); code != "invalid_cursor" {
			t.Errorf("GET %s as B: %s, want invalid_cursor", p, res)
		}
	}
	sendB("GET", "/v1/projects/"+bID+"/tokens", b[vibejobs.RoleAdmin], "", nil)
	sendB("GET", "/v1/projects/"+bID, b[vibejobs.RoleAdmin], "", nil)
	// A's feed position means nothing in B's feed: answered from B's feed,
	// or refused as beyond B's head.
	after := sendB("GET", "/v1/events?after="+strconv.FormatInt(aHead, 10), bRead, "", nil)
	if after.status != 200 && after.status != 400 {
		t.Errorf("GET /v1/events?after=<A's head> as B: %s", after)
	}

	// Batch creation puts every job in B.
	batch := sendB("POST", "/v1/jobs/batch", b[vibejobs.RoleWrite], newKey(), map[string]any{"jobs": []any{
		jobBody(map[string]any{"name": "beta-batch-1"}), jobBody(map[string]any{"name": "beta-batch-2"})}})
	if batch.status != 201 {
		t.Fatalf("batch as B: %s", batch)
	}
	for _, j := range batch.json(t)["jobs"].([]any) {
		id := j.(map[string]any)["id"].(string)
		if _, err := e.st.GetJob(ctx, bID, id); err != nil {
			t.Errorf("batch job %s is not B's: %v", id, err)
		}
	}

	// Idempotency-Keys are per project. Every POST A sent under a key,
	// B sends with the same key, path and body: B gets its own answer,
	// never A's stored one (which holds secrets and tokens). A key A used
	// for another request is no conflict in B either: that would tell B the
	// key is in use elsewhere.
	shared := []struct {
		path    string
		body    any
		aStatus int
		bStatus int
		aToken  vibejobs.Role
	}{
		{"/v1/jobs", jobBody(map[string]any{"name": "shared-idem"}), 201, 201, vibejobs.RoleWrite},
		{"/v1/jobs/batch", map[string]any{"jobs": []any{jobBody(map[string]any{"name": "shared-idem-batch"})}}, 201, 201, vibejobs.RoleWrite},
		{"/v1/subscriptions", map[string]any{"url": "https://shared-hooks.example.test/idem"}, 201, 201, vibejobs.RoleWrite},
		{"/v1/jobs/" + aJobID + "/pause", nil, 200, 404, vibejobs.RoleWrite},
		{"/v1/jobs/" + aJobID + "/resume", nil, 200, 404, vibejobs.RoleWrite},
		{"/v1/jobs/" + aJobID + "/runs", nil, 202, 404, vibejobs.RoleWrite},
		{"/v1/subscriptions/" + aSubID + "/reset", nil, 200, 404, vibejobs.RoleWrite},
		{"/v1/projects/" + aID + "/tokens", map[string]any{"name": "shared-idem-token", "role": "read"}, 201, 404, vibejobs.RoleAdmin},
		// Last: they change A's secrets, checked below.
		{"/v1/jobs/" + aJob2ID + "/rotate-secret", nil, 200, 404, vibejobs.RoleWrite},
	}
	for i, s := range shared {
		key := "shared-key-" + strconv.Itoa(i)
		first := e.send("POST", s.path, a[s.aToken], key, s.body)
		if first.status != s.aStatus {
			t.Fatalf("POST %s as A: %s, want %d", s.path, first, s.aStatus)
		}
		bToken := b[vibejobs.RoleAdmin]
		again := sendB("POST", s.path, bToken, key, s.body)
		if again.status != s.bStatus || again.header.Get("Idempotent-Replayed") != "" || bytes.Equal(again.body, first.body) {
			t.Errorf("POST %s as B with A's key: %s (replayed %q), want a fresh %d", s.path, again, again.header.Get("Idempotent-Replayed"), s.bStatus)
		}
		// A key A used for another request.
		probe := "probe-key-" + strconv.Itoa(i)
		if res := e.send("POST", "/v1/jobs/job_missing/pause", a[vibejobs.RoleWrite], probe, nil); res.status != 404 {
			t.Fatalf("probe as A: %s", res)
		}
		other := sendB("POST", s.path, bToken, probe, s.body)
		if other.status != s.bStatus || other.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("POST %s as B under a key A used for another request: %s, want a fresh %d", s.path, other, s.bStatus)
		}
	}

	for _, res := range toB {
		for _, f := range forbidden {
			if f != "" && bytes.Contains(res.body, []byte(f)) {
				t.Errorf("an answer to project B holds %q of project A: %s", f, res)
			}
		}
	}

	// A's things are as they were.
	j, err := e.st.GetJob(ctx, aID, aJobID)
	if err != nil || j.Name != "alpha-job-one" || j.URL != "https://alpha-target.example.test/hook" || !j.Enabled {
		t.Errorf("A's job after B's attempts: %+v, %v", j, err)
	} else if got, _ := e.keys.Open(j.Secret, aJobID); got != aSecret {
		t.Error("A's job secret was rotated by B")
	}
	if _, err := e.st.GetJob(ctx, aID, aJob2ID); err != nil {
		t.Errorf("A's second job after B's attempts: %v", err)
	}
	sub, err := e.st.GetSubscription(ctx, aID, aSubID)
	if err != nil || sub.URL != "https://alpha-hooks.example.test/feed" || len(sub.Types) != 0 || sub.PreviousExpiresAt != nil {
		t.Errorf("A's subscription after B's attempts: %+v, %v", sub, err)
	} else if got, _ := e.keys.Open(sub.Secret, aSubID); got != aSubSecret {
		t.Error("A's subscription secret was rotated by B")
	}
	for _, id := range []string{aTokenID, bootstrapTokenID} {
		if tk, err := e.st.GetToken(ctx, id); err != nil || tk.RevokedAt != nil {
			t.Errorf("token %s after B's attempts: %+v, %v", id, tk, err)
		}
	}
	aToks, _, err := e.st.ListTokens(ctx, aID, vibejobs.Page{})
	if err != nil || len(aToks) != 4 { // three, and the one A minted under a shared key
		t.Errorf("A's tokens after B's attempts: %d, %v", len(aToks), err)
	}
	// Two manual runs, and one under a shared key; none from B.
	if runs, _, err := e.st.ListRuns(ctx, aID, vibejobs.RunFilter{JobID: aJobID}, vibejobs.Page{}); err != nil || len(runs) != 3 {
		t.Errorf("A's runs after B's attempts: %d, %v", len(runs), err)
	}
}
