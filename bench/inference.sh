#!/usr/bin/env bash
# Inference routing benchmarks: the fake model backend called directly and
# through the inference Router (the handler behind inference.local), both
# on loopback, measured side by side in one run. No root needed.
#
#   bench/inference.sh           # added TTFB p50, streamed events/s ratio, small req/s ratio
#   COUNT=3 bench/inference.sh   # repeat each benchmark
#
# Targets (issue 12): added TTFB <= 1000 us p50, stream_ratio >= 0.95,
# rps_ratio >= 0.5. TLS termination and the sandbox's listeners are not in
# this measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=0
out=$(go test -run '^$' -bench 'Inference(TTFB|Stream|Small)' -benchtime "${N:-300}x" -count "${COUNT:-1}" ./test/bench/)
echo "$out"
echo
echo "$out" | awk '
  /BenchmarkInferenceTTFB/  { for (i = 1; i <= NF; i++) if ($(i+1) == "added_p50_us") printf "added TTFB p50:        %s us (target <= 1000)\n", $i }
  /BenchmarkInferenceStream/ { for (i = 1; i <= NF; i++) if ($(i+1) == "stream_ratio") printf "streamed events/s:     %s x direct (target >= 0.95)\n", $i }
  /BenchmarkInferenceSmall/  { for (i = 1; i <= NF; i++) if ($(i+1) == "rps_ratio") printf "small requests/s:      %s x direct (target >= 0.5)\n", $i }'
