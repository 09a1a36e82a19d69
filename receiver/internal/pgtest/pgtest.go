// Package pgtest gives tests and benchmarks of the receiver SDK a PostgreSQL
// schema of their own on the database named by VIBEJOBS_TEST_POSTGRES_URL, so
// that they never collide with each other or with other packages' tests.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvURL names the variable holding the test database URL.
const EnvURL = "VIBEJOBS_TEST_POSTGRES_URL"

// URL returns the test database URL. When it is unset, URL skips tb, or fails
// it when the CI variable is set (CI must not silently skip these tests).
func URL(tb testing.TB) string {
	tb.Helper()
	u := os.Getenv(EnvURL)
	if u == "" {
		if os.Getenv("CI") != "" {
			tb.Fatalf("%s is not set; CI must run the PostgreSQL tests", EnvURL)
		}
		tb.Skipf("PostgreSQL tests skipped: set %s (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable)", EnvURL)
	}
	return u
}

// Schema creates a fresh schema on the database at baseURL and returns a URL
// whose connections use it as search_path, and a function that drops it.
func Schema(ctx context.Context, baseURL string) (schemaURL string, drop func(), err error) {
	var b [6]byte
	rand.Read(b[:])
	name := "receiver_test_" + hex.EncodeToString(b[:])
	conn, err := pgx.Connect(ctx, baseURL)
	if err != nil {
		return "", nil, fmt.Errorf("connecting to the test database: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("creating schema: %w", err)
	}
	u, err := url.Parse(baseURL)
	if err != nil {
		return "", nil, err
	}
	q := u.Query()
	q.Set("search_path", name) // pgx sends unknown URL parameters as run-time parameters
	u.RawQuery = q.Encode()
	drop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, baseURL)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE")
	}
	return u.String(), drop, nil
}

// TestSchema is Schema for a test: it skips or fails as URL does and drops the
// schema when tb ends.
func TestSchema(tb testing.TB) string {
	tb.Helper()
	base := URL(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, drop, err := Schema(ctx, base)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(drop)
	return u
}
