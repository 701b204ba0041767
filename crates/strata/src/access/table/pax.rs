//! The byte format of a table leaf (PAX: partition attributes across).
//!
//! A leaf holds the rows with ids `first .. first + count`, laid out for `cap` rows. After
//! the 64-byte node header (little-endian words, see [`crate::access::btree::node`]) come
//! the columns, one after another; each column is a null bitmap (one bit per row, set for
//! NULL, rounded up to 8 bytes) followed by `cap` fixed-size values (rounded up to 8 bytes):
//!
//! | type          | value bytes                                                         |
//! |---------------|---------------------------------------------------------------------|
//! | `i64`, `f64`  | 8, little-endian (`f64` as its bits)                                |
//! | `date`        | 4: days since 1970-01-01, little-endian `i32`                       |
//! | `bool`        | 1: 0 or 1                                                           |
//! | `str`, `bytes`| 16-byte header: length (`u32`), then the bytes inline if at most 12, |
//! |               | else their first 4 bytes (a prefix for comparisons) and the offset  |
//! |               | of the bytes in the leaf (`u64`)                                    |
//!
//! The bytes of longer strings are packed at the end of the page, growing down to `var`
//! (header word 1). A string never spans pages: a row is stored whole in one leaf, of the
//! size class that holds it.
//!
//! Header words: 0 kind ([`KIND_PAX`]) and count, 1 `var`, 2 `cap`, 3 `first`, 4 the number
//! of columns (checked against the schema).
//!
//! Readers may see the bytes through an optimistic guard while a writer changes them, so
//! every length and offset is checked against the page before use; an impossible one is a
//! [`Restart`] (and corruption if the page then validates).

use super::schema::{ColumnType, Schema, Value};
use crate::access::btree::node::{Src, HDR, KIND_PAX};
use crate::buffer::Restart;

const W_VAR: usize = 8;
const W_CAP: usize = 16;
const W_FIRST: usize = 24;
const W_COLS: usize = 32;

/// `x` rounded up to a multiple of 8 (the alignment of every area of a leaf).
pub(crate) fn align8(x: usize) -> usize {
    x.div_ceil(8) * 8
}

/// Bytes of a null bitmap for `cap` rows.
pub fn bitmap_bytes(cap: usize) -> usize {
    align8(cap.div_ceil(8))
}

/// Bytes of one column's area for `cap` rows (bitmap and values).
pub fn column_bytes(ty: ColumnType, cap: usize) -> usize {
    bitmap_bytes(cap) + align8(cap * ty.fixed_width())
}

/// The end of the fixed-size area of a leaf laid out for `cap` rows (header included).
pub fn fixed_end(schema: &Schema, cap: usize) -> usize {
    HDR + schema.columns.iter().map(|c| column_bytes(c.ty, cap)).sum::<usize>()
}

/// Where column `col`'s bitmap and values start in a leaf laid out for `cap` rows.
pub fn column_at(schema: &Schema, cap: usize, col: usize) -> (usize, usize) {
    let bitmap = HDR + schema.columns[..col].iter().map(|c| column_bytes(c.ty, cap)).sum::<usize>();
    (bitmap, bitmap + bitmap_bytes(cap))
}

/// Bytes the row's long strings take in the variable-size area.
pub fn var_bytes(row: &[Value]) -> usize {
    row.iter().map(Value::var_len).sum()
}

/// A leaf's header, checked against the page and the schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leaf {
    /// Rows held.
    pub count: usize,
    /// Start of the variable-size area.
    pub var: usize,
    /// Rows the fixed-size area is laid out for.
    pub cap: usize,
    /// The id of the first row.
    pub first: u64,
}

/// Reads and checks a leaf's header.
pub fn header<S: Src + ?Sized>(s: &S, schema: &Schema) -> Result<Leaf, Restart> {
    let w0 = s.word(0);
    let size = s.size();
    let (kind, count) = (w0 as u8, (w0 >> 32) as usize);
    let var = s.word(W_VAR) as usize;
    let cap = s.word(W_CAP) as usize;
    let first = s.word(W_FIRST);
    let cols = s.word(W_COLS);
    // A row needs at least one bit, so `cap` is bounded before the layout is computed.
    if kind != KIND_PAX || cols != schema.len() as u64 || count > cap || cap > size.saturating_mul(8) || var > size || fixed_end(schema, cap) > var {
        return Err(Restart);
    }
    if first.checked_add(count as u64).is_none() {
        return Err(Restart);
    }
    Ok(Leaf { count, var, cap, first })
}

fn byte<S: Src + ?Sized>(s: &S, at: usize) -> u8 {
    let mut b = [0u8; 1];
    s.copy(at, &mut b);
    b[0]
}

