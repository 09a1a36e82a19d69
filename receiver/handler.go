package receiver

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vibejobs/vibejobs/contract"
)

// Config configures [NewHandler] and [NewMiddleware].
type Config struct {
	// Verifier checks signatures. Required.
	Verifier *Verifier
	// JobIDs, when not empty, is the set of job ids the app expects; a verified
	// body naming another job is answered 400 {"error":"unexpected_job"},
	// before anything is stored.
	//
	// 400 is deliberate. The platform retries every answer but 2xx, 401 and
	// 403 while attempts and the run's lifetime remain, and fails the run for
	// good on 401 or 403; the contract keeps 401 for a bad signature or
	// caller and answers an invalid payload, which includes a job id the app
	// does not expect, with 400. A validly signed delivery for an unexpected
	// job means this list and the job secret disagree, which is a
	// configuration fault an operator can fix before the next attempt; the
	// owner sees the answer's body in the attempt history. To refuse a job
	// for good, delete it on the platform (which cancels its pending runs),
	// or leave JobIDs empty and answer 403 from a handler behind
	// [NewMiddleware].
	JobIDs []string
	// BodyReadTimeout, when positive, bounds reading the body of one request by
	// setting the connection's read deadline (through http.ResponseController)
	// while the handler reads it. A ResponseWriter that does not lead to the
	// connection (a middleware's wrapper without an Unwrap method) leaves
	// nothing to set it on: the handler then logs a warning, once, and the
	// server's ReadTimeout alone bounds the body (a read cannot be cut
	// otherwise, and the handler must not leave one running after it
	// returns). Give such wrappers Unwrap. When zero, the server's
	// ReadTimeout alone governs slow bodies, and a server without one waits
	// for a stalled client for as long as the connection stays open: set
	// ReadHeaderTimeout and ReadTimeout on the http.Server in any case.
	// Negative is an error.
	BodyReadTimeout time.Duration
	// AcceptTimeout (NewHandler only) bounds the store's acceptance of one
	// verified delivery: waiting for a connection, the transaction and its
	// commit. Zero means DefaultAcceptTimeout. The acceptance runs under a
	// context detached from the request's cancellation, so this is its only
	// deadline.
	AcceptTimeout time.Duration
	// Logger receives one line per delivery the Handler answers, with the run
	// id once the body is verified and valid, never the secret, the signature
	// or the body. A verified delivery that a handler made by NewMiddleware
	// passes to next is answered, and logged, by next. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// DefaultAcceptTimeout is the default Config.AcceptTimeout: the longest
// attempt timeout the platform allows. A store slower than that is treated as
// unavailable (503), and the platform retries.
const DefaultAcceptTimeout = 30 * time.Second

// Handler answers deliveries. Make it with [NewHandler] or [NewMiddleware].
// A Handler made otherwise (a zero Handler, a nil *Handler) has nothing to
// verify against and nowhere to pass a delivery: it answers every request 500
// {"error":"handler_not_configured"}, which the platform retries, before
// reading the body, and logs why through slog.Default().
type Handler struct {
	verifier      *Verifier
	jobIDs        map[string]struct{}
	bodyTimeout   time.Duration
	acceptTimeout time.Duration
	log           *slog.Logger
	// noDeadline logs, once, that BodyReadTimeout could not be set.
	noDeadline sync.Once
	store      Store        // set by NewHandler
	next       http.Handler // set by NewMiddleware
}

func newHandler(cfg Config) (*Handler, error) {
	if cfg.Verifier == nil {
		return nil, errors.New("receiver: Config.Verifier is required")
	}
	if cfg.AcceptTimeout < 0 {
		return nil, errors.New("receiver: Config.AcceptTimeout is negative")
	}
	if cfg.BodyReadTimeout < 0 {
		return nil, errors.New("receiver: Config.BodyReadTimeout is negative")
	}
	h := &Handler{
		verifier:      cfg.Verifier,
		bodyTimeout:   cfg.BodyReadTimeout,
		acceptTimeout: cmp.Or(cfg.AcceptTimeout, DefaultAcceptTimeout),
		log:           cmp.Or(cfg.Logger, slog.Default()),
	}
	if len(cfg.JobIDs) > 0 {
		h.jobIDs = make(map[string]struct{}, len(cfg.JobIDs))
		for _, id := range cfg.JobIDs {
			if !contract.ValidID(id, "job_") {
				return nil, errors.New("receiver: Config.JobIDs holds a value that is not a job id")
			}
			h.jobIDs[id] = struct{}{}
		}
	}
	return h, nil
}

// NewHandler returns the handler that receives deliveries and accepts them
// durably through store. For each POST it, in this order:
//
//  1. requires exactly one Content-Type header whose media type is the one the
//     platform sends, application/json (compared without regard to ASCII case,
//     parameters allowed, but a charset, if given, must be utf-8): 415
//     otherwise, before a byte of the body is read (closing an HTTP/1.x
//     connection, as for 413). The platform retries a 415, so a proxy that
//     rewrites the header can be fixed before the run's attempts run out.
//     Likewise a Content-Encoding naming any coding but identity (gzip added
//     by a proxy, say) is answered 415 with Accept-Encoding: identity (RFC
//     7694), not the 401 its changed bytes would earn, which would fail the
//     run for good;
//  2. reads the raw body through the 64 KiB bound before any parsing: 413 beyond
//     it (at once when Content-Length announces more), closing an HTTP/1.x
//     connection rather than reading the rest;
//  3. requires exactly one physical X-Vibe-Caller-Kind line with the value
//     "schedule" and exactly one physical Vibe-Signature line, and verifies the
//     signature: 401 otherwise; but 503 while the Verifier holds no secret
//     yet (a zero Verifier before SetSecrets), since the platform takes 401
//     as a refusal for good and would fail the run;
//  4. validates the body with [ValidatePayload] and the job id against
//     Config.JobIDs: 400 otherwise;
//  5. calls store.Accept with the run id and the raw body and answers with the
//     stored response, which is 202 {"accepted":true} for the first and every
//     repeated delivery of a run. A store error is answered 503, a stored
//     response that is not 2xx 500: never 2xx without a commit.
//
// Other methods get 405.
//
// Once a delivery is verified and valid, its acceptance does not depend on the
// request's context: the store gets a context that keeps the request's values
// but not its cancellation, bounded by Config.AcceptTimeout. A client that
// disconnects, an HTTP/2 stream reset or a deadline set by middleware such as
// http.TimeoutHandler therefore neither rolls back nor cuts short a commit
// that the app has started; when the answer cannot reach the platform, its
// retry finds the receipt and gets the stored 2xx.
func NewHandler(cfg Config, store Store) (*Handler, error) {
	if store == nil {
		return nil, errors.New("receiver: a Store is required")
	}
	h, err := newHandler(cfg)
	if err != nil {
		return nil, err
	}
	h.store = store
	return h, nil
}

// NewMiddleware returns a handler that does steps 1–4 of [NewHandler] and then
// calls next with the verified request: its Body rereads the exact raw bytes
// and [PayloadFromContext] returns the parsed payload. next is responsible for
// durable deduplication on the run id, and should commit it under a context
// detached from the request's cancellation (context.WithoutCancel with its own
// timeout), as NewHandler does, so that a client leaving mid-commit does not
// cut short work the app has started.
func NewMiddleware(cfg Config, next http.Handler) (*Handler, error) {
	if next == nil {
		return nil, errors.New("receiver: a next handler is required")
	}
	h, err := newHandler(cfg)
	if err != nil {
		return nil, err
	}
	h.next = next
	return h, nil
}

type payloadKey struct{}

// PayloadFromContext returns the verified payload that a handler made by
// [NewMiddleware] stored in the request's context.
func PayloadFromContext(ctx context.Context) (contract.Payload, bool) {
	p, ok := ctx.Value(payloadKey{}).(contract.Payload)
	return p, ok
}

var (
	errBodyTooLarge    = errors.New("receiver: body larger than 64 KiB")
	errBodyConnection  = errors.New("receiver: the connection failed or timed out while the body was read")
	errNoSecret        = errors.New("receiver: no secret configured: the Verifier has none yet (SetSecrets)")
	errContentType     = errors.New("receiver: Content-Type is not a single application/json header")
	errContentEncoding = errors.New("receiver: Content-Encoding names a coding other than identity")
	errNotConfigured   = errors.New("receiver: the Handler was not made by NewHandler or NewMiddleware")
)

// configured reports whether h was made by NewHandler or NewMiddleware, which
// set its Verifier, its logger, and its store or next handler.
func (h *Handler) configured() bool {
	return h != nil && h.verifier != nil && h.log != nil && (h.store != nil || h.next != nil)
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.configured() {
		// A programming fault, not this delivery's: 500, which the platform
		// retries, where a panic would cost a dropped connection per
		// delivery. Not 503, which this handler keeps for a receiver that
		// becomes able to accept without a new build (a Verifier awaiting
		// SetSecrets, a store that comes back). Nothing of the request is
		// read or trusted.
		closeUnreadBody(w, r)
		slog.Default().LogAttrs(r.Context(), slog.LevelError, "delivery rejected",
			slog.Int("status", http.StatusInternalServerError), slog.String("reason", "handler_not_configured"),
			slog.String("remote", r.RemoteAddr), slog.String("error", errNotConfigured.Error()))
		writeJSON(w, http.StatusInternalServerError, `{"error":"handler_not_configured"}`)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		h.reject(w, r, http.StatusMethodNotAllowed, "method_not_allowed", "", nil)
		return
	}
	if !jsonContentType(r.Header) {
		closeUnreadBody(w, r)
		h.reject(w, r, http.StatusUnsupportedMediaType, "unsupported_media_type", "", errContentType)
		return
	}
	if !identityContentEncoding(r.Header) {
		// RFC 7694 §3: name the codings this receiver takes.
		w.Header().Set("Accept-Encoding", "identity")
		closeUnreadBody(w, r)
		h.reject(w, r, http.StatusUnsupportedMediaType, "unsupported_media_type", "", errContentEncoding)
		return
	}
	body, err := h.readBody(w, r)
	switch {
	case err == nil:
	case errors.Is(err, errBodyTooLarge):
		closeUnreadBody(w, r)
		h.reject(w, r, http.StatusRequestEntityTooLarge, "body_too_large", "", nil)
		return
	default:
		// Always answer, even when the client seems gone: returning without a
		// status would make net/http send 200.
		status, code := http.StatusBadRequest, "body_unreadable"
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			status, code = http.StatusRequestTimeout, "body_timeout"
		}
		if _, ok := errors.AsType[*net.OpError](err); ok {
			// Not its text, which names this receiver's address (the
			// job URL's host and port) and the peer's.
			err = errBodyConnection
		}
		h.reject(w, r, status, code, "", err)
		return
	}
	if !h.verifier.hasSecret() {
		// Nothing to verify against: not a refusal of this delivery, which
		// the platform would take as final, but a receiver not ready yet.
		h.reject(w, r, http.StatusServiceUnavailable, "unavailable", "", errNoSecret)
		return
	}
	if err := h.verifier.VerifyHeaders(r.Header, body); err != nil {
		h.reject(w, r, http.StatusUnauthorized, "unauthorized", "", err)
		return
	}
	p, err := ValidatePayload(body)
	if err != nil {
		field := ""
		if pe, ok := errors.AsType[*PayloadError](err); ok {
			field = pe.Field
		}
		h.reject(w, r, http.StatusBadRequest, "invalid_payload", field, err)
		return
	}
	if h.jobIDs != nil {
		if _, ok := h.jobIDs[p.JobID]; !ok {
			h.reject(w, r, http.StatusBadRequest, "unexpected_job", "jobId", nil)
			return
		}
	}
	if h.next != nil {
		r2 := r.WithContext(context.WithValue(r.Context(), payloadKey{}, p))
		r2.Body = io.NopCloser(bytes.NewReader(body))
		r2.ContentLength = int64(len(body))
		h.next.ServeHTTP(w, r2)
		return
	}
	h.accept(w, r, p, body)
}

