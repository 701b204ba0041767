//! Page guards: how callers reach page bytes.
//!
//! * [`SharedGuard`]: a shared latch; the payload is readable as `&[u8]`.
//! * [`ExclusiveGuard`]: the exclusive latch; the payload is readable as `&[u8]` and
//!   writable through word-sized atomic stores. Dropping it bumps the version and marks the
//!   page dirty.
//! * Temporary pages (operator state) are private to their owner: they cannot be read
//!   optimistically, and their exclusive guard offers a plain `&mut [u8]`
//!   ([`ExclusiveGuard::data_mut`]).
//! * [`OptimisticGuard`]: no latch at all, only the version seen at the start; reads copy
//!   bytes out with atomic loads and must be [validated](OptimisticGuard::validate).
//!
//! # Why the optimistic API is sound
//!
//! An optimistic reader does not stop a writer, so the payload may change (or be zeroed by
//! eviction, or be overwritten by a `pread` that loads another version) while it reads.
//! Reading it through a `&[u8]` would then be a data race, undefined behaviour even if the
//! version check later throws the result away. Therefore:
//!
//! 1. Optimistic readers never get a reference to page memory. They read with
//!    `AtomicU64::load(Relaxed)` on 8-byte aligned words and copy the bytes they want out of
//!    the loaded words ([`OptimisticGuard::read`], [`OptimisticGuard::read_u64`]).
//! 2. Every store to a frame by Rust code is an `AtomicU64::store(Relaxed)` of an aligned
//!    word: [`ExclusiveGuard`]'s writers, header sealing and test backends all go through it.
//!    All accesses that can race are therefore atomic and of the same size: no data race.
//!    The kernel's stores (`pread`, `MADV_DONTNEED` zeroing) happen outside the Rust
//!    abstract machine, like DMA; readers see either old or new words, never UB.
//! 3. `&[u8]` views exist only under a shared or exclusive latch. While one exists no writer
//!    can exist (a shared latch excludes the exclusive one; an [`ExclusiveGuard`]'s `&[u8]`
//!    borrows the guard, so its own write methods, which take `&mut self`, cannot run), and
//!    the only other accesses are optimistic atomic *loads*: reads alongside reads.
//! 4. The frame's mapping is never unmapped while the buffer manager lives (eviction uses
//!    `MADV_DONTNEED`), so an optimistic load never faults; the guard borrows the manager.
//! 5. The state word's Acquire load at the start and the Acquire re-load in `validate`
//!    (paired with the writer's Release unlock) make a successful validation mean that no
//!    exclusive section overlapped the reads.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

use super::manager::BufferManager;
use super::space::Space;
use super::state::{PageState, Word, LOCKED};
use crate::error::Result;
use crate::storage::{PageId, PAGE_HEADER_SIZE};

/// An optimistic read saw a concurrent change and must be retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("optimistic read invalidated by a concurrent change; restart")]
pub struct Restart;

/// The aligned word at byte `byte` of a frame.
///
/// # Safety
/// `byte` is a multiple of 8 below the frame's size, and the frame's mapping outlives `'a`
/// (it lives as long as the buffer manager, which every guard borrows).
#[inline]
unsafe fn word_at<'a>(frame: *mut u8, byte: usize) -> &'a AtomicU64 {
    debug_assert!(byte.is_multiple_of(8));
    // SAFETY: forwarded to the caller; frames are 4 KiB aligned, so the word is aligned.
    unsafe { AtomicU64::from_ptr(frame.add(byte).cast::<u64>()) }
}

/// Copies `dst.len()` payload bytes starting at payload offset `at` out of `frame` with
/// aligned 8-byte atomic loads: a partial first word, whole words (each a fixed 8-byte store,
/// no call), a partial last word.
///
/// # Safety
/// `frame` is a mapped, 8-byte aligned frame whose payload holds `at + dst.len()` bytes
/// (every caller checks the range against the page's payload first) and that stays mapped
/// during the call.
#[allow(clippy::host_endian_bytes)] // memory order of the loaded words
unsafe fn atomic_copy_out(frame: *mut u8, at: usize, dst: &mut [u8]) {
    let start = PAGE_HEADER_SIZE + at;
    let end = start + dst.len();
    let load = |w: usize| {
        // SAFETY: every `w` passed below is 8-aligned and below `end`, which the callers bound
        // by the page size; the frame outlives the copy.
        unsafe { word_at(frame, w) }.load(Ordering::Relaxed).to_ne_bytes()
    };
    if start == end {
        return;
    }
    let mut w = start & !7;
    let mut out = 0;
    if w != start {
        let n = (w + 8).min(end) - start;
        dst[..n].copy_from_slice(&load(w)[start - w..start - w + n]);
        out = n;
        w += 8;
    }
    if w < end {
        let whole = (end - w) / 8 * 8;
        for chunk in dst[out..out + whole].chunks_exact_mut(8) {
            chunk.copy_from_slice(&load(w));
            w += 8;
        }
        out += whole;
        if w < end {
            let n = end - w;
            dst[out..out + n].copy_from_slice(&load(w)[..n]);
        }
    }
}

