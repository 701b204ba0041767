#![cfg(loom)]
//! Loom models of the page-state word protocol (`strata::buffer::state`).
//!
//! Run with
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target-loom cargo test -p strata --release --test loom_state
//! ```
//!
//! Under `--cfg loom` the crate's `sync` facade makes `PageState` a loom atomic, so every
//! interleaving (and every value a weak-memory load may legally return) of the protocol
//! steps below is explored. Each model is a miniature of what the buffer manager does with
//! one page:
//!
//! * page bytes that optimistic readers may load concurrently with writers are loom
//!   `AtomicU64` words accessed with `Relaxed`, as `OptimisticGuard` / `ExclusiveGuard` do;
//! * page bytes only ever touched under a shared or exclusive latch (the `&[u8]` views, the
//!   eviction's zeroing, the loader's read, the "disk") are a loom `UnsafeCell`, so loom also
//!   reports a data race if the latch does not order the accesses (missing Acquire/Release);
//! * bookkeeping counters use `Relaxed` read-modify-writes: they always read the latest
//!   value (so they detect overlapping critical sections) without adding any
//!   happens-before edge that could hide a missing ordering in the protocol itself.
//!
//! Two-thread models are explored exhaustively; the three-thread ones with a preemption
//! bound of 3 (`LOOM_MAX_PREEMPTIONS` overrides it, and bounds the others too).

use loom::cell::UnsafeCell;
use loom::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering::*};
use loom::sync::Arc;
use loom::thread;

use strata::buffer::state::{optimistic_ok, PageState, Word, EVICTED, LOCKED, MARKED, UNLOCKED};

/// The page's content while resident (a resident frame is never all zeroes in these models).
const CONTENT: u64 = 7;

/// Runs `f` under loom with `bound` preemptions unless `LOOM_MAX_PREEMPTIONS` is set.
fn check_bounded(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(bound);
    }
    b.check(f);
}

/// EVICTED -> LOCKED -> `fill` -> UNLOCKED (clean), as a load does: the page becomes resident.
fn make_resident(st: &PageState, fill: impl FnOnce()) {
    assert!(st.try_lock_evicted(st.load()));
    fill();
    st.unlock_exclusive_unchanged(true);
    assert_eq!(st.load().state(), UNLOCKED);
}

/// `BufferManager::fix_exclusive`'s latch loop. Returns `true` if the caller took
/// EVICTED -> LOCKED and must load the page.
///
/// Unlike the manager, which only calls each `try_*` in the states it accepts, the model's
/// loops hand every state to the `try_*` functions and rely on them to refuse the wrong
/// ones (equivalent when the protocol is right, and it makes the models check those
/// refusals too).
fn lock_exclusive(st: &PageState) -> bool {
    loop {
        let w = st.load();
        if st.try_lock_exclusive(w) {
            return false;
        }
        if st.try_lock_evicted(w) {
            return true;
        }
        thread::yield_now();
    }
}

/// `BufferManager::fix_shared`'s latch loop. Returns `true` if the caller took
/// EVICTED -> LOCKED and must load the page (then `downgrade_to_shared`).
fn lock_shared(st: &PageState) -> bool {
    loop {
        let w = st.load();
        if st.try_lock_shared(w) {
            return false;
        }
        if st.try_lock_evicted(w) {
            return true;
        }
        thread::yield_now();
    }
}

// ------------------------------------------------------------------------------------------
// Model 1: optimistic read vs exclusive write (and vs eviction).
// ------------------------------------------------------------------------------------------

/// A page whose words optimistic readers load while latch holders store them.
struct OptPage {
    st: PageState,
    words: [AtomicU64; 2],
}

impl OptPage {
    fn resident(content: u64) -> OptPage {
        let p = OptPage { st: PageState::new(), words: [AtomicU64::new(0), AtomicU64::new(0)] };
        make_resident(&p.st, || {
            for w in &p.words {
                w.store(content, Relaxed);
            }
        });
        p
    }

