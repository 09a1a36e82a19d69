package sqlitestore

// SetBusyRetryHook makes f run before each wait of Open's retry on
// SQLITE_BUSY and returns a function that removes it.
func SetBusyRetryHook(f func()) (restore func()) {
	old := busyRetryHook
	busyRetryHook = f
	return func() { busyRetryHook = old }
}
