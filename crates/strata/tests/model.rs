//! Model test: random operation sequences against the buffer manager and an in-memory model
//! of every live page's payload, with a pool far smaller than the data.
//!
//! Every case allocates persistent and temporary pages of several size classes (4 KiB ..
//! 64 KiB pages, 4 KiB smallest page) well beyond the pool (192..384 KiB), then runs a
//! random mix of writes (`write`, `write_u64`, `zero`, `data_mut` on temporary pages,
//! optimistic upgrade, downgrade), reads through all three fix paths (temporary pages: no
//! optimistic reads, which must be refused), an optimistic guard kept across the page's
//! eviction and reload, frees (after which the id must not be fixable or freeable),
//! checkpoints, close/drop + reopen (temporary pages are gone, persistent contents and the
//! allocation table survive) and pool resizes (which must succeed: no guard is held). After
//! every operation it checks the cap (`used_bytes() <= pool_size()`), `check_invariants()`
//! and the peak against the largest pool this manager instance ever had. Each case ends
//! with a full comparison, a close and a reopen, and a full comparison again.
//!
//! The default case count is proptest's (256); `PROPTEST_CASES=n` changes it.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use strata::storage::backend::OpenMode;
use strata::storage::{FileBackend, IoBufMut, ReadReq, StorageBackend, StorageFile};
use strata::{BufferManager, Config, Error, PageId, PAGE_HEADER_SIZE};

const MIN_PAGE: u64 = 4096;
/// Largest page the test allocates: 64 KiB (payload 65504 bytes).
const MAX_PAYLOAD: usize = (16 * MIN_PAGE) as usize - PAGE_HEADER_SIZE;
/// Pool sizes the test uses: 192..=384 KiB. The lower bound leaves room for the manager's
/// metadata (up to ten spaces of state words, about 42 KiB, plus the resident set) and two
/// pinned 64 KiB pages.
const POOL_MIN_4K: u64 = 48;
const POOL_MAX_4K: u64 = 96;
const PIN_WAIT: Duration = Duration::from_millis(200);

/// Picks an element of a collection: `n % len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pick(usize);

impl Pick {
    fn of(&self, len: usize) -> usize {
        self.0 % len
    }
}

impl Arbitrary for Pick {
    type Parameters = ();
    type Strategy = prop::strategy::Map<prop::num::usize::Any, fn(usize) -> Pick>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        any::<usize>().prop_map(Pick)
    }
}

/// The real filesystem backend minus the fsyncs: this test checks contents across
/// close/reopen, not crash durability, and fsync would dominate its run time. Some cases use
/// O_DIRECT page I/O as in production (through io_uring where the kernel allows it, or
/// through pread/pwrite), the rest buffered I/O (much faster on slow disks); the buffer
/// manager above the file layer is the same.
#[derive(Debug)]
struct NoSync(Arc<dyn StorageBackend>);

#[derive(Debug)]
struct NoSyncFile(Arc<dyn StorageFile>);

