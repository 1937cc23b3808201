#!/usr/bin/env bash
# Start-up cost of a sandbox: `corral run -- true` against
# `bwrap --unshare-all ... true`, measured side by side in one hyperfine run
# so machine noise hits both equally. Prints each mean and the ratio.
#
#   bench/startup.sh             # the built-in default policy (proxy mode,
#                                # no endpoint: every connection captured, denied)
#   MODE=proxy bench/startup.sh  # proxy mode with an endpoint allowed
#   MODE=offline bench/startup.sh # network.mode: block (loopback only, no capture)
#   RUNS=200 bench/startup.sh    # more runs
#   CORRAL_BIN=/path/to/other/corral bench/startup.sh   # another build
#   CORRAL_BASE=/path/to/old/corral bench/startup.sh  # and a second, in the same runs
#   ROUNDS=5 bench/startup.sh    # RUNS split into 5 rounds that take turns, so
#                                # a slow spell of a noisy machine hits every command
#   TRACE=5 bench/startup.sh     # also each start-up step's median over 5 traced runs
#   AS_USER=nobody bench/startup.sh  # rootless: both run as that user (setpriv)
#   SWITCHES=30 bench/startup.sh # also context switches, page faults and CPU time per run,
#                                # means over 30 more runs (perf stat; the base too)
#
# It also times the sandbox's init program alone, exec to exit doing
# nothing (it finds no supervisor and exits 125): the start of one Go
# program on this machine. corral pays two, its own and the init's, which
# puts a floor under its ratio to bubblewrap that no work inside corral
# removes.
#
# Needs root (bwrap's --unshare-all and corral's cgroups), bubblewrap and
# hyperfine (apt-get install bubblewrap hyperfine).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${RUNS:-100}
case "${MODE:-block}" in
block | proxy | offline) ;;
*)
	echo "bench/startup.sh: MODE=$MODE: use block (the built-in policy), proxy or offline" >&2
	exit 2
	;;
esac
if [ -n "${AS_USER:-}" ]; then
	uid=$(id -u "$AS_USER") && gid=$(id -g "$AS_USER") || {
		echo "bench/startup.sh: AS_USER=$AS_USER: no such user" >&2
		exit 2
	}
fi
for tool in bwrap hyperfine jq; do
	command -v "$tool" >/dev/null || { echo "bench/startup.sh: $tool is required (apt-get install bubblewrap hyperfine jq)" >&2; exit 2; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bin=${CORRAL_BIN:-}
if [ -z "$bin" ]; then
	bin="$work/corral"
	# As installed: carrying the init program it starts each sandbox with,
	# and its full program.
	go generate ./internal/fullbin
	CGO_ENABLED=0 go build -o "$bin" ./cmd/corral
fi
mkdir -p "$work/proj" "$work/state"

policy=""
case "${MODE:-block}" in
proxy)
	cat >"$work/proxy.yaml" <<'YAML'
version: 1
filesystem_policy:
  read_only: [/usr, /lib, /lib64, /bin, /sbin, /etc, /opt]
network:
  allow: ["example.invalid:443"]
YAML
	policy="--policy $work/proxy.yaml"
	;;
offline)
	cat >"$work/offline.yaml" <<'YAML'
version: 1
filesystem_policy:
  include_workdir: true
  read_only: [/usr, /lib, /lib64, /lib32, /bin, /sbin, /etc, /opt]
network:
  mode: block
YAML
	policy="--policy $work/offline.yaml"
	;;
esac
# Rootless, corral and bubblewrap both run as AS_USER, with their files
# that user's.
as=""
if [ -n "${AS_USER:-}" ]; then
	mkdir -p "$work/home"
	chown -R "$uid:$gid" "$work/proj" "$work/state" "$work/home"
	chmod 755 "$work"
	as="env HOME=$work/home setpriv --reuid=$uid --regid=$gid --clear-groups"
fi
run="$as $bin run --log-level error --state-dir $work/state --workdir $work/proj $policy"
corral="$run -- true"
bwrap="$as bwrap --unshare-all --ro-bind / / --proc /proc --dev /dev --tmpfs /tmp true"
# The first run writes the init program it runs (corral-init as root,
# corral-netinit rootless) into the state directory.
$corral
init=$(ls "$work"/state/bin/corral-*init-*)
commands=(-n corral "$corral" -n bwrap "$bwrap" -n init-alone "$as $init")
if [ -n "${CORRAL_BASE:-}" ]; then
	mkdir -p "$work/base-state"
	[ -z "$as" ] || chown "$uid:$gid" "$work/base-state"
	base="$as $CORRAL_BASE run --log-level error --state-dir $work/base-state --workdir $work/proj $policy -- true"
	$base
	base_init=$(ls "$work"/base-state/bin/corral-*init-*)
	commands+=(-n base "$base" -n base-init-alone "$as $base_init")
