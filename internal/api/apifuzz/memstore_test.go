package apifuzz_test

import (
	"cmp"
	"context"
	"encoding/base64"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vibejobs/vibejobs"
)

// memStore is the smallest in-memory vibejobs.Store the job routes need.
// Methods it lacks panic (the nil embedded interface), which the fuzz target
// reports as a 500.
type memStore struct {
	vibejobs.Store
	mu    sync.Mutex
	token *vibejobs.Token
	jobs  map[string]*vibejobs.Job
	keys  map[string]*vibejobs.IdempotencyRecord
	subs  map[string]*vibejobs.Subscription
}

func newMemStore(token *vibejobs.Token) *memStore {
	return &memStore{token: token, jobs: map[string]*vibejobs.Job{}, keys: map[string]*vibejobs.IdempotencyRecord{},
		subs: map[string]*vibejobs.Subscription{}}
}

func (m *memStore) TokenByHash(ctx context.Context, hash []byte) (*vibejobs.Token, error) {
	if string(hash) == string(m.token.Hash) {
		t := *m.token
		return &t, nil
	}
	return nil, vibejobs.ErrNotFound("token")
}

// Update runs fn on an overlay of the maps, applied when fn succeeds.
func (m *memStore) Update(ctx context.Context, fn func(tx vibejobs.Tx) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	tx := &memTx{base: m, jobs: map[string]*vibejobs.Job{}, keys: map[string]*vibejobs.IdempotencyRecord{},
		subs: map[string]*vibejobs.Subscription{}}
	if err := fn(tx); err != nil {
		return err
	}
	maps.Copy(m.jobs, tx.jobs)
	maps.Copy(m.subs, tx.subs)
	for k, r := range tx.keys {
		if r == nil {
			delete(m.keys, k)
		} else {
			m.keys[k] = r
		}
	}
	return nil
}

func (m *memStore) GetIdempotencyKey(ctx context.Context, projectID, key string, now time.Time) (*vibejobs.IdempotencyRecord, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return getKey(m.keys, projectID, key, now)
}

func (m *memStore) GetJob(ctx context.Context, projectID, id string) (*vibejobs.Job, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return getJob(m.jobs, projectID, id)
}

func getKey(keys map[string]*vibejobs.IdempotencyRecord, projectID, key string, now time.Time) (*vibejobs.IdempotencyRecord, error) {
	r, ok := keys[projectID+"\x00"+key]
	if !ok || !r.ExpiresAt.After(now) {
		return nil, vibejobs.ErrNotFound("idempotency_key")
	}
	c := *r
	c.Age = now.Sub(c.CreatedAt) // one process, one clock, as on SQLite
	return &c, nil
}

func getJob(jobs map[string]*vibejobs.Job, projectID, id string) (*vibejobs.Job, error) {
	j, ok := jobs[id]
	if !ok || j.ProjectID != projectID {
		return nil, vibejobs.ErrNotFound("job")
	}
	c := *j
	return &c, nil
}

// memTx holds the writes of one Update; a nil key record is a deletion.
type memTx struct {
	vibejobs.Tx
	base *memStore
	jobs map[string]*vibejobs.Job
	keys map[string]*vibejobs.IdempotencyRecord
	subs map[string]*vibejobs.Subscription
}

func (t *memTx) key(projectID, key string, now time.Time) (*vibejobs.IdempotencyRecord, error) {
	k := projectID + "\x00" + key
	if r, ok := t.keys[k]; ok {
		if r == nil {
			return nil, vibejobs.ErrNotFound("idempotency_key")
		}
		return getKey(t.keys, projectID, key, now)
	}
	return getKey(t.base.keys, projectID, key, now)
}

func (t *memTx) GetIdempotencyKey(ctx context.Context, projectID, key string, now time.Time) (*vibejobs.IdempotencyRecord, error) {
	return t.key(projectID, key, now)
}

func (t *memTx) InsertIdempotencyKey(ctx context.Context, rec *vibejobs.IdempotencyRecord) error {
	if _, err := t.key(rec.ProjectID, rec.Key, rec.CreatedAt); err == nil {
		return vibejobs.Errorf(vibejobs.ECONFLICT, "idempotency_key_exists", "a live record of this key exists")
	}
	c := *rec
	t.keys[rec.ProjectID+"\x00"+rec.Key] = &c
	return nil
}

func (t *memTx) CompleteIdempotencyKey(ctx context.Context, rec *vibejobs.IdempotencyRecord) error {
	r, err := t.key(rec.ProjectID, rec.Key, time.Time{})
	if err != nil {
		return err
	}
	if r.Done || !r.CreatedAt.Equal(rec.CreatedAt) {
		return vibejobs.ErrNotFound("idempotency_key")
	}
	r.Done, r.ResponseStatus, r.ResponseHeaders, r.ResponseBody = true, rec.ResponseStatus, rec.ResponseHeaders, rec.ResponseBody
	t.keys[rec.ProjectID+"\x00"+rec.Key] = r
	return nil
}

