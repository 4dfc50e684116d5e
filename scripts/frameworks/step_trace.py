"""One traced training step under $BENCH_PROFILE, shared by the framework drivers.

bench's triage, once it has found the first bad commit of a regression, runs the finding's
cell once at the last good and once at the first bad commit with
`BENCH_PROFILE=<path>.trace.json` and diffs the two Chrome traces by kernel
(src/triage/kernels.rs). `bench adapt` passes the cell's warm-up step count in
$BENCH_WARMUP, so a driver knows which of the framework's (1-based) steps is the last one
bench does not measure. Rank r > 0 of a multi-rank run writes `<stem>.rank<r>.<ext>` beside
rank 0's path, the naming of the built-in workload (src/workload/train.rs) and of triage's
reader (`rank_files`).

Tracing must never fail a cell: the traced run is a diagnosis, and a missing trace is
reported by triage as "wrote no trace". Every failure here is printed as one
`bench-profile: warning: ...` line and the training carries on untraced. The warning names
the exception as `Type (message)`, not `Type: message`, so bench adapt never takes a
profiler warning for the framework's own exception line when it explains a failed cell.

This module imports no framework (MaxText's Python has no torch); TorchStep imports torch
when it is used.
"""

import gzip
import json
import os
import shutil


def note(message: str) -> None:
    """Prints one `bench-profile: ...` line to the cell's log."""
    print(f"bench-profile: {message}", flush=True)


def warn(message: str, error: BaseException | None = None) -> None:
    """Prints a profiler failure that the cell carries on after."""
    if error is not None:
        message += f" ({type(error).__name__} ({error}))"
    note(f"warning: {message}; the cell carries on untraced")


def requested() -> tuple[str, int] | None:
    """`(path, step)` when $BENCH_PROFILE asks for a trace: the path rank 0 writes and the
    framework's 1-based step to trace, the last warm-up step ($BENCH_WARMUP, which bench
    adapt sets from the cell). `None` when no trace is asked for."""
    path = os.environ.get("BENCH_PROFILE", "")
    if not path:
        return None
    try:
        warmup = int(os.environ.get("BENCH_WARMUP", ""))
    except ValueError:
        # A driver started by hand, outside bench adapt: the first step is the only one
        # known to be a warm-up step (bench requires at least one).
        warmup = 1
    return path, max(warmup, 1)


def rank_path(path: str, rank: int) -> str:
    """Where rank `rank` writes its trace: rank 0 at `path`, every other rank beside it with
    `.rank<r>` before the extension (`t.trace.json` -> `t.trace.rank1.json`), as
    src/workload/train.rs names them and src/triage/kernels.rs finds them."""
    if rank == 0:
        return path
    folder, name = os.path.split(path)
    stem, ext = os.path.splitext(name)
    return os.path.join(folder, f"{stem}.rank{rank}{ext}")


def write_atomically(dest: str, write) -> None:
    """Calls `write(tmp)` and renames the file into place, so that a reader never sees half
    a trace (a killed run leaves only the temporary file)."""
    folder = os.path.dirname(os.path.abspath(dest))
    os.makedirs(folder, exist_ok=True)
    tmp = dest + ".partial"
    try:
        write(tmp)
        os.replace(tmp, dest)
    except BaseException:
        # A half-written file is no trace: remove it, so nothing but the warning remains.
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def copy_trace(src: str, dest: str) -> None:
    """Copies a Chrome trace that a framework's own profiler wrote (gzipped when `src` ends
    in `.gz`) to `dest` as plain JSON, which triage's reader reads."""

    def write(tmp):
        opener = gzip.open if src.endswith(".gz") else open
        with opener(src, "rb") as f, open(tmp, "wb") as out:
            shutil.copyfileobj(f, out)

    write_atomically(dest, write)


