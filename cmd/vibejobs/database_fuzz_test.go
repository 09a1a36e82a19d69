package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// urlScheme is RFC 3986's scheme: what a --database error may quote of the
// value, since it holds no user name, password or host.
var urlScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*$`)

// FuzzDatabaseSetting feeds --database (VIBEJOBS_DATABASE) whatever an
// operator could write. The value may hold a password, so an error about it
// quotes nothing of it but a URL scheme; what is accepted is a PostgreSQL URL
// (passed on with only its scheme's case changed) or a SQLite path with no
// "://" and no connection keyword; and the case of a scheme never decides
// whether a value is accepted.
func FuzzDatabaseSetting(f *testing.F) {
	for _, seed := range []string{
		"",
		"vibejobs.db",
		"./data/jobs.db",
		"postgres://app:hunter2@127.0.0.1:5432/jobs?sslmode=disable",
		"PostgreSQL://app@127.0.0.1/jobs",
		"postgres:/app:hunter2@127.0.0.1/jobs",
		"mysql://app:hunter2@127.0.0.1/jobs",
		"app:hunter2@127.0.0.1://jobs", // its "scheme" was quoted, password and all
		"host=127.0.0.1 password=hunter2://x",
		"host=127.0.0.1 user=app password=hunter2 dbname=jobs",
		"file:jobs.db?mode=rwc",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, database string) {
		c := Config{Database: database, DataDir: "data", LogFormat: "text", LogLevel: "info"}
		err := c.validateStore()
		if err != nil {
			msg := err.Error()
			for i := strings.IndexByte(msg, '"'); i >= 0; i = strings.IndexByte(msg, '"') {
				q, perr := strconv.QuotedPrefix(msg[i:])
				if perr != nil {
					t.Fatalf("--database %q: error %q has an unmatched quote", database, msg)
				}
				s, _ := strconv.Unquote(q)
				scheme, _, _ := strings.Cut(database, "://")
				if s != "://" && (s != scheme || !urlScheme.MatchString(s)) {
					t.Fatalf("--database %q: error quotes %q, which is not its URL scheme: %s", database, s, msg)
				}
				msg = msg[i+len(q):]
			}
		} else if pg, ok := postgresURL(database); ok {
			i := strings.Index(database, "://")
			if len(pg) != len(database) || !strings.EqualFold(pg[:i], database[:i]) || pg[i:] != database[i:] {
				t.Fatalf("--database %q is passed on as %q", database, pg)
			}
		} else if strings.Contains(database, "://") || keywordDSN(database) {
			t.Fatalf("--database %q accepted as a SQLite path", database)
		}

		// The scheme in lower case is accepted or refused alike.
		if scheme, rest, ok := strings.Cut(database, "://"); ok {
			lower := Config{Database: strings.ToLower(scheme) + "://" + rest, DataDir: "data", LogFormat: "text", LogLevel: "info"}
			if lerr := lower.validateStore(); (lerr == nil) != (err == nil) {
				t.Fatalf("--database %q: %v, but in lower case: %v", database, err, lerr)
			}
		}
	})
}
