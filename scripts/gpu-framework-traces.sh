#!/usr/bin/env bash
# One traced step per framework cell on a GPU (issue 30's kernel diffs for framework cells):
# each one-GPU bf16 cell of matrix/frameworks-h100.yaml runs once with BENCH_PROFILE set, as
# triage runs a cell at the last good and the first bad commit, and the trace each driver
# wrote is summed by kernel (scripts/trace-top.py). A driver that wrote no trace, or one
# with no device kernel, is named in summary.txt.
#
# Usage: scripts/gpu-framework-traces.sh BENCH OUT_DIR [FRAMEWORK...]
#   (default frameworks: hf deepspeed torchtitan megatron)
# Carry the wheels as scripts/gpu-frameworks.sh does (.gpu/fw/whl-tt, whl-ds, whl-meg,
# megatron-lm, tokenizer); MaxText's are not needed for these.
set -u
BENCH=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); OUTD=$2; shift 2
FWS=("$@"); [ ${#FWS[@]} -eq 0 ] && FWS=(hf deepspeed torchtitan megatron)
R=$PWD/.gpu
mkdir -p "$OUTD"; OUTD=$(cd "$OUTD" && pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
wheels=()
for w in "$R"/fw/whl-*/*.whl; do
  case $w in */whl-mt/*) ;; *) wheels+=("$w") ;; esac
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "${wheels[@]}" || exit 1
export PYTHONPATH=/tmp/site
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
export LD_LIBRARY_PATH=$TL:$TL/../../nvidia/nccl/lib:$TL/../../nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export BENCH_PYTHON=python3 BENCH_MEGATRON_SOURCE=$R/fw/megatron-lm BENCH_LLMC_SOURCE=$R/fw/llm.c
# One repeat: the trace is of one step of one run, as triage takes it.
sed 's/^  repeats: 3$/  repeats: 1/' matrix/frameworks-h100.yaml > /tmp/fw-traces.yaml
grep -q '^  repeats: 1$' /tmp/fw-traces.yaml || { echo "repeats moved in the matrix"; exit 1; }
for fw in "${FWS[@]}"; do
  t0=$SECONDS
  trace=$OUTD/$fw.trace.json
  BENCH_PROFILE=$trace timeout 300 "$BENCH" matrix /tmp/fw-traces.yaml \
      --filter "framework=$fw and gpus=1 and dtype=bf16" --results-dir /tmp/fw-runs \
      --run-id "$fw" --no-progress > "$OUTD/$fw.out" 2> "$OUTD/$fw.err"
  rc=$?
  if [ -f "$trace" ]; then
    python3 scripts/trace-top.py "$trace" 12 > "$OUTD/$fw.top.md" 2>&1
    echo "$fw rc=$rc $((SECONDS - t0))s: $(head -1 "$OUTD/$fw.top.md")" | tee -a "$OUTD/summary.txt"
    gzip -f "$trace"
  else
    echo "$fw rc=$rc $((SECONDS - t0))s: no trace; $(grep -rh 'bench-profile' "$OUTD/$fw.err" /tmp/fw-runs/"$fw" 2>/dev/null | head -2)" | tee -a "$OUTD/summary.txt"
  fi
done
