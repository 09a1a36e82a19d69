package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/postgres"
	"github.com/vibejobs/vibejobs/internal/secretbox"
	"github.com/vibejobs/vibejobs/internal/sqlite"
)

// TestMasterKeyRotationKeepsDeliveriesValid rotates the master key while the
// server runs: every secret is re-sealed under the new key, the server picks
// the key up from the file, and deliveries still carry valid signatures.
func TestMasterKeyRotationKeepsDeliveriesValid(t *testing.T) {
	rc := newReceiver(t, nil)
	dataDir := t.TempDir()
	_, api := startMain(t, dataDir)
	code, job := api.do("POST", "/v1/jobs", map[string]any{"name": "k", "schedule": "0 0 1 1 *", "url": rc.URL})
	if code != 201 {
		t.Fatalf("create: %d %v", code, job)
	}
	secret, id := job["secret"].(string), job["id"].(string)
	oldKeys, err := os.ReadFile(filepath.Join(dataDir, "master.key"))
	if err != nil {
		t.Fatal(err)
	}

	if out := rotateMasterKey(t, map[string]string{"VIBEJOBS_DATA_DIR": dataDir}); !strings.Contains(out, "1 secrets and 1 stored Idempotency-Key answers re-sealed") {
		t.Fatalf("rotate said %q", out)
	}
	newKeys, _ := os.ReadFile(filepath.Join(dataDir, "master.key"))
	kr, err := secretbox.Parse(newKeys)
	if err != nil || len(kr.IDs()) != 2 || !bytes.HasSuffix(newKeys, oldKeys) {
		t.Fatalf("key file after rotation: %v %v", kr.IDs(), err)
	}

	// A secret the running server seals right after the rotation is under
	// the new key: the older keys may go at once, as rotate says.
	if code, job := api.do("POST", "/v1/jobs", map[string]any{"name": "after", "schedule": "0 0 1 1 *", "url": rc.URL}); code != 201 {
		t.Fatalf("create after the rotation: %d %v", code, job)
	}

	// The running server opens the re-sealed secret and signs correctly.
	if code, _ := api.do("POST", "/v1/jobs/"+id+"/runs", nil); code != 202 {
		t.Fatalf("trigger: %d", code)
	}
	checkDelivery(t, rc.next(t, 10e9), secret, id)

	// With only the new key, the old one dropped, the server still starts:
	// it opens the stored secrets, both jobs' included.
	dropOlderKeys(t, dataDir)
	m := NewMain(io.Discard, io.Discard)
	m.Config = Config{Listen: "127.0.0.1:0", DataDir: dataDir, LogFormat: "text", LogLevel: "error",
		Concurrency: 8, PerHost: 8, RetentionDays: 90, MaxJobsPerProject: 10}
	if err := m.Run(context.Background()); err != nil {
		t.Fatalf("start with the rotated key only: %v", err)
	}
	m.Close()
}

