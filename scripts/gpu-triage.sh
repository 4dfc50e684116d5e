#!/usr/bin/env bash
# Automatic triage on a real GPU (issue 30): nights of a nightly repository judged by
# `bench matrix matrix.yaml --history` as the CI templates run it, the last night after a
# range of commits of which one is a code change that slows the built-in workload (the
# master-weight AdamW kernel dropped for libtorch's fused AdamW over fp32 parameters). The
# matrix's `triage:` block gives the build recipe and a GPU-seconds budget; nothing is run by
# hand: the slowed night's summary.md must name the first bad commit and the kernels that
# moved.
#
# The lent GPU hosts have no Rust toolchain, so "building" a commit is a build-cache lookup:
# the repository holds bench's src/workload/engine.rs as each commit has it, and build.sh
# copies the binary that was built from exactly that file (on the build machine, keyed by
# the file's SHA-256) into worker/bench. A commit whose source no build matches fails its
# setup, as a broken build would.
#
# Usage: scripts/gpu-triage.sh PHASE OUT_DIR
#   PHASE  clean:N   N clean nights (a new repository and history unless OUT_DIR/state has one)
#          slow      the commit range with the slowdown, then the night that triages it
# Prepare on the build machine (.gpu-triage is excluded from git):
#   .gpu-triage/builds/<sha256 of engine.rs>/bench   the stripped release binaries
#   .gpu-triage/src/{good,slow}/engine.rs             the two versions of src/workload/engine.rs
#                                                  (scripts/gpu-triage/make-sources.sh writes them)
# State between device calls (the repository and the history) travels as
# OUT_DIR/state.tgz; give it back as .gpu-triage/state.tgz to the next call.
set -u
PHASE=$1; OUTD=$2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
G=$ROOT/.gpu-triage
mkdir -p "$OUTD"; OUTD=$(cd "$OUTD" && pwd)
WORK=${TRIAGE_WORK:-/tmp/gpu-triage}
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
export LD_LIBRARY_PATH=$TL:$TL/../../nvidia/nccl/lib:$TL/../../nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 GITHUB_REF_NAME=main BUILDS=$G/builds
for v in $(env | grep -o '^BENCH_[A-Z0-9_]*'); do unset "$v"; done
unset GITHUB_BASE_REF CI_MERGE_REQUEST_TARGET_BRANCH_NAME
REPO=$WORK/repo
if [ ! -d "$REPO/.git" ] && [ -f "$G/state.tgz" ]; then
  mkdir -p "$WORK" && tar xzf "$G/state.tgz" -C "$WORK"
fi
gitc() { git -C "$REPO" -c user.name="Nightly Dev" -c user.email=dev@example.com "$@"; }
if [ ! -d "$REPO/.git" ]; then
  mkdir -p "$REPO/src/workload" && git -C "$REPO" init -q -b main
  cp "$G/src/good/engine.rs" "$REPO/src/workload/engine.rs"
  printf 'worker/\n' > "$REPO/.gitignore"
  cat > "$REPO/build.sh" <<'EOF'
#!/bin/sh
# The build: the binary built from this commit's source (see scripts/gpu-triage.sh).
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
defaults:
  steps: 30
  warmup: 10
  seq_len: 1024
  micro_batch: 16
  repeats: 5
  timeout: 10m
  retries: 1
triage:
  setup: sh build.sh
  worker: worker/bench
  budget_gpu_s: 1500
EOF
  gitc add -A && gitc commit -q -m "nightly: gpt2-125m on one GPU"
fi
# One night: the commit's own build runs the matrix against the history, as the CI template
# does after its build step.
night() {
  local id=$1; local t0=$SECONDS
  (cd "$REPO" && sh build.sh && timeout 580 worker/bench matrix matrix.yaml --no-progress \
     --results-dir "$WORK/results" --run-id "$id" --baselines "$WORK/baselines" \
     --history "$WORK/history.sqlite") > "$OUTD/$id.out" 2> "$OUTD/$id.err"
  local rc=$?
  echo "$id rc=$rc $((SECONDS - t0))s" | tee -a "$OUTD/nights.txt"
  for f in summary.md report.json junit.xml history.json; do
    [ -f "$WORK/results/$id/$f" ] && cp "$WORK/results/$id/$f" "$OUTD/$id.$f"
  done
  if [ -d "$WORK/results/$id/triage" ]; then
    (cd "$WORK/results/$id" && tar czf "$OUTD/$id.triage.tgz" triage)
  fi
  save_state
}
# The repository and the history, after every night: a call cut at its time limit keeps
# the nights it finished.
save_state() {
  (cd "$WORK" && shopt -s nullglob && tar czf "$OUTD/state.tgz" repo history.sqlite results/*/results.json)
}
n=0
for d in "$WORK"/results/night*; do
  case ${d##*/} in night*[!0-9]*) ;; *) n=$((n + 1)) ;; esac
done
case $PHASE in
  clean:*)
    for _ in $(seq "${PHASE#clean:}"); do
      n=$((n + 1))
      echo "night $n" > "$REPO/NOTES" && gitc add -A && gitc commit -q -m "docs: night $n notes"
      night "$(printf 'night%02d' "$n")"
    done ;;
  slow)
    for s in "refactor: name the loader's buffers" "docs: the optimizer's flags" \
             "optim: libtorch's fused AdamW over fp32 parameters by default" \
             "ci: cache the venv" "tests: more precision cases" "style: fmt"; do
      case $s in
        optim:*) cp "$G/src/slow/engine.rs" "$REPO/src/workload/engine.rs" ;;
        *) echo "$s" >> "$REPO/NOTES" ;;
      esac
      gitc add -A && gitc commit -q -m "$s"
    done
    gitc log --format='%h %s' | head -8 > "$OUTD/commits.txt"
    n=$((n + 1))
    night "$(printf 'night%02d' "$n")" ;;
esac
