//go:build unix

package egress_test

import (
	"syscall"
	"time"
)

// processCPUTime is the user+system CPU time of the whole test process (client
// and loopback server alike). On a shared machine it varies less than wall time.
func processCPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
