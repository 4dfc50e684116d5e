#!/usr/bin/env bash
# A nightly split into two shards on one GPU host, run one after the other and merged, beside
# the same nightly unsharded (issue 33): the merged verdict must equal the unsharded one's,
# as the CI templates run both (`bench matrix --history`, re-runs of suspects included).
#
# Each night is a commit of a scratch repository, as in scripts/gpu-gate-nights.sh, whose
# store of 18 real H200 nights this script starts from: both ways of running get their own
# copy of that store, so each night is judged against the same earlier nights. Nights:
# clean, slow (a real code slowdown: BENCH_FUSED_ADAMW=0, the unfused AdamW), clean again.
# Per night: the unsharded run, shard 1/2, shard 2/2, `bench report merge`; one line per
# cell and way into verdicts.tsv (verdict, exit code, findings), and at the end a table of
# whether they agree.
#
# Runs on a GPU host with torch and no Rust: carry the stripped release binary.
# Usage: scripts/gpu-shards.sh BENCH STORE OUT_DIR [PHASE...]
#   STORE    a history to start from ('' for none: then begin with `history` nights)
#   PHASE    history (an unsharded clean night recorded in both stores: the history on this
#            host) | clean | slow
#   FILTER   (environment) the cells of matrix/gate-nights.yaml; default the two cells the
#            committed store holds
set -u
BENCH=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); STORE=$2; OUTD=$3; shift 3
PHASES=("$@"); [ ${#PHASES[@]} -eq 0 ] && PHASES=(clean slow clean)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUTD"; OUTD=$(cd "$OUTD" && pwd)
WORK=${GPU_SHARDS_WORK:-/tmp/gpu-shards}
rm -rf "$WORK"; mkdir -p "$WORK/logs"
if [ -n "$STORE" ]; then cp "$STORE" "$WORK/whole.sqlite"; cp "$STORE" "$WORK/shards.sqlite"; fi
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
export LD_LIBRARY_PATH=$TL:$TL/../../nvidia/nccl/lib:$TL/../../nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 GITHUB_REF_NAME=main
for v in $(env | grep -o '^BENCH_FUSED_[A-Z0-9_]*'); do unset "$v"; done
FILTER=${FILTER:-'gpus=1 and (model=gpt2-125m and features=sac or model=llama-3.1-8b-proxy and features=base)'}
REPO=$WORK/repo
mkdir -p "$REPO" && git -C "$REPO" init -q -b main
: > "$OUTD/verdicts.tsv"
# One line per cell of a judged run folder: way, night, exit code, cell, verdict, findings.
verdicts() {
  python3 - "$1" "$2" "$3" "$4" <<'PY' >> "$OUTD/verdicts.tsv"
import json, sys
d, way, night, rc = sys.argv[1:]
try:
    h = json.load(open(f"{d}/history.json"))
    r = json.load(open(f"{d}/report.json"))
except Exception as e:
    print(f"{night}\t{way}\trc={rc}\t-\tno history.json or report.json ({e})"); sys.exit()
n = len(r.get("findings", []))
for c in sorted(h["cells"], key=lambda c: c["cell_id"]):
    print(f"{night}\t{way}\trc={rc}\t{c['cell_id']}\t{c['judgement']['verdict']}\tfindings={n}\t{c['line'][:300]}")
PY
}
run() { # way id results store [extra args]
  local way=$1 id=$2 res=$3 store=$4; shift 4
  local t0=$SECONDS
  (cd "$REPO" && timeout 400 "$BENCH" matrix "$ROOT/matrix/gate-nights.yaml" --filter "$FILTER" \
    --no-progress --results-dir "$res" --run-id "$id" --baselines "$WORK/baselines" \
    --history "$store" "$@") > "$WORK/logs/$way-$id.out" 2> "$WORK/logs/$way-$id.err"
  local rc=$?
  echo "$id $way rc=$rc $((SECONDS - t0))s" >> "$OUTD/runs.txt"
  return $rc
}
n=0
for kind in "${PHASES[@]}"; do
  n=$((n + 1)); id=$(printf 'night%02d-%s' "$n" "$kind")
  git -C "$REPO" -c user.name=n -c user.email=n@n commit -q --allow-empty -m "$id"
  if [ "$kind" = history ]; then
    run whole "$id" "$WORK/whole" "$WORK/whole.sqlite"
    cp "$WORK/whole.sqlite" "$WORK/shards.sqlite"
    continue
  fi
  [ "$kind" = slow ] && export BENCH_FUSED_ADAMW=0
  run whole "$id" "$WORK/whole" "$WORK/whole.sqlite"; rc=$?
  verdicts "$WORK/whole/$id" whole "$id" $rc
  run shard1 "$id" "$WORK/s1" "$WORK/shards.sqlite" --shard 1/2
  run shard2 "$id" "$WORK/s2" "$WORK/shards.sqlite" --shard 2/2
  unset BENCH_FUSED_ADAMW
  "$BENCH" report merge "$WORK/s1/$id" "$WORK/s2/$id" -o "$WORK/merged/$id" \
    --baselines "$WORK/baselines" > "$WORK/logs/merge-$id.out" 2> "$WORK/logs/merge-$id.err"
  rc=$?
  echo "$id merge rc=$rc" >> "$OUTD/runs.txt"
  verdicts "$WORK/merged/$id" merged "$id" $rc
  tail -n 4 "$OUTD/verdicts.tsv"
done
# Whether the merged verdict equals the unsharded one, night by night.
python3 - "$OUTD/verdicts.tsv" <<'PY' | tee "$OUTD/agreement.md"
import sys, collections
rows = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    if len(f) < 6:
        continue
    night, way, rc, cell, verdict, findings = f[:6]
    rows[(night, cell)][way] = (verdict, rc, findings)
print("| night | cell | unsharded | merged shards | equal |")
print("|---|---|---|---|---|")
for (night, cell), w in sorted(rows.items()):
    a, b = w.get("whole"), w.get("merged")
    show = lambda v: "-" if v is None else f"{v[0]} ({v[1]}, {v[2]})"
    print(f"| {night} | `{cell}` | {show(a)} | {show(b)} | {'yes' if a == b else '**no**'} |")
PY
(cd "$WORK" && find whole s1 s2 merged -maxdepth 2 \( -name summary.md -o -name history.json \
  -o -name report.json -o -name shard.json -o -name shards.json \) -print0 \
  | tar czf "$OUTD/shards.tgz" --null -T - logs)