impl StorageFile for NoSyncFile {
    fn read_at(&self, dst: IoBufMut<'_>, offset: u64) -> io::Result<usize> {
        self.0.read_at(dst, offset)
    }
    fn write_at(&self, src: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_at(src, offset)
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    fn read_many(&self, reqs: &mut [ReadReq<'_>]) -> io::Result<()> {
        self.0.read_many(reqs)
    }
    fn queue_depth(&self) -> usize {
        self.0.queue_depth()
    }
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn is_direct(&self) -> bool {
        self.0.is_direct()
    }
    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl StorageBackend for NoSync {
    fn open(&self, path: &Path, mode: OpenMode, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        Ok(Arc::new(NoSyncFile(self.0.open(path, mode, create)?)))
    }
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.0.read_file(path)
    }
    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let tmp = strata::storage::atomic_write_temp(path);
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.0.remove(path)
    }
    fn exists(&self, path: &Path) -> bool {
        self.0.exists(path)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.0.create_dir_all(path)
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        self.0.list_dir(path)
    }
    fn sync_dir(&self, _path: &Path) -> io::Result<()> {
        Ok(())
    }
    fn io_name(&self) -> String {
        self.0.io_name()
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        bytes: usize,
        temp: bool,
        seed: u64,
    },
    Write {
        page: Pick,
        at: Pick,
        len: usize,
        seed: u64,
    },
    WriteU64 {
        page: Pick,
        word: Pick,
        value: u64,
    },
    Zero {
        page: Pick,
    },
    /// Optimistic read of one word, then upgrade (must succeed: single thread) and write.
    UpgradeWrite {
        page: Pick,
        word: Pick,
        value: u64,
    },
    /// Exclusive write, downgrade, compare under the shared latch.
    DowngradeWrite {
        page: Pick,
        at: Pick,
        len: usize,
        seed: u64,
    },
    /// fix_shared, fix_exclusive and read_optimistic, each compared with the model.
    Read {
        page: Pick,
    },
    /// An optimistic guard on one page is kept while other pages are read until that page
    /// is evicted; its frame is copied while not resident, the page is loaded again, and
    /// the guard must then not validate (or, if it does, the copy must be right).
    OptimisticAcrossEviction {
        page: Pick,
    },
    /// Two shared latches held at once (both pinned while the second one is loaded).
    ReadPair {
        a: Pick,
        b: Pick,
    },
    Free {
        page: Pick,
        via_guard: bool,
    },
    /// A freed (or forgotten temporary) id must not be fixable.
    FixStale {
        page: Pick,
    },
    Checkpoint,
    /// `prefetch` of `n` pages in id order from a picked one (adjacent runs coalesce; temp,
    /// resident and freed ids are skipped), then the first and last compared with the model.
    Prefetch {
        from: Pick,
        n: usize,
    },
    /// `close` (or a plain drop when `!clean`) and open again with `pool`.
    Reopen {
        pool: u64,
        clean: bool,
    },
    SetPool {
        pool: u64,
    },
}

fn pool_size() -> impl Strategy<Value = u64> {
    (POOL_MIN_4K..=POOL_MAX_4K).prop_map(|k| k * 4096)
}

/// Payload sizes spread over the classes 4, 8, 16, 32 and 64 KiB (biased to big pages so
/// the data outgrows the pool quickly).
fn payload_size() -> impl Strategy<Value = usize> {
    prop_oneof![
        2 => 1usize..=200,
        2 => 201usize..=4064,
        2 => 4065usize..=8160,
        2 => 8161usize..=16352,
        1 => 16353usize..=32736,
        2 => 32737usize..=MAX_PAYLOAD,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (payload_size(), any::<bool>(), any::<u64>()).prop_map(|(bytes, temp, seed)| Op::Alloc { bytes, temp, seed }),
        6 => (any::<Pick>(), any::<Pick>(), 1usize..=6000, any::<u64>()).prop_map(|(page, at, len, seed)| Op::Write { page, at, len, seed }),
        3 => (any::<Pick>(), any::<Pick>(), any::<u64>()).prop_map(|(page, word, value)| Op::WriteU64 { page, word, value }),
        1 => any::<Pick>().prop_map(|page| Op::Zero { page }),
        2 => (any::<Pick>(), any::<Pick>(), any::<u64>()).prop_map(|(page, word, value)| Op::UpgradeWrite { page, word, value }),
        2 => (any::<Pick>(), any::<Pick>(), 1usize..=3000, any::<u64>()).prop_map(|(page, at, len, seed)| Op::DowngradeWrite { page, at, len, seed }),
        6 => any::<Pick>().prop_map(|page| Op::Read { page }),
        2 => (any::<Pick>(), any::<Pick>()).prop_map(|(a, b)| Op::ReadPair { a, b }),
        1 => any::<Pick>().prop_map(|page| Op::OptimisticAcrossEviction { page }),
        3 => (any::<Pick>(), any::<bool>()).prop_map(|(page, via_guard)| Op::Free { page, via_guard }),
        1 => any::<Pick>().prop_map(|page| Op::FixStale { page }),
        1 => Just(Op::Checkpoint),
        2 => (any::<Pick>(), 1usize..=24).prop_map(|(from, n)| Op::Prefetch { from, n }),
        1 => (pool_size(), any::<bool>()).prop_map(|(pool, clean)| Op::Reopen { pool, clean }),
        2 => pool_size().prop_map(|pool| Op::SetPool { pool }),
    ]
}

/// Deterministic bytes from a seed (splitmix64).
fn bytes_from(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Payload length of the smallest class whose pages hold `bytes` payload bytes.
fn expected_payload(bytes: usize) -> usize {
    let total = (bytes + PAGE_HEADER_SIZE).next_power_of_two().max(MIN_PAGE as usize);
    total - PAGE_HEADER_SIZE
}

struct Harness<'d> {
    db: &'d Path,
    backend: Arc<dyn StorageBackend>,
    bm: Option<BufferManager>,
    /// Live pages and their expected payloads.
    model: BTreeMap<PageId, Vec<u8>>,
    /// Ids that are not allocated now (freed, or temporary pages of an earlier session).
    stale: BTreeSet<PageId>,
    /// Largest pool this manager instance ever had (bounds its peak).
    max_pool: u64,
}

fn payload_eq(what: &str, pid: PageId, got: &[u8], want: &[u8]) {
    if got != want {
        let first = got.iter().zip(want).position(|(a, b)| a != b);
        panic!("{what}: payload of {pid} differs from the model (lengths {} / {}, first difference at {first:?})", got.len(), want.len());
    }
}

impl<'d> Harness<'d> {
    fn bm(&self) -> &BufferManager {
        self.bm.as_ref().unwrap()
    }

