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

TPC-H mode (`--tpch`): strata vs DuckDB on the TPC-H queries of crates/strata/tests/tpch/
(Q1 Q3 Q5 Q6 Q10 Q12 Q14 Q19 as the spec writes them):

    python3 bench/peers.py --tpch --sf 0.1 --pool 16MiB \
        --out bench/results/tpch/tpch-sf0.1-16MiB.json --plot bench/results/tpch/tpch-sf0.1-16MiB.png

`strata gen tpch` writes the CSVs once (into --work, default target/peers-tpch/sfF); both
engines load those same files (strata: `strata import-tpch` through the pool; DuckDB: a
database file, the schema of crates/strata/tests/tpch/schema.txt with decimals as DOUBLE like
strata's f64, under the same memory_limit; if DuckDB cannot load within it, the load is
retried with read_csv's buffer_size at 1 MiB (its default buffer is 16 MiB), then also with
preserve_insertion_order=false, then without a limit; "how" says which attempt loaded it and
"failed_at_limit" lists the ones that failed). Load times and peak RSS are reported apart from the
queries (--reuse-load: databases an earlier run loaded into the same --work are kept). Each query of each engine then runs in its own fresh process (strata: `strata sql
--json --file`; DuckDB: a fresh Python interpreter, `SET memory_limit`, `SET threads`,
read-only connection), --threads each (default 1; strata parallelizes aggregation pipelines,
see docs/cli.md). Peak RSS is
the process's maximum resident set from /usr/bin/time (%M; else wait4's ru_maxrss, which
can count this script's own RSS at the fork); the DuckDB figure includes the interpreter:
"python_baseline_rss_bytes" is a worker that imports duckdb and opens the database without
querying. "seconds" is the query as the engine times it (strata's own "seconds"; DuckDB
execute + fetchall), "process_seconds" the whole process. Cold: the OS page cache is
dropped (sync; echo 3 > /proc/sys/vm/drop_caches, needs root) before each cold run; warm:
the same query again right after (--rounds N: N cold and N warm runs, each reported figure
the median run, all times in "rounds_seconds"). strata's rows are checked
against DuckDB's (same number of rows in the same order, strings and dates equal, numbers
to --rel-tol relative); differences are listed in "mismatches". Exit status 1 if any.
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


def ensure_venv(packages=PACKAGES):
    py = os.path.join(VENV, "bin", "python3")
    if sys.prefix == VENV:
        return
    if not os.path.exists(py):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
    if subprocess.run([py, "-c", "import " + ", ".join(packages)], capture_output=True).returncode != 0:
        subprocess.check_call([py, "-m", "pip", "install", "-q"] + packages)
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


# --------------------------------------------------------------------------- TPC-H mode

TPCH_QUERIES = [f"q{i}" for i in range(1, 23)]
TPCH_TABLES = ["region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem"]
TPCH_DIR = os.path.join(ROOT, "crates", "strata", "tests", "tpch")
DUCK_TYPES = {"i64": "BIGINT", "f64": "DOUBLE", "str": "VARCHAR", "date": "DATE"}


def tpch_sql(q):
    return os.path.join(TPCH_DIR, q + ".sql")


def tpch_schema():
    """Table -> [(column, duckdb type)] from strata's fixed import schema."""
    out = {}
    with open(os.path.join(TPCH_DIR, "schema.txt")) as f:
        for line in f:
            if line.strip():
                table, cols = line.split()
                out[table] = [(c.split(":")[0], DUCK_TYPES[c.split(":")[1]]) for c in cols.split(",")]
    return out


def jsonable(v):
    import datetime
    import decimal
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return float(v)
    return v


