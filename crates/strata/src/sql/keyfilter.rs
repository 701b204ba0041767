//! Join filters pushed into scans: while a hash join probes its table with the rows of a
//! table scan, the scan drops the rows whose join key cannot be in the table, a leaf at a
//! time, before it decodes them into rows (sideways information passing; DuckDB's and
//! Umbra's join filters).
//!
//! The filter is a one-bit-per-key Bloom filter of the build side's keys, sized at 16 bits
//! per key and at most [`MAX_BITS`] bits (about 6 % false positives per probe while the
//! build side has at most 512 Ki keys). Its hash ([`key_hash`]) is its own, not the join's:
//! every row of the scan is tested, most of them dropped, so the test must be cheap; the
//! hash multiplies the key encoding's words independently (no chain of multiplications),
//! and for a key of one integer or date column the scan computes it from the value
//! ([`i64_key_hash`], [`date_key_hash`]) without encoding the key.
//! It is kept on the heap: it is small and bounded, and the hash table it summarizes fits
//! a fraction of the pool anyway.
//!
//! A join installs it only where a probe row without a match produces nothing (inner and
//! semi joins, and the joins that mark a left build side), on a scan whose key columns
//! reach the join as they are: through projections, filters and groupings on them (a
//! group whose key cannot match is dropped whole, as TPC-H Q20's sums per part and
//! supplier of only the parts the join wants) and through the left sides of anti joins
//! (Q16's parts joined to the suppliers NOT IN a subquery's). The scan applies the filter
//! to rows that passed its own conditions (so these fail on the same rows as without it);
//! rows dropped there are not seen by the operators above the scan, so an expression there
//! that would have failed on such a row (an overflow in a group that joins nothing) does
//! not, as in other engines that push join filters down. A NULL key matches nothing and is
//! dropped too.

use std::sync::{Arc, Mutex};

use super::exec::Plan;
use super::expr::BExpr;
use super::join::JoinKind;

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
        // The high bits: the final multiplication mixes every input bit into them.
        (h >> (64 - self.mask.count_ones())) as usize
    }

    /// Adds a key by its encoding.
    pub fn add(&mut self, key: &[u8]) {
        let b = self.bit(key_hash(key));
        self.bits[b / 64] |= 1 << (b % 64);
    }

    /// Whether a key with [`key_hash`] `h` may be in the build side.
    #[inline]
    pub fn may_contain(&self, h: u64) -> bool {
        let b = self.bit(h);
        self.bits[b / 64] >> (b % 64) & 1 == 1
    }
}

/// Multipliers of a key's words by position (mod 4), of its length, and of the final mix.
const K: [u64; 4] = [0x9E37_79B9_7F4A_7C15, 0xC2B2_AE3D_27D4_EB4F, 0x1656_67B1_9E37_79F9, 0x27D4_EB2F_1656_67C5];
const K_LEN: u64 = 0xFF51_AFD7_ED55_8CCD;
const K_FIN: u64 = 0xC4CE_B9FE_1A85_EC53;

#[inline]
fn finish(h: u64) -> u64 {
    (h ^ (h >> 29)).wrapping_mul(K_FIN)
}

/// The filter's hash of a key encoding (see the module documentation): the sum of its
/// little-endian 8-byte words (the last one zero-padded) times a multiplier per position,
/// and of its length, mixed once.
#[inline]
pub fn key_hash(key: &[u8]) -> u64 {
    let mut h = (key.len() as u64).wrapping_mul(K_LEN);
    let mut chunks = key.chunks_exact(8);
    let mut i = 0;
    for c in &mut chunks {
        h = h.wrapping_add(u64::from_le_bytes(c.try_into().unwrap_or_default()).wrapping_mul(K[i & 3]));
        i += 1;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = h.wrapping_add(u64::from_le_bytes(w).wrapping_mul(K[i & 3]));
    }
    finish(h)
}

