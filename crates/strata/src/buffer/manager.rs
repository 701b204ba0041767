//! The buffer manager: one memory budget over pages of every size class.
//!
//! [`BufferManager`] is defined here with its lifecycle (create, open, read-only open,
//! close, crash); each concern has its own file, all of them `impl BufferManager`:
//!
//! | file | concern |
//! |---|---|
//! | [`super::alloc`] | spaces (page id -> state word and frame by arithmetic), allocating and freeing |
//! | [`super::fix`] | exclusive, shared and optimistic latches; the hit path |
//! | [`super::load`] | the miss path: loading one page, prefetching many |
//! | [`super::budget`] | the memory cap: reservations, metadata charges, resizing |
//! | [`super::evict`] | the clock across all classes, the cleaner's round |
//! | [`super::writeback`] | sealing, the write-ahead rule, double writes, the dirty-page table |
//! | [`super::remote`] | the second memory tier's side of eviction and misses |
//! | [`super::checkpoint`] | checkpoints, and the double-write area at open |
//! | [`super::inspect`] | statistics, allocation ranges, page inspection, invariants |
//!
//! # Protocol
//!
//! * **Translation.** A page id names a space (class, persistent or temporary) and an index;
//!   its state word and frame are found by arithmetic in the space's reservations.
//! * **Fix.** A resident page is latched with one compare-and-swap on its state word (see
//!   [`super::state`]); nothing global is touched except a striped hit counter.
//! * **Miss.** The fixing thread takes `EVICTED -> LOCKED`, checks the allocation bitmap,
//!   reserves the page's bytes in the budget (evicting if needed), reads the page straight
//!   into its frame, verifies checksum and id, inserts it into the resident set and keeps or
//!   downgrades the latch.
//! * **Budget.** `used` counts resident page bytes plus metadata and is only ever increased
//!   by a compare-and-swap that keeps it `<= pool`: the cap holds at every instant.
//! * **Eviction.** Clock over the resident set, across all classes (see [`super::evict`]).
//!
//! Lock order: a space's bitmap mutex is never held while waiting for a page latch; the
//! resident set's grow mutex is taken only by `set_pool_size` (which holds no latch).
//!
//! No lock is shared by all threads on a fix, a miss or an eviction: the resident set is
//! lock-free, partitioned (a slot array and a clock hand per partition) and grows in place
//! without a lock on the hot path ([`super::resident`]), the dirty-page table and the
//! remote tier's versions are sharded by page id, the allocation check of a miss reads an
//! atomic mirror of the bitmap ([`Space::is_allocated`]), counters are striped.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use super::budget::{check_pool, clock_partitions, resident_set_too_big, USED_MASK};
use super::config::Config;
use super::resident::ResidentSet;
use super::space::Space;
use super::stats::Counters;
use crate::error::{Error, Result};
use crate::storage::backend::atomic_word;
use crate::storage::dirlock::DirLock;
use crate::storage::doublewrite::DoubleWrite;
use crate::storage::layout::temp_file;
use crate::storage::meta::FORMAT_VERSION;
use crate::storage::wal::{CheckpointInfo, Wal, FIRST_LSN};
use crate::storage::{AllocTable, ClassBitmap, Meta, ReadOnlyBackend, SizeClasses, StorageBackend, PAGE_HEADER_SIZE};
use std::sync::Arc;

pub use super::inspect::{ClassAllocation, PageInspection};
pub use super::recovery::Report as RecoveryReport;

/// What a create writes before the meta file (and their temporary names, `NAME.*`).
const CREATE_FILES: &[&str] = &["alloc.table", crate::storage::dirlock::LOCK_FILE];

