#!/usr/bin/env bash
# The gateway under load, with a real corral-gateway and real sandboxes on
# this host (local driver); nothing leaves the machine. Needs root.
#  * policy set -> the supervisor's LOADED status at the gateway, 50 sets on
#    one running sandbox: p50/p99 (targets p50 <= 100 ms, p99 <= 300 ms);
#  * 50 sandboxes created at once: create-to-ready p50/p99, time until all
#    are ready, gateway RSS idle and with the 50 running;
#  * log ingest: 4 supervisor credentials pushing batches of 500 for 10 s
#    (GATEWAY_INGEST_SECONDS), events/s stored on SQLite and entries lost
#    (target >= 20 000/s, none lost).
#
#   bench/gateway.sh                                  # this tree
#   CORRAL_BIN=/path/to/other/corral bench/gateway.sh # sandboxes of another corral
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=0
go test -run '^$' -bench 'Gateway' -benchtime 1x -count "${COUNT:-1}" -timeout 10m -v ./test/bench/ |
	grep -E 'policy set ->|sandboxes at once|log ingest|^Benchmark|^ok|FAIL|--- '
