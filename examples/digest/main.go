// Command digest is the daily-digest example app of the receiver SDK:
//
//	go run ./examples/digest --listen 127.0.0.1:9090 --secret-file F \
//		[--previous-secret-file F2] [--database sqlite-path-or-postgres-url] [--job-id job_…]
//
// It stops gracefully on SIGINT or SIGTERM. See package digestapp.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/vibejobs/vibejobs/examples/digest/digestapp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := digestapp.Run(ctx, os.Args[1:], os.Stdout); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "digest:", err)
		}
		os.Exit(2)
	}
}
