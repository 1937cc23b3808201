#!/usr/bin/env bash
# Held connections: a sandboxed workload opens 1 000 and then 10 000
# connections at once to the project's own test hosts (a network namespace
# the Go benchmark creates and removes; nothing leaves the machine) and
# holds them. Reported: how many it got, the supervisor's descriptors and
# resident memory meanwhile, whether the sandbox's DNS and control socket
# still answered, and whether a fresh connection works after. Needs root.
#
#   bench/conns.sh                                   # this tree
#   CORRAL_BIN=/path/to/old/corral bench/conns.sh    # another build
#   CONNS_POLICY=$'limits:\n  connections: 20000\n' bench/conns.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=0
go test -run '^$' -bench HeldConnections -benchtime 1x -count "${COUNT:-1}" -timeout 10m -v ./test/bench/ |
	grep -E 'connections:|supervisor_|^ok|FAIL'
