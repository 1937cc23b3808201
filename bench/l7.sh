#!/usr/bin/env bash
# L7 inspection benchmarks, each measured side by side with the same work
# done without corral (or through mitmproxy), on the project's own test
# hosts (a network namespace the Go benchmarks create and remove). Needs
# root; the mitmproxy comparison needs Debian's mitmproxy package
# (apt-get install mitmproxy) and is skipped without it.
#
#   bench/l7.sh              # requests/s and added latency, corral vs direct and vs mitmproxy
#   COUNT=3 bench/l7.sh      # repeat each benchmark
#
# The in-process pieces are Go benchmarks too: one inspected request over
# loopback, the engine's share of it, and the leaf-certificate cache.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=0
go test -run '^$' -bench 'Inspected' -benchtime 1x -count "${COUNT:-1}" ./test/bench/
go test -run '^$' -bench 'InspectedRequest' -benchtime 3000x ./internal/l7/inspect/
go test -run '^$' -bench 'DecideHTTP' -benchtime 5000x ./internal/egress/decide/
go test -run '^$' -bench 'Leaf' -benchtime 2000x ./internal/l7/ca/
