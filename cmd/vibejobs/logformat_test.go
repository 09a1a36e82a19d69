package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/internal/api"
	"github.com/vibejobs/vibejobs/internal/secretbox"
	"github.com/vibejobs/vibejobs/internal/sqlite"
)

// jsonRecords parses stderr as JSON log records, one a line, and fails the
// test at a line that is none: a pipeline that reads a command's logs as
// JSON must be able to read all it says.
func jsonRecords(t *testing.T, stderr string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for line := range strings.Lines(stderr) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("stderr holds a line that is no JSON record: %q", line)
			continue
		}
		recs = append(recs, rec)
	}
	return recs
}

// TestFailureFollowsTheLogFormat: the error that ends serve, migrate or
// master-key rotate is a JSON record when the command's settings ask for
// JSON logs, from the flag or the variable, usage errors of its settings
// included; otherwise it is the plain line "error: …".
func TestFailureFollowsTheLogFormat(t *testing.T) {
	dir := t.TempDir()
	notADir := filepath.Join(dir, "file")
	if err := os.WriteFile(notADir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		code    int
		command string
		want    string // in the error's text
	}{
		{"serve usage", []string{"serve", "--concurrency", "0"}, 2, "serve", "--concurrency"},
		{"serve ca file", []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "serve"), "--ca-file", filepath.Join(dir, "missing.pem")}, 1, "serve", "--ca-file"},
		{"migrate", []string{"migrate", "--database", filepath.Join(notADir, "x.db")}, 1, "migrate", "migrating"},
		{"rotate", []string{"master-key", "rotate", "--data-dir", filepath.Join(dir, "empty")}, 1, "master-key", "master key file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, how := range []string{"flag", "env", "text"} {
				args, env := tc.args, map[string]string{}
				switch how {
				case "flag":
					args = append(append([]string{}, args...), "--log-format", "json")
				case "env":
					env["VIBEJOBS_LOG_FORMAT"] = "JSON"
				}
				var out, errb bytes.Buffer
				if code := run(context.Background(), args, func(k string) string { return env[k] }, &out, &errb); code != tc.code {
					t.Fatalf("%s: exit %d, want %d (%s)", how, code, tc.code, errb.String())
				}
				if how == "text" {
					if !strings.HasPrefix(errb.String(), "error: ") || !strings.Contains(errb.String(), tc.want) {
						t.Errorf("text: stderr %q, want the line error: …", errb.String())
					}
					continue
				}
				recs := jsonRecords(t, errb.String())
				if len(recs) == 0 {
					t.Fatalf("%s: nothing on stderr", how)
				}
				last := recs[len(recs)-1]
				if last["level"] != "ERROR" || last["msg"] != "command.failed" || last["command"] != tc.command ||
					!strings.Contains(last["error"].(string), tc.want) {
					t.Errorf("%s: last record %v, want command.failed of %s with %q", how, last, tc.command, tc.want)
				}
			}
		})
	}
}