def duckdb_tpch_worker(args):
    import duckdb
    dbfile = os.path.join(args.work, "duck.db")
    if args.query == "load":
        for path in (dbfile, dbfile + ".wal"):
            if os.path.exists(path):
                os.remove(path)
        con = duckdb.connect(dbfile)
    else:
        con = duckdb.connect(dbfile, read_only=True)
    if args.pool_bytes:
        con.execute(f"SET memory_limit='{args.pool_bytes // (1 << 20)}MB'")
    con.execute(f"SET threads={args.threads}")
    con.execute(f"SET temp_directory='{os.path.join(args.work, 'duck.tmp')}'")
    if args.no_insertion_order:
        con.execute("SET preserve_insertion_order=false")
    if args.query == "baseline":
        return {"seconds": 0.0, "peak_rss_bytes": vmhwm(), "duckdb_version": duckdb.__version__}
    t = time.perf_counter()
    if args.query == "load":
        tables = []
        for table, cols in tpch_schema().items():
            t0 = time.perf_counter()
            spec = ", ".join(f"'{c}': '{ty}'" for c, ty in cols)
            buf = f", buffer_size={args.csv_buffer}" if args.csv_buffer else ""
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM read_csv('{os.path.join(args.csv, table + '.csv')}', "
                        f"header=true, delim=',', quote='\"', columns={{{spec}}}{buf})")
            n = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            tables.append({"table": table, "rows": n, "seconds": time.perf_counter() - t0})
        con.execute("CHECKPOINT")
        con.close()
        return {"seconds": time.perf_counter() - t, "tables": tables, "peak_rss_bytes": vmhwm()}
    with open(tpch_sql(args.query)) as f:
        sql = f.read()
    cur = con.execute(sql)
    rows = cur.fetchall()
    secs = time.perf_counter() - t
    return {"columns": [d[0] for d in cur.description], "rows": [[jsonable(v) for v in r] for r in rows],
            "seconds": secs, "peak_rss_bytes": vmhwm()}


TIME = "/usr/bin/time"


def run_measured(cmd, timeout):
    """Run cmd in a fresh process; returns (rc, stdout, stderr, wall seconds, peak RSS bytes of that process).

    The peak RSS is GNU time's %M (ru_maxrss of its child) where /usr/bin/time exists, else
    wait4's ru_maxrss, which can include this Python process's RSS at the fork (the child's
    maximum before its exec) and so overstates a small child."""
    import tempfile
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as rss_file:
        if os.access(TIME, os.X_OK):
            cmd = [TIME, "-f", "%M", "-o", rss_file.name] + cmd
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err)
        deadline = t + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                p.kill()
                os.wait4(p.pid, 0)
                return None, "", f"timeout after {timeout} s", timeout, None
            time.sleep(0.002)
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        rss = ru.ru_maxrss * 1024
        if cmd[0] == TIME:
            lines = [l for l in rss_file.read().split() if l.isdigit()]
            if lines:
                rss = int(lines[-1]) * 1024
        return p.returncode, out.read().decode(), err.read().decode(), wall, rss


def failure(rc, stderr):
    lines = [l.strip() for l in stderr.strip().splitlines() if l.strip()]
    errors = [l for l in lines if "Error" in l or "error" in l or "Exception" in l]
    return ((errors or lines or [f"exit {rc}"])[-1])[:300]


def tpch_run(engine, query, args, pool_bytes=None, extra=()):
    """One fresh process of one engine; returns a result dict (with "rows" for queries)."""
    pool_bytes = args.pool_bytes if pool_bytes is None else pool_bytes
    if engine == "strata":
        db = os.path.join(args.work, "strata.db")
        if query == "load":
            if os.path.exists(db):
                shutil.rmtree(db)
            cmd = [args.strata, "import-tpch", db, "--from", args.csv, "--pool", str(pool_bytes), "--json"]
        else:
            cmd = [args.strata, "sql", db, "--pool", str(pool_bytes), "--threads", str(args.threads), "--json",
                   "--file", tpch_sql(query)]
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "duckdb-tpch", "--query", query,
               "--work", args.work, "--csv", args.csv, "--pool", str(pool_bytes), "--threads", str(args.threads), *extra]
    rc, out, err, wall, rss = run_measured(cmd, args.timeout)
    if rc != 0:
        return {"failed": err if rc is None else failure(rc, err), "process_seconds": wall}
    r = json.loads(out.strip().splitlines()[-1])
    res = {"seconds": r["seconds"], "process_seconds": wall, "peak_rss_bytes": rss}
    if engine == "strata":
        res["self_reported_peak_rss_bytes"] = r.get("peak_rss_bytes")
        if "peak_resident_bytes" in r:
            res["peak_resident_bytes"] = r["peak_resident_bytes"]
    else:
        res["self_reported_peak_rss_bytes"] = r.get("peak_rss_bytes")
    for k in ("tables", "rows", "columns", "duckdb_version"):
        if k in r:
            res[k] = r[k]
    return res


