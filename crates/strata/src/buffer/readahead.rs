//! Read-ahead: an I/O thread that loads the next pages of a stream while its consumers work
//! on the current ones.
//!
//! A *stream* is a sequence of pages consumed (roughly) in order: the pages of a column, a
//! range of a data file. Its consumers say where they are — [`ReadAhead::claim`] hands out
//! the next morsel from a shared cursor, [`ReadAhead::advance`] reports a position a
//! consumer reached by itself — and the stream asks its I/O thread to have the pages up to
//! `position + depth` loaded. The I/O thread loads them with [`BufferManager::prefetch`]:
//! adjacent pages coalesced into reads of up to 1 MiB, several of those in flight at once
//! (io_uring), pages left PREFETCHED so that one never used is the first to go.
//!
//! The depth adapts to the consumer: it doubles (up to a quarter of the pool) whenever a
//! consumer reaches pages the I/O thread has not finished — the device is behind, so more
//! must be in flight — and halves (down to 1 MiB) when prefetched pages were evicted unused
//! since the last chunk — the pool is too small for that much read-ahead. A consumer never
//! waits for the I/O thread: a page it reaches first it loads itself (the prefetch then
//! skips it), and a page the I/O thread is reading is latched until its read completed, so
//! the consumer's fix simply waits for that latch.
//!
//! # Ring mode
//! A stream made by [`BufferManager::read_ahead_ring`] or [`ReadAhead::spawn_ring`] reads
//! its pages into a scan ring ([`super::ring`]) instead of their frames, where the ring is
//! on (`Config::scan_rings`) and one can be had (else it is a stream as above): the ring's
//! I/O threads read the evicted pages ahead of the consumers into the ring's buffers,
//! verified, and a consumer takes a page's image from there ([`Morsel::ring_page`]) — no
//! frame is allocated, zeroed, filled and released for it; the pages the ring did not
//! read (resident, changed since the read, failed) it fixes as usual. Consumers hold their
//! positions through a [`Morsel`], which gives them back as the consumer moves on (and
//! the rest when it is dropped, however the consumer ends).
//!
//! Lifetime: the I/O thread owns nothing but page latches it holds during one
//! `prefetch` call (released before the call returns, whatever happens). Dropping the
//! stream (or returning from [`BufferManager::read_ahead`]) stops it: the ranges still
//! queued are dropped and the thread is joined, so no read of the stream is in flight
//! afterwards.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::manager::BufferManager;
use super::ring::{Bm, Pages, Ring};
use crate::storage::PageId;

/// The pages of a stream, by position.
pub trait PageSource: Send + Sync {
    /// Number of pages.
    fn len(&self) -> usize;
    /// Whether the stream has no pages.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The page at position `i < len()`.
    fn page(&self, i: usize) -> PageId;
}

impl PageSource for [PageId] {
    fn len(&self) -> usize {
        <[PageId]>::len(self)
    }
    fn page(&self, i: usize) -> PageId {
        self[i]
    }
}

impl PageSource for Vec<PageId> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn page(&self, i: usize) -> PageId {
        self[i]
    }
}

/// Pages `first..first + count` of one class (persistent): a range of a data file.
#[derive(Clone, Copy, Debug)]
pub struct FilePages {
    /// The size class.
    pub class: u8,
    /// Index of the first page.
    pub first: u64,
    /// Number of pages.
    pub count: u64,
}

impl PageSource for FilePages {
    fn len(&self) -> usize {
        self.count as usize
    }
    fn page(&self, i: usize) -> PageId {
        PageId::new(self.class, false, self.first + i as u64)
    }
}

