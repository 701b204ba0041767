//! The memory budget: reservations that never let resident bytes exceed the cap, metadata
//! charges, and changing the cap.
//!
//! `used` counts resident page bytes plus metadata and is only ever increased by a
//! compare-and-swap that keeps it `<= pool`: the cap holds at every instant, whatever the
//! interleaving. Physical memory is touched only after the bytes were reserved. A
//! reservation that finds the pool full runs the clock ([`super::evict`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::manager::BufferManager;
use super::recycle::Taken;
use super::resident::ResidentSet;
use super::space::Space;
use crate::error::{Error, Result};
use crate::storage::SizeClasses;

/// The `used` word packs two fields: the bytes counted against the cap (its low `USED_BITS`
/// bits, see [`BufferManager::used_bytes`]) and a shrink generation (the high bits), which
/// every [`BufferManager::set_pool_size`] that lowers the cap bumps after storing the new
/// cap. A reservation compare-and-swaps the whole word, so one that read the cap before a
/// shrink fails (the word changed) and retries under the new cap. Without the generation,
/// a reservation that read the old cap could still succeed after the shrink had seen `used`
/// below the new cap and returned, leaving `used` above the cap it had just set.
const USED_BITS: u32 = 52;
/// Mask of the byte count in the `used` word (4 PiB; reservations never carry past it).
pub(super) const USED_MASK: u64 = (1 << USED_BITS) - 1;
/// One step of the shrink generation in the `used` word (it wraps, which is harmless: a
/// reservation would have to sleep between its load and its CAS through 4096 shrinks).
const SHRINK_GENERATION: u64 = 1 << USED_BITS;

/// Spin, then yield, then sleep: for waits on latches held by others.
pub(super) struct Backoff(pub(super) u32);

