"""DeepSpeed's engine on a Llama config, started by `bench adapt` (under torchrun) for a
`deepspeed` cell.

bench writes one JSON file: the `LlamaConfig` of the cell's bench preset (`model`), the
DeepSpeed config (`deepspeed`: batch sizes, bf16, ZeRO stage, AdamW, steps_per_print 1),
the sequence length, steps, seed and the `compile` / `gradient_checkpointing` switches. The
model starts from random weights and trains on synthetic uniform tokens, so nothing is
downloaded. The loop is DeepSpeed's own engine API: `engine(...)`, `engine.backward(loss)`,
`engine.step()` (once per micro-batch; the engine steps the optimizer at the accumulation
boundary); DeepSpeed's ThroughputTimer prints its samples/s lines, and this driver prints
`[bench-ds] step: N time: T loss: L tokens: K memory: B` after each optimizer step (T:
seconds between step ends after a device synchronisation; B: peak reserved device memory
in bytes, -1 on CPU).

Nothing of DeepSpeed's is compiled, ahead of time or at run time (torch.compile, with the
`compile` switch, is torch's): DeepSpeed installs as a pure-Python wheel (`DS_BUILD_OPS=0`),
and the run needs none of its C++/CUDA ops:
- the optimizer is `torch.optim.AdamW` (`torch_adam` in the config; DeepSpeed's own
  `FusedAdam` would be JIT-compiled with nvcc on a GPU, or with g++ on CPU);
- on CPU, DeepSpeed's accelerator is `cpu` (`DS_ACCELERATOR=cpu`) with gloo as its
  communication backend (what it falls back to without oneCCL's
  `oneccl_bindings_for_pytorch`), and its shared-memory all-reduce op (`deepspeed_shm_comm`,
  JIT-compiled with ninja and g++ when the first process group starts) is marked
  unavailable, so collectives go through gloo.

With $BENCH_PROFILE set (bench's triage), the last warm-up step runs under torch.profiler
and each rank writes its Chrome trace (scripts/frameworks/step_trace.py). DeepSpeed's own
flops profiler prints a table of module FLOPs, not a trace of kernels, so it is not used.
"""

import argparse
import json
import os
import sys
import time

import torch

