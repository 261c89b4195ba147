// Package priority holds a scenario test that measures egress's priorities
// and fair shares (WithPriorities) beside its nearest peers: failsafe-go's
// PriorityLimiter with its RateLimiter, a bottleneck-style priority heap
// over x/time/rate, and egress in arrival order, in one process and as a
// fleet of four instances sharing one limit in Redis. Three scenarios: an
// interactive stream beside a backfill, a high-priority flood over normal
// and low work, and tenants of one priority sharing a limit in requests and
// in tokens. See TestPriorityScenarios.
//
//	cd bench && go test -run TestPriorityScenarios -v ./priority/ -count=1
//	cd bench && EGRESS_PRIORITY_ONLY=1 go test -run TestPriorityScenarios -v ./priority/ -count=1
//
// It takes about three and a half minutes and is skipped under -short.
// With EGRESS_PRIORITY_OUT=path the tables are also written to path, as
// markdown. Everything else is in _test.go files.
package priority