/// Stores `src` at payload offset `at` of `frame` with aligned 8-byte atomic stores (the
/// partial words at either end are read, spliced and stored back; only the exclusive latch
/// holder writes, so the read-modify-write cannot lose a concurrent store).
///
/// # Safety
/// As for [`atomic_copy_out`] with `src.len()`, and the caller holds the exclusive latch.
#[allow(clippy::host_endian_bytes)]
unsafe fn atomic_copy_in(frame: *mut u8, at: usize, src: &[u8]) {
    let start = PAGE_HEADER_SIZE + at;
    let end = start + src.len();
    let mut w = start & !7;
    let mut inp = 0;
    while w < end {
        let lo = start.max(w) - w;
        let hi = end.min(w + 8) - w;
        // SAFETY: w is 8-aligned and below `end`, which the callers bound by the page size.
        let cell = unsafe { word_at(frame, w) };
        let word = if lo == 0 && hi == 8 {
            u64::from_ne_bytes(src[inp..inp + 8].try_into().unwrap())
        } else {
            let mut b = cell.load(Ordering::Relaxed).to_ne_bytes();
            b[lo..hi].copy_from_slice(&src[inp..inp + hi - lo]);
            u64::from_ne_bytes(b)
        };
        cell.store(word, Ordering::Relaxed);
        inp += hi - lo;
        w += 8;
    }
}

/// Reads the payload of a latched frame as a slice.
///
/// # Safety
/// The caller holds a shared or exclusive latch on the page for `'a` and no `&mut` to the
/// same memory exists (see the module documentation, point 3).
#[inline]
unsafe fn payload<'a>(frame: *mut u8, page_size: usize) -> &'a [u8] {
    // SAFETY: forwarded to the caller; the frame is mapped and page_size bytes long.
    unsafe { std::slice::from_raw_parts(frame.add(PAGE_HEADER_SIZE), page_size - PAGE_HEADER_SIZE) }
}

/// A shared latch on a resident page. Many may coexist; no writer can.
pub struct SharedGuard<'a> {
    pub(crate) sp: &'a Space,
    pub(crate) index: u64,
    pub(crate) frame: *mut u8,
    pub(crate) _not_send: PhantomData<*const ()>,
}

impl<'a> SharedGuard<'a> {
    /// The page's id.
    #[inline]
    pub fn pid(&self) -> PageId {
        self.sp.pid(self.index)
    }
    /// The payload (the page minus its 32-byte header).
    #[inline]
    pub fn data(&self) -> &[u8] {
        // SAFETY: this guard holds a shared latch for its lifetime; no writer can exist.
        unsafe { payload(self.frame, self.sp.page_size() as usize) }
    }
    /// Payload length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.sp.page_size() as usize - PAGE_HEADER_SIZE
    }
    /// Never true: a page always has a payload.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for SharedGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.sp.state(self.index).unlock_shared();
    }
}

/// The exclusive latch on a resident page.
pub struct ExclusiveGuard<'a> {
    pub(crate) bm: &'a BufferManager,
    pub(crate) sp: &'a Space,
    pub(crate) index: u64,
    pub(crate) frame: *mut u8,
    pub(crate) _not_send: PhantomData<*const ()>,
}

