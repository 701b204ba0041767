//! Library-level bad-input tests: every damaged file, wrong configuration, invalid page id,
//! exhausted pool and failing disk must surface as the precise typed [`Error`] variant, and
//! must not lose anything that was stored before.

use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use strata::storage::alloc_table::ALLOC_FILE;
use strata::storage::layout::class_file;
use strata::storage::meta::{FORMAT_VERSION, META_FILE};
use strata::storage::{AlignedBuf, FaultyBackend, FileBackend, PageId};
use strata::util::Bytes;
use strata::{BufferManager, Config, Error, ExclusiveGuard};

const MIN_PAGE: u64 = 4096;
const PAYLOAD: usize = MIN_PAGE as usize - strata::PAGE_HEADER_SIZE;

// ------------------------------------------------------------------ helpers

fn db_dir(tmp: &tempfile::TempDir) -> PathBuf {
    tmp.path().join("db")
}

/// Word `k` of the payload of the page filled with `seed`.
fn word(seed: u64, k: usize) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (k as u64).wrapping_mul(1_000_003) ^ 0x5A5A
}

/// Fills the whole payload with a pattern derived from `seed`.
fn fill(g: &mut ExclusiveGuard<'_>, seed: u64) {
    for k in 0..g.len() / 8 {
        g.write_u64(8 * k, word(seed, k));
    }
}

/// Checks a payload filled by [`fill`].
fn check_payload(data: &[u8], seed: u64) {
    for (k, c) in data.chunks_exact(8).enumerate() {
        assert_eq!(u64::from_le_bytes(c.try_into().unwrap()), word(seed, k), "payload word {k} of page seeded {seed}");
    }
}

/// Reads page `pid` through a shared latch and checks its whole payload.
fn check_page(bm: &BufferManager, pid: PageId, seed: u64) {
    let g = bm.fix_shared(pid).unwrap_or_else(|e| panic!("fix {pid}: {e}"));
    check_payload(g.data(), seed);
}

/// Creates a database with `n` class-0 pages (seeds 0..n) and closes it.
fn make_db(db: &Path, n: u64) -> Vec<PageId> {
    let bm = BufferManager::create(Config::new(db).min_page(MIN_PAGE).pool_size(1 << 20)).unwrap();
    let pids = (0..n)
        .map(|i| {
            let mut g = bm.alloc(PAYLOAD).unwrap();
            assert_eq!(g.pid().class(), 0);
            fill(&mut g, i);
            g.pid()
        })
        .collect();
    bm.close().unwrap();
    pids
}

fn open_small(db: &Path) -> BufferManager {
    BufferManager::open(Config::new(db).pool_size(64 << 10)).unwrap()
}

fn page_offset(pid: PageId) -> u64 {
    pid.index() * (MIN_PAGE << pid.class())
}

fn flip_byte(path: &Path, at: u64) {
    let mut f = OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8];
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut b).unwrap();
    b[0] ^= 0x20;
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&b).unwrap();
    f.sync_all().unwrap();
}

fn write_bytes(path: &Path, at: u64, bytes: &[u8]) {
    let mut f = OpenOptions::new().read(true).write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
}

fn read_bytes(path: &Path, at: u64, len: usize) -> Vec<u8> {
    let mut f = fs::File::open(path).unwrap();
    let mut b = vec![0u8; len];
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut b).unwrap();
    b
}

/// Asserts `r` is a Corruption of page `pid` in `file`; returns its reason and Display.
#[track_caller]
fn expect_page_corruption<T>(r: strata::Result<T>, file: &Path, pid: PageId) -> (String, String) {
    match r {
        Err(e @ Error::Corruption { .. }) => {
            let msg = e.to_string();
            let Error::Corruption { file: f, page, reason } = e else { unreachable!() };
            assert_eq!(f, file, "{msg}");
            assert_eq!(page, Some(pid), "{msg}");
            assert!(msg.contains(&file.file_name().unwrap().to_string_lossy().into_owned()), "{msg}");
            assert!(msg.contains(&pid.to_string()), "{msg}");
            (reason, msg)
        }
        Err(e) => panic!("expected Corruption of {pid}, got {e:?}"),
        Ok(_) => panic!("expected Corruption of {pid}, got Ok"),
    }
}

fn faulty() -> (Arc<FaultyBackend>, Arc<strata::storage::Faults>) {
    let fb = Arc::new(FaultyBackend::new(Arc::new(FileBackend::default())));
    let faults = fb.faults.clone();
    (fb, faults)
}

// ------------------------------------------------------------------ damaged pages

#[test]
fn corrupted_page_payload_is_reported_and_other_pages_survive() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let pids = make_db(&db, 8);
    let file = class_file(&db, 0);
    let bad = pids[3];
    flip_byte(&file, page_offset(bad) + 32 + 1234);

    let bm = open_small(&db);
    let (reason, _) = expect_page_corruption(bm.fix_shared(bad), &file, bad);
    assert!(reason.contains("checksum"), "{reason}");
    // Every way of fixing the page refuses it, again and again (nothing is cached).
    expect_page_corruption(bm.fix_exclusive(bad), &file, bad);
    expect_page_corruption(bm.fix_optimistic(bad).map(|_| ()), &file, bad);
    expect_page_corruption(bm.read_optimistic(bad, |g| Ok(g.read_u64(0))), &file, bad);
    expect_page_corruption(bm.fix_shared(bad), &file, bad);
    let mut buf = AlignedBuf::zeroed(MIN_PAGE as usize);
    expect_page_corruption(bm.verify_on_disk(bad, &mut buf), &file, bad);
    bm.check_invariants().unwrap();

    for (i, &p) in pids.iter().enumerate() {
        if p != bad {
            check_page(&bm, p, i as u64);
            bm.verify_on_disk(p, &mut buf).unwrap();
        }
    }
    bm.check_invariants().unwrap();
    // A failed load charged nothing: only the good pages and metadata are counted.
    let st = bm.stats();
    assert_eq!(st.used_bytes, st.resident_bytes + st.metadata_bytes);
    assert!(bm.is_allocated(bad), "a corrupt page is reported, not dropped");
    bm.close().unwrap();
}

