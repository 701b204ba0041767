//! Spaces and page allocation: finding a page id's space, growing its reservations,
//! allocating (persistent, temporary, logged) and freeing pages.

use std::sync::atomic::Ordering;

use super::budget::Backoff;
use super::guard::ExclusiveGuard;
use super::manager::{set_frame_lsn, BufferManager};
use super::space::{Space, META_PER_STATE_CHUNK, STATES_PER_OS_PAGE};
use super::state::EVICTED;
use crate::error::{Error, Result};
use crate::storage::backend::OpenMode;
use crate::storage::layout::{class_file, temp_file};
use crate::storage::{ClassBitmap, PageId, PAGE_HEADER_SIZE};

/// The largest step by which a data file's reserved disk space grows.
pub(crate) const MAX_RESERVE_STEP: u64 = 64 << 20;

impl BufferManager {
    pub(super) fn space_or_create(&self, class: u8, temp: bool, bitmap: Option<ClassBitmap>) -> Result<&Space> {
        let slot = &self.spaces[class as usize * 2 + temp as usize];
        if let Some(sp) = slot.get() {
            return Ok(sp);
        }
        let _g = self.space_init.lock();
        if let Some(sp) = slot.get() {
            return Ok(sp);
        }
        if temp {
            self.refuse_if_read_only("using temporary pages")?;
        }
        let path = if temp { temp_file(&self.dir, class) } else { class_file(&self.dir, class) };
        let file = self.backend.open(&path, OpenMode::Direct, true).map_err(|e| Error::io("open", &path, e))?;
        let sp = Space::new(
            class,
            temp,
            self.classes.page_shift(class),
            file,
            bitmap.unwrap_or_default(),
            self.recycler.uffd_for(self.classes.page_shift(class)).cloned(),
        );
        Ok(slot.get_or_init(|| sp))
    }

    /// The space of `pid` if its index is addressable (the hit path's lookup: no error is
    /// built).
    #[inline]
    pub(super) fn addressable_space(&self, pid: PageId) -> Option<&Space> {
        self.spaces.get(pid.space()).and_then(|s| s.get()).filter(|sp| sp.addressable(pid.index()))
    }

    /// The space of `pid` and check that its index is addressable.
    #[inline]
    pub(super) fn lookup(&self, pid: PageId) -> Result<&Space> {
        if let Some(sp) = self.addressable_space(pid) {
            return Ok(sp);
        }
        Err(self.lookup_error(pid))
    }

    /// Why `pid` has no addressable space.
    #[cold]
    fn lookup_error(&self, pid: PageId) -> Error {
        match self.spaces.get(pid.space()).and_then(|s| s.get()) {
            None => Error::InvalidPageId { pid, reason: "no page of this size class was ever allocated" },
            Some(_) => Error::InvalidPageId { pid, reason: "index beyond any allocated page" },
        }
    }

    pub(super) fn ensure_addressable(&self, sp: &Space, index: u64) -> Result<()> {
        let chunks = index / STATES_PER_OS_PAGE + 1;
        let charged = sp.charged_chunks.load(Ordering::Acquire);
        if chunks > charged {
            // Charge the metadata before touching it; only one thread grows a space at a
            // time (callers hold the space's bitmap lock or are in `open`).
            self.charge_metadata((chunks - charged) * META_PER_STATE_CHUNK)?;
            sp.charged_chunks.store(chunks, Ordering::Release);
        }
        sp.alloc_bits.ensure(index / 64)?;
        sp.states.ensure(index)?;
        sp.frames.ensure(index)
    }

