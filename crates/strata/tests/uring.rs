//! The io_uring storage backend: raw file round trips, `read_many`, the whole buffer manager
//! on it (and on its forced fallback), injected read errors, and concurrent use from several
//! threads (one ring each).
//!
//! Where io_uring is not available the backend falls back to `pread`/`pwrite`; these tests
//! then still pass (they test the fallback) and say so on stderr.
#![cfg(target_os = "linux")]

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use strata::storage::backend::OpenMode;
use strata::storage::{AlignedBuf, FaultyBackend, FileBackend, IoBufMut, PageId, ReadReq, StorageBackend, StorageFile, UringBackend};
use strata::util::SplitMix64;
use strata::{BufferManager, Config, Error};

const PAGE: usize = 4096;

/// Byte `i` of page `p` of the test files.
fn pattern(p: u64, i: usize) -> u8 {
    (p.wrapping_mul(131) ^ (i as u64).wrapping_mul(7) ^ (i as u64 >> 8)) as u8
}

fn backend() -> UringBackend {
    let be = UringBackend::new();
    if let Some(why) = be.fallback_reason() {
        eprintln!("io_uring unavailable here ({why}): testing the fallback");
    }
    be
}

/// Creates a data file of `pages` 4 KiB pages filled with [`pattern`].
fn make_file(be: &dyn StorageBackend, path: &Path, pages: u64) -> Arc<dyn StorageFile> {
    let f = be.open(path, OpenMode::Direct, true).unwrap();
    let chunk_pages = 64u64;
    let mut buf = AlignedBuf::zeroed(chunk_pages as usize * PAGE);
    for first in (0..pages).step_by(chunk_pages as usize) {
        let n = chunk_pages.min(pages - first);
        for p in 0..n {
            for (i, b) in buf.as_mut()[p as usize * PAGE..(p as usize + 1) * PAGE].iter_mut().enumerate() {
                *b = pattern(first + p, i);
            }
        }
        f.write_at(&buf[..n as usize * PAGE], first * PAGE as u64).unwrap();
    }
    f.sync().unwrap();
    f
}

fn check_page_bytes(bytes: &[u8], p: u64) {
    for (i, &b) in bytes.iter().enumerate() {
        assert_eq!(b, pattern(p, i), "byte {i} of page {p}");
    }
}

#[test]
fn raw_round_trip_short_read_at_eof_and_sync() {
    let dir = tempfile::tempdir().unwrap();
    let be = backend();
    let f = be.open(&dir.path().join("x"), OpenMode::Direct, true).unwrap();
    assert!(f.is_direct(), "ext4 and friends take O_DIRECT");
    let mut buf = AlignedBuf::zeroed(8192);
    buf.as_mut()[..5].copy_from_slice(b"hello");
    buf.as_mut()[8191] = 0xEE;
    f.write_at(&buf, 4096).unwrap();
    f.write_at(&buf[..4096], 16384).unwrap();
    f.sync().unwrap();
    assert_eq!(f.len().unwrap(), 20480);
    let mut back = AlignedBuf::zeroed(8192);
    assert_eq!(f.read_at(back.io(), 4096).unwrap(), 8192);
    assert_eq!(&back[..5], b"hello");
    assert_eq!(back[8191], 0xEE);
    // The hole between the writes reads as zeros.
    let mut hole = AlignedBuf::zeroed(4096);
    hole.as_mut().fill(1);
    assert_eq!(f.read_at(hole.io(), 12288).unwrap(), 4096);
    assert!(hole.iter().all(|&b| b == 0));
    // Short read at EOF, and nothing past it.
    let mut tail = AlignedBuf::zeroed(8192);
    assert_eq!(f.read_at(tail.io(), 16384).unwrap(), 4096, "short read at EOF");
    assert_eq!(&tail[..5], b"hello");
    assert_eq!(f.read_at(tail.io(), 20480).unwrap(), 0);
    assert_eq!(f.read_at(tail.io(), 1 << 30).unwrap(), 0);
    // set_len and len are the plain file calls.
    f.set_len(8192).unwrap();
    assert_eq!(f.len().unwrap(), 8192);
    assert_eq!(f.read_at(back.io(), 4096).unwrap(), 4096);
    if be.uses_io_uring() {
        let st = be.stats();
        assert!(st.ring_calls >= 9 && st.posix_calls == 0, "{st:?}");
    }
}

