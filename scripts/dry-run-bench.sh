#!/usr/bin/env bash
# The dry run's scale guard that CI runs (scripts/test.sh, right after scripts/site-bench.sh):
# `bench matrix --dry-run` over the nightly-shaped matrix of 1,000,000 combinations that
# scripts/dry-run-scale.sh generates, in both output formats, three times each, under
# /usr/bin/time -v. It prints a table (median and each run's seconds, peak MB) and exits
# non-zero when a format's median wall time is over DRY_RUN_LIMIT_S seconds (default 2) or
# its peak resident set over DRY_RUN_LIMIT_MB (default 600); 0 reports without failing.
# The dry run once took 10 s and 467 MB here, from a second walk of the million cells; the
# human listing, rendered on one thread, took 2.5 s until it was rendered by blocks.
#
# It times the optimized binary site-bench builds: the same `cargo bench --no-run` (the
# bench profile, the same target folder), which is a no-op after scripts/site-bench.sh, so
# CI compiles the crate optimized once.
#
# DRY_RUN_CELLS changes the matrix's size (a multiple of 200); DRY_RUN_REPEATS the runs per
# format.
#
# Usage: scripts/dry-run-bench.sh
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
target="${CARGO_TARGET_DIR:-$ROOT/target}"
cells="${DRY_RUN_CELLS:-1000000}"
repeats="${DRY_RUN_REPEATS:-3}"
limit_s="${DRY_RUN_LIMIT_S:-2}"
limit_mb="${DRY_RUN_LIMIT_MB:-600}"

start=$(date +%s)
cargo bench --locked --no-run --bench site_fleet
echo "dry-run-bench: optimized build (shared with site-bench): $(( $(date +%s) - start )) s"
bin="$target/release/bench"
[ -x "$bin" ] || { echo "dry-run-bench: no $bin after the build" >&2; exit 1; }

# Each run of dry-run-scale.sh prints one row per format: "CELLS FORMAT WALL_S PEAK_MB".
declare -A walls peaks
for _ in $(seq "$repeats"); do
  rows=$(SIZES="$cells" CELLS=0 "$ROOT/scripts/dry-run-scale.sh" "$bin")
  while read -r n fmt wall mb; do
    [ "$n" = "$cells" ] || continue
    walls[$fmt]="${walls[$fmt]:-} $wall"
    if [ -z "${peaks[$fmt]:-}" ] || awk -v a="$mb" -v b="${peaks[$fmt]}" 'BEGIN { exit !(a > b) }'; then
      peaks[$fmt]=$mb
    fi
  done <<<"$rows"
done

status=0
printf '\nbench matrix --dry-run, %s combinations, %s runs per format, %s CPUs (limits: %s s median, %s MB peak)\n' \
  "$cells" "$repeats" "$(nproc)" "$limit_s" "$limit_mb"
printf '%-7s %9s %8s  %s\n' format "median s" "peak MB" "runs (s)"
for fmt in human json; do
  if [ -z "${walls[$fmt]:-}" ]; then
    echo "dry-run-bench: no $fmt row from scripts/dry-run-scale.sh" >&2
    exit 1
  fi
  # shellcheck disable=SC2086 # the runs' times are words
  median=$(printf '%s\n' ${walls[$fmt]} | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  printf '%-7s %9.2f %8s  %s\n' "$fmt" "$median" "${peaks[$fmt]}" "${walls[$fmt]# }"
  if awk -v m="$median" -v l="$limit_s" 'BEGIN { exit !(l > 0 && m > l) }'; then
    echo "dry-run-bench: the $fmt dry run took $median s (median), over the limit of $limit_s s" >&2
    status=1
  fi
  if awk -v m="${peaks[$fmt]}" -v l="$limit_mb" 'BEGIN { exit !(l > 0 && m > l) }'; then
    echo "dry-run-bench: the $fmt dry run peaked at ${peaks[$fmt]} MB, over the limit of $limit_mb MB" >&2
    status=1
  fi
done
exit $status