/// A buffer manager over one database directory. `Send + Sync`: share it with `Arc`.
pub struct BufferManager {
    pub(super) dir: PathBuf,
    pub(super) backend: std::sync::Arc<dyn StorageBackend>,
    pub(super) classes: SizeClasses,
    pub(super) spaces: Box<[OnceLock<Space>]>,
    pub(super) space_init: Mutex<()>,
    pub(super) pool: AtomicU64,
    pub(super) used: AtomicU64,
    pub(super) metadata: AtomicU64,
    pub(super) peak: AtomicU64,
    pub(super) resident: ResidentSet,
    pub(super) evictors: AtomicU64,
    /// Frames of evicted pages handed to loads ([`super::recycle`]).
    pub(super) recycler: super::recycle::Recycler,
    pub(super) pin_wait: Duration,
    pub(super) counters: Counters,
    pub(super) closed: std::sync::atomic::AtomicBool,
    /// Set by a failed fsync: later checkpoints fail instead of claiming durability.
    pub(super) sync_failed: Mutex<Option<PathBuf>>,
    /// The write-ahead log, the dirty-page table, active transactions and checkpoint state
    /// ([`crate::durability`]).
    pub(crate) durability: crate::durability::Durability,
    /// The double-write area, and the lock that serialises its batches (held from writing a
    /// batch until its pages are durable at home, so the area is never reused too early).
    pub(super) dw: DoubleWrite,
    pub(super) dw_lock: Mutex<()>,
    /// Per persistent class: the allocation bitmap as last stored on disk (a superset while
    /// a checkpoint replaces it). A page allocated there has a durable copy that an in-place
    /// write could tear, so such writes go through the double-write area. Plain writes hold
    /// the read lock until they are issued.
    pub(super) durable: RwLock<Vec<ClassBitmap>>,
    /// Whether a replacement of the allocation table failed since the last that succeeded:
    /// `durable` then holds the union of both versions, not what the file holds.
    pub(super) alloc_table_unsure: AtomicBool,
    /// Bytes of disk kept back for recovery (see [`crate::storage::reserve`]).
    disk_reserve: u64,
    /// The second memory tier, and the checksum of the image each page has there (the
    /// image of its current disk version; see [`super::tier`]).
    pub(super) remote: Option<std::sync::Arc<dyn super::tier::RemoteTier>>,
    pub(super) remote_versions: crate::sharded::PageMap<u32>,
    pub(super) warm_restart: bool,
    /// What the warm restart at open did.
    pub(super) warm_report: Mutex<Option<super::hotset::WarmReport>>,
    /// Rung when an eviction wrote dirty victims itself (wakes a [`super::Cleaner`]).
    pub(super) bell: super::cleaner::Bell,
    /// This manager's identity for the per-thread sequential-miss detector.
    pub(super) id: u64,
    /// Whether sequential misses load windows ahead ([`super::sequential`]).
    pub(super) sequential_readahead: bool,
    /// Whether scans read cold pages into rings ([`super::ring`]).
    pub(super) scan_rings: bool,
    /// The database's format version (its meta file's).
    format_version: u32,
    pub(super) partial_reads: super::PartialReads,
    /// The buffers of finished scan rings, kept for the next.
    pub(super) rings: super::ring::RingCache,
    /// The threads scan rings read with.
    pub(super) io_workers: super::io_workers::IoWorkers,
    /// Opened by [`BufferManager::open_read_only`]: nothing is ever written.
    pub(super) read_only: bool,
    /// What recovery did when this manager was opened.
    pub(super) recovered: super::recovery::Report,
    /// The database directory's lock (`None` on backends without one). Declared last so
    /// that it is released only after everything else is dropped; taken out early only by
    /// [`BufferManager::crash`].
    pub(super) dir_lock: Mutex<Option<DirLock>>,
}

// Guards are tied to the manager by lifetime; the manager itself is shared between threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<BufferManager>();
};

// The manager is built on the stack of the thread that opens it (and moved a few times
// before it is boxed or shared): keep it small, with large tables on the heap. (Striped
// counters inline once made it hundreds of KiB and overflowed a test thread's stack.)
const _: () = assert!(std::mem::size_of::<BufferManager>() <= 16 << 10);

