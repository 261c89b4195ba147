# One command sets up and runs everything: make test.
GO ?= go

.PHONY: test setup vet race wallclock fuzz bench fast

test: setup vet race fuzz wallclock otel sdk

# The wall-clock suites: real timers at real rates, fleets of processes,
# adaptive fleets learning a provider's limit, Redis failovers, and the
# shared limiters' turns and the storms' probes timed to a few
# milliseconds. Their own step, last, with no other package's tests beside
# them (go test ./... runs two packages at once: a turn timed beside them
# came 5 ms late with no stall of its own process to show for it).
# Everything else runs on fake clocks or real Redis.
WALLCLOCK = ^Test(RealTime|Fleet|Adaptive(Fleet|Local)|Failover|Shared(LeakyBucketExact|TokenBucketExact|Bucket|RaiseBringsTurnsIn|DecreaseSpreadsGivenTurns)|ProbesAfterAHold|SmallBurstIsNoStorm|StormIsTold)

# The Redis tests run against a real redis-server on a loopback port; install
# the Debian package when it is missing (as root, or through sudo).
setup:
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null || { \
		echo "installing redis-server"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get install -y -q redis-server >/dev/null 2>&1 || \
		{ $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q redis-server >/dev/null; }; \
	}
	@redis-server --version

vet:
	$(GO) vet ./...

# The fast step, for a change in progress: every test under -race that needs
# neither Redis nor the wall clock (-short skips the Redis tests: see
# redistest, and the examples' demos, which run on the real clock; the
# property tests draw a quarter of their schedules), about 45 s on two
# cores once built. Not part of test, whose race step runs the same tests
# again beside the Redis ones and the demos.
fast:
	$(GO) test -race -short -count=1 -skip '$(WALLCLOCK)' ./...

race:
	$(GO) test -race -count=1 -timeout 10m -skip '$(WALLCLOCK)' ./...

# (They all live in the root package.) The step used 86 s of CPU in 305 s
# one suite after another: most suites wait on real time. Those that
# measure spacing and turns to a few milliseconds (the fleets of processes,
# the buckets' exact schedules and spacing) run alone, first; the loose
# ones, which count what a provider accepted in a second or a run, call
# t.Parallel and run four at a time after them: the three end-to-end dialect
# suites (TestRealTimeDialects...), each a third of a core busy, the
# failovers and the LLM runs. (A suite's cases run one after another: as
# parallel subtests, four cases at once, a case met one refusal more than
# its bound, and another used 20 of the 24 requests it must.) Not more: six at a time, a storm's 429s were
# taken for a lower limit. The storms' suites and the adaptive fleets run
# alone, and the stepped buckets' four runs beside each other only: beside
# the others, a small burst's refusals were taken for a storm, a fleet used
# 30 of its provider's 50 requests a second, and a stepped bucket met 4
# refusals where alone it meets 2.
wallclock:
	$(GO) test -race -count=1 -timeout 10m -parallel 4 -run '$(WALLCLOCK)' .

# A short, bounded run of each fuzz target on top of its seed corpus: a
# count of executions, not a duration. With a duration, Go's fuzzing
# coordinator before 1.27 may report "context deadline exceeded" as a
# failure when the time ends during a worker's call, with no failing input
# (golang/go#75804); a count has no deadline to race. A run takes about 18 s
# in the root package, whose test binary holds net/http and go-redis (the
# fuzzer checks every instrumented edge after each input), and about 3 s in
# internal/field, which holds the standard library alone.
FUZZTIME ?= 150000x
FUZZPKGS = . ./internal/field ./internal/usage ./internal/route ./internal/control
fuzz:
	@for p in $(FUZZPKGS); do \
		for f in $$($(GO) test -list '^Fuzz' $$p | grep '^Fuzz'); do \
			echo "fuzz $$p $$f for $(FUZZTIME)"; \
			$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$p || exit 1; \
		done; \
	done

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 5 .

# The chaos soak: about two minutes of Redis restarts, pauses, script and
# data flushes and a killed worker under a 4-process fleet; not part of test.
.PHONY: soak
soak: setup
	EGRESS_SOAK=1 $(GO) test -race -count=1 -timeout 5m -run '^TestChaosSoak$$' -v ./internal/soak/

# The OpenTelemetry adapter is its own module (egress itself does not depend
# on OpenTelemetry), so go test ./... above does not reach it; test runs it
# last.
.PHONY: otel
otel:
	cd otel && $(GO) vet ./... && $(GO) test -race -count=1 ./...

# The providers' SDKs (openai-go, anthropic-sdk-go, stripe-go) over egress,
# against the fake providers: a module of its own, so that the SDKs never
# enter egress's go.mod. Real time, about 15 s, after a build of about
# three minutes on a cold cache (the SDKs are large). The module holds
# tests only: go test runs vet's own checks on them, and a separate go vet
# would build the SDKs a second time, without -race. Its eleven tests run
# all at once (-parallel 12; the default is one a core): each spends its
# time waiting on real time.
.PHONY: sdk
sdk:
	cd sdk && $(GO) test -race -count=1 -parallel 12 ./...