fi

rounds=${ROUNDS:-1}
per_round=$(((runs + rounds - 1) / rounds))
for round in $(seq "$rounds"); do
	hyperfine --style basic --warmup $((round == 1 ? 10 : 3)) --runs "$per_round" --ignore-failure \
		--export-json "$work/result-$round.json" "${commands[@]}" >&2
done

# Every run of every round, by command: mean and median in ms.
jq -rs '
  def ms: . * 1000 | . * 100 | round / 100;
  def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  [.[].results[]] | group_by(.command) | map({(.[0].command): ([.[].times[]] | {mean: (add / length), median: median, n: length})}) | add as $r
  | "corral mean \($r.corral.mean | ms) ms (median \($r.corral.median | ms) ms)",
    "bwrap  mean \($r.bwrap.mean | ms) ms (median \($r.bwrap.median | ms) ms)",
    "ratio corral/bwrap (mean): \($r.corral.mean / $r.bwrap.mean | . * 100 | round / 100)x",
    "ratio corral/bwrap (median): \($r.corral.median / $r.bwrap.median | . * 100 | round / 100)x",
    (if $r.base then
      "base   mean \($r.base.mean | ms) ms (median \($r.base.median | ms) ms)",
      "ratio base/bwrap (median): \($r.base.median / $r.bwrap.median | . * 100 | round / 100)x",
      "corral - base (median): \($r.corral.median - $r.base.median | ms) ms",
      "base init alone: mean \($r["base-init-alone"].mean | ms) ms (median \($r["base-init-alone"].median | ms) ms)"
    else empty end),
    "init alone, one Go program started and ended: mean \($r["init-alone"].mean | ms) ms (median \($r["init-alone"].median | ms) ms); corral starts two",
    "runs per command: \($r.corral.n) in \('"$rounds"') round(s)"
' "$work"/result-*.json

if [ "${SWITCHES:-0}" -gt 0 ]; then
	# What a run costs the machine besides its time: every context switch
	# takes a core from the set-up for a moment, and on a virtual machine
	# every page fault costs tens of microseconds. perf stat counts
	# corral's whole tree (supervisor, init, workload).
	command -v perf >/dev/null || { echo "bench/startup.sh: SWITCHES needs perf (apt-get install linux-perf)" >&2; exit 2; }
	switches() {
		perf stat -x, -e context-switches,page-faults,task-clock -r "$SWITCHES" $2 2>&1 >/dev/null |
			awk -F, -v name="$1" -v n="$SWITCHES" '
				$3 == "context-switches" { cs = $1 }
				$3 == "page-faults" { pf = $1 }
				$3 == "task-clock" { cpu = $1 }
				END { printf "%s: %.0f context switches, %.0f page faults, %.1f ms of CPU per run (perf stat, mean of %d)\n", name, cs, pf, cpu, n }'
	}
	switches corral "$corral"
	[ -z "${CORRAL_BASE:-}" ] || switches base "$base"
fi

if [ "${TRACE:-0}" -gt 0 ]; then
	# Where the time goes: each step's median over TRACE more runs, when
	# it ended and how long it took (the first line includes package
	# initialisation, not the exec before it). The README's table groups
	# these.
	for _ in $(seq "$TRACE"); do
		$run --trace -- true 2>&1 >/dev/null | grep '^trace' || true
	done | awk '
		{ at = $2; took = $3; sub(/ms$/, "", at); sub(/^\+/, "", took); sub(/ms$/, "", took)
		  name = $4; for (i = 5; i <= NF; i++) name = name " " $i
		  if (!(name in n)) order[++steps] = name
		  n[name]++; ats[name, n[name]] = at; tooks[name, n[name]] = took }
		function median(arr, name, k,   i, j, v, t) {
			for (i = 1; i <= k; i++) v[i] = arr[name, i]
			for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (v[j] + 0 < v[i] + 0) { t = v[i]; v[i] = v[j]; v[j] = t }
			return v[int((k + 1) / 2)]
		}
		END { for (s = 1; s <= steps; s++) printf "%8s ms  %+7s ms  %s\n", median(ats, order[s], n[order[s]]), median(tooks, order[s], n[order[s]]), order[s] }'
fi
