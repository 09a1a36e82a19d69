-- project_job_counts holds each project's number of live (not deleted)
-- jobs, kept by CreateJob and DeleteJob in the same transaction, so the job
-- limit is checked without counting a project's jobs on every create.

-- +goose Up
CREATE TABLE project_job_counts (
    project_id TEXT    PRIMARY KEY REFERENCES projects (id),
    live_jobs  INTEGER NOT NULL
);
INSERT INTO project_job_counts (project_id, live_jobs)
SELECT project_id, count(*) FROM jobs WHERE deleted_at IS NULL GROUP BY project_id;

-- +goose Down
DROP TABLE project_job_counts;
