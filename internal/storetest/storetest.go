// Package storetest is the conformance suite of vibejobs.Store: every store
// (internal/sqlite, internal/postgres) runs it from its own tests with
//
//	func TestStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) vibejobs.Store { return mustOpen(t) })
//	}
//
// The suite checks the behaviour documented on vibejobs.Store and nothing
// that is a store's own choice. Every time it passes is explicit (a fixed
// fake clock around T0); it never sleeps.
package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/vibejobs/vibejobs"
)

// T0 is the fake "now" of the suite.
var T0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// Margin is the lease margin the suite claims with.
const Margin = 5 * time.Second

// Run runs the suite. open returns a new, empty, migrated Store for one
// subtest and closes it when that subtest ends (t.Cleanup); no two subtests
// share data. The Store's own clock (for the one method without a time
// argument, NextDueAt) must be fixed at T0.
func Run(t *testing.T, open func(t *testing.T) vibejobs.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, f *fixture)
	}{
		{"Ping", testPing},
		{"Closed", testClosed},
		{"Projects", testProjects},
		{"ListProjectsPagination", testListProjectsPagination},
		{"Tokens", testTokens},
		{"TokenLimit", testTokenLimit},
		{"TokenLimitConcurrent", testTokenLimitConcurrent},
		{"ListTokensPagination", testListTokensPagination},
		{"PruneRevokedTokens", testPruneRevokedTokens},
		{"UpdateRollsBack", testUpdateRollsBack},
		{"TxReadsItsWrites", testTxReadsItsWrites},

		{"JobRoundTrip", testJobRoundTrip},
		{"UpdateJob", testUpdateJob},
		{"ListJobsPagination", testListJobsPagination},
		{"ListJobsPaginationWhileChanging", testListJobsPaginationWhileChanging},
		{"PageValidation", testPageValidation},
		{"ProjectIsolation", testProjectIsolation},
		{"DeleteJob", testDeleteJob},
		{"CountJobs", testCountJobs},
		{"DeleteFutureRuns", testDeleteFutureRuns},
		{"WithdrawHeldRuns", testWithdrawHeldRuns},
		{"AddSkippedRuns", testAddSkippedRuns},
		{"LastRun", testLastRun},
		{"SecretRotation", testSecretRotation},
		{"MasterKey", testMasterKey},

		{"CreateAndGetRun", testCreateAndGetRun},
		{"ManualRunsNeverMerged", testManualRunsNeverMerged},
		{"ListRuns", testListRuns},
		{"ListRunsPaginationWhileChanging", testListRunsPaginationWhileChanging},

		{"DueJobs", testDueJobs},
		{"DueJobsAfter", testDueJobsAfter},
		{"ApplyRunPlans", testApplyRunPlans},
		{"ApplyRunPlansSkipped", testApplyRunPlansSkipped},
		{"ApplyRunPlansCompletesOneOff", testApplyRunPlansCompletesOneOff},
		{"ApplyRunPlansResent", testApplyRunPlansResent},
		{"ApplyRunPlansConcurrent", testApplyRunPlansConcurrent},
		{"RunDueAfterDeadlineRefused", testRunDueAfterDeadlineRefused},

		{"ClaimOrderAndLimit", testClaimOrderAndLimit},
		{"ClaimDeadline", testClaimDeadline},
		{"ClaimUsesCurrentJobSettings", testClaimUsesCurrentJobSettings},
		{"ClaimConcurrent", testClaimConcurrent},
		{"ClaimRecordConcurrent", testClaimRecordConcurrent},
		{"AttemptNumberingAcrossRetries", testAttemptNumberingAcrossRetries},
		{"ClaimCarriesDueTime", testClaimCarriesDueTime},
		{"LateDecidedOnceAtFirstAttempt", testLateDecidedOnce},
		{"RecordOutcomes", testRecordOutcomes},
		{"RecordRetryAfterDeadline", testRecordRetryAfterDeadline},
		{"RecordOutcomesDropped", testRecordOutcomesDropped},
		{"RecoverExpiredLeases", testRecoverExpiredLeases},
		{"RecoverExpiredLeasesRetrying", testRecoverExpiredLeasesRetrying},
		{"RecoverExpiredLeasesEnds", testRecoverExpiredLeasesEnds},
		{"RecoverExpiredLeasesLimit", testRecoverExpiredLeasesLimit},
		{"RecoverWithdrawnRunOfDeletedJob", testRecoverWithdrawnRunOfDeletedJob},
		{"ReleaseClaims", testReleaseClaims},
		{"ReleaseOfARedelivery", testReleaseOfARedelivery},
		{"ReleaseWithALaterDue", testReleaseWithALaterDue},
		{"ReleaseDueAfterItsDeadline", testReleaseDueAfterItsDeadline},
		{"ReleaseKeepsLateOfASentFirstAttempt", testReleaseKeepsLateOfASentFirstAttempt},
		{"ReleaseOfARecoveredClaim", testReleaseOfARecoveredClaim},
		{"ReleaseWhenAttemptsAreUsedUp", testReleaseWhenAttemptsAreUsedUp},
		{"ReleaseKeepsItsPlaceInLine", testReleaseKeepsItsPlaceInLine},
		{"NextDueAt", testNextDueAt},
		{"QueueStats", testQueueStats},
		{"RunsEnded", testRunsEnded},
		{"AttemptsRecorded", testAttemptsRecorded},

		{"FailExpiredRuns", testFailExpiredRuns},
		{"PruneRuns", testPruneRuns},
		{"PruneDeletedJobs", testPruneDeletedJobs},
		{"Idempotency", testIdempotency},
		{"IdempotencyAnswers", testIdempotencyAnswers},
		{"PruneIdempotencyKeys", testPruneIdempotencyKeys},
		{"Sessions", testSessions},

		{"EventsOfOutcomes", testEventsOfOutcomes},
		{"EventsOfCancellationsAndRecovery", testEventsOfCancellationsAndRecovery},
		{"EventsAppendedAtomically", testEventsAppendedAtomically},
		{"ListEventsFilters", testListEventsFilters},
		{"PruneEvents", testPruneEvents},
		{"Subscriptions", testSubscriptions},
		{"SubscriptionDelivery", testSubscriptionDelivery},
		{"SubscriptionClaimOrder", testSubscriptionClaimOrder},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			tc.fn(t, &fixture{t: t, s: s, ctx: context.Background()})
		})
	}
}

func testPing(t *testing.T, f *fixture) {
	if err := f.s.Ping(f.ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}
