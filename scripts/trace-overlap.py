#!/usr/bin/env python3
"""How much of the kernels matching PATTERN ran while other kernels ran, in a Chrome trace
that `BENCH_PROFILE=FILE bench worker ...` wrote (libtorch's profiler, one step).

Usage: trace-overlap.py TRACE.json[.gz] [PATTERN] [--each]   (PATTERN default: master_adamw)

Prints the matching kernels' total time, the part of it during which some other kernel
was running (on any stream), their streams, and the other kernels' busy time: the
measure of whether an update queued on a second stream really ran beside the backward.
With --each, also one line per matching kernel in time order: its start from the trace's
first kernel, its duration and the part of it that nothing else ran beside (exposed), which
is where a data-parallel step's collectives (PATTERN nccl) cost the step its time.
"""
import gzip
import json
import sys


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def covered(a, b, merged):
    """Length of [a, b) covered by the merged intervals."""
    total = 0.0
    for x, y in merged:
        if y <= a:
            continue
        if x >= b:
            break
        total += min(b, y) - max(a, x)
    return total


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    args = [a for a in sys.argv[2:] if a != "--each"]
    each = "--each" in sys.argv[2:]
    pattern = args[0] if args else "master_adamw"
    events = load(sys.argv[1])
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    mine = [e for e in kernels if pattern in e.get("name", "")]
    rest = [e for e in kernels if pattern not in e.get("name", "")]
    if not mine:
        sys.exit(f"trace-overlap.py: no kernel matching {pattern!r} among {len(kernels)} kernels")
    merged = union((e["ts"], e["ts"] + e["dur"]) for e in rest)
    total = sum(e["dur"] for e in mine)
    beside = sum(covered(e["ts"], e["ts"] + e["dur"], merged) for e in mine)
    streams = sorted({str(e.get("args", {}).get("stream", "?")) for e in mine})
    start = min(e["ts"] for e in kernels)
    end = max(e["ts"] + e["dur"] for e in kernels)
    busy = sum(b - a for a, b in merged)
    print(f"kernels matching {pattern!r}: {len(mine)} launches, {total / 1e3:.2f} ms on stream(s) {', '.join(streams)}")
    print(f"  of which beside other kernels: {beside / 1e3:.2f} ms ({100 * beside / total:.1f}%)")
    print(f"other kernels busy: {busy / 1e3:.2f} ms of the traced span {(end - start) / 1e3:.2f} ms")
    if each:
        for e in sorted(mine, key=lambda e: e["ts"]):
            a, b = e["ts"], e["ts"] + e["dur"]
            exposed = e["dur"] - covered(a, b, merged)
            print(f"  {e['name'][:60]:60s} at {(a - start) / 1e3:8.2f} ms, {e['dur'] / 1e3:6.2f} ms, exposed {exposed / 1e3:6.2f} ms")


if __name__ == "__main__":
    main()