impl Backoff {
    pub(super) fn snooze(&mut self) {
        self.0 += 1;
        if self.0 < 16 {
            crate::sync::spin_hint();
        } else if self.0 < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// The number of resident-set partitions for a pool of `pool` bytes: `configured` if it is a
/// power of two of at most [`super::resident::MAX_PARTITIONS`], else an error; by default
/// [`ResidentSet::default_partitions`].
pub(super) fn clock_partitions(classes: SizeClasses, pool: u64, configured: Option<usize>) -> Result<usize> {
    match configured {
        None => Ok(ResidentSet::default_partitions(pool / classes.min_page())),
        Some(n) if n.is_power_of_two() && n <= super::resident::MAX_PARTITIONS => Ok(n),
        Some(n) => Err(Error::InvalidConfig(format!("clock partitions must be a power of two from 1 to {}, not {n}", super::resident::MAX_PARTITIONS))),
    }
}

/// Checks that a pool of `pool` bytes holds the resident set (of `partitions` partitions)
/// plus one smallest page; returns the resident set's size.
pub(super) fn check_pool(classes: SizeClasses, pool: u64, partitions: usize) -> Result<u64> {
    let rs_bytes = ResidentSet::memory_bytes_for(pool / classes.min_page(), partitions);
    let needed = rs_bytes.saturating_add(classes.min_page());
    if needed > pool {
        return Err(Error::PoolTooSmall { needed, pool });
    }
    Ok(rs_bytes)
}

pub(super) fn resident_set_too_big(pool: u64, rs_bytes: u64) -> Error {
    Error::InvalidConfig(format!(
        "a pool of {} needs a resident-page table of {}, which cannot be allocated; choose a smaller pool",
        crate::util::Bytes(pool),
        crate::util::Bytes(rs_bytes)
    ))
}

impl BufferManager {
    pub(super) fn charge_metadata(&self, bytes: u64) -> Result<()> {
        self.reserve(bytes)?;
        self.metadata.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Reserves `bytes` in the budget, evicting as needed; never lets `used` exceed the cap.
    pub(super) fn reserve(&self, bytes: u64) -> Result<()> {
        self.reserve_within(bytes, self.pin_wait, None)
    }

    /// Like `reserve`, but gives up at once when nothing is evictable (for prefetches,
    /// which must never wait for pinned pages).
    pub(super) fn try_reserve(&self, bytes: u64) -> Result<()> {
        self.reserve_within(bytes, Duration::ZERO, None)
    }

    /// Reserves the memory of page `index` of `sp`, which the caller latched for a load:
    /// a frame of its class from the recycler's stash if there is one (moved into the
    /// page's frame, its bytes already charged), else fresh bytes; an eviction it runs
    /// stashes the victims of the page's class for it (see [`super::recycle`]).
    pub(super) fn reserve_frame(&self, sp: &Space, index: u64) -> Result<()> {
        let frame = self.recycler.uffd_for(sp.page_shift).is_some().then_some((sp, index));
        self.reserve_within(sp.page_size(), self.pin_wait, frame)
    }

    /// Reserves the memory of pages `first..first + n` of `sp`, latched by a prefetch
    /// (`EVICTED -> LOCKED`), like [`reserve_frame`](Self::reserve_frame) does for a load:
    /// each frame takes a stashed frame of its class where there is one, and an eviction it
    /// runs stashes the victims of that class for it. Without waiting, as
    /// [`try_reserve`](Self::try_reserve): on failure nothing stays reserved and the frames
    /// are empty again. (Reserving the bytes alone would both skip the stash and drain it,
    /// so every prefetched page would be faulted into fresh zeroed memory and the next
    /// load's recycled frame given back to the kernel.)
    pub(super) fn try_reserve_frames(&self, sp: &Space, first: u64, n: u64) -> Result<()> {
        let size = sp.page_size();
        if self.recycler.uffd_for(sp.page_shift).is_none() {
            return self.try_reserve(n * size);
        }
        for k in 0..n {
            if let Err(e) = self.reserve_within(size, Duration::ZERO, Some((sp, first + k))) {
                // Frames that took a stashed frame hold its memory: give it back with them.
                if k > 0 {
                    sp.frames.discard(first, k);
                    self.release(k * size);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    fn reserve_within(&self, bytes: u64, wait: Duration, frame: Option<(&Space, u64)>) -> Result<()> {
        let start = Instant::now();
        let mut backoff = Backoff(0);
        let class = frame.map(|(sp, _)| sp.class);
        let mut waited = false;
        loop {
            if let Some((sp, index)) = frame {
                // SAFETY: the frame of page `index` of `sp`, a live space whose frames are
                // registered with the recycler's userfaultfd; the caller holds its exclusive
                // latch (taken `EVICTED -> LOCKED`), so its frame is ours and unpopulated.
                match unsafe { self.recycler.take(sp.class, sp.page_shift, sp.frame(index), &sp.frames, index) } {
                    Taken::Frame => return Ok(()),
                    Taken::Nothing { release } if release > 0 => self.release(release),
                    Taken::Nothing { .. } => {}
                }
            }
            // Acquire: a word that carries a shrink's generation bump makes the cap stored
            // before that bump visible to the load below (see `USED_BITS`).
            let word = self.used.load(Ordering::Acquire);
            let used = word & USED_MASK;
            // Clamped so that `used + bytes` never carries into the generation.
            let limit = self.pool.load(Ordering::Relaxed).min(USED_MASK);
            if used + bytes <= limit {
                if self.used.compare_exchange_weak(word, word + bytes, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    self.peak.fetch_max(used + bytes, Ordering::Relaxed);
                    return Ok(());
                }
                continue;
            }
            let meta = self.metadata.load(Ordering::Relaxed);
            if bytes + meta > limit {
                return Err(Error::PoolTooSmall { needed: bytes + meta, pool: limit });
            }
            // Evict at least 1/64 of the pool at a time: dirty victims are written (and their
            // double write fsynced) as one batch, so one page per miss would cost two fsyncs
            // per page.
            let need = (used + bytes - limit).max(limit / 64);
            // Stashed frames are free memory: give them back before evicting pages (all but
            // those of the class this load can take).
            let drained = self.recycler.drain(need, class) + self.rings.drain();
            if drained > 0 {
                self.release(drained);
                backoff = Backoff(0);
                continue;
            }
            let freed = self.evict(need, class)?;
            if freed > 0 {
                backoff = Backoff(0);
                continue;
            }
            if !waited {
                waited = true;
                self.counters.reservation_waits.add(1);
            }
            if self.evictors.load(Ordering::Acquire) > 0 {
                // Another thread holds victims it is about to free.
                std::thread::yield_now();
                continue;
            }
            if start.elapsed() >= wait {
                // An evictor that finished between our read of `used` and our look at
                // `evictors` may have freed enough: look once more before giving up.
                if self.used_bytes() + bytes <= self.pool.load(Ordering::Relaxed).min(USED_MASK) {
                    continue;
                }
                let used = self.used_bytes();
                return Err(Error::OutOfMemory {
                    requested: bytes,
                    used,
                    limit,
                    pinned: used.saturating_sub(self.metadata.load(Ordering::Relaxed)),
                    waited_ms: start.elapsed().as_millis() as u64,
                });
            }
            backoff.snooze();
        }
    }

    pub(super) fn release(&self, bytes: u64) {
        let prev = self.used.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(prev & USED_MASK >= bytes);
    }

    /// Changes the cap. Growing is immediate; shrinking evicts down to the new cap (waiting
    /// a bounded time for pinned pages, else the old cap is restored and OutOfMemory returned).
    pub fn set_pool_size(&self, bytes: u64) -> Result<()> {
        // A cap that cannot hold the metadata plus one page can never be met, however much
        // is evicted: refuse it up front, changing nothing.
        let needed = self.metadata.load(Ordering::Relaxed).saturating_add(self.classes.min_page());
        if bytes < needed {
            return Err(Error::PoolTooSmall { needed, pool: bytes });
        }
        let old = self.pool.swap(bytes, Ordering::AcqRel);
        if bytes < old {
            // Reservations that read the old cap and have not completed must fail their
            // compare-and-swap: change the word they compare against. Every reservation
            // that did complete is then included in the `used` read below.
            self.used.fetch_add(SHRINK_GENERATION, Ordering::AcqRel);
        }
        let max_pages = bytes / self.classes.min_page();
        // The resident set must have room for every page the new pool can hold. It grows in
        // place (new segments, then a larger mask: see `super::resident`), so loads and
        // evictions go on meanwhile without taking any lock; only growers are serialised.
        let rs = &self.resident;
        let lock = rs.grow_lock();
        let extra = rs.grow_bytes(max_pages);
        if extra > 0 {
            // A table larger than the budget can count (or than the new pool minus the
            // metadata) cannot be allocated anyway: a configuration error, as at open.
            if extra.saturating_add(self.metadata.load(Ordering::Relaxed)) > bytes.min(USED_MASK) {
                self.pool.store(old, Ordering::Release);
                return Err(resident_set_too_big(bytes, ResidentSet::memory_bytes_for(max_pages, rs.partitions())));
            }
            if let Err(e) = self.charge_metadata(extra) {
                self.pool.store(old, Ordering::Release);
                return Err(e);
            }
            if !rs.grow(&lock, max_pages) {
                self.metadata.fetch_sub(extra, Ordering::Relaxed);
                self.release(extra);
                self.pool.store(old, Ordering::Release);
                return Err(resident_set_too_big(bytes, ResidentSet::memory_bytes_for(max_pages, rs.partitions())));
            }
        }
        drop(lock);
        let start = Instant::now();
        let mut backoff = Backoff(0);
        loop {
            let used = self.used_bytes();
            if used <= bytes {
                return Ok(());
            }
            let drained = self.recycler.drain(u64::MAX, None) + self.rings.drain();
            self.release(drained);
            if drained > 0 {
                continue;
            }
            let freed = match self.evict(used - bytes, None) {
                Ok(freed) => freed,
                Err(e) => {
                    // E.g. the disk is full and only dirty pages are left: as when pinned
                    // pages remain, the shrink is abandoned and the old cap restored.
                    self.pool.store(old.max(self.used_bytes()), Ordering::Release);
                    return Err(e);
                }
            };
            if freed == 0 && self.evictors.load(Ordering::Acquire) == 0 {
                if start.elapsed() >= self.pin_wait {
                    self.pool.store(old.max(used), Ordering::Release);
                    return Err(Error::OutOfMemory {
                        requested: used - bytes,
                        used,
                        limit: bytes,
                        pinned: used - self.metadata.load(Ordering::Relaxed),
                        waited_ms: start.elapsed().as_millis() as u64,
                    });
                }
                backoff.snooze();
            }
        }
    }
}
