#!/usr/bin/env bash
# The framework comparison on a GPU host that has torch (the same torch==2.11.0 the binary
# was built against), transformers, accelerate and jax with its CUDA plugin, but no Rust
# toolchain and no network: `bench matrix matrix/frameworks-h100.yaml` with every
# framework's own wheels carried.
#
# Usage: [LIMIT=seconds] scripts/gpu-frameworks.sh [FILTER] [OUT_DIR]
#   FILTER   bench's filter language, e.g. 'gpus=1' (default) or 'gpus=1 and framework=megatron'
#   OUT_DIR  gets probe.log and run.tgz, the run folder (written under /tmp/gpu-frameworks/run)
#            and the probe in one file, since the device returns few files (default $OUT or
#            /tmp/gpu-frameworks)
#
# Prepare on the build machine, in the project's root (.gpu is excluded from git):
#   cargo build --release && cp target/release/bench .gpu/bench && strip .gpu/bench
#   .gpu/fw/whl-*/   the frameworks' wheels and what the host lacks of their dependencies
#                    (docs/frameworks.md lists them: torchtitan 0.2.2 + torchao 0.18.0,
#                    megatron-core 0.19.0, DeepSpeed 0.19.8 built with DS_BUILD_OPS=0,
#                    maxtext 0.2.5 + pathwaysutils, ...)
#   .gpu/fw/tokenizer/     torchtitan's tests/assets/tokenizer at tag v0.2.2
#   .gpu/fw/megatron-lm/   pretrain_gpt.py, gpt_builders.py and model_provider.py of
#                          Megatron-LM at tag core_v0.19.0 (the wheel's own version); the
#                          `megatron` package itself comes from the megatron-core wheel,
#                          which carries the compiled dataset helpers
# and call the device with `.gpu` carried. Every cell is bounded by the matrix's timeout, so
# the script ends.
set -u
FILTER=${1:-gpus=1}
OUTD=${2:-${OUT:-/tmp/gpu-frameworks}}
R=$PWD/.gpu
mkdir -p "$OUTD"
# Multicast stays off on shared hosts (the device's rules); every framework inherits it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
# MaxText's wheels go to a folder of their own: its tokamax needs typeguard 2.13.3 and
# torchtitan's tyro typeguard 4, and pip refuses two wheels of one project in one command
# (pydantic is in both whl-ds and whl-mt). The matrix's MaxText cells get that folder as their
# PYTHONPATH through a copy of the matrix (the shipped file names no host's folders).
wheels=()
for w in "$R"/fw/whl-*/*.whl; do
  case $w in */whl-mt/*) ;; *) wheels+=("$w") ;; esac
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "${wheels[@]}" || exit 1
MATRIX=matrix/frameworks-h100.yaml
if [ -d "$R/fw/whl-mt" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site-mt "$R"/fw/whl-mt/*.whl || exit 1
  MATRIX=$R/frameworks-h100.yaml
  sed 's|workload: {kind: maxtext}|workload: {kind: maxtext, env: {PYTHONPATH: /tmp/site-mt}}|' \
      matrix/frameworks-h100.yaml > "$MATRIX"
  grep -q 'PYTHONPATH: /tmp/site-mt' "$MATRIX" || { echo "gpu-frameworks.sh: the maxtext override moved"; exit 1; }
fi
export PYTHONPATH=/tmp/site
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
export LD_LIBRARY_PATH=$TL:$TL/../../nvidia/nccl/lib:$TL/../../nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export BENCH_PYTHON=python3 BENCH_MEGATRON_SOURCE=$R/fw/megatron-lm BENCH_LLMC_SOURCE=$R/fw/llm.c

# SKIP_PROBE=1 leaves out the import probe (half a minute) when device time is short.
[ "${SKIP_PROBE:-0}" = 1 ] || {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  # One line per framework: the version that imports, or the import error, so a cell that
  # fails can be told apart from a framework that is not there.
  for m in torch torchtitan torchao transformers accelerate megatron.core deepspeed jax; do
    timeout 120 python3 -c "import importlib,sys; m=importlib.import_module('$m'); print('$m', getattr(m,'__version__','?'))" 2>&1 | tail -1
  done
  PYTHONPATH=/tmp/site-mt timeout 120 python3 -c "import maxtext.trainers.pre_train.train, flax, importlib.metadata as md; print('maxtext', md.version('maxtext'), 'flax', flax.__version__)" 2>&1 | tail -1
  command -v nvcc || ls /usr/local/cuda/bin/nvcc
} > "$OUTD/probe.log" 2>&1
cat "$OUTD/probe.log" 2>/dev/null

RUNS=/tmp/gpu-frameworks
mkdir -p "$RUNS"
# LIMIT (seconds) bounds the whole matrix for a device call's wall clock: at the limit bench
# gets SIGINT, its orderly stop (finished cells are kept, exit 130).
timeout -s INT -k 30 "${LIMIT:-86400}" "$R/bench" matrix "$MATRIX" --filter "$FILTER" \
    --results-dir "$RUNS" --run-id run --gpu-hour-price 2.5 --no-progress
rc=$?
echo "bench matrix rc=$rc"
cp "$OUTD/probe.log" "$RUNS/" 2>/dev/null
parts=(run)
[ -f "$RUNS/probe.log" ] && parts+=(probe.log)
tar czf "$OUTD/run.tgz" -C "$RUNS" "${parts[@]}"
exit $rc
