//! FSST-style string compression for packed leaves (after Boncz, Neumann and Leis, "FSST:
//! Fast Random Access String Compression", VLDB 2020; our own code and a simplified
//! variant).
//!
//! A symbol table holds up to 255 symbols of 1 to 8 bytes; a string is compressed to a
//! sequence of 1-byte codes: code `c < 255` stands for symbol `c`, and [`ESC`] is followed by
//! one literal byte. Compression is greedy: at each position the longest symbol the lookup
//! finds (one symbol of 3 or more bytes per 3-byte prefix, one per 2-byte prefix, one per
//! byte), else an escape. Decoding is a loop of table lookups that writes 8 bytes per code.
//!
//! The table is trained on a sample of the block's own strings in a few generations (as in
//! the paper): compress the sample with the current table, count how often each symbol (or
//! escaped byte) and each pair of consecutive ones occurs, and keep the 255 candidates
//! (symbols and concatenations of pairs, cut to 8 bytes) that cover the most bytes.
//! Training and compression are deterministic: the same strings give the same table and
//! the same codes, which is what lets a packer's size estimate equal the encoded size.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use super::packed::FastHasher;
use super::pax::align8;
use crate::buffer::Restart;

/// The escape code: the next byte is a literal.
pub const ESC: u8 = 255;
/// The most symbols of a table.
pub const MAX_SYMBOLS: usize = 255;
/// Training generations.
const GENERATIONS: usize = 5;
/// Slots of each lookup hash (at most [`MAX_SYMBOLS`] used, so probes are short).
const SLOTS: usize = 1024;
const EMPTY: u32 = u32::MAX;

/// The low `l` bytes of a word.
#[inline(always)]
fn mask(l: usize) -> u64 {
    if l >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * l)) - 1
    }
}

/// Up to 8 bytes of `s` from `p` (`p < s.len()`), little-endian, zero padded.
#[inline(always)]
fn load(s: &[u8], p: usize) -> u64 {
    match s.get(p..p + 8) {
        Some(b) => u64::from_le_bytes(b.try_into().unwrap()),
        None => {
            let mut t = [0u8; 8];
            let r = &s[p..];
            t[..r.len()].copy_from_slice(r);
            u64::from_le_bytes(t)
        }
    }
}

/// An open-addressing hash from a 2- or 3-byte prefix (`key` < 2^24) to a code (< 255):
/// each slot holds `key | code << 24`, never [`EMPTY`].
#[derive(Clone)]
struct Slots {
    slot: Box<[u32; SLOTS]>,
    used: Vec<u16>,
}

impl Slots {
    fn new() -> Self {
        Slots { slot: Box::new([EMPTY; SLOTS]), used: Vec::new() }
    }
    #[inline(always)]
    fn home(key: u32) -> usize {
        (key.wrapping_mul(0x9E37_79B1) >> 22) as usize & (SLOTS - 1)
    }
    #[inline(always)]
    fn get(&self, key: u32) -> Option<u8> {
        let mut h = Self::home(key);
        loop {
            let e = self.slot[h];
            if e == EMPTY {
                return None;
            }
            if e & 0xFF_FFFF == key {
                return Some((e >> 24) as u8);
            }
            h = (h + 1) & (SLOTS - 1);
        }
    }
    /// Inserts `key` unless present; whether it was inserted.
    fn insert(&mut self, key: u32, code: u8) -> bool {
        debug_assert!(key < 1 << 24 && code != ESC);
        let mut h = Self::home(key);
        loop {
            let e = self.slot[h];
            if e == EMPTY {
                self.slot[h] = key | (code as u32) << 24;
                self.used.push(h as u16);
                return true;
            }
            if e & 0xFF_FFFF == key {
                return false;
            }
            h = (h + 1) & (SLOTS - 1);
        }
    }
    fn clear(&mut self) {
        for &h in &self.used {
            self.slot[h as usize] = EMPTY;
        }
        self.used.clear();
    }
}

/// A symbol table with its compression lookups.
#[derive(Clone)]
pub struct Symbols {
    n: usize,
    /// Symbols by code (256 entries, so that a code indexes without a check).
    sym: [u64; 256],
    len: [u8; 256],
    /// The code of each 1-byte symbol, [`ESC`] for none.
    single: [u8; 256],
    two: Slots,
    long: Slots,
}