/// The LSN in the header of the page image in `frame` (bytes 16..24, little-endian). The
/// caller holds a latch on the page (or reads optimistically and validates).
///
/// # Safety
/// `frame` is the address of a frame of a live space of this process's buffer manager
/// (8-byte aligned, at least 24 bytes, mapped for as long as the call lasts).
pub(crate) unsafe fn frame_lsn(frame: *mut u8) -> u64 {
    // SAFETY: by the contract, bytes 16..24 are an aligned word inside a mapped frame; the
    // load is atomic.
    let w = unsafe { atomic_word(frame.add(16)) }.load(Ordering::Relaxed);
    // The header is stored as its little-endian byte image.
    #[allow(clippy::host_endian_bytes)]
    let bytes = w.to_ne_bytes();
    u64::from_le_bytes(bytes)
}

/// Stores `lsn` into the header of the page image in `frame`; the caller holds the page's
/// exclusive latch.
///
/// # Safety
/// As for [`frame_lsn`].
pub(crate) unsafe fn set_frame_lsn(frame: *mut u8, lsn: u64) {
    #[allow(clippy::host_endian_bytes)]
    let w = u64::from_ne_bytes(lsn.to_le_bytes());
    // SAFETY: by the contract, as in `frame_lsn`; the store is atomic (optimistic readers
    // may load it).
    unsafe { atomic_word(frame.add(16)) }.store(w, Ordering::Relaxed);
}

/// Refuses to create a database in `dir` when it exists with files other than those an
/// interrupted create leaves.
fn refuse_existing(be: &dyn StorageBackend, dir: &Path, init_files: &[&str]) -> Result<()> {
    if !be.exists(dir) {
        return Ok(());
    }
    let entries = be.list_dir(dir).map_err(|e| Error::io("list", dir, e))?;
    // A create that was interrupted before it wrote the meta file (which goes last) left only
    // files of its own: that is no database, and creating again replaces them. Anything else
    // is refused.
    let ours = |e: &String| CREATE_FILES.iter().chain(init_files).any(|f| e == f || e.starts_with(&format!("{f}.")));
    if entries.iter().all(ours) {
        Ok(())
    } else {
        Err(Error::AlreadyExists { path: dir.to_owned() })
    }
}

impl BufferManager {
    /// Creates a new database in `config.dir` (which must not exist or be empty).
    pub fn create(config: Config) -> Result<BufferManager> {
        Self::create_with(config, &[], |_, _| Ok(()))
    }

    /// Like [`create`](Self::create), running `init` on the new directory before the meta
    /// file is written (higher layers create their own files there, so that a directory
    /// with a meta file always has them).
    /// `init_files` names the files `init` writes: a directory holding only those and the
    /// manager's own (a create interrupted before the meta file) may be created again.
    pub fn create_with(config: Config, init_files: &[&str], init: impl FnOnce(&dyn StorageBackend, &Path) -> Result<()>) -> Result<BufferManager> {
        let be = &config.backend;
        let dir = &config.dir;
        refuse_existing(be.as_ref(), dir, init_files)?;
        let min_page = config.min_page.unwrap_or(super::config::DEFAULT_MIN_PAGE);
        let classes = SizeClasses::new(min_page)
            .ok_or_else(|| Error::InvalidConfig(format!("min_page must be a power of two between 4 KiB and 64 GiB, got {min_page}")))?;
        // Refuse an unusable pool before writing anything: a create that fails must not
        // leave a database behind (a retry would then fail with AlreadyExists).
        check_pool(classes, config.pool_size, clock_partitions(classes, config.pool_size, config.clock_partitions)?)?;
        be.create_dir_all(dir).map_err(|e| Error::io("create directory", dir, e))?;
        let lock = be.lock_dir(dir)?;
        // Again under the lock: a concurrent create may have finished since the check above.
        refuse_existing(be.as_ref(), dir, init_files)?;
        AllocTable::new(classes.count()).store(be.as_ref(), dir)?;
        init(be.as_ref(), dir)?;
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        // The meta file goes last: a directory without it is not a database.
        Meta { version: FORMAT_VERSION, classes, created }.store(be.as_ref(), dir)?;
        Self::open_locked(config, lock, None)
    }

