#!/usr/bin/env bash
# Renders a run folder's report.html again (bench report html) and screenshots it in headless
# chromium, after the same checks the browser test makes (no console error, no network,
# every chart drawn). For the README's picture of a real run:
#
#   scripts/screenshot-report.sh results/20261122T101500Z docs/report.png
#
# Needs Debian's chromium (or BENCH_CHROMIUM=/path/to/chrome), node with `npm ci` done in
# the checkout (run here when node_modules is missing), and bench: $BENCH, else the newer
# of target/release/bench and target/debug/bench, else bench on PATH. Extra arguments go to `bench report html` (e.g.
# --baselines DIR, --history FILE).
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: scripts/screenshot-report.sh RUN_DIR OUT.png [bench report html options]" >&2
    exit 2
fi
run_dir="$1"
out="$2"
shift 2
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# $BENCH, else the newer of this checkout's builds, else bench on PATH.
bench_bin="${BENCH:-}"
if [ -z "$bench_bin" ]; then
    for b in "$root/target/release/bench" "$root/target/debug/bench"; do
        if [ -x "$b" ] && { [ -z "$bench_bin" ] || [ "$b" -nt "$bench_bin" ]; }; then
            bench_bin="$b"
        fi
    done
fi
if [ -z "$bench_bin" ]; then
    bench_bin="$(command -v bench || true)"
fi
if [ -z "$bench_bin" ]; then
    echo "screenshot-report: no bench binary (build it, or put it on PATH)" >&2
    exit 2
fi
if [ ! -d "$root/node_modules/playwright-core" ]; then
    (cd "$root" && npm ci --no-audit --no-fund)
fi
"$bench_bin" report html "$run_dir" -o "$run_dir/report.html" "$@"
node "$root/tests/browser/check-report.mjs" --screenshot "$out" "$run_dir/report.html"
echo "wrote $out"
