#!/usr/bin/env bash
# The gate's scale guard that CI runs (scripts/test.sh, after scripts/site-bench.sh): a
# 1,000-cell command run judged against a generated year (365 nights) of its own history,
# by the optimized binary site-bench builds (`cargo bench` of the bench profile, the same
# target folder, so no second optimized build of the crate). benches/gate_fleet.rs prints
# the table and exits 1 when judging costs more than GATE_BENCH_LIMIT_S seconds (the
# difference between the run with --history and without; default 30).
#
# Usage: scripts/gate-bench.sh
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
start=$(date +%s)
cargo bench --locked --bench gate_fleet
echo "gate-bench: $(( $(date +%s) - start )) s in all"
