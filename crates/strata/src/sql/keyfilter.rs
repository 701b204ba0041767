//! Join filters pushed into scans: while a hash join probes its table with the rows of a
//! table scan, the scan drops the rows whose join key cannot be in the table, a leaf at a
//! time, before it decodes them into rows (sideways information passing; DuckDB's and
//! Umbra's join filters).
//!
//! The filter is a one-bit-per-key Bloom filter of the build side's key hashes (the
//! hashes the join computes, of the keys' encodings: [`super::rows::hash_bytes`] of
//! [`super::rows::encode_value`]s), sized at 16 bits per key and at most [`MAX_BITS`] bits
//! (about 6 % false positives per probe while the build side has at most 512 Ki keys).
//! It is kept on the heap: it is small and bounded, and the hash table it summarizes fits
//! a fraction of the pool anyway.
//!
//! A join installs it only where a probe row without a match produces nothing (inner and
//! semi joins, and the joins that mark a left build side), on a scan whose key columns
//! reach the join as they are: through projections, filters and groupings on them (a
//! group whose key cannot match is dropped whole, as TPC-H Q20's sums per part and
//! supplier of only the parts the join wants). The scan applies the filter to rows that
//! passed its own conditions (so these fail on the same rows as without it); rows dropped
//! there are not seen by the operators above the scan, so an expression there that would
//! have failed on such a row (an overflow in a group that joins nothing) does not, as in
//! other engines that push join filters down. A NULL key matches nothing and is dropped
//! too.

use std::sync::{Arc, Mutex};

use super::exec::Plan;
use super::expr::BExpr;

/// Bits of a filter at most (1 MiB).
pub const MAX_BITS: usize = 8 << 20;
/// Bits of a filter at least.
const MIN_BITS: usize = 1 << 12;

/// The key hashes of a join's build side, for [`ColScan`](super::scan::ColScan)s to test
/// their rows against.
#[derive(Debug)]
pub struct KeyFilter {
    /// The scan's columns that make the key, in the key's order.
    pub(crate) cols: Vec<usize>,
    bits: Vec<u64>,
    mask: u64,
}

impl KeyFilter {
    /// An empty filter for about `keys` keys, over the scan columns `cols`.
    pub fn new(keys: u64, cols: Vec<usize>) -> KeyFilter {
        let n = usize::try_from(keys.saturating_mul(16)).unwrap_or(MAX_BITS).clamp(MIN_BITS, MAX_BITS).next_power_of_two();
        KeyFilter { cols, bits: vec![0; n / 64], mask: n as u64 - 1 }
    }

    #[inline]
    fn bit(&self, h: u64) -> usize {
        // Bits of the hash that the join table's slot does not use (it takes the low ones).
        (h.rotate_left(24) & self.mask) as usize
    }

    /// Adds a key by its hash.
    pub fn add(&mut self, h: u64) {
        let b = self.bit(h);
        self.bits[b / 64] |= 1 << (b % 64);
    }

    /// Whether a key with hash `h` may be in the build side.
    #[inline]
    pub fn may_contain(&self, h: u64) -> bool {
        let b = self.bit(h);
        self.bits[b / 64] >> (b % 64) & 1 == 1
    }
}

/// Where a join puts its filter for a scan: empty but while the join probes. Cloning a
/// plan gives a clone an empty slot.
#[derive(Default)]
pub struct Slot(Mutex<Option<Arc<KeyFilter>>>);

impl Slot {
    /// The filter installed now, if any.
    pub fn get(&self) -> Option<Arc<KeyFilter>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, f: Option<Arc<KeyFilter>>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = f;
    }
}

impl Clone for Slot {
    fn clone(&self) -> Slot {
        Slot::default()
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.get().is_some() { "Slot(filter)" } else { "Slot(empty)" })
    }
}

/// The scan under `plan` that a filter on the join keys `keys` (expressions over `plan`'s
/// rows) can be pushed into, with the scan columns the keys are: every key a plain
/// column, traced down through projections (a key must be a plain column of the input),
/// filters, and groupings whose output key it is (a group key that is a plain column:
/// dropping the rows of a group drops exactly the group) to a column scan.
pub fn target<'p>(plan: &'p Plan, keys: &[BExpr]) -> Option<(&'p super::scan::ColScan, Vec<usize>)> {
    let mut cols = Vec::with_capacity(keys.len());
    for k in keys {
        match k {
            BExpr::Col(c, _) => cols.push(*c),
            _ => return None,
        }
    }
    let through = |cols: &mut Vec<usize>, exprs: &[BExpr]| -> Option<()> {
        for c in cols.iter_mut() {
            match exprs.get(*c) {
                Some(BExpr::Col(i, _)) => *c = *i,
                _ => return None,
            }
        }
        Some(())
    };
    let mut plan = plan;
    loop {
        match plan {
            Plan::ColScan(s) => return (cols.iter().all(|&c| c < s.table.schema.len())).then_some((&**s, cols)),
            Plan::Project { input, exprs } => {
                through(&mut cols, exprs)?;
                plan = input;
            }
            Plan::HashAggregate { input, keys, .. } => {
                through(&mut cols, keys)?;
                plan = input;
            }
            Plan::Filter { input, .. } => plan = input,
            _ => return None,
        }
    }
}

/// Keeps a filter installed in a scan; removes it when dropped (also on an error).
pub struct Installed<'p>(&'p Slot);

impl<'p> Installed<'p> {
    pub fn new(slot: &'p Slot, f: KeyFilter) -> Installed<'p> {
        slot.set(Some(Arc::new(f)));
        Installed(slot)
    }
}

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        self.0.set(None);
    }
}
