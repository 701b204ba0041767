//! The allocation table: one bitmap per size class, bit `i` set when page `i` of the class
//! is allocated. Disk space is reused only within a class (a freed page's slot is handed out
//! again only as a page of the same size), so a page's bytes are never read as part of a
//! page of another size.
//!
//! The table lives in the database directory as `alloc.table`, a sequence of 4 KiB blocks,
//! each with its own CRC-32C, replaced atomically at every checkpoint. Block layout
//! (little-endian): `crc32c u32 | magic "SAT1" | block no u32 | block count u32 | 4080
//! payload bytes`. The payload stream is `class count u32`, then per class `class u8,
//! word count u32, words u64...`.

use std::path::{Path, PathBuf};

use super::backend::StorageBackend;
use crate::error::{Error, Result};

/// File name of the allocation table.
pub const ALLOC_FILE: &str = "alloc.table";
const BLOCK: usize = 4096;
const BLOCK_HEAD: usize = 16;
const MAGIC: &[u8; 4] = b"SAT1";

/// The allocation bitmap of one size class (or one class's temporary pages).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassBitmap {
    words: Vec<u64>,
    allocated: u64,
    /// Lowest word that may have a clear bit.
    hint: usize,
}

impl ClassBitmap {
    /// Allocates the lowest free index.
    pub fn alloc(&mut self) -> u64 {
        while self.hint < self.words.len() && self.words[self.hint] == u64::MAX {
            self.hint += 1;
        }
        if self.hint == self.words.len() {
            self.words.push(0);
        }
        let w = &mut self.words[self.hint];
        let bit = (!*w).trailing_zeros();
        *w |= 1 << bit;
        self.allocated += 1;
        self.hint as u64 * 64 + bit as u64
    }

    /// Frees `index`; returns false if it was not allocated.
    pub fn free(&mut self, index: u64) -> bool {
        if !self.is_allocated(index) {
            return false;
        }
        let w = (index / 64) as usize;
        self.words[w] &= !(1 << (index % 64));
        self.allocated -= 1;
        self.hint = self.hint.min(w);
        true
    }

    /// Marks `index` allocated; returns false if it already was.
    pub fn set_allocated(&mut self, index: u64) -> bool {
        if self.is_allocated(index) {
            return false;
        }
        let w = (index / 64) as usize;
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << (index % 64);
        self.allocated += 1;
        true
    }

    /// Adds every page allocated in `other`.
    pub fn union_with(&mut self, other: &ClassBitmap) {
        for (i, &w) in other.words.iter().enumerate() {
            if i >= self.words.len() {
                self.words.push(0);
            }
            self.allocated += (w & !self.words[i]).count_ones() as u64;
            self.words[i] |= w;
        }
    }

    /// Whether `index` is allocated.
    pub fn is_allocated(&self, index: u64) -> bool {
        let w = (index / 64) as usize;
        w < self.words.len() && self.words[w] & (1 << (index % 64)) != 0
    }

    /// Number of allocated pages.
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// One past the highest index the bitmap has room for (a bound on allocated indices).
    pub fn capacity(&self) -> u64 {
        self.words.len() as u64 * 64
    }

    /// One past the highest allocated index (0 when empty).
    pub fn high_water(&self) -> u64 {
        match self.words.iter().rposition(|&w| w != 0) {
            Some(i) => i as u64 * 64 + 64 - self.words[i].leading_zeros() as u64,
            None => 0,
        }
    }

    /// Iterates over allocated indices in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                (w != 0).then(|| {
                    let b = w.trailing_zeros();
                    w &= w - 1;
                    i as u64 * 64 + b as u64
                })
            })
        })
    }

    /// The allocated indices as inclusive ranges `(first, last)`, ascending.
    pub fn runs(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for i in self.iter() {
            match out.last_mut() {
                Some((_, last)) if *last + 1 == i => *last = i,
                _ => out.push((i, i)),
            }
        }
        out
    }

    /// The free indices below `end` as inclusive ranges `(first, last)`, ascending.
    pub fn free_runs(&self, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut next = 0;
        for (first, last) in self.runs() {
            if first >= end {
                break;
            }
            if first > next {
                out.push((next, first - 1));
            }
            next = last + 1;
        }
        if next < end {
            out.push((next, end - 1));
        }
        out
    }

    fn from_words(mut words: Vec<u64>) -> ClassBitmap {
        while words.last() == Some(&0) {
            words.pop();
        }
        let allocated = words.iter().map(|w| w.count_ones() as u64).sum();
        ClassBitmap { words, allocated, hint: 0 }
    }

    /// Memory the bitmap takes (counted in the pool budget).
    pub fn memory_bytes(&self) -> u64 {
        self.words.capacity() as u64 * 8
    }
}

