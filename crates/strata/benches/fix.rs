//! Cost of the buffer manager on resident pages, one thread, against plain memory.
//!
//! * `fix_read8`: fix a resident 64 KiB page and read 8 bytes of it, over 1000 pages visited
//!   in a shuffled order (optimistic through `read_optimistic` and by hand, shared,
//!   exclusive), next to reading 8 bytes at the same positions of a plain `Vec<u8>` of the
//!   same total size (also with each read's address depending on the previous value, so
//!   that the plain reads cannot overlap either). Throughput is in fixes (one element = one
//!   fix + 8-byte read).
//! * `scan_64MiB_in_{1MiB,64KiB}_pages`: sum every u64 word of the payload of 64 MiB of
//!   resident pages (`fix_shared` each page) next to summing the same bytes in a plain
//!   `Vec<u8>` (same summation code) and a `Vec<u64>`.
//!
//! The pool is large enough that nothing is ever evicted. Run with
//! `cargo bench -p strata --bench fix`; `cargo test --benches` runs each entry once.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use strata::{BufferManager, Config, PageId, PAGE_HEADER_SIZE};

const MIN_PAGE: u64 = 64 << 10;
const FIX_PAGES: usize = 1000;
const SCAN_BYTES: u64 = 64 << 20;

/// A small deterministic generator (xorshift64*), so the benchmark needs no extra crate.
struct Rng(u64);

