//! The byte format of a packed table leaf: the rows of a [`pax`] leaf, lightly compressed
//! column by column, read by expanding them into the plain PAX layout.
//!
//! A packed leaf holds the rows with ids `first .. first + count` and is never changed in
//! place (only rewritten whole). After the 64-byte node header come the column directory
//! and the columns' blocks, one after another, each 8-byte aligned.
//!
//! Header words (little-endian): 0 kind ([`KIND_PACKED`]) and count (high 32 bits), 1 the
//! bytes used (header, directory and blocks), 2 flags ([`FLAG_FULL`]: the next row did not
//! fit, so an append starts a new leaf instead of repacking this one; [`FLAG_DIR`]: the
//! leaf has a directory), 3 `first`, 4 the number of columns (checked against the schema).
//!
//! The directory ([`FLAG_DIR`]): the CRC-32C of the header and the directory (these 4
//! bytes left out; 4 bytes, then 4 zero bytes), then per column (in schema order) 16 bytes: its
//! block's start and end in the page (`u32` each), the CRC-32C of the block's bytes, 4 zero
//! bytes. The blocks of the fixed-width columns come first (in schema order), then those of
//! strings and bytes: a reader that needs a few columns reads the header, the directory
//! and their blocks, not the page ([`ColumnRead`]: the scan rings read only those byte
//! ranges, and verify them with the directory's checksums, as a whole page is verified
//! with its own), and a table's long strings (comments) lie at the end where prefix reads
//! leave them out. A leaf without a directory (written before there was one) has its
//! blocks in column order right after the header, and is read whole.
//!
//! A block starts with a 32-byte header:
//!
//! | bytes  | meaning                                                                  |
//! |--------|--------------------------------------------------------------------------|
//! | 0      | encoding tag (below)                                                     |
//! | 1      | 1 if a null bitmap follows the header, else 0                            |
//! | 2      | `w`: bits per value (or per dictionary code), 0..=64                     |
//! | 3      | `f64` scale `s` (0..=4), or bits per (string or code) length `lw` (0..=32) |
//! | 4..8   | block length in bytes (header included, a multiple of 8), `u32`          |
//! | 8..16  | frame of reference: the base value (`i64`), or the base (string or code) |
//! |        | length                                                                   |
//! | 16..24 | dictionary entries (strings), or symbols (compressed strings, 0..=255)   |
//! | 24..32 | bytes of the non-NULL strings longer than 12 bytes (their plain var area) |
//!
//! then the null bitmap if any (one bit per row, set for NULL, the plain layout's
//! [`pax::bitmap_bytes`]), then the values. Bit-packed sequences are `n` values of `w` bits
//! each, least significant bits first, in `(n * w).div_ceil(64)` little-endian words.
//!
//! | tag | encoding      | values                                                         |
//! |-----|---------------|----------------------------------------------------------------|
//! | 1   | integer       | `i64`, `date`, `bool`: `base + v`, `v` bit-packed              |
//! | 2   | decimal `f64` | `(base + v) as f64 / 10^s`, `v` bit-packed (bit-exact values)  |
//! | 3   | raw `f64`     | `count` 8-byte bit patterns                                    |
//! | 4   | dictionary    | entry lengths (`base + v`, `lw` bits each) for the entries, the |
//! |     |               | entries' bytes concatenated (8-aligned), codes (`w` bits/row)  |
//! | 5   | plain strings | lengths (`base + v`, `lw` bits) per row, the non-NULL rows'   |
//! |     |               | bytes concatenated (8-aligned)                                 |
//! | 6   | compressed    | the symbol table (a length byte, 1..=8, per symbol, then the   |
//! |     | strings       | symbols' bytes concatenated; 8-aligned), code lengths          |
//! |     |               | (`base + v`, `lw` bits) per row, the non-NULL rows' codes      |
//! |     |               | concatenated (8-aligned); see [`fsst`]                         |
//!
//! Compressed strings (FSST-style, [`fsst`]): each string is a sequence of 1-byte codes,
//! code `c` < 255 standing for symbol `c` (1 to 8 bytes) and code 255 followed by one
//! literal byte. The table is trained on the column's first strings in the leaf (a sample
//! of `size / 8` bytes, see [`SAMPLE_SHARE`]), so the packer knows every string's compressed
//! size as it takes it; a column is stored so only when that is at most 80% of its plain or
//! dictionary block ([`FSST_PERCENT`]).
//!
//! NULL rows store the base (code 0, length base with no bytes or codes). Readers may decode
//! optimistic copies that turn out invalid, so every length, offset and width is checked
//! against the page: an impossible one is a [`Restart`], never a panic, and an expanded
//! image is never larger than [`max_expanded`] of the page.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::fsst::{self, Symbols};
use super::pax::{self, align8, Leaf};
use super::schema::{ColumnType, Schema, Value};
use crate::access::btree::node::{Src, HDR, KIND_PACKED, KIND_PAX};
use crate::buffer::{PartialRead, Restart};

const W_USED: usize = 8;
const W_FLAGS: usize = 16;
const W_FIRST: usize = 24;
const W_COLS: usize = 32;

/// Header flag: the leaf was closed because the next row did not fit.
pub const FLAG_FULL: u64 = 1;
/// Header flag: a column directory follows the header (see the module doc); leaves written
/// before it had none (their blocks follow the header in column order).
pub const FLAG_DIR: u64 = 2;

/// The directory's first bytes: the CRC-32C of the header and the directory (these 4 bytes
/// left out), then 4 zero bytes.
const DIR_PRE: usize = 8;
/// A directory entry: a column's block start and end in the page (`u32` each), the CRC-32C
/// of the block's bytes, 4 zero bytes.
const DIR_ENTRY: usize = 16;

/// Bytes of the column directory of a leaf with `cols` columns.
fn dir_bytes(cols: usize) -> usize {
    DIR_PRE + DIR_ENTRY * cols
}

const BLOCK_HDR: usize = 32;
/// Block encodings (see the module doc).
pub const TAG_INT: u8 = 1;
#[allow(missing_docs)]
pub const TAG_DEC: u8 = 2;
#[allow(missing_docs)]
pub const TAG_RAW: u8 = 3;
#[allow(missing_docs)]
pub const TAG_DICT: u8 = 4;
#[allow(missing_docs)]
pub const TAG_PLAIN: u8 = 5;
/// Compressed strings (a symbol table and 1-byte codes, [`fsst`]).
pub const TAG_FSST: u8 = 6;

/// A string column's symbol table is trained on its first strings once they hold this
/// share of the page's bytes (`size / SAMPLE_SHARE`, within [`SAMPLE_MIN`, `SAMPLE_MAX`]).
const SAMPLE_SHARE: usize = 8;
const SAMPLE_MIN: usize = 256;
const SAMPLE_MAX: usize = 16384;
/// A column whose first this many strings are too short for a sample is not compressed.
const SAMPLE_STRINGS: usize = 2048;
/// Compressed strings are used only when they take at most this share (in 1/100) of the
/// best other encoding (decoding them costs more than copying).
const FSST_PERCENT: usize = 80;

/// The most entries of a string column's dictionary.
pub const DICT_MAX: usize = 4096;
/// After this many distinct values a dictionary is given up if over 95% of the values
/// were distinct (it would not be smaller than plain strings).
const DICT_PROBE: usize = 256;
const MAX_SCALE: usize = 4;
const POW10: [f64; MAX_SCALE + 1] = [1.0, 10.0, 100.0, 1000.0, 10000.0];
/// Scaled values stay below 2^53 in magnitude (exact as `f64`).
const SCALED_LIMIT: f64 = 9.0e15;

/// The most rows a packed leaf of `size` bytes holds (a quarter of its bytes).
pub fn max_rows(size: usize) -> usize {
    size / 4
}

/// The largest plain image a packed leaf of `size` bytes expands into.
pub fn max_expanded(size: usize) -> usize {
    size.saturating_mul(64)
}

/// Bits needed for `x`.
fn bits(x: u64) -> u32 {
    64 - x.leading_zeros()
}

/// Bytes of `n` bit-packed values of `w` bits.
fn packed_bytes(n: usize, w: u32) -> usize {
    (n * w as usize).div_ceil(64) * 8
}

/// The header of a packed leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packed {
    /// Rows held.
    pub count: usize,
    /// Bytes used (header and blocks).
    pub used: usize,
    /// The id of the first row.
    pub first: u64,
    /// Whether the next row did not fit ([`FLAG_FULL`]).
    pub full: bool,
    /// Whether the leaf has a column directory ([`FLAG_DIR`]).
    pub dir: bool,
}

/// Reads and checks a packed leaf's header.
pub fn header<S: Src + ?Sized>(s: &S, schema: &Schema) -> Result<Packed, Restart> {
    let w0 = s.word(0);
    let size = s.size();
    let (kind, count) = (w0 as u8, (w0 >> 32) as usize);
    let used = s.word(W_USED) as usize;
    let flags = s.word(W_FLAGS);
    let first = s.word(W_FIRST);
    let cols = s.word(W_COLS);
    let dir = flags & FLAG_DIR != 0;
    let least = HDR + if dir { dir_bytes(schema.len()) } else { 0 } + BLOCK_HDR * schema.len();
    if kind != KIND_PACKED || cols != schema.len() as u64 || count > max_rows(size) || used > size || used < least || flags > FLAG_FULL | FLAG_DIR {
        return Err(Restart);
    }
    if first.checked_add(count as u64).is_none() {
        return Err(Restart);
    }
    Ok(Packed { count, used, first, full: flags & FLAG_FULL != 0, dir })
}

/// The order of a leaf's blocks: the fixed-width columns, then strings and bytes (each in
/// schema order).
fn block_order(schema: &Schema) -> impl Iterator<Item = usize> + '_ {
    let var = |c: &usize| schema.columns[*c].ty.is_var();
    (0..schema.len()).filter(move |c| !var(c)).chain((0..schema.len()).filter(var))
}

// ------------------------------------------------------------------ bit packing

/// Appends values of `w` bits to a byte vector in little-endian 64-bit words.
struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u128,
    have: u32,
}

impl<'a> BitWriter<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        BitWriter { out, acc: 0, have: 0 }
    }
    #[inline]
    fn put(&mut self, v: u64, w: u32) {
        if w == 0 {
            return;
        }
        self.acc |= (v as u128) << self.have;
        self.have += w;
        if self.have >= 64 {
            self.out.extend_from_slice(&(self.acc as u64).to_le_bytes());
            self.acc >>= 64;
            self.have -= 64;
        }
    }
    fn finish(self) {
        if self.have > 0 {
            self.out.extend_from_slice(&(self.acc as u64).to_le_bytes());
        }
    }
}

/// Reads values of `w` bits from little-endian 64-bit words; the caller checked that the
/// source holds [`packed_bytes`] for the values it reads.
struct BitReader<'a> {
    src: &'a [u8],
    pos: usize,
    acc: u128,
    have: u32,
    w: u32,
    mask: u64,
}

impl<'a> BitReader<'a> {
    fn new(src: &'a [u8], w: u32) -> Self {
        let mask = if w >= 64 { u64::MAX } else { (1u64 << w) - 1 };
        BitReader { src, pos: 0, acc: 0, have: 0, w, mask }
    }
    #[inline(always)]
    fn next(&mut self) -> u64 {
        if self.have < self.w {
            let word = u64::from_le_bytes(self.src[self.pos..self.pos + 8].try_into().unwrap());
            self.pos += 8;
            self.acc |= (word as u128) << self.have;
            self.have += 64;
        }
        let v = self.acc as u64 & self.mask;
        self.acc >>= self.w;
        self.have -= self.w;
        v
    }
}

// ------------------------------------------------------------------ statistics

/// A cheap hasher for dictionary lookups (FxHash-style, word at a time).
#[derive(Default)]
pub(super) struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(c.try_into().unwrap())).wrapping_mul(K);
        }
        let mut tail = [0u8; 8];
        let r = chunks.remainder();
        tail[..r.len()].copy_from_slice(r);
        self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(tail) ^ bytes.len() as u64).wrapping_mul(K);
    }
}

type Dict<'a> = HashMap<&'a [u8], u32, BuildHasherDefault<FastHasher>>;

/// The bytes of a string or byte-string value (`None` for NULL and other types).
fn str_bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::Str(s) => Some(s.as_bytes()),
        Value::Bytes(b) => Some(b),
        _ => None,
    }
}

/// A number column's value as the integer that is packed (`None` for NULL).
fn int_of(v: &Value) -> Option<i64> {
    match v {
        Value::I64(x) => Some(*x),
        Value::Date(x) => Some(*x as i64),
        Value::Bool(x) => Some(*x as i64),
        _ => None,
    }
}

/// `v * 10^s` as an integer if dividing it by `10^s` gives `v` back bit for bit.
#[inline]
fn scaled(v: f64, s: usize) -> Option<i64> {
    let x = v * POW10[s];
    if x.abs() >= SCALED_LIMIT || x.is_nan() {
        return None;
    }
    let k = x.round() as i64;
    ((k as f64 / POW10[s]).to_bits() == v.to_bits()).then_some(k)
}

/// What [`scaled`] gives at scale `s + d` for a value that scales to `k` at scale `s`,
/// without its float arithmetic: `k * 10^d`, when below 2^50 in magnitude (`None`: not
/// known, test it). Exact: `k / 10^s` and `k * 10^d / 10^(s + d)` are the same real number
/// with exact operands, so IEEE division rounds both to the same float, `x`; and `x * 10^(s
/// + d)` is within `|k * 10^d| * 2^-52 < 0.5` of `k * 10^d`, so it rounds to it.
#[inline]
fn scaled_up(k: i64, d: usize) -> Option<i64> {
    k.checked_mul(POW10[d] as i64).filter(|q| q.unsigned_abs() < 1 << 50)
}

/// Running min and max.
#[derive(Clone, Copy, Debug)]
struct Range {
    min: i64,
    max: i64,
}

