//! The probe side of a hash join read a leaf at a time (inner and left joins, and semi
//! and anti joins that build on the right), when it is a scan whose filter is evaluated
//! leaf-wise and whose join keys are plain columns.
//!
//! For each batch of rows that pass (see [`ColScan::run_batches`]) the keys are encoded
//! straight from the leaf and hashed, then the rows' directory words and first chain
//! entries are read in one loop (independent loads, which the processor overlaps, where
//! row at a time each cache miss waited for the one before), then the rows are probed in
//! their order. A row's columns are decoded into the joined row only when it is output
//! (see [`Probe::Leaf`]); no row of the probe side is built as values first.

use super::slots::Joined;
use super::table::JoinTable;
use super::{Ctx, Probe, Sink};
use crate::access::table::ColumnType;
use crate::buffer::BufferManager;
use crate::error::Result;
use crate::sql::exec::Plan;
use crate::sql::expr::BExpr;
use crate::sql::rows::{hash_bytes, i64_code, rd64};
use crate::sql::scan::ColScan;

/// The probe plan's scan and its key columns, if the probe can go a leaf at a time: a
/// batchable scan that decodes the key columns and the probe side's kept ones (`pcols`).
pub(super) fn target<'p>(pplan: &'p Plan, pkeys: &[BExpr], pcols: &[usize]) -> Option<(&'p ColScan, Vec<usize>)> {
    let Plan::ColScan(scan) = pplan else { return None };
    if !scan.batchable() {
        return None;
    }
    let cols = pkeys.iter().map(|k| if let BExpr::Col(c, _) = k { Some(*c) } else { None }).collect::<Option<Vec<usize>>>()?;
    let decoded = scan.needed();
    cols.iter().chain(pcols).all(|c| decoded.contains(c)).then_some((scan, cols))
}

/// Probes `table` with the rows `from..to` of `scan` (keys: columns `kcols`), a leaf at a
/// time. `false` if the sink asked to stop.
#[allow(clippy::too_many_arguments)]
pub(super) fn probe(
    bm: &BufferManager,
    scan: &ColScan,
    kcols: &[usize],
    from: u64,
    to: u64,
    ctx: &Ctx<'_>,
    table: &JoinTable<'_>,
    jr: &mut Joined,
    sink: &mut Sink<'_>,
) -> Result<bool> {
    // Per row of the batch: its index in the leaf, its key's hash (None: a NULL key) and
    // where its key lies in `keys`.
    let mut rows: Vec<(usize, Option<u64>, std::ops::Range<usize>)> = Vec::new();
    let mut keys = Vec::new();
    let one_i64 = match kcols {
        [c] if scan.table.schema.columns[*c].ty == ColumnType::I64 => Some(*c),
        _ => None,
    };
    scan.run_batches_range(bm, from, to, &mut |b| {
        rows.clear();
        keys.clear();
        for &i in b.sel {
            let i = i as usize;
            if kcols.iter().any(|&c| b.lf.is_null(c, i)) {
                rows.push((i, None, 0..0));
                continue;
            }
            let at = keys.len();
            match one_i64 {
                // (The encoding of an integer key, as `encode` writes it, from the value.)
                Some(c) => keys.extend_from_slice(&i64_code(b.lf.i64_at(c, i))),
                None => b.encode(i, kcols, &mut keys)?,
            }
            rows.push((i, Some(hash_bytes(&keys[at..])), at..keys.len()));
        }
        // One shared latch on the table for the batch (not two atomic operations per
        // row), where a claim allows keeping it while the batch's rows go on to the
        // operators above (see [`super::Claim`]); else the look-ups are only touched under
        // it, and each row's probe latches the table again.
        let (held, _claim) = super::hold(bm, table)?;
        {
            let g;
            let d = match held.as_ref() {
                Some(h) => h.data(),
                None => {
                    g = table.page.shared()?;
                    g.data()
                }
            };
            let mut touched = 0u64;
            for h in rows.iter().filter_map(|r| r.1) {
                let head = table.head(d, h);
                if head != 0 && head + 11 <= d.len() {
                    touched ^= rd64(d, head + 3);
                }
            }
            std::hint::black_box(touched);
        }
        let d = held.as_ref().map(|g| g.data());
        for (i, h, k) in rows.iter().cloned() {
            let go = match h {
                Some(h) => ctx.probe(table, d, jr, Probe::Leaf(b, i), &keys[k], h, false, true, sink)?.0,
                None => ctx.null_probe(jr, Probe::Leaf(b, i), sink)?,
            };
            if !go {
                return Ok(false);
            }
        }
        Ok(true)
    })
}
