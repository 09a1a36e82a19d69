package main

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// ownsLocalPort reports whether process pid holds a TCP socket bound to
// local port port, read from /proc (Linux): the socket inodes among its
// file descriptors, matched against the kernel's TCP tables. ok is false
// when /proc cannot tell (another system, or the process is gone).
func ownsLocalPort(pid, port int) (owns, ok bool) {
	fds, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "fd", "*"))
	if err != nil || len(fds) == 0 {
		return false, false
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		if link, err := os.Readlink(fd); err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	read := false
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		read = true
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 {
				continue
			}
			_, hexPort, _ := strings.Cut(fields[1], ":")
			p, err := strconv.ParseUint(hexPort, 16, 16)
			if err == nil && int(p) == port && inodes[fields[9]] {
				f.Close()
				return true, true
			}
		}
		f.Close()
	}
	return false, read
}

// TestOwnsLocalPort: the kill of TestReplicasSurviveSIGKILL relies on
// ownsLocalPort telling this process's sockets from another's.
func TestOwnsLocalPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	owns, ok := ownsLocalPort(os.Getpid(), port)
	if !ok {
		t.Skip("/proc cannot tell which process holds a socket here")
	}
	if !owns {
		t.Errorf("this process does not own its listener's port %d", port)
	}
	if owns, _ := ownsLocalPort(os.Getppid(), port); owns {
		t.Errorf("the parent process owns this process's port %d", port)
	}
}
