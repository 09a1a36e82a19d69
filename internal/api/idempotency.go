package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/vibejobs/vibejobs"
)

const (
	// idempotencyTTL is how long a key is remembered (per project).
	idempotencyTTL = 24 * time.Hour
	// abandonedAfter is when an in-progress key is taken to belong to a
	// request that died with its process: a new request may take it over.
	// Were that request only slow, its completion now fails, its effect,
	// which commits with it, rolls back, and it answers takenOver. The age
	// is the store's (IdempotencyRecord.Age): on PostgreSQL, the database
	// server's clock, so replicas whose clocks disagree agree on it.
	abandonedAfter = 60 * time.Second
	// sealedKeyHeader marks a stored answer whose body is sealed under the
	// master key it names. It is never sent to a client.
	sealedKeyHeader = "Vibejobs-Sealed-Key"
	replayedHeader  = "Idempotent-Replayed"
)

func checkIdempotencyKey(values []string) *vibejobs.Error {
	if len(values) == 0 {
		return invalid("idempotency_key_required", "Idempotency-Key", "this request needs an Idempotency-Key header: a fresh random value per logical operation, reused on retries")
	}
	if len(values) > 1 {
		return invalid("invalid_idempotency_key", "Idempotency-Key", "send the Idempotency-Key header once")
	}
	if !vibejobs.ValidIdempotencyKey(values[0]) {
		return invalid("invalid_idempotency_key", "Idempotency-Key", "the Idempotency-Key must be 1 to 255 printable ASCII characters, without spaces")
	}
	return nil
}

// requestHash identifies a request for key reuse: the token that sent it,
// method, path with query and the body bytes. The token is part of it
// because a stored answer is served before the effect, and so before the
// effect's own checks of the caller: another token of the project sending
// the same key and request (one that may not mint tokens in another
// project, say) must not be handed the first token's answer, which can
// hold a secret or a token. It gets idempotency_key_reuse_conflict.
func requestHash(r *http.Request, tokenID string, body []byte) []byte {
	h := sha256.New()
	h.Write([]byte(tokenID))
	h.Write([]byte{'\n'})
	h.Write([]byte(r.Method))
	h.Write([]byte{' '})
	h.Write([]byte(r.URL.EscapedPath()))
	if r.URL.RawQuery != "" {
		h.Write([]byte{'?'})
		h.Write([]byte(r.URL.RawQuery))
	}
	h.Write([]byte{'\n'})
	h.Write(body)
	return h.Sum(nil)
}

