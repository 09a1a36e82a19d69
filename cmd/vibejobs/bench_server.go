package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// benchServer is a "vibejobs serve" child process of a benchmark.
type benchServer struct {
	cmd  *exec.Cmd
	base string // http://127.0.0.1:port
}

// startBenchServer starts this binary's serve command on a free loopback
// port, on database with data directory dir (shared by replicas: master key
// and admin token), opened to loopback deliveries, and waits until it is
// ready. maxJobs raises the per-project limit; the rate limit is off.
func startBenchServer(ctx context.Context, dir, database string, maxJobs int) (*benchServer, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.CommandContext(ctx, self, "serve")
	cmd.Env = append(os.Environ(), "VIBEJOBS_LISTEN="+addr, "VIBEJOBS_DATA_DIR="+dir, "VIBEJOBS_DATABASE="+database,
		"VIBEJOBS_MAX_JOBS_PER_PROJECT="+strconv.Itoa(maxJobs), "VIBEJOBS_RATE_LIMIT=1000000",
		"VIBEJOBS_LOG_LEVEL=warn", "VIBEJOBS_ALLOW_PRIVATE=127.0.0.0/8")
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &benchServer{cmd: cmd, base: "http://" + addr}
	for i := 0; i < 600; i++ {
		if resp, err := http.Get(s.base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s, nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.stop()
	return nil, fmt.Errorf("server at %s never became ready", s.base)
}

// stop interrupts the server and waits for it.
func (s *benchServer) stop() {
	s.cmd.Process.Signal(os.Interrupt)
	s.cmd.Wait()
}

// adminToken reads the token the first server wrote to dir.
func adminToken(dir string) (string, error) {
	tok, err := os.ReadFile(filepath.Join(dir, "admin.token"))
	return strings.TrimSpace(string(tok)), err
}