from driver_info import ran_safely, sdpa_kernel, version
from step_trace import TorchStep


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    with open(args.config) as f:
        config = json.load(f)

    cuda = torch.cuda.is_available()
    # DeepSpeed picks its accelerator once, on first use (at import: engine.compile's default
    # backend is read then), so it is named before the import. Without a GPU its auto-detection
    # falls back to `cpu` too, with a warning; an explicit setting of the caller's is kept.
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")

    import deepspeed
    import deepspeed.comm
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from transformers import LlamaConfig, LlamaForCausalLM

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    else:
        # The cpu accelerator's TorchBackend JIT-compiles `deepspeed_shm_comm` (ninja, g++,
        # minutes on a small machine) unless the op is marked incompatible; the compatibility
        # table is computed once and edits to it persist (deepspeed/ops/__init__.py).
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    backend = get_accelerator().communication_backend_name()
    deepspeed.init_distributed(dist_backend=backend)
    if rank == 0:
        info = {
            "name": "deepspeed",
            "version": deepspeed.__version__,
            "libraries": {
                k: v
                for k, v in {
                    "torch": torch.__version__,
                    "transformers": version("transformers"),
                }.items()
                if v
            },
            "device": torch.cuda.get_device_name(local_rank) if cuda else "cpu",
            "world_size": world,
        }
        print("bench-framework: " + json.dumps(info), flush=True)

    ds = config["deepspeed"]
    # For configs written before the adapter set these two (bench adapt writes both): torch's
    # AdamW, not FusedAdam, which would need nvcc (GPU) or g++ (CPU) at run time; and
    # DeepSpeed's log at INFO, the level of its ThroughputTimer lines (its logger's default
    # is WARNING).
    opt = ds.get("optimizer", {}).get("params")
    if opt is not None:
        opt.setdefault("torch_adam", True)
    ds.setdefault("log_level", "info")

    torch.manual_seed(config["seed"])
    model_cfg = LlamaConfig(**config["model"])
    # On a GPU the weights are created and initialised on the rank's device rather than on
    # the host and then copied; every rank draws the same weights (same seed), and DeepSpeed
    # broadcasts rank 0's (ZeRO 0-2) or partitions them (ZeRO-3).
    with torch.device(f"cuda:{local_rank}" if cuda else "cpu"):
        model = LlamaForCausalLM(model_cfg)
    if config["gradient_checkpointing"]:
        # Non-reentrant checkpointing (torch's recommended mode; the reentrant one is a graph
        # break for torch.compile).
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    model.config.use_cache = False
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=ds
    )
    if config["compile"]:
        engine.compile()
    if rank == 0:
        ran_safely(lambda: record(engine, model, model_cfg, config, cuda))

    micro, accum = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
    seq, vocab = config["seq_len"], model_cfg.vocab_size
    tokens_per_step = ds["train_batch_size"] * seq
    # Each rank draws its own tokens (seeded by rank), as a sharded data loader would.
    gen = torch.Generator().manual_seed(config["seed"] * 1000 + rank)
    device = engine.device

    def sync_now() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    # The last warm-up step is traced: bench measures none of the warm-up steps, and the last
    # is the one nearest to the measured steps' state (compiled, allocator warm).
    trace = TorchStep(rank)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    last = sync_now()
    for step in range(1, config["steps"] + 1):
        if trace.due(step):
            trace.start()
        losses = []
        for _ in range(accum):
            x = torch.randint(0, vocab, (micro, seq), generator=gen).to(device)
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()
            losses.append(loss.detach().float())
        mean = torch.stack(losses).mean()
        if world > 1:
            torch.distributed.all_reduce(mean)
            mean /= world
        # Written before the step's clock stops, so the export counts in the traced (warm-up)
        # step's time and never in the next, measured one's.
        trace.finish()
        now = sync_now()
        if rank == 0:
            mem = torch.cuda.max_memory_reserved() if cuda else -1
            print(
                f"[bench-ds] step: {step} time: {now - last:.6f} loss: {mean.item():.6f} "
                f"tokens: {tokens_per_step} memory: {mem}",
                flush=True,
            )
        last = sync_now()

    # Leave without the interpreter's teardown. A finished collective's work object can be
    # freed on a communication thread after the main thread has begun finalising Python;
    # freeing its tensors needs the GIL, the thread is made to exit, and the process aborts
    # ("terminate called without an active exception", seen in about 1 run in 4 with 2 ranks
    # over gloo, with or without destroy_process_group), so torchrun would fail a run whose
    # every step ran. The barrier keeps a rank from leaving while a peer still talks to it.
    if world > 1:
        deepspeed.comm.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def record(engine, model, model_cfg, config, cuda):
    """What DeepSpeed was set to run, read from the engine DeepSpeed built. Whether its
    compile held (dynamo's recompile limit) only the log says; bench reads that line."""
    stage = engine.zero_optimization_stage()
    world = engine.world_size
    heads = model_cfg.num_attention_heads
    impl = getattr(model.config, "_attn_implementation", None) or "default"
    attention = f"transformers `{impl}` attention"
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float32
    if impl == "sdpa" and cuda:
        attention += "; " + sdpa_kernel(
            config["deepspeed"]["train_micro_batch_size_per_gpu"], heads, heads,
            model_cfg.hidden_size // heads, config["seq_len"], dtype, "cuda",
        )
    basic = getattr(engine, "basic_optimizer", None)
    fused = getattr(basic, "defaults", {}).get("fused") if basic is not None else None
    # The wrapper (ZeRO's optimizer) is named by DeepSpeed's own "Final Optimizer" line.
    optimizer = f"torch.optim.{type(basic).__name__}" if basic is not None else "no basic optimizer"
    if fused is not None:
        optimizer += f" (fused={fused})"
    if engine.bfloat16_enabled():
        precision = "bf16 weights and activations (DeepSpeed's bf16 mode); fp32 master weights and optimizer state"
    else:
        precision = "fp32 throughout"
    ckpt = "full: every decoder layer recomputed (transformers' gradient checkpointing)" if getattr(model, "is_gradient_checkpointing", False) else "none"
    parallel = f"ZeRO stage {stage} over {world} rank{'s' if world != 1 else ''}"
    if world == 1 and stage > 0:
        parallel += " (nothing to partition across: one rank holds every shard)"
    # A compiled engine's own "Compiling mode=..." line says how; only eager is said here.
    execution = None if getattr(engine, "is_compiled", False) else "eager"
    return {
        "execution": execution,
        "attention": attention,
        "checkpointing": ckpt,
        "optimizer": optimizer,
        "precision": precision,
        "parallel": parallel,
    }


if __name__ == "__main__":
    main()