    /// Makes sure the disk space of page `index` of `sp` is reserved in its file (the
    /// caller holds the space's bitmap lock), reserving ahead in steps of an eighth of the
    /// file (at least a page, at most [`MAX_RESERVE_STEP`]). A full disk is thus met when a
    /// page is allocated (an error for the writer, whose transaction rolls back), never
    /// when a committed page is written back: not at eviction, not at a checkpoint, and not
    /// in recovery, which a full disk could otherwise keep from ever finishing. File systems
    /// that cannot reserve (or copy-on-write ones, where it means little) are written
    /// sparsely, as before.
    pub(super) fn reserve_disk(&self, sp: &Space, index: u64) -> Result<()> {
        let end = sp.offset(index) + sp.page_size();
        let from = sp.disk_reserved.load(Ordering::Relaxed);
        if end <= from {
            return Ok(());
        }
        let step = (end / 8).clamp(sp.page_size(), MAX_RESERVE_STEP.max(sp.page_size()));
        let to = (end - 1 + step).next_multiple_of(sp.page_size());
        match sp.file.reserve(from, to - from) {
            Ok(()) => {
                sp.disk_reserved.store(to, Ordering::Relaxed);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                sp.disk_reserved.store(u64::MAX, Ordering::Relaxed);
                Ok(())
            }
            // Less than the step may still be there: the page itself is what must fit.
            Err(_) if sp.file.reserve(from, end - from).is_ok() => {
                sp.disk_reserved.store(end, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(Error::io("reserve disk space in", sp.path(), e)),
        }
    }

    /// For recovery and rollback: marks `pid` allocated (creating its space and making it
    /// addressable as needed). Returns false if it already was.
    pub(crate) fn set_allocated(&self, pid: PageId) -> Result<bool> {
        let sp = self.space_or_create(pid.class(), pid.is_temp(), None)?;
        let mut bm = sp.bitmap.lock();
        self.ensure_addressable(sp, pid.index())?;
        sp.mirror_allocated(pid.index(), true);
        Ok(bm.set_allocated(pid.index()))
    }

    /// Allocates a persistent page whose payload holds at least `bytes` bytes (the smallest
    /// class that fits). Returns it zeroed and exclusively latched.
    pub fn alloc(&self, bytes: usize) -> Result<ExclusiveGuard<'_>> {
        self.alloc_in(bytes, false)
    }

    /// Allocates a temporary page (same budget; written to a scratch file if evicted; gone
    /// after [`free`](Self::free) or restart).
    pub fn alloc_temp(&self, bytes: usize) -> Result<ExclusiveGuard<'_>> {
        self.alloc_in(bytes, true)
    }