    /// `OptimisticGuard`: start (refusing LOCKED / EVICTED, clearing a mark), copy both
    /// words out with relaxed loads, then `validate` (Acquire fence + state re-load).
    /// `Some((seen, words))` iff the read validated.
    fn read_optimistic(&self) -> Option<(Word, [u64; 2])> {
        let seen = self.st.load();
        if !optimistic_ok(seen) {
            return None;
        }
        self.st.clear_mark(seen);
        let a = self.words[0].load(Relaxed);
        let b = self.words[1].load(Relaxed);
        fence(Acquire);
        self.st.validate(seen).then_some((seen, [a, b]))
    }

    /// One clock visit (see `Page::clock_visit`): a victim's frame is dropped by `evict`
    /// under the exclusive latch, then the page is EVICTED. Returns whether it was evicted.
    fn clock_visit(&self, evict: impl FnOnce()) -> bool {
        let w = self.st.load();
        if w.state() == MARKED {
            if self.st.try_lock_exclusive(w) {
                evict();
                self.st.unlock_evicted();
                return true;
            }
        } else {
            self.st.try_mark(w);
        }
        false
    }
}

/// A writer keeps `word0 == word1 == number of exclusive sections so far` (which is also the
/// version, as every section ends with `unlock_exclusive_modified`); an optimistic reader
/// that validates must have read a consistent pair, and the pair of the version it started
/// at (a read that validates never spans a write).
#[test]
fn optimistic_read_vs_exclusive_write() {
    loom::model(|| {
        let p = Arc::new(OptPage::resident(0));
        let writer = {
            let p = p.clone();
            thread::spawn(move || {
                for _ in 0..2 {
                    assert!(!lock_exclusive(&p.st), "the page is never evicted here");
                    let v = p.words[0].load(Relaxed);
                    p.words[0].store(v + 1, Relaxed);
                    p.words[1].store(v + 1, Relaxed);
                    p.st.unlock_exclusive_modified();
                }
            })
        };
        if let Some((seen, [a, b])) = p.read_optimistic() {
            assert_eq!(a, b, "validated a torn read");
            assert_eq!(a, seen.version(), "validated a read that spans an exclusive section");
        }
        writer.join().unwrap();
        let end = p.st.load();
        assert_eq!((end.state(), end.version(), end.dirty()), (UNLOCKED, 2, true));
    });
}

/// An evictor (clock: mark, then latch the marked page, zero the frame, `unlock_evicted`)
/// races an optimistic reader: a read that validates never saw the zeroed frame.
#[test]
fn optimistic_read_vs_eviction() {
    loom::model(|| {
        let p = Arc::new(OptPage::resident(CONTENT));
        let evictor = {
            let p = p.clone();
            thread::spawn(move || {
                for _ in 0..2 {
                    let evicted = p.clock_visit(|| {
                        // The frame is dropped (MADV_DONTNEED): it reads as zeroes.
                        for w in &p.words {
                            w.store(0, Relaxed);
                        }
                    });
                    if evicted {
                        return;
                    }
                }
            })
        };
        if let Some((_, words)) = p.read_optimistic() {
            assert_eq!(words, [CONTENT; 2], "validated a read of an evicted (zeroed) frame");
        }
        evictor.join().unwrap();
    });
}

/// One thread modifies the page (A -> B), then evicts it (writing B back); another thread
/// loads it again (EVICTED -> LOCKED, frame := disk, unlock). An optimistic reader that
/// validates read the content of the version it started at: A at version 0, B after.
#[test]
fn optimistic_read_vs_modify_evict_reload() {
    const A: u64 = CONTENT;
    const B: u64 = CONTENT + 1;
    check_bounded(3, || {
        let p = Arc::new(OptPage::resident(A));
        let disk = Arc::new([AtomicU64::new(A), AtomicU64::new(A)]);
        let writer_evictor = {
            let (p, disk) = (p.clone(), disk.clone());
            thread::spawn(move || {
                assert!(!lock_exclusive(&p.st), "only this thread evicts");
                for w in &p.words {
                    w.store(B, Relaxed);
                }
                p.st.unlock_exclusive_modified();
                for _ in 0..3 {
                    let evicted = p.clock_visit(|| {
                        assert!(p.st.load().dirty());
                        // Write back, then drop the frame.
                        for (d, w) in disk.iter().zip(&p.words) {
                            d.store(w.load(Relaxed), Relaxed);
                            w.store(0, Relaxed);
                        }
                    });
                    if evicted {
                        return;
                    }
                }
            })
        };
        let loader = {
            let (p, disk) = (p.clone(), disk.clone());
            thread::spawn(move || {
                let w = p.st.load();
                if w.state() == EVICTED && p.st.try_lock_evicted(w) {
                    for (d, w) in disk.iter().zip(&p.words) {
                        w.store(d.load(Relaxed), Relaxed);
                    }
                    p.st.unlock_exclusive_unchanged(true);
                }
            })
        };
        if let Some((seen, words)) = p.read_optimistic() {
            let expect = if seen.version() == 0 { A } else { B };
            assert_eq!(words, [expect; 2], "validated a read that does not match version {}", seen.version());
        }
        writer_evictor.join().unwrap();
        loader.join().unwrap();
    });
}

