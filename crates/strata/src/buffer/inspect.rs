//! Introspection: statistics, allocation ranges, reading and verifying pages on disk, and
//! the buffer manager's invariants.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use super::manager::BufferManager;
use super::state::EVICTED;
use super::stats::{ClassStats, IoStats, Stats};
use crate::error::{Error, Result};
use crate::storage::page::{self};
use crate::storage::{IoBufMut, PageId};

/// One size class's allocation ([`BufferManager::allocation`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ClassAllocation {
    /// The size class.
    pub class: u8,
    /// Its page size in bytes.
    pub page_size: u64,
    /// Allocated pages.
    pub pages_allocated: u64,
    /// One past the highest allocated index (every index from there on is free).
    pub high_water: u64,
    /// Page slots the class's data file holds (its length over the page size).
    pub file_pages: u64,
    /// Allocated indices as inclusive ranges `(first, last)`, ascending.
    pub allocated: Vec<(u64, u64)>,
    /// Free indices below the larger of `high_water` and `file_pages`, as inclusive ranges.
    pub free: Vec<(u64, u64)>,
}

/// A page as read from disk ([`BufferManager::inspect_page`]).
#[derive(Clone, Debug)]
pub struct PageInspection {
    /// The page asked for.
    pub pid: PageId,
    /// Its data file, and its byte offset and size there.
    pub file: PathBuf,
    pub offset: u64,
    pub page_size: u64,
    /// Bytes of the page the file holds (short when the file ends inside the page; the rest
    /// was read as zeros).
    pub bytes_on_disk: u64,
    /// The header as stored.
    pub header: page::Header,
    /// The checksum the page's bytes have.
    pub computed_checksum: u32,
    /// The page's LSN if it verifies (checksum, magic, id), else what is wrong.
    pub verdict: std::result::Result<u64, page::PageFault>,
}