    fn alloc_in(&self, bytes: usize, temp: bool) -> Result<ExclusiveGuard<'_>> {
        self.alloc_with(bytes, temp, None).map(|(g, _)| g)
    }

    /// Allocates a persistent page and logs it: `log` is called with the new id while the
    /// class's bitmap is locked (so a checkpoint's copy of the bitmap never holds an
    /// allocation whose record is not in the log) and returns the record's LSN, which
    /// becomes the page's LSN. Nothing is allocated if `log` fails. [`is_allocated`]
    /// reports the page only after `log` returned (transactions lock the new page in `log`
    /// and rely on this: see `txn::lock`).
    ///
    /// [`is_allocated`]: Self::is_allocated
    pub(crate) fn alloc_logged(&self, bytes: usize, log: &dyn Fn(PageId) -> Result<u64>) -> Result<(ExclusiveGuard<'_>, u64)> {
        self.alloc_with(bytes, false, Some(log))
    }

    fn alloc_with(&self, bytes: usize, temp: bool, log: Option<&dyn Fn(PageId) -> Result<u64>>) -> Result<(ExclusiveGuard<'_>, u64)> {
        self.refuse_if_read_only("allocating pages")?;
        let class = (bytes as u64)
            .checked_add(PAGE_HEADER_SIZE as u64)
            .and_then(|total| self.classes.class_for(total))
            .ok_or_else(|| Error::InvalidInput(format!("page of {bytes} bytes is larger than the largest size class")))?;
        let size = self.classes.page_size(class);
        let pool = self.pool_size();
        if size + self.metadata.load(Ordering::Relaxed) > pool {
            return Err(Error::PoolTooSmall { needed: size + self.metadata.load(Ordering::Relaxed), pool });
        }
        let sp = self.space_or_create(class, temp, None)?;
        // Memory first: once the allocation is logged, it must not fail any more.
        self.reserve(size)?;
        let (index, lsn) = {
            let mut bm = sp.bitmap.lock();
            let index = bm.alloc();
            let fail = |bm: &mut ClassBitmap, e: Error| {
                bm.free(index);
                self.release(size);
                Err(e)
            };
            if index > PageId::MAX_INDEX {
                return fail(&mut bm, Error::InvalidInput("size class is out of page ids".into()));
            }
            if let Err(e) = self.ensure_addressable(sp, index) {
                return fail(&mut bm, e);
            }
            if !temp {
                if let Err(e) = self.reserve_disk(sp, index) {
                    return fail(&mut bm, e);
                }
            }
            let lsn = match log.map(|f| f(sp.pid(index))) {
                None => 0,
                Some(Ok(lsn)) => lsn,
                Some(Err(e)) => return fail(&mut bm, e),
            };
            sp.mirror_allocated(index, true);
            (index, lsn)
        };
        let st = sp.state(index);
        let mut backoff = Backoff(0);
        let mut g = loop {
            let w = st.load();
            if w.state() == EVICTED && st.try_lock_evicted(w) {
                // An EVICTED frame is unbacked, hence zero: nothing to clear.
                sp.resident_bytes.fetch_add(size, Ordering::Relaxed);
                self.resident.insert(sp.pid(index));
                break ExclusiveGuard { bm: self, sp, index, frame: sp.frame(index), _not_send: Default::default() };
            }
            if w.is_unlatched() && st.try_lock_exclusive(w) {
                // A stray fix (of an id not yet handed out) loaded the slot's old bytes; the
                // page is resident and counted already.
                self.release(size);
                let mut g = ExclusiveGuard { bm: self, sp, index, frame: sp.frame(index), _not_send: Default::default() };
                g.zero();
                // SAFETY: the guard's frame, latched exclusively.
                unsafe { set_frame_lsn(g.frame, 0) };
                break g;
            }
            backoff.snooze();
        };
        if lsn > 0 {
            g.set_page_lsn(lsn);
        }
        Ok((g, lsn))
    }

    /// Frees `pid`. Waits for other latches on it to be released; the caller must not hold
    /// one (use [`ExclusiveGuard::free`] to free a page you have latched).
    pub fn free(&self, pid: PageId) -> Result<()> {
        self.refuse_if_read_only("freeing pages")?;
        let sp = self.lookup(pid)?;
        let index = pid.index();
        let st = sp.state(index);
        let mut backoff = Backoff(0);
        loop {
            let w = st.load();
            let got = match w.state() {
                EVICTED => st.try_lock_evicted(w),
                _ if w.is_unlatched() => st.try_lock_exclusive(w),
                _ => false,
            };
            if got {
                break;
            }
            backoff.snooze();
        }
        self.free_locked(sp, index)
    }

    /// Frees a page whose exclusive latch the caller holds (resident or not).
    pub(crate) fn free_locked(&self, sp: &Space, index: u64) -> Result<()> {
        let st = sp.state(index);
        let pid = sp.pid(index);

        let resident = self.resident.remove(pid);
        let mut bm = sp.bitmap.lock();
        if !bm.free(index) {
            drop(bm);
            debug_assert!(!resident);
            st.unlock_still_evicted();
            return Err(Error::InvalidPageId { pid, reason: "double free: page is not allocated" });
        }
        sp.mirror_allocated(index, false);
        drop(bm);
        self.durability.page_clean(pid);
        self.forget_remote(pid);
        if resident {
            sp.frames.discard(index, 1);
            sp.resident_bytes.fetch_sub(sp.page_size(), Ordering::Relaxed);
            self.release(sp.page_size());
        }
        st.unlock_evicted();
        Ok(())
    }

    /// Whether `pid` is currently allocated.
    pub fn is_allocated(&self, pid: PageId) -> bool {
        self.lookup(pid).is_ok_and(|sp| sp.is_allocated(pid.index()))
    }
}
