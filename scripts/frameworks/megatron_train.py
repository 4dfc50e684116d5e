"""Megatron-LM's own pretrain_gpt.py, started by `bench adapt` for a `megatron` cell.

bench writes one JSON file: the cell id, the Megatron-LM checkout (`source`, else
$BENCH_MEGATRON_SOURCE) and the command-line flags of pretrain_gpt.py (`argv`): the
cell's Llama preset as a Megatron-Core GPTModel with the local layer spec
(`--transformer-impl local`), mock data (`--mock-data`, NullTokenizer), and one log line
per iteration (`--log-interval 1 --log-throughput`). This driver prints its version line
and then runs pretrain_gpt.py as `__main__` in this process, so every step line bench
reads is printed by Megatron's own training_log.
"""

import argparse
import json
import os
import runpy
import sys

from driver_info import source_commit, version


def use_prebuilt_dataset_helpers() -> None:
    """initialize_megatron runs `make` in megatron/core/datasets on rank 0 to build the C++
    dataset helpers. The megatron-core wheel ships them built (helpers_cpp.*.so) but not the
    Makefile, so that `make` fails ("No targets specified and no makefile found", seen on an
    H100 with megatron-core 0.19.0) and Megatron exits. Where the Makefile is missing and the
    built helpers import, the build step is what make would find: nothing to do. A checkout
    (with its Makefile) builds as Megatron always does."""
    import megatron.core.datasets as datasets
    import megatron.core.datasets.utils as utils

    folder = os.path.dirname(datasets.__file__)
    if os.path.exists(os.path.join(folder, "Makefile")):
        return
    try:
        from megatron.core.datasets import helpers_cpp  # noqa: F401 (the check is the import)
    except ImportError:
        return  # Megatron's own make runs and reports what is missing
    utils.compile_helpers = lambda: None
    print("megatron_train.py: megatron-core's dataset helpers are prebuilt (wheel without their Makefile): not rebuilt", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    with open(args.config) as f:
        config = json.load(f)
    source = config.get("source") or os.environ.get("BENCH_MEGATRON_SOURCE")
    if not source or not os.path.isfile(os.path.join(source, "pretrain_gpt.py")):
        sys.exit(
            f"megatron_train.py: no Megatron-LM checkout with pretrain_gpt.py at {source!r}: "
            "set the workload's `source` or $BENCH_MEGATRON_SOURCE"
        )
    # pretrain_gpt.py imports its sibling modules (gpt_builders, model_provider) and the
    # checkout's `megatron` package, which wins over an installed megatron-core.
    sys.path.insert(0, source)
    import torch  # noqa: E402 (after the path is set, as Megatron's own scripts do)
    import megatron.core  # noqa: E402

    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        info = {
            "name": "megatron-core",
            "version": getattr(megatron.core, "__version__", "") or version("megatron-core"),
            "libraries": {
                k: v
                for k, v in {
                    "torch": torch.__version__,
                    "megatron-lm": source_commit(source),
                    "transformer-engine": version("transformer-engine"),
                }.items()
                if v
            },
            "device": device,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        }
        print("bench-framework: " + json.dumps(info), flush=True)
    use_prebuilt_dataset_helpers()
    sys.argv = [os.path.join(source, "pretrain_gpt.py")] + list(config["argv"])
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