/// The allocation bitmaps of all persistent classes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocTable {
    /// Bitmap per class (index = class).
    pub classes: Vec<ClassBitmap>,
}

impl AllocTable {
    /// An empty table for `n` classes.
    pub fn new(n: usize) -> AllocTable {
        AllocTable { classes: vec![ClassBitmap::default(); n] }
    }

    /// Path of the table in database `dir`.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(ALLOC_FILE)
    }

    /// Serialises into checksummed blocks.
    pub fn encode(&self) -> Vec<u8> {
        let mut stream = Vec::new();
        let used: Vec<(usize, &ClassBitmap)> = self.classes.iter().enumerate().filter(|(_, b)| b.allocated > 0).collect();
        stream.extend_from_slice(&(used.len() as u32).to_le_bytes());
        for (class, bm) in used {
            let words = &bm.words[..bm.high_water().div_ceil(64) as usize];
            stream.push(class as u8);
            stream.extend_from_slice(&(words.len() as u32).to_le_bytes());
            for w in words {
                stream.extend_from_slice(&w.to_le_bytes());
            }
        }
        let payload = BLOCK - BLOCK_HEAD;
        let n_blocks = stream.len().div_ceil(payload).max(1);
        let mut out = vec![0u8; n_blocks * BLOCK];
        for (b, block) in out.chunks_exact_mut(BLOCK).enumerate() {
            let chunk = stream.get(b * payload..((b + 1) * payload).min(stream.len())).unwrap_or(&[]);
            block[4..8].copy_from_slice(MAGIC);
            block[8..12].copy_from_slice(&(b as u32).to_le_bytes());
            block[12..16].copy_from_slice(&(n_blocks as u32).to_le_bytes());
            block[BLOCK_HEAD..BLOCK_HEAD + chunk.len()].copy_from_slice(chunk);
            let crc = crc32c::crc32c(&block[4..]);
            block[0..4].copy_from_slice(&crc.to_le_bytes());
        }
        out
    }

    /// Parses and verifies; `n_classes` bounds the class numbers; `path` names errors.
    pub fn decode(bytes: &[u8], n_classes: usize, path: &Path) -> Result<AllocTable> {
        let bad = |reason: String| Error::corruption(path, None, reason);
        if bytes.is_empty() || !bytes.len().is_multiple_of(BLOCK) {
            return Err(bad(format!("allocation table is {} bytes, not a whole number of 4 KiB blocks", bytes.len())));
        }
        let n_blocks = bytes.len() / BLOCK;
        let mut stream = Vec::with_capacity(n_blocks * (BLOCK - BLOCK_HEAD));
        for (b, block) in bytes.chunks_exact(BLOCK).enumerate() {
            let stored = u32::from_le_bytes(block[0..4].try_into().unwrap());
            if crc32c::crc32c(&block[4..]) != stored || &block[4..8] != MAGIC {
                return Err(bad(format!("allocation table block {b} fails its checksum")));
            }
            let no = u32::from_le_bytes(block[8..12].try_into().unwrap()) as usize;
            let count = u32::from_le_bytes(block[12..16].try_into().unwrap()) as usize;
            if no != b || count != n_blocks {
                return Err(bad(format!("allocation table block {b} is out of place (says {no} of {count})")));
            }
            stream.extend_from_slice(&block[BLOCK_HEAD..]);
        }
        let mut r = Reader { s: &stream, at: 0 };
        let mut table = AllocTable::new(n_classes);
        let n = r.u32().ok_or_else(|| bad("truncated allocation table".into()))?;
        let mut seen = vec![false; n_classes];
        for _ in 0..n {
            let class = r.u8().ok_or_else(|| bad("truncated allocation table".into()))? as usize;
            let count = r.u32().ok_or_else(|| bad("truncated allocation table".into()))? as usize;
            if class >= n_classes {
                return Err(bad(format!("allocation table names class {class}, the database has {n_classes}")));
            }
            // A second entry (e.g. a class count that reaches into the zero padding, which
            // reads as "class 0, no words") would silently replace the first bitmap.
            if std::mem::replace(&mut seen[class], true) {
                return Err(bad(format!("allocation table lists class {class} twice")));
            }
            // `count` comes from the file: bound the allocation by what the stream holds.
            let mut words = Vec::with_capacity(count.min(r.remaining() / 8));
            for _ in 0..count {
                words.push(r.u64().ok_or_else(|| bad("truncated allocation table".into()))?);
            }
            table.classes[class] = ClassBitmap::from_words(words);
        }
        Ok(table)
    }

    /// Loads the table of database `dir` (an absent file is an empty table only for a
    /// database that has never checkpointed).
    pub fn load(backend: &dyn StorageBackend, dir: &Path, n_classes: usize) -> Result<AllocTable> {
        let path = AllocTable::path(dir);
        if !backend.exists(&path) {
            return Err(Error::corruption(&path, None, "allocation table file is missing"));
        }
        let bytes = backend.read_file(&path).map_err(|e| Error::io("read", &path, e))?;
        AllocTable::decode(&bytes, n_classes, &path)
    }

    /// Writes the table of database `dir` atomically.
    pub fn store(&self, backend: &dyn StorageBackend, dir: &Path) -> Result<()> {
        let path = AllocTable::path(dir);
        backend.write_atomic(&path, &self.encode()).map_err(|e| Error::io("write", &path, e))
    }
}

