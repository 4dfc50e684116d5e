#!/usr/bin/env bash
# Writes the two versions of src/workload/engine.rs that scripts/gpu-triage.sh's nightly
# repository holds: good/ is this checkout's file, slow/ the same file with the master-weight
# AdamW kernel dropped (master_weights() always false, so a bf16 GPU cell runs libtorch's
# fused AdamW over fp32 parameters, as BENCH_FUSED_ADAMW=0 does, but as a code change that
# no switch in the environment reveals). The run of 2026-11-27 used a slow/engine.rs made by
# hand that was not kept; this script makes the change its docs describe, so the run can be
# repeated from what is committed. Then build one bench per version (cargo build --release
# with the file in place, strip) into .gpu-triage/builds/<sha256 of engine.rs>/bench.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
G=$ROOT/.gpu-triage
mkdir -p "$G/src/good" "$G/src/slow"
cp "$ROOT/src/workload/engine.rs" "$G/src/good/engine.rs"
python3 - "$G/src/good/engine.rs" "$G/src/slow/engine.rs" <<'PY'
import sys
good, slow = sys.argv[1:]
s = open(good).read()
old = "fn master_weights(s: &Settings, dev: &DeviceInfo) -> bool {\n    dev.is_cuda()"
if old not in s:
    sys.exit("src/workload/engine.rs has no master_weights() of the expected shape; update this script")
s = s.replace(old, "fn master_weights(s: &Settings, dev: &DeviceInfo) -> bool {\n    false && dev.is_cuda()")
open(slow, "w").write(s)
PY
sha256sum "$G/src/good/engine.rs" "$G/src/slow/engine.rs"