// idempotent runs a creating or changing POST under its Idempotency-Key
// (SEMANTICS.md section 5):
//
//   - the key is claimed in its own short transaction (in progress);
//   - the effect and the key's completed record (status, headers, body)
//     commit in one transaction; an error a user can act on rolls the effect
//     back and is stored as the answer, so a retry gets the same answer;
//   - an internal failure deletes the key so a retry may proceed (when
//     the database is down for that too, the next request with the key to
//     this process deletes it first);
//   - the same key with another request is 422, while in progress 409 with
//     Retry-After (a claim older than abandonedAfter is taken over), and
//     after completion the stored answer byte for byte with
//     Idempotent-Replayed: true;
//   - a request whose claim was taken over meanwhile applies nothing and
//     answers 409 idempotency_key_in_progress with Retry-After: a retry
//     gets the answer of the request that took the key over.
func (s *Server) idempotent(ctx context.Context, c *call, effect func(context.Context, *call, vibejobs.Tx) (*response, error)) *response {
	values := c.r.Header.Values("Idempotency-Key")
	if e := checkIdempotencyKey(values); e != nil {
		return errorResponse(e)
	}
	key, project := values[0], c.projectID()
	hash := requestHash(c.r, c.token.ID, c.body)
	if claimedAt, ok := s.unreleased.get(project, key, c.now); ok {
		// A request of this process failed with this key and could not
		// free it then: free it now, or this retry, and every other for a
		// minute, would be told the first is still in progress.
		if err := s.deleteClaim(ctx, project, key, claimedAt); err != nil {
			return s.fail(c, err)
		}
		s.unreleased.remove(project, key, claimedAt)
	}

	rec, err := s.store.GetIdempotencyKey(ctx, project, key, c.now)
	switch {
	case err == nil:
		if resp, err := s.answerFromRecord(rec, hash); err != nil {
			return s.fail(c, err)
		} else if resp != nil {
			return resp
		}
	case vibejobs.ErrorKind(err) != vibejobs.ENOTFOUND:
		return s.fail(c, err)
	}

	// Claim the key. A concurrent claim that won makes ours ECONFLICT; the
	// loop then reads the winner's record.
	var existing *response
	for attempt := 0; ; attempt++ {
		err = s.update(ctx, func(tx vibejobs.Tx) error {
			existing = nil
			rec, err := tx.GetIdempotencyKey(ctx, project, key, c.now)
			switch {
			case err == nil:
				resp, err := s.answerFromRecord(rec, hash)
				if err != nil {
					return err
				}
				if resp != nil {
					existing = resp
					return nil
				}
				// A request that took the abandoned claim over first leaves
				// nothing to delete; the insert below then meets its claim.
				err = tx.DeleteIdempotencyKey(ctx, project, key, rec.CreatedAt)
				if err != nil && vibejobs.ErrorKind(err) != vibejobs.ENOTFOUND {
					return err
				}
			case vibejobs.ErrorKind(err) != vibejobs.ENOTFOUND:
				return err
			}
			return tx.InsertIdempotencyKey(ctx, &vibejobs.IdempotencyRecord{
				ProjectID: project, Key: key, RequestHash: hash,
				CreatedAt: c.now, ExpiresAt: c.now.Add(idempotencyTTL),
			})
		})
		if vibejobs.ErrorKind(err) == vibejobs.ECONFLICT && attempt < 3 {
			continue
		}
		break
	}
	if vibejobs.ErrorKind(err) == vibejobs.ECONFLICT {
		return inProgress()
	}
	if err != nil {
		return s.fail(c, err)
	}
	if existing != nil {
		return existing
	}

	// The key is ours. If anything below panics, free it for a retry.
	done := false
	defer func() {
		if !done {
			s.releaseKey(project, key, c.now)
		}
	}()
	var resp *response
	var userErr *vibejobs.Error
	err = s.update(ctx, func(tx vibejobs.Tx) error {
		resp, userErr = nil, nil
		c.dropEffects()
		r, err := effect(ctx, c, tx)
		if err != nil {
			if e := userError(err); e != nil {
				userErr = e
				return errRollback
			}
			return err
		}
		rec, err := s.completedRecord(project, key, hash, r, c.now)
		if err != nil {
			return err
		}
		if err := completeClaim(ctx, tx, rec); err != nil {
			return err
		}
		resp = r
		return nil
	})
	if userErr != nil && errors.Is(err, errRollback) {
		// The effect was refused: nothing of it committed. The refusal is the
		// answer to this key from now on.
		resp = errorResponse(userErr)
		c.dropEffects()
		err = s.update(ctx, func(tx vibejobs.Tx) error {
			rec, err := s.completedRecord(project, key, hash, resp, c.now)
			if err != nil {
				return err
			}
			return completeClaim(ctx, tx, rec)
		})
	}
	if errors.Is(err, errTakenOver) {
		// Nothing of this request committed, and the key is the taker's:
		// there is no claim of ours to free.
		done = true
		c.dropEffects()
		s.log.Warn("api: a request's idempotency key was taken over while it ran", "project", project,
			"ran", s.now().Sub(c.now).Round(time.Millisecond).String())
		return takenOver()
	}
	if err != nil {
		return s.fail(c, err) // the deferred release frees the key
	}
	done = true
	s.committed(c)
	return resp
}

// errTakenOver is completeClaim's answer when the request's claim is no
// longer there to complete.
var errTakenOver = errors.New("api: the idempotency key was taken over")

