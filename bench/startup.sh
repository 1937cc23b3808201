#!/usr/bin/env bash
# Start-up cost of a sandbox: `corral run -- true` against
# `bwrap --unshare-all ... true`, measured side by side in one hyperfine run
# so machine noise hits both equally. Prints each mean and the ratio.
#
#   bench/startup.sh             # block mode (built-in default policy)
#   MODE=proxy bench/startup.sh  # proxy mode (capture, DNS and proxies set up)
#   RUNS=200 bench/startup.sh    # more runs
#   CORRAL_BIN=/path/to/other/corral bench/startup.sh   # another build
#   TRACE=1 bench/startup.sh     # also print one run's start-up trace
#
# Needs root (bwrap's --unshare-all and corral's cgroups), bubblewrap and
# hyperfine (apt-get install bubblewrap hyperfine).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${RUNS:-100}
for tool in bwrap hyperfine jq; do
	command -v "$tool" >/dev/null || { echo "bench/startup.sh: $tool is required (apt-get install bubblewrap hyperfine jq)" >&2; exit 2; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bin=${CORRAL_BIN:-}
if [ -z "$bin" ]; then
	bin="$work/corral"
	# As installed: carrying the init program it starts each sandbox with.
	go generate ./internal/sandbox/initbin
	CGO_ENABLED=0 go build -o "$bin" ./cmd/corral
fi
mkdir -p "$work/proj" "$work/state"

policy=""
if [ "${MODE:-block}" = "proxy" ]; then
	cat >"$work/proxy.yaml" <<'YAML'
version: 1
filesystem_policy:
  read_only: [/usr, /lib, /lib64, /bin, /sbin, /etc, /opt]
network:
  allow: ["example.invalid:443"]
YAML
	policy="--policy $work/proxy.yaml"
fi
run="$bin run --log-level error --state-dir $work/state --workdir $work/proj $policy"
corral="$run -- true"
bwrap="bwrap --unshare-all --ro-bind / / --proc /proc --dev /dev --tmpfs /tmp true"

hyperfine --style basic --warmup 10 --runs "$runs" --export-json "$work/result.json" \
	-n corral "$corral" -n bwrap "$bwrap" >&2

jq -r '
  (.results | map({(.command): .}) | add) as $r
  | "corral mean \($r.corral.mean * 1000 | . * 100 | round / 100) ms (median \($r.corral.median * 1000 | . * 100 | round / 100) ms)",
    "bwrap  mean \($r.bwrap.mean * 1000 | . * 100 | round / 100) ms (median \($r.bwrap.median * 1000 | . * 100 | round / 100) ms)",
    "ratio corral/bwrap (mean): \($r.corral.mean / $r.bwrap.mean | . * 100 | round / 100)x",
    "ratio corral/bwrap (median): \($r.corral.median / $r.bwrap.median | . * 100 | round / 100)x"
' "$work/result.json"

if [ "${TRACE:-0}" = 1 ]; then
	# Where the time goes, from one more run (the first line includes
	# package initialisation, not the exec before it).
	$run --trace -- true 2>&1 >/dev/null | grep '^trace' || true
fi
