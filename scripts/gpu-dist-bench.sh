#!/usr/bin/env bash
# DDP weak scaling of `bench` against the PyTorch peer on one host with (at least) 2 GPUs,
# on a host that has torch (the same torch==2.11.0 the binary was built against) but no
# Rust toolchain.
#
# Usage: scripts/gpu-dist-bench.sh [DIR] [OUT_DIR]
#   DIR      holds the release binary `bench`, the matrix `ddp-2gpu.yaml`, the peer
#            `gpt2_dist_pytorch.py` and optionally the GPU test binary `ddp_gpu`
#            (default .gpu)
#   OUT_DIR  gets the logs, the run folder of `bench matrix` and table.md
#            (default $OUT or /tmp/gpu-dist-bench)
# Environment: TMO=seconds per run (default 420).
# Runs the two-GPU tests, then gpt2-1.5b bf16 8x1024 per GPU on 1 and 2 GPUs through
# `bench matrix` (the real launcher: one `bench worker` per GPU) and through the peer under
# torchrun, and prints the table last. NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -u
DIR=${1:-.gpu}
OUTD=${2:-${OUT:-/tmp/gpu-dist-bench}}
TMO=${TMO:-420}
LOGS=$OUTD/logs
mkdir -p "$LOGS"
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
export LD_LIBRARY_PATH=$TL:$TL/../../nvidia/nccl/lib:$TL/../../nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
BENCH=$(realpath "$DIR/bench")

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$LOGS/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, "nccl", torch.cuda.nccl.version())' | tee -a "$LOGS/gpu.txt"

if [ -x "$DIR/ddp_gpu" ]; then
  BENCH_BIN=$BENCH timeout 300 "$DIR/ddp_gpu" --test-threads 1 --nocapture > "$LOGS/ddp_gpu.log" 2>&1
  echo "ddp_gpu tests rc=$?"
  grep -E "^test |test result|checksum|losses|single " "$LOGS/ddp_gpu.log"
fi

timeout "$TMO" "$BENCH" matrix "$DIR/ddp-2gpu.yaml" --results-dir "$OUTD/results" --run-id ddp \
  --baselines "$OUTD/no-baselines" --no-progress > "$LOGS/bench-matrix.log" 2>&1
echo "bench matrix rc=$?"
tail -5 "$LOGS/bench-matrix.log"
# The 2-GPU cell again with the all-reduce after the backward instead of overlapped with it.
BENCH_DDP_OVERLAP=0 timeout "$TMO" "$BENCH" matrix "$DIR/ddp-2gpu.yaml" --filter gpus=2 \
  --results-dir "$OUTD/results" --run-id ddp-no-overlap --baselines "$OUTD/no-baselines" \
  --no-progress > "$LOGS/bench-matrix-no-overlap.log" 2>&1
echo "bench matrix (no overlap) rc=$?"
tail -3 "$LOGS/bench-matrix-no-overlap.log"

for n in 1 2; do
  timeout "$TMO" torchrun --standalone --nproc_per_node "$n" "$DIR/gpt2_dist_pytorch.py" 8 20 ddp 48 1600 25 \
    > "$LOGS/peer-ddp$n.log" 2>&1
  echo "peer ddp $n GPU(s) rc=$? $(grep '^RESULT' "$LOGS/peer-ddp$n.log")"
done

python3 - "$OUTD" <<'PY' | tee "$OUTD/table.md"
import glob, json, os, sys
out = sys.argv[1]
rows = {}
for run, who in (("ddp", "bench"), ("ddp-no-overlap", "bench, no overlap")):
    for path in sorted(glob.glob(f"{out}/results/{run}/logs/*.log")):
        for line in open(path):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if isinstance(e, dict) and e.get("event") == "summary":
                n = e.get("world_size") or 1
                rows[(who, n)] = (e.get("tokens_per_s_per_gpu"), e.get("mfu"),
                                  [b / 2**30 for b in e.get("peak_mem_bytes", [])])
if ("bench", 1) in rows:
    rows[("bench, no overlap", 1)] = rows[("bench", 1)]
for n in (1, 2):
    p = f"{out}/logs/peer-ddp{n}.log"
    line = [l for l in open(p) if l.startswith("RESULT")] if os.path.exists(p) else []
    if line:
        f = line[-1].split()
        kv = {f[i]: f[i + 1] for i in range(2, len(f) - 1, 2)}
        rows[("peer", n)] = (float(kv["tok_s_per_gpu"]), float(kv["mfu_per_gpu"]),
                             [float(kv["peak_gib_per_rank"])] * n)
print("| run | GPUs | tok/s per GPU | MFU | scaling | peak GiB per rank |")
print("|---|---|---|---|---|---|")
for who in ("bench", "bench, no overlap", "peer"):
    base = rows.get((who, 1), (None,))[0]
    for n in (1, 2):
        if who == "bench, no overlap" and n == 1:
            continue
        if (who, n) not in rows:
            print(f"| {who} | {n} | failed | | | |")
            continue
        tok, mfu, mem = rows[(who, n)]
        eff = f"{tok / base * 100:.1f}%" if base and tok and n > 1 else ""
        mfu_s = f"{mfu * 100:.1f}%" if mfu else ""
        print(f"| {who} | {n} | {tok:,.0f} | {mfu_s} | {eff} | {' / '.join(f'{m:.1f}' for m in mem)} |")
for n in (1, 2):
    if ("bench", n) in rows and ("peer", n) in rows and rows[("peer", n)][0]:
        print(f"\nbench / peer tok/s per GPU at {n} GPU(s): {rows[('bench', n)][0] / rows[('peer', n)][0]:.3f}", end="")
print()
PY
