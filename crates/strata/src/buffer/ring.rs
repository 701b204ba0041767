//! Scan rings: a scan's cold pages read into a small ring of the scan's own buffers
//! instead of into their frames.
//!
//! A page loaded into its frame costs the kernel more than the read: its frame's memory is
//! allocated, zeroed and charged at the first touch (the read), and returned when the page
//! is evicted. A scan larger than the pool pays that for every page it reads, on pages it
//! reads once (measured: a third to a half of the CPU of a cold table scan). A ring is a
//! fixed set of page-sized, 4 KiB-aligned buffers, charged to the pool's budget for the
//! ring's lifetime (the cap holds), into which I/O threads read the stream's pages
//! ahead of the scan (adjacent pages coalesced into one read, several reads in flight),
//! verifies them, and hands them to the scan in order; the scan gives each buffer back when
//! it moves on, and the thread reads the next page into it. Pages never enter the pool, so
//! a scan does not push out what others use either.
//!
//! Users: B+-tree scans (the children ahead of a leaf, one consumer) and read-ahead
//! streams in ring mode ([`super::readahead`]: column scans, the bench's scan; several
//! consumers, each giving back exactly the positions of its morsels).
//!
//! # Why an image from the disk is the page
//! A page is read so only if it is EVICTED (and allocated, and not held by the remote
//! tier); its state word is noted before the read. The disk holds an evicted page's
//! current image: a page is written only while resident (write-back), and every way back
//! to residency (a load, an allocation) changes the state word, as does every eviction
//! (the version is bumped). So if the word is unchanged after the read (and the checksum
//! and page id verify), the image read is the page's content — and if it is still
//! unchanged when the scan takes the image ([`Ring::get`]), it still is then: the scan's
//! read is an optimistic read of an evicted page, validated like any other. Anything else
//! (resident, latched, another size class, changed, failed) is handed to the scan as
//! `None`: it fixes the page as usual.

use std::collections::BTreeSet;
use std::ops::{Deref, Range};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::manager::BufferManager;
use super::partial::{self, PartialRead, SectorPlan, SECTOR};
use super::readahead::PageSource;
use super::space::Space;
use super::state::Word;
use super::PartialReads;
use crate::storage::page;
use crate::storage::{IoBufMut, PageId, ReadReq};

/// Largest read the ring coalesces adjacent pages into.
const MAX_RUN_BYTES: usize = 1 << 20;
/// The most bytes a ring takes: a share of the pool, at most this.
const MAX_RING_BYTES: u64 = 4 << 20;
/// A ring takes at most this share of the pool (1/8).
const POOL_SHARE: u64 = 8;
/// The rings that exist at once take at most this share of the pool together (1/2), a new
/// one at most that divided by their number.
const RINGS_SHARE: u64 = 2;
/// I/O threads per ring.
const IO_THREADS: usize = 2;
/// A ring needs at least this many buffers.
const MIN_SLOTS: usize = 4;
/// Batches read in parts after a consumer waited for the ring ([`PartialReads::WhenWaiting`]):
/// two windows of the ring (four batches each). Reading in parts makes the reads catch
/// up, after which the consumer may not wait for a while: one batch per wait would switch
/// back and forth between whole pages and parts while the scan is bound by its reads.
/// (The first window is read whole: its batches are claimed before anyone waited, and they
/// teach the plan. A batch without a plan is read whole and still uses a credit. Only
/// table scans' rings read in parts: shared read-ahead rings have no [`PartialRead`].)
const WAIT_CREDIT: u32 = 8;

/// The longest a consumer of a shared ring waits for its page's image before fixing the
/// page instead (a consumer that never gives its positions back cannot stall the others).
const SHARED_WAIT: Duration = Duration::from_secs(1);
/// How long a consumer of a shared ring waits for positions before the ring's window (held
/// by slower consumers, or never to be taken: a stream restarted under a consumer) before
/// the ring skips the ones nobody holds.
const SKIP_WAIT: Duration = Duration::from_millis(50);

/// A ring's buffers: one anonymous mapping, charged to the pool's budget for as long as it
/// exists (in a ring or kept in the [`RingCache`]). Mappings of whole 2 MiB units are
/// aligned to 2 MiB and advised to be transparent huge pages (where the system allows
/// them on request): the first read into a fresh 4 MiB ring then costs two faults and
/// two zeroed huge pages instead of 1024 faults of 4 KiB, the I/O threads pin fewer pages
/// per read, and the buffers stay whole (they are never discarded piecemeal).
struct RingBuf {
    ptr: *mut u8,
    len: usize,
}

/// The unit of a huge-page ring buffer.
const HUGE: usize = 1 << super::region::HUGE_SHIFT;

// SAFETY: a RingBuf is the sole owner of its mapping (a pointer and a length); moving it
// to another thread moves that ownership.
unsafe impl Send for RingBuf {}

impl RingBuf {
    /// A zeroed mapping of `len` bytes (a multiple of 4096), of huge pages where `len` is
    /// whole units of them, or `None` if the system has no memory to map.
    fn alloc(len: usize) -> Option<RingBuf> {
        let ptr = super::region::map_anonymous(len, len.is_multiple_of(HUGE)).ok()?;
        Some(RingBuf { ptr, len })
    }
}

impl Drop for RingBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping made by `alloc` with this start and length, owned by this
        // buffer, whose ring (and its I/O threads) or cache no longer uses it.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The buffers of finished rings, kept (still charged) for the next ring: a fresh
/// allocation costs a page fault and a zeroed page per 4 KiB at its first read. A
/// reservation that finds the pool full gives them back before it evicts a page
/// ([`RingCache::drain`]), so they never stand in the way of other memory.
#[derive(Default)]
pub(super) struct RingCache {
    bufs: Mutex<Vec<RingBuf>>,
    /// Bytes of every ring buffer that exists (in a ring or kept here), all charged.
    bytes: AtomicU64,
    /// Rings that exist now, and the bytes of their slots: a new ring's share of the pool
    /// is divided by their number, and what they take together is bounded.
    live: AtomicU64,
    live_bytes: AtomicU64,
}

/// Buffers a [`RingCache`] keeps at most: as many as the rings of the workers of a parallel
/// scan (one each per morsel; with fewer kept, most of sixteen workers' rings were fresh
/// mappings, zeroed by the kernel at their first reads).
const CACHED: usize = 16;

impl RingCache {
    /// A kept buffer of at least `bytes` (the smallest).
    fn take(&self, bytes: usize) -> Option<RingBuf> {
        let mut bufs = self.bufs.lock();
        let i = (0..bufs.len()).filter(|&i| bufs[i].len >= bytes).min_by_key(|&i| bufs[i].len)?;
        Some(bufs.swap_remove(i))
    }

    /// Keeps `buf`; if the cache is full, the smallest of the kept buffers and `buf` is
    /// handed back instead (for the caller to free: small buffers of many rings at once do
    /// not push out the large one that a lone scan's ring takes).
    fn put(&self, buf: RingBuf) -> Result<(), RingBuf> {
        let mut bufs = self.bufs.lock();
        if bufs.len() >= CACHED {
            let Some(i) = (0..bufs.len()).min_by_key(|&i| bufs[i].len).filter(|&i| bufs[i].len < buf.len) else { return Err(buf) };
            return Err(std::mem::replace(&mut bufs[i], buf));
        }
        bufs.push(buf);
        Ok(())
    }

