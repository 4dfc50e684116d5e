"""The Hugging Face Trainer on a Llama config, started by `bench adapt` for an `hf` cell.

bench writes one JSON file: the `LlamaConfig` of the cell's bench preset (`model`), the
`TrainingArguments` (`training_args`) and the sequence length. The model starts from
random weights and trains on synthetic uniform tokens (as bench's built-in workload does),
so nothing is downloaded. The Trainer prints its own logs (`{'loss': ..}` per step, the
end-of-run `{'train_runtime': ..}`); a TrainerCallback adds one line per optimizer step,
`[bench-hf] step: N time: T tokens: K memory: B`, with T the seconds between the ends of
consecutive steps after a device synchronisation (the first step from the start of
training) and B the peak reserved device memory of the step in bytes (-1 on CPU).

With $BENCH_PROFILE set (bench's triage), a second TrainerCallback traces the last warm-up
step with torch.profiler and writes its Chrome trace there (scripts/frameworks/step_trace.py).
"""

import argparse
import importlib.metadata
import json
import os
import time

import torch
from torch.utils.data import Dataset
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from driver_info import ran_safely, sdpa_kernel, version
from step_trace import TorchStep, requested


class SyntheticTokens(Dataset):
    """Uniform random tokens; labels are the inputs (the model shifts them)."""

    def __init__(self, n: int, seq_len: int, vocab: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab, (n, seq_len), generator=g)

    def __len__(self) -> int:
        return self.data.shape[0]

    def __getitem__(self, i):
        x = self.data[i]
        return {"input_ids": x, "labels": x}


class StepTimes(TrainerCallback):
    def __init__(self, tokens_per_step: int):
        self.tokens = tokens_per_step
        self.last = None
        self.cuda = torch.cuda.is_available()

    def _sync_now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def on_train_begin(self, args, state, control, **kw):
        self.last = self._sync_now()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def on_step_end(self, args, state, control, **kw):
        now = self._sync_now()
        dt = now - self.last
        self.last = now
        mem = -1
        if self.cuda:
            mem = torch.cuda.max_memory_reserved()
            torch.cuda.reset_peak_memory_stats()
        if state.is_world_process_zero:
            print(
                f"[bench-hf] step: {state.global_step} time: {dt:.6f} "
                f"tokens: {self.tokens} memory: {mem}",
                flush=True,
            )


class TraceStep(TrainerCallback):
    """torch.profiler around the last warm-up step (bench measures none of the warm-up
    steps, so the profiler's cost and the trace's export land in no measured step's time;
    the last one is the warm-up step nearest to the measured steps' state: compiled,
    allocator and kernels warm). It must come before StepTimes among the callbacks: the
    Trainer calls them in order, so the trace is written before StepTimes reads the clock
    that ends the step, and the export is counted in the traced step's time, not the next
    (measured) one's."""

    def __init__(self, rank: int):
        self.trace = TorchStep(rank)

    def on_step_begin(self, args, state, control, **kw):
        # The Trainer counts finished optimizer steps: step N begins at global_step N - 1.
        if self.trace.due(state.global_step + 1):
            self.trace.start()

    def on_step_end(self, args, state, control, **kw):
        self.trace.finish()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    a = ap.parse_args()
    with open(a.config) as f:
        cfg = json.load(f)
    targs = dict(cfg["training_args"])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    if not cuda:
        targs["use_cpu"] = True
    else:
        targs.setdefault("optim", "adamw_torch_fused")
    args = TrainingArguments(**targs)
    seq_len = int(cfg["seq_len"])
    model_cfg = LlamaConfig(**cfg["model"])
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(model_cfg)
    global_batch = (
        args.per_device_train_batch_size * args.gradient_accumulation_steps * world
    )
    data = SyntheticTokens(
        global_batch * args.max_steps, seq_len, model_cfg.vocab_size, args.seed
    )
    if args.process_index == 0:
        device = torch.cuda.get_device_name(0) if cuda else "cpu"
        libs = {"torch": torch.__version__}
        for lib in ("accelerate", "tokenizers"):
            if v := version(lib):
                libs[lib] = v
        info = {
            "name": "transformers",
            "version": importlib.metadata.version("transformers"),
            "libraries": libs,
            "device": device,
            "world_size": world,
        }
        print("bench-framework: " + json.dumps(info), flush=True)
    callbacks = [StepTimes(global_batch * seq_len)]
    if requested():
        # Without $BENCH_PROFILE the Trainer gets exactly the callbacks it always had.
        callbacks.insert(0, TraceStep(args.process_index))
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=data,
        callbacks=callbacks,
    )
    if args.process_index == 0:
        ran_safely(lambda: record(args, model, model_cfg, seq_len, world, cuda))
    trainer.train()


def record(args, model, model_cfg, seq_len, world, cuda):
    """What the Trainer was set to run, read from its own resolved arguments and model."""
    fsdp = bool(args.fsdp) and world > 1
    fsdp_ac = fsdp and bool((args.fsdp_config or {}).get("activation_checkpointing"))
    if args.gradient_checkpointing:
        ckpt = "full: every decoder layer recomputed (the Trainer's gradient_checkpointing)"
    elif fsdp_ac:
        ckpt = "full: every decoder layer recomputed (FSDP's activation_checkpointing)"
    else:
        ckpt = "none"
    impl = getattr(model.config, "_attn_implementation", None) or "default"
    heads = model_cfg.num_attention_heads
    attention = f"transformers `{impl}` attention"
    if impl == "sdpa" and cuda:
        dtype = torch.bfloat16 if args.bf16 else torch.float32
        attention += "; " + sdpa_kernel(
            args.per_device_train_batch_size, heads, heads,
            model_cfg.hidden_size // heads, seq_len, dtype, "cuda",
        )
    if args.torch_compile:
        execution = (
            f"torch.compile of the whole model (backend {args.torch_compile_backend or 'inductor'}, "
            f"mode {args.torch_compile_mode or 'default'})"
        )
    else:
        execution = "eager"
    if fsdp:
        parallel = f"FSDP over {world} ranks ({' '.join(str(o) for o in args.fsdp) if isinstance(args.fsdp, list) else args.fsdp})"
    elif world > 1:
        parallel = f"DDP over {world} ranks"
    else:
        parallel = "one device: the Trainer wraps the model in nothing"
    precision = (
        "bf16 autocast over fp32 weights; fp32 optimizer state"
        if args.bf16
        else "fp32 throughout"
    )
    return {
        "execution": execution,
        "attention": attention,
        "checkpointing": ckpt,
        # TrainingArguments resolves `optim` to an enum; its value is the name users write.
        "optimizer": f"{getattr(args.optim, 'value', args.optim)} (the Trainer's optim)",
        "precision": precision,
        "parallel": parallel,
    }


if __name__ == "__main__":
    main()