impl<'a> ExclusiveGuard<'a> {
    /// The page's id.
    #[inline]
    pub fn pid(&self) -> PageId {
        self.sp.pid(self.index)
    }
    /// Payload length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.sp.page_size() as usize - PAGE_HEADER_SIZE
    }
    /// Never true: a page always has a payload.
    pub fn is_empty(&self) -> bool {
        false
    }
    /// The payload (the page minus its 32-byte header).
    #[inline]
    pub fn data(&self) -> &[u8] {
        // SAFETY: this guard holds the exclusive latch; the returned slice borrows `self`,
        // so the `&mut self` write methods cannot run while it lives.
        unsafe { payload(self.frame, self.sp.page_size() as usize) }
    }
    /// Writes `src` at payload offset `at`.
    ///
    /// # Panics
    /// If the range is outside the payload.
    pub fn write(&mut self, at: usize, src: &[u8]) {
        assert!(at.checked_add(src.len()).is_some_and(|e| e <= self.len()), "write outside the page payload");
        // SAFETY: the range was checked against the payload above; the guard's frame is
        // mapped and latched exclusively.
        unsafe { atomic_copy_in(self.frame, at, src) };
    }
    /// Writes a little-endian u64 at payload offset `at` (a multiple of 8).
    #[inline]
    pub fn write_u64(&mut self, at: usize, v: u64) {
        assert!(at.is_multiple_of(8) && at + 8 <= self.len(), "unaligned or out-of-page u64 write");
        // Store the little-endian byte image as a native word.
        #[allow(clippy::host_endian_bytes)]
        let word = u64::from_ne_bytes(v.to_le_bytes());
        // SAFETY: asserted aligned and inside the payload; the frame outlives the guard.
        unsafe { word_at(self.frame, PAGE_HEADER_SIZE + at) }.store(word, Ordering::Relaxed);
    }
    /// The payload as a mutable slice — only for temporary pages (`None` otherwise).
    ///
    /// Sound because temporary pages can never be read optimistically (the buffer manager
    /// refuses it), so while this guard holds the exclusive latch no other thread can access
    /// the frame at all: shared and exclusive latches are excluded, eviction needs the latch,
    /// and loads happen only under it.
    pub fn data_mut(&mut self) -> Option<&mut [u8]> {
        if !self.sp.temp {
            return None;
        }
        let len = self.len();
        // SAFETY: see above: the exclusive latch on a temporary page excludes every other
        // access to its frame, and the slice borrows `self` mutably.
        Some(unsafe { std::slice::from_raw_parts_mut(self.frame.add(PAGE_HEADER_SIZE), len) })
    }
    /// Zeroes the whole payload.
    pub fn zero(&mut self) {
        for w in (PAGE_HEADER_SIZE..self.sp.page_size() as usize).step_by(8) {
            // SAFETY: w steps over aligned words inside the frame; the frame outlives the guard.
            unsafe { word_at(self.frame, w) }.store(0, Ordering::Relaxed);
        }
    }
    /// Frees the page (its id becomes invalid; its disk slot is reused by its class only).
    pub fn free(self) -> Result<()> {
        let me = std::mem::ManuallyDrop::new(self);
        me.bm.free_locked(me.sp, me.index)
    }
    /// Releases the exclusive latch but keeps a shared one (the version is bumped).
    pub fn downgrade(self) -> SharedGuard<'a> {
        let me = std::mem::ManuallyDrop::new(self);
        me.note_dirty();
        me.sp.state(me.index).downgrade_modified();
        SharedGuard { sp: me.sp, index: me.index, frame: me.frame, _not_send: PhantomData }
    }
}

impl ExclusiveGuard<'_> {
    /// Enters a page that is about to become dirty into the dirty-page table.
    #[inline]
    fn note_dirty(&self) {
        if !self.sp.temp && !self.sp.state(self.index).load().dirty() {
            self.bm.note_dirty(self.pid(), None);
        }
    }

    /// Releases the latch without marking the page changed (recovery found nothing to do).
    pub(crate) fn release_unchanged(self) {
        let me = std::mem::ManuallyDrop::new(self);
        me.sp.state(me.index).unlock_exclusive_unchanged(false);
    }

    /// The LSN of the last logged change of the page.
    pub(crate) fn page_lsn(&self) -> u64 {
        // SAFETY: a guard's frame is a frame of a live space of its manager.
        unsafe { super::manager::frame_lsn(self.frame) }
    }

    /// Records a logged change: the page's LSN becomes `lsn`, and the dirty-page table
    /// learns that the log holds changes of it from `lsn` on (if it was clean).
    pub(crate) fn set_page_lsn(&mut self, lsn: u64) {
        if !self.sp.state(self.index).load().dirty() {
            self.bm.note_dirty(self.pid(), Some(lsn));
        }
        // SAFETY: a guard's frame, latched exclusively by this guard.
        unsafe { super::manager::set_frame_lsn(self.frame, lsn) };
    }
}

impl Drop for ExclusiveGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.note_dirty();
        self.sp.state(self.index).unlock_exclusive_modified();
    }
}

/// An optimistic (latch-free) view of a resident page: only a version.
pub struct OptimisticGuard<'a> {
    pub(crate) bm: &'a BufferManager,
    pub(crate) sp: &'a Space,
    pub(crate) index: u64,
    pub(crate) frame: *mut u8,
    pub(crate) seen: Word,
}

