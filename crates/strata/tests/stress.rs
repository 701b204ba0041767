//! Multi-thread stress tests: four worker threads read and write self-verifying pages of
//! four size classes (4, 8, 16 and 64 KiB; 5 MiB in all) through a 512 KiB pool, while a
//! monitor thread samples `used_bytes()` and asserts that it never exceeds the cap.
//!
//! Page contents: payload word 0 is the page id, word 1 a sequence number `seq`, word `i >= 2`
//! is [`word`]`(pid, seq, i)`. Writers (`fix_exclusive`, or `fix_optimistic` + `upgrade`)
//! check that the page holds exactly the last committed `seq` (a lost write-back or a stale
//! reload is caught), rewrite every word for `seq + 1`, publish it in the page's counter and
//! sometimes downgrade and re-check. Readers check full consistency and `seq` == committed
//! under a shared latch, and, only after a successful validation, consistency and
//! `committed before <= seq <= committed after` for optimistic copies (`fix_optimistic` +
//! `read` + `validate`, some with a pause halfway, and `read_optimistic`). At the end every
//! page must hold its committed `seq`, the counters must add up to the writes done, the
//! invariants must hold, the peak must stay within the largest pool, there must have been
//! evictions, and everything must survive close and reopen.
//!
//! * `readers_and_writers_with_a_tenth_of_the_data_in_memory`: the above.
//! * `with_scratch_pages_checkpoints_and_pool_resizes`: also allocates, rewrites (through
//!   `data_mut` for temporary pages), checks and frees private temporary and persistent
//!   scratch pages, checkpoints, and shrinks and grows the pool while the others work.
//! * `*_clock_partitions_*`: the same with the resident set and clock in 1, 2 and 8
//!   partitions, and pool sizes that grow the resident set while the workers run.
//! * `everything_pinned_is_out_of_memory_over_all_partitions`: OutOfMemory with every page
//!   pinned, and a load succeeds as soon as any one page is unpinned, over 1, 2, 8 partitions.
//! * `shrinking_the_pool_races_with_loads`: shrinks and grows the pool in a tight loop while
//!   three threads load pages; after each shrink returns, `used_bytes()` must be within it.
//!
//! The size of a run is an operation count (deterministic), `STRATA_STRESS_OPS` operations
//! per worker thread (default 10 000; the shrink test does 200 times as many resize cycles).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use strata::buffer::{Cleaner, CleanerOptions};
use strata::storage::backend::OpenMode;
use strata::storage::{FileBackend, IoBufMut, ReadReq, StorageBackend, StorageFile};
use strata::{BufferManager, Config, PageId, PAGE_HEADER_SIZE};

const MIN_PAGE: u64 = 4096;
const WORKERS: usize = 4;

/// Pages per class (4, 8, 16 and 64 KiB pages): 1 + 1 + 1 + 2 MiB = 5 MiB of data.
const LAYOUT: [(u64, usize); 4] = [(4 << 10, 256), (8 << 10, 128), (16 << 10, 64), (64 << 10, 32)];
/// About a tenth of the data.
const POOL: u64 = 512 << 10;

fn ops_per_worker() -> usize {
    std::env::var("STRATA_STRESS_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000)
}

/// Word `i` (>= 2) of page `pid` at sequence number `seq`.
#[inline]
fn word(pid: PageId, seq: u64, i: usize) -> u64 {
    pid.raw() ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93)
}

#[inline]
fn le_word(data: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(data[8 * i..8 * i + 8].try_into().unwrap())
}

/// Checks that `data` is a complete image of `pid` at some sequence number; returns it.
fn consistent(pid: PageId, data: &[u8]) -> Result<u64, String> {
    let n = data.len() / 8;
    if le_word(data, 0) != pid.raw() {
        return Err(format!("word 0 is {:#x}, not the page id {pid}", le_word(data, 0)));
    }
    let seq = le_word(data, 1);
    for i in 2..n {
        let got = le_word(data, i);
        if got != word(pid, seq, i) {
            return Err(format!("word {i} of {n} is {got:#x}, expected {:#x} for seq {seq}", word(pid, seq, i)));
        }
    }
    Ok(seq)
}

