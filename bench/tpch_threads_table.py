#!/usr/bin/env python3
"""Markdown table of strata / DuckDB time ratios per TPC-H query and thread count, from the
reports of bench/tpch-peers-threads.sh (one `peers.py --tpch` JSON per thread count).

    python3 bench/tpch_threads_table.py OUT_DIR/tpch-sf1-64MiB-t*.json

Each cell is strata's seconds / DuckDB's seconds (below 1: strata faster), warm, and cold
after a slash where the run measured cold. A failed run shows what failed ("s fail":
strata, "d fail": DuckDB); "≠" marks answers that differ.
"""
import json
import sys


def cell(report, q, mode):
    s = report["engines"].get("strata", {}).get(q, {}).get(mode)
    d = report["engines"].get("duckdb", {}).get(q, {}).get(mode)
    if s is None or d is None:
        return None
    if "failed" in s or "failed" in d:
        return "s fail" if "failed" in s else "d fail"
    return f"{s['seconds'] / d['seconds']:.2f}"


def main(paths):
    reports = sorted((json.load(open(p)) for p in paths), key=lambda r: r["threads"])
    queries = reports[0]["queries"]
    print("| query | " + " | ".join(f"{r['threads']} thr" for r in reports) + " |")
    print("| --- |" + " --- |" * len(reports))
    sums = {}
    for q in queries:
        cells = []
        for r in reports:
            c = " / ".join(x for x in (cell(r, q, "warm"), cell(r, q, "cold")) if x is not None)
            if r["answers"].get(q, {}).get("match") is False:
                c += " ≠"
            cells.append(c or "-")
            ws = [r["engines"].get(e, {}).get(q, {}).get("warm", {}) for e in ("strata", "duckdb")]
            if all("seconds" in w for w in ws):
                for e, w in zip(("strata", "duckdb"), ws):
                    sums[(r["threads"], e)] = sums.get((r["threads"], e), 0.0) + w["seconds"]
        print(f"| {q.upper()} | " + " | ".join(cells) + " |")
    print("| sum of warm seconds where both ran, strata / DuckDB | " + " | ".join(
        f"{sums.get((r['threads'], 'strata'), 0):.2f} / {sums.get((r['threads'], 'duckdb'), 0):.2f}" for r in reports) + " |")
    rss = max((m.get("peak_rss_bytes", 0) for r in reports for e in r["engines"].get("strata", {}).values()
               for k, m in e.items() if k in ("warm", "cold") and isinstance(m, dict)), default=0)
    print(f"\nstrata's largest peak RSS: {rss / (1 << 20):.0f} MiB (pool {reports[0]['pool_bytes'] / (1 << 20):.0f} MiB)")


if __name__ == "__main__":
    main(sys.argv[1:])
