"""torchtitan's own trainer, started by `bench adapt` for a torchtitan cell.

bench writes the TOML config (every setting of the cell) and passes the model's shape in
$BENCH_TT_MODEL (torchtitan's `TransformerModelArgs` keyword arguments, the cell's bench
preset). This script registers that shape as the llama3 flavor `bench`, prints one
`bench-framework: {json}` line naming the versions (rank 0), then runs
`torchtitan.train.main` unchanged, with the command line it was given
(`--job.config_file ...` and any overrides). Tested with torchtitan 0.2.2.
"""

import importlib.metadata
import json
import os
import sys

from driver_info import version


def main() -> None:
    import torch
    from torchtitan.models.llama3 import TransformerModelArgs, llama3_args
    from torchtitan.train import Trainer
    from torchtitan.train import main as titan_main

    shape = json.loads(os.environ["BENCH_TT_MODEL"])
    llama3_args["bench"] = TransformerModelArgs(**shape)
    if int(os.environ.get("RANK", "0")) == 0:
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
    titan_main(Trainer)


if __name__ == "__main__":
    sys.exit(main())