#[test]
fn read_many_of_64_random_pages() {
    let dir = tempfile::tempdir().unwrap();
    let be = backend();
    let pages = 512;
    let f = make_file(&be, &dir.path().join("x"), pages);
    let mut rng = SplitMix64(0x1234_5678_9abc_def1);
    for round in 0..4 {
        let which: Vec<u64> = (0..64).map(|_| rng.below(pages)).collect();
        let mut bufs: Vec<AlignedBuf> = (0..64).map(|_| AlignedBuf::zeroed(PAGE)).collect();
        let mut reqs: Vec<ReadReq<'_>> = bufs.iter_mut().zip(&which).map(|(b, &p)| ReadReq::new(b.io(), p * PAGE as u64)).collect();
        f.read_many(&mut reqs).unwrap();
        for r in &reqs {
            assert_eq!(*r.result.as_ref().unwrap(), PAGE, "round {round}");
        }
        drop(reqs);
        for (b, &p) in bufs.iter().zip(&which) {
            check_page_bytes(b, p);
        }
    }
    // More requests than the ring holds, of mixed lengths: a sliding window.
    let mut bufs: Vec<AlignedBuf> = (0..200).map(|i| AlignedBuf::zeroed(PAGE * (1 + i % 3))).collect();
    let starts: Vec<u64> = (0..200).map(|_| rng.below(pages - 3)).collect();
    let mut reqs: Vec<ReadReq<'_>> = bufs.iter_mut().zip(&starts).map(|(b, &p)| ReadReq::new(b.io(), p * PAGE as u64)).collect();
    f.read_many(&mut reqs).unwrap();
    let lens: Vec<usize> = reqs.iter().map(|r| *r.result.as_ref().unwrap()).collect();
    drop(reqs);
    for ((b, &p), n) in bufs.iter().zip(&starts).zip(lens) {
        assert_eq!(n, b.len());
        for (k, page) in b.chunks(PAGE).enumerate() {
            check_page_bytes(page, p + k as u64);
        }
    }
    // An empty batch is fine.
    f.read_many(&mut []).unwrap();
}

#[test]
fn read_many_beyond_eof_and_misaligned_requests_get_their_own_results() {
    let dir = tempfile::tempdir().unwrap();
    let be = backend();
    let f = make_file(&be, &dir.path().join("x"), 16);
    assert!(f.is_direct());
    let mut a = AlignedBuf::zeroed(PAGE);
    let mut past = AlignedBuf::zeroed(PAGE);
    let mut odd = AlignedBuf::zeroed(PAGE);
    let mut straddle = AlignedBuf::zeroed(2 * PAGE);
    let mut c = AlignedBuf::zeroed(PAGE);
    let mut reqs = vec![
        ReadReq::new(a.io(), 3 * PAGE as u64),
        ReadReq::new(past.io(), 100 * PAGE as u64),
        // Not a multiple of 512: O_DIRECT refuses it.
        ReadReq::new(IoBufMut::from_slice(&mut odd.as_mut()[..1000]), 0),
        ReadReq::new(straddle.io(), 15 * PAGE as u64),
        ReadReq::new(c.io(), 9 * PAGE as u64),
    ];
    let err = f.read_many(&mut reqs).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "the first failure is returned: {err}");
    assert_eq!(*reqs[0].result.as_ref().unwrap(), PAGE);
    assert_eq!(*reqs[1].result.as_ref().unwrap(), 0, "past the end of the file");
    assert_eq!(reqs[2].result.as_ref().unwrap_err().raw_os_error(), Some(libc::EINVAL));
    assert_eq!(*reqs[3].result.as_ref().unwrap(), PAGE, "short at the end of the file");
    assert_eq!(*reqs[4].result.as_ref().unwrap(), PAGE);
    drop(reqs);
    check_page_bytes(&a, 3);
    check_page_bytes(&straddle[..PAGE], 15);
    check_page_bytes(&c, 9);
    assert!(odd.iter().all(|&b| b == 0), "a refused read writes nothing");
    // The same batch without the bad request succeeds as a whole.
    let mut reqs = vec![ReadReq::new(a.io(), 0), ReadReq::new(past.io(), 100 * PAGE as u64)];
    f.read_many(&mut reqs).unwrap();
    assert_eq!(*reqs[1].result.as_ref().unwrap(), 0);
}

