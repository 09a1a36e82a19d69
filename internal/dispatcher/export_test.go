package dispatcher

import "time"

// SetRetryWait replaces the record loop's pause between retries.
func SetRetryWait(d *Dispatcher, f func(attempt int) time.Duration) { d.retryWait = f }
