package web

import (
	"container/list"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"sync"
	"time"
)

// session is one login: which token it acts for, the token's project (a
// session never changes project) and the secret its forms carry against
// cross-site request forgery.
type session struct {
	key       [32]byte // SHA-256 of the session id
	tokenID   string
	projectID string
	csrf      string
	expires   time.Time
}

// sessions is the in-memory table of logins. The browser holds the session
// id (32 random bytes); the table is keyed by its SHA-256, so a lookup's
// timing or a dump of the table does not give away a usable id. It holds at
// most max sessions: a new login drops the oldest. Every session lasts a
// fixed lifetime from its login, so the oldest is also the first to expire.
// The table is per process: behind several replicas a browser must come back
// to the replica it logged in on (or log in again).
type sessions struct {
	mu       sync.Mutex
	max      int
	lifetime time.Duration
	byKey    map[[32]byte]*list.Element // of *session
	order    *list.List                 // of *session, oldest first
}

func newSessions(max int, lifetime time.Duration) *sessions {
	return &sessions{max: max, lifetime: lifetime, byKey: map[[32]byte]*list.Element{}, order: list.New()}
}

// randomToken returns the unpadded base64url of 32 random bytes.
func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// keyOf returns the table key of a session id, or false when id cannot be
// one we issued.
func keyOf(id string) ([32]byte, bool) {
	if len(id) != 43 {
		return [32]byte{}, false
	}
	if _, err := base64.RawURLEncoding.Strict().DecodeString(id); err != nil {
		return [32]byte{}, false
	}
	return sha256.Sum256([]byte(id)), true
}

// create starts a session for a token at now and returns its id, for the
// cookie.
func (s *sessions) create(tokenID, projectID string, now time.Time) string {
	id := randomToken()
	key, _ := keyOf(id)
	sess := &session{key: key, tokenID: tokenID, projectID: projectID, csrf: randomToken(), expires: now.Add(s.lifetime)}
	s.mu.Lock()
	defer s.mu.Unlock()
	for e := s.order.Front(); e != nil && !now.Before(e.Value.(*session).expires); e = s.order.Front() {
		s.removeLocked(e)
	}
	for s.order.Len() >= s.max {
		s.removeLocked(s.order.Front())
	}
	s.byKey[key] = s.order.PushBack(sess)
	return id
}

// get returns the live session of id at now; an expired one is dropped.
func (s *sessions) get(id string, now time.Time) (session, bool) {
	key, ok := keyOf(id)
	if !ok {
		return session{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.byKey[key]
	if e == nil {
		return session{}, false
	}
	sess := e.Value.(*session)
	if !now.Before(sess.expires) {
		s.removeLocked(e)
		return session{}, false
	}
	return *sess, true
}

// delete ends the session of id, if any.
func (s *sessions) delete(id string) {
	key, ok := keyOf(id)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.byKey[key]; e != nil {
		s.removeLocked(e)
	}
}

func (s *sessions) removeLocked(e *list.Element) {
	delete(s.byKey, e.Value.(*session).key)
	s.order.Remove(e)
}
