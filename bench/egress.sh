#!/usr/bin/env bash
# Egress benchmarks, each measured side by side with the same work done
# without corral, on the project's own test hosts (a network namespace this
# script's Go benchmarks create and remove). Needs root.
#
#   bench/egress.sh                 # throughput, connection set-up, supervisor RSS
#   COUNT=3 bench/egress.sh         # repeat each benchmark
#
# Decision latency with 1 000 endpoints is a Go benchmark of the engine:
#   go test -run '^$' -bench Decide1000 ./internal/egress/decide/
# bench/fastpath.sh prints the fast-path figures of one run as a table.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=0
go test -run '^$' -bench . -benchtime 1x -count "${COUNT:-1}" ./test/bench/
go test -run '^$' -bench Decide1000 -benchtime 20000x ./internal/egress/decide/
