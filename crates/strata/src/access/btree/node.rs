//! The byte format of B+-tree nodes, and reading it from a latched slice or through an
//! optimistic guard.
//!
//! Every node starts with a 64-byte header of little-endian u64 words (so an optimistic
//! reader loads each with one atomic load):
//!
//! | word | inner node                          | key-value leaf          | PAX leaf (tables) |
//! |------|-------------------------------------|-------------------------|-------------------|
//! | 0    | kind (byte 0), count (bytes 4..8)   | same                    | same              |
//! | 1    | heap start (lowest used heap byte)  | same                    | var start         |
//! | 2    | dead heap bytes                     | same                    | capacity          |
//! | 3    | `upper`: child for keys ≥ last sep  | –                       | first row id      |
//! | 4    | tree word (tables: next row id)     | –                       | –                 |
//! | 5    | tables: committed rows, see below   | –                       | –                 |
//!
//! Words 4 and 5 are the tree's own ([`tree_words`]): they mean something in the root alone
//! and every rebuild of an inner node carries them over. A table's root keeps in word 5 the
//! number of rows whose appends committed, with [`COMMITTED_SET`] set (a word of 0 is a
//! table from before the word existed: its readers fall back to word 4).
//!
//! (A packed table leaf, `KIND_PACKED`, has its own words after word 0: see
//! `access::table::packed`.)
//!
//! Inner nodes and key-value leaves then hold `count` slots of three words each, sorted by
//! key, and a heap of key (and value) bytes growing down from the end of the page:
//!
//! * word 0: key offset (low 32 bits), key length (high 32 bits);
//! * word 1: inner: the child's page id, for keys below this slot's key (and at or above the
//!   previous slot's); leaf: the value's length (the value follows the key in the heap);
//! * word 2: the key's first 8 bytes, big-endian, zero padded: most comparisons end here,
//!   and for 8-byte keys (u64 ids in big-endian) all of them do.
//!
//! Optimistic readers see whatever bytes are there while a writer changes them, so every
//! length and offset read is checked against the page before it is used; an impossible one
//! means "restart" (and, if the page then validates, corruption).

use std::cmp::Ordering;

use crate::buffer::{OptimisticGuard, Restart};

/// Bytes of the node header.
pub const HDR: usize = 64;
/// Bytes of one slot.
pub const SLOT: usize = 24;
/// The longest key.
pub const MAX_KEY: usize = 1024;

/// An inner node.
pub const KIND_INNER: u8 = 1;
/// A key-value leaf.
pub const KIND_LEAF: u8 = 2;
/// A PAX leaf of a table.
pub const KIND_PAX: u8 = 3;
/// A packed (compressed, read-only) leaf of a table (see `access::table::packed`).
pub const KIND_PACKED: u8 = 4;

/// Whether `kind` is a table leaf's (plain PAX or packed).
#[inline]
pub fn is_table_leaf(kind: u8) -> bool {
    kind == KIND_PAX || kind == KIND_PACKED
}

/// Header word offsets.
pub const W_KIND_COUNT: usize = 0;
pub const W_HEAP: usize = 8;
pub const W_DEAD: usize = 16;
pub const W_UPPER: usize = 24;
pub const W_TREE: usize = 32;
/// The second tree word (tables: committed rows, with [`COMMITTED_SET`]).
pub const W_COMMITTED: usize = 40;
/// The flag of a maintained committed-rows word (word 5 of a table's root).
pub const COMMITTED_SET: u64 = 1 << 63;

/// The tree words (header words 4 and 5) of a node, carried over when it is rebuilt.
pub fn tree_words<S: Src + ?Sized>(s: &S) -> [u64; 2] {
    [s.word(W_TREE), s.word(W_COMMITTED)]
}

/// Where a node's bytes are read from: a latched slice or an optimistic guard.
pub trait Src {
    /// Payload length.
    fn size(&self) -> usize;
    /// The little-endian word at `at` (a multiple of 8, `at + 8 <= size`).
    fn word(&self, at: usize) -> u64;
    /// Copies `dst.len()` bytes from `at` (in bounds).
    fn copy(&self, at: usize, dst: &mut [u8]);
}