// ------------------------------------------------------------------------------------------
// Models 2 and 3: fixes vs eviction, evictors vs evictors.
// ------------------------------------------------------------------------------------------

/// A page whose frame and disk image are only touched under a latch.
struct Page {
    st: PageState,
    frame: UnsafeCell<[u64; 2]>,
    disk: UnsafeCell<[u64; 2]>,
    loads: AtomicUsize,
    evictions: AtomicUsize,
    /// Threads inside an exclusive section (loader, writer, evictor).
    exclusive_inside: AtomicUsize,
}

// SAFETY: `frame` and `disk` are only accessed by a thread that holds the page's latch
// (shared: reads only; exclusive: reads and writes), which is exactly the discipline the
// models check; loom's `UnsafeCell` reports any access the latch does not order.
unsafe impl Sync for Page {}

impl Page {
    fn resident(content: u64) -> Page {
        let p = Page::evicted(content);
        // SAFETY: not shared with any other thread yet.
        make_resident(&p.st, || p.frame.with_mut(|f| unsafe { *f = [content; 2] }));
        p
    }

    fn evicted(disk: u64) -> Page {
        Page {
            st: PageState::new(),
            frame: UnsafeCell::new([0; 2]),
            disk: UnsafeCell::new([disk; 2]),
            loads: AtomicUsize::new(0),
            evictions: AtomicUsize::new(0),
            exclusive_inside: AtomicUsize::new(0),
        }
    }

    fn enter_exclusive(&self) {
        assert_eq!(self.exclusive_inside.fetch_add(1, Relaxed), 0, "two exclusive sections overlap");
    }

    fn leave_exclusive(&self) {
        self.exclusive_inside.fetch_sub(1, Relaxed);
    }

    /// Reads the frame. Caller holds a latch.
    fn read_frame(&self) -> [u64; 2] {
        // SAFETY: the caller holds a shared or exclusive latch, so no thread writes the frame.
        self.frame.with(|f| unsafe { *f })
    }

    /// Writes the frame. Caller holds the exclusive latch.
    fn write_frame(&self, v: [u64; 2]) {
        // SAFETY: the caller holds the exclusive latch: no other thread accesses the frame.
        self.frame.with_mut(|f| unsafe { *f = v });
    }

    /// The loader's work after EVICTED -> LOCKED: read the disk image into the frame.
    fn load_locked(&self) {
        self.enter_exclusive();
        assert_eq!(self.read_frame(), [0; 2], "loading over a resident frame");
        // SAFETY: the caller holds the exclusive latch: nobody else touches the disk image.
        let image = self.disk.with(|d| unsafe { *d });
        self.write_frame(image);
        self.loads.fetch_add(1, Relaxed);
        self.leave_exclusive();
    }

    /// The evictor's work after latching a MARKED victim: write back if dirty, drop the
    /// frame, `unlock_evicted`.
    fn evict_locked(&self) {
        self.enter_exclusive();
        let frame = self.read_frame();
        assert_ne!(frame, [0; 2], "evicting a page whose frame is already dropped");
        if self.st.load().dirty() {
            // SAFETY: the caller holds the exclusive latch: nobody else touches the disk image.
            self.disk.with_mut(|d| unsafe { *d = frame });
        }
        self.write_frame([0; 2]);
        self.evictions.fetch_add(1, Relaxed);
        self.leave_exclusive();
        self.st.unlock_evicted();
    }

