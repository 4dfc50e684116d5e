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
# Two suites need a real server that only a machine's administrator can start: the
# PostgreSQL half of tests/history_store.rs (BENCH_PG_TESTS=1 and BENCH_PG_URL, from
# scripts/postgres-ci-setup.sh) and the Slurm tests (BENCH_SLURM_TESTS=1, from
# scripts/slurm-ci-setup.sh as root). .ci/run starts both; elsewhere they skip themselves,
# and this says so at the start and again at the end, so a green run is never read as theirs.
left_out=()
[ "${BENCH_PG_TESTS:-}" = 1 ] || left_out+=("PostgreSQL history tests (run scripts/postgres-ci-setup.sh and eval its output)")
[ "${BENCH_SLURM_TESTS:-}" = 1 ] || left_out+=("Slurm tests (run scripts/slurm-ci-setup.sh as root, then BENCH_SLURM_TESTS=1)")
say_left_out() {
  for l in "${left_out[@]}"; do echo "test.sh: LEFT OUT: $l" >&2; done
}
# What each long step took, printed again at the very end (where a CI log's tail shows it):
# the runner-only build's time on a fresh 2-core machine is issue 41's newcomer figure.
export BENCH_CI_SUMMARY="$ROOT/target/ci-summary.txt"
mkdir -p "$ROOT/target"
: > "$BENCH_CI_SUMMARY"
timed() {
  local name=$1 s rc=0
  shift
  s=$(date +%s)
  "$@" || rc=$?
  echo "test.sh: $name took $(( $(date +%s) - s )) s (exit $rc)" >> "$BENCH_CI_SUMMARY"
  return "$rc"
}
at_exit() {
  cat "$BENCH_CI_SUMMARY" >&2 2>/dev/null || true
  say_left_out
}
trap at_exit EXIT
say_left_out
# MaxText 0.2.5, for its CPU cells (tests/frameworks_e2e.rs): it needs Python 3.12 and pins of
# its own (transformers 5, typeguard 2.13.3) that clash with the main venv's, so it gets a venv
# of its own with JAX's CPU wheels (about 230 MB of wheels, 1.1 GB installed, a minute once).
# Its wheel declares no dependencies outside extras that pull CUDA, TensorFlow and torch, so
# scripts/maxtext-cpu-requirements.txt pins the closure of what its trainer imports on CPU.
MT_VENV="${BENCH_MAXTEXT_VENV:-$ROOT/.venv-maxtext}"
MT_PY=""
for p in python3.12 /root/.pyenv/versions/3.12*/bin/python "$HOME"/.pyenv/versions/3.12*/bin/python; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
    MT_PY=$(command -v "$p")
    break
  fi
done
if [ -n "$MT_PY" ]; then
  if ! "$MT_VENV/bin/python" -c 'import importlib.metadata as m; assert m.version("maxtext") == "0.2.5"' 2>/dev/null; then
    echo "test.sh: creating $MT_VENV (Python 3.12, MaxText 0.2.5 on JAX's CPU backend)" >&2
    "$MT_PY" -m venv "$MT_VENV"
    "$MT_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
      -r scripts/maxtext-cpu-requirements.txt
  fi
  export BENCH_MAXTEXT_PYTHON="$MT_VENV/bin/python"
elif [ -n "${CI:-}" ]; then
  echo "test.sh: no Python 3.12 for MaxText's CPU cells (python3.12 or pyenv's 3.12); CI runs them" >&2
  exit 1
else
  echo "test.sh: no Python 3.12: MaxText's CPU cells are not run" >&2
fi
# The fuzz targets (tests/fuzz.rs) run for a fixed budget: 45 s each, four targets, about
# three minutes of CPU in all.
export BENCH_FUZZ_SECS="${BENCH_FUZZ_SECS:-45}"
# The browser tests (tests/report_browser.rs): playwright-core and mermaid from
# package-lock.json, and Debian's chromium (.ci/run installs it).
npm ci --no-audit --no-fund --silent
export BENCH_CHROMIUM="${BENCH_CHROMIUM:-/usr/bin/chromium}"
# The CI templates, Dockerfiles and shipped matrices against real validators.
timed "the CI templates check" scripts/check-ci-templates.sh "$VENV"
# The runner wing reads dispatcher -> launcher -> executor with no import back up, and only
# src/cli/ (and main.rs) names the clap types.
scripts/module-graph.sh
# The book (docs/, mdBook) builds, and no link or anchor of it or of the README is broken;
# tests/book_commands.rs checks that every bench command it shows parses.
timed "the book check" scripts/book-check.sh
cargo fmt --all -- --check
cargo clippy --locked --all-targets -- -D warnings
# The runner-only build (issue 41) has its own lint: other code is compiled out.
CARGO_TARGET_DIR="$ROOT/target/runner-only" cargo clippy --locked --all-targets --no-default-features -- -D warnings
# The runner-only build as a user installs it: no libtorch, timed, its own tests. It runs
# before the tests, on an idle machine, so its time is a newcomer's (issue 41), and a test
# that fails does not keep the figure from the log.
timed "the runner-only build and its tests" scripts/runner-only.sh
# On a CI machine (.ci/run sets BENCH_CI_PRUNE=1) each build folder goes once nothing later
# reads it: a machine of this kind has been seen with under 10 GB free, and the test build
# and the optimized build for the benchmarks below need several each. A developer's
# machine keeps its folders for the next incremental build.
prune() {
  if [ "${BENCH_CI_PRUNE:-}" = 1 ]; then
    rm -rf "$@"
    echo "test.sh: removed $*; free disk now $(df -h --output=avail "$ROOT" | tail -1 | tr -d ' ')" >&2
  fi
}
prune "$ROOT/target/runner-only"
# The test build is the largest thing on disk (every integration test is a binary of its
# own); a full disk shows up as a linker's bus error, so the log says what was free.
echo "test.sh: free disk before the test build: $(df -h --output=avail "$ROOT" | tail -1 | tr -d ' ')" >&2
if cargo nextest --version >/dev/null 2>&1; then
  timed "the tests (nextest)" cargo nextest run --locked --no-fail-fast
  cargo test --locked --doc
else
  cargo test --locked --no-fail-fast
fi
prune "$ROOT/target/debug"
# The site's benchmark (issue 33): `bench site` over 1,000 cells x 365 runs in a release
# build, failing over 10 s, then opened in chromium. Its release build is its own (see
# docs/history.md, "The fleet's site", for what it takes on the CI machine).
timed "the site benchmark" scripts/site-bench.sh
# The dry run's scale guard (issue 41): a million-combination `bench matrix --dry-run`, in
# both formats, on the binary site-bench just built, failing over 2 s (median) or 600 MB.
timed "the dry-run benchmark" scripts/dry-run-bench.sh
# The gate's scale guard (issue 41): a 1,000-cell run judged against 365 generated nights of
# its history, on the same optimized build, failing when judging costs over 30 s.
timed "the gate benchmark" scripts/gate-bench.sh
