// Package procstat reads what the benchmarks report about processes on
// this machine from /proc (Linux): CPU time and peak resident memory.
// Elsewhere, or for a process that is gone, it reports zero or "unknown".
package procstat

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// CPU is the user and system CPU time of process pid, in 10 ms ticks
// (USER_HZ).
func CPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name, in parentheses, may hold spaces: the fields
	// counted here start after it, with the state (field 3).
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * time.Second / 100
}

// PostgresCPU is the CPU time of every process named postgres on this
// machine: the database server of a loopback benchmark.
func PostgresCPU() time.Duration {
	dirs, _ := os.ReadDir("/proc")
	var sum time.Duration
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(comm)) == "postgres" {
			sum += CPU(pid)
		}
	}
	return sum
}

// PeakRSS is the peak resident set of process pid (VmHWM), as /proc
// writes it ("38212 kB").
func PeakRSS(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}