#[test]
fn damage_anywhere_in_a_page_header_or_payload_is_corruption() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let pids = make_db(&db, 4);
    let file = class_file(&db, 0);
    let bad = pids[2];
    let bm = open_small(&db);
    let mut buf = AlignedBuf::zeroed(MIN_PAGE as usize);
    // crc, magic, page id, lsn, reserved, first and last payload byte.
    for at in [0u64, 2, 5, 9, 15, 17, 30, 32, 33, MIN_PAGE - 1] {
        flip_byte(&file, page_offset(bad) + at);
        expect_page_corruption(bm.fix_shared(bad), &file, bad);
        expect_page_corruption(bm.verify_on_disk(bad, &mut buf), &file, bad);
        flip_byte(&file, page_offset(bad) + at); // restore
    }
    // A slot of zeros (a hole, a page that was never written) is corruption too.
    let original = read_bytes(&file, page_offset(bad), MIN_PAGE as usize);
    write_bytes(&file, page_offset(bad), &vec![0u8; MIN_PAGE as usize]);
    let (reason, _) = expect_page_corruption(bm.fix_shared(bad), &file, bad);
    assert!(reason.contains("never written"), "{reason}");
    write_bytes(&file, page_offset(bad), &original);
    for (i, &p) in pids.iter().enumerate() {
        check_page(&bm, p, i as u64);
    }
    bm.check_invariants().unwrap();
}

#[test]
fn misdirected_page_is_corruption_naming_the_wrong_id() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let pids = make_db(&db, 6);
    let file = class_file(&db, 0);
    let (a, b) = (pids[1], pids[4]);
    let image = read_bytes(&file, page_offset(a), MIN_PAGE as usize);
    write_bytes(&file, page_offset(b), &image);

    let bm = open_small(&db);
    let (reason, msg) = expect_page_corruption(bm.fix_shared(b), &file, b);
    assert!(reason.contains("another page") && reason.contains(&a.to_string()), "{msg}");
    let mut buf = AlignedBuf::zeroed(MIN_PAGE as usize);
    expect_page_corruption(bm.verify_on_disk(b, &mut buf), &file, b);
    // A's own copy is fine, as are the others.
    for (i, &p) in pids.iter().enumerate() {
        if p != b {
            check_page(&bm, p, i as u64);
        }
    }
    bm.check_invariants().unwrap();
}

#[test]
fn truncated_data_file_is_corruption_mentioning_truncation() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let pids = make_db(&db, 8);
    let file = class_file(&db, 0);
    let mut buf = AlignedBuf::zeroed(MIN_PAGE as usize);

    // Cut the last page in the middle (the file length is then not even sector-aligned).
    let last = pids[7];
    OpenOptions::new().write(true).open(&file).unwrap().set_len(page_offset(last) + 100).unwrap();
    let bm = open_small(&db);
    let (reason, _) = expect_page_corruption(bm.fix_shared(last), &file, last);
    assert!(reason.contains("truncated"), "{reason}");
    let (reason, _) = expect_page_corruption(bm.verify_on_disk(last, &mut buf), &file, last);
    assert!(reason.contains("truncated"), "{reason}");
    for (i, &p) in pids[..7].iter().enumerate() {
        check_page(&bm, p, i as u64);
    }
    bm.check_invariants().unwrap();
    drop(bm);

    // Cut at a page boundary: pages 5.. are gone entirely.
    OpenOptions::new().write(true).open(&file).unwrap().set_len(page_offset(pids[5])).unwrap();
    let bm = open_small(&db);
    for &p in &pids[5..] {
        let (reason, _) = expect_page_corruption(bm.fix_shared(p), &file, p);
        assert!(reason.contains("truncated"), "{reason}");
        let (reason, _) = expect_page_corruption(bm.verify_on_disk(p, &mut buf), &file, p);
        assert!(reason.contains("truncated"), "{reason}");
    }
    for (i, &p) in pids[..5].iter().enumerate() {
        check_page(&bm, p, i as u64);
    }
    bm.check_invariants().unwrap();
}

// ------------------------------------------------------------------ configuration and files

#[test]
fn wrong_min_page_on_open_is_invalid_config() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let pids = make_db(&db, 2);
    for m in [8192, 65536, 3000] {
        match BufferManager::open(Config::new(&db).min_page(m)) {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains("4 KiB"), "{msg}"),
            Err(e) => panic!("expected InvalidConfig, got {e:?}"),
            Ok(_) => panic!("expected InvalidConfig, got Ok"),
        }
    }
    // The right one (or none) opens and nothing was touched.
    let bm = BufferManager::open(Config::new(&db).min_page(MIN_PAGE)).unwrap();
    check_page(&bm, pids[1], 1);
}