def can_drop_caches():
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True, None
    except OSError as e:
        return False, f"cannot write /proc/sys/vm/drop_caches ({e.strerror}; needs root outside a read-only /proc/sys)"


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def same_value(a, b, rel):
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        a, b = float(a), float(b)
        return a == b or abs(a - b) <= rel * max(abs(a), abs(b))
    return a == b


def compare_rows(got, want, rel):
    """Mismatches between strata's rows (got) and DuckDB's (want), at most 5, as dicts."""
    diffs = []
    if len(got) != len(want):
        diffs.append({"what": "row count", "strata": len(got), "duckdb": len(want)})
    for i, (g, w) in enumerate(zip(got, want)):
        if len(g) != len(w):
            diffs.append({"row": i, "what": "column count", "strata": g, "duckdb": w})
            continue
        for j, (a, b) in enumerate(zip(g, w)):
            if not same_value(a, b, rel):
                diffs.append({"row": i, "column": j, "strata": a, "duckdb": b})
        if len(diffs) >= 5:
            break
    return diffs[:5]


def median_run(runs):
    ok = [r for r in runs if "failed" not in r]
    if not ok:
        return runs[-1]
    ok.sort(key=lambda r: r["seconds"])
    best = dict(ok[(len(ok) - 1) // 2])
    if len(runs) > 1:
        best["rounds_seconds"] = [r.get("seconds") for r in runs]
    return best


def tpch_main(args):
    queries = args.queries.split(",") if args.queries else TPCH_QUERIES
    engines = args.engines.split(",") if args.engines else ["strata", "duckdb"]
    sf = args.sf
    args.work = args.work or os.path.join(ROOT, "target", "peers-tpch", f"sf{sf:g}")
    args.csv = os.path.join(args.work, "csv")
    os.makedirs(args.work, exist_ok=True)
    if not os.path.exists(args.strata):
        sys.exit(f"{args.strata} not found: run `cargo build --release` first")
    log = lambda msg: print(msg, file=sys.stderr, flush=True)
    # Data: generated once per scale factor (a marker file says the generation finished).
    marker = os.path.join(args.csv, ".complete")
    gen_seconds = None
    if not os.path.exists(marker):
        if os.path.exists(args.csv):
            shutil.rmtree(args.csv)
        t = time.perf_counter()
        subprocess.check_call([args.strata, "gen", "tpch", "--sf", f"{sf:g}", "--out", args.csv])
        gen_seconds = time.perf_counter() - t
        open(marker, "w").close()
    csv_bytes = sum(os.path.getsize(os.path.join(args.csv, t + ".csv")) for t in TPCH_TABLES)
    if args.cold == "off":
        cold, cold_reason = False, "--cold off"
    else:
        cold, cold_reason = can_drop_caches()
        if args.cold == "on" and not cold:
            sys.exit(cold_reason)
    report = {"workload": "tpch", "sf": sf, "pool_bytes": args.pool_bytes, "threads": args.threads,
              "queries": queries, "rounds": args.rounds, "rel_tol": args.rel_tol,
              "machine": {"cores": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
                          "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")},
              "duckdb_version": None, "csv_bytes": csv_bytes, "gen_seconds": gen_seconds,
              "cold": {"measured": cold, "how": "sync; echo 3 > /proc/sys/vm/drop_caches before the query"}
              if cold else {"measured": False, "why_not": cold_reason},
              "load": {}, "engines": {e: {} for e in engines}, "ratios": {}, "answers": {}, "mismatches": [],
              "notes": ["DuckDB reads the CSVs with strata's import schema (decimals as DOUBLE, as strata's f64).",
                        "peak_rss_bytes: the fresh process's maximum resident set (/usr/bin/time %M, else wait4); "
                        "DuckDB's includes the Python interpreter, see python_baseline_rss_bytes.",
                        "ratios are strata / DuckDB: below 1 means strata is faster or smaller."]}
    # Loads, each in a fresh process through the same limit.
    # DuckDB: at the limit; if that fails, at the limit with a 1 MiB CSV reader buffer (its
    # default, 16 MiB, does not fit a 16 MB limit), then also with preserve_insertion_order=false
    # (DuckDB's advice for loads under a memory limit); then without a limit, so that the
    # queries can still be compared. "failed_at_limit" lists the attempts that failed.
    for e in engines:
        done = os.path.join(args.work, "strata.db" if e == "strata" else "duck.db")
        if args.reuse_load and os.path.exists(done + ".loaded"):
            # Loaded by an earlier run of this script with the same --work (e.g. one run per
            # thread count on a lent machine): its load figures are in that run's report.
            report["load"][e] = {"reused": done}
            log(f"load  {e:7} reused {done}")
            continue
        if os.path.exists(done + ".loaded"):
            os.remove(done + ".loaded")
        attempts = [("at the limit", args.pool_bytes, ())]
        if e == "duckdb":
            buf = ("--csv-buffer", str(1 << 20))
            attempts += [("at the limit, read_csv buffer_size=1MiB", args.pool_bytes, buf),
                         ("at the limit, read_csv buffer_size=1MiB, preserve_insertion_order=false", args.pool_bytes,
                          buf + ("--no-insertion-order",)),
                         ("without a memory limit", 0, ())]
        failed = []
        for how, limit, extra in attempts:
            r = tpch_run(e, "load", args, pool_bytes=limit, extra=extra)
            r["how"] = how
            if "failed" not in r:
                break
            failed.append({"how": how, "failed": r["failed"]})
            log(f"load  {e:7} failed {how}: {r['failed']}")
        if failed and "failed" not in r:
            r["failed_at_limit"] = failed
        if "failed" not in r:
            open(done + ".loaded", "w").close()
        report["load"][e] = r
        log(f"load  {e:7} " + (r.get("failed") or f"{r['seconds']:.2f} s, peak RSS {r['peak_rss_bytes'] / (1 << 20):.0f} MiB"))
    if "duckdb" in engines:
        b = tpch_run("duckdb", "baseline", args)
        report["python_baseline_rss_bytes"] = b.get("peak_rss_bytes")
        report["duckdb_version"] = b.get("duckdb_version")
    for q in queries:
        for e in engines:
            if "failed" in report["load"].get(e, {}):
                report["engines"][e][q] = {"failed": "not run: the engine could not load the data"}
                continue
            entry = {}
            if cold:
                runs = []
                for _ in range(args.rounds):
                    drop_caches()
                    runs.append(tpch_run(e, q, args))
                entry["cold"] = median_run(runs)
            entry["warm"] = median_run([tpch_run(e, q, args) for _ in range(args.rounds)])
            rows = None
            for mode in ("warm", "cold"):
                r = entry.get(mode)
                if r is not None:
                    rows = r.pop("rows", None) if rows is None else (r.pop("rows", None) and rows)
                    r.pop("columns", None)
            entry["rows"] = rows
            report["engines"][e][q] = entry
            shown = " ".join(f"{m} " + (entry[m].get("failed") or f"{entry[m]['seconds']:.3f} s "
                                        f"{entry[m]['peak_rss_bytes'] / (1 << 20):.0f} MiB")
                             for m in ("cold", "warm") if m in entry)
            log(f"{q:5} {e:7} {shown}")
        # Answers and ratios.
        s = report["engines"].get("strata", {}).get(q, {})
        d = report["engines"].get("duckdb", {}).get(q, {})
        if s.get("rows") is not None and d.get("rows") is not None:
            diffs = compare_rows(s["rows"], d["rows"], args.rel_tol)
            report["answers"][q] = {"match": not diffs, "rows": len(s["rows"])}
            for x in diffs:
                report["mismatches"].append(dict(query=q, **x))
            log(f"{q:5} answers {'match' if not diffs else 'DIFFER: ' + json.dumps(diffs[:2])}")
        else:
            report["answers"][q] = {"match": None, "why": "an engine failed"}
        rat = {}
        for mode in ("warm", "cold"):
            a, b = s.get(mode, {}), d.get(mode, {})
            if a.get("seconds") and b.get("seconds"):
                rat[f"{mode}_seconds"] = a["seconds"] / b["seconds"]
            if a.get("peak_rss_bytes") and b.get("peak_rss_bytes"):
                rat[f"{mode}_peak_rss"] = a["peak_rss_bytes"] / b["peak_rss_bytes"]
        report["ratios"][q] = rat
    # The issue's RSS target for strata: peak RSS <= pool + 48 MiB.
    limit = args.pool_bytes + (48 << 20)
    st = report["engines"].get("strata", {})
    report["strata_rss_target"] = {"limit_bytes": limit, "met": all(
        r.get("peak_rss_bytes", 0) <= limit for e in st.values() for m, r in e.items() if m in ("warm", "cold") and isinstance(r, dict))}
    # Rows are kept only where they are small enough to read in the report.
    for e in engines:
        for q in queries:
            ent = report["engines"][e].get(q, {})
            if "rows" in ent:
                rows = ent.pop("rows")
                ent["row_count"] = None if rows is None else len(rows)
                if args.keep_rows and rows is not None:
                    ent["rows"] = rows
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    if args.plot:
        try:
            plot_tpch(report, args.plot)
        except ImportError as e:
            # (A lent machine's interpreter may lack matplotlib: the report is written;
            # `--replot` draws it elsewhere.)
            log(f"no plot ({e}): redraw with --tpch --replot {args.out} --plot {args.plot}")
    print(json.dumps({"ratios": report["ratios"], "answers": report["answers"]}))
    return 1 if report["mismatches"] else 0


def plot_tpch(report, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.lines import Line2D
    engines = list(report["engines"].keys())
    queries = report["queries"]
    modes = ["warm", "cold"] if report["cold"].get("measured") else ["warm"]
    panels = [(m, "seconds", f"query seconds, {m} (log scale; lower is better)") for m in modes]
    panels.append(("warm", "peak_rss_bytes", "peak RSS of the query process, MiB"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5))
    width = 0.8 / len(engines)
    for ax, (mode, metric, title) in zip(axes, panels):
        top = 0
        for i, e in enumerate(engines):
            for j, q in enumerate(queries):
                r = report["engines"][e].get(q, {}).get(mode) or report["engines"][e].get(q, {})
                x = j + i * width
                if "failed" in r or r.get(metric) is None:
                    ax.text(x, 0.02 if metric == "seconds" else 0, "fail", rotation=90, ha="center", va="bottom",
                            fontsize=8, color="red", transform=ax.get_xaxis_transform())
                    continue
                y = r[metric] / (1 << 20) if metric == "peak_rss_bytes" else r[metric]
                top = max(top, y)
                ax.bar(x, y, width, color=COLORS.get(e, f"C{i}"))
                if e == "strata" and report["answers"].get(q, {}).get("match") is False:
                    ax.text(x, y, "≠", ha="center", va="bottom", color="red", fontsize=12, fontweight="bold")
        # strata / DuckDB ratio above each query's pair of bars.
        key = f"{mode}_seconds" if metric == "seconds" else f"{mode}_peak_rss"
        for j, q in enumerate(queries):
            v = report["ratios"].get(q, {}).get(key)
            if v is not None:
                # Vertical when there are many queries, so that neighbours do not overlap.
                many = len(queries) > 10
                ax.text(j + width * (len(engines) - 1) / 2, 0.97, f"{v:.1f}×" if many else f"{v:.2f}×", ha="center", va="top",
                        fontsize=7 if many else 8, rotation=90 if many else 0, transform=ax.get_xaxis_transform())
        if metric == "seconds":
            ax.set_yscale("log")
            ax.set_ylim(top=top * (40 if len(queries) > 10 else 6) if top else None)
        else:
            pool = report["pool_bytes"] / (1 << 20)
            ax.axhline(pool, color="black", linestyle="--", linewidth=1)
            ax.axhline(pool + 48, color="tab:blue", linestyle=":", linewidth=1)
            if report.get("python_baseline_rss_bytes"):
                ax.axhline(report["python_baseline_rss_bytes"] / (1 << 20), color="tab:orange", linestyle="-.", linewidth=1)
            ax.set_ylim(top=max(top, pool + 48) * 1.2)
        ax.set_xticks([j + width * (len(engines) - 1) / 2 for j in range(len(queries))])
        ax.set_xticklabels([q.upper() for q in queries], fontsize=7 if len(queries) > 10 else None)
        ax.set_title(title + "\n(figures on top: strata / DuckDB)", fontsize=10)
    handles = [Patch(color=COLORS.get(e, f"C{i}"), label=e) for i, e in enumerate(engines)]
    handles += [Line2D([], [], color="black", linestyle="--", label="pool / memory_limit"),
                Line2D([], [], color="tab:blue", linestyle=":", label="pool + 48 MiB (strata's RSS target)")]
    if report.get("python_baseline_rss_bytes"):
        handles.append(Line2D([], [], color="tab:orange", linestyle="-.", label="python + duckdb process, no query"))
    if any(a.get("match") is False for a in report["answers"].values()):
        handles.append(Line2D([], [], color="red", marker="$≠$", linestyle="", label="strata's answer differs"))
    ok = [a["match"] for a in report["answers"].values()]
    compared = [x for x in ok if x is not None]
    verdict = (f"answers: all {len(ok)} match DuckDB" if all(x is True for x in ok)
               else f"answers: {sum(1 for x in compared if x is True)} of {len(compared)} compared match DuckDB")
    if len(compared) < len(ok):
        verdict += f" ({len(ok) - len(compared)} not compared: an engine failed)"
    fig.suptitle(f"TPC-H SF {report['sf']:g}: strata vs DuckDB {report['duckdb_version']}, pool / memory_limit "
                 f"{report['pool_bytes'] >> 20} MiB, {report['threads']} thread{'s' if report['threads'] != 1 else ''}, each query a fresh process; {verdict}",
                 fontsize=11)
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)


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
    ap.add_argument("--work", help="scratch directory (default target/peers, TPC-H: target/peers-tpch/sfF)")
    ap.add_argument("--strata", default=os.path.join(ROOT, "target", "release", "strata"))
    ap.add_argument("--engines", help="default strata,duckdb,kuzu (TPC-H: strata,duckdb)")
    ap.add_argument("--queries", help="default " + ",".join(QUERIES) + " (TPC-H: " + ",".join(TPCH_QUERIES) + ")")
    ap.add_argument("--out")
    ap.add_argument("--tpch", action="store_true", help="TPC-H mode: strata vs DuckDB on the queries of crates/strata/tests/tpch")
    ap.add_argument("--sf", type=float, default=0.1, help="TPC-H scale factor (default 0.1)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="TPC-H: warm runs, and cold runs, per query and engine (the median run is reported)")
    ap.add_argument("--cold", choices=["auto", "on", "off"], default="auto",
                    help="TPC-H: drop the page cache before a cold run of each query (auto: if this user can)")
    ap.add_argument("--reuse-load", action="store_true",
                    help="TPC-H: keep the databases an earlier run loaded into the same --work (marker files say so)")
    ap.add_argument("--rel-tol", type=float, default=1e-6, help="TPC-H: relative tolerance of numbers in answers")
    ap.add_argument("--keep-rows", action="store_true", help="TPC-H: keep each engine's result rows in the report")
    ap.add_argument("--csv", help=argparse.SUPPRESS)
    ap.add_argument("--no-insertion-order", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--csv-buffer", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--plot")
    ap.add_argument("--replot", metavar="JSON", help="only redraw --plot from an earlier report")
    ap.add_argument("--worker")
    ap.add_argument("--query")
    args = ap.parse_args()
    args.pool_bytes = parse_size(args.pool) if not args.pool.isdigit() else int(args.pool)
    if args.worker:
        fn = {"duckdb": duckdb_worker, "kuzu": kuzu_worker, "baseline": baseline_worker,
              "duckdb-tpch": duckdb_tpch_worker}[args.worker]
        print(json.dumps(fn(args)))
        return
    if args.tpch:
        ensure_venv(["duckdb", "matplotlib"])
        if args.replot:
            with open(args.replot) as f:
                plot_tpch(json.load(f), args.plot)
            return
        args.out = args.out or os.path.join(HERE, "results", "tpch", f"tpch-sf{args.sf:g}-{args.pool_bytes >> 20}MiB.json")
        sys.exit(tpch_main(args))
    args.work = args.work or os.path.join(ROOT, "target", "peers")
    args.engines = args.engines or "strata,duckdb,kuzu"
    args.queries = args.queries or ",".join(QUERIES)
    args.out = args.out or os.path.join(HERE, "results", "peers.json")
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