#[test]
fn default_read_many_and_faulty_forwarding_agree() {
    let dir = tempfile::tempdir().unwrap();
    let plain = FileBackend::default();
    let f = make_file(&plain, &dir.path().join("x"), 8);
    let faulty = FaultyBackend::new(Arc::new(backend()));
    let g = faulty.open(&dir.path().join("x"), OpenMode::Direct, false).unwrap();
    for file in [&f, &g] {
        let mut a = AlignedBuf::zeroed(PAGE);
        let mut b = AlignedBuf::zeroed(PAGE);
        let mut reqs = [ReadReq::new(a.io(), 7 * PAGE as u64), ReadReq::new(b.io(), 8 * PAGE as u64)];
        file.read_many(&mut reqs).unwrap();
        assert_eq!(*reqs[0].result.as_ref().unwrap(), PAGE);
        assert_eq!(*reqs[1].result.as_ref().unwrap(), 0);
        check_page_bytes(&a, 7);
    }
    faulty.faults.read_errno.store(libc::EIO as u64, Ordering::Relaxed);
    let mut a = AlignedBuf::zeroed(PAGE);
    let mut b = AlignedBuf::zeroed(PAGE);
    let mut reqs = [ReadReq::new(a.io(), 0), ReadReq::new(b.io(), PAGE as u64)];
    assert_eq!(g.read_many(&mut reqs).unwrap_err().raw_os_error(), Some(libc::EIO));
    for r in &reqs {
        assert_eq!(r.result.as_ref().unwrap_err().raw_os_error(), Some(libc::EIO), "read_errno applies to every request");
    }
    faulty.faults.read_errno.store(0, Ordering::Relaxed);
    g.read_many(&mut reqs).unwrap();
    drop(reqs);
    check_page_bytes(&b, 1);
}

