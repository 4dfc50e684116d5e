#!/usr/bin/env bash
# Side-by-side timing of `bench worker` against the PyTorch peers on one GPU, on a host that
# has torch (the same torch==2.11.0 the binary was built against) but no Rust toolchain.
#
# Usage: scripts/gpu-bench.sh [DIR] [OUT_DIR]
#   DIR      holds the release binary `bench`, the reference peers (gpt2_pytorch.py,
#            llama_pytorch.py) and optionally the GPU test binary `worker_gpu` and the
#            kernel benchmark `fused_ce` (benches/fused_ce.rs)
#            (default .gpu, as the lead's recipe copies them there)
#   OUT_DIR  gets one log per run, results.tsv and table.md (default $OUT or /tmp/gpu-bench)
# The `.overlap-adamw` runs overlap the AdamW update with the backward (BENCH_OVERLAP_ADAMW=1,
# src/workload/overlap.rs) beside the serial default, for the A/B; the `.dynamic-scaling` runs
# scale each fp8 tensor by its own amax (BENCH_FP8_SCALING=dynamic) beside the default delayed
# scaling (by the amax history).
# Environment: QUICK=1 runs the bench side only; LEAN=1 skips the one-switch-off ablations and the eager peers; ONLY picks the models (space-separated
# from gpt2 llama gpt2-1.5b; default "gpt2 llama"; gpt2 is gpt2-125m); GPU_TESTS="name
# filters" runs only the matching GPU tests (GPU_TESTS=none skips them); TMO=seconds per
# run (default 300);
# PROFILE=1 also traces one step of each chosen model (gpt2-125m with and without the fused
# kernels, the Llama proxy with and without the master AdamW and in fp8) with BENCH_PROFILE
# and prints the kernel time by kind (trace-top.py, from DIR or scripts/); PROFILE=only
# runs the profiles and nothing else.
# Prints the ratio table last. Every run is bounded by `timeout` so the script never hangs.
set -u
DIR=${1:-.gpu}
OUTD=${2:-${OUT:-/tmp/gpu-bench}}
TMO=${TMO:-300}
LOGS=$OUTD/logs
mkdir -p "$LOGS"
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
export LD_LIBRARY_PATH=$TL:$TL/../../nvidia/nccl/lib:$TL/../../nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
BENCH=$DIR/bench
RES=$OUTD/results.tsv
: > "$RES"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$LOGS/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' | tee -a "$LOGS/gpu.txt"

# peer NAME ARGS...: a PyTorch reference run; records tok/s, MFU and first-step time.
peer() {
  local name=$1; shift
  timeout "$TMO" python3 "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  local line; line=$(grep '^RESULT' "$LOGS/$name.log" | tail -1)
  python3 - "$name" "$rc" "$line" >> "$RES" <<'PY'
import sys
name, rc, line = sys.argv[1], sys.argv[2], sys.argv[3]
f = line.split()
kv = {f[i]: f[i + 1] for i in range(2, len(f) - 1, 2)} if f else {}
mfu = kv.get("mfu_h100_bf16", "")
print("\t".join([name, "peer", rc, kv.get("tok_s", ""), mfu, kv.get("first_step_s", ""), kv.get("peak_gib", "")]))
PY
  echo "$name rc=$rc $line"
}

# ablate NAME ARGS...: a `mine` run that only measures what one kernel gains (a switch off);
# LEAN=1 skips these to fit a short device budget.
ablate() { [ "${LEAN:-0}" = 1 ] || mine "$@"; }

# mine NAME ARGS...: a `bench worker` run; records the summary's figures.
mine() {
  local name=$1; shift
  timeout "$TMO" "$BENCH" worker --cell-id "$name" "$@" > "$LOGS/$name.log" 2> "$LOGS/$name.err"
  local rc=$?
  python3 - "$name" "$rc" "$LOGS/$name.log" >> "$RES" <<'PY'
import sys, json
name, rc, path = sys.argv[1], sys.argv[2], sys.argv[3]
s, err = {}, ""
for l in open(path):
    try:
        e = json.loads(l)
    except ValueError:
        continue
    if e.get("event") == "summary":
        s = e
    if e.get("event") == "error":
        err = e["kind"] + ": " + e["message"][:80]
mem = s.get("peak_mem_bytes") or [0]
print("\t".join([name, "bench", rc, "%.0f" % s["tokens_per_s"] if s else "", "%.3f" % s["mfu"] if s.get("mfu") else "",
                 "%.1f" % s["time_to_first_step_s"] if s else "", "%.1f" % (mem[0] / 2**30) if s else "", err]))
PY
  echo "$name rc=$rc $(tail -1 "$LOGS/$name.log" | cut -c1-300)"
}