impl Range {
    const EMPTY: Range = Range { min: i64::MAX, max: i64::MIN };
    fn add(&mut self, v: i64) {
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }
    /// (base, width) of the frame of reference.
    fn frame(&self) -> (i64, u32) {
        if self.min > self.max {
            return (0, 0);
        }
        (self.min, bits(self.max.wrapping_sub(self.min) as u64))
    }
}

/// What an encoder needs to know of a column's values so far.
enum Stats<'a> {
    Int(Range),
    F64 {
        /// Bit `s` set while every value so far scales by `10^s`.
        scales: u8,
        k: [Range; MAX_SCALE + 1],
    },
    Str {
        len: Range,
        total: usize,
        long: usize,
        /// Distinct values and their codes, while at most [`DICT_MAX`].
        dict: Option<Dict<'a>>,
        dict_len: Range,
        dict_bytes: usize,
        /// The values in code order.
        entries: Vec<&'a [u8]>,
        fsst: Fsst<'a>,
    },
}

/// A string column's compression state.
enum Fsst<'a> {
    /// Collecting the non-NULL strings until the first `sampled` of them (their `bytes`)
    /// make a sample (`sampled` 0: not yet), and then while a dictionary smaller than the
    /// sample would beat compressed strings anyway (training waits until it fills or goes).
    Sampling { strings: Vec<&'a [u8]>, bytes: usize, sampled: usize },
    /// Trained on the sample: every string so far compressed with `table`.
    On {
        table: Box<Symbols>,
        /// Compressed lengths.
        clen: Range,
        /// Compressed bytes.
        codes: usize,
        /// The compressed length of each dictionary entry, while there is a dictionary
        /// (and the codes are not kept).
        entry_clen: Vec<u32>,
        /// For encoding: the codes of the non-NULL strings so far, and their lengths.
        kept: Option<(Vec<u8>, Vec<u32>)>,
    },
    /// Not worth it (too few bytes, or the sample did not compress).
    Off,
}

/// A column's running statistics: the encoding and the block size they imply.
struct ColStats<'a> {
    /// Non-NULL values added.
    n: usize,
    /// Bytes of strings that make a compression sample.
    sample: usize,
    /// Whether compressed strings are kept (for encoding) rather than only measured.
    keep: bool,
    nulls: bool,
    s: Stats<'a>,
}

/// How a column is encoded, decided from its statistics.
#[derive(Clone, Copy, Debug)]
enum Enc {
    Int {
        base: i64,
        w: u32,
    },
    Dec {
        base: i64,
        w: u32,
        s: usize,
    },
    Raw,
    Dict {
        lbase: i64,
        lw: u32,
        w: u32,
    },
    Plain {
        lbase: i64,
        lw: u32,
    },
    /// Compressed strings: frame of reference of the compressed lengths.
    Fsst {
        lbase: i64,
        lw: u32,
    },
}

impl<'a> ColStats<'a> {
    /// Statistics for a column of type `ty` in a packed leaf of `size` bytes.
    fn new(ty: ColumnType, size: usize) -> Self {
        let s = match ty {
            ColumnType::I64 | ColumnType::Date | ColumnType::Bool => Stats::Int(Range::EMPTY),
            ColumnType::F64 => Stats::F64 { scales: (1 << (MAX_SCALE + 1)) - 1, k: [Range::EMPTY; MAX_SCALE + 1] },
            ColumnType::Str | ColumnType::Bytes => {
                let fsst = Fsst::Sampling { strings: Vec::new(), bytes: 0, sampled: 0 };
                Stats::Str {
                    len: Range::EMPTY,
                    total: 0,
                    long: 0,
                    dict: Some(Dict::default()),
                    dict_len: Range::EMPTY,
                    dict_bytes: 0,
                    entries: Vec::new(),
                    fsst,
                }
            }
        };
        ColStats { n: 0, sample: (size / SAMPLE_SHARE).clamp(SAMPLE_MIN, SAMPLE_MAX), keep: false, nulls: false, s }
    }

    fn add(&mut self, v: &'a Value) {
        if matches!(v, Value::Null) {
            self.nulls = true;
            return;
        }
        self.n += 1;
        match &mut self.s {
            Stats::Int(r) => r.add(int_of(v).unwrap_or(0)),
            Stats::F64 { scales, k } => {
                let Value::F64(x) = v else { return };
                let mut m = *scales;
                // The lowest scale that works for `x`, and its integer.
                let mut low: Option<(usize, i64)> = None;
                while m != 0 {
                    let s = m.trailing_zeros() as usize;
                    m &= m - 1;
                    let q = match low {
                        Some((s0, k0)) => scaled_up(k0, s - s0).or_else(|| scaled(*x, s)),
                        None => scaled(*x, s),
                    };
                    match q {
                        Some(q) => {
                            k[s].add(q);
                            low = low.or(Some((s, q)));
                        }
                        None => *scales &= !(1 << s),
                    }
                }
            }
            Stats::Str { len, total, long, dict, dict_len, dict_bytes, entries, fsst } => {
                let b = str_bytes(v).unwrap_or(&[]);
                len.add(b.len() as i64);
                *total += b.len();
                if b.len() > 12 {
                    *long += b.len();
                }
                // The value's dictionary code, while there is a dictionary.
                let mut code = None;
                if let Some(d) = dict {
                    let next = d.len();
                    match d.entry(b) {
                        std::collections::hash_map::Entry::Occupied(e) => code = Some(*e.get() as usize),
                        std::collections::hash_map::Entry::Vacant(e) => {
                            // Full, or nearly every value distinct after many: no dictionary.
                            if next == DICT_MAX || (next >= DICT_PROBE && next * 20 > self.n * 19) {
                                *dict = None;
                                *entries = Vec::new();
                                if let Fsst::On { entry_clen, .. } = fsst {
                                    *entry_clen = Vec::new();
                                }
                            } else {
                                e.insert(next as u32);
                                entries.push(b);
                                dict_len.add(b.len() as i64);
                                *dict_bytes += b.len();
                                code = Some(next);
                            }
                        }
                    }
                }
                match fsst {
                    Fsst::Sampling { strings, bytes, sampled } => {
                        strings.push(b);
                        if *sampled == 0 {
                            *bytes += b.len();
                            if *bytes >= self.sample {
                                *sampled = strings.len();
                            } else if strings.len() >= SAMPLE_STRINGS {
                                *fsst = Fsst::Off;
                                return;
                            }
                        }
                        if *sampled > 0 && (dict.is_none() || *dict_bytes >= self.sample) {
                            let sample = &strings[..*sampled];
                            let table = fsst::train_cached(sample);
                            let mut kept = self.keep.then(|| (Vec::new(), Vec::with_capacity(strings.len())));
                            let (mut clen, mut codes, mut sample_codes) = (Range::EMPTY, 0usize, 0usize);
                            for (i, s) in strings.iter().enumerate() {
                                let c = match &mut kept {
                                    Some((out, lens)) => {
                                        let at = out.len();
                                        table.compress(s, out);
                                        lens.push((out.len() - at) as u32);
                                        out.len() - at
                                    }
                                    None => table.compressed_len(s),
                                };
                                clen.add(c as i64);
                                codes += c;
                                if i + 1 == *sampled {
                                    sample_codes = codes;
                                }
                            }
                            // Not worth it unless the sample shrinks by a tenth.
                            *fsst = if sample_codes * 10 > *bytes * 9 {
                                Fsst::Off
                            } else {
                                let entry_clen = if dict.is_some() && kept.is_none() {
                                    entries.iter().map(|e| table.compressed_len(e) as u32).collect()
                                } else {
                                    Vec::new()
                                };
                                Fsst::On { table, clen, codes, entry_clen, kept }
                            };
                        }
                    }
                    Fsst::On { table, clen, codes, entry_clen, kept } => {
                        let c = match (kept, code) {
                            (Some((out, lens)), _) => {
                                let at = out.len();
                                table.compress(b, out);
                                lens.push((out.len() - at) as u32);
                                out.len() - at
                            }
                            (None, Some(k)) if k < entry_clen.len() => entry_clen[k] as usize,
                            (None, _) => {
                                let c = table.compressed_len(b);
                                if code == Some(entry_clen.len()) {
                                    entry_clen.push(c as u32);
                                }
                                c
                            }
                        };
                        clen.add(c as i64);
                        *codes += c;
                    }
                    Fsst::Off => {}
                }
            }
        }
    }

    /// The encoding of the values so far.
    fn enc(&self, n: usize) -> Enc {
        match &self.s {
            Stats::Int(r) => {
                let (base, w) = r.frame();
                Enc::Int { base, w }
            }
            Stats::F64 { scales, k } => {
                if *scales == 0 {
                    return Enc::Raw;
                }
                let s = scales.trailing_zeros() as usize;
                let (base, w) = k[s].frame();
                Enc::Dec { base, w, s }
            }
            Stats::Str { len, total, dict, dict_len, dict_bytes, fsst, .. } => {
                let (lbase, lw) = len.frame();
                let plain = packed_bytes(n, lw) + align8(*total);
                let (mut best, mut best_size) = (Enc::Plain { lbase, lw }, plain);
                if let Some(d) = dict {
                    let (dbase, dlw) = dict_len.frame();
                    let w = bits(d.len().saturating_sub(1) as u64);
                    let size = packed_bytes(d.len(), dlw) + align8(*dict_bytes) + packed_bytes(n, w);
                    if size < plain {
                        (best, best_size) = (Enc::Dict { lbase: dbase, lw: dlw, w }, size);
                    }
                }
                if let Fsst::On { table, clen, codes, .. } = fsst {
                    let (cbase, clw) = clen.frame();
                    let size = table.stored_bytes() + packed_bytes(n, clw) + align8(*codes);
                    if size * 100 <= best_size * FSST_PERCENT {
                        best = Enc::Fsst { lbase: cbase, lw: clw };
                    }
                }
                best
            }
        }
    }

    /// Bytes of the column's block for `n` rows.
    fn block_bytes(&self, n: usize) -> usize {
        let nulls = if self.nulls { pax::bitmap_bytes(n) } else { 0 };
        let values = match (self.enc(n), &self.s) {
            (Enc::Int { w, .. } | Enc::Dec { w, .. }, _) => packed_bytes(n, w),
            (Enc::Raw, _) => n * 8,
            (Enc::Dict { lw, w, .. }, Stats::Str { dict_bytes, entries, .. }) => packed_bytes(entries.len(), lw) + align8(*dict_bytes) + packed_bytes(n, w),
            (Enc::Plain { lw, .. }, Stats::Str { total, .. }) => packed_bytes(n, lw) + align8(*total),
            (Enc::Fsst { lw, .. }, Stats::Str { fsst: Fsst::On { table, codes, .. }, .. }) => table.stored_bytes() + packed_bytes(n, lw) + align8(*codes),
            _ => 0,
        };
        BLOCK_HDR + nulls + values
    }

    /// Bytes the column's long strings take in the plain image.
    fn long_bytes(&self) -> usize {
        match &self.s {
            Stats::Str { long, .. } => *long,
            _ => 0,
        }
    }
}

/// Running statistics of rows taken for one packed leaf: its size after each row in
/// O(columns).
pub struct Packer<'a> {
    cols: Vec<ColStats<'a>>,
    n: usize,
    dir: bool,
}

impl<'a> Packer<'a> {
    /// An empty packer for `schema` and leaves of `size` bytes (with a column directory if
    /// `dir`).
    pub fn new(schema: &Schema, size: usize, dir: bool) -> Self {
        Packer { cols: schema.columns.iter().map(|c| ColStats::new(c.ty, size)).collect(), n: 0, dir }
    }

    /// Takes `row` (of the schema's types).
    pub fn add(&mut self, row: &'a [Value]) {
        for (c, v) in self.cols.iter_mut().zip(row) {
            c.add(v);
        }
        self.n += 1;
    }

    /// Rows taken.
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Bytes of the packed leaf of the rows taken.
    pub fn bytes(&self) -> usize {
        let dir = if self.dir { dir_bytes(self.cols.len()) } else { 0 };
        HDR + dir + self.cols.iter().map(|c| c.block_bytes(self.n)).sum::<usize>()
    }

    /// Bytes of the plain image the rows taken expand into.
    pub fn expanded_bytes(&self, schema: &Schema) -> usize {
        pax::fixed_end(schema, self.n) + self.cols.iter().map(ColStats::long_bytes).sum::<usize>()
    }
}

/// How many of `rows` (from the first) a packed leaf of `size` bytes (with a column
/// directory if `dir`) holds, and whether a row was left out because it did not fit
/// (rather than for want of rows). None in a page of 4 GiB or more with a directory (its
/// offsets are 32-bit).
pub fn fit<R: AsRef<[Value]>>(schema: &Schema, size: usize, rows: &[R], dir: bool) -> (usize, bool) {
    if dir && u32::try_from(size).is_err() {
        return (0, false);
    }
    let mut p = Packer::new(schema, size, dir);
    let limit = max_rows(size);
    for (i, row) in rows.iter().enumerate() {
        if i == limit {
            return (i, true);
        }
        p.add(row.as_ref());
        if p.bytes() > size || p.expanded_bytes(schema) > max_expanded(size) {
            return (i, true);
        }
    }
    (rows.len(), false)
}

// ------------------------------------------------------------------ encoding

