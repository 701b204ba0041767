#!/usr/bin/env python3
"""Peer comparison: strata vs DuckDB vs Kùzu on the same generated data at the same memory limit.

Usage (from the repository root, after `cargo build --release`):

    python3 bench/peers.py --count 60000000 --pool 64MiB --out bench/results/peers.json \
        --plot bench/results/peers.png

It creates a virtual environment in bench/.venv with duckdb, kuzu and matplotlib from PyPI
(once), generates the data with `strata gen ints` (u32, seeds fixed), and runs every query of
every engine in its own fresh process, so that each figure's peak RSS (VmHWM) belongs to that
query alone. DuckDB and Kùzu run inside a Python interpreter, whose own baseline RSS is
measured and reported too ("python_baseline_rss_bytes"). A query that fails or exceeds
--timeout is reported as {"failed": reason}.

Queries (as in docs/cli.md): load (import), scan v > 2^31, groupby v % 256, distinct (top
value), sort (full; checksum), join of two columns of count/2 values each.
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VENV = os.path.join(HERE, ".venv")
PACKAGES = ["duckdb", "kuzu", "numpy", "matplotlib"]
QUERIES = ["load", "scan", "groupby", "distinct", "sort", "join"]
GT = 1 << 31
COLORS = {"strata": "tab:blue", "duckdb": "tab:orange", "kuzu": "tab:green"}


def parse_size(s):
    s = s.strip()
    units = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
             "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}
    i = 0
    while i < len(s) and s[i].isdigit():
        i += 1
    return int(s[:i]) * units[s[i:].strip().lower()]


def vmhwm():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def ensure_venv():
    py = os.path.join(VENV, "bin", "python3")
    if sys.prefix == VENV:
        return
    if not os.path.exists(py):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
        subprocess.check_call([py, "-m", "pip", "install", "-q"] + PACKAGES)
    os.execv(py, [py] + sys.argv)


# --------------------------------------------------------------------------- workers
# Each worker runs in a fresh interpreter and prints one JSON line: result, seconds, rss.

def duckdb_worker(args):
    import duckdb
    dbfile = os.path.join(args.work, "duck.db")
    if args.query == "load":
        if os.path.exists(dbfile):
            os.remove(dbfile)
    con = duckdb.connect(dbfile)
    con.execute(f"SET memory_limit='{args.pool_bytes // (1 << 20)}MB'")
    con.execute(f"SET threads={args.threads}")
    con.execute(f"SET temp_directory='{os.path.join(args.work, 'duck.tmp')}'")
    t = time.time()
    q = args.query
    if q == "load":
        for name in ("v", "a", "b"):
            con.execute(f"CREATE TABLE {name} AS SELECT v FROM read_parquet('{os.path.join(args.work, name + '.parquet')}')")
        res = {"rows": con.execute("SELECT count(*) FROM v").fetchone()[0]}
    elif q == "scan":
        c, s = con.execute(f"SELECT count(*), sum(v) FROM v WHERE v > {GT}").fetchone()
        res = {"count": c, "sum": int(s or 0)}
    elif q == "groupby":
        rows = con.execute("SELECT v % 256 AS g, count(*) FROM v GROUP BY g").fetchall()
        res = {"groups": len(rows)}
    elif q == "distinct":
        g = con.execute("SELECT count(DISTINCT v) FROM v").fetchone()[0]
        tv, tc = con.execute("SELECT v, count(*) c FROM v GROUP BY v ORDER BY c DESC, v LIMIT 1").fetchone()
        res = {"groups": g, "top_value": tv, "top_count": tc}
    elif q == "sort":
        s = con.execute("SELECT sum((rn * v::HUGEINT) % 18446744073709551616) % 18446744073709551616 FROM "
                        "(SELECT row_number() OVER (ORDER BY v) AS rn, v FROM v)").fetchone()[0]
        res = {"checksum": int(s or 0)}
    elif q == "join":
        c, s = con.execute("SELECT count(*), sum(a.v::HUGEINT) % 18446744073709551616 FROM a JOIN b ON a.v = b.v").fetchone()
        res = {"matches": c, "checksum": int(s or 0)}
    secs = time.time() - t
    return {"result": res, "seconds": secs, "peak_rss_bytes": vmhwm()}


def kuzu_worker(args):
    import kuzu
    dbdir = os.path.join(args.work, "kuzu.db")
    if args.query == "load" and os.path.exists(dbdir):
        shutil.rmtree(dbdir) if os.path.isdir(dbdir) else os.remove(dbdir)
    db = kuzu.Database(dbdir, buffer_pool_size=args.pool_bytes, max_num_threads=args.threads)
    con = kuzu.Connection(db)
    t = time.time()
    q = args.query
    one = lambda cypher: con.execute(cypher).get_next()
    if q == "load":
        for name in ("V", "A", "B"):
            con.execute(f"CREATE NODE TABLE {name}(id SERIAL, v INT64, PRIMARY KEY(id))")
            con.execute(f"COPY {name}(v) FROM '{os.path.join(args.work, name.lower() + '.parquet')}'")
        res = {"rows": one("MATCH (t:V) RETURN count(*)")[0]}
    elif q == "scan":
        c, s = one(f"MATCH (t:V) WHERE t.v > {GT} RETURN count(*), sum(t.v)")
        res = {"count": c, "sum": int(s or 0)}
    elif q == "groupby":
        r = con.execute("MATCH (t:V) RETURN t.v % 256 AS g, count(*)")
        n = 0
        while r.has_next():
            r.get_next()
            n += 1
        res = {"groups": n}
    elif q == "distinct":
        tv, tc = one("MATCH (t:V) RETURN t.v AS v, count(*) AS c ORDER BY c DESC, v LIMIT 1")
        g = one("MATCH (t:V) RETURN count(DISTINCT t.v)")[0]
        res = {"groups": g, "top_value": tv, "top_count": tc}
    elif q == "sort":
        # Kùzu has no window functions: the full ORDER BY is forced by skipping to the end.
        n = one("MATCH (t:V) RETURN count(*)")[0]
        r = con.execute(f"MATCH (t:V) RETURN t.v ORDER BY t.v SKIP {max(n - 10, 0)}")
        last = []
        while r.has_next():
            last.append(r.get_next()[0])
        res = {"last": last}
    elif q == "join":
        c = one("MATCH (a:A), (b:B) WHERE a.v = b.v RETURN count(*)")[0]
        res = {"matches": c}
    secs = time.time() - t
    return {"result": res, "seconds": secs, "peak_rss_bytes": vmhwm()}


def baseline_worker(args):
    import duckdb, kuzu  # noqa: F401  (what an engine process costs before any work)
    return {"result": {}, "seconds": 0.0, "peak_rss_bytes": vmhwm()}


# --------------------------------------------------------------------------- driver

def run_worker(engine, query, args):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine, "--query", query, "--work", args.work,
           "--pool", str(args.pool_bytes), "--threads", str(args.threads)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"failed": f"timeout after {args.timeout} s"}
    if p.returncode != 0:
        lines = [l.strip() for l in p.stderr.strip().splitlines() if l.strip()]
        errors = [l for l in lines if "Error" in l or "Exception" in l or "exception" in l]
        return {"failed": ((errors or lines or [f"exit {p.returncode}"])[-1])[:300]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def strata(args, *cmd):
    return subprocess.run([args.strata, *cmd], capture_output=True, text=True, timeout=args.timeout)


def run_strata(query, args):
    db = os.path.join(args.work, "strata.db")
    pool = str(args.pool_bytes)
    try:
        if query == "load":
            if os.path.exists(db):
                shutil.rmtree(db)
            p = strata(args, "create", db)
            if p.returncode != 0:
                return {"failed": p.stderr.strip()}
            secs, rss = 0.0, 0
            for name in ("v", "a", "b"):
                p = strata(args, "import", db, name, "--from", os.path.join(args.work, name + ".u32"),
                           "--format", "u32le", "--pool", pool, "--json")
                if p.returncode != 0:
                    return {"failed": p.stderr.strip()}
                out = json.loads(p.stdout)
                secs += out["seconds"]
                rss = max(rss, out.get("peak_rss_bytes") or 0)
            return {"result": {"rows": args.count}, "seconds": secs, "peak_rss_bytes": rss}
        op = {"scan": ["scan", "v", "--gt", str(GT)], "groupby": ["groupby", "v", "--mod", "256"],
              "distinct": ["distinct", "v"], "sort": ["sort", "v"], "join": ["join", "a", "b"]}[query]
        p = strata(args, "query", db, "--pool", pool, "--threads", str(args.threads), "--json", *op)
    except subprocess.TimeoutExpired:
        return {"failed": f"timeout after {args.timeout} s"}
    if p.returncode != 0:
        return {"failed": p.stderr.strip()[:300]}
    out = json.loads(p.stdout)
    return {"result": out["result"], "seconds": out["seconds"], "peak_rss_bytes": out.get("peak_rss_bytes")}


def prepare(args):
    os.makedirs(args.work, exist_ok=True)
    import numpy as np
    import duckdb
    specs = {"v": (args.count, 1), "a": (args.count // 2, 2), "b": (args.count // 2, 3)}
    for name, (n, seed) in specs.items():
        raw = os.path.join(args.work, name + ".u32")
        pq = os.path.join(args.work, name + ".parquet")
        if not os.path.exists(raw) or os.path.getsize(raw) != 4 * n:
            subprocess.check_call([args.strata, "gen", "ints", "--count", str(n), "--seed", str(seed), "--out", raw])
            if os.path.exists(pq):
                os.remove(pq)
        if not os.path.exists(pq):
            arr = np.fromfile(raw, dtype="<u4").astype(np.int64)
            con = duckdb.connect()
            con.register("src", {"v": arr})
            con.execute(f"COPY (SELECT v FROM src) TO '{pq}' (FORMAT parquet)")
            del arr


def plot(report, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    engines = list(report["engines"].keys())
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / len(engines)
    for k, (metric, label) in enumerate([("seconds", "seconds (lower is better)"), ("peak_rss_bytes", "peak RSS, MiB")]):
        ax = axes[k]
        for i, e in enumerate(engines):
            xs, ys = [], []
            for j, q in enumerate(QUERIES):
                r = report["engines"][e].get(q, {})
                if "failed" in r or r.get(metric) is None:
                    ax.text(j + i * width, 0, "fail", rotation=90, ha="center", va="bottom", fontsize=7, color="red")
                    continue
                xs.append(j + i * width)
                ys.append(r[metric] / (1 << 20) if metric == "peak_rss_bytes" else r[metric])
            ax.bar(xs, ys, width, label=e, color=COLORS.get(e, f"C{i}"))
        if metric == "peak_rss_bytes":
            ax.axhline(report["pool_bytes"] / (1 << 20), color="black", linestyle="--", linewidth=1, label="pool / memory limit")
        ax.set_xticks([j + width * (len(engines) - 1) / 2 for j in range(len(QUERIES))])
        ax.set_xticklabels(QUERIES)
        ax.set_title(label)
        # Explicit handles: an engine that failed everything draws no bars to take a colour from.
        from matplotlib.patches import Patch
        from matplotlib.lines import Line2D
        handles = [Patch(color=COLORS.get(e, f"C{i}"), label=e) for i, e in enumerate(engines)]
        if metric == "peak_rss_bytes":
            handles.append(Line2D([], [], color="black", linestyle="--", label="pool / memory limit"))
        ax.legend(handles=handles, fontsize=8)
    fig.suptitle(f"{report['count']:,} u32 values, memory limit {report['pool_bytes'] >> 20} MiB, {report['threads']} thread(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=60_000_000)
    ap.add_argument("--pool", default="64MiB")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--work", default=os.path.join(ROOT, "target", "peers"))
    ap.add_argument("--strata", default=os.path.join(ROOT, "target", "release", "strata"))
    ap.add_argument("--engines", default="strata,duckdb,kuzu")
    ap.add_argument("--queries", default=",".join(QUERIES))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "peers.json"))
    ap.add_argument("--plot")
    ap.add_argument("--replot", metavar="JSON", help="only redraw --plot from an earlier report")
    ap.add_argument("--worker")
    ap.add_argument("--query")
    args = ap.parse_args()
    args.pool_bytes = parse_size(args.pool) if not args.pool.isdigit() else int(args.pool)
    if args.worker:
        fn = {"duckdb": duckdb_worker, "kuzu": kuzu_worker, "baseline": baseline_worker}[args.worker]
        print(json.dumps(fn(args)))
        return
    ensure_venv()
    if args.replot:
        with open(args.replot) as f:
            plot(json.load(f), args.plot)
        return
    if not os.path.exists(args.strata):
        sys.exit(f"{args.strata} not found: run `cargo build --release` first")
    prepare(args)
    engines = args.engines.split(",")
    queries = args.queries.split(",")
    report = {"count": args.count, "pool_bytes": args.pool_bytes, "threads": args.threads,
              "machine": {"cores": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()},
              "python_baseline_rss_bytes": run_worker("baseline", "none", args).get("peak_rss_bytes"),
              "engines": {e: {} for e in engines}}
    for q in queries:
        for e in engines:
            load = report["engines"][e].get("load", {})
            if q != "load" and "failed" in load:
                r = {"failed": "not run: the engine could not load the data"}
            else:
                r = run_strata(q, args) if e == "strata" else run_worker(e, q, args)
            report["engines"][e][q] = r
            shown = r.get("failed") or f"{r['seconds']:.2f} s, peak RSS {(r.get('peak_rss_bytes') or 0) / (1 << 20):.0f} MiB"
            print(f"{q:9} {e:7} {shown}", file=sys.stderr, flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    if args.plot:
        plot(report, args.plot)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
