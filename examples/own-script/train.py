"""Your own training script as a bench cell: a GPT-2-shaped decoder in plain PyTorch that
prints bench's worker events and, when bench asks, traces one step.

bench runs it as a `command` workload (see nightly.yaml beside it), one fresh process per
repeat, and reads its standard output: one JSON object per line,

    {"event": "start", "model": ..., "world_size": 1}
    {"event": "step", "step": 0, "step_time_s": 0.41, "tokens": 32768, "loss": 9.1, "warmup": true}
    ...
    {"event": "summary", "peak_mem_bytes": [...]}

Any other line is the script's own log. When `BENCH_PROFILE` names a file (bench's triage,
or `--trace-kernels`), the last warm-up step runs under torch.profiler and its Chrome
trace is written there: bench diffs such traces by kernel between the last good and the
first bad commit of a regression. Tracing never fails the run.

Usage: python3 train.py MODEL OPT   (MODEL: tiny for a CPU, s or m for a GPU; OPT: fused or
foreach AdamW)
"""

import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# name: (layers, width, heads, vocabulary, sequence, batch)
MODELS = {
    "tiny": (2, 64, 4, 512, 64, 4),
    "s": (6, 512, 8, 8192, 1024, 32),
    "m": (12, 768, 12, 8192, 1024, 32),
}


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.h = h

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers, width, heads, vocab, seq):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def emit(**fields):
    print(json.dumps(fields), flush=True)


def main():
    model_name, opt_name = sys.argv[1], sys.argv[2]
    steps = int(os.environ.get("STEPS", "20"))
    warmup = int(os.environ.get("WARMUP", "5"))
    layers, width, heads, vocab, seq, batch = MODELS[model_name]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = GPT(layers, width, heads, vocab, seq).to(dev)
    fused = opt_name == "fused" and dev == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=fused, foreach=not fused)
    gen = torch.Generator(device=dev).manual_seed(1)
    trace_to = os.environ.get("BENCH_PROFILE")
    emit(event="start", model=f"gpt-{model_name}", world_size=1)
    for step in range(steps):
        x = torch.randint(0, vocab, (batch, seq), device=dev, generator=gen)
        profiler = None
        # The last warm-up step is traced, so the measured steps stay untouched.
        if trace_to and step == max(warmup - 1, 0):
            try:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if dev == "cuda":
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                profiler = torch.profiler.profile(activities=activities)
                profiler.__enter__()
            except Exception as e:  # a diagnosis must never fail the cell
                print(f"train.py: warning: cannot trace ({e}); the cell carries on", flush=True)
                profiler = None
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, vocab), x.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if profiler is not None:
            try:
                profiler.__exit__(None, None, None)
                profiler.export_chrome_trace(trace_to)
            except Exception as e:
                print(f"train.py: warning: cannot write the trace ({e})", flush=True)
        emit(event="step", step=step, step_time_s=dt, tokens=batch * seq,
             loss=float(loss), warmup=step < warmup)
    peak = torch.cuda.max_memory_allocated() if dev == "cuda" else 0
    emit(event="summary", peak_mem_bytes=[peak])


if __name__ == "__main__":
    main()
