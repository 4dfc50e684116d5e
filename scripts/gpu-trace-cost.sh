#!/usr/bin/env bash
# What keeping every run's kernels costs (issue 30, `triage.trace_every_run`): the same
# cells run with and without `--trace-kernels`, alternating, on one GPU; each run's wall
# time and each cell's tokens/s and duration go to cost.tsv.
#
# Usage: scripts/gpu-trace-cost.sh BENCH OUT_DIR [PAIRS]   (PAIRS default 2)
set -u
BENCH=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); OUTD=$2; PAIRS=${3:-2}
mkdir -p "$OUTD"; OUTD=$(cd "$OUTD" && pwd)
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
export LD_LIBRARY_PATH=$TL:$TL/../../nvidia/nccl/lib:$TL/../../nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
W=/tmp/gpu-trace-cost; rm -rf "$W"; mkdir -p "$W"
cat > "$W/m.yaml" <<'YAML'
name: trace-cost
axes:
  model: [gpt2-125m, llama-3.1-8b-proxy]
  dtype: [bf16]
  gpus: [1]
  parallel: [single]
defaults:
  steps: 30
  warmup: 10
  seq_len: 1024
  micro_batch: 16
  repeats: 5
  timeout: 5m
overrides:
  model:
    llama-3.1-8b-proxy: { micro_batch: 1, seq_len: 4096 }
YAML
printf 'run\ttraced\twall_s\tcell\tduration_s\ttokens_per_s\ttrace_bytes\n' > "$OUTD/cost.tsv"
for i in $(seq "$PAIRS"); do
  for traced in no yes; do
    id=r$i-$traced; flag=(); [ $traced = yes ] && flag=(--trace-kernels)
    t0=$(date +%s.%N)
    "$BENCH" matrix "$W/m.yaml" --no-progress --results-dir "$W/r" --run-id "$id" \
      --baselines "$W/bl" "${flag[@]}" > "$OUTD/$id.out" 2> "$OUTD/$id.err"
    t1=$(date +%s.%N)
    python3 - "$W/r/$id" "$id" "$traced" "$t0" "$t1" <<'PY' >> "$OUTD/cost.tsv"
import json, os, sys
d, id, traced, t0, t1 = sys.argv[1:]
wall = float(t1) - float(t0)
r = json.load(open(os.path.join(d, "results.json")))
for c in r["cells"]:
    t = os.path.join(d, "kernels", c["id"] + ".trace.json")
    size = os.path.getsize(t) if os.path.exists(t) else 0
    tps = c["metrics"].get("tokens_per_s", {}).get("value")
    print(f"{id}\t{traced}\t{wall:.1f}\t{c['id']}\t{c['duration_s']:.2f}\t{tps:.0f}\t{size}")
PY
  done
done
cat "$OUTD/cost.tsv"
