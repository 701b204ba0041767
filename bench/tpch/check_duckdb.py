#!/usr/bin/env python3
"""Checks strata's TPC-H answers against DuckDB's on the same CSV files.

    strata gen tpch --sf 0.1 --out /tmp/tpch-csv
    strata import-tpch /tmp/tpch-db --from /tmp/tpch-csv
    pip install duckdb
    python3 bench/tpch/check_duckdb.py /tmp/tpch-csv /tmp/tpch-db 16MiB [path/to/strata]

DuckDB reads the CSV with its own inference (decimals as DOUBLE, as strata's f64), runs
the same query files (crates/strata/tests/tpch/qN.sql); each strata query runs in a fresh
`strata sql --json` process. Numbers must agree to 1e-9 relative, rows in order. Prints
one line per query with strata's time, peak resident bytes and peak RSS; exits 1 on a
difference.
"""
import datetime
import json
import os
import subprocess
import sys

import duckdb

QUERIES = [f"q{i}" for i in range(1, 23)]
TABLES = ["region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem"]
HERE = os.path.dirname(os.path.abspath(__file__))
QDIR = os.path.join(HERE, "..", "..", "crates", "strata", "tests", "tpch")


def same(a, b):
    if isinstance(b, datetime.date):
        b = b.isoformat()
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        return a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b))
    return a == b


def main():
    csv, db, pool = sys.argv[1], sys.argv[2], sys.argv[3]
    strata = sys.argv[4] if len(sys.argv) > 4 else "strata"
    con = duckdb.connect()
    for t in TABLES:
        con.execute(f"CREATE TABLE {t} AS SELECT * FROM read_csv('{os.path.join(csv, t + '.csv')}', header=true)")
    bad = 0
    for q in QUERIES:
        path = os.path.join(QDIR, q + ".sql")
        want = con.execute(open(path).read()).fetchall()
        out = subprocess.run([strata, "sql", db, "--pool", pool, "--json", "--file", path], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout)
        got = r["rows"]
        ok = len(got) == len(want) and all(len(g) == len(w) and all(same(a, b) for a, b in zip(g, w)) for g, w in zip(got, want))
        print(f"{q:4} {'ok' if ok else 'DIFFERENT':9} {len(got):3} rows {r['seconds']:7.3f} s  peak resident {r['peak_resident_bytes']}  peak RSS {r['peak_rss_bytes']}")
        if not ok:
            bad += 1
            print("  strata:", got[:3])
            print("  duckdb:", want[:3])
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
