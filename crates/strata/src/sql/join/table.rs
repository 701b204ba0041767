//! A chunk of a hash join's build side as a hash table in one temporary page, and a
//! bitmap of probe rows in temporary pages.

use super::super::keyfilter::KeyFilter;
use super::super::rows::{corrupt, not_temp, rd32, rd64, run_payload, wr32, wr64, Cursor, RowRun};
use crate::access::TempPage;
use crate::buffer::BufferManager;
use crate::error::Result;

/// The first bytes of a `(hash, key length, key, row)` record (see [`split`]): the hash and
/// the key's length; the key and the row follow.
pub(super) fn record_head(h: u64, key: &[u8]) -> [u8; 12] {
    let mut head = [0u8; 12];
    head[..8].copy_from_slice(&h.to_le_bytes());
    head[8..].copy_from_slice(&(key.len() as u32).to_le_bytes());
    head
}

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
///
/// The page starts with `nslots` directory words, then the entries. A directory word holds
/// the offset plus one of its chain's first entry in its low `obits` bits (0: empty) and,
/// in the bits above, a small Bloom filter of the chain's hashes (one bit per entry,
/// chosen by the hash's top bits; Umbra's tagged pointers): a probe whose bit is clear
/// has no match without reading an entry, so most probes that match nothing cost one
/// read of the directory (which is small enough to stay in cache) instead of a cache
/// miss on an entry.
pub(super) struct JoinTable<'a> {
    pub(super) page: TempPage<'a>,
    pub(super) nslots: usize,
    pub(super) count: u64,
    obits: u32,
}

/// The directory bit of hash `h` for a table whose offsets take `obits` bits (none when
/// no bit is left above them: every probe reads the chain).
#[inline]
fn tag(h: u64, obits: u32) -> u32 {
    match 32 - obits {
        0 => 0,
        t => 1 << (obits + ((h >> 58) as u32 % t)),
    }
}

impl<'a> JoinTable<'a> {
    /// The `count` records of `run` from `start` (`bytes` of them with length words).
    /// The table of the `count` records of `run` from `start`; their key hashes also go
    /// into `filter`, if given.
    pub(super) fn build(
        bm: &'a BufferManager,
        run: &RowRun<'_>,
        start: Cursor,
        count: u64,
        bytes: u64,
        mut filter: Option<&mut KeyFilter>,
    ) -> Result<JoinTable<'a>> {
        let nslots = (count.max(1)).next_power_of_two() as usize;
        let payload = nslots * 4 + bytes as usize + count as usize * 8;
        let (page, mut g) = TempPage::alloc(bm, payload)?;
        let obits;
        {
            let d = g.data_mut().ok_or_else(not_temp)?;
            obits = 64 - (d.len() as u64 + 1).leading_zeros();
            if obits > 32 {
                return Err(corrupt("join table page too large for its offsets"));
            }
            let omask = Self::omask(obits);
            // The directory is zero already (a fresh page); written once before it is read,
            // so that its first touch is a write fault, not a read fault (which maps the
            // zero page) and then a second fault to copy it.
            d[..nslots * 4].fill(0);
            let (mut at, mut taken) = (nslots * 4, 0u64);
            if count > 0 {
                run.scan(&mut { start }, &mut |_, rec| {
                    let (h, key, row) = split(rec)?;
                    if let Some(f) = filter.as_deref_mut() {
                        f.add(key);
                    }
                    let slot = (h as usize) & (nslots - 1);
                    let need = HDR + key.len() + row.len();
                    if at + need > d.len() {
                        return Err(corrupt("join table overflow"));
                    }
                    let w = rd32(d, slot * 4);
                    wr32(d, at, w & omask);
                    wr64(d, at + 4, h);
                    wr32(d, at + 12, key.len() as u32);
                    wr32(d, at + 16, row.len() as u32);
                    d[at + HDR..at + HDR + key.len()].copy_from_slice(key);
                    d[at + HDR + key.len()..at + need].copy_from_slice(row);
                    wr32(d, slot * 4, (w & !omask) | tag(h, obits) | (at + 1) as u32);
                    at += need;
                    taken += 1;
                    Ok(taken < count)
                })?;
            }
            if taken < count {
                return Err(corrupt("join build run ended early"));
            }
        }
        drop(g);
        Ok(JoinTable { page, nslots, count, obits })
    }

    fn omask(obits: u32) -> u32 {
        if obits >= 32 {
            u32::MAX
        } else {
            (1 << obits) - 1
        }
    }

    /// The offset plus one of the first entry of the chain of hash `h` in the table's
    /// bytes `d` (0: no entry can match `h`).
    #[inline]
    pub(super) fn head(&self, d: &[u8], h: u64) -> usize {
        let w = rd32(d, (h as usize & (self.nslots - 1)) * 4);
        let t = tag(h, self.obits);
        if w & t != t {
            return 0;
        }
        (w & Self::omask(self.obits)) as usize
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