#[test]
fn invalid_min_page_on_create_is_invalid_config_and_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    for m in [3000, 2048, 0, 1, 1 << 37, 4097] {
        match BufferManager::create(Config::new(&db).min_page(m)) {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains(&m.to_string()), "{msg}"),
            Err(e) => panic!("min_page {m}: expected InvalidConfig, got {e:?}"),
            Ok(_) => panic!("min_page {m}: expected InvalidConfig, got Ok"),
        }
        assert!(!db.exists(), "a refused create leaves no directory behind");
    }
}

#[test]
fn create_on_an_existing_database_is_already_exists() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let pids = make_db(&db, 3);
    match BufferManager::create(Config::new(&db).min_page(MIN_PAGE)) {
        Err(Error::AlreadyExists { path }) => assert_eq!(path, db),
        Err(e) => panic!("expected AlreadyExists, got {e:?}"),
        Ok(_) => panic!("expected AlreadyExists, got Ok"),
    }
    // A directory holding anything else is refused too.
    let other = tmp.path().join("other");
    fs::create_dir(&other).unwrap();
    fs::write(other.join("notes.txt"), b"keep me").unwrap();
    assert!(matches!(BufferManager::create(Config::new(&other)), Err(Error::AlreadyExists { .. })));
    assert_eq!(fs::read(other.join("notes.txt")).unwrap(), b"keep me");
    // The database is untouched.
    let bm = open_small(&db);
    assert_eq!(bm.allocated_pages(), pids);
    for (i, &p) in pids.iter().enumerate() {
        check_page(&bm, p, i as u64);
    }
}

#[test]
fn open_of_something_that_is_not_a_database_is_not_a_database() {
    let tmp = tempfile::tempdir().unwrap();
    // Missing directory, empty directory, directory of unrelated files, foreign meta file.
    let missing = tmp.path().join("missing");
    let empty = tmp.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let junk = tmp.path().join("junk");
    fs::create_dir(&junk).unwrap();
    fs::write(junk.join("data.csv"), b"a,b\n1,2\n").unwrap();
    let foreign = tmp.path().join("foreign");
    fs::create_dir(&foreign).unwrap();
    fs::write(foreign.join(META_FILE), b"SQLite format 3\0 and more bytes after it").unwrap();
    let short = tmp.path().join("short");
    fs::create_dir(&short).unwrap();
    fs::write(short.join(META_FILE), b"").unwrap();
    for dir in [&missing, &empty, &junk, &foreign, &short] {
        match BufferManager::open(Config::new(dir)) {
            Err(e @ Error::NotADatabase { .. }) => {
                let Error::NotADatabase { path } = &e else { unreachable!() };
                assert_eq!(path, dir);
                assert!(e.to_string().contains("not a strata database"), "{e}");
            }
            Err(e) => panic!("{}: expected NotADatabase, got {e:?}", dir.display()),
            Ok(_) => panic!("{}: expected NotADatabase, got Ok", dir.display()),
        }
    }
    assert!(!missing.exists(), "open does not create");
}

#[test]
fn corrupt_meta_file_is_corruption() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let pids = make_db(&db, 2);
    let meta = db.join(META_FILE);
    let good = fs::read(&meta).unwrap();
    assert_eq!(good.len(), 32);
    // Any flipped bit after the magic is caught by the checksum.
    for at in 8..32u64 {
        flip_byte(&meta, at);
        match BufferManager::open(Config::new(&db)) {
            Err(Error::Corruption { file, page: None, reason }) => {
                assert_eq!(file, meta);
                assert!(reason.contains("checksum"), "{reason}");
            }
            Err(e) => panic!("byte {at}: expected Corruption, got {e:?}"),
            Ok(_) => panic!("byte {at}: expected Corruption, got Ok"),
        }
        fs::write(&meta, &good).unwrap();
    }
    // A damaged magic no longer identifies a strata database at all.
    flip_byte(&meta, 3);
    assert!(matches!(BufferManager::open(Config::new(&db)), Err(Error::NotADatabase { .. })));
    // Wrong length with the right magic.
    let mut long = good.clone();
    long.push(0);
    fs::write(&meta, &long).unwrap();
    assert!(matches!(BufferManager::open(Config::new(&db)), Err(Error::Corruption { page: None, .. })));
    fs::write(&meta, &good[..20]).unwrap();
    assert!(matches!(BufferManager::open(Config::new(&db)), Err(Error::Corruption { page: None, .. })));
    // A well-formed meta file with an impossible smallest page size.
    for shift in [11u32, 37, 64, 200, u32::MAX] {
        let mut m = good.clone();
        m[12..16].copy_from_slice(&shift.to_le_bytes());
        let crc = crc32c::crc32c(&m[..28]);
        m[28..32].copy_from_slice(&crc.to_le_bytes());
        fs::write(&meta, &m).unwrap();
        match BufferManager::open(Config::new(&db)) {
            Err(Error::Corruption { reason, .. }) => assert!(reason.contains("smallest page"), "{reason}"),
            Err(e) => panic!("shift {shift}: expected Corruption, got {e:?}"),
            Ok(_) => panic!("shift {shift}: expected Corruption, got Ok"),
        }
    }
    fs::write(&meta, &good).unwrap();
    let bm = open_small(&db);
    check_page(&bm, pids[1], 1);
}