    fn config(&self, pool: u64) -> Config {
        Config::new(self.db).min_page(MIN_PAGE).pool_size(pool).pin_wait(PIN_WAIT).backend(self.backend.clone())
    }

    fn pick(&self, i: &Pick) -> Option<PageId> {
        if self.model.is_empty() {
            return None;
        }
        self.model.keys().nth(i.of(self.model.len())).copied()
    }

    fn check_cap(&self, after: &dyn std::fmt::Debug) {
        let bm = self.bm();
        let (used, pool) = (bm.used_bytes(), bm.pool_size());
        assert!(used <= pool, "after {after:?}: used {used} > pool {pool}");
        if let Err(e) = bm.check_invariants() {
            panic!("after {after:?}: {e}");
        }
        assert!(bm.peak_bytes() <= self.max_pool, "after {after:?}: peak {} > largest pool {}", bm.peak_bytes(), self.max_pool);
    }

    fn verify_page(&self, pid: PageId) {
        let bm = self.bm();
        let want = &self.model[&pid];
        {
            let g = bm.fix_shared(pid).unwrap_or_else(|e| panic!("fix_shared({pid}): {e}"));
            assert_eq!(g.pid(), pid);
            payload_eq("fix_shared", pid, g.data(), want);
        }
        {
            let g = bm.fix_exclusive(pid).unwrap_or_else(|e| panic!("fix_exclusive({pid}): {e}"));
            assert_eq!(g.pid(), pid);
            payload_eq("fix_exclusive", pid, g.data(), want);
        }
        if pid.is_temp() {
            // Temporary pages are private to their owner: no optimistic reads.
            match bm.read_optimistic(pid, |o| Ok(o.read_u64(0))) {
                Err(Error::InvalidPageId { .. }) => {}
                Err(e) => panic!("read_optimistic of temporary {pid}: unexpected error {e}"),
                Ok(_) => panic!("read_optimistic of temporary {pid} succeeded"),
            }
            return;
        }
        let got = bm
            .read_optimistic(pid, |o| {
                let mut buf = vec![0u8; o.len()];
                o.read(0, &mut buf);
                Ok(buf)
            })
            .unwrap_or_else(|e| panic!("read_optimistic({pid}): {e}"));
        payload_eq("read_optimistic", pid, &got, want);
        let w = (want.len() / 8 - 1) / 2 * 8;
        let v = bm.read_optimistic(pid, |o| Ok(o.read_u64(w))).unwrap();
        assert_eq!(v, u64::from_le_bytes(want[w..w + 8].try_into().unwrap()), "read_u64 of {pid} at {w}");
    }