    /// Bytes of the ring buffers that exist (charged to the budget).
    pub(super) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }

    /// Frees the kept buffers; returns their bytes, which the caller releases from the
    /// budget.
    pub(super) fn drain(&self) -> u64 {
        let bufs = std::mem::take(&mut *self.bufs.lock());
        let bytes = bufs.iter().map(|b| b.len as u64).sum();
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
        // (Owned by the cache, so no ring uses them: unmapped as they drop.)
        drop(bufs);
        bytes
    }
}

impl Drop for RingCache {
    fn drop(&mut self) {
        // (The budget goes with the buffer manager.)
        self.drain();
    }
}

/// The most bytes a new ring takes in a pool of `pool` bytes when it is one of `live`
/// rings that exist at once.
fn ring_bytes(pool: u64, live: u64) -> u64 {
    (pool / POOL_SHARE).min(pool / RINGS_SHARE / live.max(1)).min(MAX_RING_BYTES)
}

/// What the I/O thread made of a position.
#[derive(Clone, Copy)]
struct Filled {
    pos: usize,
    /// The state word the page had before and after its read, if the read is the page.
    seen: Option<Word>,
}

struct State {
    /// Per buffer (position % buffers): the position it was filled for.
    ready: Vec<Option<Filled>>,
    /// Positions below this are given back (their buffers are free).
    released: usize,
    /// Positions at or past `released` given back out of order (consumers of a shared
    /// ring finish their morsels in any order).
    freed: BTreeSet<usize>,
    /// Positions of a shared ring whose images a consumer is using ([`Ring::take`]).
    held: BTreeSet<usize>,
    /// First positions of the batches being read (their buffers are the I/O threads' until
    /// published, whatever `released` says).
    reading: Vec<usize>,
    /// Positions below this are (being) read by an I/O thread.
    claimed: usize,
    /// I/O threads running.
    running: usize,
    /// Whether the I/O thread has stopped (no further position will be filled).
    finished: bool,
    /// What an I/O loop panicked with: resumed by [`Ring::wait_io`].
    panic: Option<Box<dyn std::any::Any + Send>>,
    /// Batches still to be read in parts because a consumer waited for a position not yet
    /// read ([`PartialReads::WhenWaiting`]): set to [`WAIT_CREDIT`] at each wait, one used
    /// per batch claimed.
    in_parts: u32,
}

/// The buffer manager of a ring: borrowed (a scan's ring) or shared (a stream that
/// outlives the call that made it, [`super::ReadAhead::spawn_ring`]).
pub(super) enum Bm<'a> {
    Ref(&'a BufferManager),
    Arc(Arc<BufferManager>),
}

impl Deref for Bm<'_> {
    type Target = BufferManager;
    fn deref(&self) -> &BufferManager {
        match self {
            Bm::Ref(bm) => bm,
            Bm::Arc(bm) => bm,
        }
    }
}

/// The pages of a ring, by position.
pub(super) enum Pages<'a> {
    Slice(&'a [PageId]),
    Source(Arc<dyn PageSource>),
}

impl Pages<'_> {
    fn len(&self) -> usize {
        match self {
            Pages::Slice(s) => s.len(),
            Pages::Source(s) => s.len(),
        }
    }
    fn get(&self, pos: usize) -> PageId {
        match self {
            Pages::Slice(s) => s[pos],
            Pages::Source(s) => s.page(pos),
        }
    }
}

impl State {
    /// Skips positions below `to` that no consumer holds (they are not handed out any more;
    /// a consumer that asks for one fixes the page).
    fn skip_to(&mut self, to: usize) {
        let to = self.held.first().map_or(to, |&h| h.min(to));
        if to > self.released {
            self.released = to;
            self.settle();
        }
    }

    /// Moves `released` over the positions given back out of order right after it.
    fn settle(&mut self) {
        while let Some(&p) = self.freed.first() {
            if p > self.released {
                break;
            }
            self.freed.pop_first();
            if p == self.released {
                self.released += 1;
            }
        }
    }
}

/// A scan ring over a list of pages (see the module documentation).
///
/// A ring has one consumer that takes positions in increasing order and gives back
/// everything up to a position ([`Ring::release`], the B+-tree scan), or — *shared*, the
/// ring of a read-ahead stream ([`super::ReadAhead::spawn_ring`],
/// [`BufferManager::read_ahead_ring`]) — several, each taking the positions of its
/// morsels in increasing order and giving back exactly those ([`Ring::release_range`]).
pub struct Ring<'a> {
    bm: Bm<'a>,
    pids: Pages<'a>,
    /// The first page: its space is the ring's (pages of any other are not read into it).
    first: PageId,
    /// Several consumers (see above).
    shared: bool,
    slot: usize,
    slots: usize,
    /// Taken out (`None`) only when the ring is dropped.
    mem: Option<RingBuf>,
    buf: *mut u8,
    state: Mutex<State>,
    cv: Condvar,
    stop: AtomicBool,
    /// Partial reads: what the consumer needs of each page ([`super::partial`]), and the
    /// sectors predicted from the last batch.
    partial: Option<&'a dyn PartialRead>,
    plan: Mutex<SectorPlan>,
}

// SAFETY: the buffer behind `buf` is owned by the ring and handed between the I/O thread
// and the scan under `state`'s mutex (see `Ring::io` and `Ring::get`): each buffer is
// accessed by one thread at a time. Everything else is Sync already.
unsafe impl Sync for Ring<'_> {}
// SAFETY: as above; the ring is only a pointer to memory it owns plus Sync parts.
unsafe impl Send for Ring<'_> {}

impl<'a> Ring<'a> {
    /// The buffer of position `pos`.
    fn slot_ptr(&self, pos: usize) -> *mut u8 {
        // SAFETY: (pos % slots) * slot < slots * slot, so the offset stays inside the
        // allocation.
        unsafe { self.buf.add((pos % self.slots) * self.slot) }
    }

    /// The space of the ring's pages, if it is (still) addressable.
    fn space(&self) -> Option<&Space> {
        self.bm.addressable_space(self.first)
    }

    /// The payload of the page at `pos` (its bytes after the page header, as a guard's
    /// `data()` shows them), read ahead, if its image is the page now (`None`: fix it as
    /// usual).
    /// A consumer takes its positions in increasing order.
    ///
    /// # Safety
    /// The bytes are valid only until `pos` is given back ([`release`](Self::release) of
    /// `pos` or a later position, [`release_range`](Self::release_range) of a range with
    /// `pos`), by this thread or any other: then an I/O thread may read the next page into
    /// the buffer. The caller must not use them after that (the borrow checker cannot see
    /// it: giving back takes `&self` too).
    pub unsafe fn get(&self, pos: usize) -> Option<&[u8]> {
        self.image(pos, false)
    }

    /// [`get`](Self::get) for a consumer of a shared ring ([`super::readahead::Morsel`]):
    /// the position is *held* while its bytes are in use — a [`release_range`] of it by
    /// anyone else (two morsels over the same positions) does not give its buffer back, and
    /// a position someone gave back is not handed out — until [`unhold`](Self::unhold).
    ///
    /// [`release_range`]: Self::release_range
    pub(super) fn take(&self, pos: usize) -> Option<&[u8]> {
        self.image(pos, true)
    }

    /// Ends the hold of `take(pos)` (the consumer then gives the position back).
    pub(super) fn unhold(&self, pos: usize) {
        self.state.lock().held.remove(&pos);
    }

