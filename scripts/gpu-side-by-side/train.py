"""A team's own training script, as a nightly repository of issue 40 holds it: a GPT-2-shaped
decoder in eager PyTorch with bf16 autocast and AdamW (fused or foreach), printing bench's
worker events (one JSON line per step, then a summary). Not bench's built-in workload: bench
runs it as a `command` cell, one fresh process per repeat.

Usage: python train.py MODEL OPT   (MODEL: s or m; OPT: fused or foreach)
"""

import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = {
    "s": dict(n_layer=6, n_embd=512, n_head=8),
    "m": dict(n_layer=12, n_embd=768, n_head=12),
}
VOCAB, SEQ, BATCH = 8192, 1024, 32
STEPS, WARMUP = int(os.environ.get("STEPS", "20")), 5


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
    def __init__(self, n_layer, n_embd, n_head):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, n_embd), nn.Embedding(SEQ, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln, self.head = nn.LayerNorm(n_embd), nn.Linear(n_embd, VOCAB, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def emit(**kv):
    print(json.dumps(kv), flush=True)


def main():
    model_name, opt_name = sys.argv[1], sys.argv[2]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = GPT(**MODELS[model_name]).to(dev)
    opt = torch.optim.AdamW(
        model.parameters(), lr=3e-4, fused=opt_name == "fused", foreach=opt_name != "fused"
    )
    gen = torch.Generator(device=dev).manual_seed(1)
    emit(event="start", model=f"gpt-{model_name}", world_size=1)
    for step in range(STEPS):
        x = torch.randint(0, VOCAB, (BATCH, SEQ), device=dev, generator=gen)
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(dev, dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, VOCAB), x.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        emit(
            event="step",
            step=step,
            step_time_s=dt,
            tokens=BATCH * SEQ,
            loss=float(loss),
            warmup=step < WARMUP,
        )
    peak = torch.cuda.max_memory_allocated() if dev == "cuda" else 0
    emit(event="summary", peak_mem_bytes=[peak])


if __name__ == "__main__":
    main()