    /// One clock visit (`BufferManager::evict_inner`): UNLOCKED -> MARKED; a page still
    /// MARKED is a victim if its exclusive latch is taken without waiting. Returns whether
    /// this visit evicted the page.
    fn clock_visit(&self) -> bool {
        let w = self.st.load();
        if w.state() == MARKED {
            if self.st.try_lock_exclusive(w) {
                self.evict_locked();
                return true;
            }
        } else {
            // The manager only calls this on UNLOCKED pages; `try_mark` must refuse the rest.
            self.st.try_mark(w);
        }
        false
    }

    /// `visits` clock visits (the hand passing the page `visits` times). Returns how many
    /// of them evicted it.
    fn evictor(&self, visits: usize) -> usize {
        (0..visits).map(|_| usize::from(self.clock_visit())).sum()
    }

    /// After all threads joined: the state is unlatched, loads and evictions alternate (the
    /// page is resident at the end iff `resident_at_start + loads == evictions + 1`, EVICTED
    /// iff they are equal), the frame holds content iff the page is resident, and no write
    /// was lost (`expect` is the latest content: in the frame when resident, on disk when
    /// evicted).
    fn check_final(&self, resident_at_start: bool, expect: u64) {
        let end = self.st.load();
        let (loads, evictions) = (self.loads.load(Relaxed), self.evictions.load(Relaxed));
        let resident = (loads + usize::from(resident_at_start)).checked_sub(evictions);
        let frame = self.read_frame();
        // SAFETY: every other thread has been joined.
        let disk = self.disk.with(|d| unsafe { *d });
        match end.state() {
            EVICTED => {
                assert_eq!(resident, Some(0), "EVICTED after {loads} loads and {evictions} evictions");
                assert_eq!(frame, [0; 2], "EVICTED page with content in its frame");
                assert_eq!(disk, [expect; 2], "lost write");
                assert!(!end.dirty());
            }
            UNLOCKED | MARKED => {
                assert_eq!(resident, Some(1), "resident after {loads} loads and {evictions} evictions");
                assert_eq!(frame, [expect; 2], "resident page without its content");
            }
            s => panic!("page left latched: state {s}"),
        }
    }
}

/// A thread fixes the page shared twice while an evictor's clock passes it four times: while
/// the fixer holds the latch the frame is never dropped; when it finds the page EVICTED it
/// loads it itself (EVICTED -> LOCKED, load, downgrade).
#[test]
fn shared_fix_vs_eviction() {
    loom::model(|| {
        let p = Arc::new(Page::resident(CONTENT));
        let evictor = {
            let p = p.clone();
            thread::spawn(move || {
                p.evictor(4);
            })
        };
        for _ in 0..2 {
            if lock_shared(&p.st) {
                p.load_locked();
                p.st.downgrade_to_shared();
            }
            assert_eq!(p.read_frame(), [CONTENT; 2], "fixer saw a dropped frame under its latch");
            thread::yield_now();
            assert_eq!(p.read_frame(), [CONTENT; 2], "frame dropped while a shared latch was held");
            // (Checked after the frame reads: an Acquire load before them would add
            // synchronization the real fix path does not have.)
            assert!(p.st.load().shared_count() >= 1);
            p.st.unlock_shared();
        }
        evictor.join().unwrap();
        p.check_final(true, CONTENT);
    });
}

/// A thread fixes the page exclusively twice and writes it each time, while an evictor's
/// clock passes it four times: the writer never sees a dropped frame, and no write is lost
/// (dirty victims are written back before their frame is dropped; clean ones are not).
#[test]
fn exclusive_fix_vs_eviction() {
    loom::model(|| {
        let p = Arc::new(Page::resident(CONTENT));
        let evictor = {
            let p = p.clone();
            thread::spawn(move || {
                p.evictor(4);
            })
        };
        for round in 0..2 {
            if lock_exclusive(&p.st) {
                p.load_locked();
            }
            p.enter_exclusive();
            assert_eq!(p.read_frame(), [CONTENT + round; 2], "writer saw a dropped or stale frame under its latch");
            p.write_frame([CONTENT + round + 1; 2]);
            p.leave_exclusive();
            p.st.unlock_exclusive_modified();
        }
        evictor.join().unwrap();
        p.check_final(true, CONTENT + 2);
    });
}

