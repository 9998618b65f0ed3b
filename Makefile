# pgchangestream: common tasks. `make help` lists them.

GO        ?= go
TESTFLAGS ?=
# The whole suite, live PostgreSQL tests included, stays well under this.
TIMEOUT   ?= 15m

.PHONY: help test test-race lint fmt bench bench-quick demo fuzz

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

test: lint test-race ## vet, format check, then every test with the race detector (starts its own PostgreSQL)

test-race: ## every test with the race detector (the benchmark command's report tests too)
	$(GO) test -race -count=1 -timeout $(TIMEOUT) $(TESTFLAGS) ./...
	cd benchmarks && $(GO) test -race -count=1 $(TESTFLAGS) ./...

lint: ## gofmt, go vet (both modules), golangci-lint when installed
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags testcontainers ./internal/pgtest/
	cd benchmarks && $(GO) vet ./...
	@if command -v golangci-lint >/dev/null 2>&1; then golangci-lint run ./...; fi

fmt: ## format the code
	gofmt -w $$(git ls-files '*.go')

bench: ## run the benchmark command (fsync on) and rewrite docs/benchmarks.md
	cd benchmarks && $(GO) run ./cmd/bench -out ../docs/benchmarks.md

bench-quick: ## a reduced benchmark run, printed only
	cd benchmarks && $(GO) run ./cmd/bench -quick

demo: ## crash a consumer five times on a throwaway PostgreSQL and check nothing is lost
	$(GO) run ./cmd/pgchangestream demo

fuzz: ## fuzz the token parser, the pending ring and the JSON decoder for a minute each
	$(GO) test -run '^$$' -fuzz '^FuzzParseToken$$' -fuzztime 1m .
	$(GO) test -run '^$$' -fuzz '^FuzzPending$$' -fuzztime 1m .
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeMatchesEncodingJSON$$' -fuzztime 1m .
