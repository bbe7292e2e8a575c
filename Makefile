# Switchyard — build, run and test.
# `make run` starts the whole stack on an embedded NATS; `make test` runs every test with -race.

GO        ?= go
BIN       := bin/switchyard
PKGS      := ./...
TOOLS_DIR := $(CURDIR)/.cache/tools
NATS_CLI  := $(TOOLS_DIR)/nats
NATSCLI_VERSION := v0.5.0
# nats-server is built from the version go.mod requires, the one the tests embed.
NATS_SERVER := $(TOOLS_DIR)/nats-server
export GOFLAGS ?=
# The version `switchyard version` and switchyard_build_info report.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS   := -X github.com/switchyard-llm/switchyard/internal/buildinfo.version=$(VERSION)

.PHONY: all build run cluster supercluster test test-cluster test-partition test-liveness test-supercluster partition-deps test-deps test-sdk-deps test-short bench bench-e2e bench-batch test-batch-kill bench-heap lint vet fmt tidy-check vulncheck fuzz lab lab-replay replay-check test-lab soak tools test-deploy clean

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/switchyard

# Dev state, NATS keys and creds persist in DEV_DATA across runs, so the
# creds files printed stay valid.
DEV_DATA ?= .cache/dev

run: build
	./$(BIN) dev --data $(DEV_DATA)

# The production shape on this machine, every part its own process on
# loopback: three nats-server processes from deploy/nats/cluster.conf, the
# bucket with three replicas, two brokers, two gateways, an adapter and a
# simulated engine per dev replica. Prints each gateway's URL once it serves;
# Ctrl-C stops everything. State, certificates and logs go to CLUSTER_DIR.
CLUSTER_DIR ?= .cache/cluster
cluster: build $(NATS_SERVER)
	$(GO) build -o bin/cluster ./cmd/cluster
	./bin/cluster -dir $(CLUSTER_DIR) -switchyard $(BIN) -nats-server $(NATS_SERVER)

# Two regions of one bus on this machine (scripts/supercluster.sh): a
# nats-server per region joined by a NATS gateway, and in each region a
# broker, a gateway and two simulated engines with their adapters, all with
# --region; the table in region a (its copy in b), spilling a -> b and b -> a. Prints each
# region's gateway URL; Ctrl-C stops everything. Ports from
# SUPERCLUSTER_PORT (default 14000) and the 16 above it.
SUPERCLUSTER_DIR ?= .cache/supercluster
SUPERCLUSTER_PORT ?= 14000
supercluster: build $(NATS_SERVER)
	BASE_PORT=$(SUPERCLUSTER_PORT) scripts/supercluster.sh $(SUPERCLUSTER_DIR) $(BIN) $(NATS_SERVER)

# The production shape under load while each kind of process is killed or
# stopped and restarted, and last a 2,000-line batch while the NATS node
# leading its items and broker-1 are SIGKILLed; prints the per-fault table
# of docs/reliability.md.
test-cluster: $(NATS_SERVER)
	SWITCHYARD_CLUSTER_FAULTS=1 NATS_SERVER=$(NATS_SERVER) $(GO) test -count=1 -run '^TestProductionShapeSurvivesLosingAnyProcess$$' -v -timeout 15m ./test

# The production shape of `make cluster` with each NATS server, the GPU
# site's leaf node, each broker and each gateway in a network namespace of its
# own, joined by bridges (cmd/cluster -netns), under test-cluster's load while
# links are set down and up: a NATS server cut from the two others and its
# clients, the GPU site's leaf link, a gateway cut from every NATS server, a
# broker. Fails on a request lost or hung, routing not normal within 60 s,
# the table not writable within 60 s, a gateway unready later than 5 s after
# its cut or slow to answer 503 while unready, any key of the table differing
# between the servers after healing. Writes its figures into
# docs/reliability.md (## Partitions). Needs root and network namespaces (CI
# runs as root on Debian; iproute2 is installed from apt when missing);
# without them it says why and fails, unless PARTITION_SKIP_OK=1. About 5
# minutes after the build on 2 cores.
PARTITION_SKIP_OK ?=
test-partition: $(NATS_SERVER) partition-deps
	SWITCHYARD_PARTITIONS=1 SWITCHYARD_PARTITION_DOC=$(CURDIR)/docs/reliability.md PARTITION_SKIP_OK=$(PARTITION_SKIP_OK) \
	  NATS_SERVER=$(NATS_SERVER) $(GO) test -count=1 -run '^TestProductionShapeSurvivesPartitions$$' -v -timeout 20m ./test

