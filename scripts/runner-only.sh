#!/usr/bin/env bash
# The runner-only build as a user installs it (issue 41): `--no-default-features`, with no
# libtorch, Python venv or LIBTORCH* variable in sight, in a target folder of its own. It
# times the optimized build, prints the stripped binary's size, checks that the binary links
# no libtorch, and runs tests/runner_only.rs against it (a command matrix with --history,
# bench report, bench site, and the refusal of a built-in cell).
#
# Usage: scripts/runner-only.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
# What scripts/env.sh put on the paths, taken off again.
unset LIBTORCH LIBTORCH_USE_PYTORCH LIBTORCH_INCLUDE LIBTORCH_LIB
PATH="$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -e '/\.venv' -e '/\.venv-maxtext' | paste -sd: -)"
LD_LIBRARY_PATH=""
export PATH LD_LIBRARY_PATH
export CARGO_TARGET_DIR="$ROOT/target/runner-only"
start=$(date +%s)
cargo build --release --locked --no-default-features --bin bench
took=$(( $(date +%s) - start ))
bin="$CARGO_TARGET_DIR/release/bench"
strip -o "$CARGO_TARGET_DIR/bench.stripped" "$bin"
size=$(du -m "$CARGO_TARGET_DIR/bench.stripped" | cut -f1)
if ldd "$bin" | grep -E 'torch|c10' >&2; then
  echo "runner-only: the binary links libtorch" >&2
  exit 1
fi
line="runner-only: optimized build ${took} s ($(nproc) CPUs, $(free -g | awk '/^Mem:/ {print $2}') GiB), stripped binary ${size} MB, no libtorch linked"
echo "$line"
# scripts/test.sh prints this again at the end of a CI run.
if [ -n "${BENCH_CI_SUMMARY:-}" ]; then echo "$line" >> "$BENCH_CI_SUMMARY"; fi
cargo test --release --locked --no-default-features --test runner_only