/// Bytes of read-ahead a stream starts with (and never goes below).
const MIN_DEPTH_BYTES: u64 = 1 << 20;
/// Bytes one `prefetch` call of an I/O thread covers: up to four 1 MiB reads in flight.
const CHUNK_BYTES: u64 = 4 << 20;
/// I/O threads per stream: two, so that one's reads are in flight while the other does
/// the CPU part of a prefetch (making room, verifying checksums).
const IO_THREADS: usize = 2;
/// The longest a consumer waits for the I/O threads before loading pages itself.
const MAX_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// What a stream did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadAheadStats {
    /// Pages the I/O thread loaded.
    pub pages_loaded: u64,
    /// Times a consumer reached pages the I/O thread had not finished.
    pub caught_up: u64,
    /// Times the depth was halved because prefetched pages were evicted unused.
    pub shrunk: u64,
    /// The depth in pages at the end.
    pub depth: usize,
    /// The largest depth in pages reached.
    pub max_depth_reached: usize,
}

struct Shared {
    len: usize,
    /// Next position [`ReadAhead::claim`] hands out.
    cursor: AtomicUsize,
    /// The furthest position a consumer has started on: pages before it are consumed or
    /// being consumed, the I/O thread skips them.
    floor: AtomicUsize,
    /// Positions requested from the I/O threads so far (`0..requested`): they load them in
    /// order, from `floor` on.
    requested: AtomicUsize,
    /// The next position an I/O thread takes a chunk from.
    next: AtomicUsize,
    /// Every position below it has been loaded (or skipped) by the I/O threads; consumers
    /// that reach a position beyond it wait on `progress` (see [`ReadAhead::wait`]).
    done: AtomicUsize,
    /// Chunks finished out of order (start -> end), waiting for the ones before them.
    finished: Mutex<BTreeMap<usize, usize>>,
    progress: Condvar,
    /// I/O threads running (a consumer never waits for a stream without any).
    threads: AtomicUsize,
    /// I/O threads with nothing to do wait here; woken when `requested` grows or on stop.
    idle: Mutex<()>,
    wake: Condvar,
    depth: AtomicUsize,
    min_depth: usize,
    max_depth: usize,
    stop: AtomicBool,
    caught_up: AtomicUsize,
    shrunk: AtomicUsize,
    loaded: AtomicUsize,
    max_reached: AtomicUsize,
}

/// A read-ahead stream (see the module documentation). `Sync`: its consumers may be
/// several threads.
pub struct ReadAhead<'s> {
    shared: Arc<Shared>,
    /// The I/O threads of a stream made by [`ReadAhead::spawn`] (joined on drop).
    owned: Vec<std::thread::JoinHandle<()>>,
    /// Ring mode: the ring the pages are read into (its I/O threads instead of the
    /// stream's).
    ring: Option<Arc<Ring<'s>>>,
    _source: std::marker::PhantomData<&'s ()>,
}

/// A consumer's positions of a stream (see [`ReadAhead::morsel`]): in ring mode, it hands
/// out the images the ring read and gives the positions back as the consumer moves on, and
/// the rest when it is dropped.
pub struct Morsel<'r> {
    ring: Option<&'r Ring<'r>>,
    range: Range<usize>,
    /// Positions of the morsel before it are given back.
    next: usize,
    /// The position whose image was handed out last, held in the ring until the next call.
    held: Option<usize>,
}

impl Morsel<'_> {
    /// The positions.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// The payload of the page at position `pos` (as a guard's `data()` shows it) from the
    /// stream's ring, if the ring read it and it is still the page; `None`: fix the page.
    /// Positions are taken in increasing order: the morsel's positions before `pos` (and
    /// the bytes handed out for them) are given back.
    pub fn ring_page(&mut self, pos: usize) -> Option<&[u8]> {
        let ring = self.ring?;
        if pos < self.next || pos >= self.range.end {
            return None;
        }
        // The last image's bytes are no longer borrowed (this takes `&mut self`).
        if let Some(h) = self.held.take() {
            ring.unhold(h);
        }
        ring.release_range(self.next..pos);
        self.next = pos;
        let image = ring.take(pos);
        if image.is_some() {
            self.held = Some(pos);
        }
        image
    }
}

impl Drop for Morsel<'_> {
    fn drop(&mut self) {
        if let Some(ring) = self.ring {
            if let Some(h) = self.held.take() {
                ring.unhold(h);
            }
            ring.release_range(self.next..self.range.end);
        }
    }
}