# The production shape of `make cluster` under test-cluster's load with
# LIVENESS_BUSY spinning loops beside it for LIVENESS_DURATION: fails if any
# part's NATS connection gave up a server that was alive (the liveness check
# of docs/deploy.md), or a request was lost or hung.
LIVENESS_DURATION ?= 5m
LIVENESS_BUSY ?= 3
test-liveness: $(NATS_SERVER)
	SWITCHYARD_LIVENESS=1 LIVENESS_DURATION=$(LIVENESS_DURATION) LIVENESS_BUSY=$(LIVENESS_BUSY) NATS_SERVER=$(NATS_SERVER) \
	  $(GO) test -count=1 -run '^TestNoFalseReconnectsUnderLoad$$' -v -timeout 20m ./test

# Regions (docs/reliability.md, "Regions"): two regions on one embedded bus
# (TestRegionsOnOneBus: local first, spill when saturated, fail over,
# residency, a bad spill list refused); the spill penalty measured
# (TestSpillPenaltyIsTheMeasuredRoundTrip); then a real supercluster with
# the link between its regions cut: TestNamespacedRegionsCutAndHeal and
# TestRegionsKeepServingWhenTheLinkIsCut run a nats-server process per
# region in a network namespace of its own, the gateway between them over a
# veth set down and up, region b reading its copy of the table. Fails on a
# request lost or hung (the timeout), an avoidable failure or an
# expectation missed; prints each scenario's row (-v). The namespaces need
# root; without them it says why and fails, unless SUPERCLUSTER_SKIP_OK=1.
# `make test` runs the same tests with the link a loopback relay. About 3
# minutes on 2 cores.
SUPERCLUSTER_SKIP_OK ?=
test-supercluster: $(NATS_SERVER) partition-deps
	SWITCHYARD_SUPERCLUSTER=1 NATS_SERVER=$(NATS_SERVER) SUPERCLUSTER_SKIP_OK=$(SUPERCLUSTER_SKIP_OK) \
	  $(GO) test -race -count=1 -run '^(TestRegionsOnOneBus|TestSpillPenaltyIsTheMeasuredRoundTrip|TestRegionsKeepServingWhenTheLinkIsCut|TestNamespacedRegionsCutAndHeal)$$' -v -timeout 10m ./test

partition-deps:
	@command -v ip >/dev/null || [ "$$(id -u)" != 0 ] || (apt-get update && apt-get install -y iproute2)

# The nats CLI and nats-server are used by the end-to-end tests; the CLI is
# built from the Go module proxy once, the server from go.mod's version, and
# both are cached in .cache/tools.
tools: $(NATS_CLI) $(NATS_SERVER)

$(NATS_CLI):
	GOBIN=$(TOOLS_DIR) $(GO) install github.com/nats-io/natscli/nats@$(NATSCLI_VERSION)

$(NATS_SERVER): go.mod
	$(GO) build -o $@ github.com/nats-io/nats-server/v2

# The dashboard test drives headless Chromium; CI runs as root on Debian, so
# the package is installed from apt when it is missing.
test-deps:
	command -v chromium || (apt-get update && apt-get install -y chromium)

# The SDK tests (test/sdk_test.go) call the stack with the npm packages
# test/sdk/package.json pins; npm ci installs them when the lock changed.
SDK_DIR := test/sdk
test-sdk-deps: $(SDK_DIR)/node_modules/.package-lock.json

$(SDK_DIR)/node_modules/.package-lock.json: $(SDK_DIR)/package.json $(SDK_DIR)/package-lock.json
	command -v npm || (apt-get update && apt-get install -y nodejs npm)
	cd $(SDK_DIR) && npm ci --no-audit --no-fund

test: tools vet test-deps test-sdk-deps
	NATS_CLI=$(NATS_CLI) NATS_SERVER=$(NATS_SERVER) $(GO) test -race -count=1 -timeout 20m $(PKGS)
	$(MAKE) test-lab

test-short:
	$(GO) test -race -short -count=1 $(PKGS)

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

lint: vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# go.mod and go.sum must be what `go mod tidy` makes of them.
tidy-check:
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run go mod tidy"; exit 1; }

# Known vulnerabilities in the code paths this module uses; skipped, saying
# so, when the vulnerability database cannot be reached.
vulncheck:
	GO=$(GO) ./scripts/vulncheck.sh