#[test]
fn newer_format_version_is_unsupported_version() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let pids = make_db(&db, 2);
    let meta = db.join(META_FILE);
    let good = fs::read(&meta).unwrap();
    assert_eq!(&good[0..8], b"STRATADB");
    assert_eq!(u32::from_le_bytes(good[8..12].try_into().unwrap()), FORMAT_VERSION);
    for version in [99u32, FORMAT_VERSION + 1, u32::MAX, 0] {
        // Rewrite the version field and fix up the CRC-32C of bytes 0..28 (storage/meta.rs).
        let mut m = good.clone();
        m[8..12].copy_from_slice(&version.to_le_bytes());
        let crc = crc32c::crc32c(&m[..28]);
        m[28..32].copy_from_slice(&crc.to_le_bytes());
        fs::write(&meta, &m).unwrap();
        match BufferManager::open(Config::new(&db)) {
            Err(e @ Error::UnsupportedVersion { .. }) => {
                let msg = e.to_string();
                let Error::UnsupportedVersion { path, found, supported } = e else { unreachable!() };
                assert_eq!((found, supported), (version, FORMAT_VERSION));
                assert_eq!(path, meta);
                assert!(msg.contains(&version.to_string()), "{msg}");
            }
            Err(e) => panic!("version {version}: expected UnsupportedVersion, got {e:?}"),
            Ok(_) => panic!("version {version}: expected UnsupportedVersion, got Ok"),
        }
        assert_eq!(fs::read(&meta).unwrap(), m, "open must not rewrite a newer meta file");
    }
    fs::write(&meta, &good).unwrap();
    let bm = open_small(&db);
    check_page(&bm, pids[0], 0);
}

#[test]
fn corrupted_allocation_table_is_corruption() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let pids = make_db(&db, 70);
    let table = db.join(ALLOC_FILE);
    let good = fs::read(&table).unwrap();
    assert_eq!(good.len() % 4096, 0);
    let expect = |what: &str| match BufferManager::open(Config::new(&db)) {
        Err(Error::Corruption { file, page: None, reason }) => {
            assert_eq!(file, table, "{what}");
            reason
        }
        Err(e) => panic!("{what}: expected Corruption, got {e:?}"),
        Ok(_) => panic!("{what}: expected Corruption, got Ok"),
    };
    // Flipped bytes: in the CRC, the magic, the block header, the bitmap words, the padding.
    for at in [0u64, 5, 9, 13, 16, 22, 30, 4095] {
        flip_byte(&table, at);
        let reason = expect(&format!("byte {at}"));
        assert!(reason.contains("checksum"), "{reason}");
        fs::write(&table, &good).unwrap();
    }
    // Not a whole number of blocks, empty, missing.
    fs::write(&table, &good[..100]).unwrap();
    expect("short");
    fs::write(&table, b"").unwrap();
    expect("empty");
    fs::remove_file(&table).unwrap();
    assert!(expect("missing").contains("missing"));

    fs::write(&table, &good).unwrap();
    let bm = open_small(&db);
    assert_eq!(bm.allocated_pages(), pids);
    check_page(&bm, pids[69], 69);
}

/// Re-seals the checksums of an allocation table after its payload was edited.
fn reseal_table(bytes: &mut [u8]) {
    for block in bytes.chunks_exact_mut(4096) {
        let crc = crc32c::crc32c(&block[4..]);
        block[0..4].copy_from_slice(&crc.to_le_bytes());
    }
}

#[test]
fn well_formed_but_lying_allocation_table_is_corruption_not_a_crash() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let pids = make_db(&db, 3);
    let table = db.join(ALLOC_FILE);
    let good = fs::read(&table).unwrap();
    // Payload stream: class count u32 | class u8 | word count u32 | words.
    assert_eq!(u32::from_le_bytes(good[16..20].try_into().unwrap()), 1);
    assert_eq!(good[20], 0);
    assert_eq!(u32::from_le_bytes(good[21..25].try_into().unwrap()), 1);
    let cases: [(&str, usize, Vec<u8>); 5] = [
        ("huge word count", 21, u32::MAX.to_le_bytes().to_vec()),
        ("huge class count", 16, u32::MAX.to_le_bytes().to_vec()),
        // One class too many: the extra entry is read from the zero padding as "class 0,
        // no words" and must not silently empty class 0.
        ("class count one too many", 16, 2u32.to_le_bytes().to_vec()),
        ("class out of range", 20, vec![200]),
        ("block out of place", 8, 7u32.to_le_bytes().to_vec()),
    ];
    for (what, at, patch) in cases {
        let mut t = good.clone();
        t[at..at + patch.len()].copy_from_slice(&patch);
        reseal_table(&mut t);
        fs::write(&table, &t).unwrap();
        match BufferManager::open(Config::new(&db)) {
            Err(Error::Corruption { file, page: None, .. }) => assert_eq!(file, table, "{what}"),
            Err(e) => panic!("{what}: expected Corruption, got {e:?}"),
            Ok(_) => panic!("{what}: expected Corruption, got Ok"),
        }
    }
    fs::write(&table, &good).unwrap();
    let bm = open_small(&db);
    assert_eq!(bm.allocated_pages(), pids);
}

// ------------------------------------------------------------------ pool too small