impl ReadAhead<'_> {
    /// Hands out the next morsel of at most `max` positions, and has the pages ahead of it
    /// loaded; `None` at the end of the stream.
    pub fn claim(&self, max: usize) -> Option<Range<usize>> {
        let s = &self.shared;
        let start = s.cursor.fetch_add(max.max(1), Ordering::Relaxed);
        if start >= s.len {
            return None;
        }
        let range = start..(start + max.max(1)).min(s.len);
        self.advance(range.clone());
        self.wait(range.clone());
        Some(range)
    }

    /// Waits (briefly) until the I/O threads have finished the requested positions before
    /// `range.end`, so that a consumer sleeps once instead of polling a page latch while its
    /// read is in flight (which on few cores takes the CPU the I/O threads need). Returns at
    /// once for positions nobody requested, when the stream has no I/O thread, and after at
    /// most [`MAX_WAIT`] (the consumer then loads what is missing itself).
    pub fn wait(&self, range: Range<usize>) {
        let s = &self.shared;
        let end = range.end.min(s.len).min(s.requested.load(Ordering::Acquire));
        if s.done.load(Ordering::Acquire) >= end || s.threads.load(Ordering::Acquire) == 0 {
            return;
        }
        let deadline = std::time::Instant::now() + MAX_WAIT;
        let mut finished = s.finished.lock();
        while s.done.load(Ordering::Acquire) < end && !s.stop.load(Ordering::Relaxed) && s.threads.load(Ordering::Acquire) > 0 {
            if s.progress.wait_until(&mut finished, deadline).timed_out() {
                break;
            }
        }
    }

    /// Tells the stream that a consumer is about to use positions `range`: the pages after
    /// it, up to the current depth, are requested from the I/O thread.
    pub fn advance(&self, range: Range<usize>) {
        let s = &self.shared;
        let end = range.end.min(s.len);
        s.floor.fetch_max(range.start, Ordering::Relaxed);
        let mut depth = s.depth.load(Ordering::Relaxed);
        let requested = s.requested.load(Ordering::Relaxed);
        if s.done.load(Ordering::Acquire) < end && requested > range.start {
            // (`done` is contiguous: everything below it is loaded.)
            // The consumer is at pages the I/O thread has not finished: more must be in
            // flight. Additive increase (the decrease on waste is multiplicative).
            let grown = (depth + s.min_depth).min(s.max_depth);
            if grown > depth && s.depth.compare_exchange(depth, grown, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                depth = grown;
                s.max_reached.fetch_max(grown, Ordering::Relaxed);
            }
            s.caught_up.fetch_add(1, Ordering::Relaxed);
        }
        // Top the window up once half of it is consumed, so the I/O thread gets work in
        // batches large enough to keep several reads in flight.
        if requested >= s.len || requested.saturating_sub(end) > depth / 2 {
            return;
        }
        let want = end.saturating_add(depth).min(s.len);
        if s.requested.fetch_max(want, Ordering::Release) < want {
            s.wake_all();
        }
    }

    /// Whether the stream reads into a ring (see the module documentation).
    pub fn ring_mode(&self) -> bool {
        self.ring.is_some()
    }

    /// Positions `range` (a morsel a consumer got from elsewhere than
    /// [`claim`](Self::claim)), held for the consumer (see [`Morsel`]). In ring mode each
    /// position of the stream should be in some consumer's morsel once: positions nobody
    /// takes hold the ring back until a consumer a whole ring ahead of them has waited
    /// briefly (50 ms) and the ring skips them.
    pub fn morsel(&self, range: Range<usize>) -> Morsel<'_> {
        let range = range.start.min(self.shared.len)..range.end.min(self.shared.len);
        Morsel { ring: self.ring.as_deref(), next: range.start, range, held: None }
    }

    /// [`claim`](Self::claim) as a [`Morsel`].
    pub fn claim_morsel(&self, max: usize) -> Option<Morsel<'_>> {
        self.claim(max).map(|r| self.morsel(r))
    }

    /// What the stream did so far.
    pub fn stats(&self) -> ReadAheadStats {
        let s = &self.shared;
        ReadAheadStats {
            pages_loaded: s.loaded.load(Ordering::Relaxed) as u64,
            caught_up: s.caught_up.load(Ordering::Relaxed) as u64,
            shrunk: s.shrunk.load(Ordering::Relaxed) as u64,
            depth: s.depth.load(Ordering::Relaxed),
            max_depth_reached: s.max_reached.load(Ordering::Relaxed),
        }
    }

    /// Stops the I/O thread: ranges still queued are dropped (a `prefetch` call under way
    /// finishes first).
    fn stop(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.wake_all();
        if let Some(ring) = &self.ring {
            ring.halt();
        }
    }
}

