-- The event feed and its subscriptions (webhooks).

-- +goose Up

-- events is every project's feed. sequence numbers a project's events 1, 2,
-- 3… without gaps; event_heads holds each project's latest. The single
-- writer connection makes sequence order the commit order.
-- The columns say what changed (ids, states, reason, times): never a
-- secret, a URL or a body.
CREATE TABLE events (
    project_id  TEXT    NOT NULL,
    sequence    INTEGER NOT NULL,
    type        TEXT    NOT NULL,
    occurred_at INTEGER NOT NULL,
    job_id      TEXT    NOT NULL DEFAULT '',
    run_id      TEXT    NOT NULL DEFAULT '',
    state       TEXT    NOT NULL DEFAULT '',
    reason      TEXT    NOT NULL DEFAULT '',
    attempt     INTEGER NOT NULL DEFAULT 0,
    error_code  TEXT    NOT NULL DEFAULT '',
    status_code INTEGER NOT NULL DEFAULT 0,
    next_at     INTEGER,
    PRIMARY KEY (project_id, sequence)
) STRICT, WITHOUT ROWID;

CREATE TABLE event_heads (
    project_id TEXT    PRIMARY KEY,
    head       INTEGER NOT NULL
) STRICT;

-- subscriptions: types and job_ids are JSON arrays ('[]': all). The secret
-- is sealed under the master key (AAD: the subscription id); previous_* is
-- the secret a rotation replaced, signed with until previous_expires_at.
-- cursor_seq is the last event handled. error_code, attempts and
-- next_attempt_at are the failure state; lease_owner and lease_expires_at
-- are set while a replica works the subscription.
CREATE TABLE subscriptions (
    id                  TEXT    PRIMARY KEY,
    project_id          TEXT    NOT NULL REFERENCES projects (id),
    url                 TEXT    NOT NULL,
    types               TEXT    NOT NULL DEFAULT '[]',
    job_ids             TEXT    NOT NULL DEFAULT '[]',
    secret_key_id       TEXT    NOT NULL,
    secret_ciphertext   BLOB    NOT NULL,
    previous_key_id     TEXT    NOT NULL DEFAULT '',
    previous_ciphertext BLOB    NOT NULL DEFAULT x'',
    previous_expires_at INTEGER,
    cursor_seq          INTEGER NOT NULL DEFAULT 0,
    error_code          TEXT    NOT NULL DEFAULT '',
    attempts            INTEGER NOT NULL DEFAULT 0,
    next_attempt_at     INTEGER,
    last_success_at     INTEGER,
    lease_owner         TEXT,
    lease_expires_at    INTEGER,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL
) STRICT;

CREATE INDEX subscriptions_project ON subscriptions (project_id, id);

-- +goose Down
DROP TABLE subscriptions;
DROP TABLE event_heads;
DROP TABLE events;
