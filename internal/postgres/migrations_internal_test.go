package postgres

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/storetest"
)

// TestMigrationsDownAndUp: a schema at the latest version, holding the
// data of storetest.UpgradeData so that every Down runs over rows in every
// state (a run in flight among them), is migrated down to each older
// version v, then up again as Open does. Every Down runs, and leaves the
// catalog a fresh schema migrated up to v has; back up, the catalog is a
// fresh install's, and the store keeps every promise on the data the
// downs kept (storetest.CheckUpgrade). Down to 1 drops the event feed, its
// rows with it; down to 0 drops every table, and the store is checked on
// the data written again after the up.
func TestMigrationsDownAndUp(t *testing.T) {
	ctx := context.Background()
	latest := latestVersion(t)
	fresh := freshCatalogs(t, latest)
	for v := latest - 1; v >= 0; v-- {
		t.Run(fmt.Sprintf("to%05d", v), func(t *testing.T) {
			schema, pool, p := gooseTestSchema(t)
			if _, err := p.Up(ctx); err != nil {
				t.Fatalf("migrating up: %v", err)
			}
			u := storetest.UpgradeData()
			seedUpgrade(t, pool, latest, u)
			if _, err := p.DownTo(ctx, v); err != nil {
				t.Fatalf("migrating down to version %d: %v", v, err)
			}
			storetest.CheckSchema(t, fmt.Sprintf("migrated down to version %d", v), catalog(t, pool, schema), fresh[v])
			switch {
			case v == 0:
				if _, err := p.Up(ctx); err != nil {
					t.Fatalf("migrating up from version 0: %v", err)
				}
				seedUpgrade(t, pool, latest, u)
			case v < 2:
				u.DropFeed()
			}

			s := MustOpenTestWith(t, Options{Schema: schema, Now: func() time.Time { return storetest.T0 },
				Logger: slog.New(slog.DiscardHandler)})
			storetest.CheckSchema(t, fmt.Sprintf("migrated down to version %d and up again", v),
				catalog(t, s.pool, schema), fresh[latest])
			checkQueue(t, s)
			storetest.CheckUpgrade(t, s, u)
		})
	}
}

// freshCatalogs returns the catalog (see catalog) of a new schema at each
// version from 0 (goose's table alone) to latest, migrated up one version
// at a time.
func freshCatalogs(t *testing.T, latest int64) [][]string {
	t.Helper()
	ctx := context.Background()
	schema, pool, p := gooseTestSchema(t)
	if _, err := p.GetDBVersion(ctx); err != nil { // creates goose's table
		t.Fatal(err)
	}
	catalogs := [][]string{catalog(t, pool, schema)}
	for v := int64(1); v <= latest; v++ {
		if _, err := p.UpByOne(ctx); err != nil {
			t.Fatalf("migrating up to version %d: %v", v, err)
		}
		catalogs = append(catalogs, catalog(t, pool, schema))
	}
	return catalogs
}