#[test]
fn pool_below_one_page_is_pool_too_small() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let pids = make_db(&db, 2);
    for pool in [0, 1, 2048, MIN_PAGE - 1, MIN_PAGE] {
        match BufferManager::open(Config::new(&db).pool_size(pool)) {
            Err(e @ Error::PoolTooSmall { .. }) => {
                let Error::PoolTooSmall { needed, pool: p } = e else { unreachable!() };
                assert_eq!(p, pool);
                assert!(needed > pool && needed >= MIN_PAGE, "needed {needed}, pool {pool}");
            }
            Err(e) => panic!("pool {pool}: expected PoolTooSmall, got {e:?}"),
            Ok(_) => panic!("pool {pool}: expected PoolTooSmall, got Ok"),
        }
    }
    // A pool so large that the buffer manager's own tables cannot be allocated.
    for pool in [u64::MAX, 1 << 62] {
        match BufferManager::open(Config::new(&db).pool_size(pool)) {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains("pool"), "{msg}"),
            Err(e) => panic!("pool {pool}: expected InvalidConfig, got {e:?}"),
            Ok(_) => panic!("pool {pool}: expected InvalidConfig, got Ok"),
        }
    }
    // None of the refused opens touched the database.
    let bm = open_small(&db);
    assert_eq!(bm.allocated_pages(), pids);
    check_page(&bm, pids[1], 1);
    match bm.set_pool_size(u64::MAX) {
        Err(Error::InvalidConfig(msg)) => assert!(msg.contains("pool"), "{msg}"),
        r => panic!("expected InvalidConfig, got {r:?}"),
    }
    assert_eq!(bm.pool_size(), 64 << 10);
    check_page(&bm, pids[0], 0);
    bm.check_invariants().unwrap();
}

#[test]
fn create_with_a_pool_below_one_page_is_pool_too_small_and_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    match BufferManager::create(Config::new(&db).min_page(MIN_PAGE).pool_size(2048)) {
        Err(Error::PoolTooSmall { pool: 2048, .. }) => {}
        Err(e) => panic!("expected PoolTooSmall, got {e:?}"),
        Ok(_) => panic!("expected PoolTooSmall, got Ok"),
    }
    assert!(!db.exists(), "a refused create leaves no directory behind");
    // Retrying with a usable pool must work (not fail with AlreadyExists).
    let bm = BufferManager::create(Config::new(&db).min_page(MIN_PAGE).pool_size(1 << 20)).unwrap();
    bm.close().unwrap();
}

#[test]
fn page_larger_than_the_pool_is_pool_too_small() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let pool = 64 << 10;
    let bm = BufferManager::create(Config::new(&db).min_page(MIN_PAGE).pool_size(pool)).unwrap();
    for bytes in [100_000, 64 << 10, 1 << 30] {
        match bm.alloc(bytes) {
            Err(Error::PoolTooSmall { needed, pool: p }) => {
                assert_eq!(p, pool);
                assert!(needed > pool && needed >= bytes as u64, "needed {needed}");
            }
            Err(e) => panic!("alloc({bytes}): expected PoolTooSmall, got {e:?}"),
            Ok(_) => panic!("alloc({bytes}): expected PoolTooSmall, got Ok"),
        }
        assert!(matches!(bm.alloc_temp(bytes), Err(Error::PoolTooSmall { .. })));
    }
    // Larger than the largest size class: invalid input, not a panic or an overflow.
    for bytes in [1usize << 37, usize::MAX, usize::MAX - 31, usize::MAX - 32] {
        match bm.alloc(bytes) {
            Err(Error::InvalidInput(_)) => {}
            Err(e) => panic!("alloc({bytes}): expected InvalidInput, got {e:?}"),
            Ok(_) => panic!("alloc({bytes}): expected InvalidInput, got Ok"),
        }
    }
    assert!(bm.allocated_pages().is_empty(), "refused allocations leave nothing allocated");
    let mut g = bm.alloc(100).unwrap();
    fill(&mut g, 9);
    let small = g.pid();
    drop(g);
    bm.check_invariants().unwrap();
    bm.close().unwrap();

    // A big page written with a big pool cannot be loaded into a small one.
    let bm = BufferManager::open(Config::new(&db).pool_size(1 << 20)).unwrap();
    let mut g = bm.alloc(200_000).unwrap();
    let big = g.pid();
    g.write_u64(0, 77);
    drop(g);
    bm.close().unwrap();
    let bm = BufferManager::open(Config::new(&db).pool_size(pool)).unwrap();
    match bm.fix_shared(big) {
        Err(Error::PoolTooSmall { pool: p, needed }) => assert!(p == pool && needed > pool),
        Err(e) => panic!("expected PoolTooSmall, got {e:?}"),
        Ok(_) => panic!("expected PoolTooSmall, got Ok"),
    }
    assert!(matches!(bm.read_optimistic(big, |g| Ok(g.read_u64(0))), Err(Error::PoolTooSmall { .. })));
    // Verifying it needs a buffer of its size, not a smaller one.
    let mut small_buf = AlignedBuf::zeroed(MIN_PAGE as usize);
    assert!(matches!(bm.verify_on_disk(big, &mut small_buf), Err(Error::InvalidInput(_))));
    bm.verify_on_disk(big, &mut AlignedBuf::zeroed(256 << 10)).unwrap();
    check_page(&bm, small, 9);
    bm.check_invariants().unwrap();
    bm.set_pool_size(1 << 20).unwrap();
    assert_eq!(bm.read_optimistic(big, |g| Ok(g.read_u64(0))).unwrap(), 77);
    bm.check_invariants().unwrap();
}

#[test]
fn shrinking_the_pool_below_one_page_is_pool_too_small_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let pids = make_db(&db, 4);
    let bm = BufferManager::open(Config::new(&db).pool_size(1 << 20).pin_wait(Duration::from_millis(50))).unwrap();
    for &p in &pids {
        drop(bm.fix_shared(p).unwrap());
    }
    for bytes in [0, 100, MIN_PAGE] {
        match bm.set_pool_size(bytes) {
            Err(Error::PoolTooSmall { pool, needed }) => assert!(pool == bytes && needed > bytes),
            Err(e) => panic!("set_pool_size({bytes}): expected PoolTooSmall, got {e:?}"),
            Ok(()) => panic!("set_pool_size({bytes}): expected PoolTooSmall, got Ok"),
        }
        assert_eq!(bm.pool_size(), 1 << 20, "a refused resize keeps the old cap");
    }
    for (i, &p) in pids.iter().enumerate() {
        check_page(&bm, p, i as u64);
    }
    bm.check_invariants().unwrap();
}

