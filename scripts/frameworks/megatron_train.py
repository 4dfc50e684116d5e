"""Megatron-LM's own pretrain_gpt.py, started by `bench adapt` for a `megatron` cell.

bench writes one JSON file: the cell id, the Megatron-LM checkout (`source`, else
$BENCH_MEGATRON_SOURCE) and the command-line flags of pretrain_gpt.py (`argv`): the
cell's Llama preset as a Megatron-Core GPTModel with the local layer spec
(`--transformer-impl local`), mock data (`--mock-data`, NullTokenizer), and one log line
per iteration (`--log-interval 1 --log-throughput`). This driver prints its version line
and then runs pretrain_gpt.py as `__main__` in this process, so every step line bench
reads is printed by Megatron's own training_log.

With $BENCH_PROFILE set (bench's triage), Megatron's own PyTorch profiler traces one
iteration (see `profile_flags`) and each rank's trace is copied there once training ends.
"""

import argparse
import json
import os
import runpy
import sys

from driver_info import source_commit, version
from step_trace import copy_trace, note, rank_path, requested, warn


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


def flag_value(argv, flag):
    """The value of the last `flag` in `argv` (`flag value` or `flag=value`; argparse's
    last one wins), or None."""
    value = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a[len(flag) + 1:]
    return value


def profile_flags(argv, attempt_dir, warmup):
    """Megatron's flags that trace one iteration with its PyTorch profiler, and the folder
    its traces land in (`<tensorboard dir>/../torch_profile/rank-<r>.json.gz`, gzipped Chrome
    JSON, megatron/training/training.py in megatron-core 0.19); `([], None)` when the cell's
    own flags already profile.

    Megatron's profiler (torch.profiler.schedule with repeat=1) records iterations
    start..end-1 and writes the trace in `prof.step()` at the top of the iteration after
    the last recorded one, which Megatron's interval timer counts in that iteration's time.
    So the traced iteration is the one before the last warm-up iteration (warmup - 1): the
    export then lands in the last warm-up iteration and no measured iteration's time holds
    profiler work. With a warm-up of one iteration there is no earlier one: iteration 1 is
    traced and the export counts in iteration 2, whose time a traced run does not record
    (triage's traced runs are no samples)."""
    if "--profile" in argv:
        warn("the cell's own Megatron flags already profile (--profile); bench adds no trace")
        return [], None
    start = max(warmup - 1, 1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    flags = [
        "--profile",
        "--use-pytorch-profiler",
        "--profile-step-start", str(start),
        "--profile-step-end", str(start + 1),
        # Every rank traces, as triage diffs each rank's kernels.
        "--profile-ranks", *[str(r) for r in range(world)],
    ]
    tensorboard = flag_value(argv, "--tensorboard-dir")
    if tensorboard is None:
        # The profiler writes beside the TensorBoard folder, so one is named inside the
        # attempt's folder. TensorBoard's own per-iteration scalars (written by the last
        # rank when the tensorboard package is installed) are kept out of the run by an
        # interval no run reaches.
        tensorboard = os.path.join(attempt_dir, "bench-profile", "tensorboard")
        flags += ["--tensorboard-dir", tensorboard, "--tensorboard-log-interval", "1000000000"]
    note(f"Megatron's profiler traces iteration {start} (--profile-step-start {start})")
    return flags, os.path.join(os.path.dirname(os.path.normpath(tensorboard)), "torch_profile")


def collect_trace(folder, path):
    """Copies this rank's Megatron trace to its $BENCH_PROFILE path (plain JSON)."""
    rank = int(os.environ.get("RANK", "0"))
    src = os.path.join(folder, f"rank-{rank}.json.gz")
    dest = rank_path(path, rank)
    try:
        copy_trace(src, dest)
        note(f"Megatron's trace {src} copied to {dest}")
    except Exception as e:  # noqa: BLE001 (a trace is never worth a failed cell)
        warn(f"cannot copy Megatron's trace {src} to {dest}", e)


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
    argv = list(config["argv"])
    trace = requested()
    traces = None
    if trace:
        extra, traces = profile_flags(argv, os.path.dirname(os.path.abspath(args.config)), trace[1])
        argv += extra
    sys.argv = [os.path.join(source, "pretrain_gpt.py")] + argv
    finished = False
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
        finished = True
    except SystemExit as e:
        # Megatron may leave through sys.exit after its last iteration; a failed run's
        # trace is not looked for.
        finished = e.code in (None, 0)
        raise
    finally:
        if traces and finished:
            collect_trace(traces, trace[0])


if __name__ == "__main__":
    main()
