"""llm.c's own `train_gpt2.cu`, built with nvcc on this host and started by `bench adapt` for an
`llmc` cell.

bench writes one JSON file: the cell id, the llm.c checkout (`source`, else
$BENCH_LLMC_SOURCE), the precision to build (`BF16` or `FP32`), the number of processes, the
synthetic data's size and seed, and `train_gpt2cu`'s own flags (`argv`: the model descriptor
`-e dN`, batch, sequence, steps, learning rate, ...). This driver

1. builds `train_gpt2cu` with llm.c's own Makefile (`make train_gpt2cu PRECISION=..`) in a
   copy of the checkout under a build cache ($BENCH_LLMC_BUILD, else ~/.cache/bench/llmc),
   once per checkout, precision and multi-GPU setting (several cells share one build; a
   file lock keeps two from building at once);
2. writes a data shard of uniform random GPT-2 token ids in llm.c's own format (a 256-int32
   header: magic 20240520, version 1, token count; then uint16 tokens), since llm.c reads
   only tokenized shards and nothing may be downloaded;
3. prints its version line, then runs `train_gpt2cu` (one process per GPU; several are joined
   by llm.c's own NCCL set-up through a shared folder, `-pi fs`), every rank's lines
   prefixed `[rank<N>]:` as torchrun would, so each step line bench reads is printed by
   llm.c's own `printf0("step %4d/%d | loss ...")`.
"""

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from array import array
import random

from driver_info import source_commit
from step_trace import requested, warn

GPT2_VOCAB = 50257  # llm.c's GPT-2 tokenizer; ids at or above it are padding rows


def fail(msg: str) -> None:
    print(f"llmc_train.py: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def find_nvcc() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc:
        return nvcc
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    fail("no nvcc on PATH, $CUDA_HOME/bin or /usr/local/cuda/bin: llm.c is built with nvcc on the host")
    return ""


def nccl_dirs() -> tuple:
    """NCCL's include and lib folders: the system's, else the nvidia-nccl wheel's."""
    if os.path.exists("/usr/include/nccl.h"):
        return "/usr/include", ""
    try:
        import nvidia.nccl  # noqa: PLC0415 (only multi-GPU builds need it)

        base = os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0]
        if os.path.exists(os.path.join(base, "include", "nccl.h")):
            return os.path.join(base, "include"), os.path.join(base, "lib")
    except ImportError:
        pass
    fail("a multi-GPU llm.c build needs NCCL: no /usr/include/nccl.h and no nvidia-nccl wheel")
    return "", ""