impl Src for [u8] {
    fn size(&self) -> usize {
        self.len()
    }
    fn word(&self, at: usize) -> u64 {
        u64::from_le_bytes(self[at..at + 8].try_into().unwrap())
    }
    fn copy(&self, at: usize, dst: &mut [u8]) {
        dst.copy_from_slice(&self[at..at + dst.len()]);
    }
}

/// A reference reads what it refers to (so that a `&[u8]` can be passed as `&dyn Src`).
impl<T: Src + ?Sized> Src for &T {
    fn size(&self) -> usize {
        (**self).size()
    }
    fn word(&self, at: usize) -> u64 {
        (**self).word(at)
    }
    fn copy(&self, at: usize, dst: &mut [u8]) {
        (**self).copy(at, dst)
    }
}

impl Src for OptimisticGuard<'_> {
    fn size(&self) -> usize {
        self.len()
    }
    fn word(&self, at: usize) -> u64 {
        self.read_u64(at)
    }
    fn copy(&self, at: usize, dst: &mut [u8]) {
        self.read(at, dst)
    }
}

/// The key's comparison prefix: its first 8 bytes, big-endian, zero padded.
#[inline]
pub fn prefix(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = key.len().min(8);
    b[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(b)
}

/// A node's header, checked against its page size.
#[derive(Clone, Copy, Debug)]
pub struct Header {
    pub kind: u8,
    pub count: usize,
    pub heap: usize,
    pub dead: usize,
}

/// Reads and checks the header of an inner node or key-value leaf.
pub fn header<S: Src + ?Sized>(s: &S) -> Result<Header, Restart> {
    let w = s.word(W_KIND_COUNT);
    let kind = w as u8;
    let count = (w >> 32) as usize;
    let heap = s.word(W_HEAP) as usize;
    let dead = s.word(W_DEAD) as usize;
    let size = s.size();
    if !(kind == KIND_INNER || kind == KIND_LEAF) || count > (size - HDR) / SLOT || heap > size || heap < HDR + count * SLOT || dead > size {
        return Err(Restart);
    }
    Ok(Header { kind, count, heap, dead })
}

/// Slot `i`'s key position, checked: (offset, length, prefix, word 1).
#[inline]
pub fn slot<S: Src + ?Sized>(s: &S, i: usize) -> Result<(usize, usize, u64, u64), Restart> {
    let at = HDR + i * SLOT;
    let w0 = s.word(at);
    let off = (w0 & 0xffff_ffff) as usize;
    let len = (w0 >> 32) as usize;
    if len > MAX_KEY || off.checked_add(len).is_none_or(|e| e > s.size()) || off < HDR {
        return Err(Restart);
    }
    Ok((off, len, s.word(at + 16), s.word(at + 8)))
}

/// Compares `key` (whose [`prefix`] is `kp`) with slot `i`'s key. The slot's prefix word
/// decides most comparisons alone; the key's position is read (and checked) only when the
/// prefixes are equal.
#[inline(always)]
pub fn cmp_slot<S: Src + ?Sized>(s: &S, i: usize, key: &[u8], kp: u64, buf: &mut Vec<u8>) -> Result<Ordering, Restart> {
    let at = HDR + i * SLOT;
    if at + SLOT > s.size() {
        return Err(Restart);
    }
    let o = kp.cmp(&s.word(at + 16));
    if o != Ordering::Equal {
        return Ok(o);
    }
    let (off, len, _, _) = slot(s, i)?;
    if key.len() <= 8 && len <= 8 {
        return Ok(key.len().cmp(&len));
    }
    buf.resize(len, 0);
    s.copy(off, buf);
    Ok(key.cmp(&buf[..]))
}

/// Whether slot `i`'s key lies before the bound searched for `key`: below it for a lower
/// bound, at or below it for an upper bound.
#[inline(always)]
fn before<S: Src + ?Sized>(s: &S, i: usize, key: &[u8], kp: u64, upper: bool, buf: &mut Vec<u8>) -> Result<bool, Restart> {
    let o = cmp_slot(s, i, key, kp, buf)?;
    Ok(if upper { o != Ordering::Less } else { o == Ordering::Greater })
}

/// Slot `i`'s prefix word, checked against the page.
#[inline]
pub fn prefix_at<S: Src + ?Sized>(s: &S, i: usize) -> Result<u64, Restart> {
    let at = HDR + i * SLOT + 16;
    if at + 8 > s.size() {
        return Err(Restart);
    }
    Ok(s.word(at))
}

/// Nodes with fewer slots than this are searched by bisection alone.
const INTERPOLATE_MIN: usize = 8;

/// What a descent knows of a node's keys before it reads the node: the prefix words of the
/// separators around it in its parent (its keys lie at or above `lo`, below `hi`; `None`
/// at the tree's edges). Only a hint for a search's first guess: a wrong one (read from a
/// parent that then fails validation) costs comparisons, never a wrong answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fences {
    pub lo: Option<u64>,
    pub hi: Option<u64>,
}

