//! `hashpool`: the classic buffer pool (PostgreSQL's `bufmgr`, SMILE): a fixed number of
//! fixed-size frames allocated up front, a partitioned hash table page → frame, a pin count
//! and a usage count per frame, clock-sweep replacement, one page size per pool, `O_DIRECT`
//! reads.
//!
//! # Protocol (after PostgreSQL's `BufferAlloc`)
//!
//! * Each frame has a descriptor: a state word (pin count, usage count up to 5, `VALID`,
//!   `IO_ERROR`), the tag (page key) it holds, a dirty flag and a content lock (shared /
//!   exclusive, separate from pins as in PostgreSQL).
//! * **Hit**: take the key's partition lock shared, look the key up, pin the frame (CAS on
//!   the state word, bumping the usage count), release the partition lock, wait until the
//!   frame is `VALID` (another thread may still be reading it in).
//! * **Miss**: the clock sweep pins a victim (a frame with pin count 0 and usage count 0;
//!   non-zero usage counts are decremented on the way). A dirty victim is written back. Then
//!   the old and new keys' partitions are locked exclusively (in index order); if the key was
//!   loaded meanwhile the victim is released and that frame used; if anyone pinned the victim
//!   through its old mapping meanwhile, the victim is released and the sweep tried again.
//!   Otherwise the state is reset (pin = ours, not `VALID`), the old mapping removed, the new
//!   one inserted, the locks released, and the page read straight into the frame; `VALID`
//!   is published with Release.
//! * The sweep gives up with an error after passing every frame pinned (as PostgreSQL's "no
//!   unpinned buffers available"): a pool never holds more frames than it was given.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use parking_lot::{RwLock, RwLockWriteGuard};

use super::open_data;
use crate::dataset::DataFile;
use crate::workload::{mix64, Counter, FxBuild};
use crate::{EResult, EngineError, IoCounters, Page, PageStore};

const REF_MASK: u64 = 0xFFFF_FFFF;
const USAGE_ONE: u64 = 1 << 32;
const USAGE_MASK: u64 = 0xF << 32;
const MAX_USAGE: u64 = 5;
const VALID: u64 = 1 << 40;
const IO_ERROR: u64 = 1 << 41;
const TAG_NONE: u64 = u64::MAX;

/// Bytes of metadata charged per frame: the 64-byte descriptor plus a hash-table entry
/// (16-byte bucket, control byte, load factor) rounded up generously.
pub const METADATA_PER_FRAME: u64 = 64 + 40;

/// PostgreSQL's `NUM_BUFFER_PARTITIONS`.
const MAX_PARTITIONS: usize = 128;
/// Bytes charged per partition (its cache-padded lock and table header).
const PARTITION_BYTES: u64 = 128;
/// How long a miss waits for a frame to be unpinned before failing (pins by other threads
/// are usually short; PostgreSQL fails at once, which would turn a transient collision of a
/// few threads on a small pool into a failed run).
const PIN_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

type Map = HashMap<u64, u32, FxBuild>;

#[repr(align(64))]
struct Desc {
    state: AtomicU64,
    tag: AtomicU64,
    dirty: AtomicBool,
    content: RwLock<()>,
}

/// The frames: one anonymous mapping, page aligned (as `O_DIRECT` needs).
struct Frames {
    ptr: NonNull<u8>,
    len: usize,
    frame: usize,
}

// SAFETY: `Frames` is a pointer to memory it owns; which thread may touch which frame when is
// governed by the pool's protocol (pins, VALID, content locks), argued at each access.
unsafe impl Send for Frames {}
// SAFETY: as above.
unsafe impl Sync for Frames {}

impl Frames {
    fn new(count: usize, frame: usize) -> std::io::Result<Frames> {
        let len = count * frame;
        // SAFETY: an anonymous private mapping of `len > 0` bytes at an address of the
        // kernel's choosing; no existing memory is affected.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Frames { ptr: NonNull::new(p.cast()).expect("mmap returned null"), len, frame })
    }