    fn image(&self, pos: usize, hold: bool) -> Option<&[u8]> {
        if pos >= self.pids.len() {
            return None;
        }
        let filled = {
            let mut st = self.state.lock();
            if pos >= st.released + self.slots {
                // A single consumer skipped positions: their buffers are free. Consumers of
                // a shared ring may still be at them: this one waits (briefly) for them to
                // be given back, then skips those nobody holds.
                if self.shared {
                    let until = Instant::now() + SKIP_WAIT;
                    while pos >= st.released + self.slots && !st.finished {
                        if self.cv.wait_until(&mut st, until).timed_out() {
                            break;
                        }
                    }
                }
                if pos >= st.released + self.slots {
                    // (A shared ring skips to `pos`, so that the window ahead of this
                    // consumer fills at once; held positions are never skipped.)
                    st.skip_to(if self.shared { pos } else { pos + 1 - self.slots });
                    self.cv.notify_all();
                }
            }
            let deadline = self.shared.then(|| Instant::now() + SHARED_WAIT);
            let filled = loop {
                if pos < st.released {
                    return None;
                }
                match st.ready[pos % self.slots] {
                    Some(f) if f.pos == pos => break f,
                    _ if st.finished => return None,
                    _ => {
                        // The scan is ahead of the reads: the next batches are read in
                        // parts.
                        st.in_parts = WAIT_CREDIT;
                        match deadline {
                            Some(d) => {
                                if self.cv.wait_until(&mut st, d).timed_out() {
                                    return None;
                                }
                            }
                            None => self.cv.wait(&mut st),
                        }
                    }
                }
            };
            // A held position is not given back (`release_range` skips it), so `released`
            // stays at or below it and its buffer is not reused until `unhold`.
            if hold && (filled.seen.is_none() || st.freed.contains(&pos) || !st.held.insert(pos)) {
                return None;
            }
            filled
        };
        let pid = self.pids.get(pos);
        // Still the page: its state word has not changed since the read.
        let same = filled.seen.is_some() && self.space().is_some_and(|sp| Some(sp.state(pid.index()).load()) == filled.seen);
        if !same {
            if hold {
                self.unhold(pos);
            }
            return None;
        }
        // SAFETY: the buffer of `pos` was filled and published under the mutex (which
        // orders the I/O thread's writes and the kernel's before this read); the I/O thread
        // does not touch it again before `pos` is given back: by `release(pos)` (or a later
        // position), which needs `&self` no longer borrowed by the returned slice's users
        // (the single consumer's contract), or, in a shared ring, only after `unhold(pos)`
        // (a held position is never given back), which the holder (a `Morsel`) calls only
        // once the slice's `&mut` borrow of it has ended.
        let image = unsafe { std::slice::from_raw_parts(self.slot_ptr(pos), self.slot) };
        self.bm.count_ring_hit();
        // The payload, as a guard's `data()` shows a frame.
        Some(&image[page::PAGE_HEADER_SIZE..])
    }

    /// The page at `pos` of the ring's list.
    pub fn page_of(&self, pos: usize) -> PageId {
        self.pids.get(pos)
    }

    /// Gives back the buffers of positions up to `pos` (the scan has moved past them).
    pub fn release(&self, pos: usize) {
        let mut st = self.state.lock();
        if pos + 1 > st.released {
            st.released = pos + 1;
            st.settle();
            self.wake_io(&st);
        }
    }

    /// Gives back the buffers of positions `range` (a consumer of a shared ring is done
    /// with them, or will not take them); the positions before them may still be held.
    pub fn release_range(&self, range: Range<usize>) {
        let mut st = self.state.lock();
        let from = range.start.max(st.released);
        if from >= range.end {
            return;
        }
        for p in from..range.end {
            // (A position another consumer holds is given back by its holder.)
            if !st.held.contains(&p) {
                st.freed.insert(p);
            }
        }
        let before = st.released;
        st.settle();
        if st.released > before {
            self.wake_io(&st);
        }
    }

    /// Wakes the I/O threads when a batch's buffers are free.
    fn wake_io(&self, st: &State) {
        if st.released + self.slots >= st.claimed + self.batch() {
            self.cv.notify_all();
        }
    }

    /// Stops the I/O threads (a read under way finishes first): nothing more is read.
    pub(super) fn halt(&self) {
        self.stop.store(true, Ordering::Release);
        let _st = self.state.lock();
        self.cv.notify_all();
    }

    /// Pages per read batch: a quarter of the ring, so that several are in flight.
    fn batch(&self) -> usize {
        (self.slots / 4).max(1)
    }

