//! A chunk of a hash join's build side as a hash table in one temporary page, and a
//! bitmap of probe rows in temporary pages.

use super::super::rows::{corrupt, not_temp, rd32, rd64, run_payload, wr32, wr64, Cursor, RowRun};
use crate::access::TempPage;
use crate::buffer::BufferManager;
use crate::error::Result;

/// Splits a `(hash, key length, key, row)` record.
pub(super) fn split(rec: &[u8]) -> Result<(u64, &[u8], &[u8])> {
    if rec.len() < 12 {
        return Err(corrupt("short join record"));
    }
    let k = rd32(rec, 8) as usize;
    let key = rec.get(12..12 + k).ok_or_else(|| corrupt("join record key"))?;
    Ok((rd64(rec, 0), key, &rec[12 + k..]))
}

/// Entry: next u32, hash u64, key length u32, row length u32, key, row.
pub(super) const HDR: usize = 20;

/// A chunk of the build side as a hash table in one temporary page.
pub(super) struct JoinTable<'a> {
    pub(super) page: TempPage<'a>,
    pub(super) nslots: usize,
    pub(super) count: u64,
}

/// The bit of an entry's row length that marks it matched (semi and anti joins that
/// build on the left side).
pub(super) const MARK: u32 = 1 << 31;

impl<'a> JoinTable<'a> {
    /// The `count` records of `run` from `start` (`bytes` of them with length words).
    pub(super) fn build(bm: &'a BufferManager, run: &RowRun<'_>, start: Cursor, count: u64, bytes: u64) -> Result<JoinTable<'a>> {
        let nslots = (count.max(1)).next_power_of_two() as usize;
        let payload = nslots * 4 + bytes as usize + count as usize * 8;
        let (page, mut g) = TempPage::alloc(bm, payload)?;
        {
            let d = g.data_mut().ok_or_else(not_temp)?;
            let (mut cur, mut rec, mut at) = (start, Vec::new(), nslots * 4);
            for _ in 0..count {
                if !run.next(&mut cur, &mut rec)? {
                    return Err(corrupt("join build run ended early"));
                }
                let (h, key, row) = split(&rec)?;
                let slot = (h as usize) & (nslots - 1);
                let need = HDR + key.len() + row.len();
                if at + need > d.len() {
                    return Err(corrupt("join table overflow"));
                }
                wr32(d, at, rd32(d, slot * 4));
                wr64(d, at + 4, h);
                wr32(d, at + 12, key.len() as u32);
                wr32(d, at + 16, row.len() as u32);
                d[at + HDR..at + HDR + key.len()].copy_from_slice(key);
                d[at + HDR + key.len()..at + need].copy_from_slice(row);
                wr32(d, slot * 4, (at + 1) as u32);
                at += need;
            }
        }
        drop(g);
        Ok(JoinTable { page, nslots, count })
    }
}

/// One bit per probe row, in temporary pages (matched in an earlier chunk?).
pub(super) struct TempBits<'a> {
    pages: Vec<TempPage<'a>>,
    per: usize,
}

impl<'a> TempBits<'a> {
    pub(super) fn new(bm: &'a BufferManager, n: u64) -> Result<TempBits<'a>> {
        let payload = run_payload(bm);
        let per = payload * 8;
        let mut pages = Vec::new();
        for _ in 0..(n as usize).div_ceil(per) {
            let (p, g) = TempPage::alloc(bm, payload)?;
            drop(g);
            pages.push(p);
        }
        Ok(TempBits { pages, per })
    }
    pub(super) fn get(&self, i: u64) -> Result<bool> {
        let (p, b) = ((i as usize) / self.per, (i as usize) % self.per);
        let g = self.pages.get(p).ok_or_else(|| corrupt("bitmap index"))?.shared()?;
        Ok(g.data()[b / 8] & (1 << (b % 8)) != 0)
    }
    pub(super) fn set(&self, i: u64) -> Result<()> {
        let (p, b) = ((i as usize) / self.per, (i as usize) % self.per);
        let mut g = self.pages.get(p).ok_or_else(|| corrupt("bitmap index"))?.exclusive()?;
        g.data_mut().ok_or_else(not_temp)?[b / 8] |= 1 << (b % 8);
        Ok(())
    }
}