    /// Frame `f` as a shared slice.
    ///
    /// # Safety
    /// No `&mut` to frame `f` may exist while the returned slice lives (the caller holds a
    /// pin on a `VALID` frame and its content lock shared, or otherwise excludes writers).
    unsafe fn get(&self, f: usize) -> &[u8] {
        debug_assert!((f + 1) * self.frame <= self.len);
        // SAFETY: in bounds (f < frame count); aliasing forwarded to the caller.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(f * self.frame), self.frame) }
    }

    /// Frame `f` as a mutable slice.
    ///
    /// # Safety
    /// No other reference to frame `f` may exist while the returned slice lives (the caller
    /// is the loader of a frame that is not `VALID`, or holds its content lock exclusively).
    #[allow(clippy::mut_from_ref)]
    unsafe fn get_mut(&self, f: usize) -> &mut [u8] {
        debug_assert!((f + 1) * self.frame <= self.len);
        // SAFETY: in bounds; exclusivity forwarded to the caller.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(f * self.frame), self.frame) }
    }
}

impl Drop for Frames {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`; no reference into it can
        // outlive the pool (every slice borrows the pool).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

struct PoolFile {
    file: File,
    payload_offset: usize,
    pages: u64,
}

/// The classic hash-table buffer pool over the data files of one page size.
pub struct HashPool {
    page_size: usize,
    files: Vec<Option<PoolFile>>,
    frames: Frames,
    descs: Box<[Desc]>,
    parts: Box<[CachePadded<RwLock<Map>>]>,
    part_shift: u32,
    hand: CachePadded<AtomicU64>,
    hits: Counter,
    misses: Counter,
    bytes_read: Counter,
    pages_written: Counter,
    direct: bool,
    writable: bool,
    pool_bytes: u64,
    metadata_bytes: u64,
}

/// A pinned, `VALID` frame; unpinned on drop.
pub struct Pinned<'a> {
    pool: &'a HashPool,
    frame: usize,
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        self.pool.descs[self.frame].state.fetch_sub(1, Ordering::Release);
    }
}

fn key(page: Page) -> u64 {
    ((page.file as u64) << 48) | page.index
}

fn unkey(key: u64) -> Page {
    Page::new((key >> 48) as u16, key & ((1 << 48) - 1))
}

impl HashPool {
    /// Frames a pool of `pool_bytes` holds for `page_size`-byte pages once its metadata is
    /// charged to the same budget.
    pub fn frames_for(pool_bytes: u64, page_size: usize) -> u64 {
        let per = page_size as u64 + METADATA_PER_FRAME;
        let fixed = Self::partitions_for(pool_bytes / per) as u64 * PARTITION_BYTES;
        pool_bytes.saturating_sub(fixed) / per
    }

    fn partitions_for(frames: u64) -> usize {
        (frames.max(1).next_power_of_two() as usize).min(MAX_PARTITIONS)
    }

    /// A pool of `pool_bytes` (frames plus metadata) for the pages of the data files of
    /// `page_size` among `files` (file `k` of the list is [`Page::file`] `k`; files of other
    /// page sizes are not served). With `writable`, files are opened for writing and dirty
    /// frames are written back on eviction.
    pub fn open(files: &[DataFile], page_size: usize, pool_bytes: u64, writable: bool) -> EResult<HashPool> {
        if page_size == 0 || !page_size.is_multiple_of(4096) {
            return Err(EngineError(format!("hashpool page size {page_size} is not a multiple of 4 KiB")));
        }
        let n = Self::frames_for(pool_bytes, page_size);
        if n == 0 {
            return Err(EngineError(format!("a hashpool of {pool_bytes} bytes cannot hold one {page_size}-byte frame")));
        }
        if n > u32::MAX as u64 {
            return Err(EngineError("too many frames".into()));
        }
        let n = n as usize;
        let mut direct = true;
        let mut pfiles = Vec::new();
        for f in files {
            if f.page_size != page_size {
                pfiles.push(None);
                continue;
            }
            let (file, d) = open_data(&f.path, writable).map_err(|e| EngineError(format!("open {}: {e}", f.path.display())))?;
            direct &= d;
            pfiles.push(Some(PoolFile { file, payload_offset: f.payload_offset, pages: f.pages }));
        }
        let nparts = Self::partitions_for(pool_bytes / (page_size as u64 + METADATA_PER_FRAME));
        let per_part = n.div_ceil(nparts) * 2 + 8;
        let parts: Box<[_]> = (0..nparts).map(|_| CachePadded::new(RwLock::new(Map::with_capacity_and_hasher(per_part, FxBuild::default())))).collect();
        let descs: Box<[Desc]> =
            (0..n).map(|_| Desc { state: AtomicU64::new(0), tag: AtomicU64::new(TAG_NONE), dirty: AtomicBool::new(false), content: RwLock::new(()) }).collect();
        let frames = Frames::new(n, page_size).map_err(|e| EngineError(format!("allocate {n} frames: {e}")))?;
        Ok(HashPool {
            page_size,
            files: pfiles,
            frames,
            descs,
            parts,
            part_shift: 64 - nparts.trailing_zeros(),
            hand: CachePadded::new(AtomicU64::new(0)),
            hits: Counter::default(),
            misses: Counter::default(),
            bytes_read: Counter::default(),
            pages_written: Counter::default(),
            direct,
            writable,
            pool_bytes,
            metadata_bytes: pool_bytes - n as u64 * page_size as u64,
        })
    }

    /// Number of frames.
    pub fn capacity(&self) -> usize {
        self.descs.len()
    }

    /// The pool's page size.
    pub fn frame_size(&self) -> usize {
        self.page_size
    }

    /// Pages mapped in the hash table now (never more than [`capacity`](Self::capacity)): a
    /// consistent snapshot, taken with every partition locked (in index order, as loads lock
    /// them, so this cannot deadlock with them).
    pub fn mapped_pages(&self) -> usize {
        let guards: Vec<_> = self.parts.iter().map(|p| p.read()).collect();
        guards.iter().map(|g| g.len()).sum()
    }

    /// Frames pinned now.
    pub fn pinned_frames(&self) -> usize {
        self.descs.iter().filter(|d| d.state.load(Ordering::Relaxed) & REF_MASK != 0).count()
    }

    /// Pages written back so far.
    pub fn pages_written(&self) -> u64 {
        self.pages_written.get()
    }

    fn part_of(&self, key: u64) -> usize {
        if self.part_shift == 64 {
            0
        } else {
            (mix64(key) >> self.part_shift) as usize
        }
    }

    fn file(&self, page: Page) -> EResult<&PoolFile> {
        let f = self
            .files
            .get(page.file as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| EngineError(format!("this {}-byte hashpool holds no file {}", self.page_size, page.file)))?;
        if page.index >= f.pages {
            return Err(EngineError(format!("page {} of file {} is beyond its {} pages", page.index, page.file, f.pages)));
        }
        Ok(f)
    }

    fn pin(&self, f: usize) {
        let d = &self.descs[f];
        let mut s = d.state.load(Ordering::Relaxed);
        loop {
            let mut n = s + 1;
            if (s & USAGE_MASK) >> 32 < MAX_USAGE {
                n += USAGE_ONE;
            }
            match d.state.compare_exchange_weak(s, n, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return,
                Err(x) => s = x,
            }
        }
    }

    fn wait_valid(&self, f: usize) -> EResult<()> {
        let d = &self.descs[f];
        let mut spins = 0u32;
        loop {
            let s = d.state.load(Ordering::Acquire);
            if s & VALID != 0 {
                return Ok(());
            }
            if s & IO_ERROR != 0 {
                return Err(EngineError("hashpool: reading the page failed in another thread".into()));
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if spins < 256 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
    }

    /// Clock sweep: returns a frame with pin count 0 and usage count 0, now pinned by the
    /// caller.
    fn victim(&self) -> EResult<usize> {
        let n = self.descs.len();
        let mut tries = n;
        let mut waiting_since: Option<std::time::Instant> = None;
        loop {
            let i = (self.hand.fetch_add(1, Ordering::Relaxed) % n as u64) as usize;
            let d = &self.descs[i];
            let s = d.state.load(Ordering::Relaxed);
            if s & REF_MASK != 0 {
                tries -= 1;
                if tries == 0 {
                    // A whole lap found every frame pinned: wait a while for unpins.
                    let since = *waiting_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() >= PIN_WAIT {
                        return Err(EngineError(format!(
                            "hashpool of {n} frames of {} bytes: no unpinned frame (all pinned for {} ms)",
                            self.page_size,
                            PIN_WAIT.as_millis()
                        )));
                    }
                    std::thread::sleep(std::time::Duration::from_micros(50));
                    tries = n;
                }
                continue;
            }
            if s & USAGE_MASK != 0 {
                if d.state.compare_exchange_weak(s, s - USAGE_ONE, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                    tries = n;
                }
                continue;
            }
            if d.state.compare_exchange(s, s + 1, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return Ok(i);
            }
        }
    }

    /// Writes frame `f` back if dirty; the caller holds a pin on it.
    fn write_back(&self, f: usize) -> EResult<()> {
        let d = &self.descs[f];
        let _shared = d.content.read();
        if !d.dirty.load(Ordering::Acquire) {
            return Ok(());
        }
        let page = unkey(d.tag.load(Ordering::Relaxed));
        let pf = self.file(page)?;
        // SAFETY: we hold a pin (the frame cannot be reclaimed and reloaded) and its content
        // lock shared (no writer holds a `&mut`).
        let image = unsafe { self.frames.get(f) };
        pf.file.write_all_at(image, page.index * self.page_size as u64).map_err(|e| EngineError(format!("hashpool write back: {e}")))?;
        d.dirty.store(false, Ordering::Release);
        self.pages_written.add(1);
        Ok(())
    }

    /// Pins `page`, loading it if needed; the frame is `VALID` when this returns.
    pub fn fix(&self, page: Page) -> EResult<Pinned<'_>> {
        let pf = self.file(page)?;
        let key = key(page);
        let part = &self.parts[self.part_of(key)];
        {
            let map = part.read();
            if let Some(&f) = map.get(&key) {
                self.pin(f as usize);
                drop(map);
                self.hits.add(1);
                let p = Pinned { pool: self, frame: f as usize };
                self.wait_valid(p.frame)?;
                return Ok(p);
            }
        }
        self.load(page, key, pf)
    }

    fn load(&self, page: Page, key: u64, pf: &PoolFile) -> EResult<Pinned<'_>> {
        loop {
            let v = self.victim()?;
            let victim = Pinned { pool: self, frame: v };
            let d = &self.descs[v];
            if d.dirty.load(Ordering::Acquire) {
                self.write_back(v)?;
            }
            let old = d.tag.load(Ordering::Relaxed);
            let np = self.part_of(key);
            let op = (old != TAG_NONE).then(|| self.part_of(old)).filter(|&op| op != np);
            // Lock order: partition index ascending.
            let (mut new_map, mut old_map): (RwLockWriteGuard<'_, Map>, Option<RwLockWriteGuard<'_, Map>>) = match op {
                Some(op) if op < np => {
                    let o = self.parts[op].write();
                    (self.parts[np].write(), Some(o))
                }
                Some(op) => {
                    let n = self.parts[np].write();
                    (n, Some(self.parts[op].write()))
                }
                None => (self.parts[np].write(), None),
            };
            if let Some(&f) = new_map.get(&key) {
                // Another thread loaded the page meanwhile: use its frame.
                self.pin(f as usize);
                drop(old_map);
                drop(new_map);
                drop(victim);
                self.hits.add(1);
                let p = Pinned { pool: self, frame: f as usize };
                self.wait_valid(p.frame)?;
                return Ok(p);
            }
            let s = d.state.load(Ordering::Acquire);
            // Pinned through its old mapping before we locked it, or dirtied meanwhile: try
            // another victim.
            if s & REF_MASK != 1 || d.dirty.load(Ordering::Acquire) {
                continue;
            }
            if d.state.compare_exchange(s, 1 | USAGE_ONE, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                continue;
            }
            if old != TAG_NONE {
                let m = old_map.as_deref_mut().unwrap_or(&mut new_map);
                let removed = m.remove(&old);
                debug_assert_eq!(removed, Some(v as u32));
            }
            d.tag.store(key, Ordering::Relaxed);
            new_map.insert(key, v as u32);
            drop(old_map);
            drop(new_map);
            // SAFETY: the frame is pinned by us alone and not VALID: readers that find it in
            // the table pin it and wait for VALID before touching its bytes; no other
            // reference to it exists.
            let buf = unsafe { self.frames.get_mut(v) };
            match pf.file.read_exact_at(buf, page.index * self.page_size as u64) {
                Ok(()) => {
                    self.misses.add(1);
                    self.bytes_read.add(self.page_size as u64);
                    d.state.fetch_or(VALID, Ordering::Release);
                    return Ok(victim);
                }
                Err(e) => {
                    {
                        let mut m = self.parts[np].write();
                        m.remove(&key);
                        d.tag.store(TAG_NONE, Ordering::Relaxed);
                    }
                    d.state.fetch_or(IO_ERROR, Ordering::Release);
                    return Err(EngineError(format!("hashpool read of page {} of file {}: {e}", page.index, page.file)));
                }
            }
        }
    }

    /// Calls `f` with the payload of a pinned frame under its content lock (shared).
    pub fn with_frame(&self, p: &Pinned<'_>, page: Page, f: &mut dyn FnMut(&[u8])) -> EResult<()> {
        let off = self.file(page)?.payload_offset;
        let _shared = self.descs[p.frame].content.read();
        // SAFETY: pinned and VALID (fix waited for it), content lock shared: no `&mut` exists.
        let image = unsafe { self.frames.get(p.frame) };
        f(&image[off..]);
        Ok(())
    }

    /// Modifies the payload of `page` under its content lock (exclusive) and marks it dirty
    /// (written back when evicted; needs a `writable` pool).
    pub fn write(&self, page: Page, f: &mut dyn FnMut(&mut [u8])) -> EResult<()> {
        if !self.writable {
            return Err(EngineError("hashpool opened read-only".into()));
        }
        let p = self.fix(page)?;
        let off = self.file(page)?.payload_offset;
        let d = &self.descs[p.frame];
        let _excl = d.content.write();
        // SAFETY: pinned and VALID (so neither reloaded nor written by a loader), content lock
        // exclusive: no other reference to the frame exists while this one lives.
        let image = unsafe { self.frames.get_mut(p.frame) };
        f(&mut image[off..]);
        d.dirty.store(true, Ordering::Release);
        Ok(())
    }
}

impl PageStore for HashPool {
    fn name(&self) -> &'static str {
        "hashpool"
    }

    fn page_size(&self, _file: u16) -> usize {
        self.page_size
    }

    fn read(&self, page: Page, f: &mut dyn FnMut(&[u8])) -> EResult<()> {
        let p = self.fix(page)?;
        self.with_frame(&p, page, f)
    }

    fn read_pinned(&self, pages: &[Page], f: &mut dyn FnMut(usize, &[u8])) -> EResult<()> {
        let pins = pages.iter().map(|&p| self.fix(p)).collect::<EResult<Vec<_>>>()?;
        for (i, (p, &page)) in pins.iter().zip(pages).enumerate() {
            self.with_frame(p, page, &mut |d| f(i, d))?;
        }
        Ok(())
    }

    fn counters(&self) -> IoCounters {
        IoCounters { hits: Some(self.hits.get()), misses: Some(self.misses.get()), bytes_read: self.bytes_read.get() }
    }

    fn describe(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert("frames".into(), self.capacity().into());
        m.insert("frame_bytes".into(), self.page_size.into());
        m.insert("pool_bytes".into(), self.pool_bytes.into());
        m.insert("metadata_bytes".into(), self.metadata_bytes.into());
        m.insert("partitions".into(), self.parts.len().into());
        m.insert("direct_io".into(), self.direct.into());
        m
    }
}