// completeClaim completes the request's claim with rec, in the transaction
// of its effect. A claim that is gone (taken over by a later request with
// the key after abandonedAfter, or expired) is errTakenOver: the effect
// must roll back, since the key's answer is the taker's.
func completeClaim(ctx context.Context, tx vibejobs.Tx, rec *vibejobs.IdempotencyRecord) error {
	err := tx.CompleteIdempotencyKey(ctx, rec)
	if vibejobs.ErrorKind(err) == vibejobs.ENOTFOUND {
		return errTakenOver
	}
	if vibejobs.ErrorKind(err) == vibejobs.EUNAVAILABLE {
		// The database stopped answering (or took no writes): 503, a
		// passing fault the client retries, as for any other statement.
		return fmt.Errorf("api: completing idempotency key: %w", err)
	}
	if err != nil {
		// Not the user's doing, whatever its kind: answer 500 and free
		// the key.
		return fmt.Errorf("api: completing idempotency key: %s", err)
	}
	return nil
}

// releaseKey deletes the claim of key made at claimedAt by a request that
// failed, even when the request's context is gone; a later request's claim
// of the key is left alone.
func (s *Server) releaseKey(project, key string, claimedAt time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.deleteClaim(ctx, project, key, claimedAt); err != nil {
		s.log.Error("api: releasing an idempotency key after a failure", "project", project, "error", err.Error())
		s.unreleased.add(project, key, claimedAt, s.now())
	}
}

// deleteClaim deletes the claim of key made at claimedAt if it is still
// there and not completed.
func (s *Server) deleteClaim(ctx context.Context, project, key string, claimedAt time.Time) error {
	err := s.update(ctx, func(tx vibejobs.Tx) error {
		return tx.DeleteIdempotencyKey(ctx, project, key, claimedAt)
	})
	if vibejobs.ErrorKind(err) == vibejobs.ENOTFOUND {
		return nil
	}
	return err
}

// unreleasedKeys remembers, up to maxUnreleased, the claims whose release
// failed, so that the next request with the key, once the database
// answers, frees it rather than waiting out abandonedAfter. Forgotten (over
// the cap, or in a restart), a claim is still taken over after that wait.
type unreleasedKeys struct {
	mu sync.Mutex
	m  map[[2]string]time.Time
}

const maxUnreleased = 10000

func (u *unreleasedKeys) add(project, key string, claimedAt, now time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil {
		u.m = make(map[[2]string]time.Time)
	}
	if len(u.m) >= maxUnreleased {
		for k, at := range u.m {
			if now.Sub(at) >= abandonedAfter {
				delete(u.m, k)
			}
		}
	}
	if len(u.m) < maxUnreleased {
		u.m[[2]string{project, key}] = claimedAt
	}
}

// get returns the claim of key to free, if one is remembered and not yet
// old enough to be taken over anyway.
func (u *unreleasedKeys) get(project, key string, now time.Time) (time.Time, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	at, ok := u.m[[2]string{project, key}]
	if ok && now.Sub(at) >= abandonedAfter {
		delete(u.m, [2]string{project, key})
		return time.Time{}, false
	}
	return at, ok
}

// remove forgets the claim made at claimedAt; a later one is kept.
func (u *unreleasedKeys) remove(project, key string, claimedAt time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if at, ok := u.m[[2]string{project, key}]; ok && at.Equal(claimedAt) {
		delete(u.m, [2]string{project, key})
	}
}

// takenOver is the answer of a request that ran so long that another
// request with its key (the same request, sent again) took the key over:
// nothing of it was applied, and a retry gets the taker's answer, or 409
// while the taker runs. It keeps the in-progress code, which clients
// already retry.
func takenOver() *response {
	return errorResponse(&vibejobs.Error{Kind: vibejobs.ECONFLICT, Code: "idempotency_key_in_progress",
		Message: "this request took so long that a retry with the same Idempotency-Key took the key over; nothing of this request was applied; retry to get that request's answer",
		Field:   "Idempotency-Key"}).
		with("Retry-After", "1")
}