/// Writes the complete image of `pid` at `seq` (every word, word 1 last).
fn fill(g: &mut strata::ExclusiveGuard<'_>, pid: PageId, seq: u64) {
    let n = g.len() / 8;
    g.write_u64(0, pid.raw());
    for i in 2..n {
        g.write_u64(8 * i, word(pid, seq, i));
    }
    g.write_u64(8, seq);
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The real filesystem minus fsync (the checkpoints and the close here are about contents,
/// not crash durability; fsync on a slow disk would dominate the run time).
#[derive(Debug)]
struct NoSync(Arc<dyn StorageBackend>);

#[derive(Debug)]
struct NoSyncFile(Arc<dyn StorageFile>);

impl StorageFile for NoSyncFile {
    fn read_at(&self, dst: IoBufMut<'_>, offset: u64) -> std::io::Result<usize> {
        self.0.read_at(dst, offset)
    }
    fn write_at(&self, src: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(src, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn read_many(&self, reqs: &mut [ReadReq<'_>]) -> std::io::Result<()> {
        self.0.read_many(reqs)
    }
    fn queue_depth(&self) -> usize {
        self.0.queue_depth()
    }
    fn len(&self) -> std::io::Result<u64> {
        self.0.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn is_direct(&self) -> bool {
        self.0.is_direct()
    }
    fn path(&self) -> &std::path::Path {
        self.0.path()
    }
}

impl StorageBackend for NoSync {
    fn open(&self, path: &std::path::Path, mode: OpenMode, create: bool) -> std::io::Result<Arc<dyn StorageFile>> {
        Ok(Arc::new(NoSyncFile(self.0.open(path, mode, create)?)))
    }
    fn read_file(&self, path: &std::path::Path) -> std::io::Result<Vec<u8>> {
        self.0.read_file(path)
    }
    fn write_atomic(&self, path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
        let tmp = strata::storage::atomic_write_temp(path);
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path)
    }
    fn remove(&self, path: &std::path::Path) -> std::io::Result<()> {
        self.0.remove(path)
    }
    fn exists(&self, path: &std::path::Path) -> bool {
        self.0.exists(path)
    }
    fn create_dir_all(&self, path: &std::path::Path) -> std::io::Result<()> {
        self.0.create_dir_all(path)
    }
    fn list_dir(&self, path: &std::path::Path) -> std::io::Result<Vec<String>> {
        self.0.list_dir(path)
    }
    fn sync_dir(&self, _path: &std::path::Path) -> std::io::Result<()> {
        Ok(())
    }
    fn io_name(&self) -> String {
        self.0.io_name()
    }
}

/// The shared pages and their committed sequence numbers.
struct Pages {
    pids: Vec<PageId>,
    committed: Vec<AtomicU64>,
}

impl Pages {
    /// Allocates the layout's pages, each written at seq 1.
    fn create(bm: &BufferManager) -> Pages {
        let mut pids = Vec::new();
        for &(size, count) in &LAYOUT {
            for _ in 0..count {
                let mut g = bm.alloc(size as usize - PAGE_HEADER_SIZE).unwrap();
                assert_eq!(g.len() + PAGE_HEADER_SIZE, size as usize);
                let pid = g.pid();
                fill(&mut g, pid, 1);
                pids.push(pid);
            }
        }
        let committed = pids.iter().map(|_| AtomicU64::new(1)).collect();
        Pages { pids, committed }
    }

    /// A page index: a quarter of the accesses go to two pages of each class (contention
    /// on latches, invalidated optimistic reads), a quarter to every eighth page (hits), the
    /// rest to any page (misses and evictions).
    fn pick(&self, rng: &mut Rng) -> usize {
        let n = self.pids.len();
        match rng.next() % 4 {
            0 => {
                let class = rng.below(LAYOUT.len());
                let first: usize = LAYOUT[..class].iter().map(|&(_, count)| count).sum();
                first + rng.below(2)
            }
            1 => rng.below(n / 8) * 8,
            _ => rng.below(n),
        }
    }

    /// Checks every page's final content against its committed counter.
    fn verify_all(&self, bm: &BufferManager) {
        for (i, &pid) in self.pids.iter().enumerate() {
            let g = bm.fix_shared(pid).unwrap();
            let seq = consistent(pid, g.data()).unwrap_or_else(|e| panic!("final check of {pid}: {e}"));
            assert_eq!(seq, self.committed[i].load(Ordering::Relaxed), "final seq of {pid}");
        }
    }
}

/// Bounds on the cap that the monitor checks `used_bytes()` against: `allowed` is at least
/// the cap in force at every instant (raised before a grow, lowered only after a shrink
/// returned).
struct Cap {
    allowed: AtomicU64,
    max: AtomicU64,
}

impl Cap {
    fn new(pool: u64) -> Cap {
        Cap { allowed: AtomicU64::new(pool), max: AtomicU64::new(pool) }
    }

    fn resize(&self, bm: &BufferManager, to: u64) {
        let now = self.allowed.load(Ordering::SeqCst);
        self.allowed.store(now.max(to), Ordering::SeqCst);
        self.max.fetch_max(to, Ordering::SeqCst);
        bm.set_pool_size(to).unwrap_or_else(|e| panic!("set_pool_size({to}): {e}"));
        assert!(bm.used_bytes() <= to, "used {} > {to} after set_pool_size returned", bm.used_bytes());
        self.allowed.store(to, Ordering::SeqCst);
    }
}

/// Samples `used_bytes()` until every worker is done; returns the number of samples.
fn monitor(bm: &BufferManager, cap: &Cap, running: &AtomicUsize) -> u64 {
    let mut samples = 0u64;
    while running.load(Ordering::SeqCst) > 0 {
        let a1 = cap.allowed.load(Ordering::SeqCst);
        let used = bm.used_bytes();
        let a2 = cap.allowed.load(Ordering::SeqCst);
        assert!(used <= a1.max(a2), "monitor: used bytes {used} exceed the cap {}", a1.max(a2));
        samples += 1;
        if samples.is_multiple_of(16) {
            thread::yield_now();
        }
    }
    samples
}

/// Decrements `running` when a worker ends, also by panic (so the monitor stops).
struct Running<'a>(&'a AtomicUsize);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Sets the flag when dropped (also by panic).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[derive(Default, Debug)]
struct Tally {
    writes: u64,
    shared: u64,
    optimistic_valid: u64,
    optimistic_invalid: u64,
    upgrades_failed: u64,
    temp_ops: u64,
    prefetched: u64,
}

/// One exclusive write of page `i`: checks the page holds the committed seq, writes seq+1.
fn write_page(bm: &BufferManager, pages: &Pages, i: usize, downgrade: bool) {
    let pid = pages.pids[i];
    let mut g = bm.fix_exclusive(pid).unwrap_or_else(|e| panic!("fix_exclusive({pid}): {e}"));
    let seq = consistent(pid, g.data()).unwrap_or_else(|e| panic!("{pid} under the exclusive latch: {e}"));
    let committed = pages.committed[i].load(Ordering::Acquire);
    assert_eq!(seq, committed, "{pid} under the exclusive latch holds seq {seq}, last committed is {committed} (lost write?)");
    fill(&mut g, pid, seq + 1);
    pages.committed[i].store(seq + 1, Ordering::Release);
    if downgrade {
        let s = g.downgrade();
        let now = consistent(pid, s.data()).unwrap_or_else(|e| panic!("{pid} after downgrade: {e}"));
        assert_eq!(now, seq + 1, "{pid} changed between the downgrade and the shared latch");
    }
}

/// fix_optimistic, read `seq`, upgrade; on success check and rewrite. Returns whether the
/// upgrade succeeded.
fn upgrade_write(bm: &BufferManager, pages: &Pages, i: usize) -> bool {
    let pid = pages.pids[i];
    let o = bm.fix_optimistic(pid).unwrap_or_else(|e| panic!("fix_optimistic({pid}): {e}"));
    let seen = o.read_u64(8);
    let Ok(mut g) = o.upgrade() else { return false };
    let seq = consistent(pid, g.data()).unwrap_or_else(|e| panic!("{pid} after upgrade: {e}"));
    assert_eq!(seq, seen, "{pid} changed between the optimistic read and a successful upgrade");
    assert_eq!(seq, pages.committed[i].load(Ordering::Acquire), "{pid} after upgrade: stale seq");
    fill(&mut g, pid, seq + 1);
    pages.committed[i].store(seq + 1, Ordering::Release);
    true
}

fn read_shared(bm: &BufferManager, pages: &Pages, i: usize) {
    let pid = pages.pids[i];
    let g = bm.fix_shared(pid).unwrap_or_else(|e| panic!("fix_shared({pid}): {e}"));
    let seq = consistent(pid, g.data()).unwrap_or_else(|e| panic!("{pid} under a shared latch: {e}"));
    let committed = pages.committed[i].load(Ordering::Acquire);
    assert_eq!(seq, committed, "{pid} under a shared latch holds seq {seq}, last committed is {committed}");
}

/// Checks an optimistically copied, validated image against the counters read before and
/// after the read.
fn check_validated(pid: PageId, data: &[u8], before: u64, after: u64) {
    let seq = consistent(pid, data).unwrap_or_else(|e| panic!("validated optimistic read of {pid}: {e}"));
    assert!(before <= seq && seq <= after, "validated optimistic read of {pid}: seq {seq} outside committed {before}..={after}");
}

/// Copies the payload with `fix_optimistic` + `read`, checks only if `validate` succeeds.
fn read_optimistic_manual(bm: &BufferManager, pages: &Pages, i: usize, buf: &mut Vec<u8>, pause: bool) -> bool {
    let pid = pages.pids[i];
    let before = pages.committed[i].load(Ordering::Acquire);
    let o = bm.fix_optimistic(pid).unwrap_or_else(|e| panic!("fix_optimistic({pid}): {e}"));
    buf.resize(o.len(), 0);
    if pause {
        // Copy in two halves with a pause between them: a wider window for writers,
        // evictions and reloads to interleave with the read (which must then not validate).
        let half = buf.len() / 2 / 8 * 8;
        o.read(0, &mut buf[..half]);
        thread::yield_now();
        o.read(half, &mut buf[half..]);
    } else {
        o.read(0, buf);
    }
    if !o.validate() {
        return false;
    }
    let after = pages.committed[i].load(Ordering::Acquire);
    check_validated(pid, buf, before, after);
    true
}

/// The same through `read_optimistic` (which retries and falls back to a shared latch).
fn read_optimistic_closure(bm: &BufferManager, pages: &Pages, i: usize) {
    let pid = pages.pids[i];
    let before = pages.committed[i].load(Ordering::Acquire);
    let data = bm
        .read_optimistic(pid, |o| {
            let mut buf = vec![0u8; o.len()];
            o.read(0, &mut buf);
            Ok(buf)
        })
        .unwrap_or_else(|e| panic!("read_optimistic({pid}): {e}"));
    let after = pages.committed[i].load(Ordering::Acquire);
    check_validated(pid, &data, before, after);
}

/// Scratch pages a worker owns: temporary pages (and, sometimes, persistent ones) that it
/// allocates, rewrites, checks and frees while the others work.
struct Scratch {
    pages: Vec<(PageId, u64)>,
}

impl Scratch {
    const MAX: usize = 3;

    fn op(&mut self, bm: &BufferManager, rng: &mut Rng) {
        let r = rng.below(10);
        if self.pages.is_empty() || (r < 3 && self.pages.len() < Self::MAX) {
            let size = [4064, 8160, 16352, 65504][rng.below(4)];
            let temp = rng.below(4) != 0;
            let mut g = if temp { bm.alloc_temp(size) } else { bm.alloc(size) }.unwrap_or_else(|e| panic!("alloc (temp {temp}): {e}"));
            assert!(g.data().iter().all(|&b| b == 0), "fresh page {} is not zeroed", g.pid());
            let pid = g.pid();
            fill(&mut g, pid, 1);
            self.pages.push((pid, 1));
            return;
        }
        let k = rng.below(self.pages.len());
        let (pid, seq) = self.pages[k];
        match r {
            3..=5 => {
                let mut g = bm.fix_exclusive(pid).unwrap_or_else(|e| panic!("fix_exclusive(scratch {pid}): {e}"));
                let got = consistent(pid, g.data()).unwrap_or_else(|e| panic!("scratch {pid}: {e}"));
                assert_eq!(got, seq, "scratch {pid} lost a write");
                if let Some(d) = g.data_mut() {
                    // Temporary pages also take plain byte writes.
                    for i in 2..d.len() / 8 {
                        d[8 * i..8 * i + 8].copy_from_slice(&word(pid, seq + 1, i).to_le_bytes());
                    }
                    d[8..16].copy_from_slice(&(seq + 1).to_le_bytes());
                } else {
                    assert!(!pid.is_temp());
                    fill(&mut g, pid, seq + 1);
                }
                self.pages[k].1 = seq + 1;
            }
            6 | 7 => {
                let g = bm.fix_shared(pid).unwrap_or_else(|e| panic!("fix_shared(scratch {pid}): {e}"));
                let got = consistent(pid, g.data()).unwrap_or_else(|e| panic!("scratch {pid}: {e}"));
                assert_eq!(got, seq, "scratch {pid} lost a write");
            }
            _ => {
                if rng.below(2) == 0 {
                    bm.free(pid).unwrap_or_else(|e| panic!("free(scratch {pid}): {e}"));
                } else {
                    bm.fix_exclusive(pid).unwrap().free().unwrap_or_else(|e| panic!("guard free(scratch {pid}): {e}"));
                }
                // (Whether the freed id is still fixable is not checked here: another worker
                // may already have been handed the same id. The model test checks it.)
                self.pages.swap_remove(k);
            }
        }
    }

    fn free_all(&mut self, bm: &BufferManager) {
        for (pid, _) in self.pages.drain(..) {
            bm.free(pid).unwrap();
        }
    }
}

struct Run {
    /// Page files through pread/pwrite instead of the default backend (io_uring where the
    /// kernel allows it).
    posix: bool,
    /// A background cleaner thread runs alongside the workers.
    cleaner: bool,
    scratch: bool,
    /// Pool sizes worker 0 cycles through (empty: the pool stays fixed).
    resizes: &'static [u64],
    /// Loads take the frames of evicted pages (`Config::frame_recycling`).
    recycle: bool,
    /// Partitions of the resident set and clock (`Config::clock_partitions`; `None`: the
    /// default).
    partitions: Option<usize>,
}

fn worker(bm: &BufferManager, pages: &Pages, cap: &Cap, run: &Run, id: usize, ops: usize) -> Tally {
    let mut rng = Rng::new(0x5EED + id as u64);
    let mut t = Tally::default();
    let mut buf = Vec::new();
    let mut scratch = Scratch { pages: Vec::new() };
    for n in 0..ops {
        // Worker 0 also resizes the pool and checkpoints, holding no guard.
        if id == 0 && !run.resizes.is_empty() && n % 250 == 125 {
            cap.resize(bm, run.resizes[(n / 250) % run.resizes.len()]);
        }
        if id == 0 && run.scratch && n % 1000 == 500 {
            bm.checkpoint().unwrap_or_else(|e| panic!("concurrent checkpoint: {e}"));
        }
        let r = rng.below(100);
        if run.scratch && r >= 85 {
            scratch.op(bm, &mut rng);
            t.temp_ops += 1;
            continue;
        }
        let i = pages.pick(&mut rng);
        match r {
            0..=19 => {
                write_page(bm, pages, i, rng.below(4) == 0);
                t.writes += 1;
            }
            20..=27 => {
                if upgrade_write(bm, pages, i) {
                    t.writes += 1;
                } else {
                    t.upgrades_failed += 1;
                }
            }
            28..=49 => {
                read_shared(bm, pages, i);
                t.shared += 1;
            }
            50..=52 => {
                // Prefetch a run of adjacent pages and a few scattered ones (several reads
                // in one batch) while others write and evict them, then read some.
                let run = rng.below(pages.pids.len() - 8);
                let mut batch: Vec<PageId> = pages.pids[run..run + 8].to_vec();
                batch.extend((0..8).map(|_| pages.pids[rng.below(pages.pids.len())]));
                t.prefetched += bm.prefetch(&batch) as u64;
                read_shared(bm, pages, run);
                read_shared(bm, pages, i);
                t.shared += 2;
            }
            53..=72 => {
                if read_optimistic_manual(bm, pages, i, &mut buf, r.is_multiple_of(2)) {
                    t.optimistic_valid += 1;
                } else {
                    t.optimistic_invalid += 1;
                }
            }
            _ => {
                read_optimistic_closure(bm, pages, i);
                t.optimistic_valid += 1;
            }
        }
    }
    scratch.free_all(bm);
    t
}

fn stress(run: Run) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    // io_uring where the kernel allows it (`STRATA_IO=posix`: pread/pwrite).
    let inner = if run.posix { Arc::new(FileBackend::default()) } else { strata::buffer::default_backend() };
    let backend: Arc<dyn StorageBackend> = Arc::new(NoSync(inner));
    let config = || {
        let c = Config::new(&db).min_page(MIN_PAGE).pool_size(POOL).backend(backend.clone()).frame_recycling(if run.recycle { Some(0) } else { None });
        match run.partitions {
            // A longer pin wait than the default second: on a loaded machine four workers
            // may hold every frame of this tiny pool for a while (as 64 KiB pages, a 400 KiB
            // pool holds six), and lost memory, which these runs are after, never comes back.
            Some(n) => c.clock_partitions(n).pin_wait(std::time::Duration::from_secs(10)),
            None => c,
        }
    };
    let shared = Arc::new(BufferManager::create(config()).unwrap());
    let bm = &*shared;
    let pages = Pages::create(bm);
    bm.checkpoint().unwrap();
    let writes_before: u64 = pages.committed.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    let evictions_before = bm.stats().evictions;

    let ops = ops_per_worker();
    let cap = Cap::new(POOL);
    let cleaner = run.cleaner.then(|| Cleaner::start(shared.clone(), CleanerOptions { target: Some(POOL / 8), ..Default::default() }).unwrap());
    let running = AtomicUsize::new(WORKERS);
    let (tallies, samples) = thread::scope(|s| {
        let mon = s.spawn(|| monitor(bm, &cap, &running));
        let handles: Vec<_> = (0..WORKERS)
            .map(|id| {
                let (bm, pages, cap, run, running) = (&bm, &pages, &cap, &run, &running);
                s.spawn(move || {
                    let _r = Running(running);
                    worker(bm, pages, cap, run, id, ops)
                })
            })
            .collect();
        let tallies: Vec<Tally> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (tallies, mon.join().unwrap())
    });

    // Every committed write is in exactly one counter increment.
    let writes: u64 = tallies.iter().map(|t| t.writes).sum();
    let writes_after: u64 = pages.committed.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    assert_eq!(writes_after - writes_before, writes, "committed counters vs. writes done");
    pages.verify_all(bm);
    bm.check_invariants().unwrap();
    let st = bm.stats();
    let max_pool = cap.max.load(Ordering::Relaxed);
    assert!(bm.used_bytes() <= bm.pool_size());
    assert!(st.peak_resident_bytes <= max_pool, "peak {} > largest pool {max_pool}", st.peak_resident_bytes);
    assert!(st.evictions > evictions_before, "no evictions during the run: {st:?}");
    assert!(samples > 0);
    let reads: u64 = tallies.iter().map(|t| t.shared + t.optimistic_valid).sum();
    assert!(writes > 0 && reads > 0);
    let prefetched: u64 = tallies.iter().map(|t| t.prefetched).sum();
    assert!(prefetched > 0 && st.prefetch_hits + st.prefetch_wasted <= st.pages_prefetched, "{st:?}");
    if run.recycle {
        // Where the kernel has the mechanism, loads must have used it; elsewhere the run
        // checked the fallback (recycling off) and says why.
        if st.frame_recycling == "uffd-move" {
            assert!(st.frames_recycled > 0, "no load took an evicted frame: {st:?}");
        } else {
            eprintln!("stress: frame recycling unavailable here: {}", st.frame_recycling);
        }
        eprintln!("stress: {} frames recycled, {} moves failed, {} bytes stashed at the end", st.frames_recycled, st.frame_moves_failed, st.stashed_bytes);
    } else {
        assert_eq!((st.frames_recycled, st.stashed_bytes), (0, 0), "recycling is off: {st:?}");
    }
    eprintln!(
        "stress: {} ops/worker, {writes} writes, {reads} reads, {} invalid optimistic reads, {} failed upgrades, {} scratch ops, {} pages prefetched ({} used, {} wasted), {samples} monitor samples, {} evictions, hits {} misses {}",
        ops,
        tallies.iter().map(|t| t.optimistic_invalid).sum::<u64>(),
        tallies.iter().map(|t| t.upgrades_failed).sum::<u64>(),
        tallies.iter().map(|t| t.temp_ops).sum::<u64>(),
        tallies.iter().map(|t| t.prefetched).sum::<u64>(),
        st.prefetch_hits,
        st.prefetch_wasted,
        st.evictions - evictions_before,
        st.hits,
        st.misses,
    );

    // Everything committed survives close and reopen; no scratch page is left. (Rewrite
    // some pages first: after `verify_all` every resident page is clean, and the close's
    // checkpoint would have nothing to do.)
    for i in (0..pages.pids.len()).step_by(7) {
        write_page(bm, &pages, i, false);
    }
    if let Some(c) = cleaner {
        // Its own thread: bounded time to have cleaned something if it was never scheduled
        // during the run (the pages just rewritten are dirty).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while c.stats().pages_cleaned == 0 && std::time::Instant::now() < deadline {
            thread::sleep(std::time::Duration::from_millis(10));
        }
        let cs = c.stop();
        assert!(cs.pages_cleaned > 0 && cs.errors == 0, "the cleaner wrote pages ahead of the clock: {cs:?}");
        eprintln!("stress: cleaner {cs:?}, {} dirty victims written by evictions", st.dirty_victims);
    }
    Arc::try_unwrap(shared).ok().expect("nothing else holds the manager").close().unwrap();
    let bm = BufferManager::open(config()).unwrap();
    assert_eq!(bm.allocated_pages().len(), pages.pids.len(), "scratch pages were all freed");
    pages.verify_all(&bm);
    bm.check_invariants().unwrap();
    bm.close().unwrap();
}

#[test]
fn readers_and_writers_with_a_tenth_of_the_data_in_memory() {
    stress(Run { posix: false, cleaner: false, scratch: false, resizes: &[], recycle: false, partitions: None });
}

#[test]
fn readers_and_writers_on_pread_with_a_background_cleaner() {
    stress(Run { posix: true, cleaner: true, scratch: false, resizes: &[], recycle: false, partitions: None });
}

#[test]
fn with_scratch_pages_checkpoints_pool_resizes_and_a_cleaner() {
    stress(Run {
        posix: false,
        cleaner: true,
        scratch: true,
        resizes: &[400 << 10, 640 << 10, 448 << 10, 512 << 10, 384 << 10, 576 << 10],
        recycle: false,
        partitions: None,
    });
}

/// The first run, with loads taking the frames of evicted pages through the stash (and
/// optimistic readers racing with frames moved away under them).
#[test]
fn readers_and_writers_recycling_frames() {
    stress(Run { posix: false, cleaner: false, scratch: false, resizes: &[], recycle: true, partitions: None });
}

/// Scratch pages, checkpoints, resizes (a shrink drains the stash) and a cleaner, with
/// frame recycling.
#[test]
fn recycling_frames_with_scratch_pages_checkpoints_and_pool_resizes() {
    stress(Run {
        posix: false,
        cleaner: true,
        scratch: true,
        resizes: &[400 << 10, 640 << 10, 448 << 10, 512 << 10, 384 << 10, 576 << 10],
        recycle: true,
        partitions: None,
    });
}

/// Pool sizes that grow the resident set (up to 1 MiB, 256 pages of 4 KiB: twice what every
/// partition count below starts with room for) and shrink the pool again, while the others
/// work.
const GROWING: &[u64] = &[1 << 20, 400 << 10, 768 << 10, 448 << 10, 1 << 20, 384 << 10];

/// The resident set and clock in one partition, with resizes that grow the set while the
/// workers load and evict, scratch pages, checkpoints and a cleaner (which looks ahead of
/// every partition's hand).
#[test]
fn one_clock_partition_with_growing_resizes_and_a_cleaner() {
    stress(Run { posix: false, cleaner: true, scratch: true, resizes: GROWING, recycle: false, partitions: Some(1) });
}

/// As above, in two partitions.
#[test]
fn two_clock_partitions_with_growing_resizes_and_a_cleaner() {
    stress(Run { posix: false, cleaner: true, scratch: true, resizes: GROWING, recycle: false, partitions: Some(2) });
}

/// As above, in eight partitions (more than the workers: evictors move on across
/// partitions that their threads do not start in), with frame recycling; up to 2 MiB, as
/// eight partitions start with 64 slots each, room for 1 MiB of 4 KiB pages.
#[test]
fn eight_clock_partitions_with_growing_resizes_and_recycling() {
    stress(Run { posix: false, cleaner: false, scratch: true, resizes: &[2 << 20, 448 << 10, 1 << 20, 384 << 10], recycle: true, partitions: Some(8) });
}

/// With every page that fits pinned, a load is OutOfMemory whatever partition its thread
/// starts in; once one pinned page (in whatever partition) is unpinned, a load from any
/// thread finds it: the clock's bound (two laps) holds over all partitions.
#[test]
fn everything_pinned_is_out_of_memory_over_all_partitions() {
    for parts in [1usize, 2, 8] {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        let backend: Arc<dyn StorageBackend> = Arc::new(NoSync(Arc::new(FileBackend { buffered_only: true })));
        let pool = 128u64 << 10;
        let config =
            Config::new(&db).min_page(MIN_PAGE).pool_size(pool).backend(backend).clock_partitions(parts).pin_wait(std::time::Duration::from_millis(20));
        let bm = BufferManager::create(config).unwrap();
        assert_eq!(bm.clock_partitions(), parts);
        let pids: Vec<PageId> = (0..64).map(|_| bm.alloc(100).unwrap().pid()).collect();
        bm.checkpoint().unwrap();
        let mut guards = Vec::new();
        let mut next = 0;
        while next < pids.len() {
            match bm.fix_shared(pids[next]) {
                Ok(g) => guards.push(g),
                Err(strata::Error::OutOfMemory { .. }) => break,
                Err(e) => panic!("{e}"),
            }
            next += 1;
        }
        assert!(next < pids.len() && guards.len() > 2, "{parts} partitions: {} pages pinned", guards.len());
        // Several threads (several home partitions): each finds everything pinned.
        thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| assert!(matches!(bm.fix_shared(pids[next]), Err(strata::Error::OutOfMemory { .. }))));
            }
        });
        // Unpin pages one at a time; each time a load from a fresh thread succeeds.
        for round in 0..guards.len().min(8) {
            let g = guards.swap_remove(round * 7 % guards.len());
            drop(g);
            let pid = pids[next];
            let ok = thread::scope(|s| s.spawn(|| bm.fix_shared(pid).map(drop)).join().unwrap());
            ok.unwrap_or_else(|e| panic!("{parts} partitions, round {round}: one page unpinned, yet {e}"));
            // It is resident (unpinned) now; pin it, so the next round needs another victim.
            guards.push(bm.fix_shared(pid).unwrap());
            next += 1;
        }
        drop(guards);
        bm.check_invariants().unwrap();
        bm.close().unwrap();
    }
}