    /// Opens an existing database, holding its directory lock (see
    /// [`crate::storage::dirlock`]) until the manager is dropped: while another open holds
    /// it, in this process or another, this fails with [`Error::Locked`] and touches nothing.
    pub fn open(config: Config) -> Result<BufferManager> {
        // A directory that holds no database is refused before a lock file is put into it
        // (open_locked reads the meta file again, under the lock).
        Meta::load(config.backend.as_ref(), &config.dir)?;
        let lock = config.backend.lock_dir(&config.dir)?;
        Self::open_locked(config, lock, None)
    }

    /// Opens an existing database for reading only: no recovery, no checkpoint, and no file
    /// created, modified or replaced, whatever is done with the manager (its backend is
    /// wrapped in a [`ReadOnlyBackend`], which refuses every write; allocation, freeing,
    /// temporary pages, logging and writing pages fail with [`Error::ReadOnly`]). The
    /// directory lock is taken shared: read-only opens coexist, and a writer is refused while
    /// one runs ([`Error::LockedByReaders`]); while a writer holds it this fails with
    /// [`Error::Locked`]. If recovery is pending (the log holds transaction records after the
    /// last checkpoint, or the double-write area holds a page image whose home copy is torn
    /// or older), this fails with [`Error::RecoveryPending`]: a read-write
    /// [`open`](Self::open) recovers. The remote tier, warm restart and the cleaner of
    /// `config` are not used.
    pub fn open_read_only(config: Config) -> Result<BufferManager> {
        let ro = Arc::new(ReadOnlyBackend::new(config.backend.clone()));
        let mut config = config;
        config.backend = ro.clone();
        config.remote = None;
        config.warm_restart = false;
        config.cleaner = None;
        Meta::load(config.backend.as_ref(), &config.dir)?;
        let lock = config.backend.lock_dir_shared(&config.dir)?;
        Self::open_locked(config, lock, Some(ro))
    }

