#!/usr/bin/env python3
"""Adds tokens_per_joule and kwh_per_1t_tokens to a copy of a SQLite history store, from each
recorded cell's tokens_per_s and the mean board power of its telemetry, as bench computes them
for new runs (src/metrics/energy.rs): tokens/J = tokens/s / (power_w x GPUs), kWh per 1T
tokens = 1e12 / tokens/J / 3.6e6, per repeat, the value the median of the repeats.

Runs recorded before bench kept each repeat's own power (`repeat_power_w`) divide every
repeat by the cell's mean power, so their repeats carry the speed's spread only. Cells
without a power reading get nothing. The store given is never written: the result goes to
OUT.

Used for the energy calibration in docs/history.md ("Energy: tokens per joule, judged like
the speed"); then `bench history study --history OUT --metric tokens_per_joule`.

Usage: scripts/energy-backfill.py STORE.sqlite OUT.sqlite
"""
import json
import shutil
import sqlite3
import statistics
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    src, out = sys.argv[1], sys.argv[2]
    shutil.copyfile(src, out)
    db = sqlite3.connect(out)
    rows = db.execute(
        """SELECT m.run_id, m.cell_id, m.samples, m.value, c.telemetry
           FROM bench_metrics m JOIN bench_cells c
             ON c.run_id = m.run_id AND c.cell_id = m.cell_id
           WHERE m.metric = 'tokens_per_s'"""
    ).fetchall()
    added = 0
    for run_id, cell_id, samples, value, telemetry in rows:
        t = json.loads(telemetry) if telemetry else None
        if not t or not t.get("power_w") or not t.get("gpus"):
            continue
        tps = json.loads(samples) or [value]
        repeat_w = t.get("repeat_power_w") or []
        tpj = []
        for i, x in enumerate(tps):
            w = repeat_w[i] if i < len(repeat_w) and repeat_w[i] else t["power_w"]
            tpj.append(x / (w * len(t["gpus"])))
        kwh = [1e12 / x / 3.6e6 for x in tpj]
        for metric, xs in (("tokens_per_joule", tpj), ("kwh_per_1t_tokens", kwh)):
            med = statistics.median(xs)
            spread = (max(xs) - min(xs)) / 2 / med if len(xs) > 1 else 0.0
            db.execute(
                """INSERT OR REPLACE INTO bench_metrics
                   (run_id, cell_id, metric, value, rel_spread, samples)
                   VALUES (?, ?, ?, ?, ?, ?)""",
                (run_id, cell_id, metric, med, spread, json.dumps(xs)),
            )
        added += 1
    db.commit()
    print(f"{out}: tokens_per_joule and kwh_per_1t_tokens for {added} cell-runs")


if __name__ == "__main__":
    main()
