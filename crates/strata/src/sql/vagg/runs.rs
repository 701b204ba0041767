//! Streaming aggregation of runs of equal keys, for a grouping by one integer or date
//! column of a table stored in the key's order (TPC-H's lineitem by `l_orderkey`).
//!
//! Rows are folded into the state of the current run while the key stays the same; when
//! it changes, the run is a finished group. As long as each run's key is larger than the
//! run's before (per morsel: a worker's rows `from..to`), a finished group can share its
//! key with no other, except for the first and the last run of a morsel (whose key may
//! continue in the morsels beside it) and provided the morsels' key ranges do not overlap,
//! which is only known at the end. So the groups in the middle of a morsel go to a
//! [`Distinct`] run of temporary pages (one record each, no hash table), the others to the
//! hash aggregation, which merges them; at the end, if every morsel's keys rose and each
//! morsel's last key is at most the next one's first, the [`Distinct`] groups are
//! [`HashAgg::adopt`]ed as they are, else pushed into the hash aggregation like any other
//! group ([`HashAgg::merge_in`]; with several workers, each worker's into its own partial
//! aggregation before those are merged): the result never depends on the order of the input.
//!
//! The first run key that is not larger than the one before, or a batch whose arguments
//! cannot be computed as vectors, turns the streaming off for the rest of that worker's
//! input: its rows go through the pre-aggregation ([`GroupCache`]) as before, and the
//! proof has failed. A NULL key is a group of its own, pushed to the hash aggregation
//! once per batch. Decisions depend only on the worker's own rows, so with the same
//! number of workers every run merges partial states in the same order (f64 sums agree
//! to the last bit from run to run).

use super::super::agg::{encode_states, BatchItem, Distinct, HashAgg, St};
use super::super::rows::{encode_value, hash_bytes};
use super::{Grouping, Prog};
use crate::access::table::{ColumnType, Value};
use crate::buffer::BufferManager;
use crate::error::Result;
use crate::sql::scan::Batch;

/// Flips the sign bit: i64 order as u64 order.
const SIGN: u64 = 1 << 63;

/// Whether a grouping by the columns `key_cols` (of types `ty`) can stream runs.
pub(super) fn streamable(key_cols: &[usize], ty: impl Fn(usize) -> ColumnType) -> bool {
    matches!(key_cols, [c] if matches!(ty(*c), ColumnType::I64 | ColumnType::Date))
}

/// One worker's streaming state.
pub(super) struct Runs<'a> {
    /// The key is a date (else an i64).
    date: bool,
    /// Off for the rest of the input (see the module documentation).
    failed: bool,
    /// The current run's key code (`None`: no run yet in this morsel).
    cur: Option<u64>,
    /// Whether the current run is its morsel's first.
    cur_first: bool,
    cur_states: Vec<St>,
    /// This morsel's first key code.
    first: Option<u64>,
    /// Per morsel with a non-NULL key: its first row, first and last key code.
    morsels: Vec<(u64, u64, u64)>,
    out: Distinct<'a>,
    // Per batch: the group of each row (0: NULL key, 1...: the runs in order), every
    // group's states, each run's key code, the groups for the hash aggregation.
    gids: Vec<u32>,
    states: Vec<St>,
    keys: Vec<u64>,
    codes: Vec<u64>,
    ok: Vec<bool>,
    bb: Vec<u8>,
    items: Vec<BatchItem>,
    kb: Vec<u8>,
}