// catalog describes what schema holds, one line per object or property,
// with the schema's name left out so that two schemas compare: each
// relation's kind and storage options, the columns of each with their
// type, collation, nullability, default and place among the live columns
// (a dropped column leaves a hole in the numbering, which a fresh table
// has not), indexes with their definitions, constraints, triggers (those
// the server makes for foreign keys aside), sequences, the columns that
// own them, views and functions.
func catalog(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	const ns = `(SELECT oid FROM pg_namespace WHERE nspname = $1)`
	queries := []string{
		`SELECT format('relation %s kind=%s persistence=%s options=%s replica identity=%s',
			relname, relkind, relpersistence, coalesce(reloptions::text, '{}'), relreplident)
		FROM pg_class WHERE relnamespace = ` + ns,
		`SELECT format('column %s.%s #%s %s collation=%s not null=%s default=%s identity=%s generated=%s',
			c.relname, a.attname, row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum),
			format_type(a.atttypid, a.atttypmod), coalesce(co.collname, ''), a.attnotnull,
			coalesce(pg_get_expr(d.adbin, d.adrelid), '(none)'), a.attidentity, a.attgenerated)
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
		LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		LEFT JOIN pg_collation co ON co.oid = a.attcollation
		WHERE c.relnamespace = ` + ns + ` AND a.attnum > 0 AND NOT a.attisdropped`,
		`SELECT format('index %s on %s: %s primary=%s clustered=%s replica identity=%s valid=%s',
			i.relname, c.relname, pg_get_indexdef(x.indexrelid), x.indisprimary, x.indisclustered,
			x.indisreplident, x.indisvalid)
		FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class c ON c.oid = x.indrelid
		WHERE c.relnamespace = ` + ns,
		`SELECT format('constraint %s on %s: %s %s deferrable=%s deferred=%s validated=%s index=%s',
			co.conname, coalesce(c.relname, ''), co.contype, pg_get_constraintdef(co.oid), co.condeferrable,
			co.condeferred, co.convalidated, coalesce(i.relname, ''))
		FROM pg_constraint co LEFT JOIN pg_class c ON c.oid = co.conrelid LEFT JOIN pg_class i ON i.oid = co.conindid
		WHERE co.connamespace = ` + ns,
		`SELECT format('trigger %s on %s: %s enabled=%s', tg.tgname, c.relname, pg_get_triggerdef(tg.oid), tg.tgenabled)
		FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid
		WHERE c.relnamespace = ` + ns + ` AND NOT tg.tgisinternal`,
		`SELECT format('sequence %s: %s start=%s increment=%s min=%s max=%s cache=%s cycle=%s', c.relname,
			format_type(sq.seqtypid, NULL), sq.seqstart, sq.seqincrement, sq.seqmin, sq.seqmax, sq.seqcache, sq.seqcycle)
		FROM pg_sequence sq JOIN pg_class c ON c.oid = sq.seqrelid WHERE c.relnamespace = ` + ns,
		`SELECT format('sequence %s owned by %s.%s (%s)', sq.relname, c.relname, a.attname, d.deptype)
		FROM pg_depend d JOIN pg_class sq ON sq.oid = d.objid AND d.classid = 'pg_class'::regclass
		JOIN pg_class c ON c.oid = d.refobjid AND d.refclassid = 'pg_class'::regclass
		JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
		WHERE sq.relkind = 'S' AND sq.relnamespace = ` + ns,
		`SELECT format('view %s: %s', relname, pg_get_viewdef(oid)) FROM pg_class
		WHERE relkind IN ('v', 'm') AND relnamespace = ` + ns,
		`SELECT format('function %s(%s): %s', proname, pg_get_function_identity_arguments(oid),
			CASE WHEN prokind IN ('f', 'p') THEN pg_get_functiondef(oid) ELSE prokind::text END)
		FROM pg_proc WHERE pronamespace = ` + ns,
	}
	ctx := context.Background()
	var lines []string
	for _, q := range queries {
		rows, err := pool.Query(ctx, q, schema)
		if err != nil {
			t.Fatalf("reading the catalog: %v", err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("reading the catalog: %v", err)
		}
		for _, line := range got {
			line = strings.ReplaceAll(line, pgx.Identifier{schema}.Sanitize()+".", "")
			lines = append(lines, strings.ReplaceAll(line, schema+".", ""))
		}
	}
	return lines
}

// TestRunQueueMigrationKeepsTheQueue: a database at version 7, whose queue
// lived in runs, keeps every waiting and leased run claimable or
// recoverable once 00008 moves the queue into run_queue.
func TestRunQueueMigrationKeepsTheQueue(t *testing.T) {
	ctx := context.Background()
	schema, pool := migrateTestSchemaTo(t, 7)
	_, err := pool.Exec(ctx, `
		INSERT INTO projects (id, name, created_at) VALUES ('prj_1', 'p', $1);
		INSERT INTO jobs (id, project_id, name, schedule, timezone, url, enabled, state, max_attempts,
			min_backoff_ns, max_backoff_ns, timeout_ns, catch_up, schedule_anchor, secret_key_id,
			secret_ciphertext, created_at, updated_at)
		VALUES ('job_1', 'prj_1', 'j', '@every 1s', 'UTC', 'https://example.test/hook', true, 'active', 4,
			1000000000, 60000000000, 10000000000, 'all', $1, 'k1', 'sealed', $1, $1);
		INSERT INTO runs (id, job_id, project_id, trigger, scheduled_for, deadline_at, state, attempt,
			next_attempt_at, attempt_started_at, lease_owner, lease_expires_at, created_at, finished_at)
		VALUES
			('run_1', 'job_1', 'prj_1', 'manual', $1, $1::timestamptz + interval '96 hours', 'scheduled', 0,
				$1, NULL, NULL, NULL, $1, NULL),
			('run_2', 'job_1', 'prj_1', 'manual', $1, $1::timestamptz + interval '96 hours', 'retrying', 1,
				$1::timestamptz + interval '1 minute', NULL, NULL, NULL, $1, NULL),
			('run_3', 'job_1', 'prj_1', 'manual', $1, $1::timestamptz + interval '96 hours', 'scheduled', 1,
				$1, $1, 'w1', $1::timestamptz + interval '15 seconds', $1, NULL),
			('run_4', 'job_1', 'prj_1', 'manual', $1, $1::timestamptz + interval '96 hours', 'succeeded', 1,
				NULL, NULL, NULL, NULL, $1, $1)`, pgx.QueryExecModeSimpleProtocol, t0)
	if err != nil {
		t.Fatalf("seeding version 7: %v", err)
	}

	s := MustOpenTestWith(t, Options{Schema: schema, Now: func() time.Time { return t0 }})
	var queued int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM run_queue`).Scan(&queued); err != nil || queued != 3 {
		t.Fatalf("run_queue holds %d rows (%v), want the waiting, retrying and leased runs", queued, err)
	}
	checkQueue(t, s)
	claims, err := s.ClaimDueRuns(ctx, "w2", t0, 10, time.Minute)
	if err != nil || len(claims) != 1 || claims[0].Run.ID != "run_1" {
		t.Fatalf("ClaimDueRuns after the migration = %d claims, %v; want run_1 alone", len(claims), err)
	}
	if n, err := s.RecoverExpiredLeases(ctx, t0.Add(20*time.Second), 10); err != nil || n != 1 {
		t.Fatalf("RecoverExpiredLeases after the lease of run_3 expired = %d, %v; want 1", n, err)
	}
	checkQueue(t, s)
}

// TestOpenRefusesANewerSchema: a schema that a newer build migrated further
// (here: to a version 9999 this build does not have) is refused at Open,
// as by `vibejobs migrate`, not run with this build's statements: a claim
// of this build beside one of the newer could send a run twice. goose
// alone applies nothing and says nothing.
func TestOpenRefusesANewerSchema(t *testing.T) {
	ctx := context.Background()
	schema, pool, p := gooseTestSchema(t)
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO goose_db_version (version_id, is_applied) VALUES (9999, true)`); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, TestURL(t), Options{Schema: schema, Logger: slog.New(slog.DiscardHandler)})
	if err == nil {
		s.Close()
		t.Fatal("Open of a schema at version 9999 succeeded")
	}
	if want := fmt.Sprintf("at version 9999, newer than this build of vibejobs knows (%d)", latestVersion(t)); !strings.Contains(err.Error(), want) {
		t.Fatalf("Open of a schema at version 9999: %v; want an error saying %q", err, want)
	}
}

