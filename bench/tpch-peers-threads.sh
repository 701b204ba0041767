#!/usr/bin/env bash
# strata vs DuckDB on TPC-H at several thread counts (issue 15: "at least as fast as DuckDB
# ... on the same machine and thread count"), for a lent many-core machine: generates the
# data once, loads both engines once, then runs `bench/peers.py --tpch` per thread count
# (--reuse-load), each query of each engine in a fresh process, answers checked against
# DuckDB's. Cold runs where the page cache can be dropped (root outside a sandbox), else
# warm only (the report's "cold" says why).
#
#   bench/tpch-peers-threads.sh STRATA_BIN OUT_DIR [SF] [POOL]
#
# Environment: THREADS (default 1,2,4,8,16), QUERIES (peers.py's --queries, comma-separated;
# default all 22), ROUNDS (default 1), WORK (data and databases; default a temporary
# directory), PYTHON (an interpreter that can import duckdb; default python3; peers.py
# re-executes itself in bench/.venv).
# Writes OUT_DIR/machine.txt and OUT_DIR/tpch-sfSF-POOL-tN.json + .png per thread count;
# bench/tpch_threads_table.py turns them into a markdown table.
set -u
BIN=$(realpath "$1")
OUT=$2
SF=${3:-1}
POOL=${4:-64MiB}
THREADS=${THREADS:-1,2,4,8,16}
ROUNDS=${ROUNDS:-1}
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
W=${WORK:-$(mktemp -d)}
mkdir -p "$OUT"
"$HERE/machine-info.sh" "sf: $SF, pool: $POOL, rounds: $ROUNDS, threads: $THREADS" > "$OUT/machine.txt" 2>&1
for t in ${THREADS//,/ }; do
    t0=$SECONDS
    "$PY" "$HERE/peers.py" --tpch --sf "$SF" --pool "$POOL" --threads "$t" --rounds "$ROUNDS" \
        --reuse-load --work "$W" --strata "$BIN" ${QUERIES:+--queries "$QUERIES"} \
        --out "$OUT/tpch-sf$SF-$POOL-t$t.json" --plot "$OUT/tpch-sf$SF-$POOL-t$t.png" > /dev/null
    echo "threads $t: exit $?, $((SECONDS - t0)) s" | tee -a "$OUT/machine.txt"
done
[ -z "${WORK:-}" ] && rm -rf "$W"
exit 0