    fn assert_unfixable(&self, pid: PageId) {
        let bm = self.bm();
        assert!(!bm.is_allocated(pid), "{pid} should not be allocated");
        match bm.fix_shared(pid) {
            Err(Error::InvalidPageId { .. }) => {}
            Err(e) => panic!("fix_shared of stale {pid}: unexpected error {e}"),
            Ok(_) => panic!("fix_shared of stale {pid} succeeded"),
        }
        match bm.fix_exclusive(pid) {
            Err(Error::InvalidPageId { .. }) => {}
            Err(e) => panic!("fix_exclusive of stale {pid}: unexpected error {e}"),
            Ok(_) => panic!("fix_exclusive of stale {pid} succeeded"),
        }
        match bm.read_optimistic(pid, |o| Ok(o.read_u64(0))) {
            Err(Error::InvalidPageId { .. }) => {}
            Err(e) => panic!("read_optimistic of stale {pid}: unexpected error {e}"),
            Ok(_) => panic!("read_optimistic of stale {pid} succeeded"),
        }
        match bm.free(pid) {
            Err(Error::InvalidPageId { .. }) => {}
            Err(e) => panic!("double free of {pid}: unexpected error {e}"),
            Ok(()) => panic!("double free of {pid} succeeded"),
        }
    }