/// Shrinks and grows the pool in a tight loop while three threads keep loading pages (each
/// load reserves budget): once `set_pool_size(smaller)` has returned, no reservation that
/// saw the old cap may still push `used_bytes()` above the new one.
#[test]
fn shrinking_the_pool_races_with_loads() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let (big, small) = (512u64 << 10, 256u64 << 10);
    let backend: Arc<dyn StorageBackend> = Arc::new(NoSync(Arc::new(FileBackend { buffered_only: true })));
    let bm = BufferManager::create(Config::new(&db).min_page(MIN_PAGE).pool_size(big).backend(backend)).unwrap();
    let pids: Vec<PageId> = (0..1024)
        .map(|_| {
            let mut g = bm.alloc(100).unwrap();
            let pid = g.pid();
            fill(&mut g, pid, 1);
            pid
        })
        .collect();
    bm.checkpoint().unwrap();
    let cycles = ops_per_worker() * 200;
    let done = AtomicBool::new(false);
    let alive = AtomicUsize::new(3);
    thread::scope(|s| {
        for t in 0..3u64 {
            let (bm, pids, done, alive) = (&bm, &pids, &done, &alive);
            s.spawn(move || {
                let _alive = Running(alive);
                let mut rng = Rng::new(t);
                let mut n = 0u64;
                while !done.load(Ordering::Relaxed) {
                    let pid = pids[rng.below(pids.len())];
                    let g = bm.fix_shared(pid).unwrap();
                    // (Checking every load would slow the loaders down and narrow the race.)
                    if n.is_multiple_of(64) {
                        assert_eq!(consistent(pid, g.data()), Ok(1));
                    }
                    n += 1;
                }
            });
        }
        let _stop = StopOnDrop(&done); // stops the loaders, also if an assertion fails
        for _ in 0..cycles {
            bm.set_pool_size(big).unwrap();
            bm.set_pool_size(small).unwrap();
            let used = bm.used_bytes();
            assert!(used <= small, "used {used} > {small} after set_pool_size({small}) returned");
        }
    });
    bm.check_invariants().unwrap();
    assert!(bm.stats().peak_resident_bytes <= big);
}