    /// An I/O loop (on one of the manager's I/O threads, [`super::io_workers`]): claims the
    /// next batch of positions once their buffers are free (a quarter of the ring, so that
    /// several reads are in flight), fills them with coalesced reads, publishes them, until
    /// the list is done or the ring stops. However it ends, it counts itself out and wakes
    /// the consumers. A panic stops the whole ring (the batch the loop was reading is never
    /// filled: consumers waiting for it, and the other loops waiting for its buffers, must
    /// not wait on) and is kept for [`wait_io`](Self::wait_io).
    fn io(&self) {
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.io_loop())).err();
        let mut st = self.state.lock();
        st.running -= 1;
        if st.running == 0 {
            st.finished = true;
        }
        if let Some(p) = panicked {
            self.stop.store(true, Ordering::Release);
            // Nothing more is filled: consumers fix the pages they still want.
            st.finished = true;
            if st.panic.is_none() {
                st.panic = Some(p);
            }
        }
        self.cv.notify_all();
    }

    fn io_loop(&self) {
        loop {
            let range = {
                let mut st = self.state.lock();
                loop {
                    if self.stop.load(Ordering::Acquire) {
                        break None;
                    }
                    let start = st.claimed.max(st.released);
                    if start >= self.pids.len() {
                        break None;
                    }
                    // A whole batch (or the rest of the list) once its buffers are free:
                    // page-sized batches would cost a request and a wake-up per page.
                    let end = start + self.batch().min(self.pids.len() - start);
                    // Free: given back, and not still being read into by another thread (a
                    // skip may have given back positions whose batch is in flight).
                    let free = st.reading.iter().fold(st.released, |r, &s| r.min(s)) + self.slots;
                    if end <= free {
                        st.claimed = end;
                        st.reading.push(start);
                        // (Only a ring with a reader of parts spends the credit.)
                        let in_parts = self.partial.is_some()
                            && match self.bm.partial_reads {
                                PartialReads::Off => false,
                                PartialReads::WhenWaiting => {
                                    let credit = st.in_parts;
                                    st.in_parts = credit.saturating_sub(1);
                                    credit > 0
                                }
                                PartialReads::Always => true,
                            };
                        break Some((start..end, in_parts));
                    }
                    self.cv.wait(&mut st);
                }
            };
            let Some((range, in_parts)) = range else { break };
            let results = self.read(range.clone(), in_parts);
            let mut st = self.state.lock();
            st.reading.retain(|&s| s != range.start);
            for (pos, seen) in range.zip(results) {
                if pos >= st.released {
                    st.ready[pos % self.slots] = Some(Filled { pos, seen });
                }
            }
            self.cv.notify_all();
        }
    }

    /// Waits until every I/O loop of the ring has returned (after [`halt`](Self::halt),
    /// promptly), then resumes the panic of one that panicked, unless this thread is
    /// unwinding already.
    pub(super) fn wait_io(&self) {
        let mut st = self.state.lock();
        while st.running > 0 {
            self.cv.wait(&mut st);
        }
        if let Some(p) = st.panic.take() {
            drop(st);
            if !std::thread::panicking() {
                std::panic::resume_unwind(p);
            }
        }
    }

    /// Reads the pages at `positions` into their buffers (which this thread owns), in the
    /// parts the plan names if `in_parts` (and the ring reads partially), else whole: per
    /// position, the state word the page kept across its read, if the image is the page.
    fn read(&self, positions: std::ops::Range<usize>, in_parts: bool) -> Vec<Option<Word>> {
        let bm = &*self.bm;
        let Some(sp) = self.space() else { return vec![None; positions.len()] };
        // Which positions can be read, with their state words.
        let mut seen: Vec<Option<Word>> = positions
            .clone()
            .map(|pos| {
                let pid = self.pids.get(pos);
                let index = pid.index();
                if bm.addressable_space(pid).is_none_or(|s| !std::ptr::eq(s, sp)) || sp.pid(index) != pid {
                    return None;
                }
                let w = sp.state(index).load();
                (!w.is_resident() && sp.is_allocated(index) && !bm.in_remote_tier(pid)).then_some(w)
            })
            .collect();
        if let Some(partial) = self.partial.filter(|_| in_parts) {
            let plan = self.plan.lock().get().map(<[bool]>::to_vec);
            if let Some(plan) = plan {
                return self.read_partial(sp, positions, seen, partial, &plan);
            }
        }
        // Runs of adjacent pages in adjacent buffers.
        let mut runs: Vec<(usize, usize)> = Vec::new(); // (first position, pages)
        for (k, pos) in positions.clone().enumerate() {
            if seen[k].is_none() {
                continue;
            }
            match runs.last_mut() {
                Some((first, n))
                    if *first + *n == pos
                        && pos % self.slots != 0
                        && self.pids.get(pos).index() == self.pids.get(pos - 1).index() + 1
                        && (*n + 1) * self.slot <= MAX_RUN_BYTES =>
                {
                    *n += 1
                }
                _ => runs.push((pos, 1)),
            }
        }
        let mut reqs: Vec<ReadReq<'_>> = runs
            .iter()
            .map(|&(first, n)| {
                // SAFETY: the buffers of positions first..first+n are adjacent (the run does
                // not wrap around the ring), inside the allocation, 4 KiB aligned, and owned
                // by this thread until it publishes them (the scan reads a buffer only once
                // it is published for its position, and released buffers are not read; no
                // other I/O thread claims a position whose buffer is one of a batch still in
                // flight, see `reading`).
                let buf = IoBufMut::from_slice(unsafe { std::slice::from_raw_parts_mut(self.slot_ptr(first), n * self.slot) });
                ReadReq::new(buf, sp.offset(self.pids.get(first).index()))
            })
            .collect();
        bm.read_batch(sp, &mut reqs);
        let got: Vec<usize> = reqs.iter().map(|r| *r.result.as_ref().unwrap_or(&0)).collect();
        drop(reqs);
        for (&(first, n), &got) in runs.iter().zip(&got) {
            for k in 0..n {
                let pos = first + k;
                let i = pos - positions.start;
                let pid = self.pids.get(pos);
                // SAFETY: this thread's buffer of `pos`, written by the completed read.
                let image = unsafe { std::slice::from_raw_parts(self.slot_ptr(pos), self.slot) };
                let whole = (k + 1) * self.slot <= got;
                let same = seen[i].is_some_and(|w| sp.state(pid.index()).load() == w);
                if !(whole && same && page::verify(image, pid).is_ok()) {
                    seen[i] = None;
                }
            }
            bm.count_ring_read(got.min(n * self.slot) as u64, (got.min(n * self.slot) / self.slot) as u64);
        }
        if let Some(partial) = self.partial {
            // What the pages read whole needed: the prediction for the next batch.
            let sectors = self.slot / SECTOR;
            let mut ranges = Vec::new();
            let needs: Vec<Option<Vec<bool>>> = positions
                .clone()
                .zip(&seen)
                .filter(|(_, s)| s.is_some())
                .map(|(pos, _)| {
                    // SAFETY: this thread's buffer of `pos`, filled by the completed read and
                    // not yet published.
                    let image = unsafe { std::slice::from_raw_parts(self.slot_ptr(pos), self.slot) };
                    needed_sectors(partial, image, image.len(), sectors, &mut ranges)
                })
                .collect();
            self.plan.lock().learn(sectors, needs.iter().map(Option::as_deref));
        }
        seen
    }

    /// [`read`](Self::read) of pages of which the consumer needs parts: the `plan`'s sectors
    /// of each page first, then the sectors a page needed beyond them (or all of it, if it
    /// needed the whole page); a page is verified by its own checksum if read whole, else
    /// by the consumer's ([`PartialRead::verify`]) after its header names it. The plan
    /// learns from what the pages needed.
    fn read_partial(&self, sp: &Space, positions: Range<usize>, mut seen: Vec<Option<Word>>, partial: &dyn PartialRead, plan: &[bool]) -> Vec<Option<Word>> {
        let sectors = plan.len();
        let n = positions.len();
        let mut have = vec![vec![false; sectors]; n];
        let first: Vec<(usize, Range<usize>)> = (0..n).filter(|&k| seen[k].is_some()).flat_map(|k| partial::runs(plan).map(move |r| (k, r))).collect();
        let mut bytes = self.read_sectors(sp, positions.start, &first, &mut have);
        // What each page needs: `None` for all of it.
        let mut ranges = Vec::new();
        let mut need: Vec<Option<Vec<bool>>> = vec![None; n];
        let mut rest = Vec::new();
        for k in (0..n).filter(|&k| seen[k].is_some()) {
            let head = have[k].iter().take_while(|&&h| h).count() * SECTOR;
            // SAFETY: this thread's buffer of the position, its first `head` bytes filled by
            // the completed reads, not yet published.
            let image = unsafe { std::slice::from_raw_parts(self.slot_ptr(positions.start + k), self.slot) };
            need[k] = needed_sectors(partial, image, head, sectors, &mut ranges);
            let wanted = need[k].as_deref();
            let missing = (0..sectors).map(|i| wanted.is_none_or(|w| w[i]) && !have[k][i]).collect::<Vec<bool>>();
            rest.extend(partial::runs(&missing).map(|r| (k, r)));
        }
        bytes += self.read_sectors(sp, positions.start, &rest, &mut have);
        let mut pages = 0;
        for k in 0..n {
            if seen[k].is_none() {
                continue;
            }
            let pid = self.pids.get(positions.start + k);
            // SAFETY: as above; every read into the buffer has completed.
            let image = unsafe { std::slice::from_raw_parts(self.slot_ptr(positions.start + k), self.slot) };
            let complete = (0..sectors).all(|i| have[k][i] || need[k].as_deref().is_some_and(|w| !w[i]));
            let same = seen[k].is_some_and(|w| sp.state(pid.index()).load() == w);
            let verified = match need[k] {
                None => page::verify(image, pid).is_ok(),
                Some(_) => page::names(image, pid) && partial.verify(&image[page::PAGE_HEADER_SIZE..]),
            };
            if complete && same && verified {
                pages += 1;
            } else {
                seen[k] = None;
            }
        }
        self.bm.count_ring_read(bytes, pages);
        self.plan.lock().learn(sectors, need.iter().zip(&seen).filter(|(_, s)| s.is_some()).map(|(w, _)| w.as_deref()));
        seen
    }

    /// Reads the sector ranges `reads` (per entry: the position's index after `base`, and
    /// a run of its sectors; in order of position, then sector) into the positions'
    /// buffers, all in one batch; marks in `have` the sectors read. Runs apart by at most
    /// [`partial::MERGE_GAP`] sectors, in one page or across adjacent pages in adjacent
    /// buffers, are one request (the sectors between them are read too: a request costs
    /// more than a few sectors). Returns the bytes read.
    fn read_sectors(&self, sp: &Space, base: usize, reads: &[(usize, Range<usize>)], have: &mut [Vec<bool>]) -> u64 {
        if reads.is_empty() {
            return 0;
        }
        let sectors = self.slot / SECTOR;
        // Requests as spans of "global" sectors (position index * sectors + sector).
        let mut spans: Vec<Range<usize>> = Vec::new();
        for (k, r) in reads {
            let (from, to) = (k * sectors + r.start, k * sectors + r.end);
            if let Some(last) = spans.last_mut() {
                let (lk, pos) = ((last.end - 1) / sectors, base + k);
                // Adjacent on the disk and in the ring, unless in the same page.
                let joins = lk == *k || (lk + 1 == *k && pos % self.slots != 0 && self.pids.get(pos).index() == self.pids.get(pos - 1).index() + 1);
                if joins && from >= last.end && from - last.end <= partial::MERGE_GAP && (to - last.start) * SECTOR <= MAX_RUN_BYTES {
                    last.end = to;
                    continue;
                }
            }
            spans.push(from..to);
        }
        let mut reqs: Vec<ReadReq<'_>> = spans
            .iter()
            .map(|g| {
                let (k, s) = (g.start / sectors, g.start % sectors);
                let pos = base + k;
                // SAFETY: the span starts at sector `s` of the buffer of `pos` and runs over
                // whole sectors of that buffer and of the next positions' (adjacent: a span
                // crosses into a position only if its buffer follows without wrapping around
                // the ring), so it lies inside the allocation, 4 KiB aligned; the spans of one
                // call do not overlap (they are made from runs in increasing order), and the
                // buffers are this thread's until it publishes the positions (see `read`).
                let buf = unsafe { std::slice::from_raw_parts_mut(self.slot_ptr(pos).add(s * SECTOR), g.len() * SECTOR) };
                ReadReq::new(IoBufMut::from_slice(buf), sp.offset(self.pids.get(pos).index()) + (s * SECTOR) as u64)
            })
            .collect();
        self.bm.read_batch(sp, &mut reqs);
        let got: Vec<usize> = reqs.iter().map(|r| *r.result.as_ref().unwrap_or(&0)).collect();
        drop(reqs);
        let mut bytes = 0;
        for (g, got) in spans.iter().zip(got) {
            let got = got.min(g.len() * SECTOR);
            bytes += got as u64;
            // The whole sectors read (a short read, at the file's end, fills a prefix).
            for x in g.start..g.start + got / SECTOR {
                have[x / sectors][x % sectors] = true;
            }
        }
        bytes
    }
}

