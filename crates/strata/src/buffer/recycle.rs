//! Frame recycling: a loaded page takes the physical memory of a page just evicted, instead
//! of the kernel zero-filling a fresh 4 KiB page at every touch of its new frame and the
//! evictor returning the victim's pages with `MADV_DONTNEED`.
//!
//! Frames live at fixed addresses (page id -> address by arithmetic), so recycling moves
//! physical pages between addresses: `UFFDIO_MOVE` (Linux 6.8+) moves the page-table
//! entries of a range of a private anonymous mapping to another address, without copying,
//! zeroing or splitting the mappings (which `mremap` would do, one VMA per moved frame, until
//! the process hits `vm.max_map_count`). The destination must be registered with the
//! userfaultfd; every frame reservation is registered in write-protect mode only, which
//! changes nothing else about it (a fault on a missing page is still served by the kernel
//! as usual; nothing is ever write-protected).
//!
//! The hand-over goes through a **stash** per size class: a small reservation of frame
//! slots whose physical pages are *charged to the budget* while they sit there. An evictor
//! that works for a load of class `c` moves its class-`c` victims' frames into the stash
//! instead of discarding them; a load of class `c` moves a stashed frame into its page's
//! frame and reads over it. Any other reservation that finds the pool full first drains the
//! stashes (returning their memory with `MADV_DONTNEED` and its bytes to the budget), so
//! stashed frames never stand in the way of other memory: the cap still holds at every
//! instant, since stashed bytes are counted in `used` as long as they are stashed.
//!
//! Measured on the development VM (tools' micro-benchmark, 64 KiB O_DIRECT reads, CPU of
//! the loading thread per miss): discard + fault-in 43-62 us, recycle through the stash
//! (two moves) 25-45 us, no discard at all 19-32 us; at 4 KiB the three are within noise.
//!
//! Where the kernel lacks `userfaultfd`, `UFFD_FEATURE_MOVE` or the registration (older
//! kernels, seccomp, other architectures), recycling is off and eviction discards as before;
//! [`Recycler::mechanism`] says which (reported in the statistics).
//!
//! Racing optimistic readers: a reader that still holds the old address of a moved frame
//! reads an unpopulated range (the kernel maps its zero page) and fails validation, exactly
//! as after `MADV_DONTNEED`. Such a read leaves the zero page mapped at the old address,
//! which a later move into that address finds (`EEXIST`): the move then discards the
//! destination first and retries.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::region::{Discard, Region};
use super::slots::SlotStack;

const UFFD_API: u64 = 0xAA;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFD_FEATURE_MOVE: u64 = 1 << 16;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFDIO_MOVE_MODE_DONTWAKE: u64 = 1 << 0;
const UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES: u64 = 1 << 1;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}
#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
struct UffdioMove {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}

/// `_IOWR(0xAA, nr, size)`.
const fn uffd_ioctl(nr: u64, size: usize) -> u64 {
    (3 << 30) | ((size as u64) << 16) | (UFFD_API << 8) | nr
}
const UFFDIO_API: u64 = uffd_ioctl(0x3F, std::mem::size_of::<UffdioApi>());
const UFFDIO_REGISTER: u64 = uffd_ioctl(0x00, std::mem::size_of::<UffdioRegister>());
const UFFDIO_MOVE: u64 = uffd_ioctl(0x05, std::mem::size_of::<UffdioMove>());

/// A userfaultfd that can move pages (`UFFD_FEATURE_MOVE`).
pub(crate) struct Uffd {
    fd: OwnedFd,
}

