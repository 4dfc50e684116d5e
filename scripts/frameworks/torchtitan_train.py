"""torchtitan's own trainer, started by `bench adapt` for a torchtitan cell.

bench writes the TOML config (every setting of the cell) and passes the model's shape in
$BENCH_TT_MODEL (torchtitan's `TransformerModelArgs` keyword arguments, the cell's bench
preset). This script registers that shape as the llama3 flavor `bench`, prints one
`bench-framework: {json}` line naming the versions (rank 0), then runs
`torchtitan.train.main` with the command line it was given (`--job.config_file ...` and
any overrides) and a Trainer that, once torchtitan has built everything, prints a
`bench-ran: {json}` line (rank 0): the optimizer implementation and precision torchtitan
resolved, and the attention kernel torch picks at the run's shape. What torchtitan logs
itself (compile, checkpointing, FSDP, float8) bench reads from its own lines. Tested with
torchtitan 0.2.2.
"""

import importlib.metadata
import json
import os
import sys

from driver_info import ran_safely, sdpa_kernel, version


def main() -> None:
    import torch
    from torchtitan.models.llama3 import TransformerModelArgs, llama3_args
    from torchtitan.train import Trainer
    from torchtitan.train import main as titan_main

    shape = json.loads(os.environ["BENCH_TT_MODEL"])
    llama3_args["bench"] = TransformerModelArgs(**shape)
    rank0 = int(os.environ.get("RANK", "0")) == 0

    class BenchTrainer(Trainer):
        def __init__(self, job_config):
            super().__init__(job_config)
            if rank0:
                ran_safely(lambda: record(job_config))

    def record(job_config):
        opt, train = job_config.optimizer, job_config.training
        cuda = torch.cuda.is_available()
        # torchtitan's llama3 repeats the KV heads before SDPA, so SDPA sees full heads.
        heads = shape["n_heads"]
        mp = train.mixed_precision_param
        dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}.get(mp, torch.bfloat16)
        return {
            "optimizer": f"{opt.name} ({opt.implementation} implementation, torch.optim)",
            "precision": f"parameters for compute in {mp}, reductions in {train.mixed_precision_reduce}; fp32 weights and optimizer state",
            "attention": sdpa_kernel(
                train.local_batch_size, heads, heads, shape["dim"] // heads, train.seq_len,
                dtype, "cuda" if cuda else "cpu",
            ) if cuda else None,
        }

    if rank0:
        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        libs = {"torch": torch.__version__}
        if v := version("torchao"):
            libs["torchao"] = v
        info = {
            "name": "torchtitan",
            "version": importlib.metadata.version("torchtitan"),
            "libraries": libs,
            "device": device,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        }
        print("bench-framework: " + json.dumps(info), flush=True)
    titan_main(BenchTrainer)


if __name__ == "__main__":
    sys.exit(main())