/// The packed image (of `size` bytes, zero padded) of `rows`, with ids from `first` on;
/// `full` sets [`FLAG_FULL`], `dir` gives it a column directory ([`FLAG_DIR`]; without, the
/// format of databases of format version 1). The rows must fit (see [`fit`]).
pub fn encode<R: AsRef<[Value]>>(size: usize, schema: &Schema, first: u64, rows: &[R], full: bool, dir: bool) -> Vec<u8> {
    let mut img = Vec::with_capacity(size);
    let cols = schema.len();
    img.resize(HDR + if dir { dir_bytes(cols) } else { 0 }, 0);
    let n = rows.len();
    let flags = if dir { FLAG_DIR } else { 0 } | if full { FLAG_FULL } else { 0 };
    let words = [(KIND_PACKED as u64) | ((n as u64) << 32), 0, flags, first, cols as u64];
    for (i, w) in words.iter().enumerate() {
        img[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    let order: Vec<usize> = if dir { block_order(schema).collect() } else { (0..cols).collect() };
    for c in order {
        let mut st = ColStats::new(schema.columns[c].ty, size);
        st.keep = true;
        for row in rows {
            st.add(&row.as_ref()[c]);
        }
        let start = img.len();
        encode_column(&mut img, &st, rows, c);
        if !dir {
            continue;
        }
        let crc = crc32c::crc32c(&img[start..]);
        let e = HDR + DIR_PRE + c * DIR_ENTRY;
        img[e..e + 4].copy_from_slice(&(start as u32).to_le_bytes());
        let end = img.len() as u32;
        img[e + 4..e + 8].copy_from_slice(&end.to_le_bytes());
        img[e + 8..e + 12].copy_from_slice(&crc.to_le_bytes());
    }
    let used = img.len();
    img[W_USED..W_USED + 8].copy_from_slice(&(used as u64).to_le_bytes());
    if dir {
        let crc = dir_crc(&img, cols);
        img[HDR..HDR + 4].copy_from_slice(&crc.to_le_bytes());
    }
    debug_assert!(used <= size, "packed rows overflow the page: {used} > {size}");
    img.resize(size.max(used), 0);
    img
}

/// The checksum of a leaf's header and directory, the checksum's own 4 bytes left out
/// (`page` holds at least the header and the directory).
fn dir_crc(page: &[u8], cols: usize) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&page[..HDR]), &page[HDR + 4..HDR + dir_bytes(cols)])
}

/// Appends column `c`'s block.
/// Column `c` of `row`.
fn col<R: AsRef<[Value]>>(row: &R, c: usize) -> &Value {
    &row.as_ref()[c]
}

fn encode_column<R: AsRef<[Value]>>(img: &mut Vec<u8>, st: &ColStats<'_>, rows: &[R], c: usize) {
    let n = rows.len();
    let start = img.len();
    let enc = st.enc(n);
    let mut hdr = [0u8; BLOCK_HDR];
    hdr[1] = st.nulls as u8;
    let (tag, w, aux, base, entries) = match enc {
        Enc::Int { base, w } => (TAG_INT, w, 0, base, 0),
        Enc::Dec { base, w, s } => (TAG_DEC, w, s as u32, base, 0),
        Enc::Raw => (TAG_RAW, 0, 0, 0, 0),
        Enc::Dict { lbase, lw, w } => (TAG_DICT, w, lw, lbase, if let Stats::Str { entries, .. } = &st.s { entries.len() } else { 0 }),
        Enc::Plain { lbase, lw } => (TAG_PLAIN, 0, lw, lbase, 0),
        Enc::Fsst { lbase, lw } => (TAG_FSST, 0, lw, lbase, if let Stats::Str { fsst: Fsst::On { table, .. }, .. } = &st.s { table.len() } else { 0 }),
    };
    hdr[0] = tag;
    hdr[2] = w as u8;
    hdr[3] = aux as u8;
    hdr[8..16].copy_from_slice(&base.to_le_bytes());
    hdr[16..24].copy_from_slice(&(entries as u64).to_le_bytes());
    hdr[24..32].copy_from_slice(&(st.long_bytes() as u64).to_le_bytes());
    img.extend_from_slice(&hdr);
    if st.nulls {
        let at = img.len();
        img.resize(at + pax::bitmap_bytes(n), 0);
        for (i, row) in rows.iter().enumerate() {
            if matches!(col(row, c), Value::Null) {
                img[at + i / 8] |= 1 << (i % 8);
            }
        }
    }
    match enc {
        Enc::Int { base, w } => {
            let mut bw = BitWriter::new(img);
            for row in rows {
                bw.put(int_of(col(row, c)).unwrap_or(base).wrapping_sub(base) as u64, w);
            }
            bw.finish();
        }
        Enc::Dec { base, w, s } => {
            let mut bw = BitWriter::new(img);
            for row in rows {
                let k = match *col(row, c) {
                    Value::F64(x) => scaled(x, s).unwrap_or(base),
                    _ => base,
                };
                bw.put(k.wrapping_sub(base) as u64, w);
            }
            bw.finish();
        }
        Enc::Raw => {
            for row in rows {
                let b = if let Value::F64(x) = *col(row, c) { x.to_bits() } else { 0 };
                img.extend_from_slice(&b.to_le_bytes());
            }
        }
        Enc::Dict { lbase, lw, w } => {
            let Stats::Str { dict: Some(d), entries, .. } = &st.s else { unreachable!("a dictionary encoding without a dictionary") };
            put_strings(img, entries.iter().copied(), lbase, lw);
            let mut bw = BitWriter::new(img);
            for row in rows {
                let code = str_bytes(col(row, c)).and_then(|b| d.get(b)).copied().unwrap_or(0);
                bw.put(code as u64, w);
            }
            bw.finish();
        }
        Enc::Plain { lbase, lw } => put_strings(img, rows.iter().map(|r| str_bytes(col(r, c)).unwrap_or(&[])), lbase, lw),
        Enc::Fsst { lbase, lw } => {
            let Stats::Str { fsst: Fsst::On { table, codes, kept: Some((out, lens)), .. }, .. } = &st.s else {
                unreachable!("compressed strings without a symbol table or codes")
            };
            table.write(img);
            let mut bw = BitWriter::new(img);
            let mut lens = lens.iter();
            for row in rows {
                let l = if matches!(col(row, c), Value::Null) { 0 } else { lens.next().copied().unwrap_or(0) };
                bw.put((l as i64).saturating_sub(lbase).max(0) as u64, lw);
            }
            bw.finish();
            debug_assert_eq!(out.len(), *codes, "the compressed size is the estimate");
            img.extend_from_slice(out);
            img.resize(align8(img.len()), 0);
        }
    }
    // Length of the block (header included).
    let len = (img.len() - start) as u32;
    img[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
}

/// Appends strings as bit-packed lengths (frame `lbase`, `lw` bits; an empty slice, as for
/// NULL, stores the base) and their bytes, 8-aligned.
fn put_strings<'b>(img: &mut Vec<u8>, strings: impl Iterator<Item = &'b [u8]> + Clone, lbase: i64, lw: u32) {
    let mut bw = BitWriter::new(img);
    for s in strings.clone() {
        bw.put((s.len() as i64).saturating_sub(lbase).max(0) as u64, lw);
    }
    bw.finish();
    for s in strings {
        img.extend_from_slice(s);
    }
    img.resize(align8(img.len()), 0);
}

// ------------------------------------------------------------------ decoding

/// One column's block, checked against the page.
struct Block<'p> {
    tag: u8,
    nulls: Option<&'p [u8]>,
    w: u32,
    aux: u32,
    base: i64,
    entries: usize,
    long: usize,
    /// The values (after header and bitmap) to the block's end.
    body: &'p [u8],
}

impl Block<'_> {
    /// The block of a column a reader did not ask for (no encoding: reading it is a
    /// [`Restart`]).
    const ABSENT: Block<'static> = Block { tag: 0, nulls: None, w: 0, aux: 0, base: 0, entries: 0, long: 0, body: &[] };
}

/// The blocks of a packed leaf (one per column, in schema order), each checked against the
/// page. With `need`, a leaf with a directory has only the blocks of the columns it marks
/// read (the others are [`Block::ABSENT`], their bytes never looked at: a partial read of
/// the page may not hold them).
fn blocks<'p>(page: &'p [u8], schema: &Schema, p: &Packed, need: Option<&[bool]>) -> Result<Vec<Block<'p>>, Restart> {
    let mut out = Vec::with_capacity(schema.len());
    let page = &page[..p.used];
    let absent = |c: usize| need.is_some_and(|m| !m.get(c).copied().unwrap_or(true));
    if !p.dir {
        // (All parsed, one after another; those not asked for are left out as for a leaf
        // with a directory.)
        let mut at = HDR;
        for c in 0..schema.len() {
            let (b, len) = block_at(page, at, p.count)?;
            out.push(if absent(c) { Block::ABSENT } else { b });
            at += len;
        }
        return Ok(out);
    }
    let blocks_from = HDR + dir_bytes(schema.len());
    for c in 0..schema.len() {
        if absent(c) {
            out.push(Block::ABSENT);
            continue;
        }
        let (start, end, _) = dir_entry(page, c)?;
        if start < blocks_from || end > page.len() || start > end {
            return Err(Restart);
        }
        let (b, len) = block_at(page, start, p.count)?;
        if start + len != end {
            return Err(Restart);
        }
        out.push(b);
    }
    Ok(out)
}

/// Directory entry `c` of a leaf with a directory: its block's start, end and checksum.
fn dir_entry(page: &[u8], c: usize) -> Result<(usize, usize, u32), Restart> {
    let e = HDR + DIR_PRE + c * DIR_ENTRY;
    let d = page.get(e..e + DIR_ENTRY).ok_or(Restart)?;
    let word = |at: usize| u32::from_le_bytes(d[at..at + 4].try_into().unwrap());
    Ok((word(0) as usize, word(4) as usize, word(8)))
}

/// The block at `at` of `page` (a leaf of `count` rows) and its length.
fn block_at(page: &[u8], at: usize, count: usize) -> Result<(Block<'_>, usize), Restart> {
    let h = page.get(at..at + BLOCK_HDR).ok_or(Restart)?;
    let len = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
    if len < BLOCK_HDR || !len.is_multiple_of(8) || at + len > page.len() || h[1] > 1 || h[2] > 64 {
        return Err(Restart);
    }
    let mut body = &page[at + BLOCK_HDR..at + len];
    let nulls = if h[1] == 1 {
        let nb = pax::bitmap_bytes(count);
        let (b, rest) = body.split_at_checked(nb).ok_or(Restart)?;
        body = rest;
        Some(b)
    } else {
        None
    };
    let block = Block {
        tag: h[0],
        nulls,
        w: h[2] as u32,
        aux: h[3] as u32,
        base: i64::from_le_bytes(h[8..16].try_into().unwrap()),
        entries: usize::try_from(u64::from_le_bytes(h[16..24].try_into().unwrap())).map_err(|_| Restart)?,
        long: usize::try_from(u64::from_le_bytes(h[24..32].try_into().unwrap())).map_err(|_| Restart)?,
        body,
    };
    Ok((block, len))
}

/// The encoding tag of each column's block of a packed leaf (for inspection and tests).
pub fn encodings(page: &[u8], schema: &Schema) -> Result<Vec<u8>, Restart> {
    let p = header(page, schema)?;
    Ok(blocks(page, schema, &p, None)?.iter().map(|b| b.tag).collect())
}

fn is_null(nulls: Option<&[u8]>, i: usize) -> bool {
    nulls.is_some_and(|b| b[i / 8] >> (i % 8) & 1 == 1)
}

/// Expands the packed leaf `page` into `out`: a plain PAX image of its rows (laid out for
/// `cap = count`, long strings in the var area at the end, in column order; a dictionary's
/// long entry once, where all its rows point), which every reader of plain leaves reads
/// unchanged; returns its header. With `need`, only the columns it marks are filled (the
/// others' bytes are left as `out` held them, never to be read; the fixed-width part keeps
/// its layout, the var area holds the filled columns' long strings only).
pub fn expand(page: &[u8], schema: &Schema, need: Option<&[bool]>, out: &mut Vec<u8>) -> Result<Leaf, Restart> {
    let pl = PackedLeaf::open_columns(page, schema, need)?;
    let fill: Vec<Fill> = (0..schema.len()).map(|c| if need.is_none_or(|m| m.get(c).copied().unwrap_or(true)) { Fill::All } else { Fill::No }).collect();
    pl.expand(schema, &fill, &[], out)
}

/// How [`PackedLeaf::expand`] fills a column of the plain image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// Not at all (its bytes are left as they were: never read).
    No,
    /// Every row.
    All,
    /// The rows of the selection only (the others' values are left as they were and must
    /// not be read; the NULL bitmap is whole). Strings stored plain or compressed are
    /// decoded whole (a row's bytes are found through the lengths of the rows before it).
    Rows,
}

/// A packed leaf opened for reading: its header and its columns' blocks, checked against
/// the page. Predicates read the columns in their stored form ([`PackedLeaf::column`]);
/// rows are read from the plain image [`PackedLeaf::expand`] makes.
pub struct PackedLeaf<'p> {
    /// The leaf's header.
    pub header: Packed,
    blocks: Vec<Block<'p>>,
    /// The page's size.
    size: usize,
}

