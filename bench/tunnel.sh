#!/usr/bin/env bash
# Tunnels at wire speed: curl downloads one large file from a Python
# http.server on the project's own test hosts (a network namespace the Go
# benchmark creates and removes; nothing leaves the machine) directly from
# the host, inside `corral run` through the transparent path, and inside
# through CONNECT (curl -p -x), over HTTP and HTTPS, interleaved run by run.
# Prints the median speed of each and its ratio to the direct download
# (target: ratio >= 0.9). Needs root, curl and python3.
#
#   bench/tunnel.sh                                  # this tree
#   CORRAL_BIN=/path/to/old/corral bench/tunnel.sh   # another build
#   CORRAL_BASE=/path/to/old/corral bench/tunnel.sh  # both, side by side
#   TUNNEL_MB=512 TUNNEL_RUNS=9 bench/tunnel.sh      # bigger file, more runs
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=0
out=$(go test -run '^$' -bench 'TunnelCurl$' -benchtime 1x -timeout 30m ./test/bench/ 2>&1) || true
line=$(grep '^BenchmarkTunnelCurl' <<<"$out") || { echo "$out" >&2; exit 1; }
echo "file ${TUNNEL_MB:-256} MiB, median of ${TUNNEL_RUNS:-5} runs"
# The benchmark line is "name N ns/op" then value/unit pairs.
awk '{ for (i = 5; i < NF; i += 2) printf "%-42s %9.2f\n", $(i+1), $i }' <<<"$line"