G=(--model gpt2-125m --dtype bf16 --seq-len 1024 --micro-batch 16 --steps 40 --warmup 10)
# The shapes alone (the profiles add their own step counts).
L0=(--model llama-3.1-8b-proxy --seq-len 8192 --micro-batch 1)
X0=(--model gpt2-1.5b --dtype bf16 --seq-len 1024 --micro-batch 8)
L=("${L0[@]}" --steps 20 --warmup 5)
X=("${X0[@]}" --steps 30 --warmup 8)

if [ -x "$DIR/worker_gpu" ] && [ "${GPU_TESTS:-}" != none ]; then
  # GPU_TESTS: space-separated test-name filters (none: every GPU test).
  read -r -a GPU_TEST_FILTERS <<< "${GPU_TESTS:-}"
  BENCH_GPU_TESTS=1 BENCH_BIN=$(realpath "$BENCH") timeout "$TMO" "$DIR/worker_gpu" --test-threads 1 --nocapture "${GPU_TEST_FILTERS[@]}" > "$LOGS/worker_gpu.log" 2>&1
  echo "worker_gpu tests rc=$?"; grep -E "worst|test result|panicked" "$LOGS/worker_gpu.log"
fi

if [ -x "$DIR/fused_ce" ]; then
  timeout "$TMO" "$DIR/fused_ce" > "$LOGS/fused_ce.log" 2>&1
  echo "fused_ce kernel bench rc=$?"; cat "$LOGS/fused_ce.log"
fi

ONLY=" ${ONLY:-gpt2 llama} "
want() { [[ "$ONLY" == *" $1 "* ]]; }
GPT2=0; want gpt2 && GPT2=1
LLAMA=0; want llama && LLAMA=1
XL=0; want gpt2-1.5b && XL=1
TOP=$DIR/trace-top.py; [ -f "$TOP" ] || TOP=$(dirname "$0")/trace-top.py

# profile NAME ARGS...: traces the last warm-up step of a short eager run, sums it by kernel.
profile() {
  local name=$1; shift
  BENCH_PROFILE=$LOGS/trace.$name.json timeout "$TMO" "$BENCH" worker "$@" --steps 4 --warmup 3 \
    > "$LOGS/profile.$name.log" 2>&1
  echo "profile $name: rc=$?"
  python3 "$TOP" "$LOGS/trace.$name.json" 25 | tee "$LOGS/profile.$name.md"
  gzip -f "$LOGS/trace.$name.json"
}

if [ "${PROFILE:-0}" != 0 ] && [ $LLAMA = 1 ]; then
  profile llama8p.bf16 "${L0[@]}" --dtype bf16
  BENCH_FUSED_ADAMW=0 profile llama8p.bf16.per-param-adamw "${L0[@]}" --dtype bf16
  profile llama8p.fp8 "${L0[@]}" --dtype fp8
fi
if [ "${PROFILE:-0}" != 0 ] && [ $XL = 1 ]; then
  profile gpt2-1.5b.bf16 "${X0[@]}"
fi

if [ "${PROFILE:-0}" != 0 ] && [ $GPT2 = 1 ]; then
  # With and without the GPT-2 block's fused kernels (BENCH_FUSED_{CE,LN,GELU,BIAS}).
  for v in 1 0; do
    BENCH_FUSED_CE=$v BENCH_FUSED_LN=$v BENCH_FUSED_GELU=$v BENCH_FUSED_BIAS=$v \
      profile gpt2-125m.fused-$v --model gpt2-125m --dtype bf16 --seq-len 1024 --micro-batch 16
  done
fi

[ "${PROFILE:-0}" = only ] && exit 0

