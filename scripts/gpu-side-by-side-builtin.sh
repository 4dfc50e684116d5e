#!/usr/bin/env bash
# Issue 40 on a lent GPU, built-in cells: a nightly repository whose build is bench itself
# (`triage.setup: sh build.sh`, `triage.worker: worker/bench`), run night by night exactly as
# ci/github/bench.yml runs it after its build step, from the repository's root with relative
# folders:
#   sh build.sh
#   worker/bench matrix matrix.yaml --run-id ID --shard 1/1 --results-dir shards \
#     --no-progress --history H --triage-budget 3600
#   worker/bench report merge shards/ID/ -o results/ID
# The matrix has two cells (gpt2-125m bf16 on one GPU, without and with selective activation
# checkpointing); the slowdown is a code change that drops the master-weight AdamW kernel
# (libtorch's fused AdamW over fp32 parameters), about -4% on an H200.
#
# The lent GPU hosts have no Rust toolchain, so "building" a commit is a build-cache lookup,
# as in scripts/gpu-triage.sh: the repository holds bench's src/workload/engine.rs as each
# commit has it, and build.sh copies the binary built from exactly that file (keyed by its
# SHA-256) into worker/bench. Prepare on the build machine:
#   .gpu/bench                                        this checkout's stripped release build
#   .gpu-triage/src/{good,slow}/engine.rs             scripts/gpu-triage/make-sources.sh
#   .gpu-triage/builds/<sha256 of slow engine.rs>/bench  the release build of slow/engine.rs
# (the good build is .gpu/bench, filed under its source's hash here).
#
# Phases (one night each, in order): clean, slow (six commits, the fourth the slowdown),
# same (no commit), revert, busy (every CPU busy with `yes`). State between device calls
# travels as OUT/state.tgz; give it back as STATE_IN.
#
# Usage: scripts/gpu-side-by-side-builtin.sh OUT STATE_IN PHASE...   (STATE_IN '' for none)
set -u
FINAL=$1; STATE=$2; shift 2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
G=$ROOT/.gpu-triage
mkdir -p "$FINAL"; FINAL=$(cd "$FINAL" && pwd)
WORK=${SBS_WORK:-/tmp/gpu-sbs-builtin}
rm -rf "$WORK"; mkdir -p "$WORK/out"
# Everything is written under $WORK/out and goes to FINAL as one tarball after every night,
# beside the nights' table: a lent machine returns only a few files (on 2026-11-29 a call
# cut at its limit returned the first eight files and lost the table), and only what is
# there when a call ends.
OUTD=$WORK/out
sync_out() {
  tar czf "$FINAL/sbs-builtin.tgz.tmp" -C "$WORK" out && mv "$FINAL/sbs-builtin.tgz.tmp" "$FINAL/sbs-builtin.tgz"
  cp "$OUTD/nights.txt" "$FINAL/" 2>/dev/null
}
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
export LD_LIBRARY_PATH=$TL:$TL/../../nvidia/nccl/lib:$TL/../../nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 GITHUB_REF_NAME=main BUILDS=$G/builds
for v in $(env | grep -o '^BENCH_[A-Z0-9_]*'); do unset "$v"; done
unset GITHUB_BASE_REF CI_MERGE_REQUEST_TARGET_BRANCH_NAME
good=$(sha256sum "$G/src/good/engine.rs" | cut -c1-64)
mkdir -p "$BUILDS/$good" && cp "$ROOT/.gpu/bench" "$BUILDS/$good/bench"
REPO=$WORK/repo
HISTORY=$WORK/bench-history.sqlite
host=$(hostname)
# Every lent machine calls itself `vm`, so the GPU's UUID and the kernel's boot id say
# whether two calls ran on the same machine.
echo "host $host $(nvidia-smi --query-gpu=name,driver_version,uuid,pci.bus_id --format=csv,noheader | head -1) boot $(cat /proc/sys/kernel/random/boot_id) start $(date -u +%FT%TZ)" >> "$OUTD/hosts.txt"
gitc() { git -C "$REPO" -c user.name="Nightly Dev" -c user.email=dev@example.com "$@"; }
if [ -n "$STATE" ] && [ -f "$STATE" ]; then
  tar xzf "$STATE" -C "$WORK"
else
  mkdir -p "$REPO/src/workload" && git -C "$REPO" init -q -b main
  cp "$G/src/good/engine.rs" "$REPO/src/workload/engine.rs"
  printf 'worker/\nshards/\nresults/\n' > "$REPO/.gitignore"
  cat > "$REPO/build.sh" <<'EOF'