    fn alloc(&mut self, bytes: usize, temp: bool, seed: u64) {
        let bm = self.bm.as_ref().unwrap();
        let mut g = if temp { bm.alloc_temp(bytes) } else { bm.alloc(bytes) }.unwrap_or_else(|e| panic!("alloc({bytes}, temp={temp}): {e}"));
        let pid = g.pid();
        assert_eq!(pid.is_temp(), temp);
        let len = expected_payload(bytes);
        assert_eq!(g.len(), len, "payload of a page for {bytes} bytes");
        assert!(g.data().iter().all(|&b| b == 0), "fresh page {pid} is not zeroed");
        // Fill the requested bytes (what a user would store).
        let fill = bytes_from(seed, bytes);
        g.write(0, &fill);
        drop(g);
        let mut want = vec![0u8; len];
        want[..bytes].copy_from_slice(&fill);
        assert!(self.model.insert(pid, want).is_none(), "alloc returned the live id {pid}");
        self.stale.remove(&pid);
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Alloc { bytes, temp, seed } => self.alloc(*bytes, *temp, *seed),
            Op::Write { page, at, len, seed } => {
                let Some(pid) = self.pick(page) else { return };
                let want = self.model.get_mut(&pid).unwrap();
                let at = at.of(want.len());
                let len = (*len).min(want.len() - at);
                let src = bytes_from(*seed, len);
                let mut g = self.bm.as_ref().unwrap().fix_exclusive(pid).unwrap();
                match g.data_mut() {
                    // Temporary pages also offer a plain `&mut [u8]`.
                    Some(d) if seed % 2 == 1 => d[at..at + len].copy_from_slice(&src),
                    Some(_) => g.write(at, &src),
                    None => {
                        assert!(!pid.is_temp(), "temporary page {pid} offers no &mut [u8]");
                        g.write(at, &src);
                    }
                }
                if !pid.is_temp() {
                    assert!(g.data_mut().is_none(), "persistent page {pid} offers &mut [u8]");
                }
                want[at..at + len].copy_from_slice(&src);
                payload_eq("after write", pid, g.data(), want);
            }
            Op::WriteU64 { page, word, value } => {
                let Some(pid) = self.pick(page) else { return };
                let want = self.model.get_mut(&pid).unwrap();
                let at = word.of(want.len() / 8) * 8;
                let mut g = self.bm.as_ref().unwrap().fix_exclusive(pid).unwrap();
                g.write_u64(at, *value);
                want[at..at + 8].copy_from_slice(&value.to_le_bytes());
                assert_eq!(&g.data()[at..at + 8], &value.to_le_bytes());
            }
            Op::Zero { page } => {
                let Some(pid) = self.pick(page) else { return };
                let mut g = self.bm.as_ref().unwrap().fix_exclusive(pid).unwrap();
                g.zero();
                self.model.get_mut(&pid).unwrap().fill(0);
            }
            Op::UpgradeWrite { page, word, value } => {
                let Some(pid) = self.pick(page) else { return };
                let bm = self.bm.as_ref().unwrap();
                let want = self.model.get_mut(&pid).unwrap();
                let at = word.of(want.len() / 8) * 8;
                if pid.is_temp() {
                    assert!(bm.fix_optimistic(pid).is_err(), "optimistic fix of temporary {pid}");
                    return;
                }
                let o = bm.fix_optimistic(pid).unwrap();
                let old = o.read_u64(at);
                assert!(o.validate(), "optimistic read of {pid} invalid without any other thread");
                assert_eq!(old, u64::from_le_bytes(want[at..at + 8].try_into().unwrap()), "optimistic read_u64 of {pid} at {at}");
                let mut g = o.upgrade().unwrap_or_else(|_| panic!("upgrade of {pid} failed without any other thread"));
                g.write_u64(at, *value);
                want[at..at + 8].copy_from_slice(&value.to_le_bytes());
            }
            Op::DowngradeWrite { page, at, len, seed } => {
                let Some(pid) = self.pick(page) else { return };
                let bm = self.bm.as_ref().unwrap();
                let want = self.model.get_mut(&pid).unwrap();
                let at = at.of(want.len());
                let len = (*len).min(want.len() - at);
                let src = bytes_from(*seed, len);
                let mut g = bm.fix_exclusive(pid).unwrap();
                g.write(at, &src);
                want[at..at + len].copy_from_slice(&src);
                let s = g.downgrade();
                payload_eq("after downgrade", pid, s.data(), want);
                // Another shared latch coexists with the downgraded one.
                let s2 = bm.fix_shared(pid).unwrap();
                payload_eq("second shared latch", pid, s2.data(), want);
            }
            Op::Read { page } => {
                let Some(pid) = self.pick(page) else { return };
                self.verify_page(pid);
            }
            Op::OptimisticAcrossEviction { page } => {
                let Some(pid) = self.pick(page) else { return };
                if pid.is_temp() {
                    return;
                }
                let bm = self.bm();
                let o = bm.fix_optimistic(pid).unwrap();
                for &other in self.model.keys() {
                    if !o.validate() {
                        break; // evicted
                    }
                    if other != pid {
                        drop(bm.fix_shared(other).unwrap());
                    }
                }
                let mut copy = vec![0u8; o.len()];
                o.read(0, &mut copy);
                drop(bm.fix_shared(pid).unwrap()); // loads it again if it was evicted
                if o.validate() {
                    payload_eq("optimistic read validated across an eviction", pid, &copy, &self.model[&pid]);
                }
            }
            Op::Prefetch { from, n } => {
                let Some(first) = self.pick(from) else { return };
                let pids: Vec<PageId> = self.model.range(first..).take(*n).map(|(&p, _)| p).collect();
                let bm = self.bm();
                let loaded = bm.prefetch(&pids);
                assert!(loaded <= pids.len());
                let st = bm.stats();
                assert!(st.prefetch_hits + st.prefetch_wasted <= st.pages_prefetched, "{st:?}");
                for pid in [pids[0], pids[pids.len() - 1]] {
                    self.verify_page(pid);
                }
            }
            Op::ReadPair { a, b } => {
                let (Some(pa), Some(pb)) = (self.pick(a), self.pick(b)) else { return };
                let bm = self.bm();
                let ga = bm.fix_shared(pa).unwrap();
                let gb = bm.fix_shared(pb).unwrap();
                payload_eq("pair a", pa, ga.data(), &self.model[&pa]);
                payload_eq("pair b", pb, gb.data(), &self.model[&pb]);
            }
            Op::Free { page, via_guard } => {
                let Some(pid) = self.pick(page) else { return };
                let bm = self.bm();
                if *via_guard {
                    bm.fix_exclusive(pid).unwrap().free().unwrap_or_else(|e| panic!("guard free of {pid}: {e}"));
                } else {
                    bm.free(pid).unwrap_or_else(|e| panic!("free of {pid}: {e}"));
                }
                self.model.remove(&pid);
                self.stale.insert(pid);
                self.assert_unfixable(pid);
            }
            Op::FixStale { page } => {
                if self.stale.is_empty() {
                    return;
                }
                let pid = *self.stale.iter().nth(page.of(self.stale.len())).unwrap();
                self.assert_unfixable(pid);
            }
            Op::Checkpoint => self.bm().checkpoint().unwrap(),
            Op::Reopen { pool, clean } => {
                let bm = self.bm.take().unwrap();
                if *clean {
                    bm.close().unwrap();
                } else {
                    drop(bm);
                }
                self.bm = Some(BufferManager::open(self.config(*pool)).unwrap_or_else(|e| panic!("reopen: {e}")));
                self.max_pool = *pool;
                let temps: Vec<PageId> = self.model.keys().filter(|p| p.is_temp()).copied().collect();
                for pid in temps {
                    self.model.remove(&pid);
                    self.stale.insert(pid);
                }
                // The allocation table came back exactly.
                let persistent: Vec<PageId> = self.model.keys().copied().collect();
                assert_eq!(self.bm().allocated_pages(), persistent, "allocated pages after reopen");
            }
            Op::SetPool { pool } => {
                let bm = self.bm();
                bm.set_pool_size(*pool).unwrap_or_else(|e| panic!("set_pool_size({pool}) with no guard held: {e}"));
                assert_eq!(bm.pool_size(), *pool);
                assert!(bm.used_bytes() <= *pool);
                self.max_pool = self.max_pool.max(*pool);
            }
        }
    }

