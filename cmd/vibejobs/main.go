// Command vibejobs is the platform server and its CLI in one binary.
//
//	vibejobs serve              run the platform (embedded SQLite by default)
//	vibejobs migrate            run the database migrations and exit
//	vibejobs master-key rotate  re-seal every stored secret under a new master key
//	vibejobs jobs|runs|events|subscriptions|projects|tokens …   talk to a running server's API
//	vibejobs bench …            benchmarks against loopback listeners it starts
//	vibejobs version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/vibejobs/vibejobs/internal/cli"
)

// Version is set at build time with -ldflags "-X main.Version=…".
var Version = "dev"

func main() {
	ctx, stop := signalContext()
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `vibejobs — scheduled jobs delivered as signed HTTPS requests

Usage:
  vibejobs serve [flags]        run the platform (see vibejobs serve -h)
  vibejobs migrate [flags]      run database migrations and exit
  vibejobs master-key rotate    re-seal every stored secret under a new master key
  vibejobs jobs <verb> …        create|list|get|update|pause|resume|delete|trigger|rotate-secret|next
  vibejobs runs <verb> …        list|get
  vibejobs events tail          follow the project's event feed
  vibejobs subscriptions <verb> …  create|list|get|update|delete|rotate-secret|reset
  vibejobs projects <verb> …    create|list
  vibejobs tokens <verb> …      create|list|revoke
  vibejobs bench <kind> …       burst|lateness|scale|events, against loopback listeners only
  vibejobs version
`

// run executes one command and returns the process exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(ctx, args[1:], getenv, stdout, stderr)
	case "migrate":
		err = migrate(ctx, args[1:], getenv, stdout, stderr)
	case "bench":
		err = bench(ctx, args[1:], stdout, stderr)
	case "master-key":
		err = masterKey(ctx, args[1:], getenv, stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, "vibejobs", Version)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		err = cli.Run(ctx, args, stdout, stderr)
	}
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0 // -h: the flag set printed the usage
	}
	printFailure(stderr, args[0], err)
	var ue *cli.UsageError
	if errors.As(err, &ue) || errors.Is(err, errUsage) {
		return 2
	}
	return 1
}

// printFailure prints err, the failure of command, on stderr: the line
// "error: …", or, for a command whose settings ask for JSON logs (see
// inLogFormat), a JSON record of level ERROR, message command.failed, with
// the command's name and the same text, so that a pipeline that reads the
// command's stderr as JSON reads why it stopped too.
func printFailure(stderr io.Writer, command string, err error) {
	var je jsonLogsError
	if errors.As(err, &je) {
		slog.New(slog.NewJSONHandler(stderr, nil)).Error("command.failed", "command", command, "error", err.Error())
		return
	}
	fmt.Fprintln(stderr, "error:", err)
}

// jsonLogsError is the failure of a command whose settings ask for JSON
// logs (see inLogFormat).
type jsonLogsError struct{ err error }

func (e jsonLogsError) Error() string { return e.err.Error() }
func (e jsonLogsError) Unwrap() error { return e.err }

// inLogFormat marks err, the failure of a command configured by c, for run
// to print as a JSON record when c asks for JSON logs: by its flag or its
// variable, in any case, as far as the command line was read (a flag that
// does not parse ends the reading; the flag package's own message about it
// is plain text). nil stays nil.
func inLogFormat(c *Config, err error) error {
	if err == nil || !c.jsonLogs() {
		return err
	}
	return jsonLogsError{err}
}

// errUsage marks the errors of a command line or an environment that is
// wrong in itself: a flag or an argument that does not parse, or a setting,
// from a flag or a variable, whose value is malformed or out of range. run
// exits with 2 for them, as the flag package does, and with 1 for every
// failure of the work itself, such as a file, a port or the database that
// a well-formed setting names and that fails when used.
var errUsage = errors.New("usage")

// inputError is a setting refused for its value (see errUsage), with the
// text of its cause alone.
type inputError struct{ err error }

func (e inputError) Error() string   { return e.err.Error() }
func (e inputError) Unwrap() []error { return []error{e.err, errUsage} }

// badInput marks err, a refused setting, as bad input; nil stays nil.
func badInput(err error) error {
	if err == nil {
		return nil
	}
	return inputError{err}
}

func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) (err error) {
	m := NewMain(stdout, stderr)
	defer func() { err = inLogFormat(&m.Config, err) }()
	if err := m.ParseFlags(args, getenv); err != nil {
		return err
	}
	if err := m.Run(ctx); err != nil {
		m.Close()
		return err
	}
	<-ctx.Done()
	return m.Close()
}

// signalContext returns a context that ends at the first SIGINT or SIGTERM
// (a graceful stop, see Main.Close: serve lets its attempts in flight
// finish), and stop to release it. From that signal on, a second one ends
// the process at once: both signals have their default effect again, and a
// SIGINT that was ignored when the process started (a shell starts a
// command run with & so, and Go then takes the first SIGINT only because it
// is asked for) ends it with status 130, as the default effect would.
// serve's stop waits up to a job's timeout for its attempts in flight, then
// up to dispatcher.DefaultStopRecordTimeout for outcomes the database does
// not take, DefaultDrainTimeout for API requests and
// DefaultHandlerExitTimeout for the handlers of those cut off, and an
// operator who would rather not wait must not need SIGKILL: the attempts
// cut off are sent again, under the same number, once their lease ends, as
// after a crash.
func signalContext() (ctx context.Context, stop context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	// Read before Notify: signal.Stop gives an inherited SIG_IGN back to
	// SIGINT, which would then drop the second one.
	intIgnored := signal.Ignored(os.Interrupt)
	stopped := make(chan struct{})
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case <-ch:
		case <-stopped:
		}
		if !intIgnored {
			signal.Stop(ch)
			cancel()
			return
		}
		signal.Reset(syscall.SIGTERM)
		cancel()
		select {
		case <-ch:
			os.Exit(128 + int(syscall.SIGINT))
		case <-stopped:
			signal.Stop(ch)
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() { close(stopped) })
		cancel()
	}
}
