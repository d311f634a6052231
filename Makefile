# faultline — the two commands are `make run` and `make test`.
SHELL := /usr/bin/env bash
GO    ?= go
# Build and test with the toolchain go.mod pins (SECURITY.md, "Toolchain"),
# downloaded from the module proxy when the installed go is older.
export GOTOOLCHAIN ?= auto
# go-nvml's cgo header marks the NVML calls that driver 13 deprecates, and a
# cold build printed 29 such warnings; -w keeps the output to what matters.
export CGO_CFLAGS ?= -O2 -g -w
BIN   := bin
# Fuzz targets run for a bounded time by `make test` (package:target).
FUZZ_TARGETS := ./gateway:FuzzDecodeValidate ./gateway:FuzzCodecMatchesProto ./gateway:FuzzShapeJSON ./gateway:FuzzDecodeSubmitFastMatchesProtojson \
	./agents/kmsg:FuzzParserEventsValid ./agents/fabric:FuzzEvaluateEventsValid ./agents/nic:FuzzPollEventsValid ./agents/csp:FuzzCheck ./agents/conformance:FuzzCheck \
	./agents/gpu:FuzzReplay ./agents/topology:FuzzParse ./agents/preflight/dcgm:FuzzParse ./agents/preflight/nccl:FuzzParse \
	./agents/agent:FuzzLoadConfig ./schemas/validate:FuzzValidNodeName ./processors/rows:FuzzDecode
# Not fuzzed here (their seeds run with the tests): ./cmd/faultline:FuzzLoadConfig and
# ./agents/preflight/webhook:FuzzAdmitPod, whose instrumented builds took 3m22s and 1m45s of CI.
FUZZTIME ?= 20s
# The test binaries are linked without their symbol table and DWARF (-s,
# which implies -w): stack traces, t.Helper and pprof read the runtime's
# own tables, and the 67 test binaries link in 225 s of CPU instead of 321 s
# (2026-12-06, 2 cores), each run, since a fresh clone compiles and links
# its own packages again.
TEST_LDFLAGS ?= -s

# Tests run again on a two-shard ClickHouse cluster (Distributed tables) by
# test-clickhouse-cluster: the correlation rules, analytics and history.
CLUSTER_TESTS := ^(TestRules|TestSXidXidIncident|TestQueries|TestListEvents|TestListActions|TestFleet)$$
CLUSTER_PKGS  := ./processors/correlate ./internal/analytics ./internal/history ./internal/fleet

.PHONY: all build run test test-unit test-fuzz test-clickhouse-cluster test-bench-smoke testenv generate bench vet clean images

all: build

## build: the binaries into bin/
build:
	$(GO) build -o $(BIN)/ ./cmd/faultline ./agents/cmd/faultline-agent ./agents/cmd/faultline-preflight

## images: OCI images of the three binaries into bin/images (no Docker daemon; deploy/images)
images:
	$(GO) run ./deploy/images --out $(BIN)/images $(if $(VERSION),--version $(VERSION)) $(if $(PLATFORM),--platform $(PLATFORM))

## run: the whole pipeline in one process on embedded defaults (faultline dev)
run: build
	scripts/dev-deps.sh
	$(BIN)/faultline dev $(ARGS)

## testenv: install (idempotently, cached) the real Kafka, ClickHouse, ZooKeeper and Kubernetes servers, chdb-core, sushy-tools and moto
testenv:
	scripts/testenv/install.sh all

## test: every test, against real servers, plus bounded fuzzing — what .ci/run calls
# testenv and vet side by side: on a fresh machine vet compiles the
# module's dependencies (which the tests reuse) while the servers install.
test:
	$(MAKE) -j2 testenv vet
	eval "$$(scripts/testenv/env.sh)" && FAULTLINE_REQUIRE_SERVERS=1 GO=$(GO) scripts/gotest.sh -timeout 30m -count=1 -ldflags=$(TEST_LDFLAGS) -- ./...
	$(MAKE) test-clickhouse-cluster
	$(MAKE) test-bench-smoke
	$(MAKE) test-fuzz

## test-clickhouse-cluster: the ClickHouse-reading tests again on a two-shard cluster (sql/README.md)
test-clickhouse-cluster:
	eval "$$(scripts/testenv/env.sh)" && FAULTLINE_REQUIRE_SERVERS=1 FAULTLINE_TEST_CLICKHOUSE_CLUSTER=sharded \
	  GO=$(GO) scripts/gotest.sh -timeout 20m -count=1 -ldflags=$(TEST_LDFLAGS) -run '$(CLUSTER_TESTS)' -- $(CLUSTER_PKGS)

## test-bench-smoke: loadtest's Go benchmarks run twice each (seconds), so they cannot rot; their figures come from `make bench` or RESULTS.md's commands
test-bench-smoke:
	eval "$$(scripts/testenv/env.sh)" && FAULTLINE_REQUIRE_SERVERS=1 GO=$(GO) scripts/gotest.sh -timeout 10m -count=1 -ldflags=$(TEST_LDFLAGS) -run '^$$' -bench . -benchtime 2x -- ./loadtest

## test-unit: the fast tests only (servers not required; those tests skip)
test-unit:
	$(GO) test -short ./...

test-fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) FUZZFLAGS=-ldflags=$(TEST_LDFLAGS) scripts/fuzz.sh $(FUZZ_TARGETS)

vet:
	$(GO) vet ./...
	@unformatted=$$("$$($(GO) env GOROOT)/bin/gofmt" -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt: these files are not formatted (gofmt -w them):"; echo "$$unformatted"; exit 1; fi

## generate: regenerate code and the OpenAPI document from schemas/proto
generate:
	scripts/generate.sh

## bench: the Go benchmarks (numbers are recorded in the READMEs)
bench:
	eval "$$(scripts/testenv/env.sh)" && $(GO) test -run '^$$' -bench . -benchtime 2s ./...

clean:
	rm -rf $(BIN)
