// Package fleet holds a scenario test that puts egress and its peers in
// front of the same fake provider, as a fleet of simulated pods, and
// measures at the provider what each client strategy does to it: how much
// is accepted, how many 429s it draws, how many calls fail, and how close
// it comes to the provider's limit without going over it.
//
//	cd bench && go test -run TestFleetScenarios -v ./fleet/ -count=1
//
// It takes about three minutes and is skipped under -short. With
// EGRESS_FLEET_OUT=path the tables are also written to path, as markdown.
//
// TestFleetSize runs fleets of 4 × 8, 64 × 1 and 256 × 1 instances ×
// workers, egress's shared limiters beside redis_rate, and reports the
// share of the rate, 429s, the most requests sent in a second against
// R + B, p50 and p99 against the FIFO ideal, and Redis round trips per
// success (a hook counts every command and pipeline of the pods' clients):
//
//	cd bench && go test -run TestFleetSize -v ./fleet/ -count=1
//	cd bench && EGRESS_FLEETSIZE_ONLY=64x1 go test -run 'TestFleetSize/64x1/egress_SharedTokenBucket' -v ./fleet/ -count=1
//
// It runs only when named in -run or with EGRESS_FLEETSIZE=1.
//
// TestFleetProcesses runs the same fleets with the instances in separate
// processes, each with its own Go runtime, scheduler and garbage
// collector: 64 × 1 as 8 processes of 8 instances and 256 × 1 as 16 of
// 16 (EGRESS_FLEETPROCS_ONLY=64x1x1: 64 processes of one). The processes
// are this test binary again, running TestFleetProcChild; they start their
// load at one agreed instant and report as one line of JSON, and the table
// is TestFleetSize's, with 429s and the most sent in a second counted where
// the provider received them. About a minute and a half; it runs only when
// named in -run or with EGRESS_FLEETPROCS=1:
//
//	cd bench && go test -run TestFleetProcesses -v ./fleet/ -count=1
//
// Everything is in _test.go files.
package fleet