/// The first of slots `0..count` that does not lie [`before`] the bound for `key`.
///
/// Interpolation on prefix words guesses the position: between the node's fences, or where
/// one is unknown its first or last slot (keys that are integers in big-endian, the common
/// case, are spread evenly enough for the guess to land on or next to the answer); a gallop
/// from the guess (steps 1, 2, 4, ...) brackets the answer and a bisection of the bracket
/// finds it. Every step compares whole keys, so the result is the bisection's for any
/// sorted node whatever the guess; a bad guess (skewed keys, or keys sharing their first 8
/// bytes) costs at most about twice a bisection's comparisons. On an unsorted (torn or
/// corrupt) node the answer is some index in `0..=count`, as with a bisection; every read
/// is checked.
fn bound<S: Src + ?Sized>(s: &S, count: usize, key: &[u8], upper: bool, fences: Fences, buf: &mut Vec<u8>) -> Result<usize, Restart> {
    let kp = prefix(key);
    // Invariant: slots below `lo` lie before the bound, slots at or above `hi` do not.
    let (mut lo, mut hi) = (0, count);
    if count >= INTERPOLATE_MIN {
        // Prefix `first` sits at position 0 and `last` at position `span`: the last slot's
        // own prefix at `count - 1`, the upper fence just past the last slot.
        let first = match fences.lo {
            Some(p) => p,
            None => prefix_at(s, 0)?,
        };
        let (last, span) = match fences.hi {
            Some(p) => (p, count),
            None => (prefix_at(s, count - 1)?, count - 1),
        };
        let g = if kp <= first {
            0
        } else if kp >= last {
            count - 1
        } else {
            // first < kp < last: the slot the prefix would take if prefixes were evenly spread.
            // (In floating point: a 128-bit division costs more than the search it saves.)
            let f = (kp - first) as f64 / (last - first) as f64;
            ((f * span as f64) as usize).min(count - 1)
        };
        if before(s, g, key, kp, upper, buf)? {
            lo = g + 1;
            let mut step = 1;
            while lo < hi {
                let probe = (lo + step - 1).min(hi - 1);
                if before(s, probe, key, kp, upper, buf)? {
                    lo = probe + 1;
                } else {
                    hi = probe;
                    break;
                }
                step *= 2;
            }
        } else {
            hi = g;
            let mut step = 1;
            while lo < hi {
                let probe = hi.saturating_sub(step).max(lo);
                if before(s, probe, key, kp, upper, buf)? {
                    lo = probe + 1;
                    break;
                }
                hi = probe;
                step *= 2;
            }
        }
    }
    while lo < hi {
        let mid = (lo + hi) / 2;
        if before(s, mid, key, kp, upper, buf)? {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// The first slot whose key is greater than `key` (`count` if none). For an inner node that
/// is the child to follow (`upper` when it is `count`).
pub fn upper_bound<S: Src + ?Sized>(s: &S, count: usize, key: &[u8], buf: &mut Vec<u8>) -> Result<usize, Restart> {
    bound(s, count, key, true, Fences::default(), buf)
}

/// The first slot whose key is not less than `key`, and whether it equals `key`.
pub fn lower_bound<S: Src + ?Sized>(s: &S, count: usize, key: &[u8], buf: &mut Vec<u8>) -> Result<(usize, bool), Restart> {
    lower_bound_in(s, count, key, Fences::default(), buf)
}

/// [`lower_bound`] in a node whose fences are known.
pub fn lower_bound_in<S: Src + ?Sized>(s: &S, count: usize, key: &[u8], fences: Fences, buf: &mut Vec<u8>) -> Result<(usize, bool), Restart> {
    let lo = bound(s, count, key, false, fences, buf)?;
    let found = lo < count && cmp_slot(s, lo, key, prefix(key), buf)? == Ordering::Equal;
    Ok((lo, found))
}

/// [`upper_bound`] by bisection alone (the reference the tests compare the search with).
pub fn upper_bound_bisect<S: Src + ?Sized>(s: &S, count: usize, key: &[u8], buf: &mut Vec<u8>) -> Result<usize, Restart> {
    let kp = prefix(key);
    let (mut lo, mut hi) = (0, count);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if cmp_slot(s, mid, key, kp, buf)? == Ordering::Less {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(lo)
}

/// [`lower_bound`] by bisection alone (the reference the tests compare the search with).
pub fn lower_bound_bisect<S: Src + ?Sized>(s: &S, count: usize, key: &[u8], buf: &mut Vec<u8>) -> Result<(usize, bool), Restart> {
    let kp = prefix(key);
    let (mut lo, mut hi) = (0, count);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if cmp_slot(s, mid, key, kp, buf)? == Ordering::Greater {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let found = lo < count && cmp_slot(s, lo, key, kp, buf)? == Ordering::Equal;
    Ok((lo, found))
}

/// The slot count of a node whose word 0 is `w0`, checked against the page size (all a
/// search needs: every slot it reads then lies inside the page).
#[inline]
pub fn slot_count<S: Src + ?Sized>(s: &S, w0: u64) -> Result<usize, Restart> {
    let count = (w0 >> 32) as usize;
    if count > (s.size() - HDR) / SLOT {
        return Err(Restart);
    }
    Ok(count)
}

/// [`inner_child`] of an inner node with `count` slots (checked by [`slot_count`] or
/// [`header`]) and these fences. Also returns the child's fences.
#[inline]
pub fn inner_child_at<S: Src + ?Sized>(s: &S, count: usize, key: &[u8], fences: Fences, buf: &mut Vec<u8>) -> Result<(usize, u64, Fences), Restart> {
    let i = bound(s, count, key, true, fences, buf)?;
    let lo = if i > 0 { Some(prefix_at(s, i - 1)?) } else { fences.lo };
    let (child, hi) = if i == count {
        (s.word(W_UPPER), fences.hi)
    } else {
        // The slot followed is checked whole (its key's position too), as `inner_child` does.
        let (_, _, p, child) = slot(s, i)?;
        (child, Some(p))
    };
    Ok((i, child, Fences { lo, hi }))
}

/// The child of an inner node to follow for `key`: (slot index or `count` for upper, child).
pub fn inner_child<S: Src + ?Sized>(s: &S, h: &Header, key: &[u8], buf: &mut Vec<u8>) -> Result<(usize, u64), Restart> {
    let i = upper_bound(s, h.count, key, buf)?;
    let child = if i == h.count { s.word(W_UPPER) } else { slot(s, i)?.3 };
    Ok((i, child))
}

/// A decoded node: its entries as (key, word 1 or value) in order, for rebuilding.
#[derive(Clone, Debug, Default)]
pub struct Entries {
    /// Keys and values, concatenated.
    pub bytes: Vec<u8>,
    /// (key start, key length, value length or child) per entry.
    pub items: Vec<(usize, usize, u64)>,
}

impl Entries {
    /// Entry `i`'s key.
    pub fn key(&self, i: usize) -> &[u8] {
        let (o, l, _) = self.items[i];
        &self.bytes[o..o + l]
    }
    /// Entry `i`'s value (leaves).
    pub fn value(&self, i: usize) -> &[u8] {
        let (o, l, v) = self.items[i];
        &self.bytes[o + l..o + l + v as usize]
    }
    /// Entry `i`'s child (inner nodes).
    pub fn child(&self, i: usize) -> u64 {
        self.items[i].2
    }
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.items.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
    /// Heap bytes entry `i` takes (key and value).
    pub fn heap_bytes(&self, i: usize, leaf: bool) -> usize {
        let (_, l, v) = self.items[i];
        l + if leaf { v as usize } else { 0 }
    }
    /// Appends an entry.
    pub fn push(&mut self, key: &[u8], value: &[u8], word: u64) {
        let o = self.bytes.len();
        self.bytes.extend_from_slice(key);
        self.bytes.extend_from_slice(value);
        self.items.push((o, key.len(), word));
    }
    /// Inserts an entry at `i`.
    pub fn insert(&mut self, i: usize, key: &[u8], value: &[u8], word: u64) {
        let o = self.bytes.len();
        self.bytes.extend_from_slice(key);
        self.bytes.extend_from_slice(value);
        self.items.insert(i, (o, key.len(), word));
    }
}

/// Decodes every entry of a latched inner node or key-value leaf.
pub fn decode(s: &[u8]) -> Result<(Header, Entries), Restart> {
    let h = header(s)?;
    let leaf = h.kind == KIND_LEAF;
    let mut e = Entries::default();
    for i in 0..h.count {
        let (off, len, _, w1) = slot(s, i)?;
        let vlen = if leaf { w1 as usize } else { 0 };
        let end = off.checked_add(len).and_then(|x| x.checked_add(vlen)).ok_or(Restart)?;
        if end > s.len() {
            return Err(Restart);
        }
        let o = e.bytes.len();
        e.bytes.extend_from_slice(&s[off..end]);
        e.items.push((o, len, w1));
    }
    Ok((h, e))
}

/// Bytes a node of `size` payload bytes has free for slots and heap.
pub fn room(size: usize) -> usize {
    size - HDR
}

/// Bytes entries `range` of `e` need in a node (slots and heap).
pub fn need(e: &Entries, range: std::ops::Range<usize>, leaf: bool) -> usize {
    range.map(|i| SLOT + e.heap_bytes(i, leaf)).sum()
}

/// Builds the image of a node of `size` payload bytes holding `e[range]` (compact heap).
/// `upper` is header word 3, `tree` the words 4 and 5 ([`tree_words`]).
pub fn build(size: usize, kind: u8, e: &Entries, range: std::ops::Range<usize>, upper: u64, tree: [u64; 2]) -> Vec<u8> {
    let leaf = kind == KIND_LEAF;
    let mut img = vec![0u8; size];
    let count = range.len();
    let mut heap = size;
    for (slot_no, i) in range.enumerate() {
        let (o, l, w) = e.items[i];
        let n = e.heap_bytes(i, leaf);
        heap -= n;
        img[heap..heap + n].copy_from_slice(&e.bytes[o..o + n]);
        let at = HDR + slot_no * SLOT;
        img[at..at + 8].copy_from_slice(&((heap as u64) | ((l as u64) << 32)).to_le_bytes());
        img[at + 8..at + 16].copy_from_slice(&w.to_le_bytes());
        img[at + 16..at + 24].copy_from_slice(&prefix(&e.bytes[o..o + l]).to_le_bytes());
    }
    debug_assert!(heap >= HDR + count * SLOT);
    img[0..8].copy_from_slice(&((kind as u64) | ((count as u64) << 32)).to_le_bytes());
    img[W_HEAP..W_HEAP + 8].copy_from_slice(&(heap as u64).to_le_bytes());
    img[W_UPPER..W_UPPER + 8].copy_from_slice(&upper.to_le_bytes());
    img[W_TREE..W_TREE + 8].copy_from_slice(&tree[0].to_le_bytes());
    img[W_COMMITTED..W_COMMITTED + 8].copy_from_slice(&tree[1].to_le_bytes());
    img
}

/// The byte ranges in which `new` differs from `old` (same length): at most two, one in
/// each half, so that a rebuilt node logs what changed and not the whole page.
pub fn diff_ranges(old: &[u8], new: &[u8]) -> Vec<std::ops::Range<usize>> {
    debug_assert_eq!(old.len(), new.len());
    let mid = old.len() / 2;
    let mut out = Vec::with_capacity(2);
    for (lo, hi) in [(0, mid), (mid, old.len())] {
        let a = &old[lo..hi];
        let b = &new[lo..hi];
        if let Some(first) = a.iter().zip(b).position(|(x, y)| x != y) {
            let last = a.iter().zip(b).rposition(|(x, y)| x != y).unwrap();
            out.push(lo + first..lo + last + 1);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_orders_like_the_bytes() {
        let keys: [&[u8]; 7] = [b"", b"\0", b"a", b"a\0", b"ab", b"abcdefgh", b"abcdefgh\0"];
        for w in keys.windows(2) {
            assert!(prefix(w[0]) <= prefix(w[1]));
        }
        assert_eq!(prefix(&7u64.to_be_bytes()), 7);
    }

    /// Bounded fuzzing of the node decoder with damaged images: header, slots, searches and
    /// decoding never panic (impossible values are `Restart`).
    #[test]
    fn damaged_nodes_never_panic() {
        let (mut le, mut ie) = (Entries::default(), Entries::default());
        for i in 0..60u64 {
            let k = format!("key-{i:05}-{}", "x".repeat((i % 13) as usize));
            let v = vec![i as u8; (i % 40) as usize];
            le.push(k.as_bytes(), &v, v.len() as u64);
            ie.push(k.as_bytes(), &[], 1000 + i);
        }
        let size = 4096 - 32;
        let leaf = build(size, KIND_LEAF, &le, 0..le.len(), 0, [0, 0]);
        let inner = build(size, KIND_INNER, &ie, 0..ie.len(), 77, [5, 6]);
        let mut r = crate::util::SplitMix64(5);
        let mut buf = Vec::new();
        for i in 0..20_000u64 {
            let mut img = if i % 2 == 0 { leaf.clone() } else { inner.clone() };
            for _ in 0..1 + r.below(4) {
                let at = (r.below(size as u64 / 8) * 8) as usize;
                let at = if r.coin() { at % (HDR + 64 * SLOT) } else { at };
                let v = [0, 1, u64::MAX, r.next_u64(), size as u64, (size as u64) << 32, r.below(2048) | (r.below(2048) << 32)][r.below(7) as usize];
                img[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
            if let Ok(h) = header(&img[..]) {
                for key in [b"key-00030".as_slice(), b"", b"zzzz"] {
                    let _ = lower_bound(&img[..], h.count, key, &mut buf);
                    let _ = inner_child(&img[..], &h, key, &mut buf);
                }
                let _ = decode(&img);
            }
        }
    }

    #[test]
    fn build_then_search_and_decode() {
        let mut e = Entries::default();
        for k in [b"apple".as_slice(), b"banana-split-xyz", b"cherry", b"cherry-longer-than-eight"] {
            e.push(k, b"value", 5);
        }
        let img = build(4096 - 32, KIND_LEAF, &e, 0..e.len(), 0, [0, 0]);
        let h = header(&img[..]).unwrap();
        assert_eq!(h.count, 4);
        let mut buf = Vec::new();
        assert_eq!(lower_bound(&img[..], h.count, b"banana-split-xyz", &mut buf).unwrap(), (1, true));
        assert_eq!(lower_bound(&img[..], h.count, b"cherry-", &mut buf).unwrap(), (3, false));
        assert_eq!(lower_bound(&img[..], h.count, b"zzz", &mut buf).unwrap(), (4, false));
        assert_eq!(upper_bound(&img[..], h.count, b"cherry", &mut buf).unwrap(), 3);
        let (_, d) = decode(&img).unwrap();
        assert_eq!(d.key(3), b"cherry-longer-than-eight");
        assert_eq!(d.value(2), b"value");
        let mut img2 = img.clone();
        img2[100] ^= 1;
        img2[4000] ^= 1;
        assert_eq!(diff_ranges(&img, &img2), vec![100..101, 4000..4001]);
    }
}