// TestWrongMasterKeyStopsTheStart: a server given another master key than
// the one that sealed the stored secrets refuses to start, instead of sending
// deliveries with bad signatures.
func TestWrongMasterKeyStopsTheStart(t *testing.T) {
	dataDir := t.TempDir()
	m, api := startMain(t, dataDir)
	if code, job := api.do("POST", "/v1/jobs", map[string]any{"name": "k", "schedule": "@daily", "url": "http://127.0.0.1:9/"}); code != 201 {
		t.Fatalf("create: %d %v", code, job)
	}
	m.Close()
	other, _ := secretbox.NewKey()
	if err := os.WriteFile(filepath.Join(dataDir, "master.key"), []byte(other+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	m2 := NewMain(&errb, &errb)
	m2.Config = Config{Listen: "127.0.0.1:0", DataDir: dataDir, LogFormat: "text", LogLevel: "error",
		Concurrency: 8, PerHost: 8, RetentionDays: 90, MaxJobsPerProject: 10}
	err := m2.Run(context.Background())
	m2.Close()
	if err == nil || !strings.Contains(err.Error(), "master key") {
		t.Fatalf("started with a wrong master key: %v", err)
	}
}

// TestServersOfOneDatabaseShareTheMasterKey: a server whose key file lacks
// the master key of its database refuses to start, though no secret is
// stored yet to show the mismatch: with two key files, each server would
// seal secrets the other cannot open. After a rotation, that key is the new
// one.
func TestServersOfOneDatabaseShareTheMasterKey(t *testing.T) {
	for _, store := range []string{"sqlite", "postgres"} {
		t.Run(store, func(t *testing.T) {
			database := filepath.Join(t.TempDir(), "shared.db")
			if store == "postgres" {
				database, _ = pgReplicaURL(t, "")
			}
			dirA, dirB := t.TempDir(), t.TempDir()
			start := func(dataDir string) error {
				m := NewMain(io.Discard, io.Discard)
				m.Config = Config{Listen: "127.0.0.1:0", DataDir: dataDir, Database: database, LogFormat: "text",
					LogLevel: "error", Concurrency: 8, PerHost: 8, RetentionDays: 90, MaxJobsPerProject: 10}
				err := m.Run(context.Background())
				m.Close()
				return err
			}
			if err := start(dirA); err != nil {
				t.Fatalf("first server: %v", err)
			}
			keyA, _ := os.ReadFile(filepath.Join(dirA, "master.key"))
			ringA, err := secretbox.Parse(keyA)
			if err != nil {
				t.Fatal(err)
			}
			err = start(dirB)
			if err == nil || !strings.Contains(err.Error(), ringA.CurrentID()) {
				t.Fatalf("a server with its own new key file started on the database of another: %v", err)
			}
			// The key file that start created (at what could be a mistyped
			// path) is gone again.
			if _, err := os.Stat(filepath.Join(dirB, "master.key")); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("the refused start left its new key file: %v", err)
			}

			rotateMasterKey(t, map[string]string{"VIBEJOBS_DATA_DIR": dirA, "VIBEJOBS_DATABASE": database})
			if err := os.WriteFile(filepath.Join(dirB, "master.key"), keyA, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := start(dirB); err == nil || !strings.Contains(err.Error(), "master key") {
				t.Fatalf("a server with only the key rotated away started: %v", err)
			}
			rotated, _ := os.ReadFile(filepath.Join(dirA, "master.key"))
			if err := os.WriteFile(filepath.Join(dirB, "master.key"), rotated, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := start(dirB); err != nil {
				t.Fatalf("a server with the rotated key file: %v", err)
			}
		})
	}
}

// TestSecretsNeverAtRestOrInLogs scans the database files and the server's
// log for the secrets and tokens the server handed out.
func TestSecretsNeverAtRestOrInLogs(t *testing.T) {
	rc := newReceiver(t, nil)
	dataDir := t.TempDir()
	var logs bytes.Buffer
	m := NewMain(&bytes.Buffer{}, &logs)
	m.Config = Config{Listen: "127.0.0.1:0", DataDir: dataDir, AllowPrivate: "127.0.0.0/8", LogFormat: "json",
		LogLevel: "debug", Concurrency: 8, PerHost: 8, RetentionDays: 90, MaxJobsPerProject: 100}
	if err := m.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	api := apiClient{t: t, base: "http://" + m.Addr(), token: m.AdminToken}
	var secrets []string
	for i := 0; i < 5; i++ {
		code, job := api.do("POST", "/v1/jobs", map[string]any{"name": "s", "schedule": "0 0 1 1 *", "url": rc.URL + "/p?q=1"})
		if code != 201 {
			t.Fatalf("create: %d %v", code, job)
		}
		secrets = append(secrets, job["secret"].(string))
		api.do("POST", "/v1/jobs/"+job["id"].(string)+"/runs", nil)
		rc.next(t, 10e9)
		_, rot := api.do("POST", "/v1/jobs/"+job["id"].(string)+"/rotate-secret", nil)
		secrets = append(secrets, rot["secret"].(string))
	}
	m.Close()
	needles := append(secrets, m.AdminToken, strings.TrimPrefix(rc.URL, "http://"))
	files, _ := filepath.Glob(filepath.Join(dataDir, "vibejobs.db*"))
	if len(files) == 0 {
		t.Fatal("no database files found")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range needles[:len(secrets)+1] {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s holds a secret or token in clear", filepath.Base(f))
			}
		}
	}
	for _, s := range needles {
		if strings.Contains(logs.String(), s) {
			t.Errorf("the log carries %q", s[:8])
		}
	}
	if !strings.Contains(logs.String(), "server.started") {
		t.Fatal("no log captured: the scan proved nothing")
	}
}

// TestReplayAfterMasterKeyRotation: an Idempotency-Key's stored answer is
// sealed under the master key, and "master-key rotate" re-seals it with the
// secrets: once rotate ends and the older keys leave the file, as it says
// they may, a retry with the key still gets the stored answer (it got a
// 500 until the key expired).
func TestReplayAfterMasterKeyRotation(t *testing.T) {
	dataDir := t.TempDir()
	m, api := startMain(t, dataDir)
	body := `{"name":"k","schedule":"0 0 1 1 *","url":"http://127.0.0.1:9/"}`
	post := func(api apiClient) (int, string) {
		req, _ := http.NewRequest("POST", api.base+"/v1/jobs", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+api.token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "create-job-before-rotation")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, first := post(api)
	if code != 201 {
		t.Fatalf("create: %d %s", code, first)
	}
	m.Close()

	rotateMasterKey(t, map[string]string{"VIBEJOBS_DATA_DIR": dataDir})
	dropOlderKeys(t, dataDir)
	_, api = startMain(t, dataDir)

	code, replay := post(api)
	if code != 201 || replay != first {
		t.Fatalf("retry with the same Idempotency-Key after the rotation: %d %s\nwant the stored answer 201 %s", code, replay, first)
	}
}

// rotateMasterKey runs "vibejobs master-key rotate" with env as its
// environment and returns what it printed.
func rotateMasterKey(t *testing.T, env map[string]string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"master-key", "rotate"}, func(k string) string { return env[k] }, &out, &errb); code != 0 {
		t.Fatalf("rotate: %d %s %s", code, out.String(), errb.String())
	}
	return out.String()
}

// dropOlderKeys leaves only the current (first) key in dataDir's key
// file, as rotate says one may once it ended.
func dropOlderKeys(t *testing.T, dataDir string) {
	t.Helper()
	path := filepath.Join(dataDir, "master.key")
	keys, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	first := bytes.SplitN(keys, []byte("\n"), 2)[0]
	if err := os.WriteFile(path, append(first, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRotationSkipsExpiredAnswers: a stored Idempotency-Key answer that
// expired is never replayed again and is pruned soon; one an older rotation
// left sealed under a key since removed from the file must not stop this
// rotation (it failed on it, and never recorded the new key).
func TestRotationSkipsExpiredAnswers(t *testing.T) {
	dataDir := t.TempDir()
	m, _ := startMain(t, dataDir)
	m.Close()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dataDir, "vibejobs.db"), sqlite.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ps, _, err := st.ListProjects(ctx, vibejobs.Page{})
	if err != nil || len(ps) != 1 {
		t.Fatalf("projects: %v %v", ps, err)
	}
	created := time.Now().Add(-48 * time.Hour)
	rec := &vibejobs.IdempotencyRecord{ProjectID: ps[0].ID, Key: "old", RequestHash: []byte{1}, CreatedAt: created,
		ExpiresAt: created.Add(24 * time.Hour)}
	if err := st.Update(ctx, func(tx vibejobs.Tx) error {
		if err := tx.InsertIdempotencyKey(ctx, rec); err != nil {
			return err
		}
		rec.ResponseStatus, rec.ResponseBody = 201, []byte("sealed under a key long gone")
		rec.ResponseHeaders = map[string]string{"Vibejobs-Sealed-Key": "0123456789abcdef"}
		return tx.CompleteIdempotencyKey(ctx, rec)
	}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	if out := rotateMasterKey(t, map[string]string{"VIBEJOBS_DATA_DIR": dataDir}); !strings.Contains(out, "master key rotated") {
		t.Fatalf("rotate said %q", out)
	}
}

// TestRotationDropsPreviousSubscriptionSecretsItCannotUse: "master-key
// rotate" re-seals a subscription's previous secret only while its grace
// window lasts; one whose window ended is dropped, opened or not. One still
// in its window that does not open (sealed under a key the file lost: rows
// rotated before the API dropped such secrets hold one) is dropped too,
// named by its subscription's id, and does not stop the re-sealing of the
// others (the command failed on it, and never recorded the new key).
func TestRotationDropsPreviousSubscriptionSecretsItCannotUse(t *testing.T) {
	dataDir := t.TempDir()
	m, _ := startMain(t, dataDir)
	m.Close()
	ctx := context.Background()
	fileKeys, lostKeys := fileAndLostKeys(t, dataDir)
	st, err := sqlite.Open(ctx, filepath.Join(dataDir, "vibejobs.db"), sqlite.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	expired, inWindow := now.Add(-time.Hour), now.Add(23*time.Hour)
	type sub struct {
		id                string
		prevKeys          *secretbox.Keyring // nil: no previous secret
		prevUntil         time.Time
		current, previous string
		wantPrevious      bool // re-sealed under the new key
	}
	subs := []*sub{
		{id: "sub_expired_opens", prevKeys: fileKeys, prevUntil: expired},
		{id: "sub_expired_lost", prevKeys: lostKeys, prevUntil: expired},
		{id: "sub_window_opens", prevKeys: fileKeys, prevUntil: inWindow, wantPrevious: true},
		{id: "sub_window_lost", prevKeys: lostKeys, prevUntil: inWindow},
		{id: "sub_no_previous"},
	}
	if err := st.Update(ctx, func(tx vibejobs.Tx) error {
		for _, s := range subs {
			s.current, _ = contract.NewSecret(nil)
			row := &vibejobs.Subscription{ID: s.id, ProjectID: api.BootstrapProjectID, URL: "http://127.0.0.1:9/",
				CreatedAt: now, UpdatedAt: now}
			if row.Secret, err = fileKeys.Seal(s.current, s.id); err != nil {
				return err
			}
			if s.prevKeys != nil {
				s.previous, _ = contract.NewSecret(nil)
				if row.PreviousSecret, err = s.prevKeys.Seal(s.previous, s.id); err != nil {
					return err
				}
				row.PreviousExpiresAt = &s.prevUntil
			}
			if err := tx.CreateSubscription(ctx, row, vibejobs.MaxSubscriptionsPerProject); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	st.Close()

	var out, errb bytes.Buffer
	env := map[string]string{"VIBEJOBS_DATA_DIR": dataDir}
	if code := run(ctx, []string{"master-key", "rotate"}, func(k string) string { return env[k] }, &out, &errb); code != 0 {
		t.Fatalf("rotate: %d %s %s", code, out.String(), errb.String())
	}
	if !strings.Contains(errb.String(), "sub_window_lost") {
		t.Errorf("rotate did not name the subscription whose previous secret it dropped: %q", errb.String())
	}
	for _, s := range subs {
		if s.previous != "" && strings.Contains(out.String()+errb.String(), s.previous) {
			t.Errorf("rotate printed the previous secret of %s", s.id)
		}
		if s.id != "sub_window_lost" && strings.Contains(errb.String(), s.id) {
			t.Errorf("rotate warned about %s: %q", s.id, errb.String())
		}
	}

	// With only the new key in the file, every secret kept opens.
	dropOlderKeys(t, dataDir)
	content, _ := os.ReadFile(filepath.Join(dataDir, "master.key"))
	newKeys, err := secretbox.Parse(content)
	if err != nil {
		t.Fatal(err)
	}
	st, err = sqlite.Open(ctx, filepath.Join(dataDir, "vibejobs.db"), sqlite.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, s := range subs {
		got, err := st.GetSubscription(ctx, api.BootstrapProjectID, s.id)
		if err != nil {
			t.Fatal(err)
		}
		if plain, err := newKeys.Open(got.Secret, s.id); err != nil || plain != s.current {
			t.Errorf("%s: current secret after the rotation does not open to itself: %v", s.id, err)
		}
		switch {
		case s.wantPrevious:
			if plain, err := newKeys.Open(got.PreviousSecret, s.id); err != nil || plain != s.previous {
				t.Errorf("%s: previous secret in its window not re-sealed: %v", s.id, err)
			}
		case got.PreviousSecret.KeyID != "" || len(got.PreviousSecret.Ciphertext) != 0:
			t.Errorf("%s: previous secret kept under key %q, want it dropped", s.id, got.PreviousSecret.KeyID)
		}
	}
}

// TestRotationRefusesAMissingDatabase: "master-key rotate" pointed at no
// database (on a PostgreSQL host whose data directory holds the key file,
// run without VIBEJOBS_DATABASE) fails and leaves the key file alone. It
// created an empty SQLite database beside the key, "re-sealed" its 0
// secrets and put a new key first in the file, which the servers then
// sealed under, and said the older keys, which every stored secret needs,
// could go.
func TestRotationRefusesAMissingDatabase(t *testing.T) {
	dataDir := t.TempDir()
	key, _ := secretbox.NewKey()
	path := filepath.Join(dataDir, "master.key")
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, env := range []map[string]string{
		{"VIBEJOBS_DATA_DIR": dataDir},
		{"VIBEJOBS_DATA_DIR": dataDir, "VIBEJOBS_DATABASE": filepath.Join(dataDir, "jobs.db")},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), []string{"master-key", "rotate"}, func(k string) string { return env[k] }, &out, &errb)
		if code != 1 || !strings.Contains(errb.String(), "no database") {
			t.Errorf("rotate with %v: exit %d, stdout %q, stderr %q; want 1 and no database named", env, code, out.String(), errb.String())
		}
		if b, _ := os.ReadFile(path); string(b) != key+"\n" {
			t.Errorf("rotate with %v changed the key file", env)
		}
		if entries, _ := os.ReadDir(dataDir); len(entries) != 1 {
			t.Errorf("rotate with %v left %d files in the data directory, want the key file alone", env, len(entries))
		}
	}
}

// TestConcurrentRotationsKeepEveryKey runs two "master-key rotate" at once
// on one key file. Each read the file, put its new key first and wrote it
// back, so the file kept one of the two new keys: the other rotation's
// re-sealed secrets no longer opened, or the database recorded a key the
// file lost. Rotations now take their turns: both succeed, the file keeps
// both new keys, the database records its first, and every secret opens
// with that key alone, as rotate says the older ones may go.
func TestConcurrentRotationsKeepEveryKey(t *testing.T) {
	for _, store := range []string{"sqlite", "postgres"} {
		t.Run(store, func(t *testing.T) {
			dataDir := t.TempDir()
			cfg := testConfig(dataDir)
			if store == "postgres" {
				cfg.Database, _ = pgReplicaURL(t, "")
			}
			secrets := sealSomeSecrets(t, cfg, 3)
			env := map[string]string{"VIBEJOBS_DATA_DIR": dataDir, "VIBEJOBS_DATABASE": cfg.Database}
			const rotations = 2
			var wg sync.WaitGroup
			outs := make([]string, rotations)
			codes := make([]int, rotations)
			for i := range rotations {
				wg.Go(func() {
					var out bytes.Buffer
					codes[i] = run(context.Background(), []string{"master-key", "rotate"}, func(k string) string { return env[k] }, &out, &out)
					outs[i] = out.String()
				})
			}
			wg.Wait()
			for i := range rotations {
				if codes[i] != 0 {
					t.Errorf("rotation %d: exit %d: %s", i, codes[i], outs[i])
				}
			}
			content, err := os.ReadFile(filepath.Join(dataDir, "master.key"))
			if err != nil {
				t.Fatal(err)
			}
			keys, err := secretbox.Parse(content)
			if err != nil {
				t.Fatal(err)
			}
			if len(keys.IDs()) != 1+rotations {
				t.Errorf("key file after %d rotations holds %d keys, want %d", rotations, len(keys.IDs()), 1+rotations)
			}
			checkSecretsOpen(t, cfg, secrets, keys.CurrentID())
		})
	}
}

// sealSomeSecrets starts a server on cfg, creates n jobs and stops it, and
// returns their secrets by job id.
func sealSomeSecrets(t *testing.T, cfg Config, n int) map[string]string {
	t.Helper()
	m := NewMain(io.Discard, io.Discard)
	m.Config = cfg
	if err := m.Run(context.Background()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	defer m.Close()
	api := apiClient{t: t, base: "http://" + m.Addr(), token: m.AdminToken}
	secrets := map[string]string{}
	for range n {
		code, job := api.do("POST", "/v1/jobs", map[string]any{"name": "k", "schedule": "0 0 1 1 *", "url": "http://127.0.0.1:9/"})
		if code != 201 {
			t.Fatalf("create: %d %v", code, job)
		}
		secrets[job["id"].(string)] = job["secret"].(string)
	}
	return secrets
}

// checkSecretsOpen checks that the database of cfg records keyID as its
// master key and that every secret in secrets opens, with the key file's
// key keyID alone, to itself.
func checkSecretsOpen(t *testing.T, cfg Config, secrets map[string]string, keyID string) {
	t.Helper()
	content, err := os.ReadFile(cfg.masterKeyPath())
	if err != nil {
		t.Fatal(err)
	}
	var current *secretbox.Keyring
	for line := range bytes.Lines(content) {
		if k, err := secretbox.Parse(line); err == nil && k.CurrentID() == keyID {
			current = k
		}
	}
	if current == nil {
		t.Fatalf("the key file holds no key %s", keyID)
	}
	ctx := context.Background()
	st, err := cfg.openStore(ctx, slog.New(slog.DiscardHandler), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Update(ctx, func(tx vibejobs.Tx) error {
		if id, err := tx.RecordMasterKey(ctx, "none"); err != nil || id != keyID {
			t.Errorf("the database records master key %q (%v), want %s", id, err, keyID)
		}
		jobs, err := tx.SecretsNotUnder(ctx, "", 1000)
		if err != nil {
			return err
		}
		if len(jobs) != len(secrets) {
			t.Errorf("%d jobs stored, want %d", len(jobs), len(secrets))
		}
		for _, j := range jobs {
			if plain, err := current.Open(j.Secret, j.ID); err != nil || plain != secrets[j.ID] {
				t.Errorf("the secret of %s (under key %s) does not open with the current key alone: %v", j.ID, j.Secret.KeyID, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestRotationsOfOneDatabaseTakeTurns runs "master-key rotate" at once on
// two hosts of one PostgreSQL database, each with its copy of the key file.
// Both put their new key first in their file and re-sealed under it, each
// failing on the secrets the other had re-sealed, and left the servers of
// the two hosts sealing under keys the others lack. They now take turns in
// the database: one rotates, and the other, whose file then lacks the
// database's new key, refuses before it changes its file. The database's
// lock takes no connection of the pool: with pool_max_conns=1 it would
// leave none to the rotation's transactions.
func TestRotationsOfOneDatabaseTakeTurns(t *testing.T) {
	database, _ := pgReplicaURL(t, "")
	cfgs := []Config{testConfig(t.TempDir()), testConfig(t.TempDir())}
	for i := range cfgs {
		cfgs[i].Database = database
	}
	secrets := sealSomeSecrets(t, cfgs[0], 3)
	before, err := os.ReadFile(cfgs[0].masterKeyPath())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgs[1].masterKeyPath(), before, 0o600); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	outs := make([]string, len(cfgs))
	codes := make([]int, len(cfgs))
	for i, cfg := range cfgs {
		env := map[string]string{"VIBEJOBS_DATA_DIR": cfg.DataDir, "VIBEJOBS_DATABASE": database + "&pool_max_conns=1"}
		wg.Go(func() {
			var out bytes.Buffer
			codes[i] = run(context.Background(), []string{"master-key", "rotate"}, func(k string) string { return env[k] }, &out, &out)
			outs[i] = out.String()
		})
	}
	wg.Wait()
	winner, loser := 0, 1
	if codes[0] != 0 {
		winner, loser = 1, 0
	}
	if codes[winner] != 0 || codes[loser] != 1 || !strings.Contains(outs[loser], "wrong master key") {
		t.Fatalf("rotations at once on two hosts: exit %d (%s) and %d (%s), want one 0 and one 1 naming the wrong key",
			codes[0], outs[0], codes[1], outs[1])
	}
	if after, _ := os.ReadFile(cfgs[loser].masterKeyPath()); !bytes.Equal(after, before) {
		t.Error("the refused rotation changed its key file")
	}
	content, err := os.ReadFile(cfgs[winner].masterKeyPath())
	if err != nil {
		t.Fatal(err)
	}
	keys, err := secretbox.Parse(content)
	if err != nil {
		t.Fatal(err)
	}
	checkSecretsOpen(t, cfgs[winner], secrets, keys.CurrentID())
}

// TestBadKeyFileIsNamed: serve and rotate, given a key file that does not
// parse, name it and the line at fault, and print none of its keys. They
// said "key file line 2" of a file the operator had to guess.
func TestBadKeyFileIsNamed(t *testing.T) {
	dataDir := t.TempDir()
	path := filepath.Join(dataDir, "keys", "vibejobs.key")
	good, _ := secretbox.NewKey()
	bad, _ := secretbox.NewKey()
	bad = bad[:len(bad)-1]
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(good+"\n"+bad+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	check := func(what, msg string) {
		t.Helper()
		if !strings.Contains(msg, path) || !strings.Contains(msg, "line 2") {
			t.Errorf("%s with a bad key file said %q: want %s and its line 2 named", what, msg, path)
		}
		if strings.Contains(msg, good[5:]) || strings.Contains(msg, bad[5:]) {
			t.Errorf("%s printed a key", what)
		}
	}
	m := NewMain(io.Discard, io.Discard)
	m.Config = testConfig(dataDir)
	m.Config.MasterKeyFile = path
	err := m.Run(context.Background())
	m.Close()
	if err == nil {
		t.Fatal("serve started with a bad key file")
	}
	check("serve", err.Error())

	var out, errb bytes.Buffer
	env := map[string]string{"VIBEJOBS_DATA_DIR": dataDir, "VIBEJOBS_MASTER_KEY_FILE": path}
	if code := run(context.Background(), []string{"master-key", "rotate"}, func(k string) string { return env[k] }, &out, &errb); code != 1 {
		t.Errorf("rotate with a bad key file: exit %d, want 1", code)
	}
	check("rotate", errb.String())
}

// TestRotationRefusesAnUnmigratedPostgresSchema: "master-key rotate" given
// a PostgreSQL schema that holds no vibejobs database (a search_path or a
// database name mistyped) fails, creates nothing there and leaves the key
// file alone. It created the schema and its tables, "re-sealed" their 0
// secrets and put a new key first in the file, as it did on a SQLite file
// that was not there, and said the older keys, which every secret of the
// real database needs, could go. So it does when the search_path names a
// migrated schema after it: it took that one's migrations table for the
// named schema's, and re-sealed the wrong schema or migrated the named one.
func TestRotationRefusesAnUnmigratedPostgresSchema(t *testing.T) {
	base := postgres.TestURL(t)
	_, migrated := pgReplicaURL(t, "")
	dataDir := t.TempDir()
	key, _ := secretbox.NewKey()
	path := filepath.Join(dataDir, "master.key")
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, tc := range []struct {
		exists bool
		then   string
	}{{false, ""}, {true, ""}, {false, "," + migrated.Schema()}, {true, "," + migrated.Schema()}} {
		exists := tc.exists
		schema := postgres.NewTestSchema(t)
		if exists {
			if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
				t.Fatal(err)
			}
		}
		env := map[string]string{"VIBEJOBS_DATA_DIR": dataDir, "VIBEJOBS_DATABASE": base + "&search_path=" + schema + tc.then}
		var out, errb bytes.Buffer
		code := run(ctx, []string{"master-key", "rotate"}, func(k string) string { return env[k] }, &out, &errb)
		if code != 1 || !strings.Contains(errb.String(), "never migrated") || !strings.Contains(errb.String(), schema) {
			t.Errorf("rotate on a schema never migrated (it exists: %v; search_path %s%s): exit %d, stdout %q, stderr %q; want 1 and the schema named",
				exists, schema, tc.then, code, out.String(), errb.String())
		}
		if b, _ := os.ReadFile(path); string(b) != key+"\n" {
			t.Errorf("rotate on a schema never migrated (it exists: %v; search_path %s%s) changed the key file", exists, schema, tc.then)
		}
		var created bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&created); err != nil {
			t.Fatal(err)
		}
		var tables int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&tables); err != nil {
			t.Fatal(err)
		}
		if created != exists || tables != 0 {
			t.Errorf("rotate on a schema never migrated (it exists: %v; search_path %s%s) left the schema there: %v, with %d tables", exists, schema, tc.then, created, tables)
		}
	}
}

// TestRefusedStartKeepsTheKeyFilePutInItsPlace: a first start whose new key
// file is refused (the database has another master key) removes that file
// only if it still holds the key it made. It removed whatever the path held
// by then: the database's key file, moved into place by the operator while
// the start waited for the database (here, behind a replica's migrations),
// was lost, and with its last copy every secret of the database.
func TestRefusedStartKeepsTheKeyFilePutInItsPlace(t *testing.T) {
	database, store := pgReplicaURL(t, "")
	first := testConfig(t.TempDir())
	first.Database = database
	sealSomeSecrets(t, first, 1)
	right, err := os.ReadFile(first.masterKeyPath())
	if err != nil {
		t.Fatal(err)
	}

	release := postgres.HoldMigrationLock(t, store.Schema())
	created := make(chan struct{})
	m := NewMain(io.Discard, &lineWatch{line: "master_key.created", seen: created})
	m.Config = testConfig(t.TempDir())
	m.Config.Database = database
	errc := make(chan error, 1)
	go func() { errc <- m.Run(context.Background()) }()
	<-created // with a key file of its own, the start waits for the migrations

	// The operator moves the database's key file into place.
	moved := filepath.Join(m.Config.DataDir, "moved.key")
	if err := os.WriteFile(moved, right, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(moved, m.Config.masterKeyPath()); err != nil {
		t.Fatal(err)
	}
	release()
	err = <-errc
	m.Close()
	if !errors.Is(err, errForeignMasterKey) {
		t.Fatalf("the start with its own new key: %v, want it refused for the wrong master key", err)
	}
	if got, err := os.ReadFile(m.Config.masterKeyPath()); err != nil || !bytes.Equal(got, right) {
		t.Fatalf("the key file moved into place during the refused start is gone or changed (%v)", err)
	}
}

// lineWatch is a log writer that closes seen once a line holding line is
// written.
type lineWatch struct {
	line string
	seen chan struct{}
	once sync.Once
}

func (w *lineWatch) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(w.line)) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

// TestWaitingRotationStopsWhenCanceled: a rotation waiting for another one
// to end gives up when its context ends (the first Ctrl-C), and leaves the
// key file alone. It waited for the lock of the key file regardless.
func TestWaitingRotationStopsWhenCanceled(t *testing.T) {
	dataDir := t.TempDir()
	sealSomeSecrets(t, testConfig(dataDir), 1)
	path := filepath.Join(dataDir, "master.key")
	before, _ := os.ReadFile(path)
	unlock, err := lockKeyFile(context.Background(), path, nil) // the rotation under way
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting := make(chan struct{})
	go func() { <-waiting; cancel() }()
	env := map[string]string{"VIBEJOBS_DATA_DIR": dataDir}
	var out bytes.Buffer
	if code := run(ctx, []string{"master-key", "rotate"}, func(k string) string { return env[k] }, &out,
		&lineWatch{line: "waiting for another master key rotation", seen: waiting}); code != 1 {
		t.Errorf("rotate canceled while it waited: exit %d (%s), want 1", code, out.String())
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
		t.Error("rotate canceled while it waited changed the key file")
	}
}

// fileAndLostKeys returns the keys of dataDir's key file, and a keyring of
// a key that file lacks (one lost, or of another installation).
func fileAndLostKeys(t *testing.T, dataDir string) (file, lost *secretbox.Keyring) {
	t.Helper()
	content, err := os.ReadFile(filepath.Join(dataDir, "master.key"))
	if err != nil {
		t.Fatal(err)
	}
	if file, err = secretbox.Parse(content); err != nil {
		t.Fatal(err)
	}
	lostKey, _ := secretbox.NewKey()
	if lost, err = secretbox.Parse([]byte(lostKey)); err != nil {
		t.Fatal(err)
	}
	return file, lost
}
