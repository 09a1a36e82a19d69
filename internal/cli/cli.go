// Package cli is the command-line client of the management API: "vibejobs
// jobs|runs|events|subscriptions|projects|tokens …" in the platform's binary. Every command sends
// one logical operation, with a fresh Idempotency-Key for a POST that it
// reuses on its own retries.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/display"
)

// UsageError is a command line, or a variable (VIBEJOBS_SERVER,
// VIBEJOBS_TOKEN), that the command cannot use as it is: the command
// printed its usage; the process should exit with status 2. A failure of
// the work, a token file's content included, is no UsageError (status 1).
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

func usagef(format string, args ...any) error { return &UsageError{Msg: fmt.Sprintf(format, args...)} }

// Defaults of the global flags.
const (
	DefaultServer  = "http://127.0.0.1:8080"
	tokenFileName  = "admin.token"
	defaultDataDir = "vibejobs-data"
)

// Run runs one command; args start at the resource ("jobs", "create", …).
// Results go to stdout; usage goes to stderr; text from the server is
// escaped where it holds control, bidi or invalid bytes (see display.Escape),
// except in --json output. Run does not print the error it returns: the
// caller prints "error: " and the error (for an API error, "<code>: <message>
// (field)") and exits with 2 for a *UsageError, 1 otherwise. The error's text
// is safe to print on a terminal; errors.As still finds the *UsageError or
// *APIError under it.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return run(ctx, args, os.Getenv, stdout, stderr, nil)
}

// env is what a command needs around it.
type env struct {
	getenv         func(string) string
	stdout, stderr io.Writer
	// newClient builds the API client; tests replace the sleep of retries.
	tune func(*client)
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, tune func(*client)) error {
	err := dispatch(ctx, args, &env{getenv: getenv, stdout: stdout, stderr: stderr, tune: tune})
	if err != nil && display.Escape(err.Error()) != err.Error() {
		return &printableError{err}
	}
	return err
}

// printableError shows an error whose text holds what a terminal would act
// on (an API error's message, say) through display.Escape.
type printableError struct{ err error }

func (e *printableError) Error() string { return display.Escape(e.err.Error()) }
func (e *printableError) Unwrap() error { return e.err }

// dispatch finds the command of args and runs it.
func dispatch(ctx context.Context, args []string, e *env) error {
	stdout, stderr := e.stdout, e.stderr
	if len(args) == 0 {
		fmt.Fprint(stderr, topUsage)
		return usagef("name a resource: jobs, runs, events, subscriptions, projects or tokens")
	}
	if args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stdout, topUsage)
		return nil
	}
	verbs, ok := resources[args[0]]
	if !ok {
		fmt.Fprint(stderr, topUsage)
		return usagef("unknown command %q", args[0])
	}
	if len(args) < 2 || args[1] == "-h" || args[1] == "--help" || args[1] == "help" {
		fmt.Fprint(stderr, resourceUsage(args[0], verbs))
		if len(args) >= 2 {
			return nil
		}
		return usagef("name a verb for %s", args[0])
	}
	cmd, ok := verbs[args[1]]
	if !ok {
		fmt.Fprint(stderr, resourceUsage(args[0], verbs))
		return usagef("unknown verb %q for %s", args[1], args[0])
	}
	return e.runCommand(ctx, args[0]+" "+args[1], cmd, args[2:])
}

// command is one verb of a resource.
type command struct {
	args    string // positional arguments, for the usage line
	summary string
	npos    int // number of positional arguments
	// post is set on the commands that send a POST, which carries
	// --idempotency-key (or a fresh key); the others refuse that flag.
	post  bool
	flags func(fs *flag.FlagSet) func(c *call) error
}

// call is one parsed command on its way to the API.
type call struct {
	*env
	ctx    context.Context
	client *client
	json   bool
	key    string // --idempotency-key, or a fresh one
	pos    []string
	set    map[string]bool // flags given on the command line
}

