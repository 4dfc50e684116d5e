#!/usr/bin/env bash
# Issue 40 on a lent GPU: a nightly repository holding a team's own PyTorch training script
# (scripts/gpu-side-by-side/train.py: a GPT-2-shaped decoder, eager, bf16 autocast, AdamW
# fused or foreach; not bench's built-in workload), gated as a `command` workload over
# `opt`, 3 repeats of 30 steps, each repeat a fresh Python process, run night by night
# exactly as ci/github/bench.yml runs it:
#   bench matrix bench.yaml --run-id ID --shard 1/1 --results-dir shards --no-progress \
#     --history H --triage-budget 3600
#   bench report merge shards/ID/ -o results/ID
# from the repository's root with relative folders.
#
# Phases (one night each, in order; a night is a commit of the repository):
#   calibrate  time train.py with per-parameter gradient clipping on every parameter
#              against none, and pick the clipping stride that makes a 2-4% slowdown
#   clean      a docs commit
#   slow       three commits, the middle one clips gradients per parameter in the fused path
#   same       no commit (the same slow code judged again)
#   revert     the revert of the clipping
#   busy       a docs commit, with every CPU of the host busy (yes > /dev/null)
# A later session continues from the state an earlier one left (REPO bundle and store in
# STATE_IN); everything is written under OUT as it comes.
#
# Usage: scripts/gpu-side-by-side.sh BENCH OUT STATE_IN PHASE...   (STATE_IN '' for none)
set -u
BENCH=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); FINAL=$2; STATE=$3; shift 3
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$FINAL"; FINAL=$(cd "$FINAL" && pwd)
[ -n "$STATE" ] && STATE=$(cd "$STATE" && pwd)
WORK=${SBS_WORK:-/tmp/gpu-sbs}
rm -rf "$WORK"; mkdir -p "$WORK/out"
# Everything is written under $WORK/out; after every night it goes to FINAL as one tarball
# beside the two tables (a lent machine returns a few files, and only what is there when a
# call ends at its time limit).
OUTD=$WORK/out
sync_out() {
  tar czf "$FINAL/sbs.tgz.tmp" -C "$WORK" out && mv "$FINAL/sbs.tgz.tmp" "$FINAL/sbs.tgz"
  cp "$OUTD/nights.txt" "$OUTD/lines.txt" "$OUTD/hosts.txt" "$FINAL/" 2>/dev/null
}
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
export LD_LIBRARY_PATH=$TL:$TL/../../nvidia/nccl/lib:$TL/../../nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 GITHUB_REF_NAME=main
export GIT_AUTHOR_NAME="Nightly Dev" GIT_AUTHOR_EMAIL=dev@example.com
export GIT_COMMITTER_NAME="Nightly Dev" GIT_COMMITTER_EMAIL=dev@example.com
REPO=$WORK/repo
HISTORY=$WORK/bench-history.sqlite
host=$(hostname)
# Every lent machine calls itself `vm`, so the GPU's UUID and the kernel's boot id say
# whether two calls ran on the same machine.
echo "host $host $(nvidia-smi --query-gpu=name,driver_version,uuid,pci.bus_id --format=csv,noheader | head -1) boot $(cat /proc/sys/kernel/random/boot_id) start $(date -u +%FT%TZ)" >> "$OUTD/hosts.txt"
if [ -n "$STATE" ] && [ -f "$STATE/repo.bundle" ]; then
  git clone -q "$STATE/repo.bundle" "$REPO" && git -C "$REPO" checkout -q -B main origin/main
  cp "$STATE/bench-history.sqlite" "$HISTORY"
  cp "$STATE/nights.txt" "$OUTD/nights.txt" 2>/dev/null || true
else
  mkdir -p "$REPO" && git -C "$REPO" init -q -b main
  cp "$HERE/gpu-side-by-side/train.py" "$REPO/train.py"
  # The stride of the per-parameter clipping the slow commit turns on (0: none).
  sed -i 's/^STEPS, WARMUP/CLIP_STRIDE = 0\nSTEPS, WARMUP/' "$REPO/train.py"
  python3 - "$REPO/train.py" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
s = s.replace("""        loss.backward()
        opt.step()""", """        loss.backward()
        if opt_name == "fused" and CLIP_STRIDE:
            # Per-parameter clipping on the fused path (the slowdown under test).
            for q in list(model.parameters())[::CLIP_STRIDE]:
                torch.nn.utils.clip_grad_norm_([q], 1.0)
        opt.step()""")
open(p, "w").write(s)
PY
  cat > "$REPO/bench.yaml" <<'YAML'
name: team-nightly
axes:
  model: [m]
  opt: [fused, foreach]
