#!/usr/bin/env bash
# A nightly split into two shards on one GPU host, run one after the other, and merged
# (issue 33): the merged verdict must equal an unsharded run's. Cells: gpt2-125m in bf16 on
# one GPU, with and without selective activation checkpointing, and the Llama proxy at a
# short sequence; a first unsharded run writes the baselines, then the unsharded run and
# the two shards are judged against them.
#
# Usage: scripts/gpu-shards.sh BENCH OUT_DIR
set -u
BENCH=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); OUTD=$2
mkdir -p "$OUTD"; OUTD=$(cd "$OUTD" && pwd)
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
export LD_LIBRARY_PATH=$TL:$TL/../../nvidia/nccl/lib:$TL/../../nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
W=/tmp/gpu-shards; rm -rf "$W"; mkdir -p "$W"
cat > "$W/m.yaml" <<'YAML'
name: shards-gpu
axes:
  model: [gpt2-125m, llama-3.1-8b-proxy]
  dtype: [bf16]
  gpus: [1]
  parallel: [single]
  features:
    subsets_of: [sac]
defaults:
  steps: 60
  warmup: 20
  seq_len: 1024
  micro_batch: 8
  repeats: 5
  timeout: 5m
overrides:
  model:
    llama-3.1-8b-proxy: { micro_batch: 1, seq_len: 2048 }
YAML
run() { local t0=$SECONDS; "$BENCH" matrix "$W/m.yaml" --no-progress --baselines "$W/bl" "$@" > "$OUTD/$2.out" 2> "$OUTD/$2.err"; echo "$* rc=$? $((SECONDS - t0))s" | tee -a "$OUTD/runs.txt"; }
run --run-id base --results-dir "$W/r"
"$BENCH" baseline update "$W/r/base" --baselines "$W/bl" > "$OUTD/baseline.txt" 2>&1
run --run-id whole --results-dir "$W/r"
run --run-id night --results-dir "$W/s1" --shard 1/2
run --run-id night --results-dir "$W/s2" --shard 2/2
"$BENCH" report merge "$W/s1/night" "$W/s2/night" -o "$W/merged" --baselines "$W/bl" > "$OUTD/merge.out" 2> "$OUTD/merge.err"
echo "merge rc=$?" | tee -a "$OUTD/runs.txt"
for d in "$W/r/whole" "$W/merged" "$W/s1/night" "$W/s2/night"; do
  n=$(basename "$(dirname "$d")")-$(basename "$d")
  cp "$d/summary.md" "$OUTD/$n.summary.md" 2>/dev/null
  cp "$d/shard.json" "$OUTD/$n.shard.json" 2>/dev/null
  python3 - "$d/report.json" "$n" <<'PY' >> "$OUTD/verdicts.tsv"
import json, sys
r = json.load(open(sys.argv[1]))
cells = r.get("comparison", r).get("cells", [])
for c in cells:
    print(f"{sys.argv[2]}\t{c['id']}\t{c['status']}")
PY
done
cat "$OUTD/verdicts.tsv"
