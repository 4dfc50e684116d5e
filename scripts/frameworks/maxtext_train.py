"""MaxText's own trainer, started by `bench adapt` for a `maxtext` cell: one JAX process that
drives every GPU of the host (JAX's process model).

bench writes one JSON file: the cell id, an optional MaxText checkout (`source`, else
$BENCH_MAXTEXT_SOURCE, put first on sys.path; else the installed `maxtext` package) and the
config keys (`overrides`) that map the cell onto MaxText's `base.yml`: the Llama preset's
shape, synthetic data, batch, steps, precision, remat policy and mesh. This driver prints its
version line and runs `maxtext.trainers.pre_train.train` as `__main__` with
`base.yml key=value ...`, so every step line bench reads is printed by MaxText's own
metric_logger.

With $BENCH_PROFILE set (bench's triage), MaxText's own profiler (`profiler: xplane`, i.e.
jax.profiler) traces the last warm-up step (see `profile_overrides`). jax.profiler writes
an XPlane and, beside it, the same trace as gzipped Chrome JSON (`<host>.trace.json.gz`,
jax 0.11); once training ends that file is turned into triage's form, one file per GPU with
the device events categorised (step_trace.from_xla).
"""

import argparse
import glob
import json
import os
import runpy
import sys

from driver_info import version
from step_trace import from_xla, note, requested, warn


def profile_overrides(overrides, extra, warmup):
    """MaxText's config keys that trace one step with its profiler; {} when the cell's own
    keys already name a profiler.

    The traced step is bench's last warm-up step W (MaxText counts from 0: its step W - 1).
    MaxText's profiler starts before that step (after waiting for the previous one,
    `profile_cleanly`) and stops once it has run, writing the trace, all before the loop
    logs anything more. Its metric_logger prints each step's line one step late (after the
    next step is dispatched) and bench times a step between consecutive lines' stamps, so
    the profiler's work falls between the lines of bench's steps W - 2 and W - 1 and is
    counted in step W - 1 (with W = 1 there is no such line: the first line keeps MaxText's
    own dispatch time), and step W's line comes early. Both are warm-up steps; the first
    measured step's line is timed from step W's, so no measured step holds profiler work.
    """
    if "profiler" in overrides or any(a.startswith("profiler=") for a in extra):
        warn("the cell's own MaxText config already names a profiler; bench adds no trace")
        return {}
    return {
        "profiler": "xplane",
        "skip_first_n_steps_for_profiler": warmup - 1,
        "profiler_steps": 1,
        "profile_cleanly": True,
        "profile_periodically_period": -1,
    }


def collect_trace(output_dir, path):
    """Turns the newest XLA Chrome trace under MaxText's output folder into triage's files."""
    try:
        found = glob.glob(os.path.join(output_dir, "**", "plugins", "profile", "*", "*.trace.json.gz"), recursive=True)
        if not found:
            warn(f"jax.profiler wrote no *.trace.json.gz under {output_dir}")
            return
        src = max(found, key=os.path.getmtime)
        written = from_xla(src, path)
        note(f"MaxText's trace {src} written to {', '.join(written)}")
    except Exception as e:  # noqa: BLE001 (a trace is never worth a failed cell)
        warn(f"cannot turn MaxText's trace into {path}", e)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    args, extra = parser.parse_known_args()
    with open(args.config) as f:
        config = json.load(f)
    source = config.get("source") or os.environ.get("BENCH_MAXTEXT_SOURCE")
    if source:
        sys.path.insert(0, os.path.join(source, "src"))
    # JAX reserves 75% of a GPU's memory unless told otherwise; the 8B-width proxy at seq 8192
    # on one GPU wants more headroom (MaxText's GPU recipes set 0.85-0.9 too). An explicit
    # setting in the environment wins.
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.90")
    import jax
    import maxtext

    overrides = dict(config["overrides"])
    gpu = jax.default_backend() == "gpu"
    # MaxText's `hardware` names the backend its mesh is built for: the one JAX found.
    overrides["hardware"] = "gpu" if gpu else "cpu"
    # The attention kernel depends on that backend too. MaxText's `autoselected` takes
    # tokamax's Pallas-Triton flash attention on GPU; the driver names JAX's own cuDNN flash
    # attention there instead (causal, bf16/fp8 cells), plain dot-product attention elsewhere
    # (CPU, fp32). A config that names `attention` keeps it.
    if "attention" not in overrides:
        cudnn = gpu and overrides.get("dtype") != "float32"
        overrides["attention"] = "cudnn_flash_jax" if cudnn else "dot_product"
    devices = jax.devices()
    info = {
        "name": "maxtext",
        "version": getattr(maxtext, "__version__", "") or version("maxtext"),
        "libraries": {
            k: v
            for k, v in {"jax": jax.__version__, "flax": version("flax"), "optax": version("optax")}.items()
            if v
        },
        "device": devices[0].device_kind if devices[0].platform == "gpu" else "cpu",
        "world_size": len(devices),
    }
    print("bench-framework: " + json.dumps(info), flush=True)
    base = os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")

    def render(v):
        # MaxText parses each override as YAML, so lists and strings go as JSON.
        return json.dumps(v) if isinstance(v, (list, str)) else str(v).lower() if isinstance(v, bool) else str(v)

    trace = requested()
    output_dir = None
    if trace:
        added = profile_overrides(overrides, extra, trace[1])
        if added:
            overrides.update(added)
            # The matrix's extra `key=value` arguments come last, so MaxText takes theirs.
            output_dir = overrides.get("base_output_directory")
            for a in extra:
                if a.startswith("base_output_directory="):
                    output_dir = a.split("=", 1)[1]
            note(f"MaxText's profiler traces its step {trace[1] - 1} (bench's step {trace[1]})")
    sys.argv = ["train", base] + [f"{k}={render(v)}" for k, v in overrides.items()] + extra
    finished = False
    try:
        runpy.run_module("maxtext.trainers.pre_train.train", run_name="__main__", alter_sys=True)
        finished = True
    except SystemExit as e:
        # absl's app.run leaves through sys.exit, 0 (None) when training ended well; a failed
        # run's trace is not looked for.
        finished = e.code in (None, 0)
        raise
    finally:
        if output_dir and finished:
            collect_trace(output_dir, trace[0])


if __name__ == "__main__":
    main()
