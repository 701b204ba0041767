#!/usr/bin/env bash
# The fuzz campaign (issue 17 item 1): every structure-aware target of
# crates/strata/tests/fuzz/targets.rs run by the bounded driver (tests/fuzz_targets.rs) with
# a large execution count, one target (one process) at a time. Writes one JSON line per
# target to bench/results/fuzz/campaign.jsonl and the summary bench/results/fuzz/campaign.json.
#
#   bench/fuzz_campaign.sh                 # the committed campaign's counts
#   SCALE=0.1 bench/fuzz_campaign.sh       # a tenth of them
#   STRATA_FUZZ_SEED=7 bench/fuzz_campaign.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=bench/results/fuzz
mkdir -p "$out"
scale=${SCALE:-1}
seed=${STRATA_FUZZ_SEED:-2026}
# target:executions (cheap decoders get the most; imports and whole databases fewer).
# TARGETS="wal sql" runs only those (their lines are replaced in campaign.jsonl).
counts="meta:3000000 catalog:500000 alloc_table:1000000 page_header:1000000 wal:1000000
doublewrite:1000000 btree_node:3000000 pax_leaf:1000000 edge_list:200000 csr:50000 column:50000
raw_import:100000 csv:100000 parquet:50000 sql:200000 database:30000"

cargo test --release -p strata --test fuzz_targets --no-run >/dev/null 2>&1 || { echo "build failed" >&2; exit 1; }
bin=$(cargo test --release -p strata --test fuzz_targets --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="fuzz_targets" and m.get("executable"): print(m["executable"])')
only=${TARGETS:-}
if [ -z "$only" ]; then rm -f "$out/campaign.jsonl" "$out"/*.log; fi
touch "$out/campaign.jsonl"
start=$(date +%s)
for tc in $counts; do
  t=${tc%%:*}
  if [ -n "$only" ] && [[ " $only " != *" $t "* ]]; then continue; fi
  python3 - "$out/campaign.jsonl" "$t" <<'PY'
import json, sys
path, t = sys.argv[1], sys.argv[2]
rows = [l for l in open(path) if json.loads(l)["target"] != t]
open(path, "w").writelines(rows)
PY
  n=$(python3 -c "print(int(${tc#*:} * $scale))")
  echo "== $t: $n executions" >&2
  if ! STRATA_FUZZ_EXECS=$n STRATA_FUZZ_SEED=$seed STRATA_FUZZ_REPORT="$out/campaign.jsonl" RUST_BACKTRACE=0 \
      "$bin" --exact "$t" --nocapture >"$out/$t.log" 2>&1; then
    echo "{\"target\":\"$t\",\"executions\":null,\"failures\":\"the run failed: see $t.log\"}" >>"$out/campaign.jsonl"
    echo "   FAILED (see $out/$t.log)" >&2
  fi
done
end=$(date +%s)
python3 - "$out" "$seed" "$((end - start))" <<PY
import json, sys, platform, subprocess
out, seed, wall = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
order = [c.split(":")[0] for c in """$counts""".split()]
rows = sorted((json.loads(l) for l in open(f"{out}/campaign.jsonl")), key=lambda r: order.index(r["target"]) if r["target"] in order else 99)
total = sum(r.get("executions") or 0 for r in rows)
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
summary = {
    "what": "structure-aware fuzz campaign, bounded driver tests/fuzz_targets.rs (release build), one target at a time",
    "command": "bench/fuzz_campaign.sh",
    "commit": commit,
    "seed": seed,
    "machine": f"{platform.machine()}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores (shared)",
    "total_executions": total,
    "wall_s": round(sum(r.get("wall_s") or 0 for r in rows), 1),
    "note": "wall_s: the targets' own run times, summed (targets run one at a time on a 2-core machine shared with other builds)",
    "targets": rows,
    "crashes_open": sum(1 for r in rows if r.get("failures")),
}
json.dump(summary, open(f"{out}/campaign.json", "w"), indent=2)
print(f"{total} executions; this invocation took {wall} s; targets with failures: {summary['crashes_open']}")
PY