impl ReadAhead<'static> {
    /// A stream over `source` whose I/O thread shares `bm` (for owners that keep a stream
    /// across calls, such as a store that serves morsels one call at a time). The thread is
    /// stopped and joined when the stream is dropped.
    pub fn spawn(bm: Arc<BufferManager>, source: Arc<dyn PageSource>) -> ReadAhead<'static> {
        let shared = new_stream(&bm, &*source);
        // Without threads (none can be spawned) the stream still hands out morsels; its
        // requests go nowhere and consumers load every page themselves.
        let owned = (0..IO_THREADS)
            .filter_map(|_| {
                let (bm, source, sh) = (bm.clone(), source.clone(), shared.clone());
                shared.threads.fetch_add(1, Ordering::AcqRel);
                let spawned = std::thread::Builder::new().name("strata-readahead".into()).spawn(move || io_thread(&bm, &*source, &sh));
                if spawned.is_err() {
                    shared.threads.fetch_sub(1, Ordering::AcqRel);
                }
                spawned.ok()
            })
            .collect();
        ReadAhead { shared, owned, ring: None, _source: std::marker::PhantomData }
    }

    /// [`spawn`](Self::spawn) in ring mode (see the module documentation), where a ring
    /// can be had.
    pub fn spawn_ring(bm: Arc<BufferManager>, source: Arc<dyn PageSource>) -> ReadAhead<'static> {
        let Some(ring) = Ring::new(Bm::Arc(bm.clone()), Pages::Source(source.clone()), true) else {
            return ReadAhead::spawn(bm, source);
        };
        let ring = Arc::new(ring);
        let ra = ReadAhead { shared: new_stream(&bm, &*source), owned: Vec::new(), ring: Some(ring.clone()), _source: std::marker::PhantomData };
        // SAFETY: the stream holds the ring (an `Arc`) until its drop, which halts the
        // ring's loops and waits until they returned; a stream that is never dropped leaks
        // the ring, which then outlives its loops too. (The loops hold no `Arc` of their
        // own: the ring and its manager are dropped by their owner's thread, not by a
        // loop's.)
        unsafe { ring.start_io() };
        ra
    }
}

impl Drop for ReadAhead<'_> {
    fn drop(&mut self) {
        self.stop();
        if let Some(ring) = &self.ring {
            // Halted by `stop`: its loops return promptly (a panic in one is resumed here).
            ring.wait_io();
        }
        for h in self.owned.drain(..) {
            // The thread only ends by returning; a panic in it is a bug worth seeing.
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
    }
}

fn new_stream<P: PageSource + ?Sized>(bm: &BufferManager, source: &P) -> Arc<Shared> {
    let page = if source.is_empty() { bm.classes().min_page() } else { bm.classes().page_size(source.page(0).class()) };
    let min_depth = (MIN_DEPTH_BYTES / page).max(1) as usize;
    let max_depth = (bm.pool_size() / 4 / page).max(1) as usize;
    let min_depth = min_depth.min(max_depth);
    let depth = (2 * min_depth).min(max_depth);
    Arc::new(Shared {
        len: source.len(),
        cursor: AtomicUsize::new(0),
        floor: AtomicUsize::new(0),
        requested: AtomicUsize::new(0),
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        finished: Mutex::new(BTreeMap::new()),
        progress: Condvar::new(),
        threads: AtomicUsize::new(0),
        idle: Mutex::new(()),
        wake: Condvar::new(),
        depth: AtomicUsize::new(depth),
        min_depth,
        max_depth,
        stop: AtomicBool::new(false),
        caught_up: AtomicUsize::new(0),
        shrunk: AtomicUsize::new(0),
        loaded: AtomicUsize::new(0),
        max_reached: AtomicUsize::new(depth),
    })
}