defaults:
  steps: 20
  warmup: 5
  repeats: 3
  timeout: 300s
  retries: 0
  workload:
    kind: command
    argv: [python3, train.py, '{model}', '{opt}']
YAML
  printf 'shards/\nresults/\n' > "$REPO/.gitignore"
  git -C "$REPO" add -A && git -C "$REPO" commit -q -m "initial: the training script and its nightly matrix"
fi
cd "$REPO" || exit 1
night_no=$(wc -l < "$OUTD/nights.txt" 2>/dev/null || echo 0)
median_step() { # model opt -> median step time (s) of one process
  python3 train.py "$1" "$2" | python3 -c '
import json,sys,statistics
t=[json.loads(l)["step_time_s"] for l in sys.stdin if "\"step\"" in l and "\"warmup\": false" in l]
print(statistics.median(t))'
}
night() { # id [env...]
  local id=$1; shift
  local t0=$SECONDS
  env "$@" timeout 560 "$BENCH" matrix bench.yaml --run-id "$id" --shard 1/1 --results-dir shards \
    --no-progress --history "$HISTORY" --triage-budget 3600 > "$OUTD/$id.matrix.log" 2>&1
  local rc=$?
  "$BENCH" report merge "shards/$id/" -o "results/$id" > "$OUTD/$id.merge.log" 2>&1
  local mrc=$?
  local wall=$((SECONDS - t0))
  mkdir -p "$OUTD/$id"
  cp "results/$id/summary.md" "results/$id/report.json" "$OUTD/$id/" 2>/dev/null
  cp "shards/$id/history.json" "$OUTD/$id/" 2>/dev/null
  python3 "$HERE/gpu-side-by-side/night-line.py" "$id" "$rc" "$mrc" "$wall" "$host" "$(git rev-parse --short HEAD)" >> "$OUTD/nights.txt"
  grep -h "^history:\|^triage: F\|^result" "$OUTD/$id.matrix.log" | cut -c1-600 >> "$OUTD/lines.txt"
  tail -1 "$OUTD/nights.txt"
}
for phase in "$@"; do
  case $phase in
    calibrate)
      base=$(median_step m fused)
      sed -i 's/^CLIP_STRIDE = 0/CLIP_STRIDE = 1/' train.py
      all=$(median_step m fused)
      sed -i 's/^CLIP_STRIDE = 1/CLIP_STRIDE = 0/' train.py
      stride=$(python3 -c "
import sys
try: o = float('$all') / float('$base') - 1
except ValueError: o = 0
print(max(1, round(o / 0.03)) if o > 0 else 4)")
      echo "calibrate: base $base s, every parameter clipped $all s, stride $stride" | tee -a "$OUTD/calibrate.txt"
      echo "$stride" > "$WORK/stride"
      cp "$WORK/stride" "$OUTD/stride"
      sync_out
      continue ;;
  esac
  night_no=$((night_no + 1)); id=$(printf 'n%02d-%s' "$night_no" "$phase")
  case $phase in
    clean) git commit -q --allow-empty -m "docs: night $night_no notes"; night "$id" ;;
    slow)
      stride=$(cat "$WORK/stride" 2>/dev/null || cat "$STATE/stride" 2>/dev/null || echo 4)
      git commit -q --allow-empty -m "docs: the README's new section"
      sed -i "s/^CLIP_STRIDE = 0/CLIP_STRIDE = $stride/" train.py
      git commit -q -am "clip gradients per parameter in the fused path"
      git commit -q --allow-empty -m "tests: one more case"
      night "$id" ;;
    same) night "$id" ;;
    revert)
      git revert --no-edit HEAD~1 >/dev/null 2>&1 || { sed -i 's/^CLIP_STRIDE = .*/CLIP_STRIDE = 0/' train.py; git commit -q -am "Revert clipping"; }
      night "$id" ;;
    busy)
      git commit -q --allow-empty -m "docs: night $night_no notes"
      pids=(); for _ in $(seq "$(nproc)"); do yes > /dev/null & pids+=($!); done
      night "$id"
      kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null ;;
  esac
  # The state a later session continues from, after every night.
  mkdir -p "$OUTD/state"
  git bundle create -q "$OUTD/state/repo.bundle" main 2>/dev/null
  cp "$HISTORY" "$OUTD/state/bench-history.sqlite"
  cp "$OUTD/nights.txt" "$OUTD/state/nights.txt"
  cp "$WORK/stride" "$OUTD/state/stride" 2>/dev/null
  sync_out
done
echo "end $(date -u +%FT%TZ)" >> "$OUTD/hosts.txt"
sync_out
