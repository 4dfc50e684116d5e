#!/usr/bin/env bash
# Times `bench site` on a generated store of a fleet's year (1,000 cells x 365 runs by
# default; SITE_BENCH_CELLS, SITE_BENCH_RUNS, SITE_BENCH_KEYS change it) in a release build
# and prints a table (benches/site_fleet.rs), then opens the site in Debian's chromium
# (tests/browser/check-site.mjs: no console error, no network, charts drawn, filters, the
# markup cell id as text) when BENCH_CHROMIUM names it. The target is under 10 s on the CI
# machine; the time is reported, not asserted, since it depends on the machine.
#
# Usage: scripts/site-bench.sh            (the store and site in target/site-bench/)
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
export SITE_BENCH_OUT="${SITE_BENCH_OUT:-$ROOT/target/site-bench}"
cargo bench --bench site_fleet
if [ -n "${BENCH_CHROMIUM:-}" ]; then
  [ -d node_modules/playwright-core ] || npm ci --silent
  start=$(date +%s%N)
  node tests/browser/check-site.mjs "$SITE_BENCH_OUT/site"
  echo "chromium check (the index, the findings' cells, the markup cell, two runs): $(( ($(date +%s%N) - start) / 1000000 )) ms"
fi