if [ $GPT2 = 1 ]; then
mine gpt2-125m.bf16 "${G[@]}"
# The run-time kernel compile's log (time, registers) lands in this run's .err file.
BENCH_JIT_LOG=1 mine gpt2-125m.bf16.compile "${G[@]}" --features compile
grep -h "^\[jit\].*\(compiled\|registers\)" "$LOGS/gpt2-125m.bf16.compile.err"
# The AdamW update overlapped with the backward (src/workload/overlap.rs).
BENCH_OVERLAP_ADAMW=1 mine gpt2-125m.bf16.compile.overlap-adamw "${G[@]}" --features compile
# The same without each fused kernel: what each gains, measured in this run.
BENCH_FUSED_GELU=0 ablate gpt2-125m.bf16.compile.unfused-gelu "${G[@]}" --features compile
BENCH_FUSED_GELU=0 BENCH_FUSED_LN=0 ablate gpt2-125m.bf16.compile.unfused-gelu-ln "${G[@]}" --features compile
BENCH_FUSED_CE=0 BENCH_FUSED_LN=0 BENCH_FUSED_GELU=0 ablate gpt2-125m.bf16.compile.unfused "${G[@]}" --features compile
BENCH_FUSED_BIAS=0 ablate gpt2-125m.bf16.compile.unfused-bias "${G[@]}" --features compile
BENCH_FUSED_ADAMW=0 ablate gpt2-125m.bf16.compile.per-param-adamw "${G[@]}" --features compile
mine gpt2-125m.fp8.compile "${G[@]/bf16/fp8}" --features compile
BENCH_FUSED_FP8T=0 ablate gpt2-125m.fp8.compile.unfused-transpose "${G[@]/bf16/fp8}" --features compile
fi
if [ $XL = 1 ]; then
mine gpt2-1.5b.bf16 "${X[@]}"
BENCH_JIT_LOG=1 mine gpt2-1.5b.bf16.compile "${X[@]}" --features compile
grep -h "^\[jit\].*\(compiled\|registers\)" "$LOGS/gpt2-1.5b.bf16.compile.err"
BENCH_FUSED_BIAS=0 ablate gpt2-1.5b.bf16.compile.unfused-bias "${X[@]}" --features compile
BENCH_FUSED_ADAMW=0 ablate gpt2-1.5b.bf16.compile.per-param-adamw "${X[@]}" --features compile
# The nightly keeps gpt2-1.5b in fp8: delayed scaling (the default) and dynamic.
mine gpt2-1.5b.fp8.compile "${X[@]/bf16/fp8}" --features compile
BENCH_FP8_SCALING=dynamic mine gpt2-1.5b.fp8.compile.dynamic-scaling "${X[@]/bf16/fp8}" --features compile
fi
if [ $LLAMA = 1 ]; then
mine llama8p.bf16 "${L[@]}" --dtype bf16
mine llama8p.bf16.compile "${L[@]}" --dtype bf16 --features compile
BENCH_OVERLAP_ADAMW=1 mine llama8p.bf16.compile.overlap-adamw "${L[@]}" --dtype bf16 --features compile
# The Llama block's fused kernels off one by one: what each gains, measured in this run.
BENCH_FUSED_SWIGLU=0 ablate llama8p.bf16.compile.unfused-swiglu "${L[@]}" --dtype bf16 --features compile
BENCH_FUSED_SWIGLU=0 BENCH_FUSED_RMS=0 ablate llama8p.bf16.compile.unfused-swiglu-rms "${L[@]}" --dtype bf16 --features compile
ablate llama8p.bf16.sac "${L[@]}" --dtype bf16 --features sac --sac-every 1
mine llama8p.fp8 "${L[@]}" --dtype fp8
mine llama8p.fp8.compile "${L[@]}" --dtype fp8 --features compile
# fp8 scaled by each tensor's own amax (a reduction pass before each quantization) against
# the default delayed scaling (the amax history, recorded by the quantization pass itself).
BENCH_FP8_SCALING=dynamic mine llama8p.fp8.compile.dynamic-scaling "${L[@]}" --dtype fp8 --features compile
BENCH_OVERLAP_ADAMW=1 mine llama8p.fp8.compile.overlap-adamw "${L[@]}" --dtype fp8 --features compile
BENCH_FUSED_FP8T=0 ablate llama8p.fp8.compile.unfused-transpose "${L[@]}" --dtype fp8 --features compile
# The output head's matmul in fp8 too (off by default, as torchao's and torchtitan's recipes).
BENCH_FP8_HEAD=1 ablate llama8p.fp8.compile.fp8-head "${L[@]}" --dtype fp8 --features compile
BENCH_FUSED_FP8=0 ablate llama8p.fp8.compile.unfused-quant "${L[@]}" --dtype fp8 --features compile
BENCH_FUSED_ADAMW=0 ablate llama8p.bf16.compile.per-param-adamw "${L[@]}" --dtype bf16 --features compile
fi