// ------------------------------------------------------------------ invalid page ids

#[track_caller]
fn expect_invalid<T>(r: strata::Result<T>, pid: PageId) -> String {
    match r {
        Err(e @ Error::InvalidPageId { .. }) => {
            let msg = e.to_string();
            let Error::InvalidPageId { pid: p, .. } = e else { unreachable!() };
            assert_eq!(p, pid, "{msg}");
            assert!(msg.contains(&pid.to_string()), "{msg}");
            msg
        }
        Err(e) => panic!("{pid}: expected InvalidPageId, got {e:?}"),
        Ok(_) => panic!("{pid}: expected InvalidPageId, got Ok"),
    }
}

fn expect_invalid_everywhere(bm: &BufferManager, pid: PageId) {
    expect_invalid(bm.fix_shared(pid), pid);
    expect_invalid(bm.fix_exclusive(pid), pid);
    expect_invalid(bm.fix_optimistic(pid).map(|_| ()), pid);
    expect_invalid(bm.read_optimistic(pid, |g| Ok(g.read_u64(0))), pid);
    let mut buf = AlignedBuf::zeroed(MIN_PAGE as usize);
    expect_invalid(bm.verify_on_disk(pid, &mut buf), pid);
    assert!(!bm.is_allocated(pid));
}

#[test]
fn invalid_page_ids_are_invalid_page_id() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let pids = make_db(&db, 10);
    let bm = open_small(&db);

    // A class that was never used, persistent and temporary, and ids beyond any class.
    for pid in [
        PageId::new(5, false, 0),
        PageId::new(5, true, 0),
        PageId::new(0, true, 0),
        PageId::new(24, false, 3),
        PageId::new(63, false, 0),
        PageId::from_raw(u64::MAX),
    ] {
        expect_invalid_everywhere(&bm, pid);
        expect_invalid(bm.free(pid), pid);
    }
    // Far beyond any allocated page, and just past the last one (addressable, not allocated).
    for index in [1_000_000, PageId::MAX_INDEX, 10, 11, 500] {
        let pid = PageId::new(0, false, index);
        expect_invalid_everywhere(&bm, pid);
        expect_invalid(bm.free(pid), pid);
    }
    // A freed page, resident or not, and a double free.
    check_page(&bm, pids[2], 2);
    bm.free(pids[2]).unwrap(); // resident
    bm.free(pids[7]).unwrap(); // not resident
    for p in [pids[2], pids[7]] {
        expect_invalid_everywhere(&bm, p);
        let msg = expect_invalid(bm.free(p), p);
        assert!(msg.contains("not allocated"), "{msg}");
    }
    let g = bm.fix_exclusive(pids[3]).unwrap();
    g.free().unwrap();
    expect_invalid(bm.free(pids[3]), pids[3]);
    expect_invalid_everywhere(&bm, pids[3]);
    bm.check_invariants().unwrap();

    // The rest is intact, also after a restart.
    let live: Vec<(usize, PageId)> = pids.iter().copied().enumerate().filter(|&(i, _)| ![2, 3, 7].contains(&i)).collect();
    for &(i, p) in &live {
        check_page(&bm, p, i as u64);
    }
    bm.close().unwrap();
    let bm = open_small(&db);
    assert_eq!(bm.allocated_pages(), live.iter().map(|&(_, p)| p).collect::<Vec<_>>());
    expect_invalid_everywhere(&bm, pids[7]);
    for &(i, p) in &live {
        check_page(&bm, p, i as u64);
    }
}

// ------------------------------------------------------------------ pinned pool

