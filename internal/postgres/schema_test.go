package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/vibejobs/vibejobs/internal/postgres"
)

// withParam returns url with the query parameter kv (key=value) added.
func withParam(url, kv string) string {
	if strings.Contains(url, "?") {
		return url + "&" + kv
	}
	return url + "?" + kv
}

// tablesIn returns how many tables schema holds, and whether it exists.
func tablesIn(t *testing.T, conn *pgx.Conn, schema string) (n int, exists bool) {
	t.Helper()
	err := conn.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM pg_tables WHERE schemaname = $1),
		EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&n, &exists)
	if err != nil {
		t.Fatal(err)
	}
	return n, exists
}

// migratedSchema returns the test server's URL, a schema Open migrated and
// a connection of its own, closed when t ends.
func migratedSchema(t *testing.T) (url, migrated string, conn *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	url = postgres.TestURL(t)
	migrated = postgres.NewTestSchema(t)
	open(t, migrated)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	return url, migrated, conn
}

// TestMustExistLooksInTheNamedSchema: Open with MustExist (master-key
// rotate) on a URL whose search_path names a schema never migrated, before
// a schema that was, refuses it and names it, creating nothing. It looked
// for the migrations table through the whole search_path, found the second
// schema's and accepted: the rotation then worked on that schema's tables
// while the user had named the first.
func TestMustExistLooksInTheNamedSchema(t *testing.T) {
	ctx := context.Background()
	url, migrated, conn := migratedSchema(t)
	for _, exists := range []bool{false, true} {
		named := postgres.NewTestSchema(t)
		if exists {
			if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{named}.Sanitize()); err != nil {
				t.Fatal(err)
			}
		}
		s, err := postgres.Open(ctx, withParam(url, "search_path="+named+","+migrated), postgres.Options{Logger: quiet, MustExist: true})
		if err == nil {
			s.Close()
			t.Errorf("MustExist on search_path %s,%s (the first exists: %v) accepted it, want it refused", named, migrated, exists)
		} else if !strings.Contains(err.Error(), "never migrated") || !strings.Contains(err.Error(), named) {
			t.Errorf("MustExist on search_path %s,%s (the first exists: %v): %v; want the first named as never migrated", named, migrated, exists, err)
		}
		if n, ok := tablesIn(t, conn, named); ok != exists || n != 0 {
			t.Errorf("MustExist on search_path %s,%s (the first exists: %v) left it existing: %v, with %d tables", named, migrated, exists, ok, n)
		}
	}

	// The migrated schema named first is accepted, whatever follows it.
	s, err := postgres.Open(ctx, withParam(url, "search_path="+migrated+",pg_catalog"), postgres.Options{Logger: quiet, MustExist: true})
	if err != nil {
		t.Fatalf("MustExist on a migrated schema named first: %v", err)
	}
	s.Close()
}

// TestURLSchemaIsMigratedFirstInTheSearchPath: Open (serve and migrate) on
// a URL whose search_path names a missing schema before a migrated one
// creates the first and migrates it, leaving the second as it was.
func TestURLSchemaIsMigratedFirstInTheSearchPath(t *testing.T) {
	ctx := context.Background()
	url, migrated, conn := migratedSchema(t)
	before, _ := tablesIn(t, conn, migrated)
	var versionsBefore int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{migrated, "goose_db_version"}.Sanitize()).Scan(&versionsBefore); err != nil {
		t.Fatal(err)
	}

	named := postgres.NewTestSchema(t)
	s, err := postgres.Open(ctx, withParam(url, "search_path="+named+","+migrated), postgres.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Schema() != named {
		t.Errorf("Schema() = %q, want %q", s.Schema(), named)
	}
	if n, _ := tablesIn(t, conn, named); n != before {
		t.Errorf("%d tables in the named schema, want %d as in a migrated one", n, before)
	}
	var versions int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{migrated, "goose_db_version"}.Sanitize()).Scan(&versions); err != nil {
		t.Fatal(err)
	}
	if n, _ := tablesIn(t, conn, migrated); n != before || versions != versionsBefore {
		t.Errorf("the second schema of the search_path changed: %d tables (was %d), %d migrations recorded (was %d)", n, before, versions, versionsBefore)
	}
	// The store's statements reach the named schema's tables.
	var where string
	if err := s.Pool().QueryRow(ctx, `SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = 'runs'::regclass`).Scan(&where); err != nil {
		t.Fatal(err)
	}
	if where != named {
		t.Errorf("the store's runs table is in %s, want %s", where, named)
	}
}

