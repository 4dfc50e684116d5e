#!/usr/bin/env bash
# Calibration study of the regression gate (docs/history.md): many clean runs of a few
# 1-GPU cells and runs with one fused kernel switched off (real slowdowns of 1-8%, their size
# measured in the same study), all recorded in a history store; then `bench history study`
# prints detection and false-alarm rates of the old rule (3% against one stored run), the
# history rule and the shipped verdict (the history rule, then the environment check on
# each run's GPU telemetry, which bench samples by default wherever nvidia-smi runs), per
# slowdown size and repeats per run, by resampling the measured repeats. It also tallies
# the verdicts the gate itself gave each real run during the study (history.json), from
# the sixth run on, when a cell has a history to be judged against.
#
# Runs on a GPU host that has torch (the torch==2.11.0 the binary was built against) but no
# Rust toolchain, like scripts/gpu-bench.sh: carry the stripped release binary.
#
# Usage: scripts/gate-study.sh [DIR] [OUT_DIR]
#   DIR      holds the release binary `bench` (default .gpu)
#   OUT_DIR  gets the run folders, the history store, logs and study.md (default $OUT or
#            /tmp/gate-study)
# Environment:
#   BUDGET_S   stop starting runs after this many seconds (default 480)
#   CELLS      the filter of the study matrix's cells (default: gpt2-125m bf16 compile)
#   MODEL      the model axis of the study matrix (default gpt2-125m; gpt2-tiny for a CPU
#              smoke, with GPUS=0)
#   REPEATS    repeats per run (default 4)
#   SWITCHES   the slowdowns, space-separated VAR=0 (default: the fused AdamW, bias, layer
#              norm and bias+GELU kernels of GPT-2: 1.4-4.7% slowdowns, the sizes the
#              gate's targets are about; BENCH_FUSED_CE=0, 26%, is found by any rule)
#   GPUS       --gpus for bench matrix (default 1)
#   N0         the number the run ids start after (default 0): a second session into the
#              same history (OUT_DIR/history.sqlite copied there first) gets new run ids
#   SKIP       runs of this session left out of the tally of the gate's own verdicts
#              (default 5: a new history judges little before then; 0 for a second session)
#   STUDY      0: only measure; run the analysis elsewhere (`bench history study` over the
#              run folders, as below), which spares a lent GPU's time (default 1)
set -u
DIR=${1:-.gpu}
OUTD=${2:-${OUT:-/tmp/gate-study}}
BUDGET_S=${BUDGET_S:-480}
MODEL=${MODEL:-gpt2-125m}
REPEATS=${REPEATS:-4}
GPUS=${GPUS:-1}
SWITCHES=${SWITCHES:-BENCH_FUSED_ADAMW=0 BENCH_FUSED_BIAS=0 BENCH_FUSED_LN=0 BENCH_FUSED_GELU=0}
BENCH=$(cd "$DIR" && pwd)/bench
mkdir -p "$OUTD/logs"
OUTD=$(cd "$OUTD" && pwd)
if python3 -c 'import torch' 2>/dev/null; then
  TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
  export LD_LIBRARY_PATH=$TL:$TL/../../nvidia/nccl/lib:$TL/../../nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
fi
export NCCL_NVLS_ENABLE=0
# No switch may leak in from the caller: a clean run is one with none set.
for v in $(env | grep -o '^BENCH_FUSED_[A-Z0-9_]*'); do unset "$v"; done

if [ "$MODEL" = gpt2-tiny ]; then SHAPE="steps: 12
  warmup: 3
  seq_len: 128
  micro_batch: 4"; else SHAPE="steps: 40
  warmup: 10
  seq_len: 1024
  micro_batch: 16"; fi
MATRIX=$OUTD/study.yaml
cat > "$MATRIX" <<EOF
name: gate-study
axes:
  model: [$MODEL]
  dtype: [bf16]
  gpus: [1]
  parallel: [single]
  features: [[compile]]
defaults:
  $SHAPE
  repeats: $REPEATS
  timeout: 5m
  retries: 1
EOF

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader 2>/dev/null \
  | tee "$OUTD/logs/gpu.txt"

