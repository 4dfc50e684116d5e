#!/usr/bin/env bash
# Issue 41 on a lent GPU: examples/torchtitan/bench.yaml run as its comment tells a user to,
# from its own folder, on the cells one GPU can hold (`--filter 'gpus=1 and dtype=bf16'`:
# the 8-GPU cells need eight, and fp8 needs torchao):
#   bench matrix bench.yaml --history bench-history.sqlite
# CI checks the example with `--dry-run` only (torchtitan calls torch.cuda.set_device).
#
# The lent hosts have torch, pyarrow and transformers but neither torchtitan nor some of its
# dependencies, and no network; prepare on the build machine (.gpu is excluded from git):
#   .gpu/bench                        this checkout's stripped release build
#   .gpu/fw/tokenizer/                torchtitan's tests/assets/tokenizer at tag v0.2.2
#   .gpu/fw/whl-tt/*.whl              torchtitan 0.2.2, torchdata, tyro, typeguard,
#                                     docstring-parser, shtab, tomli
#   .gpu/fw/whl-tt/{new,old}/*.whl    datasets with its dill and multiprocess: 5.2.0 where the
#                                     host's pyarrow is 24 or later, else 4.0.0
# Usage: scripts/gpu-example-torchtitan.sh OUT_DIR   (writes tt.log and tt-run.tgz there)
set -u
OUTD=$1
R=$PWD/.gpu
mkdir -p "$OUTD"
set_=old
python3 -c 'import pyarrow,sys; sys.exit(int(pyarrow.__version__.split(".")[0]) < 24)' && set_=new
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site-tt "$R"/fw/whl-tt/*.whl "$R"/fw/whl-tt/$set_/*.whl || exit 1
export PYTHONPATH=/tmp/site-tt BENCH_PYTHON=python3 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
export LD_LIBRARY_PATH=$TL:$TL/../../nvidia/nccl/lib:$TL/../../nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
cd examples/torchtitan || exit 1
# The tokenizer where the example's `tokenizer: assets/tokenizer` looks for it.
mkdir -p assets && cp -r "$R/fw/tokenizer" assets/tokenizer
{
  echo "datasets set: $set_; $(python3 -c 'import pyarrow; print("pyarrow", pyarrow.__version__)')"
  nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader
  "$R/bench" matrix bench.yaml --filter 'gpus=1 and dtype=bf16' --dry-run
  "$R/bench" matrix bench.yaml --filter 'gpus=1 and dtype=bf16' --history bench-history.sqlite
  echo "exit $?"
} > "$OUTD/tt.log" 2>&1
tar czf "$OUTD/tt-run.tgz" results bench-history.sqlite 2>/dev/null
tail -25 "$OUTD/tt.log"