class TorchStep:
    """torch.profiler around one step of a torch training loop: host ops, and device
    kernels, copies and sets when CUDA is available (what triage diffs).

    `due(step)` says whether `step` (the framework's 1-based optimizer step) is the one to
    trace; `start()` begins recording and `finish()` stops it and writes the Chrome trace.
    `finish()` may be called more than once (the later calls do nothing), so a driver can
    call it where the step's time is still being counted and again in a `finally`."""

    def __init__(self, rank: int):
        req = requested()
        self.path = rank_path(req[0], rank) if req else None
        self.step = req[1] if req else 0
        self.prof = None
        self.done = False

    def due(self, step: int) -> bool:
        return self.path is not None and not self.done and step == self.step

    def start(self) -> None:
        try:
            import torch

            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            # One cycle only: accumulating across cycles changes nothing here and keeps
            # torch's warning that events are cleared between cycles out of the log.
            self.prof = torch.profiler.profile(activities=activities, acc_events=True)
            self.prof.start()
        except Exception as e:  # noqa: BLE001 (a trace is never worth a failed cell)
            self.prof = None
            self.done = True
            warn(f"cannot start torch.profiler for step {self.step}", e)

    def finish(self) -> None:
        if self.done or self.prof is None:
            return
        self.done = True
        prof, self.prof = self.prof, None
        try:
            import torch

            # The step's kernels are queued asynchronously; the trace holds the step only
            # once they have run.
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            prof.stop()
            write_atomically(self.path, prof.export_chrome_trace)
            note(f"traced step {self.step} to {self.path}")
        except Exception as e:  # noqa: BLE001
            warn(f"cannot write the trace of step {self.step} to {self.path}", e)


# The XLA profiler's Chrome trace (jax.profiler writes `<host>.trace.json.gz` beside the
# XPlane) marks no event with a category: device activity is told apart by its process
# (`/device:GPU:<n>`) and thread (`Stream #<id>(...)`, one per CUDA stream, named by
# XLA's CUPTI collector), while the process's other threads (`XLA Ops`, `XLA Modules`,
# `Steps`) are summaries derived from the same activity. Triage reads only `kernel`,
# `gpu_memcpy` and `gpu_memset` events, so the stream events get those categories here,
# by the names CUPTI gives copies and sets (`MemcpyH2D`, `Memset`, ...).
def _xla_category(name: str) -> str:
    if name.startswith("Memcpy"):
        return "gpu_memcpy"
    if name.startswith("Memset"):
        return "gpu_memset"
    return "kernel"


def from_xla(src: str, path: str) -> list[str]:
    """Turns the XLA profiler's gzipped Chrome trace `src` (one process, every GPU of the
    host) into triage's form: one file per GPU, as torch runs write one per rank (GPU n at
    `rank_path(path, n)`), its stream events categorised; the host's events stay in GPU 0's
    file (the only file when no GPU was traced, as on CPU). Returns the files written."""
    with gzip.open(src, "rb") as f:
        trace = json.load(f)
    events = trace.get("traceEvents", [])
    process = {}
    thread = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            process[e.get("pid")] = str(e.get("args", {}).get("name", ""))
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            thread[(e.get("pid"), e.get("tid"))] = str(e.get("args", {}).get("name", ""))
    gpu = {}
    for pid, name in process.items():
        if name.startswith("/device:GPU:"):
            try:
                gpu[pid] = int(name[len("/device:GPU:"):].split()[0])
            except (ValueError, IndexError):
                continue
    per_file = {}
    for e in events:
        pid = e.get("pid")
        index = gpu.get(pid, 0)
        if (
            pid in gpu
            and e.get("ph") == "X"
            and thread.get((pid, e.get("tid")), "").startswith("Stream #")
        ):
            e = dict(e, cat=_xla_category(str(e.get("name", ""))))
        per_file.setdefault(index, []).append(e)
    # GPU 0's file exists whenever anything was traced: it is the file triage asks for.
    per_file.setdefault(0, [])
    written = []
    for index in sorted(per_file):
        dest = rank_path(path, index)
        body = {k: v for k, v in trace.items() if k != "traceEvents"}
        body["traceEvents"] = per_file[index]

        def write(tmp, body=body):
            with open(tmp, "w") as out:
                json.dump(body, out)

        write_atomically(dest, write)
        written.append(dest)
    return written
