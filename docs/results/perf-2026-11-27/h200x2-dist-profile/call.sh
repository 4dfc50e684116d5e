#!/usr/bin/env bash
# Device call N (2026-11-27, two GPUs): one traced step (the last warm-up step, eager) of the
# Llama proxy's single loop, DDP and FSDP over 2 GPUs through the real launcher, each rank's
# trace summed by kernel and the NCCL kernels' overlap with compute measured.
set -u
O=$1
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
export LD_LIBRARY_PATH=$TL:$TL/../../nvidia/nccl/lib:$TL/../../nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/pr
for c in "single:parallel=single" "ddp:gpus=2 and parallel=ddp" "fsdp:gpus=2 and parallel=fsdp"; do
  n=${c%%:*}; f=${c#*:}
  BENCH_PROFILE=/tmp/pr/$n.json timeout 150 .gpu2/bench matrix .gpu2/dist-scaling.yaml \
    --filter "model=llama-3.1-8b-proxy and $f" --results-dir /tmp/pr/runs --run-id "$n" \
    --baselines /tmp/no-baselines --no-progress > "$O/$n.txt" 2>&1
  echo "$n rc=$? $(grep -E 'PASS|FAIL' "$O/$n.txt")"
done
ls /tmp/pr
for t in /tmp/pr/*.json; do
  b=$(basename "$t" .json)
  { echo "== $b"; python3 .gpu2/trace-top.py "$t" 30
    python3 .gpu2/trace-overlap.py "$t" nccl 2>&1
    python3 .gpu2/trace-overlap.py "$t" master_adamw 2>&1; } > "$O/top.$b.md"
  head -16 "$O/top.$b.md"; tail -6 "$O/top.$b.md"
  gzip -f "$t"
done
tar czf "$O/traces.tgz" -C /tmp pr