impl<'a> OptimisticGuard<'a> {
    /// The page's id.
    #[inline]
    pub fn pid(&self) -> PageId {
        self.sp.pid(self.index)
    }
    /// Payload length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.sp.page_size() as usize - PAGE_HEADER_SIZE
    }
    /// Never true.
    pub fn is_empty(&self) -> bool {
        false
    }
    #[inline]
    fn state(&self) -> &PageState {
        self.sp.state(self.index)
    }
    /// Copies payload bytes `at..at+dst.len()` into `dst`. The bytes are only meaningful if
    /// [`validate`](Self::validate) succeeds afterwards.
    pub fn read(&self, at: usize, dst: &mut [u8]) {
        assert!(at.checked_add(dst.len()).is_some_and(|e| e <= self.len()), "read outside the page payload");
        // SAFETY: the range was checked against the payload above; the guard's frame is
        // mapped while the guard lives.
        unsafe { atomic_copy_out(self.frame, at, dst) };
    }
    /// Reads the little-endian u64 at payload offset `at` (a multiple of 8). Meaningful only
    /// if [`validate`](Self::validate) succeeds afterwards.
    #[inline]
    pub fn read_u64(&self, at: usize) -> u64 {
        assert!(at.is_multiple_of(8) && at + 8 <= self.len(), "unaligned or out-of-page u64 read");
        #[allow(clippy::host_endian_bytes)]
        // SAFETY: asserted aligned and inside the payload; the frame outlives the guard.
        let bytes = unsafe { word_at(self.frame, PAGE_HEADER_SIZE + at) }.load(Ordering::Relaxed).to_ne_bytes();
        u64::from_le_bytes(bytes)
    }
    /// Whether everything read so far is consistent (no writer or eviction intervened).
    #[inline]
    pub fn validate(&self) -> bool {
        std::sync::atomic::fence(Ordering::Acquire);
        self.state().validate(self.seen)
    }
    /// [`validate`](Self::validate) as a `Result`.
    #[inline]
    pub fn check(&self) -> Result<(), Restart> {
        if self.validate() {
            Ok(())
        } else {
            Err(Restart)
        }
    }
    /// Takes the exclusive latch if nothing changed since the guard was taken.
    pub fn upgrade(self) -> Result<ExclusiveGuard<'a>, Restart> {
        let st = self.state();
        let now = st.load();
        if now.version() == self.seen.version() && now.is_unlatched() && st.try_lock_exclusive(now) {
            debug_assert_eq!(st.load().state(), LOCKED);
            return Ok(ExclusiveGuard { bm: self.bm, sp: self.sp, index: self.index, frame: self.frame, _not_send: PhantomData });
        }
        Err(Restart)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The word-wise copies give the bytes a plain copy gives, at every offset and length.
    #[test]
    fn atomic_copies_match_plain_copies() {
        let words = (PAGE_HEADER_SIZE + 64) / 8;
        let mut frame: Vec<u64> = (0..words as u64).map(|i| i.wrapping_mul(0x0101_0203_0508_0d15)).collect();
        let ptr = frame.as_mut_ptr().cast::<u8>();
        let snapshot = |frame: &Vec<u64>| frame.iter().flat_map(|w| w.to_ne_bytes()).collect::<Vec<u8>>();
        let bytes = snapshot(&frame);
        for at in 0..40 {
            for len in 0..=(64 - at) {
                let mut dst = vec![0xAAu8; len];
                // SAFETY: `frame` holds PAGE_HEADER_SIZE + 64 bytes, 8-aligned, and at + len <= 64.
                unsafe { atomic_copy_out(ptr, at, &mut dst) };
                assert_eq!(dst, bytes[PAGE_HEADER_SIZE + at..PAGE_HEADER_SIZE + at + len], "copy out of {len} at {at}");
            }
        }
        for at in 0..40 {
            for len in 0..=(64 - at) {
                let before = snapshot(&frame);
                let src: Vec<u8> = (0..len).map(|i| (i * 7 + at) as u8).collect();
                // SAFETY: as above; nothing else accesses `frame` during the call.
                unsafe { atomic_copy_in(frame.as_mut_ptr().cast::<u8>(), at, &src) };
                let mut want = before.clone();
                want[PAGE_HEADER_SIZE + at..PAGE_HEADER_SIZE + at + len].copy_from_slice(&src);
                assert_eq!(snapshot(&frame), want, "copy in of {len} at {at}");
            }
        }
    }
}