// globalFlags are accepted by every command, before or after its
// arguments; --idempotency-key only by the commands that POST.
type globalFlags struct {
	server, token, tokenFile, key string
	json                          bool
}

// register defines the flags on fs. A command that sends no POST parses
// --idempotency-key too, to refuse it by name, but does not list it (see
// printFlags): it would send the key nowhere.
func (g *globalFlags) register(fs *flag.FlagSet, post bool) {
	fs.StringVar(&g.server, "server", "", "API server `URL` (env VIBEJOBS_SERVER, default "+DefaultServer+")")
	fs.StringVar(&g.token, "token", "", "API `token` (else env VIBEJOBS_TOKEN, else the token file)")
	fs.StringVar(&g.tokenFile, "token-file", "", "`file` holding the token (default $VIBEJOBS_DATA_DIR/admin.token or ./vibejobs-data/admin.token)")
	fs.BoolVar(&g.json, "json", false, "print the API's JSON instead of a table")
	keyUsage := ""
	if post {
		keyUsage = "Idempotency-Key of the POST, sent again on its retries (default: a fresh random one)"
	}
	fs.StringVar(&g.key, "idempotency-key", "", keyUsage)
}

func (e *env) runCommand(ctx context.Context, name string, cmd command, args []string) error {
	fs := flag.NewFlagSet("vibejobs "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var g globalFlags
	g.register(fs, cmd.post)
	exec := cmd.flags(fs)
	usage := func() {
		fmt.Fprintf(e.stderr, "Usage: vibejobs %s %s[flags]\n\n%s\n\nFlags:\n", name, cmd.args, cmd.summary)
		printFlags(e.stderr, fs)
	}
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		usage()
		return nil
	}
	if err != nil {
		usage()
		return usagef("%v", err)
	}
	if len(pos) != cmd.npos {
		usage()
		if len(pos) < cmd.npos {
			return usagef("vibejobs %s needs %s", name, strings.TrimSpace(cmd.args))
		}
		return usagef("unexpected argument %q", pos[cmd.npos])
	}
	c := &call{env: e, ctx: ctx, json: g.json, key: g.key, pos: pos, set: map[string]bool{}}
	fs.Visit(func(f *flag.Flag) { c.set[f.Name] = true })
	if c.set["idempotency-key"] && !cmd.post {
		usage()
		return usagef("vibejobs %s sends no POST, so it takes no --idempotency-key (only the commands that POST send one)", name)
	}
	if c.set["idempotency-key"] && !vibejobs.ValidIdempotencyKey(c.key) {
		usage()
		return usagef("--idempotency-key must be 1 to 255 printable ASCII characters, without spaces or control characters")
	}
	if c.key == "" {
		c.key = newIdempotencyKey()
	}
	// Given empty (an unset shell variable), they would fall back to the
	// environment, the token file or the default server: another token,
	// the installation's own in the data directory, or another server
	// than the one the command line meant.
	for _, f := range []struct {
		name, value string
	}{{"server", g.server}, {"token", g.token}, {"token-file", g.tokenFile}} {
		if c.set[f.name] && f.value == "" {
			usage()
			return usagef("--%s is empty (an unset shell variable?): give it a value, or leave it out", f.name)
		}
	}
	base, err := e.serverURL(g.server)
	if err != nil {
		usage()
		return err
	}
	token, err := e.resolveToken(g)
	if err != nil {
		var ue *UsageError
		if errors.As(err, &ue) {
			usage()
		}
		return err
	}
	c.client = &client{base: base, token: token, retries: 3, sleep: sleepCtx, http: &http.Client{
		Timeout: 60 * time.Second,
		// The API never redirects a request it serves; a redirect comes
		// from a path it cleaned (an id of "." or ".."), and following it
		// would read another resource, or turn a POST into a GET.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
	if e.tune != nil {
		e.tune(c.client)
	}
	if err := exec(c); err != nil {
		var ue *UsageError
		if errors.As(err, &ue) {
			usage()
		}
		return err
	}
	return nil
}

// parseInterleaved parses flags placed before, between and after the
// positional arguments; everything after "--" is positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var tail []string
	for i, a := range args {
		if a == "--" {
			args, tail = args[:i], args[i+1:]
			break
		}
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	return append(pos, tail...), nil
}

func (e *env) serverURL(flagValue string) (string, error) {
	s, from := flagValue, "--server"
	if s == "" {
		s, from = e.getenv("VIBEJOBS_SERVER"), "VIBEJOBS_SERVER"
	}
	if s == "" {
		s = DefaultServer
	}
	// Paths are appended to the URL: after a query or a fragment they
	// would name no API route, and every command would ask for "/".
	// Not quoted: it may hold a password.
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		strings.ContainsAny(s, "?#") {
		return "", usagef("%s must be an http(s) URL such as %s, without a user, query or fragment", from, DefaultServer)
	}
	return strings.TrimRight(s, "/"), nil
}

// hasControl reports whether s holds a C0 control character or DEL (a
// newline pasted with a token, say): net/http refuses to send all but a
// tab in a header, and no token holds one.
func hasControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// resolveToken takes --token, else VIBEJOBS_TOKEN, else the token file. A
// token holding a control character cannot be sent: it is refused before
// any request, naming where it came from (for --token and VIBEJOBS_TOKEN,
// settings wrong in themselves, a *UsageError; for the token file, not).
func (e *env) resolveToken(g globalFlags) (string, error) {
	if g.token != "" {
		if hasControl(g.token) {
			return "", usagef("--token holds a control character (a newline pasted with it?): give the token alone")
		}
		return g.token, nil
	}
	if t := strings.TrimSpace(e.getenv("VIBEJOBS_TOKEN")); t != "" {
		if hasControl(t) {
			return "", usagef("VIBEJOBS_TOKEN holds a control character: it must hold the token alone")
		}
		return t, nil
	}
	path := g.tokenFile
	if path == "" {
		dir := e.getenv("VIBEJOBS_DATA_DIR")
		if dir == "" {
			dir = defaultDataDir
		}
		path = filepath.Join(dir, tokenFileName)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("no API token: give --token, set VIBEJOBS_TOKEN or put it in %s (%v)", path, errors.Unwrap(err))
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("no API token: %s is empty", path)
	}
	if hasControl(t) {
		return "", fmt.Errorf("%s holds a control character: it must hold the token alone", path)
	}
	return t, nil
}

const topUsage = `Usage: vibejobs <resource> <verb> [arguments] [flags]

  jobs           create|list|get|update|pause|resume|delete|trigger|rotate-secret|next
  runs           list|get
  events         tail
  subscriptions  create|list|get|update|delete|rotate-secret|reset
  projects       create|list
  tokens         create|list|revoke

Every command takes --server, --token, --token-file and --json; those that
POST take --idempotency-key too.
"vibejobs <resource> <verb> -h" describes a command.
`

func resourceUsage(resource string, verbs map[string]command) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: vibejobs %s <verb> [arguments] [flags]\n\n", resource)
	names := make([]string, 0, len(verbs))
	for n := range verbs {
		names = append(names, n)
	}
	sort.Strings(names)
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	for _, n := range names {
		fmt.Fprintf(tw, "  %s %s\t%s\n", n, verbs[n].args, verbs[n].summary)
	}
	tw.Flush()
	b.WriteString("\n\"vibejobs " + resource + " <verb> -h\" describes a verb.\n")
	return b.String()
}

// printFlags lists the flags of fs in the "--name" form the usage lines
// use, but for those without a usage text: flags parsed only to be refused.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		if f.Usage == "" {
			return
		}
		arg, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if arg != "" {
			line += " " + arg
		}
		fmt.Fprintf(w, "%s\n        %s\n", line, usage)
	})
}