impl Symbols {
    fn new() -> Self {
        Symbols { n: 0, sym: [0; 256], len: [0; 256], single: [ESC; 256], two: Slots::new(), long: Slots::new() }
    }

    fn clear(&mut self) {
        self.n = 0;
        self.single = [ESC; 256];
        self.two.clear();
        self.long.clear();
    }

    /// Adds a symbol unless the table is full or the lookup already has one for its
    /// prefix; whether it was added.
    fn push(&mut self, sym: u64, len: usize) -> bool {
        if self.n == MAX_SYMBOLS || !(1..=8).contains(&len) {
            return false;
        }
        let code = self.n as u8;
        let ok = match len {
            1 => {
                let b = sym as u8 as usize;
                let free = self.single[b] == ESC;
                if free {
                    self.single[b] = code;
                }
                free
            }
            2 => self.two.insert(sym as u32 & 0xFFFF, code),
            _ => self.long.insert(sym as u32 & 0xFF_FFFF, code),
        };
        if ok {
            self.sym[self.n] = sym & mask(len);
            self.len[self.n] = len as u8;
            self.n += 1;
        }
        ok
    }

    /// Symbols in the table.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Bytes of the table's stored form ([`Symbols::write`]).
    pub fn stored_bytes(&self) -> usize {
        align8(self.n + self.len[..self.n].iter().map(|&l| l as usize).sum::<usize>())
    }

    /// Appends the stored form: the symbols' lengths (a byte each), their bytes
    /// concatenated, zero padded to 8 bytes.
    pub fn write(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&self.len[..self.n]);
        for c in 0..self.n {
            out.extend_from_slice(&self.sym[c].to_le_bytes()[..self.len[c] as usize]);
        }
        out.resize(start + self.stored_bytes(), 0);
    }

    /// The code at position `p < s.len()` of `s` and the bytes it covers ([`ESC`]: one
    /// byte, escaped).
    #[inline(always)]
    fn find(&self, s: &[u8], p: usize) -> (u8, usize) {
        let r = s.len() - p;
        let w = load(s, p);
        if r >= 3 {
            if let Some(c) = self.long.get(w as u32 & 0xFF_FFFF) {
                let l = self.len[c as usize] as usize;
                if l <= r && w & mask(l) == self.sym[c as usize] {
                    return (c, l);
                }
            }
        }
        if r >= 2 {
            if let Some(c) = self.two.get(w as u32 & 0xFFFF) {
                return (c, 2);
            }
        }
        (self.single[w as u8 as usize], 1)
    }

    /// Bytes of `s` compressed.
    pub fn compressed_len(&self, s: &[u8]) -> usize {
        let (mut p, mut out) = (0, 0);
        while p < s.len() {
            let (c, l) = self.find(s, p);
            out += 1 + (c == ESC) as usize;
            p += l;
        }
        out
    }

    /// Appends `s` compressed (exactly [`Symbols::compressed_len`] bytes).
    pub fn compress(&self, s: &[u8], out: &mut Vec<u8>) {
        let mut p = 0;
        while p < s.len() {
            let (c, l) = self.find(s, p);
            out.push(c);
            if c == ESC {
                out.push(s[p]);
            }
            p += l;
        }
    }

    /// The symbol (bytes, length) of a counted code: a table code, or `256 + b` for an
    /// escaped byte `b`.
    fn counted(&self, id: usize) -> (u64, usize) {
        if id >= 256 {
            ((id - 256) as u64, 1)
        } else {
            (self.sym[id], self.len[id] as usize)
        }
    }
}

type Counts = HashMap<u32, u32, BuildHasherDefault<FastHasher>>;
type Gains = HashMap<(u64, u8), (u64, u32), BuildHasherDefault<FastHasher>>;