/// A column of a packed leaf as stored, for evaluating predicates without decoding it.
/// Bit-packed values `u` (`w` bits each, read a chunk at a time by [`Column::chunks`])
/// stand for the values `base + u` or [`Column::decimal`]; NULL rows hold `u = 0`
/// (their NULL bits say so, [`PackedLeaf::nulls`]).
pub enum Column<'p> {
    /// `i64`, `date` or `bool`: value `base + u`.
    Ints { base: i64, w: u32, body: &'p [u8] },
    /// `f64` decimals: value `(base + u) / 10^scale`.
    Decimals { base: i64, w: u32, scale: usize, body: &'p [u8] },
    /// `f64` bit patterns, 8 little-endian bytes per row.
    Raw(&'p [u8]),
    /// Strings from a dictionary: `u` is the entry's index.
    Dict { entries: Vec<&'p [u8]>, w: u32, body: &'p [u8] },
    /// Strings stored one after another (plain or compressed): read them expanded.
    Strings,
}

impl Column<'_> {
    /// Calls `f(first, values)` for the bit-packed values of the leaf's `n` rows a chunk at a
    /// time (nothing for [`Column::Raw`] and [`Column::Strings`]).
    #[inline]
    pub fn chunks(&self, n: usize, f: impl FnMut(usize, &[u64]) -> Result<(), Restart>) -> Result<(), Restart> {
        match *self {
            Column::Ints { w, body, .. } | Column::Decimals { w, body, .. } | Column::Dict { w, body, .. } => for_each_chunk(body, w, n, f),
            Column::Raw(_) | Column::Strings => Ok(()),
        }
    }

    /// The bit-packed value of row `i` (0 for [`Column::Raw`] and [`Column::Strings`]);
    /// `i` must be below the leaf's row count.
    #[inline]
    pub fn at(&self, i: usize) -> u64 {
        match *self {
            Column::Ints { w, body, .. } | Column::Decimals { w, body, .. } | Column::Dict { w, body, .. } => unpack_one(body, w, i),
            Column::Raw(_) | Column::Strings => 0,
        }
    }

    /// The value a decimal column's `u` stands for: the double [`expand`] makes of it
    /// (`(base + u) as f64 / 10^scale`; for any `u`, not only stored ones, non-decreasing in
    /// `u`).
    pub fn decimal(base: i64, scale: usize, u: u64) -> f64 {
        (base as i128 + u as i128) as f64 / POW10[scale.min(MAX_SCALE)]
    }
}

impl<'p> PackedLeaf<'p> {
    /// Opens the packed leaf `page` (header and blocks checked against the page).
    pub fn open(page: &'p [u8], schema: &Schema) -> Result<Self, Restart> {
        PackedLeaf::open_columns(page, schema, None)
    }

    /// Opens the packed leaf `page` for reading the columns `need` marks (all without it):
    /// the others' blocks are not looked at (a [`ColumnRead`] of the page may not have read
    /// them), and reading them is a [`Restart`] (as for [`Fill::No`], they are not
    /// expanded).
    pub fn open_columns(page: &'p [u8], schema: &Schema, need: Option<&[bool]>) -> Result<Self, Restart> {
        let header = header(page, schema)?;
        let blocks = blocks(page, schema, &header, need)?;
        Ok(PackedLeaf { header, blocks, size: page.len() })
    }

    /// The NULL bitmap of column `c` (bit `i` of byte `i / 8` set for NULL), if it has one;
    /// `Err` for a column the leaf was not opened for ([`open_columns`](Self::open_columns)).
    pub fn nulls(&self, c: usize) -> Result<Option<&'p [u8]>, Restart> {
        let b = &self.blocks[c];
        if b.tag == Block::ABSENT.tag {
            return Err(Restart);
        }
        Ok(b.nulls)
    }

    /// Column `c` (of type `ty`) as stored; `Err` if its block does not hold the leaf's rows.
    pub fn column(&self, c: usize, ty: ColumnType) -> Result<Column<'p>, Restart> {
        let b = &self.blocks[c];
        let n = self.header.count;
        let bits = |w: u32| if b.body.len() >= packed_bytes(n, w) { Ok(()) } else { Err(Restart) };
        Ok(match (ty, b.tag) {
            (ColumnType::I64 | ColumnType::Date | ColumnType::Bool, TAG_INT) => {
                bits(b.w)?;
                Column::Ints { base: b.base, w: b.w, body: b.body }
            }
            (ColumnType::F64, TAG_DEC) => {
                bits(b.w)?;
                if b.aux as usize > MAX_SCALE {
                    return Err(Restart);
                }
                Column::Decimals { base: b.base, w: b.w, scale: b.aux as usize, body: b.body }
            }
            (ColumnType::F64, TAG_RAW) => Column::Raw(b.body.get(..n * 8).ok_or(Restart)?),
            (ColumnType::Str | ColumnType::Bytes, TAG_DICT) => {
                let DictParts { bytes: dict, offs, codes } = dict_parts(b, n)?;
                Column::Dict { entries: offs.windows(2).map(|o| &dict[o[0]..o[1]]).collect(), w: b.w, body: codes }
            }
            (ColumnType::Str | ColumnType::Bytes, TAG_PLAIN | TAG_FSST) => Column::Strings,
            _ => return Err(Restart),
        })
    }

    /// Expands the leaf into `out` as [`expand`] does, column `c` filled as `fill[c]` says;
    /// `rows` is the selection for [`Fill::Rows`] (bit `i` of word `i / 64` set for row `i`).
    pub fn expand(&self, schema: &Schema, fill: &[Fill], rows: &[u64], out: &mut Vec<u8>) -> Result<Leaf, Restart> {
        let n = self.header.count;
        let fixed = pax::fixed_end(schema, n);
        let how = |c: usize| fill.get(c).copied().unwrap_or(Fill::All);
        // The var area holds the long strings of the filled columns.
        let mut long = 0usize;
        for (c, b) in self.blocks.iter().enumerate() {
            if how(c) != Fill::No {
                long = long.checked_add(b.long).ok_or(Restart)?;
            }
        }
        let total = fixed.checked_add(long).ok_or(Restart)?;
        if total > max_expanded(self.size) {
            return Err(Restart);
        }
        // Only the header and the filled columns are written (a fixed-width column's values
        // whole, others zeroed first where they are filled whole); the bytes of the others
        // are left as an earlier expansion left them, never read (readers of an expansion
        // read only the rows and columns it was made for).
        out.resize(total, 0);
        out[..HDR].fill(0);
        let words = [(KIND_PAX as u64) | ((n as u64) << 32), fixed as u64, n as u64, self.header.first, schema.len() as u64];
        for (i, w) in words.iter().enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        let (head, var) = out.split_at_mut(fixed);
        let mut var_at = 0usize;
        let mut bitmap = HDR;
        for (c, (def, b)) in schema.columns.iter().zip(&self.blocks).enumerate() {
            let values = bitmap + pax::bitmap_bytes(n);
            let end = bitmap + pax::column_bytes(def.ty, n);
            let how = how(c);
            if how != Fill::No {
                head[bitmap..values].fill(0);
                if let Some(bits) = b.nulls {
                    // (`blocks` took exactly the plain layout's bitmap bytes.)
                    head[bitmap..bitmap + bits.len()].copy_from_slice(bits);
                }
                let dst = &mut head[values..end];
                let var_col = var.get_mut(var_at..var_at + b.long).ok_or(Restart)?;
                if how == Fill::Rows && !matches!(b.tag, TAG_PLAIN | TAG_FSST) {
                    decode_rows(def.ty, b, n, rows, dst, var_col, fixed + var_at)?;
                } else {
                    // Fixed-width decoders write every row's value: only the padding
                    // after them is zeroed (the others write some rows' bytes only).
                    let whole = match b.tag {
                        TAG_INT | TAG_DEC | TAG_RAW => n * def.ty.fixed_width(),
                        _ => 0,
                    };
                    let whole = whole.min(dst.len());
                    dst[whole..].fill(0);
                    decode_column(def.ty, b, n, dst, var_col, fixed + var_at)?;
                }
                var_at += b.long;
            }
            bitmap = end;
        }
        Ok(Leaf { count: n, var: fixed, cap: n, first: self.header.first })
    }
}

/// Decodes a block's values into the plain value area `dst` (and the long strings into
/// `var`, which lies at `var_off` in the image).
fn decode_column(ty: ColumnType, b: &Block<'_>, n: usize, dst: &mut [u8], var: &mut [u8], var_off: usize) -> Result<(), Restart> {
    match (ty, b.tag) {
        (ColumnType::I64 | ColumnType::Date | ColumnType::Bool, TAG_INT) => decode_ints(ty, b, n, dst),
        (ColumnType::F64, TAG_DEC) => decode_decimals(b, n, dst),
        (ColumnType::F64, TAG_RAW) => {
            let src = b.body.get(..n * 8).ok_or(Restart)?;
            dst[..n * 8].copy_from_slice(src);
            zero_nulls(b.nulls, n, dst, 8);
            Ok(())
        }
        (ColumnType::Str | ColumnType::Bytes, TAG_DICT) => decode_dict(b, n, dst, var, var_off),
        (ColumnType::Str | ColumnType::Bytes, TAG_PLAIN) => decode_plain(b, n, dst, var, var_off),
        (ColumnType::Str | ColumnType::Bytes, TAG_FSST) => decode_fsst(b, n, dst, var, var_off),
        _ => Err(Restart),
    }
}

/// Zeroes the values of NULL rows (as a plain leaf has them).
fn zero_nulls(nulls: Option<&[u8]>, n: usize, dst: &mut [u8], width: usize) {
    if let Some(bits) = nulls {
        for i in 0..n {
            if is_null(Some(bits), i) {
                dst[i * width..(i + 1) * width].fill(0);
            }
        }
    }
}

/// Values per chunk of [`unpack`] in the decoders.
const CHUNK: usize = 256;

/// Values `start .. start + out.len()` of the `w`-bit values (`w <= 56`) packed LSB first in
/// `src` (the layout [`BitReader`] reads). Each value is one unaligned 8-byte load, a shift
/// and a mask, independent of the others (the reader's carried state serializes them).
/// For each width there is a loop of its own ([`unpack_w`]): eight values of `w` bits
/// start on a byte boundary, so within a group of eight every load's offset and every
/// shift is a constant.
#[inline]
fn unpack(src: &[u8], w: u32, start: usize, out: &mut [u64]) {
    debug_assert!(w <= 56);
    macro_rules! widths {
        ($($n:literal)*) => {
            match w {
                0 => out.fill(0),
                $($n => unpack_w::<$n>(src, start, out),)*
                _ => unpack_any(src, w, start, out),
            }
        };
    }
    widths!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32
        33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56);
}

/// [`unpack`] for values of `W` bits: the values before the first whole group of eight,
/// and those after the last group whose loads stay inside `src`, by [`unpack_any`].
#[inline(always)]
fn unpack_w<const W: usize>(src: &[u8], start: usize, out: &mut [u64]) {
    let mask = (1u64 << W) - 1;
    // Bytes a group of eight reads: its last value's 8-byte window ends here.
    let span = ((7 * W) >> 3) + 8;
    let head = ((8 - start % 8) % 8).min(out.len());
    unpack_any(src, W as u32, start, &mut out[..head]);
    let mut j = head;
    while j + 8 <= out.len() {
        // (start + j) is a multiple of 8: the group starts at a byte boundary.
        let base = (start + j) / 8 * W;
        let Some(g) = src.get(base..base + span) else { break };
        for (l, o) in out[j..j + 8].iter_mut().enumerate() {
            let at = (l * W) >> 3;
            let word = u64::from_le_bytes(g[at..at + 8].try_into().unwrap_or_default());
            *o = (word >> ((l * W) & 7)) & mask;
        }
        j += 8;
    }
    unpack_any(src, W as u32, start + j, &mut out[j..]);
}

/// [`unpack`] for any width `w` (1 to 56): the last few values, whose 8 bytes would pass the
/// end of `src`, put together byte by byte.
fn unpack_any(src: &[u8], w: u32, start: usize, out: &mut [u64]) {
    if out.is_empty() {
        return;
    }
    let (w, mask) = (w as usize, (1u64 << w) - 1);
    // Value i's 8-byte window starts at byte i * w / 8: inside `src` for i <= last_fast.
    let fast = if src.len() >= 8 { ((src.len() - 8) * 8 / w + 1).saturating_sub(start).min(out.len()) } else { 0 };
    for (j, o) in out[..fast].iter_mut().enumerate() {
        let bit = (start + j) * w;
        let at = bit >> 3;
        let word = u64::from_le_bytes(src[at..at + 8].try_into().unwrap_or_default());
        *o = (word >> (bit & 7)) & mask;
    }
    for (j, o) in out.iter_mut().enumerate().skip(fast) {
        let bit = (start + j) * w;
        let mut word = [0u8; 8];
        let from = (bit >> 3).min(src.len());
        let to = (from + 8).min(src.len());
        word[..to - from].copy_from_slice(&src[from..to]);
        *o = (u64::from_le_bytes(word) >> (bit & 7)) & mask;
    }
}

/// Calls `f(first, values)` for the `n` values of `w` bits in `body`, a chunk at a time
/// (the caller checked that `body` holds them): [`unpack`]ed, or read by a [`BitReader`]
/// for widths above 56 bits.
#[inline]
fn for_each_chunk(body: &[u8], w: u32, n: usize, mut f: impl FnMut(usize, &[u64]) -> Result<(), Restart>) -> Result<(), Restart> {
    let mut buf = [0u64; CHUNK];
    let mut wide = (w > 56).then(|| BitReader::new(body, w));
    let mut start = 0;
    while start < n {
        let k = CHUNK.min(n - start);
        match wide.as_mut() {
            Some(r) => buf[..k].iter_mut().for_each(|v| *v = r.next()),
            None => unpack(body, w, start, &mut buf[..k]),
        }
        f(start, &buf[..k])?;
        start += k;
    }
    Ok(())
}