// closeUnreadBody makes an answer given before the body was read (or read
// whole) the connection's last on HTTP/1.x. Without it net/http reads and
// discards up to 256 KiB of the unread body before answering on a connection
// it keeps, so the refusal would wait for a body it does not need, or for a
// timeout when the client waits for the answer first. http.MaxBytesReader
// does the same when it trips. (On HTTP/2 the header would shut down every
// stream of the connection.)
func closeUnreadBody(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
}

// jsonContentType reports whether h holds exactly one Content-Type value,
// under any ASCII case of the name, with the media type application/json in
// any ASCII case (RFC 9110 §8.3.1) and, if it names a charset, utf-8: the
// contract's body is UTF-8 JSON. Other parameters are allowed.
func jsonContentType(h http.Header) bool {
	v, n := headerLines(h, "Content-Type")
	if n != 1 {
		return false
	}
	base, _, _ := strings.Cut(v, ";")
	if !asciiEqualFold(strings.Trim(base, " \t"), contract.ContentType) {
		return false
	}
	_, params, err := mime.ParseMediaType(v)
	if err != nil {
		return false
	}
	charset, ok := params["charset"]
	return !ok || asciiEqualFold(charset, "utf-8")
}

// identityContentEncoding reports whether the body in h is sent as it is: no
// Content-Encoding header, or one whose codings, on any number of lines, are
// all "identity" (any ASCII case; empty list elements are ignored, RFC 9110
// §5.6.1). The signature covers the body's own bytes, which a coding (gzip
// added by a proxy) would change: verifying them would fail, and answering
// that 401 would make the platform fail the run for good, where the 415 of an
// unsupported coding (RFC 7694) is retried.
func identityContentEncoding(h http.Header) bool {
	for v := range headerValues(h, "Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.Trim(c, " \t"); c != "" && !asciiEqualFold(c, "identity") {
				return false
			}
		}
	}
	return true
}