impl Shared {
    /// Wakes the idle I/O threads (after `requested` grew or `stop` was set).
    fn wake_all(&self) {
        // Taking the lock orders this after an idle thread's last look at the counters:
        // it is either waiting (and woken) or has not looked yet (and will see them).
        drop(self.idle.lock());
        self.wake.notify_all();
    }

    /// Takes the next chunk of at most `chunk` requested positions at or past `floor` (the
    /// positions it jumps over, which consumers have passed, count as finished).
    fn take_chunk(&self, chunk: usize) -> Option<Range<usize>> {
        let mut at = self.next.load(Ordering::Relaxed);
        loop {
            let start = at.max(self.floor.load(Ordering::Relaxed));
            let target = self.requested.load(Ordering::Acquire);
            if start >= target {
                return None;
            }
            let end = (start + chunk).min(target);
            match self.next.compare_exchange_weak(at, end, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    if start > at {
                        self.finish(at..start);
                    }
                    return Some(start..end);
                }
                Err(now) => at = now,
            }
        }
    }

    /// Positions `r` are loaded (or skipped): advances the contiguous `done` mark over them
    /// and over chunks finished before them, and wakes waiting consumers.
    fn finish(&self, r: Range<usize>) {
        let mut finished = self.finished.lock();
        let mut done = self.done.load(Ordering::Relaxed);
        if r.start > done {
            finished.insert(r.start, r.end);
            return;
        }
        done = done.max(r.end);
        while let Some(entry) = finished.first_entry() {
            if *entry.key() > done {
                break;
            }
            done = done.max(entry.remove());
        }
        self.done.store(done, Ordering::Release);
        self.progress.notify_all();
    }
}

/// An I/O thread: takes chunks of the requested positions in order, skipping what
/// consumers have passed, and loads each with one `prefetch` call; shrinks the depth when
/// prefetched pages go unused; waits when there is nothing to do.
fn io_thread<P: PageSource + ?Sized>(bm: &BufferManager, source: &P, s: &Shared) {
    /// Counts the thread out however it ends, and wakes consumers waiting for it.
    struct Exit<'a>(&'a Shared);
    impl Drop for Exit<'_> {
        fn drop(&mut self) {
            self.0.threads.fetch_sub(1, Ordering::AcqRel);
            let _finished = self.0.finished.lock();
            self.0.progress.notify_all();
        }
    }
    let _exit = Exit(s);
    let max_chunk = if source.is_empty() { 1 } else { (CHUNK_BYTES / bm.classes().page_size(source.page(0).class())).max(1) as usize };
    let mut pids = Vec::with_capacity(max_chunk);
    let mut wasted = bm.prefetch_wasted();
    loop {
        if s.stop.load(Ordering::Relaxed) {
            return;
        }
        // Half the window per call (so both threads have work), within 1..=4 MiB.
        let chunk = (s.depth.load(Ordering::Relaxed) / 2).clamp(s.min_depth.min(max_chunk), max_chunk);
        let Some(range) = s.take_chunk(chunk) else {
            let mut idle = s.idle.lock();
            // Looked at again under the lock (see `wake_all`).
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            if s.next.load(Ordering::Relaxed).max(s.floor.load(Ordering::Relaxed)) >= s.requested.load(Ordering::Acquire) {
                s.wake.wait(&mut idle);
            }
            continue;
        };
        pids.clear();
        pids.extend(range.clone().map(|i| source.page(i)));
        let n = bm.prefetch(&pids);
        s.loaded.fetch_add(n, Ordering::Relaxed);
        s.finish(range);
        let now = bm.prefetch_wasted();
        if now > wasted {
            // Prefetched pages were evicted before use: the read-ahead outruns the pool.
            let d = s.depth.load(Ordering::Relaxed);
            s.depth.store((d / 2).max(s.min_depth), Ordering::Relaxed);
            s.shrunk.fetch_add(1, Ordering::Relaxed);
            wasted = now;
        }
    }
}