/// Two fixers (one shared, one exclusive) race for an EVICTED page while an evictor runs:
/// exactly one of them loads it per eviction, and neither ever sees a dropped frame.
#[test]
fn two_fixers_load_once_vs_eviction() {
    check_bounded(3, || {
        let p = Arc::new(Page::evicted(CONTENT));
        let reader = {
            let p = p.clone();
            thread::spawn(move || {
                if lock_shared(&p.st) {
                    p.load_locked();
                    p.st.downgrade_to_shared();
                }
                assert_ne!(p.read_frame(), [0; 2], "reader saw a dropped frame under its latch");
                p.st.unlock_shared();
            })
        };
        let evictor = {
            let p = p.clone();
            thread::spawn(move || {
                p.evictor(2);
            })
        };
        if lock_exclusive(&p.st) {
            p.load_locked();
        }
        p.enter_exclusive();
        assert_eq!(p.read_frame(), [CONTENT; 2], "writer saw a dropped frame under its latch");
        p.write_frame([CONTENT + 1; 2]);
        p.leave_exclusive();
        p.st.unlock_exclusive_modified();
        reader.join().unwrap();
        evictor.join().unwrap();
        let (loads, evictions) = (p.loads.load(Relaxed), p.evictions.load(Relaxed));
        assert!(loads >= 1, "nobody loaded the page");
        assert!(loads == evictions || loads == evictions + 1, "loads {loads}, evictions {evictions}");
        let end = p.st.load();
        let frame = p.read_frame();
        // SAFETY: every other thread has been joined.
        let disk = p.disk.with(|d| unsafe { *d });
        match end.state() {
            EVICTED => {
                assert_eq!(loads, evictions);
                assert_eq!(frame, [0; 2]);
                assert_eq!(disk, [CONTENT + 1; 2], "lost write");
            }
            UNLOCKED | MARKED => {
                assert_eq!(loads, evictions + 1);
                assert_eq!(frame, [CONTENT + 1; 2]);
            }
            s => panic!("page left latched: state {s}"),
        }
    });
}

/// Two evictors visit the same page twice each: at most one of them gets the victim, the
/// page is evicted at most once, and the final state agrees with the eviction count.
#[test]
fn two_evictors_one_victim() {
    loom::model(|| {
        let p = Arc::new(Page::resident(CONTENT));
        let other = {
            let p = p.clone();
            thread::spawn(move || p.evictor(2))
        };
        let mine = p.evictor(2);
        let theirs = other.join().unwrap();
        let evictions = p.evictions.load(Relaxed);
        assert!(mine + theirs <= 1, "both evictors got the victim");
        assert_eq!(mine + theirs, evictions);
        let end = p.st.load();
        assert_eq!(end.state() == EVICTED, evictions == 1, "state {} after {evictions} evictions", end.state());
        if evictions == 1 {
            assert_eq!(end.version(), 1, "eviction bumps the version once");
        }
        p.check_final(true, CONTENT);
    });
}

/// The background cleaner (`BufferManager::clean_ahead`) meets a writer and an evictor: a
/// dirty MARKED page is latched without waiting, written to "disk" and left MARKED and
/// clean (`unlock_cleaned`), while the writer updates it twice and the evictor's clock
/// passes it three times. The cleaner never writes a frame it has not latched, and no write
/// is lost: a page evicted as clean has its latest content on disk.
#[test]
fn cleaner_vs_writer_vs_evictor() {
    check_bounded(3, || {
        let p = Arc::new(Page::resident(CONTENT));
        // Dirty and MARKED: the cleaner's target.
        assert!(!lock_exclusive(&p.st));
        p.write_frame([CONTENT + 1; 2]);
        p.st.unlock_exclusive_modified();
        assert!(p.st.try_mark(p.st.load()));
        let cleaner = {
            let p = p.clone();
            thread::spawn(move || {
                let w = p.st.load();
                if w.state() == MARKED && w.dirty() && p.st.try_lock_exclusive(w) {
                    p.enter_exclusive();
                    assert!(p.st.load().dirty(), "the latch keeps the page dirty");
                    let frame = p.read_frame();
                    assert_ne!(frame, [0; 2], "cleaning a dropped frame");
                    // SAFETY: exclusive latch held: nobody else touches the disk image.
                    p.disk.with_mut(|d| unsafe { *d = frame });
                    p.leave_exclusive();
                    p.st.unlock_cleaned();
                }
            })
        };
        let evictor = {
            let p = p.clone();
            thread::spawn(move || {
                p.evictor(3);
            })
        };
        let mut expect = CONTENT + 1;
        for _ in 0..2 {
            if lock_exclusive(&p.st) {
                p.load_locked();
            }
            p.enter_exclusive();
            assert_eq!(p.read_frame(), [expect; 2], "writer saw a dropped or stale frame");
            expect += 1;
            p.write_frame([expect; 2]);
            p.leave_exclusive();
            p.st.unlock_exclusive_modified();
        }
        cleaner.join().unwrap();
        evictor.join().unwrap();
        p.check_final(true, expect);
    });
}