func (h *Handler) accept(w http.ResponseWriter, r *http.Request, p contract.Payload, body []byte) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.acceptTimeout)
	defer cancel()
	status, resp, err := h.store.Accept(ctx, p.RunID, body)
	if err != nil {
		h.log.LogAttrs(ctx, slog.LevelError, "delivery not accepted: store failed",
			slog.String("run_id", p.RunID), slog.Int("status", http.StatusServiceUnavailable), slog.String("error", err.Error()))
		writeJSON(w, http.StatusServiceUnavailable, `{"error":"unavailable"}`)
		return
	}
	if status < 200 || status > 299 {
		h.log.LogAttrs(ctx, slog.LevelError, "delivery not accepted: stored response is not 2xx",
			slog.String("run_id", p.RunID), slog.Int("stored_status", status))
		writeJSON(w, http.StatusInternalServerError, `{"error":"internal"}`)
		return
	}
	h.log.LogAttrs(ctx, slog.LevelInfo, "delivery accepted",
		slog.String("run_id", p.RunID), slog.String("job_id", p.JobID), slog.Int("attempt", p.Attempt), slog.Int("status", status))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(resp)))
	w.WriteHeader(status)
	w.Write(resp)
}

// readBody reads the whole body, at most contract.MaxBodyBytes.
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request) (_ []byte, err error) {
	if r.ContentLength > contract.MaxBodyBytes {
		return nil, errBodyTooLarge
	}
	if h.bodyTimeout > 0 {
		rc := http.NewResponseController(w)
		if derr := rc.SetReadDeadline(time.Now().Add(h.bodyTimeout)); derr != nil {
			h.noDeadline.Do(func() {
				h.log.LogAttrs(r.Context(), slog.LevelWarn,
					"BodyReadTimeout not applied: the ResponseWriter does not lead to the connection (a wrapper without Unwrap?); the server's ReadTimeout alone bounds request bodies",
					slog.String("error", derr.Error()))
			})
		} else {
			// Once the body is in, lift the deadline: left in place it would
			// cut the server's background read and cancel the request's
			// context. After a failed read it must stay, or the server would
			// wait for the unread rest of the body before answering.
			defer func() {
				if err == nil {
					rc.SetReadDeadline(time.Time{})
				}
			}()
		}
	}
	size := 512
	if r.ContentLength >= 0 {
		size = int(r.ContentLength) + 1 // +1: room to see EOF without growing
	}
	buf := make([]byte, 0, size)
	if r.Body == nil {
		// Only a request built for a direct call has none (net/http's
		// server always sets one): an empty body.
		return buf, nil
	}
	body := http.MaxBytesReader(w, r.Body, contract.MaxBodyBytes)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		var n int
		n, err = body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, errBodyTooLarge
		}
		if err != nil {
			return nil, err
		}
	}
}

// reject answers a refused delivery and logs why. err must not carry request
// data; the errors of this package and of contract do not.
func (h *Handler) reject(w http.ResponseWriter, r *http.Request, status int, code, field string, err error) {
	attrs := []slog.Attr{slog.Int("status", status), slog.String("reason", code), slog.String("remote", r.RemoteAddr)}
	if err != nil {
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	h.log.LogAttrs(r.Context(), slog.LevelWarn, "delivery rejected", attrs...)
	body := `{"error":"` + code + `"}`
	if field != "" {
		body = `{"error":"` + code + `","field":"` + field + `"}`
	}
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	io.WriteString(w, body)
}