// TestRotateSpeaksJSON: with JSON logs, what "master-key rotate" says on
// stderr while it works (that it waits for another rotation, the
// subscriptions whose previous secret it dropped) is JSON records too,
// with ids only; its summary stays on stdout.
func TestRotateSpeaksJSON(t *testing.T) {
	dataDir := t.TempDir()
	sealSomeSecrets(t, testConfig(dataDir), 1)
	previous := addSubscriptionWithLostPrevious(t, dataDir, "sub_lost_previous")
	path := filepath.Join(dataDir, "master.key")
	unlock, err := lockKeyFile(context.Background(), path, nil) // the rotation under way
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	var out, errb bytes.Buffer
	done := make(chan int)
	env := map[string]string{"VIBEJOBS_DATA_DIR": dataDir, "VIBEJOBS_LOG_FORMAT": "json"}
	go func() {
		done <- run(context.Background(), []string{"master-key", "rotate"}, func(k string) string { return env[k] }, &out,
			// "waiting": in either format, so that a rotate that says it in
			// the wrong one ends too, and fails below.
			io.MultiWriter(&errb, &lineWatch{line: "waiting", seen: waiting}))
	}()
	select {
	case <-waiting:
	case code := <-done:
		unlock()
		t.Fatalf("rotate ended (exit %d) without saying it waits: %q", code, errb.String())
	}
	unlock()
	if code := <-done; code != 0 {
		t.Fatalf("rotate: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "master key rotated") {
		t.Errorf("stdout %q, want the summary", out.String())
	}
	msgs := map[string]map[string]any{}
	for _, rec := range jsonRecords(t, errb.String()) {
		msgs[rec["msg"].(string)] = rec
	}
	if _, ok := msgs["master_key.rotation_waiting"]; !ok {
		t.Errorf("no master_key.rotation_waiting record in %q", errb.String())
	}
	if rec := msgs["master_key.previous_secret_dropped"]; rec == nil || rec["subscription"] != "sub_lost_previous" {
		t.Errorf("master_key.previous_secret_dropped record %v, want one naming sub_lost_previous", rec)
	}
	if strings.Contains(errb.String()+out.String(), previous) {
		t.Error("rotate printed the previous secret it dropped")
	}
}

// addSubscriptionWithLostPrevious adds to dataDir's SQLite database the
// subscription id, its current secret sealed under the key file's key and
// its previous one, still in its grace window, under a key the file lacks;
// it returns that previous secret.
func addSubscriptionWithLostPrevious(t *testing.T, dataDir, id string) string {
	t.Helper()
	ctx := context.Background()
	fileKeys, lostKeys := fileAndLostKeys(t, dataDir)
	st, err := sqlite.Open(ctx, filepath.Join(dataDir, "vibejobs.db"), sqlite.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	until := now.Add(23 * time.Hour)
	current, _ := contract.NewSecret(nil)
	previous, _ := contract.NewSecret(nil)
	row := &vibejobs.Subscription{ID: id, ProjectID: api.BootstrapProjectID, URL: "http://127.0.0.1:9/",
		CreatedAt: now, UpdatedAt: now, PreviousExpiresAt: &until}
	if row.Secret, err = fileKeys.Seal(current, id); err != nil {
		t.Fatal(err)
	}
	if row.PreviousSecret, err = lostKeys.Seal(previous, id); err != nil {
		t.Fatal(err)
	}
	if err := st.Update(ctx, func(tx vibejobs.Tx) error {
		return tx.CreateSubscription(ctx, row, vibejobs.MaxSubscriptionsPerProject)
	}); err != nil {
		t.Fatal(err)
	}
	return previous
}

// TestDatabaseErrorsHideThePassword: a PostgreSQL database that refuses
// the connection fails serve, migrate and master-key rotate with an error
// that names no part of the URL's password, wherever the URL holds it, in
// either log format. pgx's connect errors name the user, the database and
// the address, which is all an operator needs.
func TestDatabaseErrorsHideThePassword(t *testing.T) {
	dataDir := t.TempDir()
	if _, _, err := secretbox.LoadOrCreate(filepath.Join(dataDir, "master.key")); err != nil {
		t.Fatal(err)
	}
	for _, database := range []string{
		"postgres://app:Hunter2pw@127.0.0.1:1/jobs?connect_timeout=5",
		"postgres://app:Hunter2pw%40x@127.0.0.1:1,[::1]:1/jobs?connect_timeout=5",
		"postgresql://app@127.0.0.1:1/jobs?password=Hunter2pw&connect_timeout=5",
	} {
		for _, args := range [][]string{
			{"serve", "--listen", "127.0.0.1:0"},
			{"migrate"},
			{"master-key", "rotate"},
		} {
			for _, format := range []string{"text", "json"} {
				env := map[string]string{"VIBEJOBS_DATABASE": database, "VIBEJOBS_DATA_DIR": dataDir, "VIBEJOBS_LOG_FORMAT": format}
				var out, errb bytes.Buffer
				code := run(context.Background(), args, func(k string) string { return env[k] }, &out, &errb)
				all := out.String() + errb.String()
				if code != 1 || !strings.Contains(all, "127.0.0.1:1") {
					t.Errorf("%s (%s): exit %d, %q; want 1 and the address refused", args[0], format, code, all)
				}
				if strings.Contains(all, "Hunter2") {
					t.Errorf("%s (%s) printed the password: %q", args[0], format, all)
				}
			}
		}
	}
}