/// [`key_hash`] of a key encoding given a column at a time as little-endian byte strings
/// of at most 9 bytes held in integers (a fixed-width key's codes: [`fixed_i64`],
/// [`fixed_date`], ...), without writing the encoding out: the words are assembled in a
/// register. (Written to a buffer on the stack, each 8-byte load of the hash straddled two
/// narrower stores, and waited for them: a quarter of TPC-H Q9's filter time.)
#[derive(Clone, Copy, Default)]
pub struct FixedKeyHash {
    h: u64,
    acc: u128,
    bits: u32,
    word: usize,
    len: u64,
}

impl FixedKeyHash {
    /// Appends `n` (at most 9) bytes: the low `8 n` bits of `code` (nothing above them).
    #[inline(always)]
    pub fn push(&mut self, code: u128, n: u32) {
        if n > 8 {
            self.push_word(code as u64, 8);
            self.push_word((code >> 64) as u64, n - 8);
        } else {
            self.push_word(code as u64, n);
        }
    }

    /// Appends `n` (at most 8) bytes: the accumulator holds fewer than 64 bits before, so
    /// at most 127 after.
    #[inline(always)]
    fn push_word(&mut self, code: u64, n: u32) {
        self.acc |= (code as u128) << self.bits;
        self.bits += 8 * n;
        self.len += n as u64;
        if self.bits >= 64 {
            self.h = self.h.wrapping_add((self.acc as u64).wrapping_mul(K[self.word & 3]));
            self.word += 1;
            self.acc >>= 64;
            self.bits -= 64;
        }
    }

    /// The key's [`key_hash`].
    #[inline(always)]
    pub fn finish(self) -> u64 {
        let mut h = self.h.wrapping_add(self.len.wrapping_mul(K_LEN));
        if self.bits > 0 {
            h = h.wrapping_add((self.acc as u64).wrapping_mul(K[self.word & 3]));
        }
        finish(h)
    }
}

/// The 9 bytes of [`super::rows::i64_code`] of `v`, for [`FixedKeyHash::push`].
#[inline(always)]
pub fn fixed_i64(v: i64) -> u128 {
    super::rows::T_I64 as u128 | (v as u64 as u128) << 8
}

/// The 9 bytes of [`super::rows::f64_code`] of `f`, for [`FixedKeyHash::push`].
#[inline(always)]
pub fn fixed_f64(f: f64) -> u128 {
    u128::from_le_bytes({
        let mut b = [0u8; 16];
        b[..9].copy_from_slice(&super::rows::f64_code(f));
        b
    })
}

/// The 5 bytes of [`super::rows::date_code`] of `d`, for [`FixedKeyHash::push`].
#[inline(always)]
pub fn fixed_date(d: i32) -> u128 {
    super::rows::T_DATE as u128 | (d as u32 as u128) << 8
}

/// [`key_hash`] of the encoding of `i64` value `v` ([`super::rows::i64_code`]: a tag byte
/// and the value's 8 little-endian bytes), from the value.
#[inline]
pub fn i64_key_hash(v: i64) -> u64 {
    let v = v as u64;
    let w0 = super::rows::T_I64 as u64 | v << 8;
    finish(9u64.wrapping_mul(K_LEN).wrapping_add(w0.wrapping_mul(K[0])).wrapping_add((v >> 56).wrapping_mul(K[1])))
}

/// [`key_hash`] of the encoding of the key of two `i64` columns `(a, b)` (their
/// [`super::rows::i64_code`]s one after the other: 18 bytes, three words), from the values:
/// the most common key of two columns (TPC-H Q9's part and supplier) without a per-column
/// step.
#[inline]
pub fn i64_pair_key_hash(a: i64, b: i64) -> u64 {
    let (a, b, t) = (a as u64, b as u64, super::rows::T_I64 as u64);
    let w0 = t | a << 8;
    let w1 = a >> 56 | t << 8 | b << 16;
    let w2 = b >> 48;
    finish(18u64.wrapping_mul(K_LEN).wrapping_add(w0.wrapping_mul(K[0])).wrapping_add(w1.wrapping_mul(K[1])).wrapping_add(w2.wrapping_mul(K[2])))
}