impl BufferManager {
    /// A snapshot of the statistics.
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let mut classes = Vec::new();
        let mut reserved = 0;
        let mut direct = true;
        let mut resident = 0;
        for class in 0..self.classes.count() {
            let p = self.spaces[class * 2].get();
            let t = self.spaces[class * 2 + 1].get();
            if p.is_none() && t.is_none() {
                continue;
            }
            let mut cs = ClassStats { class: class as u8, page_size: self.classes.page_size(class as u8), ..Default::default() };
            for sp in [p, t].into_iter().flatten() {
                reserved += sp.frames.mapped_bytes() + sp.states.mapped_bytes();
                direct &= sp.file.is_direct();
                cs.resident_bytes += sp.resident();
                let n = sp.bitmap.lock().allocated();
                if sp.temp {
                    cs.temp_pages = n;
                } else {
                    cs.allocated_pages = n;
                    cs.file_bytes = sp.file.len().unwrap_or(0);
                }
            }
            resident += cs.resident_bytes;
            classes.push(cs);
        }
        Stats {
            pool_bytes: self.pool_size(),
            used_bytes: self.used_bytes(),
            metadata_bytes: self.metadata.load(Ordering::Relaxed),
            resident_bytes: resident,
            peak_resident_bytes: self.peak_bytes(),
            hits: c.hits.get(),
            misses: c.misses.get(),
            pages_read: c.pages_read.get(),
            read_requests: c.read_requests.get(),
            pages_prefetched: c.pages_prefetched.get(),
            prefetch_hits: c.prefetch_hits.get(),
            sequential_windows: c.sequential_windows.get(),
            prefetch_wasted: c.prefetch_wasted.get(),
            ring_pages: c.ring_pages.get(),
            ring_hits: c.ring_hits.get(),
            ring_bytes: self.rings.bytes(),
            ring_threads_started: self.io_workers.started(),
            io: {
                let (read_queue_depth, read_request_bytes) = c.read_io.snapshot();
                let (write_queue_depth, write_request_bytes) = c.write_io.snapshot();
                IoStats { backend: self.backend.io_name(), read_queue_depth, read_request_bytes, write_queue_depth, write_request_bytes }
            },
            write_requests: c.write_requests.get(),
            dirty_victims: c.dirty_victims.get(),
            pages_cleaned: c.pages_cleaned.get(),
            bytes_read: c.bytes_read.get(),
            pages_written: c.pages_written.get(),
            bytes_written: c.bytes_written.get(),
            evictions: c.evictions.get(),
            remote: self.remote.as_ref().map(|t| super::tier::RemoteStats {
                hits: c.remote_hits.get(),
                misses: c.remote_misses.get(),
                rejected: c.remote_rejected.get(),
                errors: c.remote_errors.get(),
                puts: c.remote_puts.get(),
                ..t.stats()
            }),
            reserved_bytes: reserved,
            madvise_failures: super::region::madvise_failures(),
            direct_io: direct,
            contention: super::stats::Contention {
                latch_waits: c.latch_waits.get(),
                optimistic_restarts: c.optimistic_restarts.get(),
                reservation_waits: c.reservation_waits.get(),
                dirty_table_waits: self.durability.dirty_waits(),
                remote_versions_waits: self.remote_versions.waits(),
                // The resident set has no lock any more (see `super::resident`).
                resident_set_waits: 0,
                clock_moves: c.clock_moves.get(),
            },
            frame_recycling: self.recycler.mechanism(),
            frames_recycled: self.recycler.recycled.load(Ordering::Relaxed),
            frame_moves_failed: self.recycler.failed.load(Ordering::Relaxed),
            stashed_bytes: self.recycler.bytes(),
            classes,
        }
    }

    /// The allocation of every size class that holds (or held, since this open) persistent
    /// pages, by class: allocated and free page indices as compact ranges.
    pub fn allocation(&self) -> Vec<ClassAllocation> {
        let mut out = Vec::new();
        for class in 0..self.classes.count() {
            let Some(sp) = self.spaces[class * 2].get() else { continue };
            let page_size = sp.page_size();
            let file_pages = sp.file.len().unwrap_or(0) / page_size;
            let bm = sp.bitmap.lock();
            let high_water = bm.high_water();
            out.push(ClassAllocation {
                class: class as u8,
                page_size,
                pages_allocated: bm.allocated(),
                high_water,
                file_pages,
                allocated: bm.runs(),
                free: bm.free_runs(high_water.max(file_pages)),
            });
        }
        out
    }

    /// Reads persistent page `pid` straight from its data file (bypassing the pool, so a
    /// resident page that was changed since shows its older disk copy) and reports its
    /// header and whether it verifies, for inspection. A page that fails verification is
    /// reported, not an error; a temporary page, a class this database does not have and a
    /// page that is not allocated are [`Error::InvalidPageId`].
    pub fn inspect_page(&self, pid: PageId) -> Result<PageInspection> {
        if pid.is_temp() {
            return Err(Error::InvalidPageId { pid, reason: "temporary pages are never stored in the database" });
        }
        if pid.class() as usize >= self.classes.count() {
            return Err(Error::InvalidPageId { pid, reason: "this database has no such size class" });
        }
        let not_allocated = Error::InvalidPageId { pid, reason: "page is not allocated (never allocated or freed)" };
        let Some(sp) = self.spaces[pid.space()].get() else { return Err(not_allocated) };
        if !sp.bitmap.lock().is_allocated(pid.index()) {
            return Err(not_allocated);
        }
        let size = sp.page_size();
        let offset = sp.offset(pid.index());
        let mut image = crate::storage::AlignedBuf::zeroed(size as usize);
        let n = sp.file.read_at(image.io(), offset).map_err(|e| Error::io("read page", sp.path(), e))?;
        Ok(PageInspection {
            pid,
            file: sp.path(),
            offset,
            page_size: size,
            bytes_on_disk: n as u64,
            header: page::Header::parse(&image),
            computed_checksum: page::computed_checksum(&image),
            verdict: page::verify(&image, pid),
        })
    }

    /// Allocated persistent page ids of every class, ascending.
    pub fn allocated_pages(&self) -> Vec<PageId> {
        let mut out = Vec::new();
        for class in 0..self.classes.count() {
            if let Some(sp) = self.spaces[class * 2].get() {
                let bm = sp.bitmap.lock();
                out.extend(bm.iter().map(|i| sp.pid(i)));
            }
        }
        out
    }

    /// Checks the buffer manager's invariants: every resident page is allocated and in the
    /// resident set, per-space resident bytes match the resident set, and used bytes equal
    /// resident bytes plus metadata (exact when no other thread is working).
    pub fn check_invariants(&self) -> Result<()> {
        let rs = &self.resident;
        let mut by_space = vec![0u64; self.spaces.len()];
        let mut count = 0u64;
        let mut problem = None;
        rs.for_each(|pid| {
            count += 1;
            let Ok(sp) = self.lookup(pid) else {
                problem.get_or_insert(format!("resident set holds unknown page {pid}"));
                return;
            };
            by_space[pid.space()] += sp.page_size();
            if !sp.bitmap.lock().is_allocated(pid.index()) {
                problem.get_or_insert(format!("resident page {pid} is not allocated"));
            }
            if sp.state(pid.index()).load().state() == EVICTED {
                problem.get_or_insert(format!("page {pid} is in the resident set but EVICTED"));
            }
        });
        let mut resident = 0;
        for (i, slot) in self.spaces.iter().enumerate() {
            if let Some(sp) = slot.get() {
                if sp.resident() != by_space[i] {
                    problem.get_or_insert(format!("class {} accounts {} resident bytes, resident set has {}", sp.class, sp.resident(), by_space[i]));
                }
                // Every allocated, addressable page that is not EVICTED must be in the set.
                let bm = sp.bitmap.lock();
                for index in 0..sp.states.limit().min(bm.capacity()) {
                    let w = sp.state(index).load();
                    if w.state() != EVICTED && !bm.is_allocated(index) {
                        problem.get_or_insert(format!("page {} is resident but free", sp.pid(index)));
                    }
                }
                resident += sp.resident();
            }
        }
        let used = self.used_bytes();
        let meta = self.metadata.load(Ordering::Relaxed);
        let stashed = self.recycler.bytes();
        let rings = self.rings.bytes();
        if used != resident + meta + stashed + rings {
            problem.get_or_insert(format!("used bytes {used} != resident {resident} + metadata {meta} + stashed frames {stashed} + scan rings {rings}"));
        }
        if used > self.pool_size() {
            problem.get_or_insert(format!("used bytes {used} exceed the pool {}", self.pool_size()));
        }
        match problem {
            Some(p) => Err(Error::Inconsistent(p)),
            None => Ok(()),
        }
    }

    /// Reads page `pid` straight from disk (bypassing the pool) and verifies it; used by
    /// `check`. Resident dirty pages are skipped (their disk copy is legitimately old).
    pub fn verify_on_disk(&self, pid: PageId, buf: &mut crate::storage::AlignedBuf) -> Result<()> {
        let sp = self.lookup(pid)?;
        let size = sp.page_size() as usize;
        // A free slot holds no page (or a freed one's stale bytes): that is a bad id, not
        // corruption of the database.
        if !sp.bitmap.lock().is_allocated(pid.index()) {
            return Err(Error::InvalidPageId { pid, reason: "page is not allocated (never allocated or freed)" });
        }
        if buf.len() < size {
            return Err(Error::InvalidInput(format!(
                "verify buffer of {} is smaller than page {pid} ({})",
                crate::util::Bytes(buf.len() as u64),
                crate::util::Bytes(size as u64)
            )));
        }
        let w = sp.state(pid.index()).load();
        if w.state() != EVICTED && w.dirty() {
            return Ok(());
        }
        let n = sp.file.read_at(IoBufMut::from_slice(&mut buf.as_mut()[..size]), sp.offset(pid.index())).map_err(|e| Error::io("read page", sp.path(), e))?;
        if n < size {
            return Err(Error::corruption(
                sp.path(),
                Some(pid),
                format!("data file truncated: page needs bytes {}..{}, file ends before", sp.offset(pid.index()), sp.offset(pid.index()) + size as u64),
            ));
        }
        page::verify(&buf[..size], pid).map(|_| ()).map_err(|f| Error::corruption(sp.path(), Some(pid), f.to_string()))
    }
}
