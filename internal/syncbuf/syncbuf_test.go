package syncbuf_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/vibejobs/vibejobs/internal/syncbuf"
)

// TestConcurrentWrites: every line written at once is kept whole (run with
// -race, which also checks the locking).
func TestConcurrentWrites(t *testing.T) {
	var b syncbuf.Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("line\n"))
			}
		})
	}
	wg.Wait()
	if got := strings.Count(b.String(), "line\n"); got != 800 {
		t.Fatalf("%d lines, want 800", got)
	}
}
