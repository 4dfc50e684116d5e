"""DeepSpeed's engine on a Llama config, started by `bench adapt` (under torchrun) for a
`deepspeed` cell.

bench writes one JSON file: the `LlamaConfig` of the cell's bench preset (`model`), the
DeepSpeed config (`deepspeed`: batch sizes, bf16, ZeRO stage, AdamW, steps_per_print 1),
the sequence length, steps, seed and the `compile` / `gradient_checkpointing` switches. The
model starts from random weights and trains on synthetic uniform tokens, so nothing is
downloaded. The loop is DeepSpeed's own engine API: `engine(...)`, `engine.backward(loss)`,
`engine.step()`; DeepSpeed's ThroughputTimer prints its samples/s lines, and this driver
prints `[bench-ds] step: N time: T loss: L tokens: K memory: B` after each optimizer step
(T: seconds between step ends after a device synchronisation; B: peak reserved device
memory in bytes, -1 on CPU).
"""

import argparse
import importlib.metadata
import json
import os
import time

import torch


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    with open(args.config) as f:
        config = json.load(f)

    import deepspeed
    from transformers import LlamaConfig, LlamaForCausalLM

    cuda = torch.cuda.is_available()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
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

    torch.manual_seed(config["seed"])
    model_cfg = LlamaConfig(**config["model"])
    model = LlamaForCausalLM(model_cfg)
    if config["gradient_checkpointing"]:
        model.gradient_checkpointing_enable()
    model.config.use_cache = False
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config["deepspeed"]
    )
    if config["compile"]:
        engine.compile()

    ds = config["deepspeed"]
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

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    last = sync_now()
    for step in range(1, config["steps"] + 1):
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
        now = sync_now()
        if rank == 0:
            mem = torch.cuda.max_memory_reserved() if cuda else -1
            print(
                f"[bench-ds] step: {step} time: {now - last:.6f} loss: {mean.item():.6f} "
                f"tokens: {tokens_per_step} memory: {mem}",
                flush=True,
            )
        last = sync_now()


if __name__ == "__main__":
    main()
