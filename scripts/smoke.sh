#!/usr/bin/env bash
# The main job on a fresh machine: install libtorch into .venv, build bench, and run the
# smoke matrix on the built-in workload (on the GPUs when there are any, else on the CPU).
# Extra arguments go to `bench matrix`, e.g. `scripts/smoke.sh --filter llama`.
# shellcheck source=scripts/env.sh
source "$(dirname "$0")/env.sh"
cargo build --release --locked
exec target/release/bench matrix matrix/smoke.yaml "$@"
