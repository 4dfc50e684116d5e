"""What the framework drivers record about the code they run, in one place.

`bench adapt` starts each driver from this folder, so Python finds this module beside it.
"""

import importlib.metadata
import os
import subprocess


def version(package: str) -> str:
    """The installed distribution's version, or "" when it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


def source_commit(source: str) -> str:
    """The commit of a checkout given as a framework's source folder, or "" when the folder
    is not the top of a git work tree of its own. A folder of copied files inside another
    repository (bench's own checkout, say) would otherwise report that repository's commit
    as the framework's: seen on 2026-11-26, when a Megatron-LM source folder of three copied
    files recorded bench's commit as `megatron-lm`."""
    try:
        out = subprocess.run(
            ["git", "-C", source, "rev-parse", "--show-toplevel", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return ""
    lines = out.stdout.split()
    if len(lines) != 2:
        return ""
    top, commit = lines
    if os.path.realpath(top) != os.path.realpath(source):
        return ""
    return commit


# torch's SDPBackend enum (aten/src/ATen/native/transformers/sdp_utils_cpp.h), as
# torch._fused_sdp_choice returns it.
SDPA_KERNELS = {
    0: "math (unfused: the score matrix is materialised)",
    1: "flash attention",
    2: "memory-efficient attention",
    3: "cuDNN attention",
    4: "an overrideable backend",
}


def sdpa_kernel(batch, heads, kv_heads, head_dim, seq_len, dtype, device, gqa=False):
    """The kernel torch's scaled_dot_product_attention picks for a causal attention of this
    shape, asked of torch's own dispatcher (what SDPA itself calls) with tensors of the real
    sizes, so the record says what ran. Returns a phrase; never raises."""
    try:
        import torch

        q = torch.empty(batch, heads, seq_len, head_dim, dtype=dtype, device=device)
        k = torch.empty(batch, kv_heads if gqa else heads, seq_len, head_dim, dtype=dtype, device=device)
        # torch's Python binding takes `scale` and `enable_gqa` as keywords only.
        choice = torch._fused_sdp_choice(q, k, k, None, 0.0, True, scale=None, enable_gqa=gqa)
        del q, k
        return "SDPA: " + SDPA_KERNELS.get(int(choice), f"backend {int(choice)}")
    except Exception as e:  # noqa: BLE001 (a record, never a failure of the run)
        return f"SDPA: unknown ({type(e).__name__}: {e})"


def print_ran(**aspects):
    """Prints the driver's record of what ran, one `bench-ran: {json}` line that bench
    reads beside the framework's own log lines (src/external/ran.rs). Aspects: execution,
    attention, checkpointing, optimizer, precision, parallel; a value of None is left out."""
    import json

    record = {k: str(v) for k, v in aspects.items() if v is not None}
    print("bench-ran: " + json.dumps(record), flush=True)


def ran_safely(build):
    """Calls `build()` (which returns the aspects for print_ran) and prints them; an error
    while reading the framework's objects becomes the record's own note, never a failed run."""
    try:
        print_ran(**build())
    except Exception as e:  # noqa: BLE001
        print_ran(execution=None, note=f"the driver could not read its framework's settings: {type(e).__name__}: {e}")