# The Kubernetes manifests (deploy/kubernetes) rendered and checked against
# the binary built from this checkout. The test is a module of its own so the
# Kubernetes API types never enter Switchyard's; `make test` does not run it,
# .ci/run does.
test-deploy:
	cd deploy/kubernetes && $(GO) mod tidy -diff && $(GO) vet ./... && $(GO) test -count=1 -timeout 10m ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

# Direct vs. httputil.ReverseProxy vs. Switchyard in front of one fixed-latency
# engine, open loop, on this machine, beside the bus floor (nats-floor: the
# same messages through the same NATS server, nothing else), then thousands
# of open streams through the proxy and Switchyard side by side; prints one
# verdict line per target and rewrites the bench-e2e sections of
# docs/benchmarks.md (about 10 minutes on a quiet machine; each phase first
# waits up to -settle for the load average to fall to 1.0).
# BENCH_E2E_FLAGS go to cmd/benche2e (-only-many reruns the many-streams
# phase alone).
bench-e2e:
	GO=$(GO) ./scripts/bench-e2e.sh $(BENCH_E2E_FLAGS)

# A 10,000-line batch beside steady interactive traffic through the
# in-process stack: the batch's lines per second against the pool's spare
# capacity, and the interactive p99 TTFT with and without it, each marked
# met or not (about five minutes: the batch phase stops at three and a half).
bench-batch:
	SWITCHYARD_BENCH_BATCH=1 $(GO) test -count=1 -run '^TestBatchBenchmark$$' -v -timeout 10m ./test

# A 10,000-line batch while its batcher process is SIGKILLed and restarted
# twice: it completes with exactly one output line per custom_id, within 4
# minutes (the test's own limit; 5 with the build).
test-batch-kill:
	SWITCHYARD_BATCH_KILL=1 $(GO) test -race -count=1 -run '^TestBatchSurvivesTwoKilledBatchers$$' -v -timeout 5m ./test

# 100,000 requests through the in-process stack; the live heap must stay flat.
bench-heap:
	SWITCHYARD_HEAP=1 $(GO) test -count=1 -run TestHeapFlat -v -timeout 10m ./test

# Mixed load for SOAK (default 60s) with engines killed and restarted and
# adapters stopped and started; fails on any request lost (neither complete
# nor an explicit error) and on any answer that failed mid-way without
# continuing on another replica. `make test` runs a 6 s version of the same test.
SOAK ?= 60s
soak:
	SWITCHYARD_SOAK=$(SOAK) $(GO) test -race -count=1 -run '^TestSoak$$' -v -timeout 10m ./test

FUZZTIME ?= 20s
fuzz:
	@for t in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
	  for f in $$(grep -h '^func Fuzz' $$t/*_test.go | sed 's/func \(Fuzz[A-Za-z0-9_]*\).*/\1/'); do \
	    echo "== $$t $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$t || exit 1; \
	  done; \
	done

# The routing lab: every experiment in virtual time, report.md + charts + CSV.
LAB_OUT ?= lab-out
lab: build
	./$(BIN) lab all --out $(LAB_OUT)

# The lab's experiment tests run without -race (the detector slows the
# simulator about tenfold; under -race they skip).
# The trace replays of docs/lab: the Mooncake slices in lab/testdata, --quick.
lab-replay: build
	./$(BIN) lab replay --quick --trace lab/testdata/mooncake/conversation_trace.jsonl --out docs/lab/replay-conversation
	./$(BIN) lab replay --quick --trace lab/testdata/mooncake/synthetic_trace.jsonl --out docs/lab/replay-synthetic

# The lab against the system on the same traffic: 2,000 requests of
# Mooncake's conversation slice through `switchyard dev --speed 8` with
# `switchyard bench --trace`, and through `switchyard lab replay --profile
# dev` at the same speedup (the dev pool at about 80% of its capacity),
# printed side by side. Fails when the hit rates differ by more than 3
# points; the TTFT differences are figures (docs/benchmarks.md, "Lab against
# system"). About six minutes.
replay-check:
	SWITCHYARD_REPLAY_CHECK=1 $(GO) test -count=1 -run '^TestReplayCheck$$' -v -timeout 15m ./test

test-lab:
	$(GO) test -count=1 -timeout 20m -run 'TestLab' ./lab/...

clean:
	rm -rf bin .cache $(SDK_DIR)/node_modules