impl Uffd {
    /// Opens one, or says why not.
    fn open() -> Result<Uffd, String> {
        // SAFETY: a plain system call with flag arguments; it returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK | UFFD_USER_MODE_ONLY) };
        if fd < 0 {
            return Err(format!("userfaultfd: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a descriptor the call above just opened and nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        let mut api = UffdioApi { api: UFFD_API, features: UFFD_FEATURE_MOVE, ioctls: 0 };
        // SAFETY: UFFDIO_API reads and writes a `struct uffdio_api`, which `api` is (repr(C),
        // same layout), valid for the call.
        if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) } != 0 {
            return Err(format!("userfaultfd without UFFD_FEATURE_MOVE (Linux 6.8+): {}", std::io::Error::last_os_error()));
        }
        Ok(Uffd { fd })
    }

    /// Registers the mapping `addr..addr+len` (write-protect mode only, see the module
    /// documentation) so that frames can be moved into it.
    pub(crate) fn register(&self, addr: *mut u8, len: usize) -> std::io::Result<()> {
        let mut reg = UffdioRegister { range: UffdioRange { start: addr as u64, len: len as u64 }, mode: UFFDIO_REGISTER_MODE_WP, ioctls: 0 };
        // SAFETY: UFFDIO_REGISTER reads and writes a `struct uffdio_register`, which `reg` is;
        // the range is a mapping the caller owns, and registering it changes no memory.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_REGISTER as _, &mut reg) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Moves the physical pages of `src..src+len` to `dst..dst+len` (holes in the source
    /// stay holes). On an error some prefix may have moved.
    ///
    /// # Safety
    /// Both ranges lie in private anonymous mappings of this process that stay mapped for
    /// the call; the caller owns both (no other thread writes them; racing optimistic
    /// readers of `src` only load, and read zeros or the old bytes).
    unsafe fn move_pages(&self, dst: *mut u8, src: *mut u8, len: usize) -> std::io::Result<()> {
        let mut done = 0usize;
        let mut tries = 0;
        while done < len {
            let mut mv = UffdioMove {
                dst: dst as u64 + done as u64,
                src: src as u64 + done as u64,
                len: (len - done) as u64,
                mode: UFFDIO_MOVE_MODE_DONTWAKE | UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES,
                moved: 0,
            };
            // SAFETY: UFFDIO_MOVE reads and writes a `struct uffdio_move`, which `mv` is; by
            // the contract both ranges are private anonymous memory the caller owns.
            let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_MOVE as _, &mut mv) };
            if r == 0 {
                return Ok(());
            }
            let err = std::io::Error::last_os_error();
            if mv.moved > 0 {
                done += mv.moved as usize;
            }
            tries += 1;
            // EAGAIN: a page was busy (its lock contended). EBUSY: the folio had a passing
            // extra reference (a large folio the kernel must split first, still held in a
            // per-CPU LRU batch, seen about once in 100 runs of the recycle test under load).
            // Both pass: the rest is retried a few times, yielding before an EBUSY retry.
            match err.raw_os_error() {
                Some(libc::EAGAIN) if tries <= 8 => {}
                Some(libc::EBUSY) if tries <= 8 => std::thread::yield_now(),
                _ => return Err(err),
            }
        }
        Ok(())
    }
}

/// The frames stashed for one size class.
struct Stash {
    page_size: usize,
    slots: Region,
    full: SlotStack,
    empty: SlotStack,
}

/// What [`Recycler::take`] did.
pub(crate) enum Taken {
    /// The frame now holds a stashed frame's memory, whose bytes (already charged) belong
    /// to the page now.
    Frame,
    /// Nothing taken; `release` bytes of a stashed frame that could not be moved were
    /// returned to the OS and must be released from the budget.
    Nothing { release: u64 },
}

/// The stashes of every size class and the userfaultfd that moves frames.
pub(crate) struct Recycler {
    uffd: Option<Arc<Uffd>>,
    /// Pages smaller than this are not recycled.
    min_page: u64,
    why_off: String,
    stashes: Box<[OnceLock<Option<Stash>>]>,
    /// Bytes each class's stash may hold.
    stash_bytes: u64,
    /// Bytes in all stashes now (charged to the budget).
    bytes: AtomicU64,
    /// Frames moved into a page being loaded / into a stash / failed moves.
    pub(crate) recycled: AtomicU64,
    pub(crate) stashed: AtomicU64,
    pub(crate) failed: AtomicU64,
}