    fn verify_all(&self) {
        for &pid in self.model.keys() {
            self.verify_page(pid);
        }
        for &pid in &self.stale {
            self.assert_unfixable(pid);
        }
    }
}

/// How a case's page files do their I/O.
#[derive(Clone, Copy, Debug)]
enum Io {
    /// The default backend: io_uring where the kernel allows it (`STRATA_IO=posix`: pread).
    Default,
    /// `pread`/`pwrite` with O_DIRECT.
    PosixDirect,
    /// `pread`/`pwrite` through the page cache (fast on slow disks).
    Buffered,
}

fn io_kind() -> impl Strategy<Value = Io> {
    prop_oneof![3 => Just(Io::Default), 2 => Just(Io::PosixDirect), 15 => Just(Io::Buffered)]
}

fn run_case(io: Io, pool: u64, initial: &[(usize, bool, u64)], ops: &[Op]) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let mut h = Harness {
        db: &db,
        backend: Arc::new(NoSync(match io {
            Io::Default => strata::buffer::default_backend(),
            Io::PosixDirect => Arc::new(FileBackend::default()),
            Io::Buffered => Arc::new(FileBackend { buffered_only: true }),
        })),
        bm: None,
        model: BTreeMap::new(),
        stale: BTreeSet::new(),
        max_pool: pool,
    };
    h.bm = Some(BufferManager::create(h.config(pool)).unwrap());
    for &(bytes, temp, seed) in initial {
        h.alloc(bytes, temp, seed);
        h.check_cap(&"initial allocation");
    }
    for op in ops {
        h.apply(op);
        h.check_cap(op);
    }
    h.verify_all();
    h.check_cap(&"final comparison");
    // Persistent contents survive a final close and reopen; temporary pages do not.
    h.apply(&Op::Reopen { pool, clean: true });
    h.verify_all();
    h.check_cap(&"final reopen");
    h.bm.take().unwrap().close().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn buffer_manager_matches_model(
        io in io_kind(),
        pool in pool_size(),
        initial in prop::collection::vec((payload_size(), any::<bool>(), any::<u64>()), 16..40),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        run_case(io, pool, &initial, &ops);
    }
}

/// A fixed sequence that always exercises eviction and reload of every class, so the test
/// means something even with `PROPTEST_CASES=1`.
#[test]
fn fixed_sequence_evicts_and_reloads_every_class() {
    let initial: Vec<(usize, bool, u64)> = (0..48).map(|i| ([100, 3000, 8000, 16000, 30000, 60000][i % 6], i % 5 == 0, i as u64)).collect();
    let mut ops = Vec::new();
    for i in 0..48usize {
        ops.push(Op::Write { page: Pick(i * 7), at: Pick(i * 13), len: 5000, seed: i as u64 });
        ops.push(Op::Read { page: Pick(i * 11) });
        if i % 8 == 1 {
            ops.push(Op::OptimisticAcrossEviction { page: Pick(i * 3) });
        }
        if i % 9 == 4 {
            ops.push(Op::Free { page: Pick(i), via_guard: i % 2 == 0 });
        }
        if i % 6 == 2 {
            ops.push(Op::Prefetch { from: Pick(i * 17), n: 12 });
        }
        if i % 16 == 7 {
            ops.push(Op::SetPool { pool: (POOL_MIN_4K + (i as u64 % 3) * 16) * 4096 });
        }
    }
    ops.push(Op::Reopen { pool: POOL_MIN_4K * 4096, clean: false });
    for i in 0..20usize {
        ops.push(Op::Read { page: Pick(i * 5) });
    }
    for io in [Io::Default, Io::PosixDirect] {
        run_case(io, 256 << 10, &initial, &ops);
    }
}
