#!/usr/bin/env python3
"""Recomputes the agreement table of a sharded GPU night against its unsharded twin.

Reads the tarball `scripts/gpu-shards.sh` committed (docs/results/shards-*/CALL/shards.tgz):
for each night, the unsharded run (`whole/NIGHT/`) and the merge of its shards
(`merged/NIGHT/`), each with report.json (exit code, findings) and history.json (each cell's
verdict). Two runs agree when the exit code, each cell's verdict, the number of findings and
every finding's commit range are equal; the last column says which of these differ, so a
reader can check a "yes" against the files instead of trusting it.

Usage: scripts/shards-agreement.py docs/results/shards-2026-11-27/gate-call1/shards.tgz
"""
import io
import json
import sys
import tarfile


def load(tar, name):
    try:
        return json.load(tar.extractfile(name))
    except KeyError:
        return None


def main(path):
    with tarfile.open(path) as tar:
        names = set(tar.getnames())
        nights = sorted({n.split("/")[1] for n in names if n.startswith("whole/") and n.count("/") >= 2})
        print("| night | cell | unsharded | merged shards | equal |")
        print("|---|---|---|---|---|")
        for night in nights:
            runs = {}
            for way in ("whole", "merged"):
                report = load(tar, f"{way}/{night}/report.json")
                history = load(tar, f"{way}/{night}/history.json")
                if report is None or history is None:
                    break
                runs[way] = (report, {c["cell_id"]: c["judgement"]["verdict"] for c in history["cells"]})
            if len(runs) < 2:
                continue  # a night run one way only (the history-making nights)
            (wr, wv), (mr, mv) = runs["whole"], runs["merged"]
            ranges = lambda r: sorted(tuple(f.get("commits", [])) for f in r.get("findings", []))
            run_diffs = []
            if wr.get("exit_code") != mr.get("exit_code"):
                run_diffs.append(f"exit code {wr.get('exit_code')} vs {mr.get('exit_code')}")
            if len(wr.get("findings", [])) != len(mr.get("findings", [])):
                run_diffs.append("number of findings")
            elif ranges(wr) != ranges(mr):
                short = lambda r: ", ".join("..".join(c[:7] for c in f) for f in ranges(r)) or "none"
                run_diffs.append(f"commit ranges {short(wr)} vs {short(mr)}")
            for cell in sorted(set(wv) | set(mv)):
                diffs = list(run_diffs)
                if wv.get(cell) != mv.get(cell):
                    diffs.insert(0, "verdict")
                equal = "yes" if not diffs else "**no** (" + "; ".join(diffs) + ")"
                fmt = lambda v, r: f"{v} (rc={r.get('exit_code')}, findings={len(r.get('findings', []))})"
                print(f"| {night} | `{cell}` | {fmt(wv.get(cell), wr)} | {fmt(mv.get(cell), mr)} | {equal} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