/// [`key_hash`] of the encoding of date `d` ([`super::rows::date_code`]), from the date.
#[inline]
pub fn date_key_hash(d: i32) -> u64 {
    let w0 = super::rows::T_DATE as u64 | (d as u32 as u64) << 8;
    finish(5u64.wrapping_mul(K_LEN).wrapping_add(w0.wrapping_mul(K[0])))
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
/// filters, groupings whose output key it is (a group key that is a plain column:
/// dropping the rows of a group drops exactly the group) and the left sides of anti joins
/// to a column scan.
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
            // An anti join (NOT IN, NOT EXISTS) passes on rows of its left input as they
            // are, or drops them: a left row whose key cannot match above produces nothing
            // there either way. (It installs no filter of its own on its left side, which
            // it probes with or builds from; a semi join does, in the scan's one slot.)
            Plan::HashJoin { left, kind: JoinKind::Anti | JoinKind::NotExists, .. } => plan = left,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::rows::{date_code, i64_code};
    use crate::util::SplitMix64;

    #[test]
    fn value_hashes_equal_the_hashes_of_the_encodings() {
        let mut r = SplitMix64(5);
        let mut vals: Vec<i64> = vec![0, 1, -1, i64::MIN, i64::MAX, 255, 256, -256];
        vals.extend((0..2000).map(|_| r.next_u64() as i64));
        for v in vals {
            assert_eq!(i64_key_hash(v), key_hash(&i64_code(v)), "{v}");
            let w = r.next_u64() as i64;
            assert_eq!(i64_pair_key_hash(v, w), key_hash(&[i64_code(v), i64_code(w)].concat()), "({v}, {w})");
            let d = v as i32;
            assert_eq!(date_key_hash(d), key_hash(&date_code(d)), "{d}");
        }
    }

    #[test]
    fn fixed_key_hashes_equal_the_hashes_of_the_encodings() {
        use crate::sql::rows::f64_code;
        let mut r = SplitMix64(9);
        for _ in 0..3000 {
            // One to six columns of integers, doubles and dates in a random order.
            let (mut enc, mut h) = (Vec::new(), FixedKeyHash::default());
            for _ in 0..1 + r.below(6) {
                let v = r.next_u64();
                match r.below(3) {
                    0 => {
                        enc.extend_from_slice(&i64_code(v as i64));
                        h.push(fixed_i64(v as i64), 9);
                    }
                    1 => {
                        let f = if v.is_multiple_of(5) { -0.0 } else { f64::from_bits(v >> 2) };
                        enc.extend_from_slice(&f64_code(f));
                        h.push(fixed_f64(f), 9);
                    }
                    _ => {
                        enc.extend_from_slice(&date_code(v as i32));
                        h.push(fixed_date(v as i32), 5);
                    }
                }
            }
            assert_eq!(h.finish(), key_hash(&enc), "{enc:?}");
        }
    }

    #[test]
    fn a_filter_keeps_every_key_added_and_drops_most_others() {
        let keys: Vec<[u8; 9]> = (0..5000i64).map(|k| i64_code(k * 7)).collect();
        let mut f = KeyFilter::new(keys.len() as u64, vec![0]);
        for k in &keys {
            f.add(k);
        }
        assert!(keys.iter().all(|k| f.may_contain(key_hash(k))));
        let passed = (0..100_000i64).filter(|k| k % 7 != 0 && f.may_contain(i64_key_hash(*k))).count();
        // 16 bits per key, one bit each: about 6 % false positives; allow twice that.
        assert!(passed < 100_000 * 12 / 100, "{passed} false positives in 100000");
    }
}
