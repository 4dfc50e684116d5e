#!/usr/bin/env bash
# The main job on a fresh machine: install libtorch into .venv, build bench, and run the
# smoke matrix on the built-in workload (on the GPUs when there are any, else on the CPU)
# twice: the first run measures every cell and its measurements become baselines in a
# throwaway folder; the second run is judged against them, so the job ends with a verdict
# for every cell, as a nightly would against the baselines a team commits.
# Extra arguments go to both `bench matrix` runs, e.g. `scripts/smoke.sh --filter llama`.
# shellcheck source=scripts/env.sh
source "$(dirname "$0")/env.sh"
set -euo pipefail
cargo build --release --locked
bench=target/release/bench
# The baselines live only as long as this job: the repository's own baselines/ folder is
# for the measurements a team decides to keep.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/bench-smoke.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
stamp=$(date -u +%Y%m%dT%H%M%SZ)

echo "== smoke 1/2: measuring every cell (no baselines yet, so each one is new)" >&2
rc=0
"$bench" matrix matrix/smoke.yaml --baselines "$scratch/baselines" --run-id "smoke-$stamp-1" "$@" \
  2> >(tee "$scratch/run1.err" >&2) || rc=$?
# A failed cell (exit 1) still leaves the others' measurements; anything else is an error
# the second run would only repeat.
if [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ]; then exit "$rc"; fi
# The run folder as bench named it (`results: DIR/results.json`), wherever --results-dir
# put it.
wait
run1=$(sed -n 's|^results: \(.*\)/results\.json$|\1|p' "$scratch/run1.err" | tail -1)
[ -n "$run1" ] || { echo "smoke: run 1 wrote no results, so there is nothing to judge run 2 against" >&2; exit 1; }
"$bench" baseline update "$run1" --baselines "$scratch/baselines" >&2

echo "== smoke 2/2: judged against run 1's measurements (tolerance 50%: see matrix/smoke.yaml)" >&2
rc=0
"$bench" matrix matrix/smoke.yaml --baselines "$scratch/baselines" --run-id "smoke-$stamp-2" "$@" || rc=$?
exit "$rc"
