package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var listedFlag = regexp.MustCompile(`(?m)^  -([a-z-]+)`)

// TestStoreCommandsListOnlyTheirFlags: "migrate -h" and "master-key rotate
// -h" list the flags those commands use, not every serve flag (--listen,
// --concurrency, … which they ignored); "serve -h" still lists them all.
func TestStoreCommandsListOnlyTheirFlags(t *testing.T) {
	store := []string{"data-dir", "database", "log-format", "log-level"}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"migrate", "-h"}, store},
		{[]string{"master-key", "rotate", "-h"}, append(slices.Clone(store), "master-key-file")},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), c.args, func(string) string { return "" }, &out, &errb); code != 0 {
			t.Fatalf("vibejobs %s: exit %d, stderr %q", strings.Join(c.args, " "), code, errb.String())
		}
		var listed []string
		for _, m := range listedFlag.FindAllStringSubmatch(out.String()+errb.String(), -1) {
			listed = append(listed, m[1])
		}
		slices.Sort(listed)
		slices.Sort(c.want)
		if !slices.Equal(listed, c.want) {
			t.Errorf("vibejobs %s lists %v, want %v", strings.Join(c.args, " "), listed, c.want)
		}
	}
	var out, errb bytes.Buffer
	run(context.Background(), []string{"serve", "-h"}, func(string) string { return "" }, &out, &errb)
	if n := len(listedFlag.FindAllString(out.String()+errb.String(), -1)); n != 16 {
		t.Errorf("vibejobs serve -h lists %d flags, want 16", n)
	}
}

// TestStoreCommandsRefuseServeFlags: a serve flag given to migrate or
// master-key rotate, which ignored it (--listen :1 and a migration ran as
// if it were not there), is a usage error naming the flag as serve's, and
// the command does nothing.
func TestStoreCommandsRefuseServeFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"migrate", "--listen", ":1"}, "listen"},
		{[]string{"migrate", "--concurrency", "5"}, "concurrency"},
		{[]string{"migrate", "--master-key-file", "x.key"}, "master-key-file"},
		{[]string{"master-key", "rotate", "--allow-private", "10.0.0.0/8"}, "allow-private"},
		{[]string{"master-key", "rotate", "--claim-ahead=0"}, "claim-ahead"},
	} {
		dir := filepath.Join(t.TempDir(), "data")
		var out, errb bytes.Buffer
		code := run(context.Background(), append(slices.Clone(c.args), "--data-dir", dir), func(string) string { return "" }, &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), "error: usage: vibejobs "+c.args[0]) || !strings.Contains(errb.String(), "--"+c.flag) {
			t.Errorf("vibejobs %s: exit %d, stderr %q; want 2 and --%s named", strings.Join(c.args, " "), code, errb.String(), c.flag)
		}
		if !strings.Contains(errb.String(), "a setting of vibejobs serve") {
			t.Errorf("vibejobs %s: stderr %q does not say the flag is serve's", strings.Join(c.args, " "), errb.String())
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("vibejobs %s: the data directory was created (%v)", strings.Join(c.args, " "), err)
		}
	}
	// A flag of no command is refused as before.
	var errb bytes.Buffer
	if code := run(context.Background(), []string{"migrate", "--bogus"}, func(string) string { return "" }, &errb, &errb); code != 2 ||
		!strings.Contains(errb.String(), "flag provided but not defined: -bogus") {
		t.Errorf("vibejobs migrate --bogus: exit %d, stderr %q", code, errb.String())
	}
}

// TestStoreCommandsIgnoreServeSettings: an environment shared with serve
// holds serve's settings; migrate neither reads nor checks them (a
// VIBEJOBS_CONCURRENCY it does not use stopped the migration), and still
// reads its own.
func TestStoreCommandsIgnoreServeSettings(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	env := map[string]string{
		"VIBEJOBS_CONCURRENCY": "0", "VIBEJOBS_ALLOW_PRIVATE": "bogus", "VIBEJOBS_CLAIM_AHEAD": "5s",
		"VIBEJOBS_DATA_DIR": dir, "VIBEJOBS_LOG_FORMAT": "json",
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"migrate"}, func(k string) string { return env[k] }, &out, &errb); code != 0 {
		t.Fatalf("migrate: exit %d, stderr %q", code, errb.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "vibejobs.db")); err != nil {
		t.Errorf("migrate did not use VIBEJOBS_DATA_DIR: %v", err)
	}
	if !strings.HasPrefix(errb.String(), "{") {
		t.Errorf("migrate did not log JSON (VIBEJOBS_LOG_FORMAT): %q", errb.String())
	}
	env["VIBEJOBS_LOG_LEVEL"] = "trace"
	errb.Reset()
	if code := run(context.Background(), []string{"migrate"}, func(k string) string { return env[k] }, &out, &errb); code == 0 ||
		!strings.Contains(errb.String(), "--log-level (VIBEJOBS_LOG_LEVEL)") {
		t.Errorf("migrate with VIBEJOBS_LOG_LEVEL=trace: exit %d, stderr %q; want its own setting checked", code, errb.String())
	}
}

// TestUsageHidesTheDatabaseURL: the usage that -h or a mistyped flag
// prints does not show VIBEJOBS_DATABASE, which holds the database's
// password: it was shown as the default of --database, so a typo in a
// deployment's arguments put the password in its log.
func TestUsageHidesTheDatabaseURL(t *testing.T) {
	env := map[string]string{"VIBEJOBS_DATABASE": "postgres://app:hunter2@127.0.0.1:1/jobs"}
	for _, args := range [][]string{
		{"serve", "-h"}, {"serve", "--bogus"},
		{"migrate", "-h"}, {"migrate", "--bogus"},
		{"master-key", "rotate", "-h"}, {"master-key", "rotate", "--bogus"},
	} {
		var out, errb bytes.Buffer
		run(context.Background(), args, func(k string) string { return env[k] }, &out, &errb)
		all := out.String() + errb.String()
		if !strings.Contains(all, "-database") {
			t.Fatalf("vibejobs %s printed no usage: %q", strings.Join(args, " "), all)
		}
		if strings.Contains(all, "hunter2") {
			t.Errorf("vibejobs %s printed the database password: %q", strings.Join(args, " "), all)
		}
	}
	// The variable is still read, and the flag still overrides it.
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, env["VIBEJOBS_DATABASE"]},
		{[]string{"--database", "other.db"}, "other.db"},
	} {
		m := NewMain(io.Discard, io.Discard)
		if err := m.ParseFlags(c.args, func(k string) string { return env[k] }); err != nil || m.Config.Database != c.want {
			t.Errorf("serve %q: database %q (%v), want %q", c.args, m.Config.Database, err, c.want)
		}
	}
}
