-- The first schema of vibejobs on PostgreSQL. Ids are compared byte-wise
-- (COLLATE "C") so their order is the creation order NewID promises, whatever
-- the database's default collation. Durations are bigint nanoseconds (Go's
-- time.Duration), so they round-trip exactly.

-- +goose Up
CREATE TABLE projects (
    id             text COLLATE "C" PRIMARY KEY,
    name           text NOT NULL,
    retention_days integer NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL
);

CREATE TABLE tokens (
    id           text COLLATE "C" PRIMARY KEY,
    project_id   text COLLATE "C" NOT NULL REFERENCES projects (id),
    name         text NOT NULL,
    role         text NOT NULL,
    installation boolean NOT NULL DEFAULT false,
    prefix       text NOT NULL,
    hash         bytea NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL,
    revoked_at   timestamptz
);
CREATE INDEX tokens_project_idx ON tokens (project_id, id);

CREATE TABLE jobs (
    id                text COLLATE "C" PRIMARY KEY,
    project_id        text COLLATE "C" NOT NULL REFERENCES projects (id),
    name              text NOT NULL,
    schedule          text NOT NULL DEFAULT '',
    at                timestamptz,
    timezone          text NOT NULL,
    url               text NOT NULL,
    enabled           boolean NOT NULL,
    state             text NOT NULL,
    max_attempts      integer NOT NULL,
    min_backoff_ns    bigint NOT NULL,
    max_backoff_ns    bigint NOT NULL,
    timeout_ns        bigint NOT NULL,
    catch_up          text NOT NULL,
    schedule_anchor   timestamptz NOT NULL,
    next_run_at       timestamptz,
    skipped_runs      bigint NOT NULL DEFAULT 0,
    secret_key_id     text NOT NULL,
    secret_ciphertext bytea NOT NULL,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    -- A deleted job stays as a row (its runs keep their job and stay
    -- readable) but is invisible to every job read.
    deleted_at        timestamptz
);
CREATE INDEX jobs_project_idx ON jobs (project_id, id) WHERE deleted_at IS NULL;
CREATE INDEX jobs_due_idx ON jobs (next_run_at, id)
    WHERE state = 'active' AND enabled AND deleted_at IS NULL AND next_run_at IS NOT NULL;

-- runs is the queue. A claimable run is in scheduled or retrying; claiming
-- moves it to delivering under a lease (lease_owner, lease_expires_at).
CREATE TABLE runs (
    id                 text COLLATE "C" PRIMARY KEY,
    job_id             text COLLATE "C" NOT NULL REFERENCES jobs (id),
    project_id         text COLLATE "C" NOT NULL,
    trigger            text NOT NULL,
    scheduled_for      timestamptz NOT NULL,
    -- scheduled_for for a schedule-triggered run, NULL for a manual one: the
    -- unique constraint below allows one scheduled run per occurrence and
    -- never merges manual runs (NULLs are distinct).
    occurrence_at      timestamptz,
    deadline_at        timestamptz NOT NULL,
    late               boolean NOT NULL DEFAULT false,
    late_decided       boolean NOT NULL DEFAULT false,
    state              text NOT NULL,
    -- attempt is the number of the latest attempt started; redeliver says the
    -- next claim sends that attempt again (after an interruption or a
    -- release) instead of starting attempt + 1.
    attempt            integer NOT NULL DEFAULT 0,
    redeliver          boolean NOT NULL DEFAULT false,
    next_attempt_at    timestamptz,
    attempt_started_at timestamptz,
    lease_owner        text,
    lease_expires_at   timestamptz,
    failure_reason     text NOT NULL DEFAULT '',
    created_at         timestamptz NOT NULL,
    finished_at        timestamptz,
    CONSTRAINT runs_occurrence_key UNIQUE (job_id, occurrence_at),
    -- Statements find a run delivering under a lease by its owner alone.
    CONSTRAINT runs_lease_iff_delivering CHECK ((state = 'delivering') = (lease_owner IS NOT NULL))
);
CREATE INDEX runs_claim_idx ON runs (next_attempt_at, id) WHERE state IN ('scheduled', 'retrying');
CREATE INDEX runs_lease_idx ON runs (lease_expires_at) WHERE state = 'delivering';
CREATE INDEX runs_project_idx ON runs (project_id, id);
CREATE INDEX runs_job_idx ON runs (job_id, id);
-- A job's last run, and its future runs.
CREATE INDEX runs_job_scheduled_idx ON runs (job_id, scheduled_for, id);
CREATE INDEX runs_finished_idx ON runs (project_id, finished_at) WHERE finished_at IS NOT NULL;

-- Attempts keep their insertion order (seq): an interrupted attempt and its
-- redelivery share a number.
CREATE TABLE attempts (
    seq                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id              text COLLATE "C" NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    number              integer NOT NULL,
    started_at          timestamptz NOT NULL,
    finished_at         timestamptz NOT NULL,
    status_code         integer NOT NULL DEFAULT 0,
    error_code          text NOT NULL DEFAULT '',
    signature_timestamp bigint NOT NULL DEFAULT 0,
    -- bytea: a response body may hold NUL bytes or invalid UTF-8, which
    -- text refuses.
    response_snippet    bytea NOT NULL DEFAULT ''
);
CREATE INDEX attempts_run_idx ON attempts (run_id, seq);

CREATE TABLE idempotency_keys (
    project_id       text COLLATE "C" NOT NULL REFERENCES projects (id),
    key              text COLLATE "C" NOT NULL,
    request_hash     bytea NOT NULL,
    done             boolean NOT NULL DEFAULT false,
    response_status  integer NOT NULL DEFAULT 0,
    response_headers bytea NOT NULL, -- a JSON object; bytea because jsonb refuses \u0000
    response_body    bytea,
    created_at       timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (project_id, key)
);
CREATE INDEX idempotency_keys_expires_idx ON idempotency_keys (expires_at);

-- +goose Down
DROP TABLE idempotency_keys;
DROP TABLE attempts;
DROP TABLE runs;
DROP TABLE jobs;
DROP TABLE tokens;
DROP TABLE projects;
