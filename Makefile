# pgchangestream: common tasks. `make help` lists them.

GO        ?= go
TESTFLAGS ?=
# The whole suite, live PostgreSQL tests included, stays well under this.
TIMEOUT   ?= 15m

.PHONY: help test test-race test-container lint check-module-graph fmt bench bench-quick demo fuzz

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

test: lint check-module-graph test-race ## vet, format and module graph checks, then every test with the race detector (starts its own PostgreSQL)

# go test -json through internal/testprogress: a line per test and package as each finishes, the
# whole output of failures (with -v in TESTFLAGS, go test's own verbose output).
PROGRESS  = $(GO) run ./internal/testprogress

test-race: ## every test with the race detector (the benchmark command's report tests too)
	$(PROGRESS) $(GO) test -json -race -count=1 -timeout $(TIMEOUT) $(TESTFLAGS) ./...
	$(PROGRESS) $(GO) -C prometheus test -json -race -count=1 $(TESTFLAGS) ./...
	$(PROGRESS) $(GO) -C otel test -json -race -count=1 $(TESTFLAGS) ./...
	$(PROGRESS) $(GO) -C benchmarks test -json -race -count=1 $(TESTFLAGS) ./...

test-container: ## every test against PostgreSQL in a throwaway container (needs Docker)
	cd internal/pgtest/containers && $(GO) run . -dir $(CURDIR) -- $(GO) test -race -count=1 -timeout $(TIMEOUT) $(TESTFLAGS) ./...

lint: ## gofmt, go vet (every module), no tracked build outputs, golangci-lint when installed
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	.ci/check-tracked-files
	$(GO) vet ./...
	cd internal/pgtest/containers && $(GO) vet ./...
	cd benchmarks && $(GO) vet ./...
	cd prometheus && $(GO) vet ./...
	cd otel && $(GO) vet ./...
	@if command -v golangci-lint >/dev/null 2>&1; then golangci-lint run ./...; fi

check-module-graph: ## fail if a module importing the library would require container tooling or an observability client
	.ci/check-module-graph

fmt: ## format the code
	gofmt -w $$(git ls-files '*.go')

bench: ## run the benchmark command (fsync on) and rewrite docs/benchmarks.md and its charts (docs/benchmarks/*.svg)
	cd benchmarks && $(GO) run ./cmd/bench -out ../docs/benchmarks.md

bench-quick: ## a reduced benchmark run, printed only
	cd benchmarks && $(GO) run ./cmd/bench -quick

demo: ## crash a consumer five times on a throwaway PostgreSQL and check nothing is lost
	@echo "building the demo…"
	@$(GO) build -o bin/pgchangestream ./cmd/pgchangestream
	bin/pgchangestream demo

fuzz: ## fuzz the token parser, the pending ring, the config, the pipeline filter, the JSON decoder and the typed document reads for a minute each
	$(GO) test -run '^$$' -fuzz '^FuzzParseToken$$' -fuzztime 1m .
	$(GO) test -run '^$$' -fuzz '^FuzzPending$$' -fuzztime 1m ./internal/pending
	$(GO) test -run '^$$' -fuzz '^FuzzNew$$' -fuzztime 1m .
	$(GO) test -run '^$$' -fuzz '^FuzzMatchFilterJSON$$' -fuzztime 1m .
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeMatchesEncodingJSON$$' -fuzztime 1m .
	$(GO) test -run '^$$' -fuzz '^FuzzUnmarshalDocumentMatchesTheMapRoundTrip$$' -fuzztime 1m .
	$(GO) test -run '^$$' -fuzz '^FuzzDeltas$$' -fuzztime 1m .
