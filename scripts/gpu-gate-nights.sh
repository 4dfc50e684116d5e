#!/usr/bin/env bash
# Ordered nights on a real GPU for the gate's calibration (issue 31): each night is a commit
# of a scratch repository, judged by `bench matrix matrix/gate-nights.yaml --history` as the
# CI templates run it; phases of clean nights, nights at a real code slowdown
# (BENCH_FUSED_ADAMW=0: the unfused AdamW, 2.5% on gpt2-125m), the revert, and nights on a
# host whose every CPU is busy with other processes. One line per cell and night goes to
# verdicts.tsv: the shipped verdict (history.json), the exit code and the verdict line.
#
# Runs on a GPU host with torch and no Rust: carry the stripped release binary, as
# scripts/gpu-bench.sh does. The history travels between device calls: give the store a
# call left in OUT_DIR as STORE to the next.
#
# Usage: scripts/gpu-gate-nights.sh BENCH STORE OUT_DIR FILTER PHASE...
#   BENCH    the bench binary
#   STORE    an earlier history.sqlite ('' for a new one); copied into OUT_DIR
#   FILTER   the cells (--filter of matrix/gate-nights.yaml)
#   PHASE    clean:N | slow:N | revert:N | busy:N (N nights of that kind)
# Files in OUT_DIR, written after every night: history.sqlite, verdicts.tsv, and at the end
# nights.tgz (every night's summary.md, history.json and results.json).
set -u
BENCH=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); STORE=$2; OUTD=$3; FILTER=$4; shift 4
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUTD"; OUTD=$(cd "$OUTD" && pwd)
WORK=${GATE_NIGHTS_WORK:-/tmp/gate-nights}
mkdir -p "$WORK/results" "$WORK/logs"
[ -n "$STORE" ] && [ -f "$STORE" ] && [ ! -f "$OUTD/history.sqlite" ] && cp "$STORE" "$OUTD/history.sqlite"
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
export LD_LIBRARY_PATH=$TL:$TL/../../nvidia/nccl/lib:$TL/../../nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 GITHUB_REF_NAME=main
for v in $(env | grep -o '^BENCH_FUSED_[A-Z0-9_]*'); do unset "$v"; done
REPO=$WORK/repo
if [ ! -d "$REPO/.git" ]; then
  mkdir -p "$REPO" && git -C "$REPO" init -q -b main
fi
n=$(sqlite3 "$OUTD/history.sqlite" "select count(*) from bench_runs where run_id not like '%confirm%'" 2>/dev/null || python3 - "$OUTD/history.sqlite" <<'PY'
import sqlite3, sys, os
p = sys.argv[1]
if not os.path.exists(p): print(0); sys.exit()
print(sqlite3.connect(p).execute("select count(*) from bench_runs where run_id not like '%confirm%'").fetchone()[0])
PY
)
night() {
  local kind=$1; n=$((n + 1))
  local id; id=$(printf 'night%02d-%s' "$n" "$kind")
  git -C "$REPO" -c user.name=n -c user.email=n@n commit -q --allow-empty -m "$id"
  local burners=()
  case $kind in
    slow) export BENCH_FUSED_ADAMW=0 ;;
    busy)
      for _ in $(seq "$(nproc)"); do
        python3 -c 'while True: pass' & burners+=($!)
      done
      sleep 2 ;;
  esac
  local t0=$SECONDS
  (cd "$REPO" && timeout 590 "$BENCH" matrix "$ROOT/matrix/gate-nights.yaml" --filter "$FILTER" \
    --no-progress --results-dir "$WORK/results" --run-id "$id" --baselines "$WORK/baselines" \
    --history "$OUTD/history.sqlite") > "$WORK/logs/$id.out" 2> "$WORK/logs/$id.err"
  local rc=$?
  unset BENCH_FUSED_ADAMW
  for b in "${burners[@]}"; do kill "$b" 2>/dev/null; wait "$b" 2>/dev/null; done
  python3 - "$WORK/results/$id/history.json" "$id" "$rc" "$((SECONDS - t0))" <<'PY' >> "$OUTD/verdicts.tsv"
import json, sys
path, id, rc, secs = sys.argv[1:]
try:
    h = json.load(open(path))
except Exception as e:
    print(f"{id}\trc={rc}\t{secs}s\t-\tno history.json ({e})"); sys.exit()
for c in h["cells"]:
    print(f"{id}\trc={rc}\t{secs}s\t{c['cell_id']}\t{c['judgement']['verdict']}\t{c['line'][:600]}")
PY
  tail -n 2 "$OUTD/verdicts.tsv"
}
for phase in "$@"; do
  kind=${phase%%:*}; count=${phase##*:}
  for _ in $(seq "$count"); do night "$kind"; done
done
(cd "$WORK" && find results -maxdepth 2 \( -name summary.md -o -name history.json -o -name results.json \) -print0 \
  | tar czf "$OUTD/nights.tgz" --null -T -)
