#!/usr/bin/env bash
# The history verdict on a real GPU, as issue 21 reproduced it: clean nights of the
# nightly's gpt2-125m 1-GPU bf16 cells, then nights with a real code slowdown
# (BENCH_FUSED_ADAMW=0), then clean again, then a night with a second process computing on
# the same GPU, all through `bench matrix ... --history`; prints one line per cell and
# night with the shipped verdict (history.json) and the exit code.
#
# Runs on a GPU host with torch (the torch==2.11.0 the binary was built against) and no
# Rust, like scripts/gpu-bench.sh: carry the stripped release binary.
#
# Usage: scripts/gpu-verdict.sh DIR OUT_DIR PHASE...
#   DIR      holds `bench`, and `history.sqlite` from an earlier call (it is copied into
#            OUT_DIR and used from there, so phases can span device calls)
#   PHASE    clean:N  N clean nights
#            slow:N   N nights with BENCH_FUSED_ADAMW=0
#            foreign:N  N nights with a bf16 matmul loop in another process on GPU 0
set -u
DIR=$1; OUTD=$2; shift 2
BENCH=$(cd "$DIR" && pwd)/bench
mkdir -p "$OUTD/logs"
OUTD=$(cd "$OUTD" && pwd)
[ -f "$OUTD/history.sqlite" ] || { [ -f "$DIR/history.sqlite" ] && cp "$DIR/history.sqlite" "$OUTD/"; }
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
export LD_LIBRARY_PATH=$TL:$TL/../../nvidia/nccl/lib:$TL/../../nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 GITHUB_REF_NAME=main
for v in $(env | grep -o '^BENCH_FUSED_[A-Z0-9_]*'); do unset "$v"; done
FILTER='model=gpt2-125m and gpus=1 and dtype=bf16'
n=${N0:-$(find "$OUTD/results" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | grep -vc confirm)}
night() {
  local kind=$1; n=$((n + 1))
  local id
  id=$(printf 'night%02d-%s' "$n" "$kind")
  local hog=""
  case $kind in
    slow) export BENCH_FUSED_ADAMW=0 ;;
    foreign)
      python3 -c 'import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
while True:
    b = a @ a
    torch.cuda.synchronize()' > "$OUTD/logs/hog.log" 2>&1 &
      hog=$!; sleep 8 ;;
  esac
  timeout 560 "$BENCH" matrix matrix/nightly-h100.yaml --filter "$FILTER" --no-progress \
    --results-dir "$OUTD/results" --run-id "$id" --baselines "$OUTD/baselines" \
    --history "$OUTD/history.sqlite" > "$OUTD/logs/$id.out" 2> "$OUTD/logs/$id.err"
  local rc=$?
  unset BENCH_FUSED_ADAMW
  [ -n "$hog" ] && { kill "$hog"; wait "$hog" 2>/dev/null; }
  python3 - "$OUTD/results/$id/history.json" "$id" "$rc" <<'PY'
import json, sys
path, id, rc = sys.argv[1:]
try:
    h = json.load(open(path))
except Exception as e:
    print(f"{id} rc={rc} no history.json ({e})"); sys.exit()
for c in h["cells"]:
    print(f"{id}\trc={rc}\t{c['cell_id']}\t{c['line'][:400]}")
PY
}
for phase in "$@"; do
  kind=${phase%%:*}; count=${phase##*:}
  for _ in $(seq "$count"); do night "$kind"; done
done | tee -a "$OUTD/verdicts.tsv"