#[test]
fn all_pages_pinned_is_out_of_memory_and_recovers_once_unpinned() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let pids = make_db(&db, 40);
    let pool = 64 << 10;
    let bm = BufferManager::open(Config::new(&db).pool_size(pool).pin_wait(Duration::from_millis(50))).unwrap();
    let fit = ((pool - bm.used_bytes()) / MIN_PAGE) as usize;
    assert!((4..40).contains(&fit), "{fit} pages fit");

    let mut guards: Vec<_> = pids[..fit].iter().map(|&p| bm.fix_shared(p).unwrap()).collect();
    let next = pids[fit];
    let expect_oom = |r: strata::Result<()>, what: &str| match r {
        Err(e @ Error::OutOfMemory { .. }) => {
            let msg = e.to_string();
            let Error::OutOfMemory { requested, used, limit, pinned, .. } = e else { unreachable!() };
            if what.starts_with("alloc") {
                // The first temporary page also needs its space's metadata charged.
                assert!(requested >= MIN_PAGE, "{what}: {msg}");
            } else {
                assert_eq!(requested, MIN_PAGE, "{what}: {msg}");
            }
            assert_eq!(limit, pool, "{what}: {msg}");
            assert!(used <= limit && used + requested > limit, "{what}: {msg}");
            assert_eq!(pinned, fit as u64 * MIN_PAGE, "{what}: {msg}");
            let state = format!("{} of {} in use", Bytes(used), Bytes(limit));
            assert!(msg.contains(&state), "{what}: {msg} lacks {state:?}");
            assert!(msg.contains("pinned"), "{what}: {msg}");
        }
        Err(e) => panic!("{what}: expected OutOfMemory, got {e:?}"),
        Ok(()) => panic!("{what}: expected OutOfMemory, got Ok"),
    };
    expect_oom(bm.fix_shared(next).map(drop), "fix_shared");
    expect_oom(bm.fix_exclusive(next).map(drop), "fix_exclusive");
    expect_oom(bm.fix_optimistic(next).map(drop), "fix_optimistic");
    expect_oom(bm.read_optimistic(next, |g| Ok(g.read_u64(0))).map(drop), "read_optimistic");
    expect_oom(bm.alloc(100).map(drop), "alloc");
    expect_oom(bm.alloc_temp(100).map(drop), "alloc_temp");
    assert_eq!(bm.allocated_pages(), pids, "a failed alloc allocates nothing");
    // Shrinking the pool cannot evict pinned pages either; the cap stays.
    match bm.set_pool_size(32 << 10) {
        Err(Error::OutOfMemory { limit, .. }) => assert_eq!(limit, 32 << 10),
        r => panic!("expected OutOfMemory, got {r:?}"),
    }
    assert_eq!(bm.pool_size(), pool);
    // The pinned pages are still readable through their guards.
    for (i, g) in guards.iter().enumerate() {
        check_payload(g.data(), i as u64);
    }
    bm.check_invariants().unwrap();

    // One unpinned page is enough: the fix must evict it rather than fail.
    let g = guards.pop().unwrap();
    drop(g);
    check_page(&bm, next, fit as u64);
    drop(guards);
    for (i, &p) in pids.iter().enumerate() {
        check_page(&bm, p, i as u64);
    }
    let mut g = bm.alloc(100).unwrap();
    g.write_u64(0, 1);
    drop(g);
    bm.check_invariants().unwrap();
    assert!(bm.peak_bytes() <= pool);
}

// ------------------------------------------------------------------ failing disk

#[test]
fn disk_full_on_eviction_is_disk_full_and_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let (fb, faults) = faulty();
    let pool = 64 << 10;
    let cfg = Config::new(&db).min_page(MIN_PAGE).pool_size(pool).pin_wait(Duration::from_millis(50)).backend(fb);
    let bm = BufferManager::create(cfg).unwrap();
    let mut pids = Vec::new();
    for i in 0..40u64 {
        let mut g = bm.alloc(PAYLOAD).unwrap();
        fill(&mut g, i);
        pids.push(g.pid());
    }
    assert!(bm.stats().evictions > 0);

    faults.write_errno.store(libc::ENOSPC as u64, Ordering::Relaxed);
    // Every resident page is dirty, so making room needs a write, which fails.
    let mut full = 0;
    for i in 40..60u64 {
        match bm.alloc(PAYLOAD) {
            Ok(mut g) => {
                fill(&mut g, i);
                pids.push(g.pid());
            }
            Err(Error::DiskFull { path }) => {
                assert_eq!(path, class_file(&db, 0));
                full += 1;
            }
            Err(e) => panic!("expected DiskFull, got {e:?}"),
        }
    }
    assert!(full > 0, "no allocation hit the full disk");
    assert_eq!(bm.allocated_pages(), pids, "failed allocations allocate nothing");
    // Loading an evicted page needs room too; resident pages are intact.
    let mut resident = 0;
    for (i, &p) in pids.iter().enumerate() {
        match bm.fix_shared(p) {
            Ok(g) => {
                check_payload(g.data(), i as u64);
                resident += 1;
            }
            Err(Error::DiskFull { .. }) => {}
            Err(e) => panic!("{p}: expected DiskFull or the page, got {e:?}"),
        }
    }
    assert!(resident > 0);
    // Shrinking the pool cannot evict dirty pages either; the cap stays.
    match bm.set_pool_size(32 << 10) {
        Err(Error::DiskFull { .. }) => {}
        r => panic!("expected DiskFull, got {r:?}"),
    }
    assert_eq!(bm.pool_size(), pool);
    // A checkpoint cannot write the dirty pages either.
    assert!(matches!(bm.checkpoint(), Err(Error::DiskFull { .. })));
    bm.check_invariants().unwrap();

    // Space is back: everything is written and reads back, also after a restart.
    faults.write_errno.store(0, Ordering::Relaxed);
    bm.checkpoint().unwrap();
    for (i, &p) in pids.iter().enumerate() {
        check_page(&bm, p, i as u64);
    }
    bm.check_invariants().unwrap();
    bm.close().unwrap();
    let bm = open_small(&db);
    assert_eq!(bm.allocated_pages(), pids);
    for (i, &p) in pids.iter().enumerate() {
        check_page(&bm, p, i as u64);
    }
}