    /// [`open`](Self::open) once the directory lock is taken (`None` for backends without
    /// one); the manager keeps `lock` until it is dropped. `read_only` is the backend of a
    /// read-only open (`config.backend` wraps it).
    fn open_locked(config: Config, lock: Option<DirLock>, read_only: Option<Arc<ReadOnlyBackend>>) -> Result<BufferManager> {
        let be = config.backend.clone();
        let dir = config.dir.clone();
        let meta = Meta::load(be.as_ref(), &dir)?;
        let classes = meta.classes;
        if let Some(m) = config.min_page {
            if m != classes.min_page() {
                return Err(Error::InvalidConfig(format!(
                    "database {} has smallest page {}, configuration asks for {}",
                    dir.display(),
                    crate::util::Bytes(classes.min_page()),
                    crate::util::Bytes(m)
                )));
            }
        }
        let table = AllocTable::load(be.as_ref(), &dir, classes.count())?;
        let tmp = dir.join("tmp");
        if read_only.is_some() {
            // Temporary files are left alone (a read-only open makes none).
        } else if be.exists(&tmp) {
            for name in be.list_dir(&tmp).map_err(|e| Error::io("list", &tmp, e))? {
                be.remove(&tmp.join(name)).map_err(|e| Error::io("remove", &tmp, e))?;
            }
        } else {
            be.create_dir_all(&tmp).map_err(|e| Error::io("create directory", &tmp, e))?;
        }
        let pool = config.pool_size;
        let partitions = clock_partitions(classes, pool, config.clock_partitions)?;
        let rs_bytes = check_pool(classes, pool, partitions)?;
        let resident = ResidentSet::try_new(pool / classes.min_page(), partitions).ok_or_else(|| resident_set_too_big(pool, rs_bytes))?;
        let dw = DoubleWrite::open(be.as_ref(), &dir)?;
        let checkpoint = CheckpointInfo::load(be.as_ref(), &dir)?;
        let durable = table.classes.clone();
        let start_lsn = checkpoint.map_or(FIRST_LSN, |c| c.start_lsn);
        let wal = match &read_only {
            Some(ro) => Wal::open_read_only(ro.clone(), &dir, start_lsn)?,
            None => Wal::open(be.clone(), &dir, start_lsn, config.wal)?,
        };
        let bm = BufferManager {
            dir,
            backend: be,
            classes,
            spaces: (0..classes.count() * 2).map(|_| OnceLock::new()).collect(),
            space_init: Mutex::new(()),
            pool: AtomicU64::new(pool),
            used: AtomicU64::new(0),
            metadata: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            resident,
            evictors: AtomicU64::new(0),
            recycler: super::recycle::Recycler::new(config.frame_recycling, classes.count(), pool),
            bell: Default::default(),
            id: super::sequential::manager_id(),
            sequential_readahead: config.sequential_readahead,
            scan_rings: config.scan_rings,
            format_version: meta.version,
            partial_reads: config.partial_reads,
            rings: Default::default(),
            io_workers: Default::default(),
            pin_wait: config.pin_wait,
            counters: Counters::default(),
            // Closed until fully opened: if setting up a space fails below, dropping the
            // half-built manager must not checkpoint, which would replace the allocation
            // table on disk with the partial (possibly empty) one in memory.
            closed: true.into(),
            sync_failed: Mutex::new(None),
            durability: crate::durability::Durability::new(
                wal,
                checkpoint.map(|c| c.start_lsn),
                checkpoint.map_or(1, |c| c.next_txid),
                checkpoint.map_or(0, |c| c.nonce),
                config.checkpoint_every,
            ),
            dw,
            dw_lock: Mutex::new(()),
            durable: RwLock::new(durable),
            alloc_table_unsure: AtomicBool::new(false),
            disk_reserve: config.disk_reserve,
            remote: config.remote.clone(),
            remote_versions: Default::default(),
            warm_restart: config.warm_restart,
            warm_report: Mutex::new(None),
            read_only: read_only.is_some(),
            recovered: Default::default(),
            dir_lock: Mutex::new(lock),
        };
        let mut bm = bm;
        debug_assert_eq!(rs_bytes, bm.resident.memory_bytes());
        bm.charge_metadata(rs_bytes)?;
        for (class, bitmap) in table.classes.into_iter().enumerate() {
            if bitmap.allocated() > 0 {
                let hw = bitmap.high_water();
                let sp = bm.space_or_create(class as u8, false, Some(bitmap))?;
                bm.ensure_addressable(sp, hw - 1)?;
                let bits = sp.bitmap.lock();
                for index in bits.iter() {
                    sp.mirror_allocated(index, true);
                }
            }
        }
        if bm.read_only {
            // Stays `closed`: the drop writes nothing.
            bm.refuse_pending_recovery(start_lsn)?;
            return Ok(bm);
        }
        // Finish the last double-write batch before anything reads a page, then recover
        // from the log; only then may a checkpoint (or the drop) write anything. Recovery
        // gets the reserved disk space first (the disk may have filled up).
        let recover = |bm: &BufferManager| -> Result<RecoveryReport> {
            let restored = bm.restore_double_writes()?;
            let mut report = super::recovery::recover(bm, start_lsn)?;
            report.pages_restored = restored;
            if report.records > 0 {
                bm.checkpoint()?;
            }
            Ok(report)
        };
        let report = if bm.durability.wal.end() > start_lsn || !bm.dw.is_empty()? { bm.with_disk_reserve(recover)? } else { recover(&bm)? };
        crate::storage::reserve::ensure(bm.backend.as_ref(), &bm.dir, bm.disk_reserve);
        bm.recovered = report;
        bm.closed.store(false, Ordering::Relaxed);
        if bm.warm_restart && bm.remote.is_some() {
            // Best effort: a missing, stale or unreadable snapshot only means a cold start.
            let report = bm.warm_from_remote().ok();
            *bm.warm_report.lock() = report;
        }
        Ok(bm)
    }