#!/bin/sh
# The build: the binary built from this commit's source (see scripts/gpu-side-by-side-builtin.sh).
set -eu
h=$(sha256sum src/workload/engine.rs | cut -c1-64)
[ -x "$BUILDS/$h/bench" ] || { echo "no build of source $h" >&2; exit 1; }
mkdir -p worker && cp "$BUILDS/$h/bench" worker/bench
EOF
  cat > "$REPO/matrix.yaml" <<'EOF'
name: nightly-gpt2
axes:
  model: [gpt2-125m]
  dtype: [bf16]
  gpus: [1]
  parallel: [single]
  features:
    subsets_of: [sac]
defaults:
  steps: 30
  warmup: 10
  seq_len: 1024
  micro_batch: 16
  repeats: 5
  timeout: 10m
  retries: 1
  sac_every: 2
triage:
  setup: sh build.sh
  worker: worker/bench
  budget_gpu_s: 1500
EOF
  gitc add -A && gitc commit -q -m "nightly: gpt2-125m on one GPU"
fi
cd "$REPO" || exit 1
night_no=0
[ -f "$WORK/nights.txt" ] && night_no=$(wc -l < "$WORK/nights.txt")
night() { # id
  local id=$1; local t0=$SECONDS
  sh build.sh > "$OUTD/$id.build.log" 2>&1
  timeout 560 worker/bench matrix matrix.yaml --run-id "$id" --shard 1/1 --results-dir shards \
    --no-progress --history "$HISTORY" --triage-budget 3600 > "$OUTD/$id.matrix.log" 2>&1
  local rc=$?
  worker/bench report merge "shards/$id/" -o "results/$id" > "$OUTD/$id.merge.log" 2>&1
  local mrc=$?
  local wall=$((SECONDS - t0))
  mkdir -p "$OUTD/$id"
  cp "results/$id/summary.md" "results/$id/report.json" "results/$id/junit.xml" "$OUTD/$id/" 2>/dev/null
  cp "shards/$id/history.json" "$OUTD/$id/" 2>/dev/null
  python3 "$ROOT/scripts/gpu-side-by-side/night-line.py" "$id" "$rc" "$mrc" "$wall" "$host" "$(git rev-parse --short HEAD)" | tee -a "$WORK/nights.txt" >> "$OUTD/nights.txt"
  grep -h "^history:\|^triage: F\|^result" "$OUTD/$id.matrix.log" | cut -c1-600 >> "$OUTD/lines.txt"
  tail -1 "$OUTD/nights.txt"
  # The repository and the history after every night: a call cut at its time limit keeps
  # the nights it finished. The build cache (.git/bench-builds, 20 MB a commit) stays
  # behind: a lent machine returns no file over 16 MB, and build.sh makes a build again.
  (cd "$WORK" && tar czf "$FINAL/state.tgz.tmp" --exclude=repo/worker --exclude=repo/shards \
     --exclude=repo/results --exclude=repo/.git/bench-builds repo bench-history.sqlite nights.txt && mv "$FINAL/state.tgz.tmp" "$FINAL/state.tgz")
  sync_out
}
for phase in "$@"; do
  night_no=$((night_no + 1)); id=$(printf 'b%02d-%s' "$night_no" "$phase")
  case $phase in
    clean) echo "night $night_no" >> NOTES && gitc add -A && gitc commit -q -m "docs: night $night_no notes"; night "$id" ;;
    slow)
      for s in "refactor: name the loader's buffers" "docs: the optimizer's flags" \
               "optim: libtorch's fused AdamW over fp32 parameters by default" \
               "ci: cache the venv" "tests: more precision cases" "style: fmt"; do
        case $s in
          optim:*) cp "$G/src/slow/engine.rs" src/workload/engine.rs ;;
          *) echo "$s" >> NOTES ;;
        esac
        gitc add -A && gitc commit -q -m "$s"
      done
      night "$id" ;;
    same) night "$id" ;;
    revert)
      cp "$G/src/good/engine.rs" src/workload/engine.rs
      gitc add -A && gitc commit -q -m "Revert \"optim: libtorch's fused AdamW over fp32 parameters by default\""
      night "$id" ;;
    busy)
      echo "night $night_no" >> NOTES && gitc add -A && gitc commit -q -m "docs: night $night_no notes"
      pids=(); for _ in $(seq "$(nproc)"); do yes > /dev/null & pids+=($!); done
      night "$id"
      kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null ;;
  esac
done
echo "end $(date -u +%FT%TZ)" >> "$OUTD/hosts.txt"
sync_out
