// Package egress is the only way the platform sends a request out: run
// deliveries now, event webhooks later. A job URL is chosen by a user and called
// again and again by the server, so without this package it would be a way into
// the network the platform runs in (cloud metadata, databases, admin panels).
//
// The package does three things:
//
//   - Policy decides which addresses may be reached: everything that is not a
//     public unicast address is forbidden unless the operator opens it with an
//     allow list of at most 32 CIDRs (VIBEJOBS_ALLOW_PRIVATE).
//   - Policy.ValidateURL checks a URL when a job is created or changed, so a URL
//     that can never be delivered is refused at once.
//   - Client.Post makes one delivery attempt: it resolves the name, refuses the
//     attempt if any returned address is forbidden, connects only to an address it
//     has checked (never resolving again), follows no redirect, ignores proxy
//     settings, always verifies certificates, bounds the whole attempt by one
//     budget and reads at most 4 KiB of the answer. It speaks HTTP/1.1 over a
//     keep-alive pool of its own (pool.go), not net/http's Transport.
//
// Nothing the package returns names the URL, the host or an address, so its
// results can be stored and logged as they are.
//
// It imports only the standard library.
package egress

import (
	"time"
)

// Error codes recorded per attempt (SEMANTICS.md section 2). Result.ErrorCode is
// one of them, or "" for a 2xx answer.
const (
	CodeBlocked  = "blocked"  // the URL or a resolved address is forbidden by the policy
	CodeDNS      = "dns"      // the name did not resolve
	CodeTimeout  = "timeout"  // the attempt budget ran out before the response headers
	CodeNetwork  = "network"  // refused, reset, closed or garbled connection
	CodeTLS      = "tls"      // handshake failed or the certificate was not accepted
	CodeRedirect = "redirect" // a 3xx answer: redirects are never followed
	CodeHTTP4xx  = "http_4xx" // a 4xx answer
	CodeHTTP5xx  = "http_5xx" // a 5xx answer, or a status outside 200–599

	// CodeInterrupted means the caller's context was canceled (shutdown) before
	// the attempt ended; it is not a verdict on the destination.
	CodeInterrupted = "interrupted"
)

// Limits of one attempt.
const (
	// DefaultTimeout is the attempt budget used when Post gets a timeout ≤ 0.
	DefaultTimeout = 10 * time.Second
	// MaxResponseRead is the most of a response body Post reads.
	MaxResponseRead = 4 << 10
	// SnippetSize is the most of a response body kept in Result.Snippet.
	SnippetSize = 1 << 10
	// MaxRetryAfter caps Result.RetryAfter. It is longer than the 96 h delivery
	// lifetime, so capping changes no decision, and it keeps a hostile header
	// from overflowing time arithmetic downstream.
	MaxRetryAfter = 7 * 24 * time.Hour
	// MaxURLLength is the longest URL ValidateURL accepts, in bytes.
	MaxURLLength = 2048
	// MaxAllowedCIDRs is the most CIDRs an allow list may open.
	MaxAllowedCIDRs = 32
)

// Result is the outcome of one attempt. It never contains the URL, the host or
// an address, so it can be stored and shown as it is.
type Result struct {
	StatusCode int           // 0 when no response arrived
	ErrorCode  string        // "" for a 2xx answer, else one of the Code constants
	RetryAfter time.Duration // Retry-After of a non-2xx answer (seconds or HTTP date), capped at MaxRetryAfter; 0 if absent or invalid
	Snippet    []byte        // the first SnippetSize bytes of the response body; the caller owns it
	Err        error         // the cause, for operators; nil for a 2xx answer
}