/// The sectors of a page whose first `head` bytes of `image` were read that `partial` says
/// its consumer needs (`None`: all of it).
fn needed_sectors(partial: &dyn PartialRead, image: &[u8], head: usize, sectors: usize, ranges: &mut Vec<Range<usize>>) -> Option<Vec<bool>> {
    if head <= page::PAGE_HEADER_SIZE {
        return None;
    }
    ranges.clear();
    let mut m = vec![false; sectors];
    (partial.ranges(&image[page::PAGE_HEADER_SIZE..head], ranges) && partial::mark_sectors(ranges, page::PAGE_HEADER_SIZE, &mut m)).then_some(m)
}

impl Drop for Ring<'_> {
    fn drop(&mut self) {
        // The I/O loops have returned (the ring's owner waited for them, `wait_io`, before
        // dropping it), so nobody uses the buffers any more: kept for the next ring (still
        // charged), or freed.
        let Some(mem) = self.mem.take() else { return };
        let live = self.bm.rings.live.fetch_sub(1, Ordering::AcqRel) - 1;
        self.bm.rings.live_bytes.fetch_sub((self.slots * self.slot) as u64, Ordering::AcqRel);
        // A buffer over twice what the next ring would take (made while fewer rings
        // existed) is freed rather than kept charged for a ring that uses a part of it.
        let next = ring_bytes(self.bm.pool_size(), live + 1).max((MIN_SLOTS * self.slot) as u64);
        let kept = if mem.len as u64 > 2 * next { Err(mem) } else { self.bm.rings.put(mem) };
        if let Err(mem) = kept {
            let len = mem.len as u64;
            // (Unmapped here: its ring's users are gone.)
            drop(mem);
            self.bm.rings.bytes.fetch_sub(len, Ordering::AcqRel);
            self.bm.release(len);
        }
    }
}

