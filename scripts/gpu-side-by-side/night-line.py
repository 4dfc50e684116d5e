"""One night's line of the side-by-side nights table (scripts/gpu-side-by-side.sh and
scripts/gpu-side-by-side-builtin.sh): its exit codes, wall time, GPU-seconds by stage, each
cell's verdict and the first bad commit, read from the merged report and the shard's
history.json. Run from the nightly repository's root.

Usage: night-line.py ID RC MERGE_RC WALL_S HOST HEAD
"""
import json, sys
id, rc, mrc, wall, host, head = sys.argv[1:]
try:
    r = json.load(open(f"results/{id}/report.json"))
    h = json.load(open(f"shards/{id}/history.json"))
except Exception as e:
    print(f"{id}\t{host}\t{head}\trc={rc}\tmerge={mrc}\t{wall}s\tERROR {e}"); sys.exit()
c = r.get("cost", {})
cells = "; ".join(f"{x['cell_id']}={x['judgement']['verdict']}" for x in h["cells"])
fb = [f["bisected"]["first_bad"]["subject"] for f in r.get("findings", []) if (f.get("bisected") or {}).get("first_bad")]
print(f"{id}\t{host}\t{head}\trc={rc}\tmerge={mrc}\t{wall}s\tmeasure={c.get('measuring_gpu_s',0):.0f}\tpairs={c.get('pairs_gpu_s',0):.0f}\treruns={c.get('reruns_gpu_s',0):.0f}\ttriage={c.get('triage_gpu_s',0):.0f}\t{cells}\tfirst_bad={fb}")
