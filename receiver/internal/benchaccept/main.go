// Command benchaccept measures accepted deliveries per second through the
// receiver's handler on PostgreSQL (verify + validate + durable accept, one
// fresh run id per request) with N concurrent clients on loopback, and in the
// same run pgbench's TPS for a one-row INSERT transaction at the same
// concurrency on the same database: the machine's durable-commit limit.
//
//	go run ./receiver/internal/benchaccept --database "$VIBEJOBS_TEST_POSTGRES_URL"
//
// Each phase uses a schema of its own, dropped at the end.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vibejobs/vibejobs/contract"
	"github.com/vibejobs/vibejobs/receiver"
	"github.com/vibejobs/vibejobs/receiver/internal/pgtest"
	"github.com/vibejobs/vibejobs/receiver/pgstore"
)

const secret = "vjs_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"

func main() {
	dbURL := flag.String("database", os.Getenv(pgtest.EnvURL), "PostgreSQL URL")
	clients := flag.Int("clients", 32, "concurrent clients")
	poolSize := flag.Int("pool", 0, "connection pool size (default: clients)")
	duration := flag.Duration("duration", 10*time.Second, "measured time per phase")
	warmup := flag.Duration("warmup", 2*time.Second, "unmeasured time before each phase")
	rounds := flag.Int("rounds", 3, "rounds of (handler, pgbench)")
	pgbench := flag.String("pgbench", "", "pgbench binary (default: from PATH or /usr/lib/postgresql/*/bin)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the handler phases")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if *dbURL == "" {
		log.Fatalf("set --database or %s", pgtest.EnvURL)
	}
	ctx := context.Background()

	// Alternate the phases so that both see the same machine load.
	var ratios []float64
	for round := 1; round <= *rounds; round++ {
		rate, err := benchHandler(ctx, *dbURL, *clients, *poolSize, *warmup, *duration)
		if err != nil {
			log.Fatal(err)
		}
		tps, err := benchPgbench(ctx, *dbURL, *pgbench, *clients, *duration)
		if err != nil {
			log.Fatal(err)
		}
		ratios = append(ratios, rate/tps)
		fmt.Printf("round %d: receiver handler %.0f accepted deliveries/s, pgbench one-row INSERT %.0f tps (%d clients, %v): ratio %.2f\n",
			round, rate, tps, *clients, *duration, rate/tps)
	}
	slices.Sort(ratios)
	defer fmt.Printf("median ratio: %.2f (target >= 0.5)\n", ratios[len(ratios)/2])
}

func benchHandler(ctx context.Context, base string, clients, poolSize int, warmup, duration time.Duration) (float64, error) {
	dsn, drop, err := pgtest.Schema(ctx, base)
	if err != nil {
		return 0, err
	}
	defer drop()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return 0, err
	}
	cfg.MaxConns = int32(clients)
	if poolSize > 0 {
		cfg.MaxConns = int32(poolSize)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	store := pgstore.New(pool)
	if err := store.Migrate(ctx); err != nil {
		return 0, err
	}
	v, err := receiver.NewVerifier(receiver.Secrets{Current: secret}, nil)
	if err != nil {
		return 0, err
	}
	h, err := receiver.NewHandler(receiver.Config{Verifier: v, Logger: slog.New(slog.DiscardHandler)}, store)
	if err != nil {
		return 0, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 15 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()

	url := "http://" + ln.Addr().String() + "/"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}}
	var seq, accepted atomic.Int64
	var measuring atomic.Bool
	stop := make(chan struct{})
	errs := make(chan error, clients)
	scheduled := time.Now().UTC().Truncate(time.Millisecond)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				body := contract.Body(contract.Payload{
					JobID: "job_bench", RunID: "run_" + strconv.FormatInt(seq.Add(1), 10),
					ScheduledFor: scheduled, Attempt: 1, Trigger: contract.TriggerSchedule,
				})
				req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
				req.Header.Set("Content-Type", contract.ContentType)
				req.Header.Set(contract.HeaderCallerKind, contract.CallerKindSchedule)
				req.Header.Set(contract.HeaderSignature, contract.Sign(secret, time.Now().Unix(), body))
				resp, err := client.Do(req)
				if err != nil {
					errs <- err
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted {
					errs <- fmt.Errorf("status %d", resp.StatusCode)
					return
				}
				if measuring.Load() {
					accepted.Add(1)
				}
			}
		})
	}
	time.Sleep(warmup)
	measuring.Store(true)
	start := time.Now()
	select {
	case err = <-errs:
	case <-time.After(duration):
	}
	measuring.Store(false)
	elapsed := time.Since(start)
	n := accepted.Load()
	close(stop)
	wg.Wait()
	if err != nil {
		return 0, err
	}
	var items int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM job_outbox`).Scan(&items); err != nil {
		return 0, err
	}
	if items != seq.Load() {
		return 0, fmt.Errorf("%d outbox items for %d deliveries", items, seq.Load())
	}
	return float64(n) / elapsed.Seconds(), nil
}

var tpsRE = regexp.MustCompile(`tps = ([0-9.]+)`)

func benchPgbench(ctx context.Context, base, bin string, clients int, duration time.Duration) (float64, error) {
	if bin == "" {
		if p, err := exec.LookPath("pgbench"); err == nil {
			bin = p
		} else if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pgbench"); len(m) > 0 {
			bin = m[len(m)-1]
		} else {
			return 0, fmt.Errorf("pgbench not found")
		}
	}
	dsn, drop, err := pgtest.Schema(ctx, base)
	if err != nil {
		return 0, err
	}
	defer drop()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	var schema string
	if err := conn.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return 0, err
	}
	table := pgx.Identifier{schema, "bench_insert"}.Sanitize()
	_, err = conn.Exec(ctx, `CREATE TABLE `+table+` (id bigserial PRIMARY KEY, payload jsonb NOT NULL)`)
	conn.Close(ctx)
	if err != nil {
		return 0, err
	}
	script := filepath.Join(os.TempDir(), fmt.Sprintf("benchaccept-%d.sql", os.Getpid()))
	if err := os.WriteFile(script, []byte(`INSERT INTO `+table+` (payload) VALUES ('{}');`+"\n"), 0o600); err != nil {
		return 0, err
	}
	defer os.Remove(script)
	run := func(d time.Duration) (float64, error) {
		out, err := exec.CommandContext(ctx, bin, "-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", "2",
			"-T", strconv.Itoa(max(1, int(d.Seconds()))), "-f", script, base).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("pgbench: %v\n%s", err, out)
		}
		m := tpsRE.FindSubmatch(out)
		if m == nil {
			return 0, fmt.Errorf("pgbench output without tps:\n%s", out)
		}
		return strconv.ParseFloat(string(m[1]), 64)
	}
	// pgbench reports TPS without its connection time; no warm-up needed.
	return run(duration)
}