impl BufferManager {
    /// Runs `f` with a scan ring over `pids` (see [`super::ring`]), or with `None` where no
    /// ring can be had (rings off, too small a pool, no room, no thread, an empty list or
    /// one whose first page is not addressable): the caller then reads its pages as usual.
    ///
    /// With `partial`, the ring reads of each page only what it says the scan needs, and
    /// hands out images of which only those bytes are the page's ([`super::partial`]).
    pub fn scan_ring<R>(&self, pids: &[PageId], partial: Option<&dyn PartialRead>, f: impl FnOnce(Option<&Ring<'_>>) -> R) -> R {
        let Some(ring) = Ring::new(Bm::Ref(self), Pages::Slice(pids), false) else { return f(None) };
        let ring = ring.reading(partial);
        let stop = StopIo(&ring);
        // SAFETY: `stop`, dropped before `ring` and whatever the ring borrows (it was
        // declared after them), also when `f` panics, halts the loops and waits until they
        // returned.
        unsafe { ring.start_io() };
        let r = f(Some(&ring));
        drop(stop);
        r
    }
}

/// Halts a ring's I/O loops and waits for them when dropped (see [`Ring::start_io`]).
struct StopIo<'r, 'a>(&'r Ring<'a>);

impl Drop for StopIo<'_, '_> {
    fn drop(&mut self) {
        self.0.halt();
        self.0.wait_io();
    }
}

impl<'a> Ring<'a> {
    /// A ring over `pids` (`shared`: for several consumers, see [`Ring`]), or `None` where
    /// none can be had (rings off, too small a pool, no room, an empty list or one whose
    /// first page is not addressable). Its I/O threads are started by the caller.
    pub(super) fn new(bm: Bm<'a>, pids: Pages<'a>, shared: bool) -> Option<Ring<'a>> {
        if !bm.scan_rings || pids.len() == 0 {
            return None;
        }
        let first = pids.get(0);
        let slot = bm.addressable_space(first)?.page_size() as usize;
        // The rings that exist at once share half the pool (the workers of a parallel scan
        // have one each: at a full ring's share each, sixteen of them took the whole pool
        // and evicted the pages the workers probe). The count and the bytes are taken before
        // the ring is made (rings made at the same moment see one another), and given back
        // if it is not.
        let live = bm.rings.live.fetch_add(1, Ordering::AcqRel) + 1;
        let (mut bytes, mut slots) = (0, 0);
        let taken = bm.rings.live_bytes.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            bytes = ring_bytes(bm.pool_size(), live).min((bm.pool_size() / RINGS_SHARE).saturating_sub(used));
            slots = (bytes as usize / slot).min(pids.len().max(MIN_SLOTS));
            (slots >= MIN_SLOTS && slot >= 4096).then(|| used + (slots * slot) as u64)
        });
        if taken.is_err() {
            bm.rings.live.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        // (`bytes` and `slots` are those of the claim that succeeded: the last call.)
        let total = slots * slot;
        let unclaim = || {
            bm.rings.live.fetch_sub(1, Ordering::AcqRel);
            bm.rings.live_bytes.fetch_sub(total as u64, Ordering::AcqRel);
        };
        let mem = match bm.rings.take(total) {
            Some(mem) => mem,
            None => {
                // A buffer of over 2 MiB is made of whole huge-page units where the ring's
                // share allows (later rings of that size take it from the cache).
                let size = match total.next_multiple_of(HUGE) {
                    up if total > HUGE && up as u64 <= bytes => up,
                    _ => total,
                };
                // Charged first (evicting as needed), without waiting for pinned pages.
                if bm.try_reserve(size as u64).is_err() {
                    unclaim();
                    return None;
                }
                let Some(mem) = RingBuf::alloc(size) else {
                    bm.release(size as u64);
                    unclaim();
                    return None;
                };
                bm.rings.bytes.fetch_add(size as u64, Ordering::AcqRel);
                mem
            }
        };
        // (`live` and `live_bytes` are counted out again when the ring drops.)
        Some(Ring {
            bm,
            pids,
            first,
            shared,
            slot,
            slots,
            buf: mem.ptr,
            mem: Some(mem),
            state: Mutex::new(State {
                ready: vec![None; slots],
                released: 0,
                freed: BTreeSet::new(),
                held: BTreeSet::new(),
                reading: Vec::new(),
                claimed: 0,
                running: 0,
                finished: false,
                in_parts: 0,
                panic: None,
            }),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            partial: None,
            plan: Mutex::new(SectorPlan::new(slot / SECTOR)),
        })
    }

    /// Reads only what `partial` says a page needs (pages of at least four sectors; see
    /// [`super::partial`]). Before the I/O threads start.
    fn reading(mut self, partial: Option<&'a dyn PartialRead>) -> Ring<'a> {
        self.partial = partial.filter(|_| self.bm.partial_reads != PartialReads::Off && self.slot >= 4 * SECTOR && self.slot.is_multiple_of(SECTOR));
        self
    }

    /// Starts the ring's I/O loops on the manager's I/O threads ([`super::io_workers`]).
    /// All are counted in before any starts (a loop that ends at once cannot finish the
    /// ring while another is still to start); a ring none of whose loops started is
    /// finished (its consumers fix every page).
    ///
    /// # Safety
    /// The loops borrow the ring: it must not be dropped (nor anything it borrows end)
    /// before [`wait_io`](Self::wait_io) returned, after a [`halt`](Self::halt) or the end
    /// of its list (a [`StopIo`] does both when dropped).
    pub(super) unsafe fn start_io(&self) {
        // SAFETY: only the lifetimes change (same type, same layout); by the contract the
        // reference is not used after `wait_io` returned, which is before the ring and what
        // it borrows end.
        let ring = unsafe { std::mem::transmute::<&Ring<'_>, &'static Ring<'static>>(self) };
        self.state.lock().running += IO_THREADS;
        let failed = (0..IO_THREADS).filter(|_| !self.bm.io_workers.run(Box::new(move || ring.io()))).count();
        if failed > 0 {
            let mut st = self.state.lock();
            st.running -= failed;
            if st.running == 0 {
                st.finished = true;
            }
            self.cv.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring hands out the images of evicted pages as their payloads, in order; a page
    /// changed after its image was read (loaded, written, so its state word moved) is not
    /// handed out from the ring; the ring's bytes are charged to the pool while it exists
    /// and while its buffer is kept, and given back when a reservation needs them.
    /// Ring buffers of whole 2 MiB units start on a 2 MiB boundary (where huge pages can
    /// back them); others are page-aligned; both are zeroed, writable to their last byte,
    /// and unmapped when dropped (no leak across many).
    #[test]
    fn ring_buffers_are_aligned_zeroed_mappings() {
        for _ in 0..64 {
            for len in [HUGE, 2 * HUGE, 10 * 65536] {
                let b = RingBuf::alloc(len).expect("a mapping");
                assert_eq!(b.len, len);
                let align = if len % HUGE == 0 { HUGE } else { 4096 };
                assert_eq!(b.ptr as usize % align, 0, "{len} bytes at {:p}", b.ptr);
                // SAFETY: the buffer's own `len` bytes, mapped writable by `alloc`, used
                // by nothing else.
                let bytes = unsafe { std::slice::from_raw_parts_mut(b.ptr, b.len) };
                assert!(bytes.iter().step_by(4096).all(|&x| x == 0));
                bytes[len - 1] = 7;
                bytes[0] = 7;
            }
        }
    }

    #[test]
    fn a_ring_hands_out_the_pages_and_never_an_image_older_than_a_change() {
        let (_dir, bm) = crate::testutil::bm(1 << 20, 4096);
        let mut marks = std::collections::HashMap::new();
        for i in 0..700u64 {
            let mut g = bm.alloc(100).unwrap();
            g.write(0, &(i * 7 + 1).to_le_bytes());
            marks.insert(g.pid(), i * 7 + 1);
        }
        let mut cold: Vec<PageId> = marks.keys().copied().filter(|&p| !bm.is_resident(p)).collect();
        cold.sort();
        cold.truncate(64);
        assert!(cold.len() >= 32, "{} evicted pages", cold.len());
        let mark = |payload: &[u8]| u64::from_le_bytes(payload[..8].try_into().unwrap());
        let before = bm.stats();
        bm.scan_ring(&cold, None, |ring| {
            let ring = ring.expect("a ring in a 1 MiB pool");
            assert_eq!(bm.stats().ring_bytes, (ring.slots * ring.slot) as u64);
            assert!(bm.used_bytes() <= bm.pool_size());
            // SAFETY: the image is read before position 0 is given back.
            let first = unsafe { ring.get(0) }.expect("an evicted page read into the ring");
            assert_eq!(mark(first), marks[&cold[0]]);
            ring.release(0);
            // Position 1 was read with position 0 (one batch); change the page now.
            {
                let mut g = bm.fix_exclusive(cold[1]).unwrap();
                g.write(0, &u64::MAX.to_le_bytes());
            }
            // SAFETY: no image is handed out (checked), so none is used.
            assert!(unsafe { ring.get(1) }.is_none(), "an image older than the page's change was handed out");
            ring.release(1);
            for (pos, pid) in cold.iter().enumerate().skip(2) {
                // SAFETY: the image is read before `pos` is given back.
                if let Some(p) = unsafe { ring.get(pos) } {
                    assert_eq!(mark(p), marks[pid], "position {pos}");
                }
                ring.release(pos);
            }
        });
        let after = bm.stats();
        assert!(after.ring_hits - before.ring_hits >= 30, "{after:?}");
        // The buffer is kept for the next ring, still charged.
        assert!(after.ring_bytes > 0);
        bm.check_invariants().unwrap();
        // A reservation that needs the memory gets it back.
        for _ in 0..400 {
            drop(bm.alloc(100).unwrap());
        }
        assert_eq!(bm.stats().ring_bytes, 0);
        bm.check_invariants().unwrap();
    }

    /// The reader of [`a_ring_reads_the_parts_of_pages_its_consumer_needs`]: it needs each
    /// page's first 16 bytes and 64 bytes at an offset they name.
    struct Parts;

    fn far(p: &[u8]) -> usize {
        u64::from_le_bytes(p[..8].try_into().unwrap()) as usize
    }

    fn pattern(mark: u64) -> Vec<u8> {
        (0..64u64).map(|i| (mark.wrapping_mul(31) + i) as u8).collect()
    }

    impl PartialRead for Parts {
        fn ranges(&self, head: &[u8], out: &mut Vec<Range<usize>>) -> bool {
            if head.len() < 16 || far(head) > 60_000 {
                return false;
            }
            out.extend([0..16, far(head)..far(head) + 64]);
            true
        }
        fn verify(&self, p: &[u8]) -> bool {
            let mark = u64::from_le_bytes(p[8..16].try_into().unwrap());
            p[far(p)..far(p) + 64] == pattern(mark)[..]
        }
    }

    /// A manager of 64 KiB pages in a 4 MiB pool reading partially in `mode`, and the
    /// evicted ones of 160 pages that [`Parts`] reads: (page, offset of its part, mark).
    fn parts_pages(dir: &std::path::Path, mode: crate::buffer::PartialReads) -> (BufferManager, Vec<(PageId, usize, u64)>) {
        let config = crate::buffer::Config::new(dir.join("db")).min_page(64 << 10).pool_size(4 << 20).scan_rings(true).partial_reads(mode);
        let bm = BufferManager::create(config).unwrap();
        let mut pages = Vec::new();
        for i in 0..160u64 {
            let mut g = bm.alloc(60_000).unwrap();
            let at = 20_000 + (i % 3) * 12_000;
            g.write(0, &at.to_le_bytes());
            g.write(8, &(i + 1).to_le_bytes());
            g.write(at as usize, &pattern(i + 1));
            pages.push((g.pid(), at as usize, i + 1));
        }
        let cold: Vec<(PageId, usize, u64)> = pages.iter().copied().filter(|&(p, ..)| !bm.is_resident(p)).collect();
        assert!(cold.len() >= 64, "{} evicted pages", cold.len());
        (bm, cold)
    }

    /// A ring reading parts of pages: its consumer ([`Parts`]) needs each page's first 16
    /// bytes and 64 bytes at an offset they name (three offsets, in different sectors). The
    /// images hand out those bytes as the pages hold them (the first batch reads the header
    /// sector, then what each page needs; later ones what the batch before needed, and what
    /// a page needs beyond it in a second round), the bytes read are a fraction of the
    /// pages', and a page whose part was changed on the disk is not handed out (fixed, its
    /// checksum fails).
    #[test]
    fn a_ring_reads_the_parts_of_pages_its_consumer_needs() {
        let dir = tempfile::tempdir().unwrap();
        let (bm, cold) = parts_pages(dir.path(), crate::buffer::PartialReads::Always);
        let pids: Vec<PageId> = cold.iter().map(|c| c.0).collect();
        let read = |pids: &[PageId]| {
            let before = bm.stats();
            let mut got = Vec::new();
            bm.scan_ring(pids, Some(&Parts), |ring| {
                let ring = ring.expect("a ring in a 4 MiB pool");
                for pos in 0..pids.len() {
                    // SAFETY: the image is read before `pos` is given back.
                    got.push(unsafe { ring.get(pos) }.map(|p| (far(p), u64::from_le_bytes(p[8..16].try_into().unwrap()), p[far(p)..far(p) + 64].to_vec())));
                    ring.release(pos);
                }
            });
            (got, bm.stats().bytes_read - before.bytes_read)
        };
        let (got, bytes) = read(&pids);
        for ((_, at, mark), g) in cold.iter().zip(&got) {
            let (f, m, part) = g.as_ref().expect("an evicted page's parts handed out");
            assert_eq!((*f, *m, &part[..]), (*at, *mark, &pattern(*mark)[..]));
        }
        let whole = (pids.len() * (64 << 10)) as u64;
        assert!(bytes * 3 < whole, "{bytes} bytes read of {whole}");
        // A page's part changed on the disk: not handed out, and its checksum fails a fix.
        let (bad, at, _) = cold[cold.len() / 2];
        {
            use std::io::{Seek, SeekFrom, Write};
            let sp = bm.addressable_space(bad).unwrap();
            let mut f = std::fs::OpenOptions::new().write(true).open(sp.path()).unwrap();
            f.seek(SeekFrom::Start(sp.offset(bad.index()) + (page::PAGE_HEADER_SIZE + at) as u64)).unwrap();
            f.write_all(&[0xEE; 8]).unwrap();
            f.sync_all().unwrap();
        }
        let (got, _) = read(&pids);
        for ((pid, _, mark), g) in cold.iter().zip(&got) {
            if *pid == bad {
                assert!(g.is_none(), "a changed part was handed out");
            } else {
                assert_eq!(g.as_ref().map(|g| g.1), Some(*mark));
            }
        }
        assert!(bm.fix_shared(bad).is_err(), "the changed page fixed without an error");
    }

    /// Rings one after another read with the same threads (kept by the manager's I/O
    /// workers), and a ring whose consumer panics leaves none of its loops running.
    #[test]
    fn rings_reuse_their_io_threads() {
        let dir = tempfile::tempdir().unwrap();
        let (bm, cold) = parts_pages(dir.path(), crate::buffer::PartialReads::Always);
        let pids: Vec<PageId> = cold.iter().map(|c| c.0).collect();
        let rings = 10;
        for _ in 0..rings {
            let marks = bm.scan_ring(&pids, None, |ring| {
                let ring = ring.expect("a ring in a 4 MiB pool");
                (0..pids.len())
                    .map(|pos| {
                        // SAFETY: the image is read before `pos` is given back.
                        let mark = unsafe { ring.get(pos) }.map(|p| u64::from_le_bytes(p[8..16].try_into().unwrap()));
                        ring.release(pos);
                        mark
                    })
                    .collect::<Vec<_>>()
            });
            assert_eq!(marks, cold.iter().map(|c| Some(c.2)).collect::<Vec<_>>());
        }
        let started = bm.stats().ring_threads_started;
        assert!(started >= IO_THREADS as u64 && started * 2 <= (rings * IO_THREADS) as u64, "{started} threads for {rings} rings");
        // A consumer's panic ends the scan; its loops are halted and waited for.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            bm.scan_ring(&pids, None, |ring| {
                // SAFETY: as above.
                assert!(unsafe { ring.unwrap().get(0) }.is_some());
                panic!("the consumer's own panic");
            })
        }));
        assert!(r.is_err());
        bm.check_invariants().unwrap();
        // A panic in one loop (here the reader's, asked what a page needs, the first time)
        // stops the ring: the consumer, reading every position, does not wait for the batch
        // that loop never filled, and gets the panic when the scan ends. The threads go on
        // serving rings.
        struct Broken(std::sync::atomic::AtomicBool);
        impl PartialRead for Broken {
            fn ranges(&self, head: &[u8], out: &mut Vec<Range<usize>>) -> bool {
                if !self.0.swap(true, Ordering::SeqCst) {
                    panic!("a broken reader");
                }
                Parts.ranges(head, out)
            }
            fn verify(&self, p: &[u8]) -> bool {
                Parts.verify(p)
            }
        }
        let broken = Broken(std::sync::atomic::AtomicBool::new(false));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            bm.scan_ring(&pids, Some(&broken), |ring| {
                let ring = ring.expect("a ring");
                for pos in 0..pids.len() {
                    // SAFETY: the image is looked at before `pos` is given back.
                    let _ = unsafe { ring.get(pos) }.is_some();
                    ring.release(pos);
                }
            })
        }));
        let p = r.expect_err("the loop's panic was not resumed");
        assert_eq!(p.downcast_ref::<&str>(), Some(&"a broken reader"));
        bm.io_workers.wait_until(|_, idle| idle >= IO_THREADS);
        let before = bm.stats().ring_threads_started;
        // SAFETY: the image is looked at before the ring ends.
        assert!(bm.scan_ring(&pids, None, |ring| unsafe { ring.unwrap().get(0) }.is_some()));
        assert_eq!(bm.stats().ring_threads_started, before, "a loop's panic cost its thread");
    }

    /// [`PartialReads::WhenWaiting`]: a consumer that takes each image as soon as it can
    /// (it waits for the reads all along) gets the pages read in parts; one that works on
    /// each page for longer than its read takes (10 ms; it waits for the first batch only)
    /// gets the batches after its wait's credit read whole.
    #[test]
    fn a_ring_reads_in_parts_only_while_its_consumer_waits_for_the_reads() {
        let dir = tempfile::tempdir().unwrap();
        let (bm, cold) = parts_pages(dir.path(), crate::buffer::PartialReads::WhenWaiting);
        let pids: Vec<PageId> = cold.iter().map(|c| c.0).collect();
        let read = |pause: Duration| {
            let before = bm.stats();
            bm.scan_ring(&pids, Some(&Parts), |ring| {
                let ring = ring.expect("a ring in a 4 MiB pool");
                for (pos, &(_, at, mark)) in cold.iter().enumerate() {
                    std::thread::sleep(pause);
                    // SAFETY: the image is read before `pos` is given back.
                    let part = unsafe { ring.get(pos) }.map(|p| p[at..at + 64].to_vec());
                    assert_eq!(part.as_deref(), Some(&pattern(mark)[..]), "page {pos}");
                    ring.release(pos);
                }
            });
            bm.stats().bytes_read - before.bytes_read
        };
        let whole = (pids.len() * (64 << 10)) as u64;
        let eager = read(Duration::ZERO);
        let busy = read(Duration::from_millis(10));
        assert!(eager * 3 < whole, "a consumer waiting for the reads: {eager} bytes read of {whole}");
        assert!(busy > 2 * eager && busy * 2 > whole, "a consumer slower than the reads: {busy} bytes read of {whole} (waiting: {eager})");
    }

    /// Rings that exist at once (the workers of a parallel scan have one each) share the
    /// pool: the k-th takes at most half the pool divided by k, and all of them together at
    /// most half of it (at an eighth each sixteen would want twice the pool, and evict what
    /// the workers read; a ring that finds no room left is not had: its scan fixes its
    /// pages); their buffers are kept for the next rings only up to twice what those take.
    #[test]
    fn rings_that_exist_at_once_share_the_pool() {
        let pool = 16u64 << 20;
        let dir = tempfile::tempdir().unwrap();
        let bm = BufferManager::create(crate::Config::new(dir.path().join("db")).min_page(4096).pool_size(pool).scan_rings(true)).unwrap();
        let pids: Vec<PageId> = (0..2000).map(|_| bm.alloc(100).unwrap().pid()).collect();
        fn nest(bm: &BufferManager, pids: &[PageId], depth: usize, sizes: &mut Vec<Option<u64>>) {
            bm.scan_ring(pids, None, |ring| {
                sizes.push(ring.map(|r| (r.slots * r.slot) as u64));
                if depth > 1 {
                    nest(bm, pids, depth - 1, sizes);
                }
            });
        }
        let mut sizes = Vec::new();
        nest(&bm, &pids, 16, &mut sizes);
        assert!(sizes[..4].iter().all(Option::is_some), "{sizes:?}");
        for (k, s) in sizes.iter().enumerate() {
            let s = s.unwrap_or(0);
            assert!(s <= ring_bytes(pool, k as u64 + 1), "ring {k} takes {s} bytes: {sizes:?}");
        }
        assert!(sizes.iter().map(|s| s.unwrap_or(0)).sum::<u64>() <= pool / RINGS_SHARE, "{sizes:?}");
        // After they are gone: the buffers kept are all that is still charged for rings.
        let kept: u64 = bm.rings.bufs.lock().iter().map(|b| b.len as u64).sum();
        assert_eq!(bm.rings.bytes(), kept);
        assert_eq!(bm.stats().ring_bytes, kept);
        assert_eq!(bm.rings.live.load(Ordering::Acquire), 0);
        assert_eq!(bm.rings.live_bytes.load(Ordering::Acquire), 0);
        bm.check_invariants().unwrap();
    }

    /// A full ring cache keeps the larger buffers: a small one put into it is handed back,
    /// a large one takes the place of the smallest kept, which is handed back.
    #[test]
    fn a_full_ring_cache_keeps_the_larger_buffers() {
        let cache = RingCache::default();
        let small = 16 << 10;
        for _ in 0..CACHED {
            cache.put(RingBuf::alloc(small).unwrap()).ok().expect("room in the cache");
        }
        let back = cache.put(RingBuf::alloc(small).unwrap()).expect_err("the cache is full");
        assert_eq!(back.len, small);
        let back = cache.put(RingBuf::alloc(HUGE).unwrap()).expect_err("the cache is full");
        assert_eq!(back.len, small, "the smallest kept buffer is handed back");
        assert_eq!(cache.take(HUGE).map(|b| b.len), Some(HUGE), "the large buffer is kept");
        // (The cache frees what it keeps when dropped; its byte count is the caller's.)
        cache.bytes.store((CACHED as u64 - 1) * small as u64, Ordering::Release);
    }

    /// A shared ring's positions given back out of order free their buffers only once
    /// every position before them is given back (another consumer may still hold those):
    /// the I/O threads never reuse a buffer a consumer holds.
    #[test]
    fn a_shared_ring_frees_buffers_only_below_every_position_still_held() {
        let (_dir, bm) = crate::testutil::bm(1 << 20, 4096);
        let pids: Vec<PageId> = (0..40).map(|_| bm.alloc(100).unwrap().pid()).collect();
        let ring = Ring::new(Bm::Ref(&bm), Pages::Slice(&pids), true).expect("a ring in a 1 MiB pool");
        // (No I/O threads: only the bookkeeping is looked at.)
        ring.release_range(4..8);
        ring.release_range(10..12);
        assert_eq!(ring.state.lock().released, 0, "positions 0..4 are still held");
        ring.release_range(0..3);
        assert_eq!(ring.state.lock().released, 3, "position 3 is still held");
        ring.release_range(3..4);
        assert_eq!(ring.state.lock().released, 8, "8..10 are still held");
        ring.release_range(8..10);
        let st = ring.state.lock();
        assert_eq!((st.released, st.freed.len()), (12, 0));
        drop(st);
        // A shared ring does not free the positions a consumer skips ahead of (a single
        // consumer's ring does): with no I/O thread, the far position is simply not served.
        ring.state.lock().finished = true;
        // SAFETY: no image is handed out (checked), so none is used.
        assert!(unsafe { ring.get(12 + ring.slots + 3) }.is_none());
        assert_eq!(ring.state.lock().released, 12);
    }
}