/// A symbol table trained on `sample` (deterministic).
pub fn train(sample: &[&[u8]]) -> Symbols {
    let mut t = Symbols::new();
    let mut single = vec![0u32; 512];
    let mut pairs = Counts::default();
    let mut gains = Gains::default();
    let mut cands: Vec<(u64, u32, u64, u8)> = Vec::new();
    for _ in 0..GENERATIONS {
        single.fill(0);
        pairs.clear();
        for s in sample {
            let mut p = 0;
            let mut prev = u32::MAX;
            while p < s.len() {
                let (c, l) = t.find(s, p);
                let id = if c == ESC { 256 + s[p] as u32 } else { c as u32 };
                single[id as usize] += 1;
                if prev != u32::MAX {
                    *pairs.entry(prev << 9 | id).or_default() += 1;
                }
                prev = id;
                p += l;
            }
        }
        // Candidates: the symbols and escaped bytes used, and the concatenations of
        // consecutive pairs, by the bytes they would cover.
        gains.clear();
        for (id, &k) in single.iter().enumerate().filter(|&(_, &k)| k > 0) {
            let (sym, l) = t.counted(id);
            let g = gains.entry((sym, l as u8)).or_default();
            g.0 += k as u64 * l as u64;
            g.1 += k;
        }
        for (&pair, &k) in &pairs {
            let (s1, l1) = t.counted((pair >> 9) as usize);
            let (s2, l2) = t.counted((pair & 511) as usize);
            let l = (l1 + l2).min(8);
            // (A first symbol of 8 bytes leaves no room: the pair is the first alone;
            // shifted by 64 bits, the second would have been merged into it unshifted.)
            let sym = if l1 >= 8 { s1 } else { (s1 | s2 << (8 * l1)) & mask(l) };
            let g = gains.entry((sym, l as u8)).or_default();
            g.0 += k as u64 * l as u64;
            g.1 += k;
        }
        // A symbol seen once in the sample costs more in the table than it saves.
        cands.clear();
        cands.extend(gains.iter().filter(|(_, &(_, k))| k >= 2).map(|(&(sym, l), &(g, k))| (g, k, sym, l)));
        cands.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(b.3.cmp(&a.3)).then(a.2.cmp(&b.2)));
        t.clear();
        for &(_, _, sym, l) in &cands {
            if t.n == MAX_SYMBOLS {
                break;
            }
            t.push(sym, l as usize);
        }
    }
    t
}

thread_local! {
    /// The last few tables trained on this thread, with their samples (each string's length
    /// and bytes): a packer measures a leaf and the encoder then encodes the same rows.
    static TRAINED: std::cell::RefCell<Vec<(Vec<u8>, Symbols)>> = const { std::cell::RefCell::new(Vec::new()) };
}
const TRAINED_KEEP: usize = 4;

/// [`train`], through a small cache of the last tables (the same sample gives the same
/// table, so this only saves time).
pub fn train_cached(sample: &[&[u8]]) -> Box<Symbols> {
    let mut key = Vec::with_capacity(sample.iter().map(|s| s.len() + 4).sum());
    for s in sample {
        key.extend_from_slice(&(s.len() as u32).to_le_bytes());
        key.extend_from_slice(s);
    }
    TRAINED.with(|t| {
        let mut t = t.borrow_mut();
        if let Some((_, sym)) = t.iter().find(|(k, _)| *k == key) {
            return Box::new(sym.clone());
        }
        let sym = train(sample);
        if t.len() == TRAINED_KEEP {
            t.remove(0);
        }
        t.push((key, sym.clone()));
        Box::new(sym)
    })
}

/// A stored symbol table, read for decoding.
pub struct Decoder {
    sym: [u64; 256],
    /// 0 for codes that are no symbol ([`ESC`] included).
    len: [u8; 256],
}

impl Decoder {
    /// Reads a stored table of `n` symbols from the front of `body`; returns it and the
    /// rest of `body`.
    pub fn read(body: &[u8], n: usize) -> Result<(Decoder, &[u8]), Restart> {
        if n > MAX_SYMBOLS {
            return Err(Restart);
        }
        let lens = body.get(..n).ok_or(Restart)?;
        let mut d = Decoder { sym: [0; 256], len: [0; 256] };
        let mut at = n;
        for (c, &l) in lens.iter().enumerate() {
            if !(1..=8).contains(&l) {
                return Err(Restart);
            }
            let b = body.get(at..at + l as usize).ok_or(Restart)?;
            let mut w = [0u8; 8];
            w[..b.len()].copy_from_slice(b);
            d.sym[c] = u64::from_le_bytes(w);
            d.len[c] = l;
            at += l as usize;
        }
        let rest = body.get(align8(at)..).ok_or(Restart)?;
        Ok((d, rest))
    }

    /// Bytes of output room [`Decoder::decode_into`] needs for `codes` (each code writes 8
    /// bytes and advances by at most 8).
    #[inline(always)]
    pub fn room(codes: &[u8]) -> usize {
        codes.len() * 8 + 8
    }

