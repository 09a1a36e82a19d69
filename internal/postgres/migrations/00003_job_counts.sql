-- project_job_counts holds each project's number of live (not deleted)
-- jobs, so the job limit is checked without counting a project's jobs on
-- every create (a count that grows with the project: at a million jobs it
-- was most of the cost of creating one). A transaction that creates or
-- deletes jobs adds its net change just before it commits, so the row is
-- locked only from then to the commit.

-- +goose Up
CREATE TABLE project_job_counts (
    project_id text COLLATE "C" PRIMARY KEY REFERENCES projects (id),
    live_jobs  bigint NOT NULL
);
INSERT INTO project_job_counts (project_id, live_jobs)
SELECT project_id, count(*) FROM jobs WHERE deleted_at IS NULL GROUP BY project_id;

-- +goose Down
DROP TABLE project_job_counts;
