package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// APIError is an error answer of the API. Its text is "<code>: <message>
// (field)", so the command's "error: " prefix gives the documented form.
type APIError struct {
	Status  int
	Code    string
	Message string
	Field   string
}

func (e *APIError) Error() string {
	s := e.Code + ": " + e.Message
	if e.Field != "" {
		s += " (" + e.Field + ")"
	}
	return s
}

// client talks to one API server with one token.
type client struct {
	base  string
	token string
	http  *http.Client
	// retries is how many times a request is sent again after a connection
	// error, a 5xx, a 429 or a 409 idempotency_key_in_progress.
	retries int
	// sleep waits between attempts; tests replace it.
	sleep func(ctx context.Context, d time.Duration) error
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// maxRetryWait caps a server's Retry-After, so a command does not hang.
const maxRetryWait = 5 * time.Second

// newIdempotencyKey returns a fresh key for one logical operation.
func newIdempotencyKey() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("cli: reading random bytes: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// reply is a successful answer.
type reply struct {
	status int
	body   []byte
}

// do sends one logical operation: a POST carries key (one per operation,
// the same on every retry). It returns the answer of a 2xx, or an *APIError.
func (c *client) do(ctx context.Context, method, path string, body any, key string) (*reply, error) {
	// An id of "", "." or ".." would make a path the server's router
	// cleans or matches to no route: answered "no such route" or with a
	// redirect, not as the id it is.
	p, _, _ := strings.Cut(path, "?")
	for _, seg := range strings.Split(p, "/")[1:] {
		if seg == "" || seg == "." || seg == ".." {
			return nil, usagef("%q is not an id", seg)
		}
	}
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return nil, err
		}
	}
	var lastErr error
	unanswered := false // an attempt went out and no answer came back
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			wait := time.Duration(100<<attempt) * time.Millisecond // 200ms, 400ms, 800ms
			var ra *retryAfter
			if errors.As(lastErr, &ra) && ra.d > wait {
				wait = min(ra.d, maxRetryWait)
			}
			if err := c.sleep(ctx, wait); err != nil {
				return nil, lastErr
			}
		}
		rep, err, retry := c.once(ctx, method, path, payload, key)
		if err == nil {
			return rep, nil
		}
		// A DELETE carries no Idempotency-Key: when an earlier attempt's
		// answer was lost, "not found" is most likely its own work.
		var ae *APIError
		if method == http.MethodDelete && unanswered && errors.As(err, &ae) && ae.Status == http.StatusNotFound {
			return &reply{status: http.StatusNoContent}, nil
		}
		var oe *net.OpError
		if !errors.As(err, &ae) && !(errors.As(err, &oe) && oe.Op == "dial") {
			unanswered = true // a refused connection sent nothing
		}
		lastErr = err
		if !retry || attempt >= c.retries {
			var ra *retryAfter
			if errors.As(err, &ra) {
				return nil, ra.err
			}
			return nil, err
		}
	}
}

// retryAfter wraps a retryable answer with the wait the server asked for.
type retryAfter struct {
	err error
	d   time.Duration
}

func (r *retryAfter) Error() string { return r.err.Error() }
func (r *retryAfter) Unwrap() error { return r.err }

func (c *client) once(ctx context.Context, method, path string, payload []byte, key string) (rep *reply, err error, retry bool) {
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err, false
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "vibejobs-cli")
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err(), false
		}
		// The error names the server, never the token.
		return nil, fmt.Errorf("cannot reach the server at %s: %w", c.base, unwrapURLError(err)), true
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err), true
	}
	if resp.StatusCode < 300 {
		return &reply{status: resp.StatusCode, body: b}, nil, false
	}
	ae := &APIError{Status: resp.StatusCode}
	var eb struct {
		Error struct{ Code, Message, Field string }
	}
	if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
		ae.Code, ae.Message, ae.Field = eb.Error.Code, eb.Error.Message, eb.Error.Field
	} else {
		ae.Code, ae.Message = "http_"+strconv.Itoa(resp.StatusCode), strings.TrimSpace(http.StatusText(resp.StatusCode))
	}
	wait := time.Duration(0)
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		wait = time.Duration(s) * time.Second
	}
	retryable := resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests ||
		resp.StatusCode == http.StatusConflict && ae.Code == "idempotency_key_in_progress"
	return nil, &retryAfter{err: ae, d: wait}, retryable
}

// unwrapURLError drops the *url.Error wrapper, whose text repeats the method
// and URL.
func unwrapURLError(err error) error {
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) {
		if inner := ue.Unwrap(); inner != nil {
			return inner
		}
	}
	return err
}
