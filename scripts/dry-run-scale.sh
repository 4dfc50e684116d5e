#!/usr/bin/env bash
# Runner scale (issue 23): wall time and peak memory of `bench matrix FILE --dry-run` on
# generated matrices of 10^4, 10^5 and 10^6 combinations, in both output formats, and the
# runner's own cost per cell on a trivial command workload.
#
# The matrix is shaped like a nightly (five models, two dtypes, five GPU counts, the four
# subsets of {compile, sac}, an override, one rule of each kind and an include entry) with
# a `seed` axis that scales it: 200 combinations per seed. Each dry run writes to
# /dev/null under `/usr/bin/time -v`, which reports the wall time and the peak resident set
# (VmHWM) of the process. The run section times `bench matrix` over CELLS cells of a
# command workload, `sh worker.sh` printing two steps and a summary (a worker that costs
# one fork/exec and nothing else), against as many bare `sh worker.sh` runs in a loop, so
# the difference per cell is what bench itself costs; a second run of CELLS/10 cells gives
# the marginal cost per cell, without what a run costs once (start-up, reports).
#
# Usage: scripts/dry-run-scale.sh [path/to/bench]   (default: target/release/bench)
#   SIZES="10000 100000 1000000"  combinations to dry-run
#   CELLS=2000                    cells of the run section (0 skips it)
# Run it on an idle machine; it prints one table per section.
set -euo pipefail
BENCH="$(realpath "${1:-target/release/bench}")"
SIZES="${SIZES:-10000 100000 1000000}"
CELLS="${CELLS:-2000}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# matrix FILE SEEDS: the nightly-shaped matrix with SEEDS values of the `seed` axis.
matrix() {
  local seeds
  seeds=$(seq -s ', ' 0 $(($2 - 1)))
  cat > "$1" <<YAML
name: scale
axes:
  model: [gpt2-125m, gpt2-350m, gpt2-1.5b, llama-3.1-8b-proxy, llama-3.1-70b-proxy]
  dtype: [bf16, fp8]
  gpus: [1, 2, 4, 8, 16]
  features: {subsets_of: [compile, sac]}
  seed: [$seeds]
defaults: {steps: 40, warmup: 10, seq_len: 1024, micro_batch: 4, repeats: 3, timeout: 20m}
overrides:
  model:
    llama-3.1-8b-proxy: {seq_len: 8192, micro_batch: 1}
    llama-3.1-70b-proxy: {seq_len: 8192, micro_batch: 1, timeout: 30m}
rules:
  - name: compile-fp8
    incompatible: [compile, fp8]
    reason: the compiled step does not capture fp8 scaling
  - when: model~70b and gpus<8
    reason: the 70B proxy needs eight GPUs
  - exclude: {model: gpt2-125m, dtype: fp8}
    reason: gpt2-125m's GEMMs are too small for fp8
  - requires: {if: "has(sac)", then: "gpus>=2"}
    reason: SAC only pays off across GPUs
include:
  - {model: gpt2-125m, dtype: bf16, gpus: 1, features: [], seed: 0, steps: 100}
YAML
}

# measure OUT CMD...: runs CMD with stdout to /dev/null under /usr/bin/time -v and prints
# "wall_s peak_mb" (peak = maximum resident set size).
measure() {
  local log="$TMP/time.log"
  /usr/bin/time -v "$@" > /dev/null 2> "$log" || {
    echo "failed: $*" >&2
    cat "$log" >&2
    exit 1
  }
  awk -F': ' '
    /Elapsed \(wall clock\)/ { n = split($2, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i]; wall = s }
    /Maximum resident set size/ { mb = $2 / 1024 }
    END { printf "%.2f %.0f\n", wall, mb }' "$log"
}

echo "bench: $BENCH ($(nproc) CPUs)"
printf '\n%-10s %-6s %8s %8s\n' cells format "wall s" "peak MB"
for n in $SIZES; do
  m="$TMP/scale-$n.yaml"
  matrix "$m" $((n / 200))
  for fmt in human json; do
    read -r wall mb < <(measure "$BENCH" matrix "$m" --dry-run --max-cells $((n + 1)) --format "$fmt")
    printf '%-10s %-6s %8s %8s\n' "$n" "$fmt" "$wall" "$mb"
  done
done

[ "$CELLS" -gt 0 ] || exit 0
# The run section: CELLS cells of a command workload that prints two steps and a summary.
cat > "$TMP/worker.sh" <<'SH'
printf '{"event":"step","step":0,"step_time_s":0.01,"tokens":1024,"loss":2.5}\n'
printf '{"event":"step","step":1,"step_time_s":0.01,"tokens":1024,"loss":2.4}\n'
printf '{"event":"summary"}\n'
SH
# run.yaml N: the run matrix with N cells.
run_matrix() {
  local seeds
  seeds=$(seq -s ', ' 0 $(($1 - 1)))
  cat > "$TMP/run-$1.yaml" <<YAML
name: runner-overhead
axes:
  seed: [$seeds]
defaults:
  steps: 2
  warmup: 1
  retries: 0
  workload: {kind: command, argv: [sh, $TMP/worker.sh]}
YAML
}
cd "$TMP"
start=$(date +%s.%N)
for _ in $(seq "$CELLS"); do sh "$TMP/worker.sh" > /dev/null; done
end=$(date +%s.%N)
bare=$(echo "$end - $start" | bc -l)
# Two runs, CELLS/10 and CELLS cells: the difference per cell leaves out what a run costs
# once (start-up, the environment probe, the reports at the end).
small=$((CELLS / 10))
run_matrix "$small"
run_matrix "$CELLS"
read -r wall_small _ < <(measure "$BENCH" matrix "run-$small.yaml" --gpus 0 --baselines "$TMP/none" --results-dir "$TMP/results")
read -r wall mb < <(measure "$BENCH" matrix "run-$CELLS.yaml" --gpus 0 --baselines "$TMP/none" --results-dir "$TMP/results")
per_cell=$(echo "($wall - $bare) * 1000 / $CELLS" | bc -l)
marginal=$(echo "(($wall - $wall_small) / ($CELLS - $small) - $bare / $CELLS) * 1000" | bc -l)
printf '\n%-40s %8s %8s\n' "run of $CELLS cells" "wall s" "peak MB"
printf '%-40s %8.2f %8s\n' "sh worker.sh, bare loop" "$bare" ""
printf '%-40s %8.2f %8s\n' "bench matrix, $small cells" "$wall_small" ""
printf '%-40s %8.2f %8s\n' "bench matrix, $CELLS cells" "$wall" "$mb"
printf '%-40s %8.2f ms\n' "bench's cost per cell, average" "$per_cell"
printf '%-40s %8.2f ms\n' "bench's cost per cell, marginal" "$marginal"
printf '%-40s %8.0f\n' "cells/s" "$(echo "$CELLS / $wall" | bc -l)"