#[test]
fn four_threads_read_at_and_read_many_concurrently() {
    let dir = tempfile::tempdir().unwrap();
    let be = Arc::new(backend());
    let pages = 1024;
    let f = make_file(&*be, &dir.path().join("x"), pages);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let f = f.clone();
            std::thread::spawn(move || {
                let mut rng = SplitMix64(0x9e37_79b9_7f4a_7c15 ^ (t + 1));
                let mut one = AlignedBuf::zeroed(PAGE);
                for _ in 0..50 {
                    let p = rng.below(pages);
                    assert_eq!(f.read_at(one.io(), p * PAGE as u64).unwrap(), PAGE);
                    check_page_bytes(&one, p);
                    let which: Vec<u64> = (0..1 + rng.below(40)).map(|_| rng.below(pages)).collect();
                    let mut bufs: Vec<AlignedBuf> = which.iter().map(|_| AlignedBuf::zeroed(PAGE)).collect();
                    let mut reqs: Vec<ReadReq<'_>> = bufs.iter_mut().zip(&which).map(|(b, &p)| ReadReq::new(b.io(), p * PAGE as u64)).collect();
                    f.read_many(&mut reqs).unwrap();
                    assert!(reqs.iter().all(|r| *r.result.as_ref().unwrap() == PAGE));
                    drop(reqs);
                    for (b, &p) in bufs.iter().zip(&which) {
                        check_page_bytes(b, p);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    if be.uses_io_uring() {
        let st = be.stats();
        assert_eq!(st.posix_calls, 0, "every thread got its own ring: {st:?}");
        assert!(st.ring_calls >= 400, "{st:?}");
    }
}

// ------------------------------------------------------------------ the buffer manager

/// Word `k` of the payload of the page filled with `seed`.
fn word(seed: u64, k: usize) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (k as u64).wrapping_mul(1_000_003) ^ 0x5A5A
}

/// Allocates pages of mixed sizes, fills them, closes; reopens with a pool smaller than the
/// data (so pages are evicted and read back) and checks every page, twice.
fn buffer_manager_round_trip(backend: Arc<dyn StorageBackend>) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let sizes = [3000usize, 20_000, 100, 60_000, 4000, 9000];
    let mut pages: Vec<(PageId, usize)> = Vec::new();
    {
        let bm = BufferManager::create(Config::new(&db).min_page(4096).pool_size(2 << 20).backend(backend.clone())).unwrap();
        for i in 0..240usize {
            let mut g = bm.alloc(sizes[i % sizes.len()]).unwrap();
            for k in 0..g.len() / 8 {
                g.write_u64(8 * k, word(i as u64, k));
            }
            pages.push((g.pid(), g.len()));
        }
        assert!(bm.stats().evictions > 0, "the data is larger than the pool");
        bm.close().unwrap();
    }
    let data: usize = pages.iter().map(|p| p.1).sum();
    let pool = 1u64 << 20;
    assert!(data as u64 > 3 * pool, "{data} bytes of pages");
    let bm = BufferManager::open(Config::new(&db).pool_size(pool).backend(backend)).unwrap();
    for pass in 0..2 {
        for (i, &(pid, len)) in pages.iter().enumerate() {
            let g = bm.fix_shared(pid).unwrap_or_else(|e| panic!("pass {pass}: fix {pid}: {e}"));
            assert_eq!(g.len(), len);
            for (k, c) in g.data().chunks_exact(8).enumerate() {
                assert_eq!(u64::from_le_bytes(c.try_into().unwrap()), word(i as u64, k), "pass {pass}: word {k} of page {pid}");
            }
        }
    }
    let st = bm.stats();
    // Loaded one by one or in sequential read-ahead windows (the pages of each class are
    // fixed in index order).
    assert!(st.misses + st.pages_prefetched >= pages.len() as u64 && st.evictions > 0, "{st:?}");
    bm.check_invariants().unwrap();
    bm.close().unwrap();
}

#[test]
fn buffer_manager_on_io_uring() {
    let be = Arc::new(backend());
    buffer_manager_round_trip(be.clone());
    let st = be.stats();
    if be.uses_io_uring() {
        assert!(st.ring_calls >= 100, "page reads and writes went through io_uring: {st:?}");
        assert_eq!(st.posix_calls, 0, "{st:?}");
    }
}

#[test]
fn buffer_manager_on_the_forced_fallback() {
    let be = Arc::new(UringBackend::forced_fallback());
    assert!(!be.uses_io_uring());
    assert!(be.fallback_reason().unwrap().contains("forced"), "{:?}", be.fallback_reason());
    buffer_manager_round_trip(be.clone());
    assert_eq!(be.stats(), Default::default(), "the fallback is a plain FileBackend");
}

#[test]
fn injected_read_error_is_typed_io_and_the_page_reads_once_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let uring = Arc::new(backend());
    let fb = Arc::new(FaultyBackend::new(uring.clone()));
    let faults = fb.faults.clone();
    let mut pids = Vec::new();
    {
        let bm = BufferManager::create(Config::new(&db).min_page(4096).pool_size(1 << 20).backend(fb.clone())).unwrap();
        for i in 0..8u64 {
            let mut g = bm.alloc(4000).unwrap();
            g.write_u64(0, i * 11);
            pids.push(g.pid());
        }
        bm.close().unwrap();
    }
    let bm = BufferManager::open(Config::new(&db).pool_size(1 << 20).backend(fb)).unwrap();
    assert_eq!(bm.fix_shared(pids[0]).unwrap().data()[..8], 0u64.to_le_bytes());
    faults.read_errno.store(libc::EIO as u64, Ordering::Relaxed);
    match bm.fix_shared(pids[3]).map(drop) {
        Err(Error::Io { source, path, .. }) => {
            assert_eq!(source.raw_os_error(), Some(libc::EIO));
            assert!(path.starts_with(&db), "{}", path.display());
        }
        other => panic!("expected Error::Io, got {other:?}"),
    }
    // A resident page does not need the disk.
    assert_eq!(bm.fix_shared(pids[0]).unwrap().data()[..8], 0u64.to_le_bytes());
    faults.read_errno.store(0, Ordering::Relaxed);
    for (i, &p) in pids.iter().enumerate() {
        let g = bm.fix_shared(p).unwrap();
        assert_eq!(g.data()[..8], (i as u64 * 11).to_le_bytes());
    }
    bm.check_invariants().unwrap();
    bm.close().unwrap();
    if uring.uses_io_uring() {
        assert!(uring.stats().ring_calls > 0);
    }
}

#[test]
fn strata_io_posix_in_the_environment_forces_the_fallback() {
    if std::env::var("STRATA_IO_CHILD").is_ok() {
        let be = UringBackend::new();
        assert!(be.fallback_reason().is_some_and(|r| r.contains("STRATA_IO=posix")), "{:?}", be.fallback_reason());
        return;
    }
    // Run this test again in a child process with the variable set (setting it here would
    // race with the other tests' UringBackend::new).
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "strata_io_posix_in_the_environment_forces_the_fallback", "--nocapture"])
        .env("STRATA_IO", "posix")
        .env("STRATA_IO_CHILD", "1")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}