fn decode_ints(ty: ColumnType, b: &Block<'_>, n: usize, dst: &mut [u8]) -> Result<(), Restart> {
    if b.body.len() < packed_bytes(n, b.w) {
        return Err(Restart);
    }
    let base = b.base;
    // A value out of its type's range is impossible, but where the row is NULL (its slot
    // is zeroed after).
    let check = |i: usize, ok: bool| if ok || is_null(b.nulls, i) { Ok(()) } else { Err(Restart) };
    let width = match ty {
        ColumnType::I64 => 8,
        ColumnType::Date => 4,
        _ => 1,
    };
    // Whether every value the block can hold (`base + u` for `u` of `w` bits) is in the
    // type's range: then no value is checked (the usual case, a loop the compiler
    // vectorizes; checking each date cost a quarter of a date-heavy scan's time).
    let top = base as i128 + if b.w >= 64 { u64::MAX as i128 } else { (1i128 << b.w) - 1 };
    let fits = |lo: i128, hi: i128| base as i128 >= lo && top <= hi;
    let (dates_fit, bools_fit) = (fits(i32::MIN as i128, i32::MAX as i128), fits(0, 1));
    for_each_chunk(b.body, b.w, n, |at, vals| {
        let dst = &mut dst[at * width..(at + vals.len()) * width];
        match ty {
            ColumnType::Date if dates_fit => {
                for (d, &v) in dst.chunks_exact_mut(4).zip(vals) {
                    d.copy_from_slice(&(base.wrapping_add(v as i64) as i32).to_le_bytes());
                }
            }
            ColumnType::Bool if bools_fit => {
                for (d, &v) in dst.iter_mut().zip(vals) {
                    *d = base.wrapping_add(v as i64) as u8;
                }
            }
            ColumnType::I64 => {
                for (d, &v) in dst.chunks_exact_mut(8).zip(vals) {
                    d.copy_from_slice(&base.wrapping_add(v as i64).to_le_bytes());
                }
            }
            ColumnType::Date => {
                for (i, (d, &v)) in dst.chunks_exact_mut(4).zip(vals).enumerate() {
                    let v = base.wrapping_add(v as i64);
                    check(at + i, i32::try_from(v).is_ok())?;
                    d.copy_from_slice(&(v as i32).to_le_bytes());
                }
            }
            _ => {
                for (i, (d, &v)) in dst.iter_mut().zip(vals).enumerate() {
                    let v = base.wrapping_add(v as i64);
                    check(at + i, (0..=1).contains(&v))?;
                    *d = v as u8;
                }
            }
        }
        Ok(())
    })?;
    zero_nulls(b.nulls, n, dst, width);
    Ok(())
}

/// 2^52 + 2^51: adding an integer of magnitude below 2^51 to its bits as a double and
/// subtracting it converts the integer exactly, in a form that vectorizes.
const MAGIC: f64 = 6_755_399_441_055_744.0;

/// Widest codes [`decode_decimals`] converts through a table of their doubles.
const TABLE_BITS: u32 = 8;

fn decode_decimals(b: &Block<'_>, n: usize, dst: &mut [u8]) -> Result<(), Restart> {
    if b.body.len() < packed_bytes(n, b.w) || b.aux as usize > MAX_SCALE {
        return Err(Restart);
    }
    let (p, base) = (POW10[b.aux as usize], b.base);
    // Every k = base + v has |k| < 2^51 here: converted through MAGIC (the same doubles as
    // `k as f64`, then the same correctly rounded division); otherwise `as f64`.
    let magic = (b.w <= 50 && base.unsigned_abs() < 1 << 50).then_some(MAGIC.to_bits() as i64);
    // Few distinct codes (narrow values: a discount, a tax rate, a quantity): each code's
    // double computed once, by the same expression, and looked up (a division costs as much
    // as the rest of the decoding together).
    let table: Option<Vec<f64>> = (b.w <= TABLE_BITS && (1usize << b.w) <= n).then(|| (0..1i64 << b.w).map(|u| base.wrapping_add(u) as f64 / p).collect());
    let mut out = [0f64; CHUNK];
    for_each_chunk(b.body, b.w, n, |at, vals| {
        let out = &mut out[..vals.len()];
        match (&table, magic) {
            // (`vals` are `w`-bit codes: every one indexes the table.)
            (Some(t), _) => out.iter_mut().zip(vals).for_each(|(o, &v)| *o = t[v as usize & (t.len() - 1)]),
            (None, Some(m)) => {
                out.iter_mut().zip(vals).for_each(|(o, &v)| *o = (f64::from_bits(m.wrapping_add(base.wrapping_add(v as i64)) as u64) - MAGIC) / p)
            }
            (None, None) => out.iter_mut().zip(vals).for_each(|(o, &v)| *o = base.wrapping_add(v as i64) as f64 / p),
        }
        for (d, o) in dst[at * 8..(at + vals.len()) * 8].chunks_exact_mut(8).zip(out.iter()) {
            d.copy_from_slice(&o.to_bits().to_le_bytes());
        }
        Ok(())
    })?;
    zero_nulls(b.nulls, n, dst, 8);
    Ok(())
}

/// Reads `count` bit-packed lengths (frame `base`, `lw` bits) from the front of `body` into
/// `lens`; returns the rest of `body`.
fn read_lengths<'p>(body: &'p [u8], count: usize, base: i64, lw: u32, lens: &mut Vec<u32>) -> Result<&'p [u8], Restart> {
    if lw > 32 || base < 0 || base > u32::MAX as i64 {
        return Err(Restart);
    }
    let nb = packed_bytes(count, lw);
    if body.len() < nb {
        return Err(Restart);
    }
    lens.clear();
    lens.reserve(count);
    let mut r = BitReader::new(body, lw);
    for _ in 0..count {
        let l = u32::try_from(base as u64 + r.next()).map_err(|_| Restart)?;
        lens.push(l);
    }
    Ok(&body[nb..])
}

/// Writes the plain 16-byte header of string `s` into `h`; a long one's bytes go to `var`
/// at `*var_at` (advanced), which lies at `var_off` in the image.
#[inline]
fn put_string(h: &mut [u8], s: &[u8], var: &mut [u8], var_at: &mut usize, var_off: usize) -> Result<(), Restart> {
    h[..4].copy_from_slice(&(s.len() as u32).to_le_bytes());
    if s.len() <= 12 {
        h[4..4 + s.len()].copy_from_slice(s);
    } else {
        let d = var.get_mut(*var_at..*var_at + s.len()).ok_or(Restart)?;
        d.copy_from_slice(s);
        h[4..8].copy_from_slice(&s[..4]);
        h[8..16].copy_from_slice(&((var_off + *var_at) as u64).to_le_bytes());
        *var_at += s.len();
    }
    Ok(())
}

fn decode_plain(b: &Block<'_>, n: usize, dst: &mut [u8], var: &mut [u8], var_off: usize) -> Result<(), Restart> {
    let mut lens = Vec::new();
    let bytes = read_lengths(b.body, n, b.base, b.aux, &mut lens)?;
    let (mut at, mut var_at) = (0usize, 0usize);
    for (i, (h, &len)) in dst.chunks_exact_mut(16).zip(&lens).enumerate() {
        if is_null(b.nulls, i) {
            continue;
        }
        let s = bytes.get(at..at + len as usize).ok_or(Restart)?;
        at += len as usize;
        put_string(h, s, var, &mut var_at, var_off)?;
    }
    if var_at != var.len() {
        return Err(Restart);
    }
    Ok(())
}

fn decode_fsst(b: &Block<'_>, n: usize, dst: &mut [u8], var: &mut [u8], var_off: usize) -> Result<(), Restart> {
    let (dec, rest) = fsst::Decoder::read(b.body, b.entries)?;
    let mut lens = Vec::new();
    let codes = read_lengths(rest, n, b.base, b.aux, &mut lens)?;
    let mut buf = Vec::new();
    let (mut at, mut var_at) = (0usize, 0usize);
    for (i, (h, &len)) in dst.chunks_exact_mut(16).zip(&lens).enumerate() {
        if is_null(b.nulls, i) {
            continue;
        }
        let c = codes.get(at..at + len as usize).ok_or(Restart)?;
        at += len as usize;
        // Straight into the var area where it has room (a short string is then moved to
        // the header and its bytes there overwritten by the next long ones).
        let free = &mut var[var_at..];
        if free.len() >= fsst::Decoder::room(c) {
            let m = dec.decode_into(c, free)?;
            h[..4].copy_from_slice(&(m as u32).to_le_bytes());
            if m <= 12 {
                h[4..4 + m].copy_from_slice(&free[..m]);
            } else {
                h[4..8].copy_from_slice(&free[..4]);
                h[8..16].copy_from_slice(&((var_off + var_at) as u64).to_le_bytes());
                var_at += m;
            }
        } else {
            // A code stands for at least half a byte: codes for more than the room left
            // (or an inline string) are impossible, which also bounds the scratch buffer.
            if c.len() / 2 > free.len().max(12) {
                return Err(Restart);
            }
            let m = dec.decode(c, &mut buf)?;
            put_string(h, &buf[..m], var, &mut var_at, var_off)?;
        }
    }
    if var_at != var.len() {
        return Err(Restart);
    }
    Ok(())
}

/// A dictionary block's parts.
struct DictParts<'p> {
    /// The entries' bytes, concatenated.
    bytes: &'p [u8],
    /// Each entry's offset into `bytes`, and the end.
    offs: Vec<usize>,
    /// The codes (holding the leaf's rows).
    codes: &'p [u8],
}

/// A dictionary block's parts (the codes checked to hold `n` codes).
fn dict_parts<'p>(b: &Block<'p>, n: usize) -> Result<DictParts<'p>, Restart> {
    if b.entries > DICT_MAX || (b.entries == 0 && n > 0 && b.nulls.is_none()) {
        return Err(Restart);
    }
    let mut lens = Vec::new();
    let rest = read_lengths(b.body, b.entries, b.base, b.aux, &mut lens)?;
    let mut offs = Vec::with_capacity(lens.len() + 1);
    let mut total = 0usize;
    offs.push(0);
    for &l in &lens {
        total += l as usize;
        offs.push(total);
    }
    let dict = rest.get(..total).ok_or(Restart)?;
    let codes = &rest[align8(total).min(rest.len())..];
    if codes.len() < packed_bytes(n, b.w) {
        return Err(Restart);
    }
    Ok(DictParts { bytes: dict, offs, codes })
}

/// A dictionary's entries as plain 16-byte headers, each made when a row first needs it
/// (a long entry's bytes written to the var area then, once, where every row of it points;
/// so a var area sized for a copy per row may end early).
struct DictHeads<'p> {
    parts: DictParts<'p>,
    heads: Vec<[u8; 16]>,
    ready: Vec<bool>,
    var_at: usize,
}

impl<'p> DictHeads<'p> {
    fn new(b: &Block<'p>, n: usize) -> Result<Self, Restart> {
        let parts = dict_parts(b, n)?;
        let entries = parts.offs.len() - 1;
        Ok(DictHeads { parts, heads: vec![[0u8; 16]; entries], ready: vec![false; entries], var_at: 0 })
    }

    /// The header of entry `code` (the var area `var` lies at `var_off` in the image).
    #[inline]
    fn head(&mut self, code: usize, var: &mut [u8], var_off: usize) -> Result<&[u8; 16], Restart> {
        if !*self.ready.get(code).ok_or(Restart)? {
            let o = &self.parts.offs;
            put_string(&mut self.heads[code], &self.parts.bytes[o[code]..o[code + 1]], var, &mut self.var_at, var_off)?;
            self.ready[code] = true;
        }
        Ok(&self.heads[code])
    }
}

/// Decodes a dictionary block, each entry's header made once and copied to its rows.
fn decode_dict(b: &Block<'_>, n: usize, dst: &mut [u8], var: &mut [u8], var_off: usize) -> Result<(), Restart> {
    let mut dh = DictHeads::new(b, n)?;
    let codes = dh.parts.codes;
    if b.nulls.is_none() && dh.parts.offs.windows(2).all(|o| o[1] - o[0] <= 12) {
        // Short entries only (inline in their headers: nothing goes to the var area) and no
        // NULL: every header made first, then a plain copy per row.
        for code in 0..dh.heads.len() {
            dh.head(code, var, var_off)?;
        }
        let heads = &dh.heads;
        return for_each_chunk(codes, b.w, n, |at, vals| {
            for (d, &c) in dst[at * 16..(at + vals.len()) * 16].chunks_exact_mut(16).zip(vals) {
                d.copy_from_slice(heads.get(c as usize).ok_or(Restart)?);
            }
            Ok(())
        });
    }
    for_each_chunk(codes, b.w, n, |at, vals| {
        for (j, &c) in vals.iter().enumerate() {
            let i = at + j;
            if !is_null(b.nulls, i) {
                dst[i * 16..i * 16 + 16].copy_from_slice(dh.head(c as usize, var, var_off)?);
            }
        }
        Ok(())
    })
}

/// Value `i` of the `w`-bit values packed in `src` (which holds them: [`packed_bytes`]).
#[inline]
fn unpack_one(src: &[u8], w: u32, i: usize) -> u64 {
    if w == 0 {
        return 0;
    }
    let bit = i * w as usize;
    let at = bit >> 3;
    let word = match src.get(at..at + 16) {
        Some(b) => u128::from_le_bytes(b.try_into().expect("16 bytes")),
        None => {
            let mut buf = [0u8; 16];
            let end = (at + 16).min(src.len());
            if at < end {
                buf[..end - at].copy_from_slice(&src[at..end]);
            }
            u128::from_le_bytes(buf)
        }
    };
    let v = (word >> (bit & 7)) as u64;
    if w >= 64 {
        v
    } else {
        v & ((1u64 << w) - 1)
    }
}