func inProgress() *response {
	return errorResponse(&vibejobs.Error{Kind: vibejobs.ECONFLICT, Code: "idempotency_key_in_progress",
		Message: "a request with this Idempotency-Key is still in progress; retry later", Field: "Idempotency-Key"}).
		with("Retry-After", "1")
}

// answerFromRecord decides what an existing record means for a request with
// hash: a 422 for another request, a 409 while in progress, the stored answer
// once done, or nil (take the key over) when the first request was abandoned
// (its claim's Age, by the store's clock, is abandonedAfter or more).
func (s *Server) answerFromRecord(rec *vibejobs.IdempotencyRecord, hash []byte) (*response, error) {
	if !bytes.Equal(rec.RequestHash, hash) {
		return errorResponse(&vibejobs.Error{Kind: vibejobs.EUNPROCESSABLE, Code: "idempotency_key_reuse_conflict",
			Message: "this Idempotency-Key was used with another request", Field: "Idempotency-Key"}), nil
	}
	if !rec.Done {
		if rec.Age >= abandonedAfter {
			return nil, nil
		}
		return inProgress(), nil
	}
	resp := &response{status: rec.ResponseStatus, header: map[string]string{}, body: rec.ResponseBody}
	for k, v := range rec.ResponseHeaders {
		if k != sealedKeyHeader {
			resp.header[k] = v
		}
	}
	if keyID, ok := rec.ResponseHeaders[sealedKeyHeader]; ok {
		plain, err := s.sealer.Open(vibejobs.SealedSecret{KeyID: keyID, Ciphertext: rec.ResponseBody}, recordAAD(rec.ProjectID, rec.Key))
		if err != nil {
			return nil, err
		}
		resp.body = []byte(plain)
	}
	resp.header[replayedHeader] = "true"
	return resp, nil
}

// completedRecord is the record of key answered by r. The body is sealed:
// the answer that creates a job or mints a token holds its secret in clear,
// and no secret may rest in the database unencrypted.
func (s *Server) completedRecord(project, key string, hash []byte, r *response, now time.Time) (*vibejobs.IdempotencyRecord, error) {
	sealed, err := s.sealer.Seal(string(r.body), recordAAD(project, key))
	if err != nil {
		return nil, err
	}
	h := make(map[string]string, len(r.header)+1)
	for k, v := range r.header {
		h[k] = v
	}
	h[sealedKeyHeader] = sealed.KeyID
	return &vibejobs.IdempotencyRecord{
		ProjectID: project, Key: key, RequestHash: hash, Done: true,
		ResponseStatus: r.status, ResponseHeaders: h, ResponseBody: sealed.Ciphertext,
		CreatedAt: now, ExpiresAt: now.Add(idempotencyTTL),
	}, nil
}

// ResealAnswer re-seals the stored answer of the completed record rec with
// sealer (master key rotation) and reports whether rec changed: false when
// the answer is already under keyID, the key sealer seals with now.
func ResealAnswer(rec *vibejobs.IdempotencyRecord, sealer Sealer, keyID string) (bool, error) {
	old, ok := rec.ResponseHeaders[sealedKeyHeader]
	if !ok || old == keyID {
		return false, nil
	}
	aad := recordAAD(rec.ProjectID, rec.Key)
	plain, err := sealer.Open(vibejobs.SealedSecret{KeyID: old, Ciphertext: rec.ResponseBody}, aad)
	if err != nil {
		return false, fmt.Errorf("opening the stored answer of an idempotency key: %w", err)
	}
	sealed, err := sealer.Seal(plain, aad)
	if err != nil {
		return false, err
	}
	rec.ResponseHeaders[sealedKeyHeader], rec.ResponseBody = sealed.KeyID, sealed.Ciphertext
	return true, nil
}

// recordAAD binds a sealed answer to its project and key.
func recordAAD(project, key string) string { return "idempotency\x00" + project + "\x00" + key }
