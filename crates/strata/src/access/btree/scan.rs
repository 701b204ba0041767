//! Range scans: the leaves in key order, the next one reached through the parent without a
//! new descent, and the parent's next children read ahead while the current leaf is handed
//! out.
//!
//! # Read-ahead
//! A scan that finds leaves ahead of it out of memory runs a read-ahead stream
//! ([`BufferManager::read_ahead`]) over the parent's children after the current one (up to
//! the child holding the scan's end key, if it has one): its I/O threads load them, with
//! coalesced reads several in flight, while the scan decodes the current leaf, so a cold
//! scan of a table costs the device's time or the CPU's, whichever is larger, not their sum.
//! The list is a snapshot of the parent taken under a validated optimistic read; a leaf
//! split or freed meanwhile only makes a prefetch useless (`prefetch` skips pages that are
//! not allocated), never a scan wrong: the scan itself still follows the parent.

use super::node::{self, HDR, KIND_LEAF, KIND_PACKED, SLOT, W_UPPER};
use super::{BTree, LeafVisitor, Path, Step};
use crate::buffer::{BufferManager, OptimisticGuard, PartialRead, ReadAhead, Ring};
use crate::error::{Error, Result};
use crate::storage::PageId;

/// Leaves larger than this are scanned under a shared latch instead of copied out.
const SCAN_COPY_LIMIT: usize = 256 << 10;
/// A scan reads a parent's children ahead when at least this many lie ahead of it.
const AHEAD_MIN: usize = 2;

/// How a walk along one parent's children ended.
enum Walk {
    /// The scan is over (the visitor stopped it, or the last leaf was handed out).
    Done,
    /// Descend again from the root for the next leaf (the parent has no further child, or
    /// a validation failed).
    Descend,
    /// The next leaf is not in memory: descend again to it and read ahead from there on.
    ReadAhead,
}

