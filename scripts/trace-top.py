#!/usr/bin/env python3
"""Sums the device kernels of a libtorch profiler trace (`BENCH_PROFILE=FILE bench worker ...`,
Chrome-trace JSON) by kernel name and by kind, and prints the largest first, as Markdown.

Usage: scripts/trace-top.py TRACE.json [TOP]   (TOP rows of the per-kernel table, default 30)
"""
import collections
import json
import re
import sys

# Kernel kinds by name, first match wins: what each lever of docs/perf-notes.md would touch.
KINDS = [
    ("cross-entropy (fused)", r"^ce_(fwd|bwd)"),
    ("layer norm (fused)", r"^ln_(fwd|bwd)"),
    ("bias+GELU (fused)", r"^bias_gelu_(fwd|bwd)"),
    ("RMSNorm (fused)", r"^rms_(fwd|bwd)"),
    ("SwiGLU (fused)", r"^swiglu_(fwd|bwd)"),
    ("optimizer (master AdamW)", r"^master_adamw"),
    ("matmul", r"gemm|nvjet|cutlass|sm90_xmma|cublas|Kernel2"),
    ("attention", r"flash|fmha|attention"),
    ("layer/rms norm", r"layer_norm|LayerNorm|rms_norm|RmsNorm"),
    ("cross-entropy (libtorch)", r"softmax|nll_loss|log_softmax"),
    ("optimizer", r"adam|Adam|multi_tensor"),
    ("embedding", r"embedding|indexSelect|index_select|scatter|sort|radix"),
    ("reduction", r"reduce_kernel|Reduce"),
    ("elementwise", r"elementwise|vectorized|unrolled|CatArray|copy"),
]


def kind_of(name):
    for kind, pat in KINDS:
        if re.search(pat, name):
            return kind
    return "other"


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    by_name = collections.defaultdict(lambda: [0.0, 0])
    by_kind = collections.defaultdict(lambda: [0.0, 0])
    total = 0.0
    for e in events:
        if e.get("cat") != "kernel" or "dur" not in e:
            continue
        name, dur = e["name"], float(e["dur"])  # microseconds
        by_name[name][0] += dur
        by_name[name][1] += 1
        k = kind_of(name)
        by_kind[k][0] += dur
        by_kind[k][1] += 1
        total += dur
    print(f"device kernel time in the trace: {total / 1e3:.2f} ms over "
          f"{sum(c for _, c in by_name.values())} kernels\n")
    print("| kind | ms | share | kernels |\n|---|---|---|---|")
    for k, (d, c) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        print(f"| {k} | {d / 1e3:.2f} | {100 * d / max(total, 1e-9):.1f}% | {c} |")
    print(f"\n| kernel (first 90 characters) | ms | share | calls |\n|---|---|---|---|")
    for name, (d, c) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"| {name[:90]} | {d / 1e3:.2f} | {100 * d / max(total, 1e-9):.1f}% | {c} |")


if __name__ == "__main__":
    main()
