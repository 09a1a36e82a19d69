//go:build !linux

package postgres

import "syscall"

// setUserTimeout does nothing where TCP_USER_TIMEOUT is not known: the
// keepalive probes remain (see dialer).
func setUserTimeout(string, string, syscall.RawConn) error { return nil }