    /// Runs `f` (recovery's work, which must not fail for lack of space) with the disk space
    /// of the reserve given back to the file system, then takes the reserve again where
    /// space allows (see [`crate::storage::reserve`]).
    pub(crate) fn with_disk_reserve<T>(&self, f: impl FnOnce(&BufferManager) -> Result<T>) -> Result<T> {
        crate::storage::reserve::release(self.backend.as_ref(), &self.dir)?;
        let r = f(self);
        crate::storage::reserve::ensure(self.backend.as_ref(), &self.dir, self.disk_reserve);
        r
    }

    /// Whether this manager was opened read-only ([`open_read_only`](Self::open_read_only)).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// What recovery did when this manager was opened (all zero for a clean database and
    /// for read-only opens).
    pub fn recovery_report(&self) -> RecoveryReport {
        self.recovered
    }

    pub(super) fn refuse_if_read_only(&self, op: &'static str) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly { dir: self.dir.clone(), op });
        }
        Ok(())
    }

    /// The database directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The size classes.
    pub fn classes(&self) -> SizeClasses {
        self.classes
    }

    /// The storage backend.
    pub fn backend(&self) -> &std::sync::Arc<dyn StorageBackend> {
        &self.backend
    }

    /// Partitions of the resident set and the clock ([`Config::clock_partitions`]).
    pub fn clock_partitions(&self) -> usize {
        self.resident.partitions()
    }

    /// Whether scans read their cold pages into scan rings (`Config::scan_rings`, see
    /// [`super::ring`]).
    pub fn scan_rings(&self) -> bool {
        self.scan_rings
    }

    /// The database's format version ([`crate::storage::meta::FORMAT_VERSION`] for a
    /// database this build created; older ones keep theirs).
    pub fn format_version(&self) -> u32 {
        self.format_version
    }

    /// The current cap in bytes.
    pub fn pool_size(&self) -> u64 {
        self.pool.load(Ordering::Relaxed)
    }

    /// Bytes counted against the cap now.
    pub fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed) & USED_MASK
    }

    /// High-water mark of [`used_bytes`](Self::used_bytes).
    pub fn peak_bytes(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Largest payload a page of `class` holds.
    pub fn payload_size(&self, class: u8) -> usize {
        self.classes.page_size(class) as usize - PAGE_HEADER_SIZE
    }

    /// Checkpoints and removes the temporary files. Dropping the manager without `close`
    /// also checkpoints, but ignores errors.
    pub fn close(self) -> Result<()> {
        let mut r = self.checkpoint();
        if r.is_ok() && self.warm_restart && self.remote.is_some() {
            r = self.save_hot_set().map(|_| ());
        }
        self.closed.store(true, Ordering::Relaxed);
        for class in 0..self.classes.count() {
            if self.spaces[class * 2 + 1].get().is_some() {
                let _ = self.backend.remove(&temp_file(&self.dir, class as u8));
            }
        }
        r
    }

    /// Simulates the death of the process, for crash tests and the recovery benchmark:
    /// nothing more of this manager runs (no checkpoint, no close; its memory and open
    /// files are leaked), and the directory lock is released, as the kernel releases it when
    /// a process dies, so that the database can be opened again in this process.
    pub fn crash(self) {
        drop(self.take_dir_lock());
        std::mem::forget(self);
    }

    /// Takes the directory lock out of the manager (for [`crash`](Self::crash) and
    /// `Database::crash`, which then leak the manager).
    pub(crate) fn take_dir_lock(&self) -> Option<DirLock> {
        self.dir_lock.lock().take()
    }
}

impl Drop for BufferManager {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::Relaxed) {
            let _ = self.checkpoint();
            for class in 0..self.classes.count() {
                if self.spaces[class * 2 + 1].get().is_some() {
                    let _ = self.backend.remove(&temp_file(&self.dir, class as u8));
                }
            }
        }
    }
}
