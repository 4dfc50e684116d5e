#!/usr/bin/env bash
# DDP and FSDP weak scaling of `bench` against the PyTorch peer on one host with 2 or more
# GPUs, on a host that has torch (the same torch==2.11.0 the binary was built against) but
# no Rust toolchain.
#
# Usage: scripts/gpu-dist-bench.sh [DIR] [OUT_DIR]
#   DIR      holds the release binary `bench`, the matrix `dist-scaling.yaml`, the peer
#            `gpt2_dist_pytorch.py` and optionally the GPU test binary `ddp_gpu`
#            (default .gpu)
#   OUT_DIR  gets the logs, the run folder of `bench matrix` and table.md
#            (default $OUT or /tmp/gpu-dist-bench)
# Environment:
#   TMO=seconds per run (default 420)
#   STAGE=tests  runs only the multi-GPU tests (ddp_gpu)
#   STAGE=bench  runs only the bench side (no tests, no peer)
#   STAGE=all    (default) tests, bench and peer
#   MODELS       the matrix filter for models (default: both models of the matrix)
# The bench side runs `bench matrix` on matrix/dist-scaling.yaml (the real launcher: one
# `bench worker` per GPU) for every GPU count of the matrix up to this host's; the peer
# runs gpt2-1.5b (8x1024 per GPU) under torchrun with DDP and with FSDP2 at the same GPU
# counts. The table comes last. NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -u
DIR=${1:-.gpu}
OUTD=${2:-${OUT:-/tmp/gpu-dist-bench}}
TMO=${TMO:-420}
STAGE=${STAGE:-all}
LOGS=$OUTD/logs
mkdir -p "$LOGS"
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
export LD_LIBRARY_PATH=$TL:$TL/../../nvidia/nccl/lib:$TL/../../nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
BENCH=$(realpath "$DIR/bench")
NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$LOGS/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, "nccl", torch.cuda.nccl.version())' | tee -a "$LOGS/gpu.txt"

if [ "$STAGE" != bench ] && [ -x "$DIR/ddp_gpu" ]; then
  BENCH_GPU_TESTS=1 BENCH_BIN=$BENCH timeout 400 "$DIR/ddp_gpu" --test-threads 1 --nocapture > "$LOGS/ddp_gpu.log" 2>&1
  echo "ddp_gpu tests rc=$?"
  grep -E "^test |test result|checksum|losses|single |panicked|fsdp|plain" "$LOGS/ddp_gpu.log" | cut -c1-400
fi
[ "$STAGE" = tests ] && exit 0

FILTER=(--filter "gpus<=$NGPU")
[ -n "${MODELS:-}" ] && FILTER+=(--filter "model=$MODELS")
timeout "$TMO" "$BENCH" matrix "$DIR/dist-scaling.yaml" "${FILTER[@]}" --results-dir "$OUTD/results" \
  --run-id dist --baselines "$OUTD/no-baselines" --no-progress > "$LOGS/bench-matrix.log" 2>&1
echo "bench matrix rc=$?"
tail -4 "$LOGS/bench-matrix.log"

COUNTS=()
for n in 1 2 4 8; do [ "$n" -le "$NGPU" ] && COUNTS+=("$n"); done
if [ "$STAGE" = all ]; then
  for kind in ddp fsdp; do
    for n in "${COUNTS[@]}"; do
      timeout "$TMO" torchrun --standalone --nproc_per_node "$n" "$DIR/gpt2_dist_pytorch.py" 8 20 "$kind" 48 1600 25 \
        > "$LOGS/peer-$kind$n.log" 2>&1
      echo "peer $kind $n GPU(s) rc=$? $(grep '^RESULT' "$LOGS/peer-$kind$n.log")"
    done
  done
fi

python3 - "$OUTD" "${COUNTS[@]}" <<'PY' | tee "$OUTD/table.md"
import glob, json, os, re, sys
out, counts = sys.argv[1], [int(c) for c in sys.argv[2:]]
rows = {}
for path in sorted(glob.glob(f"{out}/results/dist/logs/*.log")):
    name = os.path.basename(path)
    m = re.match(r"(.+?)\.bf16\.(\d+)gpu\.(single|ddp|fsdp)\.", name)
    if not m:
        continue
    model, n, kind = m.group(1), int(m.group(2)), m.group(3)
    for line in open(path):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and e.get("event") == "summary":
            rows[(model, kind, "bench", n)] = (e.get("tokens_per_s_per_gpu"), e.get("mfu"),
                                               [b / 2**30 for b in e.get("peak_mem_bytes", [])])
for kind in ("ddp", "fsdp"):
    for n in counts:
        p = f"{out}/logs/peer-{kind}{n}.log"
        line = [l for l in open(p) if l.startswith("RESULT")] if os.path.exists(p) else []
        if line:
            f = line[-1].split()
            kv = {f[i]: f[i + 1] for i in range(2, len(f) - 1, 2)}
            rows[("gpt2-1.5b", kind, "peer", n)] = (float(kv["tok_s_per_gpu"]), float(kv["mfu_per_gpu"]),
                                                    [float(kv["peak_gib_per_rank"])])
print("| model | parallel | side | GPUs | tok/s per GPU | MFU | weak scaling | vs single | peak GiB per rank | bench / peer |")
print("|---|---|---|---|---|---|---|---|---|---|")
for model in ("gpt2-1.5b", "llama-3.1-8b-proxy"):
    single = rows.get((model, "single", "bench", 1), (None,))[0]
    for kind in ("single", "ddp", "fsdp"):
        for side in ("bench", "peer"):
            if (model != "gpt2-1.5b" or kind == "single") and side == "peer":
                continue
            base = rows.get((model, kind, side, 1), (None,))[0]
            for n in counts:
                r = rows.get((model, kind, side, n))
                if not r or r[0] is None:
                    if kind != "single" or n == 1:
                        print(f"| {model} | {kind} | {side} | {n} | failed | | | | | |")
                    continue
                tok, mfu, mem = r
                eff = f"{tok / base * 100:.1f}%" if base and n > 1 else ""
                mfu_s = f"{mfu * 100:.1f}%" if mfu else ""
                mem_s = " / ".join(f"{x:.1f}" for x in mem)
                # The issue's yardstick: per-GPU throughput against the plain loop on one GPU.
                vs_single = f"{tok / single:.3f}" if single and side == "bench" and kind != "single" else ""
                vs = ""
                peer = rows.get((model, kind, "peer", n))
                if side == "bench" and peer and peer[0]:
                    vs = f"{tok / peer[0]:.3f}"
                print(f"| {model} | {kind} | {side} | {n} | {tok:,.0f} | {mfu_s} | {eff} | {vs_single} | {mem_s} | {vs} |")
PY
