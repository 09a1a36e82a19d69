package web

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"time"

	"github.com/vibejobs/vibejobs"
)

// session is one login: which token it acts for, the token's project (a
// session never changes project) and the secret its forms carry against
// cross-site request forgery.
type session struct {
	tokenID   string
	projectID string
	csrf      string
}

// sessions keeps the logins in the Store, so that every replica behind a
// load balancer knows them. The browser holds the session id (32 random
// bytes); the Store holds only its SHA-256, so a dump of the table gives
// away no usable id. The form secret is derived from the id, so it is not
// stored either. Each token keeps at most max sessions: a new login ends
// the one that expires first. Every session lasts a fixed lifetime from its
// login.
type sessions struct {
	store    vibejobs.SessionStore
	max      int
	lifetime time.Duration
}

// randomToken returns the unpadded base64url of 32 random bytes.
func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// keyOf returns the stored key of a session id, or false when id cannot be
// one we issued.
func keyOf(id string) ([]byte, bool) {
	if len(id) != 43 {
		return nil, false
	}
	if _, err := base64.RawURLEncoding.Strict().DecodeString(id); err != nil {
		return nil, false
	}
	k := sha256.Sum256([]byte(id))
	return k[:], true
}

// formSecret is the CSRF secret of the session id: a hash the Store's key
// (the id's plain SHA-256) does not give.
func formSecret(id string) string {
	sum := sha256.Sum256([]byte("vibejobs dashboard form secret\x00" + id))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// create starts a session for a token at now and returns its id, for the
// cookie.
func (s *sessions) create(ctx context.Context, tokenID, projectID string, now time.Time) (string, error) {
	id := randomToken()
	key, _ := keyOf(id)
	err := s.store.CreateSession(ctx, &vibejobs.DashboardSession{
		Key: key, TokenID: tokenID, ProjectID: projectID, ExpiresAt: now.Add(s.lifetime),
	}, s.max)
	if err != nil {
		return "", err
	}
	return id, nil
}

// get returns the live session of id at now; false when there is none.
func (s *sessions) get(ctx context.Context, id string, now time.Time) (session, bool, error) {
	key, ok := keyOf(id)
	if !ok {
		return session{}, false, nil
	}
	sess, err := s.store.GetSession(ctx, key, now)
	if vibejobs.ErrorKind(err) == vibejobs.ENOTFOUND {
		return session{}, false, nil
	}
	if err != nil {
		return session{}, false, err
	}
	return session{tokenID: sess.TokenID, projectID: sess.ProjectID, csrf: formSecret(id)}, true, nil
}

// delete ends the session of id, if any.
func (s *sessions) delete(ctx context.Context, id string) error {
	key, ok := keyOf(id)
	if !ok {
		return nil
	}
	return s.store.DeleteSession(ctx, key)
}