/// Reads row `i` (0-based within the leaf) into `out` (cleared first).
pub fn read_row<S: Src + ?Sized>(s: &S, schema: &Schema, leaf: &Leaf, i: usize, out: &mut Vec<Value>) -> Result<(), Restart> {
    out.clear();
    if i >= leaf.count {
        return Err(Restart);
    }
    let size = s.size();
    let mut bitmap = HDR;
    for c in &schema.columns {
        let values = bitmap + bitmap_bytes(leaf.cap);
        let w = c.ty.fixed_width();
        let null = byte(s, bitmap + i / 8) >> (i % 8) & 1 == 1;
        let at = values + i * w;
        let v = if null {
            Value::Null
        } else {
            let mut b = [0u8; 16];
            s.copy(at, &mut b[..w]);
            match c.ty {
                ColumnType::I64 => Value::I64(i64::from_le_bytes(b[..8].try_into().unwrap())),
                ColumnType::F64 => Value::F64(f64::from_bits(u64::from_le_bytes(b[..8].try_into().unwrap()))),
                ColumnType::Date => Value::Date(i32::from_le_bytes(b[..4].try_into().unwrap())),
                ColumnType::Bool => match b[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    _ => return Err(Restart),
                },
                ColumnType::Str | ColumnType::Bytes => {
                    let len = u32::from_le_bytes(b[..4].try_into().unwrap()) as usize;
                    let bytes = if len <= 12 {
                        b[4..4 + len].to_vec()
                    } else {
                        let off = u64::from_le_bytes(b[8..16].try_into().unwrap()) as usize;
                        if off < leaf.var || off.checked_add(len).is_none_or(|e| e > size) {
                            return Err(Restart);
                        }
                        let mut v = vec![0u8; len];
                        s.copy(off, &mut v);
                        if v[..4] != b[4..8] {
                            return Err(Restart);
                        }
                        v
                    };
                    if c.ty == ColumnType::Str {
                        Value::Str(String::from_utf8(bytes).map_err(|_| Restart)?)
                    } else {
                        Value::Bytes(bytes)
                    }
                }
            }
        };
        out.push(v);
        bitmap += column_bytes(c.ty, leaf.cap);
    }
    Ok(())
}

/// How many of `rows` (from the first) fit into the leaf in place.
pub fn fit_in_place(schema: &Schema, leaf: &Leaf, rows: &[Vec<Value>]) -> usize {
    let mut free = leaf.var - fixed_end(schema, leaf.cap);
    let mut n = 0;
    for row in rows.iter().take(leaf.cap - leaf.count) {
        let v = var_bytes(row);
        if v > free {
            break;
        }
        free -= v;
        n += 1;
    }
    n
}

/// How a new leaf of `size` payload bytes is filled from `rows`: (rows taken, capacity).
/// Rows are taken while they fit; when all of them fit, the capacity leaves room for more
/// rows of the same average size (appends fill the leaf in place later). `(0, 0)`: even the
/// first row does not fit a page of this size.
pub fn plan<R: AsRef<[Value]>>(schema: &Schema, size: usize, rows: &[R]) -> (usize, usize) {
    let mut var = 0usize;
    let mut n = 0;
    while n < rows.len() {
        let v = var + var_bytes(rows[n].as_ref());
        if fixed_end(schema, n + 1) + v > size {
            break;
        }
        var = v;
        n += 1;
    }
    if n == 0 || n < rows.len() {
        return (n, n);
    }
    // Every row fits: the largest capacity whose fixed area leaves room for that many rows
    // of the average variable size.
    let fits = |cap: usize| fixed_end(schema, cap) + (var * cap).div_ceil(n) <= size;
    let (mut lo, mut hi) = (n, size * 8);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    (n, lo)
}

/// Bytes a page needs to hold `row` alone.
pub fn row_bytes(schema: &Schema, row: &[Value]) -> usize {
    fixed_end(schema, 1) + var_bytes(row)
}