// TestOptionsSearchPathIsRefused: a URL whose options (or PGOPTIONS) set
// search_path, libpq's -c search_path=name, is refused with an error that
// says to write search_path=name instead. Open read the schema from
// search_path= alone: a schema chosen through options was the connections'
// schema, but the Store's was "", so two installations in two schemas of
// one database, each chosen so, shared the migration lock, the master key
// rotation lock and their notifications, and a missing schema was not
// created. Options that set no search_path are taken.
func TestOptionsSearchPathIsRefused(t *testing.T) {
	ctx := context.Background()
	url := postgres.TestURL(t)
	migrated := postgres.NewTestSchema(t)
	open(t, migrated)
	refused := func(t *testing.T, what, url string) {
		t.Helper()
		s, err := postgres.Open(ctx, url, postgres.Options{Logger: quiet})
		if err == nil {
			t.Errorf("%s: Open took it (schema %q), want it refused", what, s.Schema())
			s.Close()
			return
		}
		if msg := err.Error(); !strings.Contains(msg, "options") || !strings.Contains(msg, "search_path=") {
			t.Errorf("%s: %v; want an error that says to give search_path= instead", what, err)
		}
	}
	for _, options := range []string{
		"-csearch_path%3D" + migrated,
		"-c%20search_path%3D" + migrated,
		"--search_path%3D" + migrated,
		"--search-path%3D" + migrated,
		"-c%20statement_timeout%3D5s%20-c%20SEARCH_PATH%3D" + migrated + ",public",
	} {
		refused(t, "options="+options, withParam(url, "options="+options))
	}
	t.Run("PGOPTIONS", func(t *testing.T) {
		t.Setenv("PGOPTIONS", "-c search_path="+migrated)
		refused(t, "PGOPTIONS", url)
	})

	schema := postgres.NewTestSchema(t)
	s, err := postgres.Open(ctx, withParam(withParam(url, "options=-c%20statement_timeout%3D5s%20-c%20application_name%3Dsearch_path"), "search_path="+schema),
		postgres.Options{Logger: quiet})
	if err != nil {
		t.Fatalf("options that set no search_path: %v", err)
	}
	defer s.Close()
	var timeout string
	if err := s.Pool().QueryRow(ctx, `SHOW statement_timeout`).Scan(&timeout); err != nil || timeout != "5s" || s.Schema() != schema {
		t.Errorf("options that set no search_path: statement_timeout %q (%v), Schema() %q; want 5s and %s", timeout, err, s.Schema(), schema)
	}
}

// TestURLSchemaFoldsCaseAsTheServerDoes: a search_path entry written
// without quotes names the schema in lower case, as the server reads it,
// and one in double quotes names it as written. Open created the schema
// with the letters as written ("Vjtest_…"), while the server looked for
// vjtest_…: no schema, so the migrations failed ("no schema has been
// selected to create in") and left the stray schema behind.
func TestURLSchemaFoldsCaseAsTheServerDoes(t *testing.T) {
	ctx := context.Background()
	url := postgres.TestURL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) }) // after the drops below
	for _, quoted := range []bool{false, true} {
		lower := postgres.NewTestSchema(t)
		mixed := "Vj" + strings.TrimPrefix(lower, "vj")
		t.Cleanup(func() {
			if _, err := conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{mixed}.Sanitize()+" CASCADE"); err != nil {
				t.Errorf("dropping test schema %s: %v", mixed, err)
			}
		})
		entry, want, other := mixed, lower, mixed
		if quoted {
			entry, want, other = "%22"+mixed+"%22", mixed, lower
		}
		s, err := postgres.Open(ctx, withParam(url, "search_path="+entry), postgres.Options{Logger: quiet})
		if err != nil {
			t.Errorf("search_path=%s: %v", entry, err)
			continue
		}
		s.Close()
		if s.Schema() != want {
			t.Errorf("search_path=%s: Schema() = %q, want %q", entry, s.Schema(), want)
		}
		if n, _ := tablesIn(t, conn, want); n == 0 {
			t.Errorf("search_path=%s: no tables in %s", entry, want)
		}
		if _, exists := tablesIn(t, conn, other); exists {
			t.Errorf("search_path=%s: schema %s was made", entry, other)
		}
	}
}
