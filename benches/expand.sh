#!/usr/bin/env bash
# Expansion speed: times `bench matrix --dry-run --format json` on a generated matrix of
# 32,000 combinations (10 models x 10 seq lens x 10 micro batches x 4 GPU counts x 8 feature
# sets) with one rule of each kind, against a baseline of `bench schema` (process start-up:
# libtorch's shared libraries load at exec). Prints a table; run on an idle machine.
# Usage: benches/expand.sh [path/to/bench]   (default: target/release/bench)
set -euo pipefail
BENCH="${1:-target/release/bench}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
models=$(printf 'm%d, ' $(seq 0 9)); models="${models%, }"
cat > "$TMP/large.yaml" <<YAML
axes:
  model: [$models]
  seq_len: [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
  micro_batch: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
  gpus: [1, 2, 4, 8]
  features: {subsets_of: [compile, sac, fp8]}
rules:
  - incompatible: [compile, fp8]
    reason: a
  - when: seq_len>=32768 and micro_batch>4
    reason: b
  - exclude: {model: m0, gpus: 8}
    reason: c
  - requires: {if: has(sac), then: gpus>=2}
    reason: d
YAML
runs=10
time_of() { # median wall seconds of $runs runs of "$@"
  for _ in $(seq $runs); do
    s=$(date +%s.%N); "$@" > /dev/null; e=$(date +%s.%N)
    echo "$e - $s" | bc -l
  done | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
startup=$(time_of "$BENCH" schema)
full=$(time_of "$BENCH" matrix "$TMP/large.yaml" --dry-run --format json)
cells=$("$BENCH" matrix "$TMP/large.yaml" --dry-run --format json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["counts"]["combinations"], d["counts"]["run"], d["counts"]["dropped"])')
printf '\n%-44s %s\n' "what" "median of $runs (s)"
printf '%-44s %.3f\n' "process start-up (bench schema)" "$startup"
printf '%-44s %.3f\n' "dry run, 32k combinations, JSON out" "$full"
printf '%-44s %.3f\n' "expansion + JSON (difference)" "$(echo "$full - $startup" | bc -l)"
printf 'combinations / run / dropped: %s\n' "$cells"