/// The writes (offset, bytes) that append `rows` to a leaf with header `leaf` whose current
/// bytes are `page`, in place (the caller checked that they fit with [`fit_in_place`]): per
/// column one write of the values (and one of the bitmap bytes if a value is NULL), one of
/// the variable-size bytes, and one of the header.
pub fn append_writes(page: &[u8], schema: &Schema, leaf: &Leaf, rows: &[Vec<Value>]) -> Vec<(usize, Vec<u8>)> {
    let k = rows.len();
    let mut out = Vec::with_capacity(2 * schema.len() + 2);
    if k == 0 {
        return out;
    }
    let var_total: usize = rows.iter().map(|r| var_bytes(r)).sum();
    let var_start = leaf.var - var_total;
    let mut var = Vec::with_capacity(var_total);
    for (col, def) in schema.columns.iter().enumerate() {
        let (bitmap_at, values_at) = column_at(schema, leaf.cap, col);
        let w = def.ty.fixed_width();
        let mut values = vec![0u8; k * w];
        let (lo, hi) = (leaf.count / 8, (leaf.count + k - 1) / 8);
        let mut bits = page[bitmap_at + lo..=bitmap_at + hi].to_vec();
        let mut nulls = false;
        for (r, row) in rows.iter().enumerate() {
            let dst = &mut values[r * w..(r + 1) * w];
            match &row[col] {
                Value::Null => {
                    let i = leaf.count + r;
                    bits[i / 8 - lo] |= 1 << (i % 8);
                    nulls = true;
                }
                Value::I64(v) => dst.copy_from_slice(&v.to_le_bytes()),
                Value::F64(v) => dst.copy_from_slice(&v.to_bits().to_le_bytes()),
                Value::Date(v) => dst.copy_from_slice(&v.to_le_bytes()),
                Value::Bool(v) => dst[0] = *v as u8,
                Value::Str(s) => string_header(dst, s.as_bytes(), var_start, &mut var),
                Value::Bytes(b) => string_header(dst, b, var_start, &mut var),
            }
        }
        if nulls {
            out.push((bitmap_at + lo, bits));
        }
        out.push((values_at + leaf.count * w, values));
    }
    debug_assert_eq!(var.len(), var_total);
    if var_total > 0 {
        out.push((var_start, var));
    }
    let mut hdr = [0u8; 16];
    hdr[..8].copy_from_slice(&((KIND_PAX as u64) | (((leaf.count + k) as u64) << 32)).to_le_bytes());
    hdr[8..].copy_from_slice(&(var_start as u64).to_le_bytes());
    out.push((0, hdr.to_vec()));
    out
}

/// Fills a 16-byte string header; a string longer than 12 bytes goes to `var`, which will
/// be written at `var_start`.
fn string_header(dst: &mut [u8], s: &[u8], var_start: usize, var: &mut Vec<u8>) {
    dst[..4].copy_from_slice(&(s.len() as u32).to_le_bytes());
    if s.len() <= 12 {
        dst[4..4 + s.len()].copy_from_slice(s);
    } else {
        dst[4..8].copy_from_slice(&s[..4]);
        dst[8..16].copy_from_slice(&((var_start + var.len()) as u64).to_le_bytes());
        var.extend_from_slice(s);
    }
}