# A binary older than the history store still measures; the study then runs elsewhere
# (`bench history study OUT_DIR/results/*` on any machine with a newer bench).
HIST=()
if "$BENCH" matrix --help 2>/dev/null | grep -q -- '--history'; then HIST=(--history "$OUTD/history.sqlite"); fi
START=$(date +%s)
n=${N0:-0}
# run ID [VAR=0]: one `bench matrix` run of the study matrix, recorded in the history.
run() {
  local id=$1; shift
  env "$@" timeout 600 "$BENCH" matrix "$MATRIX" --gpus "$GPUS" --no-progress \
    --results-dir "$OUTD/results" --run-id "$id" --baselines "$OUTD/baselines" \
    "${HIST[@]}" > "$OUTD/logs/$id.log" 2>&1
  local rc=$?
  echo "$id rc=$rc $(python3 - "$OUTD/results/$id/results.json" <<'PY' 2>/dev/null
import json, sys
for c in json.load(open(sys.argv[1]))["cells"]:
    m = c.get("metrics", {}).get("tokens_per_s")
    print(c["id"], "%.0f" % m["value"] if m else c.get("status"), [round(x) for x in m["samples"]] if m else "")
PY
) ($(( $(date +%s) - START )) s)"
}
# Clean and slowed runs interleaved (clean, slow A, clean, slow B, ...), so a drift of the
# GPU over the study (warming up, another tenant) spreads over both.
while [ $(( $(date +%s) - START )) -lt "$BUDGET_S" ]; do
  for sw in $SWITCHES; do
    [ $(( $(date +%s) - START )) -lt "$BUDGET_S" ] || break
    n=$((n + 1))
    run "clean-$(printf %03d $n)"
    [ $(( $(date +%s) - START )) -lt "$BUDGET_S" ] || break
    run "slow-$(printf %03d $n)-${sw%%=*}" "$sw"
  done
done

# The gate's own verdicts on the real runs (with --history): per kind of run, how many
# cell-runs came out each way, from the sixth run of the study on.
python3 - "$OUTD/results" "${SKIP:-5}" <<'PY' | tee "$OUTD/verdicts.md"
import json, os, sys, collections
root, skip = sys.argv[1], int(sys.argv[2])
loaded = []
for run in os.listdir(root):
    if run.endswith("-confirm"):
        continue
    try:
        h = json.load(open(os.path.join(root, run, "history.json")))
        res = json.load(open(os.path.join(root, run, "results.json")))
    except Exception:
        continue
    loaded.append((res["started_at"], run, h, res))
tally = collections.defaultdict(collections.Counter)
tele = collections.Counter()
# In the order the runs started: the first five have too little history to be judged.
for i, (_, run, h, res) in enumerate(sorted(loaded)):
    for c in res["cells"]:
        tele["with telemetry" if c.get("telemetry") else "without telemetry"] += 1
    if i < skip:
        continue
    kind = "clean" if run.startswith("clean") else run.split("-", 2)[-1] + "=0"
    for c in h["cells"]:
        tally[kind][c["judgement"]["verdict"]] += 1
print("Cell-runs: " + ", ".join(f"{n} {k}" for k, n in sorted(tele.items())) + ".\n")
print(f"| runs (from the {skip + 1}th of this session) | cell-runs | regressed | environment | other verdicts |")
print("|---|---|---|---|---|")
for kind, c in sorted(tally.items()):
    other = ", ".join(f"{v} {n}" for v, n in sorted(c.items()) if v not in ("regressed", "environment"))
    print(f"| {kind} | {sum(c.values())} | {c['regressed']} | {c['environment']} | {other} |")
PY

[ "${STUDY:-1}" = 0 ] && exit 0
# From the store the gate judged with (its confirmation re-runs left out: the study
# simulates its own).
"$BENCH" history study --history "$OUTD/history.sqlite" > "$OUTD/study.md" 2> "$OUTD/logs/study.err"
echo "study rc=$?"
cat "$OUTD/study.md"
first=$(find "$OUTD"/results -mindepth 2 -maxdepth 2 -name results.json | sort | head -1)
for cell in $(python3 -c 'import json,sys; print(" ".join(c["id"] for c in json.load(open(sys.argv[1]))["cells"]))' "$first" 2>/dev/null); do
  "$BENCH" history "$cell" --history "$OUTD/history.sqlite" | tee "$OUTD/trend-$cell.txt" | head -8
done
