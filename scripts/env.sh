# shellcheck shell=bash
# Sourced by the other scripts: makes sure the local venv holds libtorch (the PyPI
# torch==2.11.0 wheel, which tch 0.24 requires exactly) and the CUDA 13.0 headers the C++
# shim compiles against, then exports what the build needs. Idempotent and quiet when
# everything is already there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BENCH_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
TORCH_VERSION=2.11.0

if [ ! -x "$VENV/bin/python" ]; then
  echo "bench: creating $VENV (python venv for libtorch)" >&2
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null \
   || [ ! -d "$("$VENV/bin/python" -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))')/nvidia/cu13/include/crt" ]; then
  echo "bench: installing torch==$TORCH_VERSION and CUDA 13.0 headers into $VENV (a few GB, once)" >&2
  # --no-cache-dir: the wheels (about 3 GB with torch's CUDA libraries) are unpacked into the
  # venv once; keeping a second copy in pip's cache doubled the disk the set-up needs, and a
  # CI machine ran out of it.
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
    "torch==$TORCH_VERSION" "nvidia-cuda-crt==13.0.*" "nvidia-cuda-cccl==13.0.*"
fi
export LIBTORCH_USE_PYTORCH=1
export PATH="$VENV/bin:$PATH"
TORCH_LIB="$("$VENV/bin/python" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export LD_LIBRARY_PATH="$TORCH_LIB:$TORCH_LIB/../../nvidia/nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cd "$ROOT"