impl<'a> Runs<'a> {
    pub(super) fn new(bm: &'a BufferManager, date: bool) -> Runs<'a> {
        Runs {
            date,
            failed: false,
            cur: None,
            cur_first: false,
            cur_states: Vec::new(),
            first: None,
            morsels: Vec::new(),
            out: Distinct::new(bm),
            gids: Vec::new(),
            states: Vec::new(),
            keys: Vec::new(),
            codes: Vec::new(),
            ok: Vec::new(),
            bb: Vec::new(),
            items: Vec::new(),
            kb: Vec::new(),
        }
    }

    /// Whether batches still stream.
    pub(super) fn on(&self) -> bool {
        !self.failed
    }

    /// The code of a key whose [`small_codes`](crate::sql::scan::LeafView::small_codes) code is
    /// `c`: ordered as the keys are.
    #[inline]
    fn order(&self, c: u64) -> u64 {
        let v = if self.date { i64::from(c as u32 as i32) } else { c as i64 };
        (v as u64) ^ SIGN
    }

    /// The encoded key of code `code` (see [`order`](Self::order)) into `kb`.
    fn key(&mut self, code: u64) {
        self.kb.clear();
        let v = (code ^ SIGN) as i64;
        let v = if self.date { Value::Date(v as i32) } else { Value::I64(v) };
        encode_value(&v, &mut self.kb);
    }

    /// Queues a group for the hash aggregation.
    fn queue_hashed(&mut self, key: Option<u64>, states: &[St]) {
        match key {
            Some(c) => self.key(c),
            None => {
                self.kb.clear();
                encode_value(&Value::Null, &mut self.kb);
            }
        }
        let at = self.bb.len();
        self.bb.extend_from_slice(&self.kb);
        encode_states(states, &mut self.bb);
        self.items.push(BatchItem { hash: hash_bytes(&self.kb), at, klen: self.kb.len(), slen: self.bb.len() - at - self.kb.len() });
    }

    fn push_queued(&mut self, main: &mut HashAgg<'_>) -> Result<()> {
        if !self.items.is_empty() {
            main.push_batch(&self.bb, &self.items)?;
            self.bb.clear();
            self.items.clear();
        }
        Ok(())
    }

    /// Turns the streaming off: the current run goes to the hash aggregation.
    pub(super) fn stop(&mut self, main: &mut HashAgg<'_>) -> Result<()> {
        self.failed = true;
        if let Some(c) = self.cur.take() {
            let st = std::mem::take(&mut self.cur_states);
            self.queue_hashed(Some(c), &st);
            self.push_queued(main)?;
        }
        Ok(())
    }

    /// One batch, its arguments computed as vectors (`prog.eval` succeeded).
    pub(super) fn batch(&mut self, g: &Grouping<'_>, prog: &mut Prog, b: &Batch<'_>, main: &mut HashAgg<'_>) -> Result<()> {
        let n = g.kinds.len();
        let len = b.sel.len();
        let empty = |s: &mut Vec<St>| s.extend(g.kinds.iter().map(|k| St::empty(k.kind)));
        self.codes.resize(len, 0);
        self.ok.clear();
        self.ok.resize(len, true);
        b.lf.small_codes(g.key_cols[0], b.sel, &mut self.codes[..len], &mut self.ok);
        self.gids.clear();
        self.states.clear();
        self.keys.clear();
        empty(&mut self.states);
        self.keys.push(0);
        // The run carried over from the batch before is group 1.
        let carried = self.cur.is_some();
        // (0: none; group 0 is the NULL key's)
        let mut first_run = if carried && self.cur_first { 1 } else { 0 };
        if let Some(c) = self.cur {
            self.states.append(&mut self.cur_states);
            self.keys.push(c);
        }
        let mut nulls = false;
        for k in 0..len {
            if !self.ok[k] {
                nulls = true;
                self.gids.push(0);
                continue;
            }
            let c = self.order(self.codes[k]);
            if self.cur != Some(c) {
                match self.cur {
                    Some(p) if c < p => self.failed = true,
                    Some(_) => {}
                    None => {
                        self.first = Some(c);
                        first_run = self.keys.len();
                    }
                }
                self.cur = Some(c);
                self.keys.push(c);
                empty(&mut self.states);
            }
            self.gids.push((self.keys.len() - 1) as u32);
        }
        let runs = self.keys.len() - 1;
        if runs == 0 && !nulls {
            return Ok(());
        }
        prog.merge_rows(0..len, Some(&self.gids), &mut self.states, &g.kinds)?;
        let mut states = std::mem::take(&mut self.states);
        if nulls {
            self.queue_hashed(None, &states[..n]);
        }
        // Every run but the last is finished.
        for r in 1..runs {
            let st = &states[r * n..(r + 1) * n];
            if self.failed || r == first_run {
                self.queue_hashed(Some(self.keys[r]), st);
            } else {
                self.key(self.keys[r]);
                self.out.push(&self.kb, st)?;
            }
        }
        if runs > 0 {
            self.cur_first = first_run == runs;
            self.cur_states.clear();
            self.cur_states.extend(states.drain(runs * n..));
        }
        debug_assert!(runs > 0 || !carried);
        self.states = states;
        self.push_queued(main)?;
        if self.failed {
            self.stop(main)?;
        }
        Ok(())
    }

    /// The end of the morsel that began at row `from`: its last run goes to the hash
    /// aggregation.
    pub(super) fn end_morsel(&mut self, from: u64, main: &mut HashAgg<'_>) -> Result<()> {
        if let (Some(first), Some(last)) = (self.first.take(), self.cur) {
            self.morsels.push((from, first, last));
        }
        if let Some(c) = self.cur.take() {
            let st = std::mem::take(&mut self.cur_states);
            self.queue_hashed(Some(c), &st);
            self.push_queued(main)?;
        }
        Ok(())
    }

    /// The groups held, for merging (not proven distinct).
    pub(super) fn into_groups(self) -> Distinct<'a> {
        debug_assert!(self.cur.is_none());
        self.out
    }

    /// Hands the groups held to `main` (adopted if `proven`, else merged).
    pub(super) fn finish(self, proven: bool, main: &mut HashAgg<'a>) -> Result<()> {
        debug_assert!(self.cur.is_none());
        if self.out.is_empty() {
            return Ok(());
        }
        if proven {
            main.adopt(self.out)
        } else {
            main.merge_in(self.out)
        }
    }
}

/// Whether the groups of every worker's [`Distinct`] run are distinct from every other
/// group: no worker stopped streaming, and the morsels' key ranges, in row order, do not
/// overlap (one morsel's last key may be the next one's first: both went to the hash
/// aggregation).
pub(super) fn proven(workers: &[&Runs<'_>]) -> bool {
    if workers.iter().any(|w| w.failed) {
        return false;
    }
    let mut ms: Vec<(u64, u64, u64)> = workers.iter().flat_map(|w| w.morsels.iter().copied()).collect();
    ms.sort_unstable_by_key(|m| m.0);
    ms.windows(2).all(|w| w[0].2 <= w[1].1)
}