def source_digest(source: str) -> str:
    """A digest of the files the build reads, so an edited checkout gets its own build."""
    h = hashlib.sha256()
    paths = ["Makefile", "train_gpt2.cu"]
    llmc = os.path.join(source, "llmc")
    paths += sorted(os.path.join("llmc", f) for f in os.listdir(llmc))
    for p in paths:
        h.update(p.encode())
        with open(os.path.join(source, p), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def nvcc_release(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    return next((l.split("release")[-1].split(",")[0].strip() for l in out.splitlines() if "release" in l), "")


# llm.c (through commit f1e2ace, 2024) calls cudaMemAdvise with a device ordinal; CUDA 13
# removed that overload for one taking a cudaMemLocation (CUDA 12.2+), so the checkout does
# not compile with nvcc 13 ("no suitable constructor exists to convert from int to
# cudaMemLocation", llmc/cuda_utils.cuh). The build copy, never the checkout, gets the same
# call in the new form: the host as the preferred location of the managed fallback.
CUDA13_OLD = "cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)"
CUDA13_NEW = "cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})"


def port_to_cuda13(release: str, work: str) -> None:
    if not release or int(release.split(".")[0]) < 13:
        return
    path = os.path.join(work, "llmc", "cuda_utils.cuh")
    with open(path) as f:
        text = f.read()
    if CUDA13_OLD in text:
        with open(path, "w") as f:
            f.write(text.replace(CUDA13_OLD, CUDA13_NEW))
        print(f"llmc_train.py: nvcc {release}: ported llmc/cuda_utils.cuh's cudaMemAdvise call to CUDA 13's cudaMemLocation form (build copy only)", flush=True)


def compute_capability() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, check=True,
        )
        caps = sorted(
            (l.strip().replace(".", "") for l in out.stdout.splitlines() if l.strip()),
            key=lambda c: int(c) if c.isdigit() else 0,
        )
        # The lowest, as llm.c's Makefile picks: code for it runs on every GPU of the host.
        return caps[0] if caps else ""
    except (OSError, subprocess.CalledProcessError):
        return ""


def nvml_stub_dir(nvcc: str) -> str:
    root = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    for d in ("lib64/stubs", "targets/x86_64-linux/lib/stubs", "lib/stubs"):
        if os.path.exists(os.path.join(root, d, "libnvidia-ml.so")):
            return os.path.join(root, d)
    return ""


def build(source: str, precision: str, multi_gpu: bool, nvcc: str, release: str) -> str:
    """Builds train_gpt2cu with `nvcc` (of CUDA `release`) once per (checkout contents,
    precision, multi-GPU, GPU architecture, release); returns its path."""
    root = os.environ.get("BENCH_LLMC_BUILD") or os.path.join(
        os.path.expanduser("~"), ".cache", "bench", "llmc"
    )
    # The binary holds code for one GPU architecture, from one nvcc: both are in the key, so
    # a cache shared between nodes of different GPUs, or kept across a CUDA upgrade, never
    # hands a cell a binary built for something else.
    cap = compute_capability()
    key = "-".join([
        source_digest(source),
        precision.lower(),
        "multi" if multi_gpu else "single",
        f"sm{cap or 'default'}",
        f"nvcc{release or 'unknown'}",
    ])
    work = os.path.join(root, key)
    exe = os.path.join(work, "train_gpt2cu")
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, key + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(exe, os.X_OK):
            # Said on every run, not only the one that built it: bench reads how the binary
            # was built (cuDNN or not) from this line into the cell's record of what ran.
            try:
                with open(os.path.join(work, BUILD_ARGS)) as f:
                    built = f.read().strip()
            except OSError:
                built = "make train_gpt2cu (flags not recorded)"
            print(f"llmc_train.py: cached build: {built} (in {work})", flush=True)
            return exe
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        shutil.copy(os.path.join(source, "Makefile"), work)
        shutil.copy(os.path.join(source, "train_gpt2.cu"), work)
        shutil.copytree(os.path.join(source, "llmc"), os.path.join(work, "llmc"))
        port_to_cuda13(release, work)
        env = dict(os.environ)
        env["PATH"] = os.path.dirname(nvcc) + os.pathsep + env.get("PATH", "")
        # llm.c's Makefile finds NCCL through dpkg only; a wheel's NCCL is passed explicitly
        # (PFLAGS carries -DMULTI_GPU beside the precision flag, as the Makefile would add it).
        args = ["make", "train_gpt2cu", f"PRECISION={precision}", "USE_CUDNN=0", "NO_USE_MPI=1", "NO_MULTI_GPU=1"]
        # The Makefile's own GPU query never fires (its file_exists_in_path lacks `shell`),
        # so without this llm.c would build no code for this GPU's architecture.
        if cap:
            args.append(f"GPU_COMPUTE_CAPABILITY={cap}")
        # The Makefile links -lnvidia-ml; a host whose driver ships only libnvidia-ml.so.1
        # links against the toolkit's stub, which loads the driver's library at run time.
        stubs = nvml_stub_dir(nvcc)
        if stubs:
            args.append(f"NVCC_LDFLAGS=-lcublas -lcublasLt -lnvidia-ml -L{stubs}")
        if multi_gpu:
            inc, lib = nccl_dirs()
            flag = {"BF16": "-DENABLE_BF16", "FP32": "-DENABLE_FP32", "FP16": "-DENABLE_FP16"}[precision]
            args.append(f"PFLAGS={flag} -DMULTI_GPU")
            args.append(f"NVCC_INCLUDES=-I{inc}")
            args.append(f"NVCC_LDLIBS=-L{lib} -l:libnccl.so.2 -Xlinker -rpath={lib}" if lib else "NVCC_LDLIBS=-lnccl")
        print(f"llmc_train.py: building: {' '.join(args)} (in {work})", flush=True)
        done = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True)
        sys.stdout.write(done.stdout[-4000:])
        sys.stdout.write(done.stderr[-4000:])
        if done.returncode != 0 or not os.access(exe, os.X_OK):
            fail(f"`make train_gpt2cu` failed with exit code {done.returncode} (the compiler's last lines are above)")
        with open(os.path.join(work, BUILD_ARGS), "w") as f:
            f.write(" ".join(args) + "\n")
        return exe


# The make command line a cached build was made with, kept beside the binary.
BUILD_ARGS = "bench-build-args.txt"