/// Decodes the selected rows (`rows`, a bitmap) of a block of integers, decimals, raw
/// doubles or dictionary strings into the plain value area `dst` (long strings into `var`,
/// at `var_off` in the image), as [`decode_column`] does for every row.
fn decode_rows(ty: ColumnType, b: &Block<'_>, n: usize, rows: &[u64], dst: &mut [u8], var: &mut [u8], var_off: usize) -> Result<(), Restart> {
    let width = ty.fixed_width();
    let mut dict = if b.tag == TAG_DICT { Some(DictHeads::new(b, n)?) } else { None };
    match (ty, b.tag) {
        (ColumnType::I64 | ColumnType::Date | ColumnType::Bool, TAG_INT) | (ColumnType::F64, TAG_DEC) => {
            if b.body.len() < packed_bytes(n, b.w) || (b.tag == TAG_DEC && b.aux as usize > MAX_SCALE) {
                return Err(Restart);
            }
        }
        (ColumnType::F64, TAG_RAW) => {
            if b.body.len() < n * 8 {
                return Err(Restart);
            }
        }
        (ColumnType::Str | ColumnType::Bytes, TAG_DICT) => {}
        _ => return Err(Restart),
    }
    for i in crate::util::set_bits(rows).take_while(|&i| i < n) {
        let d = &mut dst[i * width..(i + 1) * width];
        if is_null(b.nulls, i) {
            d.fill(0);
            continue;
        }
        match (ty, b.tag) {
            (ColumnType::I64, _) => d.copy_from_slice(&b.base.wrapping_add(unpack_one(b.body, b.w, i) as i64).to_le_bytes()),
            (ColumnType::Date, _) => {
                let v = i32::try_from(b.base.wrapping_add(unpack_one(b.body, b.w, i) as i64)).map_err(|_| Restart)?;
                d.copy_from_slice(&v.to_le_bytes());
            }
            (ColumnType::Bool, _) => {
                let v = b.base.wrapping_add(unpack_one(b.body, b.w, i) as i64);
                d[0] = u8::try_from(v).ok().filter(|&v| v <= 1).ok_or(Restart)?;
            }
            (ColumnType::F64, TAG_DEC) => {
                let v = b.base.wrapping_add(unpack_one(b.body, b.w, i) as i64) as f64 / POW10[b.aux as usize];
                d.copy_from_slice(&v.to_bits().to_le_bytes());
            }
            (ColumnType::F64, _) => d.copy_from_slice(&b.body[i * 8..i * 8 + 8]),
            _ => {
                let dh = dict.as_mut().ok_or(Restart)?;
                let code = unpack_one(dh.parts.codes, b.w, i) as usize;
                d.copy_from_slice(dh.head(code, var, var_off)?);
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------ partial reads

/// What a scan of some columns needs of a packed leaf with a directory: its header, its
/// directory and the blocks of those columns ([`PartialRead`]); verified with the
/// directory's checksums. Any other page is read whole.
pub struct ColumnRead<'a> {
    schema: &'a Schema,
    need: &'a [bool],
}

impl<'a> ColumnRead<'a> {
    /// Partial reads for a scan of `schema`'s columns that `need` marks.
    pub fn new(schema: &'a Schema, need: &'a [bool]) -> Self {
        ColumnRead { schema, need }
    }

    fn needed(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.schema.len()).filter(|&c| self.need.get(c).copied().unwrap_or(true))
    }
}

impl PartialRead for ColumnRead<'_> {
    fn ranges(&self, head: &[u8], out: &mut Vec<std::ops::Range<usize>>) -> bool {
        let cols = self.schema.len();
        let dir_end = HDR + dir_bytes(cols);
        let Some(h) = head.get(..dir_end) else { return false };
        let word = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().unwrap());
        let used = word(W_USED) as usize;
        if word(0) as u8 != KIND_PACKED || word(W_FLAGS) & FLAG_DIR == 0 || word(W_COLS) != cols as u64 {
            return false;
        }
        out.push(0..dir_end);
        for c in self.needed() {
            let Ok((start, end, _)) = dir_entry(h, c) else { return false };
            if start > end || end > used {
                return false;
            }
            out.push(start..end);
        }
        true
    }

    fn verify(&self, payload: &[u8]) -> bool {
        let cols = self.schema.len();
        if payload.len() < HDR + dir_bytes(cols) || u32::from_le_bytes(payload[HDR..HDR + 4].try_into().unwrap()) != dir_crc(payload, cols) {
            return false;
        }
        self.needed()
            .all(|c| dir_entry(payload, c).is_ok_and(|(start, end, crc)| start <= end && payload.get(start..end).is_some_and(|b| crc32c::crc32c(b) == crc)))
    }
}

/// Whether every block of a packed leaf with a directory matches its checksum, and the
/// directory its own (true for a leaf without one: the page's checksum covers it).
pub fn checksums_match(page: &[u8], schema: &Schema) -> Result<bool, Restart> {
    let p = header(page, schema)?;
    if !p.dir {
        return Ok(true);
    }
    let all = vec![true; schema.len()];
    Ok(ColumnRead::new(schema, &all).verify(&page[..p.used]))
}

/// The rows of a packed leaf (for repacking it with more rows), via its plain image.
pub fn rows(page: &[u8], schema: &Schema, out: &mut Vec<Vec<Value>>) -> Result<(), Restart> {
    let mut img = Vec::new();
    let leaf = expand(page, schema, None, &mut img)?;
    let mut row = Vec::with_capacity(schema.len());
    for i in 0..leaf.count {
        pax::read_row(&img[..], schema, &leaf, i, &mut row)?;
        out.push(std::mem::take(&mut row));
    }
    Ok(())
}

