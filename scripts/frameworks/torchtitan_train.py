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

With $BENCH_PROFILE set (bench's triage), the Trainer traces the last warm-up step with
torch.profiler and each rank writes its Chrome trace (scripts/frameworks/step_trace.py).
torchtitan's own `[profiling]` (enable_profiling, profile_freq, save_traces_folder) is not
used: its schedule (torchtitan/tools/profiling.py, 0.2.2) has no repeat limit, so it traces
every `profile_freq`-th step, measured ones included, and it writes each trace in
`torch_profiler.step()` after the step's log line, so the export would be counted in the
next step's time (bench times torchtitan's steps between its log lines' stamps).
"""

import importlib.metadata
import json
import os
import sys

from driver_info import ran_safely, sdpa_kernel, version
from step_trace import TorchStep


def main() -> None:
    import torch
    from torchtitan.models.llama3 import TransformerModelArgs, llama3_args
    from torchtitan.train import Trainer
    from torchtitan.train import main as titan_main

    shape = json.loads(os.environ["BENCH_TT_MODEL"])
    llama3_args["bench"] = TransformerModelArgs(**shape)
    rank = int(os.environ.get("RANK", "0"))
    rank0 = rank == 0
    trace = TorchStep(rank)

    class BenchTrainer(Trainer):
        def __init__(self, job_config):
            super().__init__(job_config)
            if rank0:
                ran_safely(lambda: record(job_config))

        def train_step(self, data_iterator):
            # torchtitan counts steps from 1 and increments `self.step` before calling this.
            # The last warm-up step is traced: bench measures none of the warm-up steps, and
            # the last is nearest to the measured steps' state (compiled, allocator warm).
            if not trace.due(self.step):
                return super().train_step(data_iterator)
            # The trace is written just before the step's log line, whose stamp ends the
            # step's time for bench, so the export counts in this (warm-up) step and not in
            # the next, measured one. Every rank logs each step (metrics.log_freq = 1).
            metrics = self.metrics_processor
            log = metrics.log

            def log_after_trace(*args, **kwargs):
                trace.finish()
                return log(*args, **kwargs)

            metrics.log = log_after_trace
            trace.start()
            try:
                return super().train_step(data_iterator)
            finally:
                metrics.log = log
                trace.finish()

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
