package scheduler

import (
	"github.com/vibejobs/vibejobs"
	"github.com/vibejobs/vibejobs/internal/schedule"
)

// ObserveJobSchedule makes s call seen with each job whose schedule it
// parses, before parsing it.
func ObserveJobSchedule(s *Scheduler, seen func(*vibejobs.Job)) {
	s.jobSchedule = func(j *vibejobs.Job) (schedule.Schedule, error) {
		seen(j)
		return JobSchedule(j)
	}
}

// SetMaxResentRuns bounds the runs of failed calls' plans s keeps to send
// again.
func SetMaxResentRuns(s *Scheduler, n int) { s.maxResentRuns = n }
