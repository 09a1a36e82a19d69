package procstat

import (
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestCPUAndPeakRSSOfThisProcess: the figures of this very process grow
// with work it does, and a process that does not exist reads as nothing.
func TestCPUAndPeakRSSOfThisProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("procstat reads /proc")
	}
	before := CPU(os.Getpid())
	// Spin until the kernel has counted at least two more ticks.
	for start := time.Now(); CPU(os.Getpid()) < before+20*time.Millisecond; {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("CPU stayed at %v after 10 s of spinning", CPU(os.Getpid()))
		}
	}
	if rss := PeakRSS(os.Getpid()); !strings.HasSuffix(rss, " kB") {
		t.Errorf("PeakRSS = %q, want a figure in kB", rss)
	}
	if got := CPU(-1); got != 0 {
		t.Errorf("CPU of no process = %v, want 0", got)
	}
	if got := PeakRSS(-1); got != "unknown" {
		t.Errorf("PeakRSS of no process = %q, want unknown", got)
	}
}
