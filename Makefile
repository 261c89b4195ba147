# One command sets up and runs everything: make test.
GO ?= go

.PHONY: test vet race fuzz bench

test: vet race fuzz

vet:
	$(GO) vet ./...

race:
	$(GO) test -race -count=1 -timeout 10m ./...

# A short, bounded run of each fuzz target on top of its seed corpus.
FUZZTIME ?= 10s
fuzz:
	@for f in $$($(GO) test -list '^Fuzz' . | grep '^Fuzz'); do \
		echo "fuzz $$f for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) . || exit 1; \
	done

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 5 .
