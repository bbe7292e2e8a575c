#!/bin/sh
# End-to-end benchmark of Switchyard against direct engine access and a plain
# httputil.ReverseProxy, all on this machine (see cmd/benche2e). Rewrites the
# bench-e2e section of docs/benchmarks.md; the raw reports and the CPU
# profile of the Switchyard process go to .cache/bench/. It first runs
# BenchmarkDecide/candidates=64, and prints one verdict line per target.
# Extra arguments go to benche2e (e.g. -duration 10s -budget 2m).
set -eu
cd "$(dirname "$0")/.."
GO=${GO:-go}
export GO
out=.cache/bench
mkdir -p bin "$out"
"$GO" build -o bin/benche2e ./cmd/benche2e
exec ./bin/benche2e \
	-out docs/benchmarks.md \
	-json "$out/e2e.json" \
	-cpuprofile "$out/switchyard.cpu.pprof" \
	-decide-bench ./broker/policy \
	"$@"