// ------------------------------------------------------------------------------------------
// Model 4: shared latch counting vs the exclusive latch.
// ------------------------------------------------------------------------------------------

/// Two threads take and release shared latches while a third takes the exclusive one:
/// readers and the writer never overlap, readers see the writer's update atomically, and the
/// word returns to UNLOCKED with one version bump.
///
/// Readers make at most two attempts (a reader that finds the page latched exclusively
/// twice gives up): with two threads spinning on the same word loom explores schedules in
/// which they hand the processor to each other forever while the latch holder never runs.
/// The writer spins like `fix_exclusive` (readers never wait while holding a latch, so it
/// always gets in).
#[test]
fn shared_latches_exclude_writer() {
    struct Shared {
        st: PageState,
        data: UnsafeCell<[u64; 2]>,
        readers_inside: AtomicUsize,
        writer_inside: AtomicUsize,
    }
    // SAFETY: `data` is read only under a shared latch and written only under the
    // exclusive one; loom's `UnsafeCell` checks that the latch orders those accesses.
    unsafe impl Sync for Shared {}

    check_bounded(3, || {
        let s =
            Arc::new(Shared { st: PageState::new(), data: UnsafeCell::new([0; 2]), readers_inside: AtomicUsize::new(0), writer_inside: AtomicUsize::new(0) });
        make_resident(&s.st, || {});
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let s = s.clone();
                thread::spawn(move || {
                    for attempt in 0..2 {
                        if attempt > 0 {
                            thread::yield_now();
                        }
                        let w = s.st.load();
                        if !s.st.try_lock_shared(w) {
                            continue;
                        }
                        s.readers_inside.fetch_add(1, Relaxed);
                        assert_eq!(s.writer_inside.fetch_add(0, Relaxed), 0, "reader inside with the writer");
                        // SAFETY: shared latch held: no writer.
                        let [a, b] = s.data.with(|d| unsafe { *d });
                        assert_eq!(a, b, "reader saw a half-done write");
                        // (Only after the data access: an Acquire load of the state word here
                        // would add synchronization the real fix path does not have.)
                        let n = s.st.load().shared_count();
                        assert!((1..=2).contains(&n), "shared count {n} with one reader in");
                        s.readers_inside.fetch_sub(1, Relaxed);
                        s.st.unlock_shared();
                        return;
                    }
                })
            })
            .collect();
        // A bare attempt first (`try_lock_exclusive` must refuse a shared page by itself),
        // then `fix_exclusive`'s loop.
        if !s.st.try_lock_exclusive(s.st.load()) {
            assert!(!lock_exclusive(&s.st), "the page is never evicted here");
        }
        s.writer_inside.fetch_add(1, Relaxed);
        assert_eq!(s.readers_inside.fetch_add(0, Relaxed), 0, "writer inside with a reader");
        // SAFETY: exclusive latch held: no other reader or writer.
        s.data.with_mut(|d| unsafe { *d = [1, 1] });
        assert_eq!(s.st.load().state(), LOCKED);
        s.writer_inside.fetch_sub(1, Relaxed);
        s.st.unlock_exclusive_modified();
        for r in readers {
            r.join().unwrap();
        }
        let end = s.st.load();
        assert_eq!((end.state(), end.shared_count(), end.version(), end.dirty()), (UNLOCKED, 0, 1, true));
        // SAFETY: every other thread has been joined.
        assert_eq!(s.data.with(|d| unsafe { *d }), [1, 1]);
    });
}
