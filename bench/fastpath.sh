#!/usr/bin/env bash
# The fast-path figures of one run, side by side: connection set-up added
# to a direct connection, the decision engine's latency with 1 000
# endpoints, inspected HTTPS against direct requests (Python's client on
# HTTP/1.1, and curl on h2 and on HTTP/1.1), the supervisor's
# memory idle and with 1 000 tunnels, and its CPU time per GB relayed.
# Tunnel throughput and start-up have their own scripts (bench/tunnel.sh,
# bench/startup.sh). Needs root; every comparison runs on the project's
# own test hosts (a network namespace the Go benchmarks create and
# remove).
#
#   bench/fastpath.sh            # one run of each
#   COUNT=3 bench/fastpath.sh    # three, each figure the median
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=0
count="${COUNT:-1}"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT

go test -run '^$' -bench 'ConnectionSetup|InspectedRequests|SupervisorRSS|RelayCPU' \
	-benchtime 1x -count "$count" ./test/bench/ | tee -a "$out"
go test -run '^$' -bench 'Decide1000' -benchtime 20000x -count "$count" ./internal/egress/decide/ | tee -a "$out"

# metric BENCH UNIT: the median over the runs of the value reported in UNIT
# by the benchmark whose name starts with BENCH.
metric() {
	awk -v b="$1" -v u="$2" '
		index($1, b) == 1 { for (i = 3; i < NF; i++) if ($(i+1) == u) v[n++] = $i }
		END {
			if (n == 0) { print "-"; exit }
			for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
			m = v[int((n - 1) / 2)]
			printf(m >= 1000 ? "%.0f" : "%.4g", m)
		}' "$out"
}

echo
printf '%-44s %-12s %s\n' "fast path, median of $count run(s)" measured target
printf '%-44s %-12s %s\n' \
	"connection set-up added p50 (µs)" "$(metric BenchmarkConnectionSetup added_p50_µs)" "≤ 300" \
	"connection set-up added p99 (µs)" "$(metric BenchmarkConnectionSetup added_p99_µs)" "≤ 2000" \
	"  of which connect() itself, p50 (µs)" "$(metric BenchmarkConnectionSetup connect_added_p50_µs)" "(the connect noted)" \
	"decision p99, 1000 endpoints, go (µs)" "$(metric BenchmarkDecide1000/go p99-µs)" "≤ 20" \
	"decision p99, 1000 endpoints, rego (µs)" "$(metric BenchmarkDecide1000/rego p99-µs)" "(reference)" \
	"inspected HTTPS / direct req/s, repeated" "$(metric BenchmarkInspectedRequests/repeated ratio)" "≥ 0.5" \
	"inspected HTTPS added p50, repeated (µs)" "$(metric BenchmarkInspectedRequests/repeated added_p50_µs)" "≤ 200" \
	"inspected HTTPS / direct req/s, unique" "$(metric BenchmarkInspectedRequests/unique ratio)" "≥ 0.5" \
	"inspected HTTPS added p50, unique (µs)" "$(metric BenchmarkInspectedRequests/unique added_p50_µs)" "≤ 200" \
	"inspected HTTPS / direct req/s, curl h2" "$(metric BenchmarkInspectedRequestsCurl/http2 ratio)" "≥ 0.5" \
	"inspected HTTPS / direct req/s, curl 1.1" "$(metric BenchmarkInspectedRequestsCurl/http1.1 ratio)" "≥ 0.5" \
	"supervisor RSS idle (MiB)" "$(metric BenchmarkSupervisorRSS idle_MiB)" "≤ 40" \
	"supervisor RSS, 1000 tunnels (MiB)" "$(metric BenchmarkSupervisorRSS 1000_tunnels_MiB)" "≤ 120" \
	"supervisor CPU per GB relayed (s)" "$(metric BenchmarkRelayCPU cpu_s/GB)" "(lower is better)"
