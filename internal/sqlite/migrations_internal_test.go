package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibejobs/vibejobs/internal/storetest"
)

// TestMigrationsDownAndUp: a database at the latest version, holding the
// data of storetest.UpgradeData so that every Down runs over rows in every
// state, is migrated down to each older version v, then up again as Open
// does. Every Down runs, and leaves the schema a fresh database migrated
// up to v has; back up, the schema is a fresh install's, and the store
// keeps every promise on the data the downs kept (storetest.CheckUpgrade).
// Down to 1 drops the event feed, its rows with it; down to 0 drops every
// table, and the store is checked on the data written again after the up.
func TestMigrationsDownAndUp(t *testing.T) {
	ctx := context.Background()
	latest := storetest.LatestMigration(t, migrationsFS(t))
	fresh := freshSchemas(t, latest)
	for v := latest - 1; v >= 0; v-- {
		t.Run(fmt.Sprintf("to%05d", v), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "vibejobs.db")
			db, p := gooseOn(t, path)
			if _, err := p.Up(ctx); err != nil {
				t.Fatalf("migrating up: %v", err)
			}
			u := storetest.UpgradeData()
			seedUpgrade(t, db, latest, u)
			if _, err := p.DownTo(ctx, v); err != nil {
				t.Fatalf("migrating down to version %d: %v", v, err)
			}
			storetest.CheckSchema(t, fmt.Sprintf("migrated down to version %d", v), schemaOf(t, db), fresh[v])
			switch {
			case v == 0:
				if _, err := p.Up(ctx); err != nil {
					t.Fatalf("migrating up from version 0: %v", err)
				}
				seedUpgrade(t, db, latest, u)
			case v < 2:
				u.DropFeed()
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}

			s := openAtT0(t, path)
			storetest.CheckSchema(t, fmt.Sprintf("migrated down to version %d and up again", v), schemaOf(t, s.r), fresh[latest])
			storetest.CheckUpgrade(t, s, u)
		})
	}
}

// freshSchemas returns the schema (see schemaOf) of a new database at each
// version from 0 (goose's table alone) to latest, migrated up one version
// at a time.
func freshSchemas(t *testing.T, latest int64) [][]string {
	t.Helper()
	ctx := context.Background()
	db, p := gooseOn(t, filepath.Join(t.TempDir(), "fresh.db"))
	if _, err := p.GetDBVersion(ctx); err != nil { // creates goose's table
		t.Fatal(err)
	}
	schemas := [][]string{schemaOf(t, db)}
	for v := int64(1); v <= latest; v++ {
		if _, err := p.UpByOne(ctx); err != nil {
			t.Fatalf("migrating up to version %d: %v", v, err)
		}
		schemas = append(schemas, schemaOf(t, db))
	}
	return schemas
}

// schemaOf describes the schema of db, one line per object or property:
// every entry of sqlite_schema with its SQL (whitespace runs made one
// space), each table's kind, columns, indexes with their columns, and
// foreign keys. The statistics tables ANALYZE and PRAGMA optimize write
// are left out.
func schemaOf(t *testing.T, db *sql.DB) []string {
	t.Helper()
	const tables = `sqlite_schema m JOIN pragma_table_list(m.name) l
		WHERE m.type = 'table' AND l.schema = 'main' AND m.name NOT LIKE 'sqlite_stat%'`
	queries := []string{
		`SELECT type || ' ' || name || ' on ' || tbl_name || ': ' || ifnull(sql, '(no sql)') FROM sqlite_schema
		WHERE name NOT LIKE 'sqlite_stat%'`,
		`SELECT 'table ' || l.name || ' ' || l.type || ' columns=' || l.ncol || ' without rowid=' || l.wr ||
			' strict=' || l.strict FROM ` + tables,
		`SELECT 'column ' || m.name || '.' || c.name || ' #' || c.cid || ' ' || c.type || ' notnull=' || c."notnull" ||
			' default=' || ifnull(c.dflt_value, '(none)') || ' pk=' || c.pk || ' hidden=' || c.hidden
		FROM ` + strings.Replace(tables, "WHERE", "JOIN pragma_table_xinfo(m.name) c WHERE", 1),
		`SELECT 'index ' || i.name || ' on ' || m.name || ' unique=' || i."unique" || ' origin=' || i.origin ||
			' partial=' || i.partial || ' #' || x.seqno || ' ' || ifnull(x.name, '(cid ' || x.cid || ')') || ' desc=' || x."desc" ||
			' collation=' || ifnull(x.coll, '') || ' key=' || x.key
		FROM ` + strings.Replace(tables, "WHERE", "JOIN pragma_index_list(m.name) i JOIN pragma_index_xinfo(i.name) x WHERE", 1),
		`SELECT 'foreign key ' || m.name || ' #' || f.id || '.' || f.seq || ' ' || f."from" || ' references ' || f."table" ||
			' (' || ifnull(f."to", '(primary key)') || ') on update ' || f.on_update || ' on delete ' || f.on_delete ||
			' match ' || f."match"
		FROM ` + strings.Replace(tables, "WHERE", "JOIN pragma_foreign_key_list(m.name) f WHERE", 1),
	}
	var lines []string
	for _, q := range queries {
		rows, err := db.QueryContext(context.Background(), q)
		if err != nil {
			t.Fatalf("reading the schema: %v", err)
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatalf("reading the schema: %v", err)
			}
			lines = append(lines, strings.Join(strings.Fields(line), " "))
		}
		if err := rows.Close(); err != nil {
			t.Fatalf("reading the schema: %v", err)
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("reading the schema: %v", err)
		}
	}
	return lines
}

// TestOpenRefusesANewerSchema: a database that a newer build migrated
// further (here: to a version 9999 this build does not have) is refused at
// Open, not run with this build's statements, which could break the newer
// schema's promises. goose alone applies nothing and says nothing.
func TestOpenRefusesANewerSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "vibejobs.db")
	db, p := gooseOn(t, path)
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO goose_db_version (version_id, is_applied) VALUES (9999, 1)`); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, path, Options{Logger: slog.New(slog.DiscardHandler)})
	if err == nil {
		s.Close()
		t.Fatal("Open of a database at schema version 9999 succeeded")
	}
	latest := storetest.LatestMigration(t, migrationsFS(t))
	if want := fmt.Sprintf("at version 9999, newer than this build of vibejobs knows (%d)", latest); !strings.Contains(err.Error(), want) {
		t.Fatalf("Open of a database at schema version 9999: %v; want an error saying %q", err, want)
	}
}
