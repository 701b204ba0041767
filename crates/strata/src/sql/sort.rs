//! `ORDER BY`: rows with their order-preserving keys ([`super::rows::encode_sort_key`], so
//! comparing is `memcmp`) gathered in one temporary page (an eighth of the pool); when it is
//! full its records are sorted (an index of offsets) and written out as a sorted run
//! ([`RowRun`], temporary pages that are evicted to the scratch file under pressure); at
//! the end the runs are merged, at most [`FANIN`] at a time (more runs: merged into longer
//! runs first). With a small `LIMIT` (at most [`TOP_K_MAX`] rows, offset included) only
//! the best rows are kept, in memory.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::rows::{corrupt, not_temp, rd32, run_payload, work_payload, wr32, Cursor, RowRun};
use crate::access::TempPage;
use crate::buffer::BufferManager;
use crate::error::Result;

/// Most runs merged at once.
pub const FANIN: usize = 16;

/// Largest `LIMIT` (plus `OFFSET`) sorted in memory as a top-k heap.
pub const TOP_K_MAX: u64 = 1000;

/// Record layout in the buffer and in runs: key length u32, row length u32, key, row.
fn parts(rec: &[u8]) -> Result<(&[u8], &[u8])> {
    if rec.len() < 8 {
        return Err(corrupt("short sort record"));
    }
    let (k, r) = (rd32(rec, 0) as usize, rd32(rec, 4) as usize);
    if rec.len() != 8 + k + r {
        return Err(corrupt("sort record length"));
    }
    Ok((&rec[8..8 + k], &rec[8 + k..]))
}

/// An external sort (or a top-k heap).
pub struct Sorter<'a> {
    bm: &'a BufferManager,
    top: Option<usize>,
    heap: BinaryHeap<(Vec<u8>, u64, Vec<u8>)>,
    seq: u64,
    buf: Option<TempPage<'a>>,
    cap: usize,
    bump: usize,
    offs: Vec<u32>,
    runs: Vec<RowRun<'a>>,
    /// Sorted runs written (for tests).
    pub runs_written: u64,
}

