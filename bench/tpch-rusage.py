#!/usr/bin/env python3
"""CPU and context switches of TPC-H queries per thread count: for each query, thread count
and environment setting, one fresh `strata sql --json` process; prints one JSON line with the
query's own seconds and the process's user and system CPU, voluntary and involuntary
context switches and peak RSS (wait4). For telling apart a query that waits (I/O, a serial
phase: CPU well under threads x seconds) from one that computes, on a machine without perf.

    bench/tpch-rusage.py STRATA_BIN DB "q1 q6" "1 2 4 8 16" [NAME=VALUE ...] [--pool 64MiB]
"""
import json
import os
import subprocess
import sys

SQL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "strata", "tests", "tpch")


def main(argv):
    pool = "64MiB"
    if "--pool" in argv:
        i = argv.index("--pool")
        pool = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    binp, db, queries, threads = argv[:4]
    settings = argv[4:] or [""]
    for q in queries.split():
        for t in threads.split():
            for setting in settings:
                env = dict(os.environ)
                if setting:
                    name, value = setting.split("=", 1)
                    env[name] = value
                p = subprocess.Popen([binp, "sql", db, "--pool", pool, "--threads", t, "--json", "--file", os.path.join(SQL, q + ".sql")],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
                out = p.stdout.read()
                _, status, ru = os.wait4(p.pid, 0)
                try:
                    seconds = json.loads(out)["seconds"]
                except (ValueError, KeyError):
                    seconds = None
                print(json.dumps({"query": q, "threads": int(t), "setting": setting, "seconds": seconds, "user": ru.ru_utime, "sys": ru.ru_stime,
                                  "voluntary_switches": ru.ru_nvcsw, "involuntary_switches": ru.ru_nivcsw, "peak_rss_kib": ru.ru_maxrss,
                                  "exit": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
