-- Times are INTEGER Unix milliseconds (UTC); durations are INTEGER nanoseconds.

-- +goose Up
CREATE TABLE projects (
    id             TEXT    PRIMARY KEY,
    name           TEXT    NOT NULL,
    retention_days INTEGER NOT NULL DEFAULT 0,
    created_at     INTEGER NOT NULL
) STRICT;

CREATE TABLE tokens (
    id           TEXT    PRIMARY KEY,
    project_id   TEXT    NOT NULL REFERENCES projects (id),
    name         TEXT    NOT NULL,
    role         TEXT    NOT NULL,
    installation INTEGER NOT NULL DEFAULT 0,
    prefix       TEXT    NOT NULL,
    hash         BLOB    NOT NULL UNIQUE,
    created_at   INTEGER NOT NULL,
    revoked_at   INTEGER
) STRICT;

CREATE INDEX tokens_project ON tokens (project_id, id);

-- A deleted job keeps its row (deleted_at set): its runs stay visible and a
-- run id keeps pointing at a job.
CREATE TABLE jobs (
    id                TEXT    PRIMARY KEY,
    project_id        TEXT    NOT NULL REFERENCES projects (id),
    name              TEXT    NOT NULL,
    schedule          TEXT    NOT NULL,
    at                INTEGER,
    timezone          TEXT    NOT NULL,
    url               TEXT    NOT NULL,
    enabled           INTEGER NOT NULL,
    state             TEXT    NOT NULL,
    max_attempts      INTEGER NOT NULL,
    min_backoff_ns    INTEGER NOT NULL,
    max_backoff_ns    INTEGER NOT NULL,
    timeout_ns        INTEGER NOT NULL,
    catch_up          TEXT    NOT NULL,
    schedule_anchor   INTEGER NOT NULL,
    next_run_at       INTEGER,
    skipped_runs      INTEGER NOT NULL DEFAULT 0,
    secret_key_id     TEXT    NOT NULL,
    secret_ciphertext BLOB    NOT NULL,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    deleted_at        INTEGER
) STRICT;

CREATE INDEX jobs_project ON jobs (project_id, id) WHERE deleted_at IS NULL;
CREATE INDEX jobs_due ON jobs (next_run_at, id)
    WHERE enabled = 1 AND state = 'active' AND deleted_at IS NULL;
CREATE INDEX jobs_secret_key ON jobs (secret_key_id, id);

-- runs is the queue. seq (the rowid) is the insertion order: claims take
-- runs due at the same instant in seq order, so a batch touches neighbouring
-- rows, and attempts refer to their run by it.
--
-- occurrence is 1 for a schedule-triggered run and NULL for a manual one:
-- UNIQUE (job_id, scheduled_for, occurrence) allows one scheduled run per
-- (job, scheduledFor) and any number of manual runs (NULLs are distinct).
-- The same index finds a job's last run and its future runs.
--
-- attempt is the number of the latest attempt started; redeliver = 1 makes
-- the next claim send that attempt again under the same number (after an
-- interruption or a release). late is NULL until the first attempt decides it.
-- attempt_started_at, lease_owner and lease_expires_at are set while delivering.
CREATE TABLE runs (
    seq                INTEGER PRIMARY KEY,
    id                 TEXT    NOT NULL UNIQUE,
    job_id             TEXT    NOT NULL REFERENCES jobs (id),
    project_id         TEXT    NOT NULL,
    trigger            TEXT    NOT NULL,
    scheduled_for      INTEGER NOT NULL,
    occurrence         INTEGER CHECK (occurrence = 1),
    deadline_at        INTEGER NOT NULL,
    late               INTEGER,
    state              TEXT    NOT NULL,
    attempt            INTEGER NOT NULL DEFAULT 0,
    redeliver          INTEGER NOT NULL DEFAULT 0,
    next_attempt_at    INTEGER,
    attempt_started_at INTEGER,
    lease_owner        TEXT,
    lease_expires_at   INTEGER,
    failure_reason     TEXT    NOT NULL DEFAULT '',
    created_at         INTEGER NOT NULL,
    finished_at        INTEGER,
    UNIQUE (job_id, scheduled_for, occurrence)
) STRICT;

-- Claim: the waiting runs in due order, ties in seq order.
CREATE INDEX runs_queue ON runs (next_attempt_at)
    WHERE state IN ('scheduled', 'retrying');
-- Lease recovery.
CREATE INDEX runs_leases ON runs (lease_expires_at) WHERE state = 'delivering';
-- Listing, newest first.
CREATE INDEX runs_project ON runs (project_id, id);
CREATE INDEX runs_job ON runs (job_id, id);
-- Pruning finished runs.
CREATE INDEX runs_finished ON runs (project_id, finished_at) WHERE finished_at IS NOT NULL;

-- attempts keeps every attempt, in insertion order (id). A number appears
-- twice when an attempt was interrupted and sent again.
CREATE TABLE attempts (
    id                  INTEGER PRIMARY KEY,
    run_seq             INTEGER NOT NULL REFERENCES runs (seq) ON DELETE CASCADE,
    number              INTEGER NOT NULL,
    started_at          INTEGER NOT NULL,
    finished_at         INTEGER NOT NULL,
    status_code         INTEGER NOT NULL,
    error_code          TEXT    NOT NULL,
    signature_timestamp INTEGER NOT NULL,
    response_snippet    TEXT    NOT NULL
) STRICT;

CREATE INDEX attempts_run ON attempts (run_seq);

CREATE TABLE idempotency_keys (
    project_id       TEXT    NOT NULL REFERENCES projects (id),
    key              TEXT    NOT NULL,
    request_hash     BLOB    NOT NULL,
    done             INTEGER NOT NULL DEFAULT 0,
    response_status  INTEGER NOT NULL DEFAULT 0,
    response_headers TEXT    NOT NULL DEFAULT '{}',
    response_body    BLOB,
    created_at       INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL,
    PRIMARY KEY (project_id, key)
) STRICT;

CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);

-- +goose Down
DROP TABLE idempotency_keys;
DROP TABLE attempts;
DROP TABLE runs;
DROP TABLE jobs;
DROP TABLE tokens;
DROP TABLE projects;