/// The image of a leaf of `size` payload bytes laid out for `cap` rows, holding `rows` with
/// ids from `first` on.
pub fn build(size: usize, schema: &Schema, first: u64, cap: usize, rows: &[Vec<Value>]) -> Vec<u8> {
    let mut img = vec![0u8; size];
    let words = [(KIND_PAX as u64), size as u64, cap as u64, first, schema.len() as u64];
    for (i, w) in words.iter().enumerate() {
        img[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    let leaf = Leaf { count: 0, var: size, cap, first };
    debug_assert!(fixed_end(schema, cap) + rows.iter().map(|r| var_bytes(r)).sum::<usize>() <= size);
    for (at, bytes) in append_writes(&img, schema, &leaf, rows) {
        img[at..at + bytes.len()].copy_from_slice(&bytes);
    }
    img
}

/// Checks every row of a (latched or copied) leaf: all its values readable.
pub fn verify(page: &[u8], schema: &Schema, leaf: &Leaf) -> Result<(), Restart> {
    let mut row = Vec::with_capacity(schema.len());
    for i in 0..leaf.count {
        read_row(page, schema, leaf, i, &mut row)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Schema {
        Schema::parse("id:i64,x:f64,d:date,b:bool,s:str,raw:bytes").unwrap()
    }

    fn row(i: i64) -> Vec<Value> {
        let s = "x".repeat((i as usize * 7) % 40);
        vec![
            Value::I64(i * 1000 - 7),
            if i % 3 == 0 { Value::Null } else { Value::F64(i as f64 / 3.0) },
            Value::Date(i as i32 - 500),
            Value::Bool(i % 2 == 0),
            if i % 5 == 0 { Value::Null } else { Value::Str(s) },
            Value::Bytes(vec![i as u8; (i as usize) % 20]),
        ]
    }

    #[test]
    fn build_append_and_read_back() {
        let sc = schema();
        let rows: Vec<_> = (0..50).map(row).collect();
        let size = 8192 - 32;
        let (n, cap) = plan(&sc, size, &rows[..20]);
        assert_eq!(n, 20);
        assert!(cap > 20, "spare capacity for more rows: {cap}");
        let mut img = build(size, &sc, 100, cap, &rows[..20]);
        let mut leaf = header(&img[..], &sc).unwrap();
        assert_eq!((leaf.count, leaf.first, leaf.cap), (20, 100, cap));
        // Append in place as far as it goes.
        let k = fit_in_place(&sc, &leaf, &rows[20..]);
        assert!(k > 0);
        for (at, b) in append_writes(&img, &sc, &leaf, &rows[20..20 + k]) {
            img[at..at + b.len()].copy_from_slice(&b);
        }
        leaf = header(&img[..], &sc).unwrap();
        assert_eq!(leaf.count, 20 + k);
        let mut out = Vec::new();
        for (i, want) in rows.iter().enumerate().take(leaf.count) {
            read_row(&img[..], &sc, &leaf, i, &mut out).unwrap();
            assert_eq!(&out, want, "row {i}");
        }
        verify(&img, &sc, &leaf).unwrap();
        // A wrong schema or a damaged offset is caught.
        assert!(header(&img[..], &Schema::parse("a:i64").unwrap()).is_err());
        let (_, values) = column_at(&sc, cap, 4);
        let long = (0..leaf.count).find(|&i| matches!(&rows[i][4], Value::Str(s) if s.len() > 12)).unwrap();
        img[values + long * 16 + 8..values + long * 16 + 16].copy_from_slice(&(size as u64 - 2).to_le_bytes());
        assert!(read_row(&img[..], &sc, &leaf, long, &mut out).is_err());
    }

    /// Bounded fuzzing of the leaf decoder with damaged images (bit flips, overwritten
    /// words, random bytes): never a panic, and a header that passes keeps every later read
    /// in bounds (errors are `Restart`).
    #[test]
    fn damaged_leaves_never_panic() {
        let sc = schema();
        let rows: Vec<_> = (0..40).map(row).collect();
        let size = 4096 - 32;
        let (n, cap) = plan(&sc, size, &rows);
        let good = build(size, &sc, 7, cap, &rows[..n]);
        let mut r = crate::util::SplitMix64(99);
        let mut out = Vec::new();
        for i in 0..20_000u64 {
            let mut img = if i % 10 == 0 { (0..size).map(|_| r.below(256) as u8).collect() } else { good.clone() };
            for _ in 0..1 + r.below(4) {
                match r.below(3) {
                    0 => {
                        let at = r.below(size as u64 * 8);
                        img[(at / 8) as usize] ^= 1 << (at % 8);
                    }
                    1 => {
                        // A header word or a string header's length/offset.
                        let at = (r.below(size as u64 / 8) * 8) as usize;
                        let v = [0, 1, u64::MAX, r.next_u64(), size as u64, size as u64 - 1][r.below(6) as usize];
                        img[at..at + 8].copy_from_slice(&v.to_le_bytes());
                    }
                    _ => {
                        let at = r.below(64) as usize * 8;
                        img[at] = r.below(256) as u8;
                    }
                }
            }
            if let Ok(leaf) = header(&img[..], &sc) {
                for k in 0..leaf.count.min(64) {
                    let _ = read_row(&img[..], &sc, &leaf, k, &mut out);
                }
                let _ = verify(&img, &sc, &leaf);
                let _ = fit_in_place(&sc, &leaf, &rows[..3]);
            }
        }
    }

    #[test]
    fn plan_respects_the_page() {
        let sc = Schema::parse("s:str").unwrap();
        let big = vec![vec![Value::Str("y".repeat(10_000))]];
        assert_eq!(plan(&sc, 4096, &big), (0, 0));
        let need = row_bytes(&sc, &big[0]);
        let (n, cap) = plan(&sc, need, &big);
        assert_eq!((n, cap), (1, 1));
        let img = build(need, &sc, 0, 1, &big);
        let leaf = header(&img[..], &sc).unwrap();
        let mut out = Vec::new();
        read_row(&img[..], &sc, &leaf, 0, &mut out).unwrap();
        assert_eq!(out, big[0]);
        // Many small rows: taken until the page is full.
        let small: Vec<_> = (0..10_000).map(|i| vec![Value::Str(format!("{i:020}"))]).collect();
        let (n, cap) = plan(&sc, 4096, &small);
        assert!(n > 10 && n < 10_000 && cap == n);
        assert!(fixed_end(&sc, n) + 20 * n <= 4096);
        assert!(fixed_end(&sc, n + 1) + 20 * (n + 1) > 4096);
    }
}