// TestStoreStandsDownWhenANewerBuildMigrates: a newer build that migrates
// the schema under an open Store (a rolling upgrade, this replica still
// running) stands it down once the Store reads the version: every call
// fails EUNAVAILABLE, saying why, so that no claim of this build runs
// beside one of the newer build's. Before that, the Store answers as ever.
func TestStoreStandsDownWhenANewerBuildMigrates(t *testing.T) {
	ctx := context.Background()
	schema, pool, p := gooseTestSchema(t)
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, TestURL(t), Options{Schema: schema, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ahead, err := s.checkSchema(ctx); ahead || err != nil {
		t.Fatalf("checkSchema of the schema this build migrated = %v, %v; want false, nil", ahead, err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping before a newer build migrated: %v", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO goose_db_version (version_id, is_applied) VALUES (9999, true)`); err != nil {
		t.Fatal(err)
	}
	if ahead, err := s.checkSchema(ctx); !ahead || err != nil {
		t.Fatalf("checkSchema of a schema at version 9999 = %v, %v; want true, nil", ahead, err)
	}
	want := fmt.Sprintf("at version 9999, newer than this build of vibejobs knows (%d)", latestVersion(t))
	calls := map[string]func() error{
		"Ping": func() error { return s.Ping(ctx) },
		"ClaimDueRuns": func() error {
			_, err := s.ClaimDueRuns(ctx, "w1", time.Now(), 10, time.Second)
			return err
		},
		"Update": func() error { return s.Update(ctx, func(vibejobs.Tx) error { return nil }) },
		"ListProjects": func() error {
			_, _, err := s.ListProjects(ctx, vibejobs.Page{})
			return err
		},
	}
	for name, call := range calls {
		if err := call(); vibejobs.ErrorKind(err) != vibejobs.EUNAVAILABLE || !strings.Contains(err.Error(), want) {
			t.Errorf("%s on a Store stood down: %v; want EUNAVAILABLE saying %q", name, err, want)
		}
	}
}