struct Reader<'a> {
    s: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn remaining(&self) -> usize {
        self.s.len() - self.at
    }
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let v = self.s.get(self.at..self.at + N)?.try_into().ok()?;
        self.at += N;
        Some(v)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take::<4>().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take::<8>().map(u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_reuses_lowest_free_index() {
        let mut b = ClassBitmap::default();
        for i in 0..130 {
            assert_eq!(b.alloc(), i);
        }
        assert!(b.free(5) && b.free(100));
        assert!(!b.free(5), "double free is refused");
        assert!(!b.free(10_000));
        assert_eq!(b.alloc(), 5);
        assert_eq!(b.alloc(), 100);
        assert_eq!(b.alloc(), 130);
        assert_eq!(b.allocated(), 131);
        assert_eq!(b.high_water(), 131);
        assert_eq!(b.iter().count(), 131);
    }

    #[test]
    fn runs_and_free_runs_are_compact_ranges() {
        let mut b = ClassBitmap::default();
        assert_eq!(b.runs(), vec![]);
        assert_eq!(b.free_runs(0), vec![]);
        assert_eq!(b.free_runs(3), vec![(0, 2)]);
        for i in [0, 1, 2, 5, 63, 64, 65, 200] {
            b.set_allocated(i);
        }
        assert_eq!(b.runs(), vec![(0, 2), (5, 5), (63, 65), (200, 200)]);
        assert_eq!(b.free_runs(b.high_water()), vec![(3, 4), (6, 62), (66, 199)]);
        assert_eq!(b.free_runs(205), vec![(3, 4), (6, 62), (66, 199), (201, 204)]);
        assert_eq!(b.free_runs(10), vec![(3, 4), (6, 9)]);
    }

    #[test]
    fn table_round_trips_across_blocks_and_detects_damage() {
        let mut t = AllocTable::new(8);
        for _ in 0..70_000 {
            t.classes[0].alloc();
        }
        t.classes[0].free(3);
        for _ in 0..5 {
            t.classes[7].alloc();
        }
        let bytes = t.encode();
        assert!(bytes.len() > BLOCK, "spans several blocks");
        let p = Path::new("alloc.table");
        let back = AllocTable::decode(&bytes, 8, p).unwrap();
        assert_eq!(back.classes[0].allocated(), 69_999);
        assert!(!back.classes[0].is_allocated(3));
        assert_eq!(back.classes[7].allocated(), 5);
        let mut bad = bytes.clone();
        bad[BLOCK + 100] ^= 0x10;
        let e = AllocTable::decode(&bad, 8, p).unwrap_err().to_string();
        assert!(e.contains("block 1"), "{e}");
        assert!(AllocTable::decode(&bytes[..BLOCK], 8, p).is_err(), "truncated");
        assert!(AllocTable::decode(&bytes, 4, p).is_err(), "class out of range");
    }
}