impl<'a> Sorter<'a> {
    /// A sort; `top`: only the first `top` rows are wanted (a heap if it is small).
    pub fn new(bm: &'a BufferManager, top: Option<u64>) -> Sorter<'a> {
        let top = top.filter(|&t| t <= TOP_K_MAX).map(|t| t as usize);
        Sorter { bm, top, heap: BinaryHeap::new(), seq: 0, buf: None, cap: 0, bump: 0, offs: Vec::new(), runs: Vec::new(), runs_written: 0 }
    }

    /// Adds a row (`row`, encoded) with its sort key.
    pub fn push(&mut self, key: &[u8], row: &[u8]) -> Result<()> {
        if let Some(k) = self.top {
            if k == 0 {
                return Ok(());
            }
            self.seq += 1;
            if self.heap.len() < k {
                self.heap.push((key.to_vec(), self.seq, row.to_vec()));
            } else if self.heap.peek().is_some_and(|t| key < t.0.as_slice()) {
                self.heap.pop();
                self.heap.push((key.to_vec(), self.seq, row.to_vec()));
            }
            return Ok(());
        }
        let need = 8 + key.len() + row.len();
        if self.buf.is_none() {
            let (page, g) = TempPage::alloc(self.bm, work_payload(self.bm))?;
            self.cap = g.data().len();
            drop(g);
            self.buf = Some(page);
        }
        if self.bump + need > self.cap && self.bump > 0 {
            self.spill()?;
        }
        if need > self.cap {
            // Larger than the buffer: a run of its own.
            let mut run = RowRun::new(self.bm, run_payload(self.bm));
            run.append(&[&(key.len() as u32).to_le_bytes(), &(row.len() as u32).to_le_bytes(), key, row])?;
            self.runs.push(run);
            self.runs_written += 1;
            super::counters::SORT_RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(());
        }
        let page = self.buf.as_ref().ok_or_else(|| corrupt("no sort buffer"))?;
        let mut g = page.exclusive()?;
        let d = g.data_mut().ok_or_else(not_temp)?;
        let o = self.bump;
        wr32(d, o, key.len() as u32);
        wr32(d, o + 4, row.len() as u32);
        d[o + 8..o + 8 + key.len()].copy_from_slice(key);
        d[o + 8 + key.len()..o + need].copy_from_slice(row);
        self.offs.push(o as u32);
        self.bump += need;
        Ok(())
    }

    /// Sorts the buffer's index.
    fn sort_index(&mut self) -> Result<()> {
        let Some(page) = self.buf.as_ref() else { return Ok(()) };
        let g = page.shared()?;
        let d = g.data();
        let key = |o: u32| {
            let o = o as usize;
            let k = rd32(d, o) as usize;
            &d[o + 8..o + 8 + k]
        };
        self.offs.sort_by(|&a, &b| key(a).cmp(key(b)).then(a.cmp(&b)));
        Ok(())
    }

    /// Writes the buffer as a sorted run and empties it.
    fn spill(&mut self) -> Result<()> {
        if self.offs.is_empty() {
            return Ok(());
        }
        self.sort_index()?;
        let page = self.buf.as_ref().ok_or_else(|| corrupt("no sort buffer"))?;
        let mut run = RowRun::new(self.bm, run_payload(self.bm));
        {
            let g = page.shared()?;
            let d = g.data();
            for &o in &self.offs {
                let o = o as usize;
                let n = 8 + rd32(d, o) as usize + rd32(d, o + 4) as usize;
                run.append(&[&d[o..o + n]])?;
            }
        }
        self.offs.clear();
        self.bump = 0;
        self.runs.push(run);
        self.runs_written += 1;
        super::counters::SORT_RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Hands the rows to `f` in key order; `f` returns `false` to stop.
    pub fn finish(mut self, f: &mut dyn FnMut(&[u8]) -> Result<bool>) -> Result<bool> {
        if self.top.is_some() {
            for (_, _, row) in std::mem::take(&mut self.heap).into_sorted_vec() {
                if !f(&row)? {
                    return Ok(false);
                }
            }
            return Ok(true);
        }
        if self.runs.is_empty() {
            // All in the buffer: sorted in place, read out a row at a time.
            self.sort_index()?;
            let Some(page) = self.buf.take() else { return Ok(true) };
            let mut row = Vec::new();
            for &o in &self.offs {
                {
                    let g = page.shared()?;
                    let d = g.data();
                    let o = o as usize;
                    let (k, r) = (rd32(d, o) as usize, rd32(d, o + 4) as usize);
                    row.clear();
                    row.extend_from_slice(&d[o + 8 + k..o + 8 + k + r]);
                }
                if !f(&row)? {
                    return Ok(false);
                }
            }
            return Ok(true);
        }
        self.spill()?;
        self.buf = None;
        let mut runs = std::mem::take(&mut self.runs);
        while runs.len() > FANIN {
            let group: Vec<RowRun<'a>> = runs.drain(..FANIN).collect();
            let mut out = RowRun::new(self.bm, run_payload(self.bm));
            merge(&group, &mut |rec| {
                out.append(&[rec])?;
                Ok(true)
            })?;
            drop(group);
            runs.push(out);
        }
        merge(&runs, &mut |rec| f(parts(rec)?.1))
    }
}

/// Merges sorted runs, handing each record to `f` in key order (ties: earlier run first).
fn merge(runs: &[RowRun<'_>], f: &mut dyn FnMut(&[u8]) -> Result<bool>) -> Result<bool> {
    let mut cursors = vec![Cursor::default(); runs.len()];
    let mut heads: Vec<Vec<u8>> = vec![Vec::new(); runs.len()];
    let mut heap = BinaryHeap::new();
    for i in 0..runs.len() {
        if runs[i].next(&mut cursors[i], &mut heads[i])? {
            heap.push(Reverse((parts(&heads[i])?.0.to_vec(), i)));
        }
    }
    while let Some(Reverse((_, i))) = heap.pop() {
        if !f(&heads[i])? {
            return Ok(false);
        }
        if runs[i].next(&mut cursors[i], &mut heads[i])? {
            heap.push(Reverse((parts(&heads[i])?.0.to_vec(), i)));
        }
    }
    Ok(true)
}
