// Package vibejobs holds the domain of the platform: jobs, runs, attempts, the
// delivery rules that decide what happens after an attempt, error codes and the
// Store interface that the storage adapters implement. It imports only the
// standard library and the contract package.
package vibejobs

import (
	"errors"
	"fmt"
)

// Error kinds. Only the HTTP adapter maps them to status codes.
const (
	EINVALID       = "invalid"       // 400
	EUNAUTHORIZED  = "unauthorized"  // 401
	EFORBIDDEN     = "forbidden"     // 403
	ENOTFOUND      = "not_found"     // 404
	ECONFLICT      = "conflict"      // 409
	ETOOLARGE      = "too_large"     // 413
	EUNPROCESSABLE = "unprocessable" // 422
	ERATELIMIT     = "rate_limited"  // 429
	EUNAVAILABLE   = "unavailable"   // 503
	EINTERNAL      = "internal"      // 500
)

// Error is an error a user can act on. Code is a specific snake_case code
// (for example "invalid_schedule"), Field the input field it concerns, if any.
// Message must never contain a secret, a token, a body or a target URL.
type Error struct {
	Kind    string
	Code    string
	Message string
	Field   string
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %s (%s)", e.Code, e.Message, e.Field)
	}
	return e.Code + ": " + e.Message
}

// Errorf returns an *Error of the given kind and code.
func Errorf(kind, code, format string, args ...any) *Error {
	return &Error{Kind: kind, Code: code, Message: fmt.Sprintf(format, args...)}
}

// FieldError returns an EINVALID error about one input field.
func FieldError(code, field, format string, args ...any) *Error {
	return &Error{Kind: EINVALID, Code: code, Field: field, Message: fmt.Sprintf(format, args...)}
}

// ErrorKind returns the kind of err, or EINTERNAL when err is not an *Error.
func ErrorKind(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return EINTERNAL
}

// ErrNotFound is the error for a missing (or another project's) resource.
func ErrNotFound(what string) *Error {
	return &Error{Kind: ENOTFOUND, Code: what + "_not_found", Message: what + " not found"}
}