#[test]
fn disk_full_while_writing_the_allocation_table_keeps_the_previous_state() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let (fb, faults) = faulty();
    let cfg = Config::new(&db).min_page(MIN_PAGE).pool_size(1 << 20).backend(fb);
    let bm = BufferManager::create(cfg).unwrap();
    let first: Vec<PageId> = (0..10u64)
        .map(|i| {
            let mut g = bm.alloc(PAYLOAD).unwrap();
            fill(&mut g, i);
            g.pid()
        })
        .collect();
    bm.checkpoint().unwrap();
    let second: Vec<PageId> = (10..20u64)
        .map(|i| {
            let mut g = bm.alloc(PAYLOAD).unwrap();
            fill(&mut g, i);
            g.pid()
        })
        .collect();

    faults.meta_errno.store(libc::ENOSPC as u64, Ordering::Relaxed);
    match bm.checkpoint() {
        Err(Error::DiskFull { path }) => assert_eq!(path, db.join(ALLOC_FILE)),
        r => panic!("expected DiskFull, got {r:?}"),
    }
    assert!(matches!(bm.close(), Err(Error::DiskFull { .. })));

    // The database opens with the state of the last successful checkpoint.
    let bm = open_small(&db);
    assert_eq!(bm.allocated_pages(), first);
    for (i, &p) in first.iter().enumerate() {
        check_page(&bm, p, i as u64);
    }
    for &p in &second {
        expect_invalid(bm.fix_shared(p), p);
    }
    bm.check_invariants().unwrap();
    drop(bm);

    // The same with the fault cleared before the retry: the retry persists everything.
    faults.meta_errno.store(0, Ordering::Relaxed);
    let (fb, faults) = faulty();
    let bm = BufferManager::open(Config::new(&db).pool_size(1 << 20).backend(fb)).unwrap();
    let more: Vec<PageId> = (20..25u64)
        .map(|i| {
            let mut g = bm.alloc(PAYLOAD).unwrap();
            fill(&mut g, i);
            g.pid()
        })
        .collect();
    // An exhausted quota is a full disk too.
    faults.meta_errno.store(libc::EDQUOT as u64, Ordering::Relaxed);
    assert!(matches!(bm.checkpoint(), Err(Error::DiskFull { .. })));
    faults.meta_errno.store(0, Ordering::Relaxed);
    bm.checkpoint().unwrap();
    bm.close().unwrap();
    let bm = open_small(&db);
    let all: Vec<PageId> = first.iter().chain(&more).copied().collect();
    assert_eq!(bm.allocated_pages(), all);
    for (i, &p) in first.iter().enumerate() {
        check_page(&bm, p, i as u64);
    }
    for (i, &p) in more.iter().enumerate() {
        check_page(&bm, p, 20 + i as u64);
    }
}

#[test]
fn failed_fsync_is_io_and_later_checkpoints_refuse_until_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let (fb, faults) = faulty();
    let bm = BufferManager::create(Config::new(&db).min_page(MIN_PAGE).pool_size(1 << 20).backend(fb)).unwrap();
    let alloc = |range: std::ops::Range<u64>| -> Vec<PageId> {
        range
            .map(|i| {
                let mut g = bm.alloc(PAYLOAD).unwrap();
                fill(&mut g, i);
                g.pid()
            })
            .collect()
    };
    let durable = alloc(0..5);
    bm.checkpoint().unwrap();
    let _later = alloc(5..10);
    faults.fail_sync.store(true, Ordering::Relaxed);
    match bm.checkpoint() {
        Err(Error::Io { op, path, source }) => {
            assert_eq!(op, "fsync");
            assert_eq!(path, class_file(&db, 0));
            assert_eq!(source.raw_os_error(), Some(libc::EIO));
        }
        r => panic!("expected Io, got {r:?}"),
    }
    faults.fail_sync.store(false, Ordering::Relaxed);
    // A retry must not claim durability: Linux reports a failed writeback only once.
    let e = bm.checkpoint().unwrap_err();
    assert!(e.to_string().contains("earlier fsync"), "{e}");
    assert!(bm.close().is_err());
    // Reopened, the database is in its last durable state: the first checkpoint's pages.
    let bm = open_small(&db);
    assert_eq!(bm.allocated_pages(), durable);
    for (i, &p) in durable.iter().enumerate() {
        check_page(&bm, p, i as u64);
    }
}

#[test]
fn injected_read_error_is_io_and_the_page_reads_once_cleared() {
    let tmp = tempfile::tempdir().unwrap();
    let db = db_dir(&tmp);
    let pids = make_db(&db, 12);
    let (fb, faults) = faulty();
    let bm = BufferManager::open(Config::new(&db).pool_size(64 << 10).backend(fb)).unwrap();
    check_page(&bm, pids[0], 0);

    faults.read_errno.store(libc::EIO as u64, Ordering::Relaxed);
    let expect_io = |r: strata::Result<()>, what: &str| match r {
        Err(e @ Error::Io { .. }) => {
            let msg = e.to_string();
            let Error::Io { path, source, .. } = e else { unreachable!() };
            assert_eq!(path, class_file(&db, 0), "{what}");
            assert_eq!(source.raw_os_error(), Some(libc::EIO), "{what}");
            assert!(msg.contains("class-00.pages"), "{msg}");
        }
        Err(e) => panic!("{what}: expected Io, got {e:?}"),
        Ok(()) => panic!("{what}: expected Io, got Ok"),
    };
    let p = pids[5];
    expect_io(bm.fix_shared(p).map(drop), "fix_shared");
    expect_io(bm.fix_exclusive(p).map(drop), "fix_exclusive");
    expect_io(bm.fix_optimistic(p).map(drop), "fix_optimistic");
    expect_io(bm.read_optimistic(p, |g| Ok(g.read_u64(0))).map(drop), "read_optimistic");
    let mut buf = AlignedBuf::zeroed(MIN_PAGE as usize);
    expect_io(bm.verify_on_disk(p, &mut buf), "verify_on_disk");
    // A resident page does not need the disk.
    check_page(&bm, pids[0], 0);
    bm.check_invariants().unwrap();
    let st = bm.stats();
    assert_eq!(st.used_bytes, st.resident_bytes + st.metadata_bytes, "failed reads release their reservation");

    faults.read_errno.store(0, Ordering::Relaxed);
    for (i, &p) in pids.iter().enumerate() {
        check_page(&bm, p, i as u64);
    }
    bm.verify_on_disk(p, &mut buf).unwrap();
    bm.check_invariants().unwrap();
}
