package api

import (
	"errors"
	"net/http"

	"github.com/vibejobs/vibejobs"
)

// statusOf is the one map from error kinds to HTTP status codes.
func statusOf(kind string) int {
	switch kind {
	case vibejobs.EINVALID:
		return http.StatusBadRequest
	case vibejobs.EUNAUTHORIZED:
		return http.StatusUnauthorized
	case vibejobs.EFORBIDDEN:
		return http.StatusForbidden
	case vibejobs.ENOTFOUND:
		return http.StatusNotFound
	case vibejobs.ECONFLICT:
		return http.StatusConflict
	case vibejobs.ETOOLARGE:
		return http.StatusRequestEntityTooLarge
	case vibejobs.EUNPROCESSABLE:
		return http.StatusUnprocessableEntity
	case vibejobs.ERATELIMIT:
		return http.StatusTooManyRequests
	case vibejobs.EUNAVAILABLE:
		return http.StatusServiceUnavailable
	case kindMethodNotAllowed:
		return http.StatusMethodNotAllowed
	}
	return http.StatusInternalServerError
}

// kindMethodNotAllowed is the only kind the domain does not need: it exists
// for the router alone.
const kindMethodNotAllowed = "method_not_allowed"

// userError returns err as an *vibejobs.Error a client may see, or nil when
// err is internal (its details must then be logged, never shown).
func userError(err error) *vibejobs.Error {
	var e *vibejobs.Error
	if errors.As(err, &e) && e.Kind != vibejobs.EINTERNAL && statusOf(e.Kind) < 500 {
		return e
	}
	return nil
}

// errorBody is the wire form of every error.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

// errorResponse renders e. Messages are written by this package or the
// domain and never carry a URL, a secret or a token.
func errorResponse(e *vibejobs.Error) *response {
	return jsonResponse(statusOf(e.Kind), errorBody{errorDetail{Code: e.Code, Message: e.Message, Field: e.Field}})
}

var internalResponse = func() *response {
	return jsonResponse(http.StatusInternalServerError, errorBody{errorDetail{Code: "internal", Message: "internal error"}})
}

// unavailableResponse answers a request the database could not serve for
// now: a passing fault, which the client may retry (the CLI does), after
// the Retry-After it gives: a failover or a restart takes seconds.
func unavailableResponse() *response {
	return jsonResponse(http.StatusServiceUnavailable, errorBody{errorDetail{Code: "database_unavailable",
		Message: "the database is unavailable for now; retry later"}}).with("Retry-After", "2")
}

func invalid(code, field, msg string) *vibejobs.Error {
	return &vibejobs.Error{Kind: vibejobs.EINVALID, Code: code, Field: field, Message: msg}
}

func errForbidden(msg string) *vibejobs.Error {
	return &vibejobs.Error{Kind: vibejobs.EFORBIDDEN, Code: "forbidden", Message: msg}
}