/// A walk's read-ahead.
enum Ahead<'a, 'r, 's> {
    /// None: the scan reads ahead, but this parent has too few children ahead of it (or
    /// changed while they were listed).
    Off,
    /// None yet: end the walk with [`Walk::ReadAhead`] at the first leaf not in memory.
    Ask,
    /// This stream.
    On(&'a Stream<'r, 's>),
    /// This ring: the children ahead read into the scan's own buffers.
    Ring(&'a RingAhead<'r, 's>),
}

/// A scan ring over a parent's children from slot `first` on.
struct RingAhead<'r, 's> {
    ring: &'r Ring<'s>,
    first: usize,
}

/// The leaf a walk hands out next.
enum Cur<'a, 'r> {
    /// In the pool (read optimistically).
    Guard(OptimisticGuard<'a>),
    /// Its image in a scan ring: the parent's child `i`.
    Image(PageId, &'r [u8], usize),
}

/// A read-ahead stream over a parent's children from slot `first` on.
struct Stream<'r, 's> {
    ra: &'r ReadAhead<'s>,
    first: usize,
}

impl Stream<'_, '_> {
    /// The scan is about to use the parent's child `i`: the children after it are requested,
    /// and the scan sleeps until the I/O threads have read child `i` if they are reading it.
    fn reach(&self, i: usize) {
        if let Some(pos) = i.checked_sub(self.first) {
            self.ra.advance(pos..pos + 1);
            self.ra.wait(pos..pos + 1);
        }
    }
}

impl BTree {
    /// Calls `f(key, value)` for every entry with a key at or after `start`, in key order,
    /// until `f` returns false. Each leaf is copied out and validated before its entries
    /// are handed out (leaves larger than 256 KiB are read under a shared latch instead), and
    /// the next leaf is reached through the parent without a new descent. Do not change the
    /// tree from inside `f`.
    pub fn scan(&self, bm: &BufferManager, start: &[u8], f: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<()> {
        self.scan_leaves(bm, start, None, None, &mut |pid, page, from| emit(bm, pid, page, from, f))
    }

    /// Calls `f(page id, bytes, from)` with each leaf, in key order, from the one holding
    /// `start`, until `f` returns false: the bytes are a validated copy of the leaf (or the
    /// leaf itself under a shared latch, for packed table leaves and leaves larger than
    /// 256 KiB), `from` the least
    /// key not handed out yet (entries below it were in an earlier leaf). The next leaf is
    /// reached through the parent without a new descent where possible. `end`, if given,
    /// is a key the caller will stop at (`f` returns false there): leaves beyond the one
    /// holding it are not read ahead.
    ///
    /// With `partial`, leaves read ahead into a scan ring are read in part, as it says
    /// ([`PartialRead`]): `f` then gets images of which only those bytes are the leaf's.
    pub(crate) fn scan_leaves(
        &self,
        bm: &BufferManager,
        start: &[u8],
        end: Option<&[u8]>,
        partial: Option<&dyn PartialRead>,
        f: &mut LeafVisitor<'_>,
    ) -> Result<()> {
        let mut from = start.to_vec();
        let mut scratch = ScanPage::take();
        let page = &mut scratch.0;
        let mut buf = Vec::new();
        // A scan starts without read-ahead and turns it on for good when the next leaf is
        // not in memory.
        let mut reading_ahead = false;
        loop {
            let Some(mut path) = self.descend(bm, &from, &mut buf)? else { continue };
            let Some(fence) = fence_of(bm, &path)? else { continue };
            let mut parent = path.inner.pop().expect("a leaf has a parent");
            let leaf = path.leaf;
            let walk = match children_ahead(&parent, end, reading_ahead, &mut buf) {
                Some(pids) => bm.scan_ring(&pids, partial, |ring| match ring {
                    Some(ring) => {
                        let ahead = RingAhead { ring, first: parent.idx + 1 };
                        walk(bm, &mut parent, leaf, fence, &mut from, page, f, Ahead::Ring(&ahead))
                    }
                    None => bm.read_ahead(&pids, |ra| {
                        // Start the stream now, so the first child ahead is read while the
                        // current leaf is handed out.
                        ra.advance(0..0);
                        let ahead = Stream { ra, first: parent.idx + 1 };
                        walk(bm, &mut parent, leaf, fence, &mut from, page, f, Ahead::On(&ahead))
                    }),
                })?,
                None => walk(bm, &mut parent, leaf, fence, &mut from, page, f, if reading_ahead { Ahead::Off } else { Ahead::Ask })?,
            };
            match walk {
                Walk::Done => return Ok(()),
                Walk::Descend => {}
                Walk::ReadAhead => reading_ahead = true,
            }
        }
    }
}

/// The children of `parent` after the one the descent followed, up to the one holding `end`
/// (its `upper` child included), if the scan is `reading` ahead and there are at least
/// [`AHEAD_MIN`] of them. `None` also when the parent changed while they were read (the
/// scan then goes without).
fn children_ahead(parent: &Step<'_>, end: Option<&[u8]>, reading: bool, buf: &mut Vec<u8>) -> Option<Vec<PageId>> {
    if !reading {
        return None;
    }
    let h = node::header(&parent.g).ok()?;
    let last = match end {
        Some(key) => node::inner_child(&parent.g, &h, key, buf).ok()?.0,
        None => h.count,
    };
    let first = parent.idx + 1;
    if last < first || last + 1 - first < AHEAD_MIN {
        return None;
    }
    let mut pids = Vec::with_capacity(last + 1 - first);
    for i in first..=last {
        let child = if i < h.count { node::slot(&parent.g, i).ok()?.3 } else { parent.g.read_u64(W_UPPER) };
        pids.push(PageId::from_raw(child));
    }
    parent.g.validate().then_some(pids)
}

/// Hands out `leaf` and the parent's children after it, in order, until the scan ends or
/// must descend again. `from` is the least key not handed out yet, `fence` the current
/// leaf's upper fence (`None`: it is the last leaf).
#[allow(clippy::too_many_arguments)]
fn walk<'a>(
    bm: &'a BufferManager,
    parent: &mut Step<'a>,
    leaf: OptimisticGuard<'a>,
    mut fence: Option<Vec<u8>>,
    from: &mut Vec<u8>,
    page: &mut Vec<u8>,
    f: &mut LeafVisitor<'_>,
    ahead: Ahead<'_, '_, '_>,
) -> Result<Walk> {
    let mut cur = Cur::Guard(leaf);
    loop {
        let (more, pid) = match &cur {
            Cur::Guard(leaf) => {
                // A packed table leaf is never changed in place (only rewritten whole): it
                // is read under a shared latch where it lies, not copied first (its reader
                // decodes it into a copy of its own anyway), as are leaves too large to copy.
                let packed = leaf.read_u64(node::W_KIND_COUNT) as u8 == KIND_PACKED;
                let more = if leaf.len() <= SCAN_COPY_LIMIT && !packed {
                    page.resize(leaf.len(), 0);
                    copy_leaf(leaf, page);
                    if !leaf.validate() {
                        return Ok(Walk::Descend);
                    }
                    f(leaf.pid(), page, from)?
                } else {
                    let s = bm.fix_shared(leaf.pid())?;
                    if !parent.g.validate() {
                        return Ok(Walk::Descend);
                    }
                    f(leaf.pid(), s.data(), from)?
                };
                (more, leaf.pid())
            }
            Cur::Image(pid, image, i) => {
                let more = f(*pid, image, from)?;
                if let Ahead::Ring(r) = ahead {
                    r.ring.release(i - r.first);
                }
                (more, *pid)
            }
        };
        if !more {
            return Ok(Walk::Done);
        }
        let Some(next_from) = fence.take() else { return Ok(Walk::Done) };
        // A leaf's fence (read and validated) lies above every key it can hold, so
        // above `from`: one at or below it means separator keys out of order, and
        // following it would hand out the same leaves again, forever.
        if next_from <= *from {
            return Err(BTree::corrupt(bm, pid, "separator keys out of order (a scan would not advance)"));
        }
        // The old `from`'s buffer holds the next fence (no allocation per leaf).
        let mut next_fence = std::mem::replace(from, next_from);
        // The next leaf through the parent, if it is a slot's child (for `upper`, the
        // fence of the next leaf lies above: descend again).
        let i = parent.idx + 1;
        let Ok(h) = node::header(&parent.g) else {
            BTree::restart_or_corrupt::<()>(bm, &parent.g, "impossible header")?;
            return Ok(Walk::Descend);
        };
        if i >= h.count {
            return Ok(Walk::Descend);
        }
        let Ok((off, len, _, child)) = node::slot(&parent.g, i) else {
            BTree::restart_or_corrupt::<()>(bm, &parent.g, "impossible slot")?;
            return Ok(Walk::Descend);
        };
        next_fence.clear();
        next_fence.resize(len, 0);
        parent.g.read(off, &mut next_fence);
        if !parent.g.validate() {
            return Ok(Walk::Descend);
        }
        match ahead {
            Ahead::On(stream) => stream.reach(i),
            Ahead::Ask if h.count - i >= AHEAD_MIN && !bm.is_resident(PageId::from_raw(child)) => return Ok(Walk::ReadAhead),
            Ahead::Ring(r) => {
                // The ring's image, if it is the child now (an optimistic read of an evicted
                // page; the parent, validated after it, still points to the child).
                if let Some(pos) = i.checked_sub(r.first) {
                    // SAFETY: this walk is the ring's only consumer, and it gives `pos` back
                    // only once the image is no longer used: below if it is not taken, else
                    // after the visitor read it (the `Cur::Image` arm), before `cur` moves on.
                    if let Some(image) = unsafe { r.ring.get(pos) } {
                        if r.ring.page_of(pos) == PageId::from_raw(child) && parent.g.validate() {
                            parent.idx = i;
                            cur = Cur::Image(PageId::from_raw(child), image, i);
                            fence = Some(next_fence);
                            continue;
                        }
                    }
                    // Not taken from the ring: its buffer is free again.
                    r.ring.release(pos);
                }
            }
            _ => {}
        }
        let Ok(next) = bm.fix_optimistic(PageId::from_raw(child)) else { return Ok(Walk::Descend) };
        if !parent.g.validate() {
            return Ok(Walk::Descend);
        }
        parent.idx = i;
        cur = Cur::Guard(next);
        fence = Some(next_fence);
    }
}

/// The upper fence of the path's leaf: the separator above it in the lowest ancestor where
/// the descent did not follow `upper` (`Some(None)`: none, it is the last leaf). `Ok(None)`:
/// restart; an impossible node that validates is a corruption (a restart would find it
/// again, forever).
fn fence_of(bm: &BufferManager, path: &Path<'_>) -> Result<Option<Option<Vec<u8>>>> {
    for step in path.inner.iter().rev() {
        let Ok(h) = node::header(&step.g) else { return BTree::restart_or_corrupt(bm, &step.g, "impossible header") };
        if step.idx < h.count {
            let Ok((off, len, _, _)) = node::slot(&step.g, step.idx) else { return BTree::restart_or_corrupt(bm, &step.g, "impossible slot") };
            let mut k = vec![0u8; len];
            step.g.read(off, &mut k);
            return Ok(step.g.validate().then_some(Some(k)));
        }
    }
    Ok(path.inner.iter().all(|s| s.g.validate()).then_some(None))
}

thread_local! {
    /// A thread's buffer for the leaf copies of its scans, kept between scans: allocating
    /// and freeing a page-sized buffer per scan cost more than a short scan's comparisons.
    static SCAN_PAGE: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// A scan's leaf buffer, taken from the thread's [`SCAN_PAGE`] (empty if a scan inside a
/// scan's callback holds it) and given back when dropped, unless it grew past 64 KiB.
struct ScanPage(Vec<u8>);

impl ScanPage {
    fn take() -> ScanPage {
        ScanPage(SCAN_PAGE.try_with(|c| c.take()).unwrap_or_default())
    }
}

impl Drop for ScanPage {
    fn drop(&mut self) {
        if self.0.capacity() <= 64 << 10 {
            let page = std::mem::take(&mut self.0);
            // During thread teardown the slot may be gone: then the buffer is just freed.
            let _ = SCAN_PAGE.try_with(|c| c.set(page));
        }
    }
}

/// Copies the leaf behind `g` into `page` (its length) for a scan: of a key-value leaf only
/// what its entries occupy (header and slots, and the heap; the free bytes between them are
/// left as they were in `page`), of any other page all of it. The copy is meaningful only
/// if `g` validates afterwards (the header words that chose the ranges included).
fn copy_leaf(g: &OptimisticGuard<'_>, page: &mut [u8]) {
    let w0 = g.read_u64(node::W_KIND_COUNT);
    let heap = g.read_u64(node::W_HEAP) as usize;
    let slots_end = HDR + (w0 >> 32) as usize * SLOT;
    if w0 as u8 == KIND_LEAF && slots_end <= heap && heap <= page.len() {
        g.read(0, &mut page[..slots_end]);
        g.read(heap, &mut page[heap..]);
    } else {
        g.read(0, page);
    }
}

/// Hands the entries of a (copied or latched) leaf at or after `from` to `f`; false when
/// `f` asked to stop.
fn emit(bm: &BufferManager, pid: PageId, page: &[u8], from: &[u8], f: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<bool> {
    let mut buf = Vec::new();
    if page[0] != KIND_LEAF {
        return Err(Error::InvalidInput(format!("page {pid} is a table leaf, not a key-value leaf: use the table's methods")));
    }
    let h = node::header(page).map_err(|_| BTree::corrupt(bm, pid, "impossible header"))?;
    let (i, _) = node::lower_bound(page, h.count, from, &mut buf).map_err(|_| BTree::corrupt(bm, pid, "impossible leaf"))?;
    for j in i..h.count {
        let (off, len, _, vlen) = node::slot(page, j).map_err(|_| BTree::corrupt(bm, pid, "impossible slot"))?;
        let end = (off + len).checked_add(vlen as usize).filter(|&e| e <= page.len()).ok_or_else(|| BTree::corrupt(bm, pid, "value beyond the page"))?;
        if !f(&page[off..off + len], &page[off + len..end]) {
            return Ok(false);
        }
    }
    Ok(true)
}
