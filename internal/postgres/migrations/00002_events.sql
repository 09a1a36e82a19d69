-- The event feed and its subscriptions (webhooks).

-- +goose Up

-- events is every project's feed: sequence numbers a project's events 1, 2,
-- 3… without gaps. event_heads holds each project's latest sequence; a
-- transaction that appends takes its project's row (INSERT … ON CONFLICT DO
-- UPDATE locks it) and keeps it until it ends, so a later sequence can
-- never commit before an earlier one is visible: sequence order is commit
-- order for every reader. The columns say what changed (ids, states,
-- reason, times): never a secret, a URL or a body.
CREATE TABLE events (
    project_id  text COLLATE "C" NOT NULL,
    sequence    bigint NOT NULL,
    type        text NOT NULL,
    occurred_at timestamptz NOT NULL,
    job_id      text COLLATE "C" NOT NULL DEFAULT '',
    run_id      text COLLATE "C" NOT NULL DEFAULT '',
    state       text NOT NULL DEFAULT '',
    reason      text NOT NULL DEFAULT '',
    attempt     integer NOT NULL DEFAULT 0,
    error_code  text NOT NULL DEFAULT '',
    status_code integer NOT NULL DEFAULT 0,
    next_at     timestamptz,
    PRIMARY KEY (project_id, sequence)
);

CREATE TABLE event_heads (
    project_id text COLLATE "C" PRIMARY KEY,
    head       bigint NOT NULL
);

-- subscriptions: the secret is sealed under the master key (AAD: the
-- subscription id); previous_* is the secret a rotation replaced, signed
-- with until previous_expires_at. cursor_seq is the last event handled;
-- error_code, attempts and next_attempt_at are the failure state;
-- lease_owner and lease_expires_at are set while a replica works it.
CREATE TABLE subscriptions (
    id                  text COLLATE "C" PRIMARY KEY,
    project_id          text COLLATE "C" NOT NULL REFERENCES projects (id),
    url                 text NOT NULL,
    types               text[] NOT NULL DEFAULT '{}',
    job_ids             text[] NOT NULL DEFAULT '{}',
    secret_key_id       text NOT NULL,
    secret_ciphertext   bytea NOT NULL,
    previous_key_id     text NOT NULL DEFAULT '',
    previous_ciphertext bytea NOT NULL DEFAULT '',
    previous_expires_at timestamptz,
    cursor_seq          bigint NOT NULL DEFAULT 0,
    error_code          text NOT NULL DEFAULT '',
    attempts            integer NOT NULL DEFAULT 0,
    next_attempt_at     timestamptz,
    last_success_at     timestamptz,
    lease_owner         text,
    lease_expires_at    timestamptz,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL
);
CREATE INDEX subscriptions_project_idx ON subscriptions (project_id, id);

-- +goose Down
DROP TABLE subscriptions;
DROP TABLE event_heads;
DROP TABLE events;