if [ "${QUICK:-0}" != 1 ]; then
  if [ $GPT2 = 1 ]; then
    # LEAN=1 leaves out the eager peers: context only, the targets are against compile.
    if [ "${LEAN:-0}" != 1 ]; then
      peer gpt2-125m.peer.eager "$DIR/gpt2_pytorch.py" 16 40 eager
      peer gpt2-125m.peer.eager_fused "$DIR/gpt2_pytorch.py" 16 40 eager_fused
    fi
    peer gpt2-125m.peer.compile_fused "$DIR/gpt2_pytorch.py" 16 40 compile_fused
    peer gpt2-125m.peer.compile_fused_amp "$DIR/gpt2_pytorch.py" 16 40 compile_fused_amp
  fi
  if [ $XL = 1 ]; then
    peer gpt2-1.5b.peer.eager_fused "$DIR/gpt2_pytorch.py" 8 30 eager_fused 48 1600 25
    peer gpt2-1.5b.peer.compile_fused "$DIR/gpt2_pytorch.py" 8 30 compile_fused 48 1600 25
    peer gpt2-1.5b.peer.compile_fused_amp "$DIR/gpt2_pytorch.py" 8 30 compile_fused_amp 48 1600 25
  fi
  if [ $LLAMA = 1 ]; then
    [ "${LEAN:-0}" = 1 ] || peer llama8p.peer.eager_fused "$DIR/llama_pytorch.py" 1 20 eager_fused
    peer llama8p.peer.compile_fused "$DIR/llama_pytorch.py" 1 20 compile_fused
    peer llama8p.peer.compile_fused_amp "$DIR/llama_pytorch.py" 1 20 compile_fused_amp
  fi
fi

python3 - "$RES" > "$OUTD/table.md" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
byname = {r[0]: r for r in rows}
def tok(n):
    r = byname.get(n)
    return float(r[3]) if r and r[3] else None
# Two peer columns beside eager: torch.compile under the same precision policy as bench
# (fp32 parameters and AdamW state under bf16 autocast, `_amp`) and under pure bf16.
refs = {"gpt2-125m": ["gpt2-125m.peer.eager", "gpt2-125m.peer.compile_fused_amp", "gpt2-125m.peer.compile_fused"],
        "gpt2-1.5b": ["gpt2-1.5b.peer.eager_fused", "gpt2-1.5b.peer.compile_fused_amp", "gpt2-1.5b.peer.compile_fused"],
        "llama8p": ["llama8p.peer.eager_fused", "llama8p.peer.compile_fused_amp", "llama8p.peer.compile_fused"]}
print("| run | side | rc | tok/s | MFU | first step s | peak GiB | vs peer eager (fused for 1.5b, Llama) | vs peer compile, same policy (amp) | vs peer compile, pure bf16 | note |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    r = r + [""] * (8 - len(r))
    fam = next(f for f in refs if r[0].startswith(f + "."))
    t = tok(r[0])
    ratios = []
    for ref in refs[fam]:
        p = tok(ref)
        ratios.append("%.2fx" % (t / p) if t and p else "")
    print("| " + " | ".join([r[0], r[1], r[2], r[3], r[4], r[5], r[6]] + ratios + [r[7]]) + " |")
# fp8 against bf16 of the same model and features, bench's own runs.
print()
print("| fp8 run | bf16 run | fp8/bf16 tok/s |")
print("|---|---|---|")
for r in rows:
    if ".fp8" in r[0]:
        # Switch suffixes first: ".fp8-head" must not become ".bf16-head".
        b = r[0]
        for suffix in (".unfused-transpose", ".unfused-quant", ".fp8-head", ".overlap-adamw",
                       ".dynamic-scaling"):
            b = b.replace(suffix, "")
        b = b.replace(".fp8", ".bf16")
        t, u = tok(r[0]), tok(b)
        print("| %s | %s | %s |" % (r[0], b, "%.2fx" % (t / u) if t and u else ""))
PY
tar czf "$OUTD/logs.tgz" -C "$OUTD" logs
cat "$OUTD/table.md"