def write_shard(path: str, tokens: int, seed: int) -> None:
    rng = random.Random(seed)
    header = array("i", [0] * 256)
    header[0], header[1], header[2] = 20240520, 1, tokens
    data = array("H", (rng.randrange(GPT2_VOCAB) for _ in range(tokens)))
    if sys.byteorder != "little":
        header.byteswap()
        data.byteswap()
    with open(path, "wb") as f:
        header.tofile(f)
        data.tofile(f)


def relay(rank: int, stream, lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        with lock:
            sys.stdout.write(f"[rank{rank}]:{line}\n")
            sys.stdout.flush()


def gpu_name() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, check=True,
        )
        return out.stdout.splitlines()[0].strip()
    except (OSError, subprocess.CalledProcessError, IndexError):
        return ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    with open(args.config) as f:
        config = json.load(f)
    source = config.get("source") or os.environ.get("BENCH_LLMC_SOURCE")
    if not source or not os.path.isfile(os.path.join(source, "train_gpt2.cu")):
        fail(f"no llm.c checkout with train_gpt2.cu at {source!r}: set the workload's `source` or $BENCH_LLMC_SOURCE")
    device = gpu_name()
    if not device:
        fail("llm.c's train_gpt2cu needs an NVIDIA GPU, and nvidia-smi lists none")
    if requested():
        # llm.c has no profiler of its own (its CUDA code only marks NVTX ranges for an
        # outside Nsight Systems run), and the binary runs outside any Python profiler.
        # Wrapping it in `nsys profile` is left out: Nsight Systems is not part of the set-up
        # bench assumes, and its report is no Chrome trace without a conversion. The log
        # says so, and triage reports that the run wrote no trace.
        warn("llm.c has no profiler that writes a Chrome trace, so $BENCH_PROFILE gets none")
    nproc = int(config["nproc"])
    nvcc = find_nvcc()
    release = nvcc_release(nvcc)
    exe = build(source, config["precision"], nproc > 1, nvcc, release)

    out_dir = os.path.dirname(os.path.abspath(args.config))
    shard = os.path.join(out_dir, "llmc_synthetic_train_000000.bin")
    write_shard(shard, int(config["tokens"]), int(config["seed"]))
    info = {
        "name": "llm.c",
        "version": source_commit(source) or "checkout",
        "libraries": {k: v for k, v in {"nvcc": release, "precision": config["precision"]}.items() if v},
        "device": device,
        "world_size": nproc,
    }
    print("bench-framework: " + json.dumps(info), flush=True)

    # The shard serves as the validation split too (one batch, `-m 1`), since llm.c always
    # opens one; sampling, checkpoints and HellaSwag are off. Paths are relative to the
    # attempt's folder (the working directory): llm.c reads -i/-j as glob patterns and copies
    # -pf into a 256-byte buffer, so a long or bracketed run folder must not reach them.
    os.chdir(out_dir)
    base = [exe, "-i", os.path.basename(shard), "-j", os.path.basename(shard)] + list(config["argv"])
    # llm.c prints with printf into a pipe, which the C library buffers by the block: step
    # lines would reach bench late (and be lost on a crash). stdbuf makes them line-buffered.
    stdbuf = shutil.which("stdbuf")
    prefix = [stdbuf, "-oL", "-eL"] if stdbuf else []
    if nproc == 1:
        os.execv(prefix[0] if prefix else exe, prefix + base)
    sync = "llmc_nccl_sync"
    os.makedirs(sync, exist_ok=True)
    lock = threading.Lock()
    procs, threads = {}, []
    for rank in range(nproc):
        argv = prefix + base + ["-pn", str(nproc), "-pr", str(rank), "-pg", str(nproc), "-pi", "fs", "-pf", sync]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        t = threading.Thread(target=relay, args=(rank, p.stdout, lock), daemon=True)
        t.start()
        procs[p.pid] = p
        threads.append(t)
    # The first rank to fail stops the others: a survivor would wait in an NCCL collective
    # (or for the rendezvous file of a rank that never wrote it) until the cell's timeout.
    code = 0
    running = dict(procs)
    while running:
        pid, status = os.wait()
        if pid not in running:
            continue
        del running[pid]
        rc = os.waitstatus_to_exitcode(status)
        procs[pid].returncode = rc
        if rc != 0 and code == 0:
            code = rc if rc > 0 else 1
            for other in running.values():
                other.terminate()
    # The relays end when the ranks' pipes close; a child a rank left behind could hold its
    # pipe open, so they get a few seconds, not forever (they are daemon threads).
    for t in threads:
        t.join(timeout=5)
    sys.stdout.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