func (t *memTx) DeleteIdempotencyKey(ctx context.Context, projectID, key string, createdAt time.Time) error {
	if r, err := t.key(projectID, key, time.Time{}); err != nil || r.Done || !r.CreatedAt.Equal(createdAt) {
		return vibejobs.ErrNotFound("idempotency_key")
	}
	t.keys[projectID+"\x00"+key] = nil
	return nil
}

func (t *memTx) GetJob(ctx context.Context, projectID, id string) (*vibejobs.Job, error) {
	if _, ok := t.jobs[id]; ok {
		return getJob(t.jobs, projectID, id)
	}
	return getJob(t.base.jobs, projectID, id)
}

func (t *memTx) CountJobs(ctx context.Context, projectID string) (int, error) {
	n := 0
	for _, j := range t.base.jobs {
		if j.ProjectID == projectID {
			n++
		}
	}
	return n, nil
}

func (t *memTx) CreateJob(ctx context.Context, j *vibejobs.Job) error {
	c := *j
	t.jobs[j.ID] = &c
	return nil
}

func (t *memTx) UpdateJob(ctx context.Context, j *vibejobs.Job) error {
	if _, err := t.GetJob(ctx, j.ProjectID, j.ID); err != nil {
		return err
	}
	c := *j
	t.jobs[j.ID] = &c
	return nil
}

// AppendEvents keeps no feed: the fuzz target checks decoding, not events.
func (t *memTx) AppendEvents(ctx context.Context, events ...*vibejobs.Event) error { return nil }

func (t *memTx) AddSkippedRuns(ctx context.Context, projectID, id string, n int64) error {
	j, err := t.GetJob(ctx, projectID, id)
	if err != nil {
		return err
	}
	j.SkippedRuns += n
	t.jobs[id] = j
	return nil
}

func (t *memTx) DeleteFutureRuns(ctx context.Context, jobID string, after time.Time) (int, error) {
	return 0, nil
}

// ListJobs pages the project's jobs in id order, with the stores' cursor:
// the unpadded base64url of the last id listed.
func (m *memStore) ListJobs(ctx context.Context, projectID string, p vibejobs.Page) ([]*vibejobs.Job, string, error) {
	limit, after, err := memPage(p)
	if err != nil {
		return nil, "", err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*vibejobs.Job
	for _, j := range m.jobs {
		if j.ProjectID == projectID && j.ID > after {
			c := *j
			out = append(out, &c)
		}
	}
	slices.SortFunc(out, func(a, b *vibejobs.Job) int { return strings.Compare(a.ID, b.ID) })
	if len(out) > limit {
		out = out[:limit]
		return out, base64.RawURLEncoding.EncodeToString([]byte(out[limit-1].ID)), nil
	}
	return out, "", nil
}

// ListRuns checks its page as the stores do; memStore holds no runs.
func (m *memStore) ListRuns(ctx context.Context, projectID string, f vibejobs.RunFilter, p vibejobs.Page) ([]*vibejobs.Run, string, error) {
	_, _, err := memPage(p)
	return nil, "", err
}

func (m *memStore) GetRun(ctx context.Context, projectID, id string) (*vibejobs.Run, error) {
	return nil, vibejobs.ErrNotFound("run")
}

// memPage checks p as the stores do and returns its limit and the id its
// cursor points after.
func memPage(p vibejobs.Page) (limit int, after string, err error) {
	limit = cmp.Or(p.Limit, 50)
	if limit < 1 || limit > 100 {
		return 0, "", vibejobs.FieldError("invalid_limit", "limit", "limit must be between 1 and 100")
	}
	if p.Cursor == "" {
		return limit, "", nil
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(p.Cursor)
	if err != nil || len(b) == 0 || len(b) > 128 || strings.TrimLeft(string(b), idChars) != "" {
		return 0, "", vibejobs.FieldError("invalid_cursor", "cursor", "cursor is not one this API returned")
	}
	return limit, string(b), nil
}

const idChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"

func (m *memStore) GetSubscription(ctx context.Context, projectID, id string) (*vibejobs.Subscription, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return getSubscription(m.subs, projectID, id)
}

func getSubscription(subs map[string]*vibejobs.Subscription, projectID, id string) (*vibejobs.Subscription, error) {
	s, ok := subs[id]
	if !ok || s.ProjectID != projectID {
		return nil, vibejobs.ErrNotFound("subscription")
	}
	c := *s
	return &c, nil
}

func (t *memTx) GetSubscription(ctx context.Context, projectID, id string) (*vibejobs.Subscription, error) {
	if _, ok := t.subs[id]; ok {
		return getSubscription(t.subs, projectID, id)
	}
	return getSubscription(t.base.subs, projectID, id)
}

// CreateSubscription keeps nothing: the fuzz target checks decoding, and
// kept, the subscriptions it creates would soon fill the project's cap.
func (t *memTx) CreateSubscription(ctx context.Context, s *vibejobs.Subscription, limit int) error {
	return nil
}

func (t *memTx) UpdateSubscription(ctx context.Context, s *vibejobs.Subscription) error {
	if _, err := t.GetSubscription(ctx, s.ProjectID, s.ID); err != nil {
		return err
	}
	c := *s
	t.subs[s.ID] = &c
	return nil
}
