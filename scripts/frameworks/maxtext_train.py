"""MaxText's own trainer, started by `bench adapt` for a `maxtext` cell: one JAX process that
drives every GPU of the host (JAX's process model).

bench writes one JSON file: the cell id, an optional MaxText checkout (`source`, else
$BENCH_MAXTEXT_SOURCE, put first on sys.path; else the installed `maxtext` package) and the
config keys (`overrides`) that map the cell onto MaxText's `base.yml`: the Llama preset's
shape, synthetic data, batch, steps, precision, remat policy and mesh. This driver prints its
version line and runs `maxtext.trainers.pre_train.train` as `__main__` with
`base.yml key=value ...`, so every step line bench reads is printed by MaxText's own
metric_logger.
"""

import argparse
import json
import os
import runpy
import sys

from driver_info import version


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

    sys.argv = ["train", base] + [f"{k}={render(v)}" for k, v in overrides.items()] + extra
    runpy.run_module("maxtext.trainers.pre_train.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