impl Rng {
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

/// Content of word `k` of the payload of page number `p`.
fn word(p: usize, k: usize) -> u64 {
    ((p as u64) << 32) ^ (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Sum of the little-endian u64 words of `b` (whose length is a multiple of 8).
#[inline]
fn sum_words(b: &[u8]) -> u64 {
    b.chunks_exact(8).fold(0u64, |s, c| s.wrapping_add(u64::from_le_bytes(c.try_into().unwrap())))
}

#[inline]
fn read8(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Allocates `n` pages of `page_size` bytes (header included) filled with [`word`]s and
/// returns their ids together with a plain copy of all their payloads, back to back.
fn fill_pages(bm: &BufferManager, n: usize, page_size: u64) -> (Vec<PageId>, Vec<u8>) {
    let payload = page_size as usize - PAGE_HEADER_SIZE;
    let mut plain = Vec::with_capacity(n * payload);
    let mut page = vec![0u8; payload];
    let pids = (0..n)
        .map(|p| {
            for (k, c) in page.chunks_exact_mut(8).enumerate() {
                c.copy_from_slice(&word(p, k).to_le_bytes());
            }
            let mut g = bm.alloc(payload).expect("alloc");
            assert_eq!(g.len(), payload, "page of exactly {page_size} bytes");
            g.write(0, &page);
            plain.extend_from_slice(&page);
            g.pid()
        })
        .collect();
    (pids, plain)
}

fn open_pool(dir: &tempfile::TempDir, pool: u64) -> BufferManager {
    BufferManager::create(Config::new(dir.path().join("db")).min_page(MIN_PAGE).pool_size(pool)).expect("create")
}

fn fix_read8(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let bm = open_pool(&dir, 256 << 20);
    let (pids, plain) = fill_pages(&bm, FIX_PAGES, MIN_PAGE);
    let payload = MIN_PAGE as usize - PAGE_HEADER_SIZE;

    // Visit every page once per pass, in a shuffled order, at a random aligned offset.
    let mut rng = Rng(0x5EED_1234_ABCD_0001);
    let mut order: Vec<usize> = (0..FIX_PAGES).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let visits: Vec<(PageId, usize, usize)> = order
        .iter()
        .map(|&p| {
            let at = rng.below(payload / 8) * 8;
            (pids[p], at, p * payload + at)
        })
        .collect();

    let expect: u64 = visits.iter().fold(0u64, |s, &(_, _, flat)| s.wrapping_add(read8(&plain, flat)));
    let optimistic = || visits.iter().fold(0u64, |s, &(pid, at, _)| s.wrapping_add(bm.read_optimistic(pid, |g| Ok(g.read_u64(at))).unwrap()));
    let by_hand = || {
        visits.iter().fold(0u64, |s, &(pid, at, _)| {
            let g = bm.fix_optimistic(pid).unwrap();
            let v = g.read_u64(at);
            let v = if g.validate() { v } else { bm.read_optimistic(pid, |g| Ok(g.read_u64(at))).unwrap() };
            s.wrapping_add(v)
        })
    };
    let shared = || {
        visits.iter().fold(0u64, |s, &(pid, at, _)| {
            let g = bm.fix_shared(pid).unwrap();
            s.wrapping_add(read8(g.data(), at))
        })
    };
    let exclusive = || {
        visits.iter().fold(0u64, |s, &(pid, at, _)| {
            let g = bm.fix_exclusive(pid).unwrap();
            s.wrapping_add(read8(g.data(), at))
        })
    };
    let plain_read = || visits.iter().fold(0u64, |s, &(_, _, flat)| s.wrapping_add(read8(black_box(&plain), flat)));
    // The same reads made dependent on each other (the address depends on the previous
    // value through an opaque zero), so they cannot overlap: the latency of one read.
    let zero = black_box(0u64);
    let plain_dependent = || visits.iter().fold(0u64, |s, &(_, _, flat)| s.wrapping_add(read8(&plain, flat + (s & zero) as usize)));
    for (name, got) in
        [("plain dependent", plain_dependent()), ("optimistic", optimistic()), ("by hand", by_hand()), ("shared", shared()), ("exclusive", exclusive())]
    {
        assert_eq!(got, expect, "{name} reads what the plain copy holds");
    }
    let misses = bm.stats().misses;

    let mut g = c.benchmark_group("fix_read8_1000x64KiB_shuffled");
    g.throughput(Throughput::Elements(FIX_PAGES as u64));
    g.bench_function("plain_vec_u8", |b| b.iter(|| black_box(plain_read())));
    g.bench_function("plain_vec_u8_dependent", |b| b.iter(|| black_box(plain_dependent())));
    g.bench_function("read_optimistic", |b| b.iter(|| black_box(optimistic())));
    g.bench_function("fix_optimistic+validate", |b| b.iter(|| black_box(by_hand())));
    g.bench_function("fix_shared", |b| b.iter(|| black_box(shared())));
    g.bench_function("fix_exclusive", |b| b.iter(|| black_box(exclusive())));
    g.finish();
    assert_eq!(bm.stats().misses, misses, "every fix was a hit: the pages stayed resident");
}

fn scan(c: &mut Criterion, page_size: u64, label: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let bm = open_pool(&dir, 2 * SCAN_BYTES);
    let n = (SCAN_BYTES / page_size) as usize;
    let (pids, plain) = fill_pages(&bm, n, page_size);
    let words: Vec<u64> = plain.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();

    let bm_scan = || {
        pids.iter().fold(0u64, |s, &pid| {
            let g = bm.fix_shared(pid).unwrap();
            s.wrapping_add(sum_words(g.data()))
        })
    };
    let vec_u8 = || sum_words(black_box(&plain));
    let vec_u64 = || black_box(&words).iter().fold(0u64, |s, &w| s.wrapping_add(w));
    let expect = vec_u64();
    assert_eq!(bm_scan(), expect);
    assert_eq!(vec_u8(), expect);
    let misses = bm.stats().misses;

    let mut g = c.benchmark_group(format!("scan_64MiB_in_{label}_pages"));
    g.throughput(Throughput::Bytes(plain.len() as u64));
    g.bench_function(BenchmarkId::new("plain_vec_u8", label), |b| b.iter(|| black_box(vec_u8())));
    g.bench_function(BenchmarkId::new("plain_vec_u64", label), |b| b.iter(|| black_box(vec_u64())));
    g.bench_function(BenchmarkId::new("bm_fix_shared", label), |b| b.iter(|| black_box(bm_scan())));
    g.finish();
    assert_eq!(bm.stats().misses, misses, "every fix was a hit: the pages stayed resident");
}

fn scans(c: &mut Criterion) {
    scan(c, 1 << 20, "1MiB");
    scan(c, 64 << 10, "64KiB");
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = fix_read8, scans
}
criterion_main!(benches);
