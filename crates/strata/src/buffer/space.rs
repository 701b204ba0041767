//! A space: the pages of one size class, either persistent or temporary. Each space has its
//! own file, frame reservation, state-word reservation and allocation bitmap; the buffer
//! manager treats all spaces alike, whatever their page size.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::recycle::Uffd;
use super::region::Region;
use super::state::PageState;
use crate::storage::{ClassBitmap, PageId, StorageFile};

/// Entries of the state-word region per 4 KiB of memory.
pub(crate) const STATES_PER_OS_PAGE: u64 = 512;
/// Metadata charged per 512 pages of a space: their state words and bitmap bits.
pub(crate) const META_PER_STATE_CHUNK: u64 = 4096 + 64;

pub(crate) struct Space {
    pub class: u8,
    pub temp: bool,
    pub page_shift: u32,
    pub frames: Region,
    pub states: Region,
    /// The allocation bitmap's bits as atomic words (bit `i % 64` of word `i / 64`), kept
    /// equal to `bitmap` under its lock, read without it by a miss ([`Space::is_allocated`]).
    pub alloc_bits: Region,
    pub file: Arc<dyn StorageFile>,
    pub bitmap: Mutex<ClassBitmap>,
    /// State-word chunks (of 512 pages) charged to the budget so far.
    pub charged_chunks: AtomicU64,
    /// Bytes of this space's pages that are resident.
    pub resident_bytes: AtomicU64,
    /// Bytes of the file (from its start) whose disk space is known to be reserved, so that
    /// writing pages there cannot fail for lack of space (`u64::MAX`: the file system cannot
    /// reserve; see `BufferManager::reserve_disk`). Grows under the bitmap lock.
    pub disk_reserved: AtomicU64,
}

impl Space {
    /// A space whose frame reservation is registered with `uffd` (for frame recycling).
    pub(crate) fn new(class: u8, temp: bool, page_shift: u32, file: Arc<dyn StorageFile>, bitmap: ClassBitmap, uffd: Option<Arc<Uffd>>) -> Space {
        Space {
            class,
            temp,
            page_shift,
            frames: Region::registered(page_shift, 4 << 20, uffd),
            states: Region::new(3, 4096),
            alloc_bits: Region::new(3, 4096),
            file,
            bitmap: Mutex::new(bitmap),
            charged_chunks: AtomicU64::new(0),
            resident_bytes: AtomicU64::new(0),
            disk_reserved: AtomicU64::new(0),
        }
    }

    #[inline]
    pub(crate) fn page_size(&self) -> u64 {
        1 << self.page_shift
    }

    #[inline]
    pub(crate) fn pid(&self, index: u64) -> PageId {
        PageId::new(self.class, self.temp, index)
    }

    /// Whether `index` has a mapped state word and frame.
    #[inline]
    pub(crate) fn addressable(&self, index: u64) -> bool {
        index < self.states.limit() && index < self.frames.limit()
    }

    /// The state word of page `index` (which should be addressable: an index whose bucket
    /// is not mapped panics in [`Region::addr`], in release builds too).
    #[inline]
    pub(crate) fn state(&self, index: u64) -> &PageState {
        let p = self.states.addr(index);
        // SAFETY: `addr` returned, so `p` points into a mapped bucket of 8-byte entries
        // (8-byte aligned: buckets are page-aligned) that lasts as long as `self`. Zeroed memory is a valid PageState (EVICTED, version 0), and all
        // accesses to it are atomic.
        unsafe { &*p.cast::<PageState>() }
    }

    /// The mirror word holding page `index`'s allocation bit (addressable `index`).
    #[inline]
    fn alloc_word(&self, index: u64) -> &AtomicU64 {
        let p = self.alloc_bits.addr(index / 64);
        // SAFETY: `addr` returned, so `p` points into a mapped, page-aligned bucket of 8-byte
        // entries that lasts as long as `self`; zeroed memory is a valid AtomicU64 (nothing
        // allocated), and every access to it is atomic.
        unsafe { &*p.cast::<AtomicU64>() }
    }

    /// Whether page `index` (addressable) is allocated, without the bitmap's lock. Exact
    /// for a page whose latch the caller holds (allocation and freeing of a page change its
    /// bit before its latch is released or taken); otherwise a recent value. (The mirror is
    /// mapped for every index the manager ever made addressable on purpose; an index that
    /// is addressable only because its state bucket is larger was never allocated.)
    #[inline]
    pub(crate) fn is_allocated(&self, index: u64) -> bool {
        index / 64 < self.alloc_bits.limit() && self.alloc_word(index).load(Ordering::Acquire) & (1 << (index % 64)) != 0
    }

    /// Records page `index`'s allocation bit in the mirror; the caller holds the bitmap's
    /// lock and made `index` addressable.
    pub(crate) fn mirror_allocated(&self, index: u64, allocated: bool) {
        let bit = 1u64 << (index % 64);
        if allocated {
            self.alloc_word(index).fetch_or(bit, Ordering::Release);
        } else {
            self.alloc_word(index).fetch_and(!bit, Ordering::Release);
        }
    }

    /// Address of the frame of page `index` (which must be addressable).
    #[inline]
    pub(crate) fn frame(&self, index: u64) -> *mut u8 {
        self.frames.addr(index)
    }

    /// File offset of page `index`.
    #[inline]
    pub(crate) fn offset(&self, index: u64) -> u64 {
        index << self.page_shift
    }

    pub(crate) fn path(&self) -> PathBuf {
        self.file.path().to_owned()
    }

    pub(crate) fn resident(&self) -> u64 {
        self.resident_bytes.load(Ordering::Relaxed)
    }
}
