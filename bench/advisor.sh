#!/usr/bin/env bash
# The policy advisor's figures, measured in-process on the supervisor's
# real decision path (gate, reloader, decision engine, audit file, draft
# store), without a sandbox or any network:
#   denial_to_draft_p50_ms      first denied connection → its pending draft
#                               (target ≤ 1000)
#   approval_to_allowed_p50_ms  approval (re-check, reload, store) → first
#                               allowed connection (target ≤ 200)
#   observe ns/op               the advisor's cost per denied connection
#                               event (target ≤ 5000), and a denied
#                               connection with and without the advisor.
#
#   bench/advisor.sh                 # 20 hosts
#   ADVISOR_RUNS=50 bench/advisor.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=0
out=$(go test -run '^$' -bench 'Advisor' -benchtime 1x -timeout 10m ./test/bench/ 2>&1) || { echo "$out" >&2; exit 1; }
lat=$(grep '^BenchmarkAdvisorLatency' <<<"$out") || { echo "$out" >&2; exit 1; }
awk '{ for (i = 5; i < NF; i += 2) printf "%-32s %9.2f\n", $(i+1), $i }' <<<"$lat"
# The per-denial costs need many iterations to be worth reading.
out=$(go test -run '^$' -bench 'AdvisorObserve|AdvisorDeniedConnection' -benchtime 2s -timeout 10m ./test/bench/ 2>&1) || { echo "$out" >&2; exit 1; }
grep -E '^BenchmarkAdvisor' <<<"$out" | awk '{ printf "%-60s %9.0f ns/op\n", $1, $3 }'
