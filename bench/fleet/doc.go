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
// Everything is in _test.go files.
package fleet