impl BufferManager {
    /// Runs `f` with a read-ahead stream over `source` (see [`super::readahead`]); the
    /// stream's I/O thread runs while `f` does and is joined before this returns.
    pub fn read_ahead<R>(&self, source: &(impl PageSource + ?Sized), f: impl FnOnce(&ReadAhead<'_>) -> R) -> R {
        let shared = new_stream(self, source);
        std::thread::scope(|scope| {
            for _ in 0..IO_THREADS {
                let sh = &*shared;
                // As in `spawn`: without threads the stream works, without read-ahead.
                sh.threads.fetch_add(1, Ordering::AcqRel);
                if std::thread::Builder::new().name("strata-readahead".into()).spawn_scoped(scope, move || io_thread(self, source, sh)).is_err() {
                    sh.threads.fetch_sub(1, Ordering::AcqRel);
                }
            }
            let ra = ReadAhead { shared: shared.clone(), owned: Vec::new(), ring: None, _source: std::marker::PhantomData };
            f(&ra)
            // `ra` is dropped here (stopping the thread), then the scope joins it.
        })
    }

    /// [`read_ahead`](Self::read_ahead) in ring mode (see [`super::readahead`]), where a
    /// ring can be had: the consumers take their pages through [`ReadAhead::claim_morsel`]
    /// or [`ReadAhead::morsel`] and [`Morsel::ring_page`].
    pub fn read_ahead_ring<R>(&self, source: &(impl PageSource + ?Sized), f: impl FnOnce(&ReadAhead<'_>) -> R) -> R {
        let pids: Vec<PageId> = (0..source.len()).map(|i| source.page(i)).collect();
        let Some(ring) = Ring::new(Bm::Ref(self), Pages::Source(Arc::new(pids)), true) else {
            return self.read_ahead(source, f);
        };
        let ring = Arc::new(ring);
        let ra = ReadAhead { shared: new_stream(self, source), owned: Vec::new(), ring: Some(ring.clone()), _source: std::marker::PhantomData };
        // SAFETY: `ra` holds the ring and is dropped before this returns (also when `f`
        // panics), and its drop halts the ring's loops and waits until they returned: no
        // loop outlives the borrow of `self` the ring holds.
        unsafe { ring.start_io() };
        f(&ra)
    }

    /// Prefetched pages evicted before use, so far.
    pub(super) fn prefetch_wasted(&self) -> u64 {
        self.counters.prefetch_wasted.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::PageId;

    #[test]
    fn done_is_contiguous_over_chunks_finished_out_of_order_and_skips() {
        let (_dir, bm) = crate::testutil::bm(1 << 20, 4096);
        let pids: Vec<PageId> = (0..100).map(|i| PageId::new(0, false, i)).collect();
        let s = new_stream(&bm, &pids[..]);
        s.finish(10..20);
        s.finish(30..40);
        assert_eq!(s.done.load(Ordering::Relaxed), 0, "0..10 is not finished yet");
        s.finish(0..10);
        assert_eq!(s.done.load(Ordering::Relaxed), 20, "0..20 now; 30..40 waits for 20..30");
        s.finish(20..30);
        assert_eq!(s.done.load(Ordering::Relaxed), 40);
        assert!(s.finished.lock().is_empty());
        // A chunk taken past the floor counts the positions it jumps over as finished.
        s.requested.store(100, Ordering::Relaxed);
        s.next.store(40, Ordering::Relaxed);
        s.floor.store(70, Ordering::Relaxed);
        assert_eq!(s.take_chunk(8), Some(70..78));
        assert_eq!(s.done.load(Ordering::Relaxed), 70, "40..70 skipped: consumers passed it");
        s.finish(70..78);
        assert_eq!(s.done.load(Ordering::Relaxed), 78);
    }
}
