#!/usr/bin/env bash
# Every test, as CI runs it: formatting, clippy with -D warnings, and the unit, integration
# and snapshot tests (cargo-nextest when installed, else cargo test).
# shellcheck source=scripts/env.sh
source "$(dirname "$0")/env.sh"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r scripts/test-requirements.txt
# DeepSpeed, for its CPU cell (tests/frameworks_e2e.rs): an sdist whose setup.py imports torch,
# so it is built against the venv's torch (no build isolation), as pure Python: none of its
# C++/CUDA ops are compiled (DS_BUILD_OPS=0; the adapter needs none of them).
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check setuptools wheel
DS_BUILD_OPS=0 "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  --no-build-isolation deepspeed==0.19.8
export BENCH_PYTHON="$VENV/bin/python"
# The fuzz targets (tests/fuzz.rs) run for a fixed budget: 45 s each, four targets, about
# three minutes of CPU in all.
export BENCH_FUZZ_SECS="${BENCH_FUZZ_SECS:-45}"
# The browser tests (tests/report_browser.rs): playwright-core and mermaid from
# package-lock.json, and Debian's chromium (.ci/run installs it).
npm ci --no-audit --no-fund --silent
export BENCH_CHROMIUM="${BENCH_CHROMIUM:-/usr/bin/chromium}"
# The CI templates, Dockerfiles and shipped matrices against real validators.
scripts/check-ci-templates.sh "$VENV"
# The runner wing reads dispatcher -> launcher -> executor with no import back up, and only
# src/cli/ (and main.rs) names the clap types.
scripts/module-graph.sh
cargo fmt --all -- --check
cargo clippy --locked --all-targets -- -D warnings
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --locked --no-fail-fast
  cargo test --locked --doc
else
  cargo test --locked --no-fail-fast
fi