    /// Decodes `codes` into the front of `buf` (grown as needed, never shrunk); returns the
    /// decoded length. A code that is no symbol, or an escape at the end, is a [`Restart`].
    #[inline]
    pub fn decode(&self, codes: &[u8], buf: &mut Vec<u8>) -> Result<usize, Restart> {
        let need = Self::room(codes);
        if buf.len() < need {
            buf.resize(need, 0);
        }
        self.decode_into(codes, buf)
    }

    /// Decodes `codes` into the front of `out`, which has at least [`Decoder::room`] bytes
    /// (else a [`Restart`]); bytes after the decoded length may be overwritten too.
    #[inline]
    pub fn decode_into(&self, codes: &[u8], out: &mut [u8]) -> Result<usize, Restart> {
        let out = out.get_mut(..Self::room(codes)).ok_or(Restart)?;
        let (mut i, mut o) = (0usize, 0usize);
        while i < codes.len() {
            let c = codes[i] as usize;
            let l = self.len[c] as usize;
            if l != 0 {
                out[o..o + 8].copy_from_slice(&self.sym[c].to_le_bytes());
                o += l;
                i += 1;
            } else if c == ESC as usize {
                out[o] = *codes.get(i + 1).ok_or(Restart)?;
                o += 1;
                i += 2;
            } else {
                return Err(Restart);
            }
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::SplitMix64;

    fn round_trip(t: &Symbols, s: &[u8]) -> usize {
        let mut c = Vec::new();
        t.compress(s, &mut c);
        assert_eq!(c.len(), t.compressed_len(s));
        let mut stored = Vec::new();
        t.write(&mut stored);
        assert_eq!(stored.len(), t.stored_bytes());
        let (d, rest) = Decoder::read(&stored, t.len()).unwrap();
        assert!(rest.is_empty());
        let mut buf = Vec::new();
        let n = d.decode(&c, &mut buf).unwrap();
        assert_eq!(&buf[..n], s);
        c.len()
    }

    #[test]
    fn tables_round_trip_any_bytes() {
        let mut r = SplitMix64(1);
        let text: Vec<Vec<u8>> = (0..300).map(|i| format!("the quick brown fox {i} jumps over the lazy dog").into_bytes()).collect();
        let refs: Vec<&[u8]> = text.iter().map(Vec::as_slice).collect();
        let t = train(&refs);
        assert!(t.len() > 20 && t.len() <= MAX_SYMBOLS);
        let (mut raw, mut packed) = (0, 0);
        for s in &text {
            raw += s.len();
            packed += round_trip(&t, s);
        }
        assert!(packed * 3 < raw, "{packed} of {raw}");
        for len in [0, 1, 2, 3, 7, 8, 9, 100, 5000] {
            let s: Vec<u8> = (0..len).map(|_| r.below(256) as u8).collect();
            round_trip(&t, &s);
            let z = vec![0u8; len];
            round_trip(&t, &z);
        }
        // A table trained on random and zero bytes (symbols with zero bytes).
        let bin: Vec<Vec<u8>> = (0..50).map(|i| (0..r.below(40)).map(|j| if (i + j) % 3 == 0 { 0 } else { r.below(4) as u8 }).collect()).collect();
        let refs: Vec<&[u8]> = bin.iter().map(Vec::as_slice).collect();
        let t = train(&refs);
        for s in &bin {
            round_trip(&t, s);
        }
        round_trip(&t, &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        let empty = train(&[]);
        assert_eq!(empty.len(), 0);
        round_trip(&empty, b"abc");
    }

    #[test]
    fn bad_codes_are_restarts() {
        let t = train(&[b"abcabcabcabc", b"abcabcabc"]);
        let mut stored = Vec::new();
        t.write(&mut stored);
        let (d, _) = Decoder::read(&stored, t.len()).unwrap();
        let mut buf = Vec::new();
        assert!(d.decode(&[ESC], &mut buf).is_err());
        assert!(d.decode(&[254], &mut buf).is_err());
        assert!(Decoder::read(&stored, 256).is_err());
        assert!(Decoder::read(&[0u8; 8], 1).is_err());
        assert!(Decoder::read(&[9u8; 8], 1).is_err());
        assert!(Decoder::read(&[8u8, 1, 2], 1).is_err());
    }
}
