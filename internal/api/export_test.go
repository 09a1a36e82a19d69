package api

import "net/http"

// Routes lists "METHOD /pattern" of every route the Server registered.
func (s *Server) Routes() []string {
	out := make([]string, 0, len(s.routes))
	for _, rt := range s.routes {
		out = append(out, rt.method+" "+rt.path)
	}
	return out
}

// RouteQuery is the query parameters the route of operation op ("METHOD
// /path") takes.
func (s *Server) RouteQuery(op string) []string {
	for _, rt := range s.routes {
		if rt.method+" "+rt.path == op {
			return rt.query
		}
	}
	return nil
}

// MuxPattern is the pattern the Server's mux picks for r ("" when none).
func (s *Server) MuxPattern(r *http.Request) string {
	_, p := s.mux.Handler(r)
	return p
}

// RequestHash is the hash an Idempotency-Key record keeps of a request.
func RequestHash(r *http.Request, tokenID string, body []byte) []byte {
	return requestHash(r, tokenID, body)
}

// WithoutIdempotency turns the Idempotency-Key layer off, for benchmarks.
func (s *Server) WithoutIdempotency() { s.noIdempotency = true }

// RouteForbids reports whether the route of operation op refuses some
// roles (403): false for a route any role may call.
func (s *Server) RouteForbids(op string) bool {
	for _, rt := range s.routes {
		if rt.method+" "+rt.path == op {
			return rt.access != accessPublic && rt.access != accessRead
		}
	}
	return false
}