impl Recycler {
    /// A recycler for `classes` size classes and a pool of `pool` bytes; `enabled: false`
    /// (or a kernel without the mechanism) gives one that never recycles.
    pub(crate) fn new(min_page: Option<u64>, classes: usize, pool: u64) -> Recycler {
        let (uffd, why_off) = if min_page.is_none() {
            (None, "off (configured)".to_string())
        } else {
            match Uffd::open() {
                Ok(u) => (Some(Arc::new(u)), String::new()),
                Err(why) => (None, format!("off ({why})")),
            }
        };
        Recycler {
            uffd,
            min_page: min_page.unwrap_or(u64::MAX),
            why_off,
            stashes: (0..classes).map(|_| OnceLock::new()).collect(),
            stash_bytes: (pool / 16).max(1),
            bytes: AtomicU64::new(0),
            recycled: AtomicU64::new(0),
            stashed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    /// The userfaultfd that the frame reservation of a space of `1 << page_shift`-byte
    /// pages registers with (`None`: that size is not recycled).
    pub(crate) fn uffd_for(&self, page_shift: u32) -> Option<&Arc<Uffd>> {
        self.uffd.as_ref().filter(|_| 1u64 << page_shift >= self.min_page)
    }

    /// How frames are recycled: `"uffd-move (pages of at least N KiB)"`, or `"off (why)"`.
    pub(crate) fn mechanism(&self) -> String {
        if self.uffd.is_some() {
            if self.min_page <= 4096 {
                "uffd-move".into()
            } else {
                format!("uffd-move (pages of at least {})", crate::util::Bytes(self.min_page))
            }
        } else {
            self.why_off.clone()
        }
    }

    /// Bytes stashed now (charged to the budget, not resident pages).
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }

    /// The stash of `class` (pages of `1 << page_shift` bytes), made on first use; `None`
    /// when recycling is off or its reservation could not be made.
    fn stash(&self, class: u8, page_shift: u32) -> Option<&Stash> {
        let uffd = self.uffd_for(page_shift)?;
        self.stashes[class as usize]
            .get_or_init(|| {
                let page_size = 1usize << page_shift;
                let n = (self.stash_bytes >> page_shift).clamp(1, 4096) as usize;
                let slots = Region::registered(page_shift, (n * page_size) as u64, Some(uffd.clone()));
                slots.ensure(n as u64 - 1).ok()?;
                Some(Stash { page_size, slots, full: SlotStack::new(n), empty: SlotStack::full(n) })
            })
            .as_ref()
    }

    /// Moves the frame at `frame` (a page of `class`, `1 << page_shift` bytes, latched
    /// exclusively by the caller and about to be evicted) into the class's stash. True if it
    /// was moved: its bytes stay charged and now count as stashed. False (stash full, off,
    /// or the move failed): the caller discards the frame as usual.
    ///
    /// # Safety
    /// `frame` is the frame of a page of a live space whose reservation is registered with
    /// this recycler's userfaultfd, latched exclusively by the caller.
    pub(crate) unsafe fn put(&self, class: u8, page_shift: u32, frame: *mut u8) -> bool {
        let Some(stash) = self.stash(class, page_shift) else { return false };
        let Some(slot) = stash.empty.pop() else { return false };
        let dst = stash.slots.addr(slot as u64);
        // SAFETY: `dst` is a slot popped from the empty stack, so this thread owns it, in the
        // stash's registered private anonymous reservation; `frame` is owned by the caller
        // (exclusive latch) and lies in a registered private anonymous reservation too.
        match unsafe { self.uffd.as_ref().expect("stash implies uffd").move_pages(dst, frame, stash.page_size) } {
            Ok(()) => {
                self.bytes.fetch_add(stash.page_size as u64, Ordering::AcqRel);
                stash.full.push(slot);
                self.stashed.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(_) => {
                // Whatever moved goes back to the OS; the slot is empty again. The caller
                // discards the frame (and so whatever did not move).
                stash.slots.discard(slot as u64, 1);
                stash.empty.push(slot);
                self.failed.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Moves a stashed frame of `class` into `frame`, the empty frame of a page being
    /// loaded (latched exclusively by the caller), whose bytes are then those of the stashed
    /// frame.
    ///
    /// # Safety
    /// As for [`put`](Self::put), for the page being loaded.
    pub(crate) unsafe fn take(&self, class: u8, page_shift: u32, frame: *mut u8, frames: &Region, index: u64) -> Taken {
        let Some(stash) = self.stashes.get(class as usize).and_then(|s| s.get()).and_then(|s| s.as_ref()) else {
            return Taken::Nothing { release: 0 };
        };
        debug_assert_eq!(stash.page_size, 1 << page_shift);
        let Some(slot) = stash.full.pop() else { return Taken::Nothing { release: 0 } };
        let src = stash.slots.addr(slot as u64);
        let uffd = self.uffd.as_ref().expect("stash implies uffd");
        // SAFETY: `src` is a slot popped from the full stack (owned by this thread); `frame`
        // is owned by the caller (exclusive latch); both in registered private anonymous
        // reservations.
        let mut moved = unsafe { uffd.move_pages(frame, src, stash.page_size) };
        if matches!(&moved, Err(e) if e.raw_os_error() == Some(libc::EEXIST)) {
            // A racing optimistic reader of the page's earlier life mapped the zero page
            // there (see the module documentation): clear the frame and move again.
            frames.discard(index, 1);
            // SAFETY: as above.
            moved = unsafe { uffd.move_pages(frame, src, stash.page_size) };
        }
        let size = stash.page_size as u64;
        self.bytes.fetch_sub(size, Ordering::AcqRel);
        match moved {
            Ok(()) => {
                stash.empty.push(slot);
                self.recycled.fetch_add(1, Ordering::Relaxed);
                Taken::Frame
            }
            Err(_) => {
                // Give back both (whatever moved into the frame is overwritten or discarded
                // by the caller's load): the caller reserves fresh memory instead.
                stash.slots.discard(slot as u64, 1);
                frames.discard(index, 1);
                stash.empty.push(slot);
                self.failed.fetch_add(1, Ordering::Relaxed);
                Taken::Nothing { release: size }
            }
        }
    }

    /// Returns stashed frames of every class but `keep` to the OS until at least `need`
    /// bytes were returned or the stashes are empty; returns the bytes, which the caller
    /// releases from the budget.
    pub(crate) fn drain(&self, need: u64, keep: Option<u8>) -> u64 {
        if self.bytes() == 0 {
            return 0;
        }
        let mut batch = Discard::default();
        let mut slots = Vec::new();
        let mut drained = 0;
        for (class, stash) in self.stashes.iter().enumerate() {
            let Some(Some(stash)) = stash.get() else { continue };
            if keep == Some(class as u8) {
                continue;
            }
            while drained < need {
                let Some(slot) = stash.full.pop() else { break };
                stash.slots.discard_later(slot as u64, 1, &mut batch);
                slots.push((stash, slot));
                drained += stash.page_size as u64;
            }
        }
        batch.run();
        for (stash, slot) in slots {
            stash.empty.push(slot);
        }
        self.bytes.fetch_sub(drained, Ordering::AcqRel);
        drained
    }
}
