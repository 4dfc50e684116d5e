#!/usr/bin/env python3
"""Says over how many nights, hosts and hours a committed history store was measured.

Every figure about nights in the docs names its store; this prints, per store and hardware
key, the runs that are nights (probes and side-by-side ends, branch `bisect`, are not, nor
are the re-runs that confirmed a night), the
distinct host names they were recorded on, and the first and last start times with the hours
between them, so "N nights on H hosts over T hours" can be recomputed from what is committed.
A host name is what the run's machine called itself: lent machines may share one name, so
the device calls (sessions) are counted too, as gaps of more than 30 minutes between runs.

Usage: scripts/nights-span.py STORE.sqlite...
"""
import sqlite3
import sys
from datetime import datetime


def parse(t):
    # RFC 3339 with nanoseconds; Python's fromisoformat takes at most microseconds.
    t = t.rstrip("Z")
    if "." in t:
        head, frac = t.split(".", 1)
        t = f"{head}.{frac[:6]}"
    return datetime.fromisoformat(t)


def main(paths):
    print("| store | hardware key | nights | confirming runs | host names | sessions (gaps over 30 min) | first start (UTC) | last start (UTC) | hours |")
    print("|---|---|---:|---:|---|---:|---|---|---:|")
    for path in paths:
        db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        keys = [k for (k,) in db.execute("select distinct hardware_key from bench_runs order by 1")]
        for key in keys:
            rows = db.execute(
                "select started_at, host, run_id from bench_runs where hardware_key = ? "
                "and coalesce(branch, '') != 'bisect' order by started_at",
                (key,),
            ).fetchall()
            # A run that confirms another (`NIGHT-confirm`, `NIGHT-confirm-2`) is part of
            # that night, not a night of its own.
            confirming = sum("-confirm" in r for _, _, r in rows)
            rows = [(t, h) for t, h, r in rows if "-confirm" not in r]
            if not rows:
                continue
            times = [parse(t) for t, _ in rows]
            hosts = sorted({h for _, h in rows})
            calls = 1 + sum((b - a).total_seconds() > 1800 for a, b in zip(times, times[1:]))
            hours = (times[-1] - times[0]).total_seconds() / 3600
            print(
                f"| {path} | {key} | {len(rows)} | {confirming} | {', '.join(hosts)} | {calls} | "
                f"{times[0]:%Y-%m-%d %H:%M} | {times[-1]:%Y-%m-%d %H:%M} | {hours:.2f} |"
            )


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