/// Reads row `i` of a packed leaf (seen through `s`, maybe optimistically: the bytes are
/// copied first, and anything impossible is a [`Restart`]) into `out`.
pub fn read_row<S: Src + ?Sized>(s: &S, schema: &Schema, i: usize, out: &mut Vec<Value>) -> Result<(), Restart> {
    let p = header(s, schema)?;
    let mut page = vec![0u8; s.size()];
    s.copy(0, &mut page[..p.used]);
    let mut img = Vec::new();
    let leaf = expand(&page, schema, None, &mut img)?;
    pax::read_row(&img[..], schema, &leaf, i, out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Rows of a leaf with every encoding: integers (narrow and 64 bits wide), dates,
    /// booleans, decimals, raw doubles, dictionary and plain or compressed strings, NULLs.
    pub(crate) fn mixed_rows(r: &mut crate::util::SplitMix64, n: usize, wide: bool) -> (Schema, Vec<Vec<Value>>) {
        let schema = Schema::parse("i:i64,w:i64,f:f64,x:f64,d:date,b:bool,s:str,t:str").unwrap();
        let words = ["AIR", "AIR REG", "DELIVER IN PERSON", "TAKE BACK RETURN", "", "MAIL", "é-ü"];
        let rows = (0..n)
            .map(|_| {
                let base = if wide { -(1 << 40) } else { 1000 };
                let mut row = vec![
                    Value::I64(base + r.below(5000) as i64),
                    Value::I64(if wide && r.below(3) == 0 { [i64::MIN, i64::MAX, -1][r.below(3) as usize] } else { r.below(100) as i64 - 50 }),
                    Value::F64((r.below(20000) as i64 - 10000) as f64 / 100.0),
                    Value::F64(if wide { f64::from_bits(r.next_u64() >> 2) } else { r.below(11) as f64 / 4.0 }),
                    Value::Date(9000 + r.below(400) as i32),
                    Value::Bool(r.below(2) == 0),
                    Value::Str(words[r.below(words.len() as u64) as usize].to_owned()),
                    Value::Str(format!("{}-{}", words[r.below(4) as usize], r.below(1 << 30))),
                ];
                for c in [0, 2, 4, 5, 6, 7] {
                    if r.below(9) == 0 {
                        row[c] = Value::Null;
                    }
                }
                row
            })
            .collect();
        (schema, rows)
    }

    /// A column expanded at selected rows only holds, at those rows, what the whole
    /// expansion holds (whatever the image held before), for every encoding.
    #[test]
    fn expanding_selected_rows_gives_their_values() {
        let mut r = crate::util::SplitMix64(41);
        let mut tags = std::collections::BTreeSet::new();
        for trial in 0..40 {
            let rows_wanted = 50 + r.below(700) as usize;
            let (schema, rows) = mixed_rows(&mut r, rows_wanted, trial % 2 == 0);
            let size = 64 << 10;
            let (n, _) = fit(&schema, size, &rows, true);
            let page = encode(size, &schema, 7, &rows[..n], false, true);
            tags.extend(encodings(&page, &schema).unwrap());
            let mut whole = Vec::new();
            let leaf = expand(&page, &schema, None, &mut whole).unwrap();
            let pl = PackedLeaf::open(&page, &schema).unwrap();
            let sel: Vec<u64> = (0..n.div_ceil(64)).map(|_| r.next_u64() & r.next_u64()).collect();
            let sel: Vec<u64> = sel.iter().enumerate().map(|(w, &x)| if (w + 1) * 64 > n { x & ((1u64 << (n % 64)) - 1) } else { x }).collect();
            let mut part = vec![0xAB; whole.len() + 100];
            let fill = vec![Fill::Rows; schema.len()];
            let got = pl.expand(&schema, &fill, &sel, &mut part).unwrap();
            assert_eq!(got, leaf);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for i in (0..n).filter(|&i| sel[i / 64] >> (i % 64) & 1 == 1) {
                pax::read_row(&whole[..], &schema, &leaf, i, &mut a).unwrap();
                pax::read_row(&part[..], &schema, &got, i, &mut b).unwrap();
                assert_eq!(format!("{a:?}"), format!("{b:?}"), "trial {trial} row {i}");
                assert_eq!(format!("{a:?}"), format!("{:?}", rows[i]), "trial {trial} row {i}");
            }
        }
        for t in [TAG_INT, TAG_DEC, TAG_RAW, TAG_DICT] {
            assert!(tags.contains(&t), "encoding {t} not exercised: {tags:?}");
        }
        assert!(tags.contains(&TAG_PLAIN) || tags.contains(&TAG_FSST), "{tags:?}");
    }

    #[test]
    fn unpack_reads_what_the_bit_reader_reads() {
        let mut r = crate::util::SplitMix64(9);
        for w in 0..=56u32 {
            for n in [0usize, 1, 7, 8, 9, 63, 64, 65, 300, 1000] {
                let mask = if w == 0 { 0 } else { (1u64 << w) - 1 };
                let vals: Vec<u64> = (0..n).map(|_| r.next_u64() & mask).collect();
                // Pack LSB first into whole little-endian words, as the encoder does.
                let mut words = vec![0u64; (n * w as usize).div_ceil(64)];
                for (i, &v) in vals.iter().enumerate().filter(|_| w > 0) {
                    let bit = i * w as usize;
                    words[bit / 64] |= v << (bit % 64);
                    if bit % 64 + w as usize > 64 {
                        words[bit / 64 + 1] |= v >> (64 - bit % 64);
                    }
                }
                let src: Vec<u8> = words.iter().flat_map(|x| x.to_le_bytes()).collect();
                assert_eq!(src.len(), packed_bytes(n, w));
                let mut br = BitReader::new(&src, w);
                let read: Vec<u64> = (0..n).map(|_| br.next()).collect();
                assert_eq!(read, vals, "bit reader, w {w} n {n}");
                for start in [0, n / 3, n.saturating_sub(5)] {
                    let mut out = vec![0u64; n - start];
                    unpack(&src, w, start, &mut out);
                    assert_eq!(out, vals[start..], "unpack w {w} n {n} start {start}");
                }
            }
        }
    }

    #[test]
    fn decimals_convert_exactly_through_the_magic_constant() {
        let mut r = crate::util::SplitMix64(3);
        let mut ks: Vec<i64> = vec![0, 1, -1, (1 << 51) - 1, -(1 << 51) + 1, 12345, -99999];
        ks.extend((0..10_000).map(|_| (r.next_u64() >> 13) as i64 - (1 << 50)));
        let magic = MAGIC.to_bits() as i64;
        for k in ks {
            assert_eq!(f64::from_bits(magic.wrapping_add(k) as u64) - MAGIC, k as f64, "{k}");
        }
    }
    use crate::util::SplitMix64;

    const SIZE: usize = 65536 - 32;

    fn schema() -> Schema {
        Schema::parse("id:i64,x:f64,d:date,b:bool,s:str,raw:bytes,price:f64,flag:str,comment:str").unwrap()
    }

    const NOUNS: [&str; 20] = [
        "foxes",
        "ideas",
        "theodolites",
        "pinto beans",
        "instructions",
        "dependencies",
        "excuses",
        "platelets",
        "asymptotes",
        "courts",
        "dolphins",
        "multipliers",
        "sauternes",
        "warthogs",
        "frets",
        "dinos",
        "attainments",
        "somas",
        "packages",
        "accounts",
    ];
    const VERBS: [&str; 16] =
        ["sleep", "wake", "are", "cajole", "haggle", "nag", "use", "boost", "affix", "detect", "integrate", "maintain", "nod", "was", "lose", "solve"];
    const ADJS: [&str; 14] =
        ["furious", "sly", "careful", "blithe", "quick", "fluffy", "slow", "quiet", "ruthless", "thin", "regular", "final", "ironic", "even"];
    const ADVS: [&str; 10] = ["sometimes", "always", "never", "furiously", "slyly", "carefully", "blithely", "quickly", "fluffily", "slowly"];
    const PREPS: [&str; 10] = ["about", "above", "according to", "across", "after", "against", "along", "among", "around", "beneath"];

    /// A TPC-H-like comment: a piece of 10 to 43 bytes of text from a small vocabulary
    /// (the real ones are cut from a pool of such sentences at random offsets).
    fn comment(r: &mut SplitMix64) -> String {
        let mut pick = |w: &[&str]| w[r.below(w.len() as u64) as usize].to_string();
        let text = format!(
            "{} {} {} {} {} the {} {}. {} {} {}",
            pick(&ADJS),
            pick(&NOUNS),
            pick(&VERBS),
            pick(&ADVS),
            pick(&PREPS),
            pick(&ADJS),
            pick(&NOUNS),
            pick(&NOUNS),
            pick(&VERBS),
            pick(&ADVS)
        );
        let len = 10 + r.below(34) as usize;
        let at = r.below((text.len() - len) as u64) as usize;
        text[at..at + len].to_string()
    }

    fn rand_str(r: &mut SplitMix64) -> String {
        let len = [0, 1, 5, 12, 13, 20, 40, 300][r.below(8) as usize];
        (0..len).map(|_| (b'a' + r.below(26) as u8) as char).collect()
    }

    fn random_row(r: &mut SplitMix64, i: i64) -> Vec<Value> {
        let null = |r: &mut SplitMix64| r.below(7) == 0;
        vec![
            if null(r) { Value::Null } else { Value::I64(i * 3 - 50 + r.below(10) as i64) },
            if null(r) {
                Value::Null
            } else {
                [Value::F64(1.0 / 3.0), Value::F64(f64::NAN), Value::F64(-0.0), Value::F64(f64::INFINITY), Value::F64(r.below(1000) as f64 / 7.0)]
                    [r.below(5) as usize]
                    .clone()
            },
            if null(r) { Value::Null } else { Value::Date(r.below(20_000) as i32 - 10_000) },
            if null(r) { Value::Null } else { Value::Bool(r.below(2) == 1) },
            if null(r) { Value::Null } else { Value::Str(rand_str(r)) },
            if null(r) { Value::Null } else { Value::Bytes((0..r.below(30)).map(|_| r.below(256) as u8).collect()) },
            Value::F64((r.below(10_000_000) as f64) / 100.0),
            Value::Str(["R", "A", "N", "MAIL", "TRUCK", "DELIVER IN PERSON"][r.below(6) as usize].into()),
            if null(r) { Value::Null } else { Value::Str(comment(r)) },
        ]
    }

    /// Packs `rows`, checks the size estimate, expands (whole and per mask) and compares with
    /// the plain image of the same rows.
    fn round_trip(sc: &Schema, rows: &[Vec<Value>]) {
        let (k, _) = fit(sc, SIZE, rows, true);
        assert_eq!(k, rows.len(), "the test rows fit one leaf");
        let mut p = Packer::new(sc, SIZE, true);
        for r in rows {
            p.add(r);
        }
        let img = encode(SIZE, sc, 42, rows, false, true);
        let h = header(&img[..], sc).unwrap();
        assert_eq!(h.used, p.bytes(), "the estimate is the encoded size");
        assert_eq!((h.count, h.first, h.full), (rows.len(), 42, false));
        // Into a buffer an earlier expansion left dirty: every byte a reader reads is written.
        let mut out = vec![0xA5u8; 2 * SIZE];
        let leaf = expand(&img, sc, None, &mut out).unwrap();
        assert_eq!(out.len(), p.expanded_bytes(sc));
        let plain = pax::build(out.len(), sc, 42, rows.len(), rows);
        // The plain image's layout (a dictionary's long strings are stored once, where all
        // their rows point, so the bytes may differ; the values are compared below).
        assert_eq!(out.len(), plain.len());
        assert_eq!(leaf, pax::header(&plain[..], sc).unwrap());
        let mut row = Vec::new();
        for (i, want) in rows.iter().enumerate() {
            pax::read_row(&out[..], sc, &leaf, i, &mut row).unwrap();
            assert_eq!(format!("{row:?}"), format!("{want:?}"), "row {i}");
            read_row(&img[..], sc, i, &mut row).unwrap();
            assert_eq!(format!("{row:?}"), format!("{want:?}"), "row {i}");
        }
        pax::verify(&out, sc, &leaf).unwrap();
        // A leaf without a directory (a database of format version 1) reads the same.
        let old = encode(SIZE, sc, 42, rows, false, false);
        assert!(!header(&old[..], sc).unwrap().dir && header(&img[..], sc).unwrap().dir);
        let mut out2 = Vec::new();
        assert_eq!(expand(&old, sc, None, &mut out2).unwrap(), leaf);
        for (i, want) in rows.iter().enumerate() {
            read_row(&old[..], sc, i, &mut row).unwrap();
            assert_eq!(format!("{row:?}"), format!("{want:?}"), "row {i} without a directory");
        }
        assert!(checksums_match(&img, sc).unwrap() && checksums_match(&old, sc).unwrap());
        // With a mask: the needed columns' bytes are those of the plain image.
        for c in 0..sc.len() {
            let need: Vec<bool> = (0..sc.len()).map(|j| j == c || j == (c + 3) % sc.len()).collect();
            let leaf2 = expand(&img, sc, Some(&need), &mut out).unwrap();
            assert_eq!(leaf, leaf2);
            assert_needed_columns(sc, rows, &out, &plain, &need);
        }
    }

    /// The columns `need` marks in `out` (an expansion of `rows` with `need`) hold the
    /// values they hold in `plain` (the plain image of `rows`).
    fn assert_needed_columns(sc: &Schema, rows: &[Vec<Value>], out: &[u8], plain: &[u8], need: &[bool]) {
        // (The var area holds the needed columns' long strings only.)
        assert!(out.len() <= plain.len());
        for (j, def) in sc.columns.iter().enumerate().filter(|&(j, _)| need[j]) {
            let (bm, _) = pax::column_at(sc, rows.len(), j);
            let end = bm + pax::column_bytes(def.ty, rows.len());
            if def.ty.is_var() {
                // Bitmap and headers; a long string's offset may differ (dictionary
                // entries are stored once), its bytes are compared below.
                let vals = bm + pax::bitmap_bytes(rows.len());
                assert_eq!(out[bm..vals], plain[bm..vals], "column {j}'s NULLs");
                for (i, row) in rows.iter().enumerate() {
                    let v = vals + i * 16;
                    let long = str_bytes(&row[j]).is_some_and(|s| s.len() > 12);
                    let cmp = if long { 8 } else { 16 };
                    assert_eq!(out[v..v + cmp], plain[v..v + cmp], "column {j} row {i}");
                }
            } else {
                assert_eq!(out[bm..end], plain[bm..end], "column {j}");
            }
            for i in 0..rows.len() {
                if let Some(s) = str_bytes(&rows[i][j]).filter(|s| s.len() > 12) {
                    let v = (bm + pax::bitmap_bytes(rows.len())) + i * 16;
                    let off = u64::from_le_bytes(out[v + 8..v + 16].try_into().unwrap()) as usize;
                    assert_eq!(&out[off..off + s.len()], s);
                }
            }
        }
    }

    /// A scan of some columns reads a leaf's header, directory and those columns' blocks
    /// only ([`ColumnRead`]): with every other byte of the page garbled, the leaf opens for
    /// those columns and expands them to the rows' values; the directory's checksums pass
    /// what was read and catch a changed byte in it; a leaf without a directory, or any
    /// other page, is read whole.
    #[test]
    fn a_leaf_read_in_part_gives_the_columns_it_was_read_for() {
        let sc = schema();
        let mut r = SplitMix64(31);
        let rows: Vec<_> = (0..5000).map(|i| random_row(&mut r, i)).collect();
        let (n, full) = fit(&sc, SIZE, &rows, true);
        assert!(full, "the rows fill the leaf");
        let rows = &rows[..n];
        let img = encode(SIZE, &sc, 5, rows, full, true);
        let mut out = Vec::new();
        expand(&img, &sc, None, &mut out).unwrap();
        let plain = pax::build(out.len(), &sc, 5, n, rows);
        let dir_end = HDR + dir_bytes(sc.len());
        let mut ranges = Vec::new();
        for trial in 0..60 {
            let need: Vec<bool> = (0..sc.len()).map(|_| r.below(3) == 0).collect();
            let cr = ColumnRead::new(&sc, &need);
            ranges.clear();
            assert!(cr.ranges(&img[..dir_end], &mut ranges));
            let blocks: usize = (0..sc.len()).filter(|&c| need[c]).map(|c| dir_entry(&img, c).map(|(s, e, _)| e - s).unwrap()).sum();
            assert_eq!(ranges.iter().map(|g| g.len()).sum::<usize>(), dir_end + blocks, "trial {trial}");
            // The page as a partial read leaves it: anything outside the ranges.
            let mut part: Vec<u8> = (0..img.len()).map(|_| r.below(256) as u8).collect();
            for g in &ranges {
                part[g.clone()].copy_from_slice(&img[g.clone()]);
            }
            assert!(cr.verify(&part), "trial {trial}");
            let pl = PackedLeaf::open_columns(&part, &sc, Some(&need)).unwrap();
            let fill: Vec<Fill> = need.iter().map(|&x| if x { Fill::All } else { Fill::No }).collect();
            let leaf = pl.expand(&sc, &fill, &[], &mut out).unwrap();
            assert_eq!((leaf.count, leaf.first), (n, 5));
            assert_needed_columns(&sc, rows, &out, &plain, &need);
            // A column not asked for cannot be read (nor its NULLs); nor of a leaf without
            // a directory opened for those columns.
            if let Some(c) = need.iter().position(|&x| !x) {
                assert!(pl.column(c, sc.columns[c].ty).is_err() && pl.nulls(c).is_err());
                let old = encode(SIZE, &sc, 5, rows, full, false);
                let po = PackedLeaf::open_columns(&old, &sc, Some(&need)).unwrap();
                assert!(po.column(c, sc.columns[c].ty).is_err() && po.nulls(c).is_err());
            }
            // A changed byte of the directory or of a block read is caught.
            let g = &ranges[r.below(ranges.len() as u64) as usize];
            if !g.is_empty() {
                let at = g.start + r.below(g.len() as u64) as usize;
                part[at] ^= 1 << r.below(8);
                assert!(!cr.verify(&part), "trial {trial}: a flipped byte at {at} passed");
            }
        }
        // Any other page: read whole.
        ranges.clear();
        assert!(!ColumnRead::new(&sc, &[true]).ranges(&encode(SIZE, &sc, 5, rows, full, false), &mut ranges));
        assert!(!ColumnRead::new(&sc, &[true]).ranges(&plain, &mut ranges));
        assert!(!ColumnRead::new(&sc, &[true]).ranges(&img[..dir_end - 1], &mut ranges));
        // A block that does not match its checksum fails the table check's test.
        let mut bad = img.clone();
        let (start, _, _) = dir_entry(&img, 0).unwrap();
        bad[start + BLOCK_HDR] ^= 1;
        assert!(!checksums_match(&bad, &sc).unwrap());
    }

    #[test]
    fn random_rows_round_trip() {
        let sc = schema();
        let mut r = SplitMix64(7);
        for n in [1, 2, 7, 63, 64, 65, 200] {
            let rows: Vec<_> = (0..n).map(|i| random_row(&mut r, i)).collect();
            round_trip(&sc, &rows);
        }
    }

    /// Each way `decode_decimals` and `decode_dict` take gives the stored values: decimals
    /// through the table of a narrow column's doubles (with and without NULLs, fewer rows
    /// than table entries, a negative base), whole numbers (narrow and wide), wide scaled
    /// decimals; dictionaries of short entries without NULLs (headers made up
    /// front), with NULLs, and with a long entry.
    #[test]
    fn every_decoder_path_round_trips() {
        let sc = Schema::parse("narrow:f64,narrow_null:f64,whole:f64,whole_wide:f64,wide:f64,short:str,short_null:str,long:str,negative:f64").unwrap();
        let mut r = SplitMix64(11);
        for n in [3, 40, 200, 1000] {
            let rows: Vec<_> = (0..n)
                .map(|i| {
                    let k = r.next_u64();
                    vec![
                        Value::F64([0.0, 0.01, 0.02, 0.05, 0.1, 0.07][i % 6]),
                        if k.is_multiple_of(5) { Value::Null } else { Value::F64((k % 9) as f64 / 100.0) },
                        Value::F64((1 + k % 50) as f64),
                        Value::F64((k % 10_000_000) as f64 - 5e6),
                        Value::F64((k % 10_000_000) as f64 / 100.0),
                        Value::Str(["A", "N", "R", "", "MAIL", "TRUCK"][i % 6].into()),
                        if k.is_multiple_of(7) { Value::Null } else { Value::Str(["F", "O"][i % 2].into()) },
                        Value::Str(if i % 3 == 0 { "a string longer than twelve bytes".into() } else { "short".into() }),
                        Value::F64([-1.0, -0.95, -0.9][i % 3]),
                    ]
                })
                .collect();
            round_trip(&sc, &rows);
            if n < 200 {
                continue; // (too few rows for dictionaries)
            }
            let img = encode(SIZE, &sc, 0, &rows, false, true);
            let b = blocks(&img, &sc, &header(&img[..], &sc).unwrap(), None).unwrap();
            let tags: Vec<_> = b.iter().map(|b| b.tag).collect();
            assert_eq!(&tags[..5], &[TAG_DEC; 5], "n = {n}");
            assert_eq!(&tags[5..8], &[TAG_DICT; 3], "n = {n}");
            assert!(b[0].w <= TABLE_BITS && b[3].w > TABLE_BITS && b[3].aux == 0 && b[4].w > TABLE_BITS, "n = {n}");
            assert!(b[8].tag == TAG_DEC && b[8].w <= TABLE_BITS && b[8].base < 0, "n = {n}");
        }
    }

    #[test]
    fn edge_columns_round_trip() {
        let sc = Schema::parse("a:i64,b:i64,c:f64,d:f64,e:str,f:str,g:date,h:bool").unwrap();
        let mut r = SplitMix64(3);
        let rows: Vec<_> = (0..300)
            .map(|i| {
                vec![
                    Value::Null,                                                                    // all NULL
                    Value::I64([i64::MIN, i64::MAX, 0][i % 3]),                                     // 64-bit span
                    Value::F64(12345.67),                                                           // all equal: 0 bits
                    Value::F64([0.04, 12345.67, 0.1, -3.5, 99999.99][i % 5]),                       // scale 2
                    Value::Str("same".into()),                                                      // dictionary of one
                    Value::Str(format!("{}-{}", "long string number".repeat(i % 3), r.next_u64())), // plain
                    Value::Date([i32::MIN, i32::MAX][i % 2]),
                    Value::Bool(true),
                ]
            })
            .collect();
        round_trip(&sc, &rows);
        let img = encode(SIZE, &sc, 0, &rows, false, true);
        let b = blocks(&img, &sc, &header(&img[..], &sc).unwrap(), None).unwrap();
        let tags: Vec<_> = b.iter().map(|b| (b.tag, b.w)).collect();
        assert_eq!(tags[0], (TAG_INT, 0));
        assert_eq!(tags[1], (TAG_INT, 64));
        assert_eq!(tags[2], (TAG_DEC, 0));
        assert_eq!((tags[3].0, b[3].aux), (TAG_DEC, 2));
        assert_eq!(tags[4], (TAG_DICT, 0));
        assert_eq!(tags[5].0, TAG_FSST, "repetitive strings compress");
        assert_eq!(tags[7], (TAG_INT, 0));
    }

    #[test]
    fn floats_that_do_not_scale_stay_raw() {
        let sc = Schema::parse("x:f64").unwrap();
        for v in [1.0 / 3.0, f64::NAN, -0.0, f64::INFINITY, f64::NEG_INFINITY, 1e300, 5e-324] {
            let rows = vec![vec![Value::F64(1.5)], vec![Value::F64(v)], vec![Value::Null]];
            let img = encode(SIZE, &sc, 0, &rows, false, true);
            let h = header(&img[..], &sc).unwrap();
            assert_eq!(blocks(&img, &sc, &h, None).unwrap()[0].tag, TAG_RAW, "{v}");
            let mut out = Vec::new();
            read_row(&img[..], &sc, 1, &mut out).unwrap();
            let Value::F64(got) = out[0] else { panic!() };
            assert_eq!(got.to_bits(), v.to_bits());
        }
    }

    #[test]
    fn fit_fills_a_page_and_compresses() {
        let sc = schema();
        let mut r = SplitMix64(11);
        let rows: Vec<_> = (0..20_000).map(|i| random_row(&mut r, i)).collect();
        let (k, full) = fit(&sc, SIZE, &rows, true);
        assert!(full && k > 0 && k < rows.len());
        let img = encode(SIZE, &sc, 0, &rows[..k], true, true);
        let h = header(&img[..], &sc).unwrap();
        assert!(h.used <= SIZE && h.full);
        let mut p = Packer::new(&sc, SIZE, true);
        for row in &rows[..=k] {
            p.add(row);
        }
        assert!(p.bytes() > SIZE || k == max_rows(SIZE) || p.expanded_bytes(&sc) > max_expanded(SIZE));
        let (plain, _) = pax::plan(&sc, SIZE, &rows);
        assert!(k > plain, "packed {k} rows, plain {plain}");
        // Low-cardinality strings and scaled prices pack several times denser.
        let sc2 = Schema::parse("q:i64,price:f64,flag:str,d:date").unwrap();
        let rows2: Vec<_> = (0..20_000)
            .map(|i| {
                vec![
                    Value::I64(i % 50),
                    Value::F64((i * 37 % 100_000) as f64 / 100.0),
                    Value::Str(["A", "N", "R"][i as usize % 3].into()),
                    Value::Date(9000 + (i % 2500) as i32),
                ]
            })
            .collect();
        let (k2, _) = fit(&sc2, SIZE, &rows2, true);
        let (plain2, _) = pax::plan(&sc2, SIZE, &rows2);
        assert!(k2 > 3 * plain2, "packed {k2} rows, plain {plain2}");
        round_trip(&sc2, &rows2[..k2.min(3000)]);
    }

    /// The shortcut for higher scales agrees with the full test.
    #[test]
    fn scaling_up_agrees_with_the_float_test() {
        let mut r = SplitMix64(17);
        let mut agreed = 0;
        for i in 0..300_000u64 {
            let v = match i % 4 {
                0 => (r.below(10_000_000_000) as f64) / 100.0,
                1 => (r.below(1 << 50) as f64) / 10_000.0 - 5e10,
                2 => f64::from_bits(r.next_u64()),
                _ => r.below(1000) as f64 / [1.0, 10.0, 100.0, 1000.0, 10000.0][r.below(5) as usize],
            };
            for s in 0..MAX_SCALE {
                let Some(k) = scaled(v, s) else { continue };
                for d in 1..=MAX_SCALE - s {
                    if let Some(q) = scaled_up(k, d) {
                        assert_eq!(scaled(v, s + d), Some(q), "{v} at scale {s} + {d}");
                        agreed += 1;
                    }
                }
            }
        }
        assert!(agreed > 100_000, "{agreed}");
    }

    #[test]
    fn dictionary_limit_falls_back_to_plain() {
        let sc = Schema::parse("s:str").unwrap();
        let rows: Vec<_> = (0..DICT_MAX + 10).map(|i| vec![Value::Str(format!("{i}"))]).collect();
        let (k, _) = fit(&sc, SIZE, &rows, true);
        assert_eq!(k, rows.len());
        let img = encode(SIZE, &sc, 0, &rows, false, true);
        assert_eq!(blocks(&img, &sc, &header(&img[..], &sc).unwrap(), None).unwrap()[0].tag, TAG_PLAIN);
        round_trip(&sc, &rows);
        let few: Vec<_> = (0..3000).map(|i| vec![Value::Str(format!("value number {}", i % 40))]).collect();
        let img = encode(SIZE, &sc, 0, &few, false, true);
        assert_eq!(blocks(&img, &sc, &header(&img[..], &sc).unwrap(), None).unwrap()[0].tag, TAG_DICT);
        round_trip(&sc, &few);
    }

    /// Bounded fuzzing with damaged images: never a panic, never a huge allocation.
    #[test]
    fn damaged_leaves_never_panic() {
        let sc = schema();
        let mut r = SplitMix64(5);
        let rows: Vec<_> = (0..120).map(|i| random_row(&mut r, i)).collect();
        let size = 16384 - 32;
        let (n, _) = fit(&sc, size, &rows, true);
        let good = encode(size, &sc, 9, &rows[..n], false, true);
        // A third of the trials damage a leaf without a directory.
        let old = encode(size, &sc, 9, &rows[..n], false, false);
        let used = header(&good[..], &sc).unwrap().used;
        // The compressed comments' block (symbol table, lengths, codes), damaged more often.
        let bl = blocks(&good, &sc, &header(&good[..], &sc).unwrap(), None).unwrap();
        let fb = bl.iter().find(|b| b.tag == TAG_FSST).expect("the comments are compressed");
        let (f0, f1) = (fb.body.as_ptr() as usize - good.as_ptr() as usize, fb.body.len());
        let mut out = Vec::new();
        let mut row = Vec::new();
        let mut expanded = 0;
        for i in 0..20_000u64 {
            let mut img = match i % 10 {
                0 => (0..size).map(|_| r.below(256) as u8).collect(),
                _ if i % 3 == 2 => old.clone(),
                _ => good.clone(),
            };
            for _ in 0..1 + r.below(4) {
                match r.below(6) {
                    0 => {
                        let at = r.below(used as u64 * 8);
                        img[(at / 8) as usize] ^= 1 << (at % 8);
                    }
                    1 => {
                        let at = (r.below(used as u64 / 8) * 8) as usize;
                        let v = [0, 1, u64::MAX, r.next_u64(), size as u64, used as u64, 64][r.below(7) as usize];
                        img[at..at + 8].copy_from_slice(&v.to_le_bytes());
                    }
                    2 => {
                        let at = r.below(used as u64) as usize;
                        img[at] = r.below(256) as u8;
                    }
                    3 | 4 => {
                        // A byte of the compressed block: a symbol length or byte, a code.
                        let at = f0 + r.below(f1 as u64) as usize;
                        img[at] = [0, 1, 8, 9, 254, 255, r.below(256) as u8][r.below(7) as usize];
                    }
                    _ => {
                        // Torn: the rest of the compressed block zeroed, or the page cut there.
                        let at = f0 + r.below(f1 as u64) as usize;
                        if r.below(2) == 0 {
                            img[at..f0 + f1].fill(0);
                        } else {
                            img[W_USED..W_USED + 8].copy_from_slice(&(at as u64).to_le_bytes());
                        }
                    }
                }
            }
            if i % 10 == 1 {
                img[..8].copy_from_slice(&((KIND_PACKED as u64) | ((r.below(5000)) << 32)).to_le_bytes());
            }
            let need: Vec<bool> = (0..sc.len()).map(|_| r.below(2) == 1).collect();
            // What partial reads do with a page: its ranges from a prefix, its checksums.
            let cr = ColumnRead::new(&sc, &need);
            let mut rg = Vec::new();
            let _ = cr.ranges(&img[..r.below(size as u64) as usize], &mut rg);
            let _ = cr.verify(&img);
            let _ = checksums_match(&img, &sc);
            if let Ok(leaf) = expand(&img, &sc, if i % 2 == 0 { None } else { Some(&need) }, &mut out) {
                assert!(out.len() <= max_expanded(size));
                expanded += 1;
                if i % 2 == 0 {
                    let _ = pax::verify(&out, &sc, &leaf);
                }
            }
            let _ = read_row(&img[..], &sc, r.below(n as u64 + 2) as usize, &mut row);
        }
        assert!(expanded > 100, "some damaged images still expand: {expanded}");
    }

    fn tags(img: &[u8], sc: &Schema) -> Vec<u8> {
        blocks(img, sc, &header(img, sc).unwrap(), None).unwrap().iter().map(|b| b.tag).collect()
    }

    /// Comments from a small vocabulary (as TPC-H's): the leaf holds about 2.5 times the
    /// rows of plain strings (measured 2.6; TPC-H SF 1's l_comment in the report).
    #[test]
    fn comments_compress() {
        let sc = Schema::parse("c:str").unwrap();
        let mut r = SplitMix64(23);
        let rows: Vec<_> = (0..50_000).map(|_| vec![Value::Str(comment(&mut r))]).collect();
        let (k, full) = fit(&sc, SIZE, &rows, true);
        assert!(full);
        let img = encode(SIZE, &sc, 0, &rows[..k], true, true);
        assert_eq!(tags(&img, &sc), [TAG_FSST]);
        let raw: usize = rows[..k].iter().map(|r| str_bytes(&r[0]).unwrap().len()).sum();
        let plain = HDR + BLOCK_HDR + packed_bytes(k, 6) + align8(raw);
        let used = header(&img[..], &sc).unwrap().used;
        let ratio = plain as f64 / used as f64;
        eprintln!("{k} comments, {raw} bytes: plain {plain} bytes, compressed {used} ({ratio:.2}x)");
        assert!(ratio > 2.2, "{ratio}");
        round_trip(&sc, &rows[..k]);
    }

    /// A comment-like column with odd values mixed in: NULL, empty, 1-byte, non-ASCII,
    /// 4096+ bytes, random bytes (the escape byte 255 among them).
    fn odd_rows(seed: u64, n: usize, every: u64) -> Vec<Vec<Value>> {
        let mut r = SplitMix64(seed);
        (0..n)
            .map(|_| {
                let c = comment(&mut r);
                if r.below(every) != 0 {
                    return vec![Value::Str(c.clone()), Value::Bytes(c.into_bytes())];
                }
                let s = match r.below(6) {
                    0 => return vec![Value::Null, Value::Null],
                    1 => String::new(),
                    2 => "x".into(),
                    3 => "Ärger über € und 日本語, naïve café 𝄞".into(),
                    4 => (0..150).map(|_| comment(&mut r)).collect::<Vec<_>>().join(" "),
                    _ => (0..r.below(40)).map(|_| char::from_u32(r.below(0x3000) as u32).unwrap_or('?')).collect(),
                };
                let b = match r.below(5) {
                    0 => (0..r.below(300)).map(|_| r.below(256) as u8).collect(),
                    1 => (0..5000).map(|_| r.below(256) as u8).collect(),
                    2 => vec![255; 1 + r.below(20) as usize],
                    3 => vec![0; r.below(20) as usize],
                    _ => s.clone().into_bytes(),
                };
                vec![Value::Str(s), Value::Bytes(b)]
            })
            .collect()
    }

    #[test]
    fn compressed_strings_round_trip_adversarial() {
        let sc = Schema::parse("c:str,b:bytes").unwrap();
        let mut compressed = 0;
        for (seed, every) in [(1, 7), (2, 3), (3, 50), (4, 2)] {
            let rows = odd_rows(seed, 20_000, every);
            let (k, full) = fit(&sc, SIZE, &rows, true);
            assert!(full && k > 0);
            for n in [1, 2, 40, 300, 1000, k / 2, k] {
                let n = n.min(k);
                round_trip(&sc, &rows[..n]);
                let img = encode(SIZE, &sc, 0, &rows[..n], false, true);
                compressed += tags(&img, &sc).iter().filter(|&&t| t == TAG_FSST).count();
            }
            // In a larger page class, with a long string every few rows.
            let (k4, _) = fit(&sc, 4 * SIZE, &rows, true);
            let img = encode(4 * SIZE, &sc, 0, &rows[..k4], true, true);
            assert!(header(&img[..], &sc).unwrap().used <= 4 * SIZE);
            let mut out = Vec::new();
            let leaf = expand(&img, &sc, None, &mut out).unwrap();
            assert_eq!(leaf.count, k4);
            let mut row = Vec::new();
            for (i, want) in rows[..k4].iter().enumerate() {
                pax::read_row(&out[..], &sc, &leaf, i, &mut row).unwrap();
                assert_eq!(&row, want, "row {i}");
            }
        }
        assert!(compressed >= 10, "{compressed}");
        // Random bytes do not compress: stored plain.
        let mut r = SplitMix64(9);
        let rows: Vec<_> = (0..3000).map(|_| vec![Value::Null, Value::Bytes((0..r.below(60)).map(|_| r.below(256) as u8).collect())]).collect();
        let (k, _) = fit(&sc, SIZE, &rows, true);
        round_trip(&sc, &rows[..k]);
        assert_eq!(tags(&encode(SIZE, &sc, 0, &rows[..k], false, true), &sc)[1], TAG_PLAIN);
    }

    /// The estimate `fit` uses is the encoded size after every row, for every page class.
    #[test]
    fn compressed_estimate_is_exact() {
        let sc = Schema::parse("c:str,b:bytes").unwrap();
        let rows = odd_rows(5, 6000, 5);
        for size in [4096 - 32, 16384 - 32, SIZE, 4 * SIZE] {
            let mut p = Packer::new(&sc, size, true);
            for (i, row) in rows.iter().enumerate() {
                p.add(row);
                if p.bytes() > size || p.expanded_bytes(&sc) > max_expanded(size) || i + 1 == max_rows(size) {
                    break;
                }
                if i % 97 == 0 || i < 20 {
                    let img = encode(size, &sc, 0, &rows[..=i], false, true);
                    assert_eq!(header(&img[..], &sc).unwrap().used, p.bytes(), "size {size}, {} rows", i + 1);
                }
            }
        }
    }
}
