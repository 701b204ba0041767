//! The buffer manager: one memory budget over pages of every size class.
//!
//! # Protocol
//!
//! * **Translation.** A page id names a space (class, persistent or temporary) and an index;
//!   its state word and frame are found by arithmetic in the space's reservations.
//! * **Fix.** A resident page is latched with one compare-and-swap on its state word (see
//!   [`super::state`]); nothing global is touched except a striped hit counter.
//! * **Miss.** The fixing thread takes `EVICTED -> LOCKED`, checks the allocation bitmap,
//!   [reserves](BufferManager::reserve) the page's bytes in the budget (evicting if needed),
//!   reads the page straight into its frame, verifies checksum and id, inserts it into the
//!   resident set and keeps or downgrades the latch.
//! * **Budget.** `used` counts resident page bytes plus metadata and is only ever increased
//!   by a compare-and-swap that keeps it `<= pool`: the cap holds at every instant, whatever
//!   the interleaving. Physical memory is touched only after the bytes were reserved.
//! * **Eviction.** Clock over the resident set, across all classes: an unlatched page is
//!   first MARKED; a page still MARKED on the next visit is a victim if its exclusive latch
//!   can be *taken without waiting*. Dirty victims are written (checksummed) first, then
//!   their frames are dropped with `MADV_DONTNEED` (adjacent frames in one call), their
//!   state set to EVICTED with a new version, and their bytes returned to the budget.
//!   Evictors never wait for latches, so a thread holding latches that needs memory cannot
//!   deadlock with another; if nothing is evictable it waits a bounded time for unpins and
//!   then reports [`Error::OutOfMemory`].
//!
//! Lock order: a space's bitmap mutex is never held while waiting for a page latch; the
//! resident-set `RwLock` is taken for writing only by `set_pool_size` (which holds no
//! latch).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use super::config::Config;
use super::guard::{ExclusiveGuard, OptimisticGuard, Restart, SharedGuard};
use super::region::Discard;
use super::resident::ResidentSet;
use super::space::{Space, META_PER_STATE_CHUNK, STATES_PER_OS_PAGE};
use super::state::{PageState, EVICTED, LOCKED, MARKED, PREFETCHED, PREFETCHED_MARKED, UNLOCKED};
use super::stats::{ClassStats, Counters, IoStats, Stats};
use crate::error::{Error, Result};
use crate::storage::backend::{atomic_word, OpenMode};
use crate::storage::dirlock::DirLock;
use crate::storage::doublewrite::DoubleWrite;
use crate::storage::layout::{class_file, temp_file};
use crate::storage::meta::FORMAT_VERSION;
use crate::storage::page::{self, checksum, header_words};
use crate::storage::wal::{CheckpointInfo, Wal, FIRST_LSN};
use crate::storage::{AllocTable, ClassBitmap, IoBufMut, Meta, PageId, ReadOnlyBackend, ReadReq, SizeClasses, StorageBackend, WriteReq, PAGE_HEADER_SIZE};
use std::sync::Arc;

pub use super::recovery::Report as RecoveryReport;

/// What a create writes before the meta file (and their temporary names, `NAME.*`).
const CREATE_FILES: &[&str] = &["alloc.table", crate::storage::dirlock::LOCK_FILE];

/// How many slots an evictor takes from the clock per step.
const CLOCK_BATCH: usize = 64;
/// Largest read that prefetch coalesces adjacent pages into.
const MAX_COALESCED_READ: u64 = 1 << 20;
/// Largest write request write-back makes of adjacent pages.
const MAX_COALESCED_WRITE: u64 = 1 << 20;

/// The `used` word packs two fields: the bytes counted against the cap (its low `USED_BITS`
/// bits, see [`BufferManager::used_bytes`]) and a shrink generation (the high bits), which
/// every [`BufferManager::set_pool_size`] that lowers the cap bumps after storing the new
/// cap. A reservation compare-and-swaps the whole word, so one that read the cap before a
/// shrink fails (the word changed) and retries under the new cap. Without the generation,
/// a reservation that read the old cap could still succeed after the shrink had seen `used`
/// below the new cap and returned, leaving `used` above the cap it had just set.
const USED_BITS: u32 = 52;
/// Mask of the byte count in the `used` word (4 PiB; reservations never carry past it).
const USED_MASK: u64 = (1 << USED_BITS) - 1;
/// One step of the shrink generation in the `used` word (it wraps, which is harmless: a
/// reservation would have to sleep between its load and its CAS through 4096 shrinks).
const SHRINK_GENERATION: u64 = 1 << USED_BITS;

/// Pages `first..first + n` of a space, latched by a prefetch and read with one request.
#[derive(Clone, Copy)]
struct Run<'a> {
    sp: &'a Space,
    first: u64,
    n: u64,
}

/// One size class's allocation ([`BufferManager::allocation`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ClassAllocation {
    /// The size class.
    pub class: u8,
    /// Its page size in bytes.
    pub page_size: u64,
    /// Allocated pages.
    pub pages_allocated: u64,
    /// One past the highest allocated index (every index from there on is free).
    pub high_water: u64,
    /// Page slots the class's data file holds (its length over the page size).
    pub file_pages: u64,
    /// Allocated indices as inclusive ranges `(first, last)`, ascending.
    pub allocated: Vec<(u64, u64)>,
    /// Free indices below the larger of `high_water` and `file_pages`, as inclusive ranges.
    pub free: Vec<(u64, u64)>,
}

/// A page as read from disk ([`BufferManager::inspect_page`]).
#[derive(Clone, Debug)]
pub struct PageInspection {
    /// The page asked for.
    pub pid: PageId,
    /// Its data file, and its byte offset and size there.
    pub file: PathBuf,
    pub offset: u64,
    pub page_size: u64,
    /// Bytes of the page the file holds (short when the file ends inside the page; the rest
    /// was read as zeros).
    pub bytes_on_disk: u64,
    /// The header as stored.
    pub header: page::Header,
    /// The checksum the page's bytes have.
    pub computed_checksum: u32,
    /// The page's LSN if it verifies (checksum, magic, id), else what is wrong.
    pub verdict: std::result::Result<u64, page::PageFault>,
}

/// A buffer manager over one database directory. `Send + Sync`: share it with `Arc`.
pub struct BufferManager {
    dir: PathBuf,
    backend: std::sync::Arc<dyn StorageBackend>,
    classes: SizeClasses,
    pub(super) spaces: Box<[OnceLock<Space>]>,
    space_init: Mutex<()>,
    pool: AtomicU64,
    used: AtomicU64,
    metadata: AtomicU64,
    peak: AtomicU64,
    pub(super) resident: RwLock<ResidentSet>,
    evictors: AtomicU64,
    pin_wait: Duration,
    pub(super) counters: Counters,
    closed: std::sync::atomic::AtomicBool,
    /// Set by a failed fsync: later checkpoints fail instead of claiming durability.
    sync_failed: Mutex<Option<PathBuf>>,
    /// The write-ahead log.
    pub(crate) wal: Wal,
    /// The double-write area, and the lock that serialises its batches (held from writing a
    /// batch until its pages are durable at home, so the area is never reused too early).
    dw: DoubleWrite,
    dw_lock: Mutex<()>,
    /// Per persistent class: the allocation bitmap as last stored on disk (a superset while
    /// a checkpoint replaces it). A page allocated there has a durable copy that an in-place
    /// write could tear, so such writes go through the double-write area. Plain writes hold
    /// the read lock until they are issued.
    durable: RwLock<Vec<ClassBitmap>>,
    /// Dirty page table: every dirty persistent page, with the LSN from which the log may
    /// hold changes not yet on its disk copy. Checkpoints flush these (not the whole pool).
    pub(crate) dirty: Mutex<HashMap<PageId, u64>>,
    /// Active transactions: id -> LSN at which they began (log truncation must keep it).
    pub(crate) active: Mutex<BTreeMap<u64, u64>>,
    pub(crate) next_txid: AtomicU64,
    /// The second memory tier, and the checksum of the image each page has there (the
    /// image of its current disk version; see [`super::tier`]).
    pub(super) remote: Option<std::sync::Arc<dyn super::tier::RemoteTier>>,
    pub(super) remote_versions: Mutex<HashMap<PageId, u32>>,
    /// The nonce of the last checkpoint (see [`CheckpointInfo::nonce`]); 0 before the first.
    pub(super) nonce: AtomicU64,
    warm_restart: bool,
    /// What the warm restart at open did.
    pub(super) warm_report: Mutex<Option<super::hotset::WarmReport>>,
    /// One checkpoint at a time; the log position where the last one began, and how much log
    /// may accumulate before a commit triggers the next.
    checkpoint_lock: Mutex<()>,
    last_checkpoint: AtomicU64,
    checkpoint_every: u64,
    /// Rung when an eviction wrote dirty victims itself (wakes a [`super::Cleaner`]).
    pub(super) bell: super::cleaner::Bell,
    /// This manager's identity for the per-thread sequential-miss detector.
    pub(super) id: u64,
    /// Whether sequential misses load windows ahead ([`super::sequential`]).
    pub(super) sequential_readahead: bool,
    /// Opened by [`BufferManager::open_read_only`]: nothing is ever written.
    read_only: bool,
    /// What recovery did when this manager was opened.
    recovered: super::recovery::Report,
    /// The database directory's lock (`None` on backends without one). Declared last so
    /// that it is released only after everything else is dropped; taken out early only by
    /// [`BufferManager::crash`].
    dir_lock: Mutex<Option<DirLock>>,
}

// Guards are tied to the manager by lifetime; the manager itself is shared between threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<BufferManager>();
};

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

/// Asks the CPU to load the cache line at `p` (no effect where the architecture has no
/// prefetch instruction here).
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults, whatever the address, and changes
    // no memory.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// 64 random bits (std's per-process random hash keys, mixed with the time).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.write_u32(std::process::id());
    h.finish()
}

struct Backoff(u32);

impl Backoff {
    fn snooze(&mut self) {
        self.0 += 1;
        if self.0 < 16 {
            crate::sync::spin_hint();
        } else if self.0 < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Checks that a pool of `pool` bytes holds the resident set plus one smallest page;
/// returns the resident set's size.
fn check_pool(classes: SizeClasses, pool: u64) -> Result<u64> {
    let rs_bytes = ResidentSet::memory_bytes_for(pool / classes.min_page());
    let needed = rs_bytes.saturating_add(classes.min_page());
    if needed > pool {
        return Err(Error::PoolTooSmall { needed, pool });
    }
    Ok(rs_bytes)
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

fn resident_set_too_big(pool: u64, rs_bytes: u64) -> Error {
    Error::InvalidConfig(format!(
        "a pool of {} needs a resident-page table of {}, which cannot be allocated; choose a smaller pool",
        crate::util::Bytes(pool),
        crate::util::Bytes(rs_bytes)
    ))
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
        check_pool(classes, config.pool_size)?;
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
        let rs_bytes = check_pool(classes, pool)?;
        let resident = ResidentSet::try_with_capacity(pool / classes.min_page()).ok_or_else(|| resident_set_too_big(pool, rs_bytes))?;
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
            resident: RwLock::new(resident),
            evictors: AtomicU64::new(0),
            bell: Default::default(),
            id: super::sequential::manager_id(),
            sequential_readahead: config.sequential_readahead,
            pin_wait: config.pin_wait,
            counters: Counters::default(),
            // Closed until fully opened: if setting up a space fails below, dropping the
            // half-built manager must not checkpoint, which would replace the allocation
            // table on disk with the partial (possibly empty) one in memory.
            closed: true.into(),
            sync_failed: Mutex::new(None),
            wal,
            dw,
            dw_lock: Mutex::new(()),
            durable: RwLock::new(durable),
            dirty: Mutex::new(HashMap::new()),
            active: Mutex::new(BTreeMap::new()),
            next_txid: AtomicU64::new(checkpoint.map_or(1, |c| c.next_txid)),
            remote: config.remote.clone(),
            remote_versions: Mutex::new(HashMap::new()),
            checkpoint_lock: Mutex::new(()),
            last_checkpoint: AtomicU64::new(0),
            checkpoint_every: config.checkpoint_every,
            nonce: AtomicU64::new(checkpoint.map_or(0, |c| c.nonce)),
            warm_restart: config.warm_restart,
            warm_report: Mutex::new(None),
            read_only: read_only.is_some(),
            recovered: Default::default(),
            dir_lock: Mutex::new(lock),
        };
        let mut bm = bm;
        bm.last_checkpoint.store(bm.wal.end(), Ordering::Relaxed);
        debug_assert_eq!(rs_bytes, bm.resident.read().memory_bytes());
        bm.charge_metadata(rs_bytes)?;
        for (class, bitmap) in table.classes.into_iter().enumerate() {
            if bitmap.allocated() > 0 {
                let hw = bitmap.high_water();
                let sp = bm.space_or_create(class as u8, false, Some(bitmap))?;
                bm.ensure_addressable(sp, hw - 1)?;
            }
        }
        if bm.read_only {
            // Stays `closed`: the drop writes nothing.
            bm.refuse_pending_recovery(start_lsn)?;
            return Ok(bm);
        }
        // Finish the last double-write batch before anything reads a page, then recover
        // from the log; only then may a checkpoint (or the drop) write anything.
        let restored = bm.restore_double_writes()?;
        let mut report = super::recovery::recover(&bm, start_lsn)?;
        report.pages_restored = restored;
        if report.records > 0 {
            bm.checkpoint()?;
        }
        bm.recovered = report;
        bm.closed.store(false, Ordering::Relaxed);
        if bm.warm_restart && bm.remote.is_some() {
            // Best effort: a missing, stale or unreadable snapshot only means a cold start.
            let report = bm.warm_from_remote().ok();
            *bm.warm_report.lock() = report;
        }
        Ok(bm)
    }

    /// The intact images of the last double-write batch whose home copy is torn or older.
    fn stale_double_writes(&self) -> Result<Vec<crate::storage::doublewrite::Saved>> {
        let mut stale = Vec::new();
        for saved in self.dw.saved()? {
            let pid = saved.pid;
            if pid.is_temp() || pid.class() as usize >= self.classes.count() || saved.image.len() as u64 != self.classes.page_size(pid.class()) {
                continue;
            }
            let sp = self.space_or_create(pid.class(), false, None)?;
            let mut home = crate::storage::AlignedBuf::zeroed(saved.image.len());
            let n = sp.file.read_at(home.io(), sp.offset(pid.index())).map_err(|e| Error::io("read page", sp.path(), e))?;
            if n < home.len() || page::verify(&home, pid).map_or(true, |lsn| lsn < saved.lsn) {
                stale.push(saved);
            }
        }
        Ok(stale)
    }

    /// Copies every intact image of the last double-write batch home whose home copy is torn
    /// or older, and makes them durable; returns how many were copied.
    fn restore_double_writes(&self) -> Result<u64> {
        let stale = self.stale_double_writes()?;
        let mut touched = Vec::new();
        for saved in &stale {
            let pid = saved.pid;
            let sp = self.space_or_create(pid.class(), false, None)?;
            sp.file.write_at(&saved.image, sp.offset(pid.index())).map_err(|e| Error::io("write page", sp.path(), e))?;
            if !touched.contains(&pid.class()) {
                touched.push(pid.class());
            }
        }
        for class in touched {
            let sp = self.space_or_create(class, false, None)?;
            sp.file.sync().map_err(|e| Error::io("fsync", sp.path(), e))?;
        }
        Ok(stale.len() as u64)
    }

    /// For a read-only open: fails with [`Error::RecoveryPending`] when a read-write open
    /// would recover (transaction records in the log from `start`, or stale double-write
    /// images), which a read-only open cannot do.
    fn refuse_pending_recovery(&self, start: u64) -> Result<()> {
        let mut records = 0u64;
        for rec in self.wal.reader(start) {
            if rec?.txid != 0 {
                records += 1;
            }
        }
        let stale = self.stale_double_writes()?.len();
        let mut why = Vec::new();
        if records > 0 {
            why.push(format!("the log holds {records} transaction records after the last checkpoint"));
        }
        if stale > 0 {
            why.push(format!("the double-write area holds {stale} page images not yet copied home"));
        }
        if why.is_empty() {
            return Ok(());
        }
        Err(Error::RecoveryPending { dir: self.dir.clone(), reason: why.join("; ") })
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

    fn refuse_if_read_only(&self, op: &'static str) -> Result<()> {
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

    // ----------------------------------------------------------------- spaces

    fn space_or_create(&self, class: u8, temp: bool, bitmap: Option<ClassBitmap>) -> Result<&Space> {
        let slot = &self.spaces[class as usize * 2 + temp as usize];
        if let Some(sp) = slot.get() {
            return Ok(sp);
        }
        let _g = self.space_init.lock();
        if let Some(sp) = slot.get() {
            return Ok(sp);
        }
        if temp {
            self.refuse_if_read_only("using temporary pages")?;
        }
        let path = if temp { temp_file(&self.dir, class) } else { class_file(&self.dir, class) };
        let file = self.backend.open(&path, OpenMode::Direct, true).map_err(|e| Error::io("open", &path, e))?;
        let sp = Space::new(class, temp, self.classes.page_shift(class), file, bitmap.unwrap_or_default());
        Ok(slot.get_or_init(|| sp))
    }

    /// The space of `pid` and check that its index is addressable.
    #[inline]
    pub(super) fn lookup(&self, pid: PageId) -> Result<&Space> {
        let sp =
            self.spaces.get(pid.space()).and_then(|s| s.get()).ok_or(Error::InvalidPageId { pid, reason: "no page of this size class was ever allocated" })?;
        if !sp.addressable(pid.index()) {
            return Err(Error::InvalidPageId { pid, reason: "index beyond any allocated page" });
        }
        Ok(sp)
    }

    fn ensure_addressable(&self, sp: &Space, index: u64) -> Result<()> {
        let chunks = index / STATES_PER_OS_PAGE + 1;
        let charged = sp.charged_chunks.load(Ordering::Acquire);
        if chunks > charged {
            // Charge the metadata before touching it; only one thread grows a space at a
            // time (callers hold the space's bitmap lock or are in `open`).
            self.charge_metadata((chunks - charged) * META_PER_STATE_CHUNK)?;
            sp.charged_chunks.store(chunks, Ordering::Release);
        }
        sp.states.ensure(index)?;
        sp.frames.ensure(index)
    }

    fn charge_metadata(&self, bytes: u64) -> Result<()> {
        self.reserve(bytes)?;
        self.metadata.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    // ----------------------------------------------------------------- budget

    /// Reserves `bytes` in the budget, evicting as needed; never lets `used` exceed the cap.
    fn reserve(&self, bytes: u64) -> Result<()> {
        self.reserve_within(bytes, self.pin_wait)
    }

    /// Like `reserve`, but gives up at once when nothing is evictable (for prefetches,
    /// which must never wait for pinned pages).
    pub(super) fn try_reserve(&self, bytes: u64) -> Result<()> {
        self.reserve_within(bytes, Duration::ZERO)
    }

    fn reserve_within(&self, bytes: u64, wait: Duration) -> Result<()> {
        let start = Instant::now();
        let mut backoff = Backoff(0);
        loop {
            // Acquire: a word that carries a shrink's generation bump makes the cap stored
            // before that bump visible to the load below (see `USED_BITS`).
            let word = self.used.load(Ordering::Acquire);
            let used = word & USED_MASK;
            // Clamped so that `used + bytes` never carries into the generation.
            let limit = self.pool.load(Ordering::Relaxed).min(USED_MASK);
            if used + bytes <= limit {
                if self.used.compare_exchange_weak(word, word + bytes, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    self.peak.fetch_max(used + bytes, Ordering::Relaxed);
                    return Ok(());
                }
                continue;
            }
            let meta = self.metadata.load(Ordering::Relaxed);
            if bytes + meta > limit {
                return Err(Error::PoolTooSmall { needed: bytes + meta, pool: limit });
            }
            // Evict at least 1/64 of the pool at a time: dirty victims are written (and their
            // double write fsynced) as one batch, so one page per miss would cost two fsyncs
            // per page.
            let freed = self.evict((used + bytes - limit).max(limit / 64))?;
            if freed > 0 {
                backoff = Backoff(0);
                continue;
            }
            if self.evictors.load(Ordering::Acquire) > 0 {
                // Another thread holds victims it is about to free.
                std::thread::yield_now();
                continue;
            }
            if start.elapsed() >= wait {
                let used = self.used_bytes();
                return Err(Error::OutOfMemory {
                    requested: bytes,
                    used,
                    limit,
                    pinned: used.saturating_sub(self.metadata.load(Ordering::Relaxed)),
                    waited_ms: start.elapsed().as_millis() as u64,
                });
            }
            backoff.snooze();
        }
    }

    pub(super) fn release(&self, bytes: u64) {
        let prev = self.used.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(prev & USED_MASK >= bytes);
    }

    /// Runs the clock until at least `need` bytes were freed or two laps found nothing.
    /// Returns the bytes freed.
    fn evict(&self, need: u64) -> Result<u64> {
        self.evictors.fetch_add(1, Ordering::AcqRel);
        let result = self.evict_inner(need);
        self.evictors.fetch_sub(1, Ordering::AcqRel);
        result
    }

    fn evict_inner(&self, need: u64) -> Result<u64> {
        let rs = self.resident.read();
        let mut victims: Vec<(PageId, &Space)> = Vec::new();
        let mut claimed = 0u64;
        let mut scanned = 0usize;
        let lap = 2 * rs.capacity();
        while claimed < need && scanned < lap {
            rs.clock_batch(CLOCK_BATCH, |pid| {
                if claimed >= need {
                    return;
                }
                let Some(sp) = self.spaces[pid.space()].get() else { return };
                let st = sp.state(pid.index());
                let w = st.load();
                match w.state() {
                    UNLOCKED | PREFETCHED => {
                        st.try_mark(w);
                    }
                    MARKED | PREFETCHED_MARKED if st.try_lock_exclusive(w) => {
                        if w.state() == PREFETCHED_MARKED {
                            // Loaded ahead and never fixed: the prefetch was wasted.
                            self.counters.prefetch_wasted.add(1);
                        }
                        claimed += sp.page_size();
                        victims.push((pid, sp));
                    }
                    _ => {}
                }
            });
            scanned += CLOCK_BATCH;
        }
        drop(rs);
        if victims.is_empty() {
            return Ok(0);
        }
        let mut first_error = None;
        // Write back the dirty victims as one batch; if it fails they stay resident.
        let dirty: Vec<(PageId, &Space)> = victims.iter().copied().filter(|&(pid, sp)| sp.state(pid.index()).load().dirty()).collect();
        if !dirty.is_empty() {
            // Written in the foreground: a cleaner should have got to them first.
            self.counters.dirty_victims.add(dirty.len() as u64);
            self.bell.ring();
            if let Err(e) = self.write_back(&dirty) {
                for &(pid, sp) in &dirty {
                    sp.state(pid.index()).unlock_exclusive_unchanged(false);
                }
                let failed: std::collections::HashSet<PageId> = dirty.iter().map(|d| d.0).collect();
                victims.retain(|v| !failed.contains(&v.0));
                first_error = Some(e);
            }
        }
        self.offer_to_remote(&victims);
        victims.sort_by_key(|&(pid, _)| pid);
        // Adjacent frames of one space are one range; all ranges go to the kernel together
        // (one TLB flush where it can), while the victims are still latched.
        let mut discard = Discard::default();
        let mut i = 0;
        while i < victims.len() {
            let (first, sp) = victims[i];
            let mut j = i + 1;
            while j < victims.len() && victims[j].0.space() == first.space() && victims[j].0.index() == first.index() + (j - i) as u64 {
                j += 1;
            }
            sp.frames.discard_later(first.index(), (j - i) as u64, &mut discard);
            i = j;
        }
        discard.run();
        let rs = self.resident.read();
        let mut freed = 0;
        for &(pid, sp) in &victims {
            let removed = rs.remove(pid);
            debug_assert!(removed, "victim {pid} not in the resident set");
            sp.resident_bytes.fetch_sub(sp.page_size(), Ordering::Relaxed);
            sp.state(pid.index()).unlock_evicted();
            freed += sp.page_size();
        }
        drop(rs);
        self.counters.evictions.add(victims.len() as u64);
        self.release(freed);
        match first_error {
            Some(e) if freed == 0 => Err(e),
            _ => Ok(freed),
        }
    }

    /// One round of the background cleaner (see [`super::cleaner`]): writes back the dirty
    /// MARKED pages among the next `target` bytes of pages ahead of the clock hand, as one
    /// batch, and leaves them MARKED and clean (the clock's next victims, now without a
    /// write). Never waits for a latch. Returns the number of pages written; on error they
    /// stay dirty.
    pub fn clean_ahead(&self, target: u64) -> Result<usize> {
        let rs = self.resident.read();
        let start = rs.hand();
        let mut seen = 0u64;
        let mut scanned = 0usize;
        let mut latched: Vec<(PageId, &Space)> = Vec::new();
        while seen < target && scanned < rs.capacity() {
            rs.peek(start.wrapping_add(scanned), CLOCK_BATCH, |pid| {
                let Some(sp) = self.spaces[pid.space()].get() else { return };
                let st = sp.state(pid.index());
                let w = st.load();
                if !w.is_resident() || seen >= target {
                    return;
                }
                seen += sp.page_size();
                // Dirty is only set under the exclusive latch, so it stays set once we hold it.
                if w.state() == MARKED && w.dirty() && st.try_lock_exclusive(w) {
                    latched.push((pid, sp));
                }
            });
            scanned += CLOCK_BATCH;
        }
        drop(rs);
        if latched.is_empty() {
            return Ok(0);
        }
        let r = self.write_back(&latched);
        for &(pid, sp) in &latched {
            let st = sp.state(pid.index());
            if r.is_ok() {
                st.unlock_cleaned();
            } else {
                st.unlock_exclusive_unchanged(false);
            }
        }
        r?;
        self.counters.pages_cleaned.add(latched.len() as u64);
        Ok(latched.len())
    }

    /// Offers the clean persistent victims (latched, about to be dropped) to the remote tier.
    fn offer_to_remote(&self, victims: &[(PageId, &Space)]) {
        let Some(tier) = &self.remote else { return };
        let image = |pid: PageId, sp: &Space| -> &[u8] {
            // SAFETY: the evictor holds the victim's exclusive latch; the page is clean, so
            // its frame holds exactly its sealed disk image; others only load from it.
            unsafe { std::slice::from_raw_parts(sp.frame(pid.index()), sp.page_size() as usize) }
        };
        let mut offer = Vec::new();
        {
            let mut versions = self.remote_versions.lock();
            for &(pid, sp) in victims.iter().filter(|(pid, _)| !pid.is_temp()) {
                let crc = u32::from_le_bytes(image(pid, sp)[0..4].try_into().unwrap());
                // The tier holds this very image already (the page came from there, or was
                // offered before and has not changed): do not send it again.
                if versions.insert(pid, crc) != Some(crc) {
                    offer.push((pid, sp));
                }
            }
        }
        for (pid, sp) in offer {
            tier.put(pid, image(pid, sp));
            self.counters.remote_puts.add(1);
        }
    }

    /// The page's disk copy is about to change or the page is freed: the remote tier's
    /// image of it must never be used again.
    fn forget_remote(&self, pid: PageId) {
        if let Some(tier) = &self.remote {
            if self.remote_versions.lock().remove(&pid).is_some() {
                tier.remove(pid);
            }
        }
    }

    /// Tries to fill the frame of `pid` (latched by the caller, `size` bytes) from the remote
    /// tier; true if it holds a verified image of the page's current version.
    fn load_from_remote(&self, sp: &Space, index: u64) -> bool {
        let Some(tier) = &self.remote else { return false };
        let pid = sp.pid(index);
        if !self.remote_versions.lock().contains_key(&pid) {
            return false;
        }
        self.install_remote(sp, index, tier.get(pid, sp.page_size() as usize))
    }

    /// Puts what the tier answered for page `index` (latched by the caller) into its frame if
    /// it is a verified image of the page's current version; counts the outcome.
    pub(super) fn install_remote(&self, sp: &Space, index: u64, answer: Result<Option<Vec<u8>>, String>) -> bool {
        let pid = sp.pid(index);
        let Some(crc) = self.remote_versions.lock().get(&pid).copied() else { return false };
        let size = sp.page_size() as usize;
        match answer {
            Ok(Some(bytes)) if bytes.len() == size && bytes[0..4] == crc.to_le_bytes() && page::verify(&bytes, pid).is_ok() => {
                // SAFETY: the caller holds the page's exclusive latch (no other writer); the
                // frame is mapped, aligned and `size` bytes long; optimistic readers only load.
                let mut buf = unsafe { IoBufMut::from_frame(sp.frame(index), size) };
                buf.copy_from(0, &bytes);
                self.counters.remote_hits.add(1);
                true
            }
            Ok(Some(_)) => {
                // Forget it, so that the next eviction offers the page again.
                self.counters.remote_rejected.add(1);
                self.forget_remote(pid);
                false
            }
            Ok(None) => {
                self.counters.remote_misses.add(1);
                self.remote_versions.lock().remove(&pid);
                false
            }
            Err(_) => {
                self.counters.remote_errors.add(1);
                false
            }
        }
    }

    /// Seals page `index` of `sp` (header with its LSN, then the checksum) in its frame and
    /// returns its LSN; the caller holds its exclusive latch.
    fn seal(&self, sp: &Space, index: u64) -> u64 {
        let frame = sp.frame(index);
        let size = sp.page_size() as usize;
        // SAFETY: `frame` is the frame of a page of `sp`, a live space of this manager.
        let lsn = unsafe { frame_lsn(frame) };
        // SAFETY: the caller holds the exclusive latch, so no thread writes the frame; the
        // only concurrent accesses are optimistic atomic loads (reads alongside reads).
        let payload = unsafe { std::slice::from_raw_parts(frame.add(PAGE_HEADER_SIZE), size - PAGE_HEADER_SIZE) };
        let words = header_words(sp.pid(index), lsn, |head| checksum(head, payload));
        for (k, w) in words.iter().enumerate() {
            // Header words are stored as their little-endian byte image.
            #[allow(clippy::host_endian_bytes)]
            let native = u64::from_ne_bytes(w.to_le_bytes());
            // SAFETY: the frame is 4 KiB aligned, so header word k (byte 8k) is aligned and
            // inside the frame; the store is atomic (optimistic readers may load it).
            unsafe { atomic_word(frame.add(8 * k)) }.store(native, Ordering::Relaxed);
        }
        lsn
    }

    /// Seals and writes back `pages`, whose exclusive latches the caller holds; clears
    /// nothing (the caller decides their states afterwards) except their dirty-table entries.
    ///
    /// The log is made durable up to the newest page LSN first (write-ahead rule). Pages whose
    /// durable copy an in-place write could tear (logged pages, and pages allocated in the
    /// stored allocation table) go through the double-write area: batch written and fsynced
    /// there, then written home and fsynced, under `dw_lock`. On error nothing is cleaned.
    fn write_back(&self, pages: &[(PageId, &Space)]) -> Result<()> {
        self.refuse_if_read_only("writing pages")?;
        let mut max_lsn = 0;
        for &(pid, sp) in pages {
            max_lsn = max_lsn.max(self.seal(sp, pid.index()));
            self.forget_remote(pid);
        }
        if max_lsn > 0 && max_lsn >= self.wal.flushed() {
            self.wal.flush(max_lsn)?;
        }
        let image = |pid: PageId, sp: &Space| -> &[u8] {
            // SAFETY: exclusive latch held by the caller (see `seal`); the frame is mapped for
            // the page size and only loaded from by others.
            unsafe { std::slice::from_raw_parts(sp.frame(pid.index()), sp.page_size() as usize) }
        };
        let durable = self.durable.read();
        let guarded = |pid: PageId, sp: &Space| {
            // SAFETY: the frame of a page of `sp`, a live space of this manager.
            !sp.temp && (unsafe { frame_lsn(sp.frame(pid.index())) } > 0 || durable.get(sp.class as usize).is_some_and(|b| b.is_allocated(pid.index())))
        };
        let (torn_risk, unguarded): (Vec<_>, Vec<_>) = pages.iter().copied().partition(|&(pid, sp)| guarded(pid, sp));
        drop(durable);
        self.write_home(&unguarded).map_err(|(_, e)| e)?;
        if !torn_risk.is_empty() {
            let _batch = self.dw_lock.lock();
            // After a failed home write or fsync, the double-write area may hold the only good
            // copy of a page whose home is torn: it must not be overwritten before a reopen
            // restores it.
            if let Some(path) = self.sync_failed.lock().clone() {
                return Err(Error::io(
                    "write page",
                    path,
                    std::io::Error::other("an earlier page write or fsync failed; pages are not overwritten in place again until the database is reopened"),
                ));
            }
            let images: Vec<(PageId, &[u8])> = torn_risk.iter().map(|&(pid, sp)| (pid, image(pid, sp))).collect();
            self.dw.write(&images)?;
            if let Err((sp, e)) = self.write_home(&torn_risk) {
                *self.sync_failed.lock() = Some(sp.path());
                return Err(e);
            }
            let mut files: Vec<&Space> = Vec::new();
            for &(_, sp) in &torn_risk {
                if !files.iter().any(|f| std::ptr::eq(*f, sp)) {
                    files.push(sp);
                }
            }
            for sp in files {
                if let Err(e) = sp.file.sync() {
                    *self.sync_failed.lock() = Some(sp.path());
                    return Err(Error::io("fsync", sp.path(), e));
                }
            }
        }
        let mut dpt = self.dirty.lock();
        for &(pid, _) in pages {
            dpt.remove(&pid);
        }
        Ok(())
    }

    /// Writes sealed `pages` (whose exclusive latches the caller holds) to their home
    /// locations: adjacent pages of one file whose frames are contiguous go as one request of
    /// up to `MAX_COALESCED_WRITE` bytes, and all requests of a file are issued as one batch
    /// ([`StorageFile::write_many`](crate::storage::StorageFile::write_many): in flight
    /// together with io_uring). On error, the file that failed and the error; the other
    /// requests of its batch were still carried out.
    fn write_home<'s>(&self, pages: &[(PageId, &'s Space)]) -> std::result::Result<(), (&'s Space, Error)> {
        let mut pages = pages.to_vec();
        pages.sort_by_key(|&(pid, sp)| (sp as *const Space as usize, pid.index()));
        for group in pages.chunk_by(|a, b| std::ptr::eq(a.1, b.1)) {
            let sp = group[0].1;
            let size = sp.page_size();
            let max_pages = (MAX_COALESCED_WRITE / size).max(1) as usize;
            let mut reqs: Vec<WriteReq<'_>> = Vec::new();
            let mut i = 0;
            while i < group.len() {
                let first = group[i].0.index();
                let mut n = 1;
                while i + n < group.len() && n < max_pages && group[i + n].0.index() == first + n as u64 && sp.frames.same_bucket(first, first + n as u64) {
                    n += 1;
                }
                // SAFETY: the caller holds the exclusive latches of pages first..first+n
                // (no thread writes their frames; others only load), which lie in one bucket,
                // so the frames are contiguous and mapped for n pages.
                let buf = unsafe { std::slice::from_raw_parts(sp.frame(first), n * size as usize) };
                reqs.push(WriteReq::new(buf, sp.offset(first)));
                i += n;
            }
            let metered = self.counters.write_io.issue(reqs.iter().map(|r| r.buf.len() as u64), sp.file.queue_depth());
            let outcome = sp.file.write_many(&mut reqs);
            self.counters.write_io.done(metered);
            self.counters.write_requests.add(metered);
            let written: u64 = reqs.iter().filter(|r| r.result.is_ok()).map(|r| r.buf.len() as u64).sum();
            self.counters.pages_written.add(written / size);
            self.counters.bytes_written.add(written);
            outcome.map_err(|e| (sp, Error::io("write page", sp.path(), e)))?;
        }
        Ok(())
    }

    /// Records that persistent page `pid` became dirty: the log may hold changes not on its
    /// disk copy from `lsn` on (`None`: from the current end of the log, for unlogged writes).
    pub(crate) fn note_dirty(&self, pid: PageId, lsn: Option<u64>) {
        if pid.is_temp() {
            return;
        }
        let lsn = lsn.unwrap_or_else(|| self.wal.end());
        self.dirty.lock().entry(pid).or_insert(lsn);
    }

    /// Loads page `index` of `sp` into its frame. The caller holds the latch taken by
    /// `EVICTED -> LOCKED`; on error the page is left EVICTED and unlatched.
    fn load(&self, sp: &Space, index: u64) -> Result<()> {
        self.load_checked(sp, index, false).map(|_| ())
    }

    /// [`load`](Self::load); with `tolerate_damage`, a page that fails verification (never
    /// written, torn) is not an error but loaded as zeros, and `false` is returned (recovery
    /// rebuilds such pages from the log).
    fn load_checked(&self, sp: &Space, index: u64, tolerate_damage: bool) -> Result<bool> {
        let pid = sp.pid(index);
        let st = sp.state(index);
        if !sp.bitmap.lock().is_allocated(index) {
            st.unlock_still_evicted();
            return Err(Error::InvalidPageId { pid, reason: "page is not allocated (never allocated or freed)" });
        }
        let size = sp.page_size();
        if let Err(e) = self.reserve(size) {
            st.unlock_still_evicted();
            return Err(e);
        }
        if self.load_from_remote(sp, index) {
            self.counters.misses.add(1);
            sp.resident_bytes.fetch_add(size, Ordering::Relaxed);
            self.resident.read().insert(pid);
            return Ok(true);
        }
        let frame = sp.frame(index);
        // SAFETY: we hold the page's exclusive latch (no other writer); the frame is mapped,
        // aligned and `size` bytes long; optimistic readers only load from it.
        let buf = unsafe { IoBufMut::from_frame(frame, size as usize) };
        let metered = self.counters.read_io.issue(std::iter::once(size), 1);
        let read = sp.file.read_at(buf, sp.offset(index));
        self.counters.read_io.done(metered);
        let result = match read {
            Err(e) => Err(Error::io("read page", sp.path(), e)),
            Ok(n) if (n as u64) < size => Err(Error::corruption(
                sp.path(),
                Some(pid),
                format!("data file truncated: page needs bytes {}..{}, read only {n}", sp.offset(index), sp.offset(index) + size),
            )),
            Ok(_) => {
                // SAFETY: latched as above; reads alongside optimistic loads.
                let image = unsafe { std::slice::from_raw_parts(frame, size as usize) };
                page::verify(image, pid).map(|_| ()).map_err(|f| Error::corruption(sp.path(), Some(pid), f.to_string()))
            }
        };
        self.counters.misses.add(1);
        let intact = match result {
            Err(Error::Corruption { .. }) if tolerate_damage => {
                // A fresh mapping reads as zeros.
                sp.frames.discard(index, 1);
                false
            }
            Err(e) => {
                sp.frames.discard(index, 1);
                self.release(size);
                st.unlock_still_evicted();
                return Err(e);
            }
            Ok(()) => true,
        };
        self.counters.pages_read.add(1);
        self.counters.read_requests.add(1);
        self.counters.bytes_read.add(size);
        sp.resident_bytes.fetch_add(size, Ordering::Relaxed);
        self.resident.read().insert(pid);
        Ok(intact)
    }

    /// For recovery: latches allocated page `pid` exclusively, loading it if needed; a copy
    /// that fails verification is loaded as zeros and reported as `false`.
    pub(crate) fn fix_for_recovery(&self, pid: PageId) -> Result<(ExclusiveGuard<'_>, bool)> {
        let sp = self.lookup(pid)?;
        let index = pid.index();
        let st = sp.state(index);
        let mut backoff = Backoff(0);
        let intact = loop {
            let w = st.load();
            match w.state() {
                _ if w.is_unlatched() && st.try_lock_exclusive(w) => break true,
                EVICTED if st.try_lock_evicted(w) => break self.load_checked(sp, index, true)?,
                _ => backoff.snooze(),
            }
        };
        Ok((ExclusiveGuard { bm: self, sp, index, frame: sp.frame(index), _not_send: Default::default() }, intact))
    }

    /// For recovery and rollback: marks `pid` allocated (creating its space and making it
    /// addressable as needed). Returns false if it already was.
    pub(crate) fn set_allocated(&self, pid: PageId) -> Result<bool> {
        let sp = self.space_or_create(pid.class(), pid.is_temp(), None)?;
        let mut bm = sp.bitmap.lock();
        self.ensure_addressable(sp, pid.index())?;
        Ok(bm.set_allocated(pid.index()))
    }

    /// Loads those of `pids` that are not resident, coalescing runs of adjacent pages of one
    /// class (contiguous on disk and, within a reservation bucket, in memory) into single
    /// reads of up to `MAX_COALESCED_READ` bytes, and issuing the reads of all runs of a file
    /// at once ([`StorageFile::read_many`](crate::storage::StorageFile::read_many): with
    /// io_uring they are in flight together). Loaded pages are left unlatched and
    /// PREFETCHED: the first fix counts a prefetch hit; one that no fix used before the clock
    /// passed it twice (the one lap any untouched page gets) is evicted and counted as
    /// wasted.
    ///
    /// Best effort: pages that are latched, free or already resident are skipped, a page that
    /// fails verification is dropped (the fix that wants it reports the error), one call
    /// loads at most a quarter of the pool, and when the pool has no room the rest is
    /// skipped. Returns the number of pages loaded.
    pub fn prefetch(&self, pids: &[PageId]) -> usize {
        let mut loaded = 0;
        let mut next = 0;
        while next < pids.len() {
            let (runs, rest, room) = self.latch_runs(pids, next, &mut loaded);
            self.read_runs(&runs, &mut loaded);
            if !room {
                break;
            }
            next = rest;
        }
        self.counters.pages_prefetched.add(loaded as u64);
        loaded
    }

    /// One round of [`prefetch`](Self::prefetch): latches runs of adjacent, evicted,
    /// allocated pages from `pids[i..]` and reserves their bytes, up to a quarter of the pool
    /// (prefetching cannot push out more than that of what other threads are using at once).
    /// Pages the remote tier holds are loaded from there at once (counted in `loaded`).
    /// Returns the runs, where the next round starts, and whether the pool had room.
    fn latch_runs(&self, pids: &[PageId], mut i: usize, loaded: &mut usize) -> (Vec<Run<'_>>, usize, bool) {
        let mut runs: Vec<Run<'_>> = Vec::new();
        let mut budget = self.pool_size() / 4;
        while i < pids.len() {
            let Ok(sp) = self.lookup(pids[i]) else {
                i += 1;
                continue;
            };
            let size = sp.page_size();
            if size > budget && !runs.is_empty() {
                return (runs, i, true); // the round is full
            }
            let first = pids[i].index();
            let max_pages = (MAX_COALESCED_READ.min(budget) >> sp.page_shift).max(1);
            let mut n = 0u64;
            let mut from_remote = false;
            while i < pids.len() && n < max_pages {
                let pid = pids[i];
                let index = first + n;
                if pid != sp.pid(index) || !sp.addressable(index) || !sp.frames.same_bucket(first, index) {
                    break;
                }
                let st = sp.state(index);
                let w = st.load();
                if !st.try_lock_evicted(w) {
                    break;
                }
                if !sp.bitmap.lock().is_allocated(index) {
                    st.unlock_still_evicted();
                    break;
                }
                let in_tier = self.remote.is_some() && self.remote_versions.lock().contains_key(&pid);
                if in_tier && n > 0 {
                    // A disk run ends before a page the remote tier holds.
                    st.unlock_still_evicted();
                    break;
                }
                if in_tier {
                    // The remote tier has it: load it from there on its own.
                    if self.try_reserve(size).is_err() {
                        st.unlock_still_evicted();
                        return (runs, i, false);
                    }
                    if self.load_from_remote(sp, index) {
                        sp.resident_bytes.fetch_add(size, Ordering::Relaxed);
                        self.resident.read().insert(pid);
                        st.unlock_prefetched();
                        *loaded += 1;
                        budget = budget.saturating_sub(size);
                        i += 1;
                        from_remote = true;
                        break;
                    }
                    // Not usable there: read it from disk, as the first page of a run.
                    self.release(size);
                }
                n += 1;
                i += 1;
            }
            if n == 0 {
                if !from_remote {
                    i += 1; // resident, latched or free: skip it
                }
                continue;
            }
            if self.try_reserve(n * size).is_err() {
                for k in 0..n {
                    sp.state(first + k).unlock_still_evicted();
                }
                return (runs, i, false);
            }
            budget = budget.saturating_sub(n * size);
            runs.push(Run { sp, first, n });
        }
        (runs, i, true)
    }

    /// Reads latched `runs` (all those of one file as one batch, in file order), verifies
    /// each page and leaves it PREFETCHED (counted in `loaded`), or EVICTED if it failed.
    fn read_runs(&self, runs: &[Run<'_>], loaded: &mut usize) {
        let mut runs = runs.to_vec();
        runs.sort_by_key(|r| (r.sp as *const Space as usize, r.first));
        for group in runs.chunk_by(|a, b| std::ptr::eq(a.sp, b.sp)) {
            let sp = group[0].sp;
            let size = sp.page_size();
            let mut reqs: Vec<ReadReq<'_>> = group
                .iter()
                .map(|r| {
                    // SAFETY: we hold the exclusive latches of pages first..first+n, which lie
                    // in one bucket, so their frames are contiguous, mapped and 4 KiB aligned;
                    // no other thread writes them; optimistic readers only load. The view
                    // lives until the batch below has completed.
                    let buf = unsafe { IoBufMut::from_frame(sp.frame(r.first), (r.n * size) as usize) };
                    ReadReq::new(buf, sp.offset(r.first))
                })
                .collect();
            self.read_batch(sp, &mut reqs);
            for (r, req) in group.iter().zip(&reqs) {
                let got = *req.result.as_ref().unwrap_or(&0) as u64;
                for k in 0..r.n {
                    let index = r.first + k;
                    let pid = sp.pid(index);
                    let ok = (k + 1) * size <= got && {
                        // SAFETY: latched as above; reads alongside optimistic loads.
                        let image = unsafe { std::slice::from_raw_parts(sp.frame(index), size as usize) };
                        page::verify(image, pid).is_ok()
                    };
                    if ok {
                        sp.resident_bytes.fetch_add(size, Ordering::Relaxed);
                        self.resident.read().insert(pid);
                        sp.state(index).unlock_prefetched();
                        *loaded += 1;
                    } else {
                        sp.frames.discard(index, 1);
                        self.release(size);
                        sp.state(index).unlock_still_evicted();
                    }
                }
                self.counters.pages_read.add(got.min(r.n * size) / size);
                self.counters.bytes_read.add(got.min(r.n * size));
            }
        }
    }

    /// Issues `reqs` on `sp`'s file as one batch and counts them. Each request's `result`
    /// says how it went.
    fn read_batch(&self, sp: &Space, reqs: &mut [ReadReq<'_>]) {
        let n = self.counters.read_io.issue(reqs.iter().map(|r| r.buf.len() as u64), sp.file.queue_depth());
        // Errors are per request (in `result`).
        let _ = sp.file.read_many(reqs);
        self.counters.read_io.done(n);
        self.counters.read_requests.add(n);
    }

    // ----------------------------------------------------------------- fixing

    /// Counts a fix that found the page resident in word `w` (a prefetch hit if it was
    /// loaded ahead and not fixed since).
    #[inline]
    fn count_hit(&self, w: super::state::Word) {
        self.counters.hits.add_cheap(1);
        if w.is_prefetched() {
            self.counters.prefetch_hits.add(1);
        }
    }

    /// Latches `pid` exclusively, loading it if needed.
    pub fn fix_exclusive(&self, pid: PageId) -> Result<ExclusiveGuard<'_>> {
        self.refuse_if_read_only("latching pages for changes")?;
        let sp = self.lookup(pid)?;
        let index = pid.index();
        let st = sp.state(index);
        let mut backoff = Backoff(0);
        loop {
            let w = st.load();
            match w.state() {
                _ if w.is_unlatched() => {
                    if st.try_lock_exclusive(w) {
                        self.count_hit(w);
                        break;
                    }
                }
                EVICTED if self.sequential_miss(sp, index) => {}
                EVICTED => {
                    if st.try_lock_evicted(w) {
                        self.load(sp, index)?;
                        break;
                    }
                }
                _ => backoff.snooze(),
            }
        }
        Ok(ExclusiveGuard { bm: self, sp, index, frame: sp.frame(index), _not_send: Default::default() })
    }

    /// Latches `pid` exclusively if no other latch is held on it (loading it if needed);
    /// `None` if one is. For callers that latch several pages together: they must never
    /// wait for a latch while holding another (rollback of an atomic section).
    pub(crate) fn try_fix_exclusive(&self, pid: PageId) -> Result<Option<ExclusiveGuard<'_>>> {
        self.refuse_if_read_only("latching pages for changes")?;
        let sp = self.lookup(pid)?;
        let index = pid.index();
        let st = sp.state(index);
        let w = st.load();
        let got = match w.state() {
            _ if w.is_unlatched() => {
                let got = st.try_lock_exclusive(w);
                if got {
                    self.count_hit(w);
                }
                got
            }
            EVICTED => {
                let got = st.try_lock_evicted(w);
                if got {
                    self.load(sp, index)?;
                }
                got
            }
            _ => false,
        };
        Ok(got.then(|| ExclusiveGuard { bm: self, sp, index, frame: sp.frame(index), _not_send: Default::default() }))
    }

    /// Latches `pid` shared, loading it if needed.
    pub fn fix_shared(&self, pid: PageId) -> Result<SharedGuard<'_>> {
        let sp = self.lookup(pid)?;
        let index = pid.index();
        let st = sp.state(index);
        let mut backoff = Backoff(0);
        loop {
            let w = st.load();
            match w.state() {
                EVICTED if self.sequential_miss(sp, index) => {}
                EVICTED => {
                    if st.try_lock_evicted(w) {
                        self.load(sp, index)?;
                        st.downgrade_to_shared();
                        break;
                    }
                }
                LOCKED => backoff.snooze(),
                _ => {
                    if st.try_lock_shared(w) {
                        self.count_hit(w);
                        break;
                    }
                    backoff.snooze();
                }
            }
        }
        Ok(SharedGuard { sp, index, frame: sp.frame(index), _not_send: Default::default() })
    }

    /// Starts an optimistic read of `pid`, loading it if needed. No latch is held.
    /// Hints that `pid` is about to be fixed: starts loading its state word and the first
    /// line of its frame into the CPU cache, so that the two loads a fix makes overlap with
    /// other work instead of following each other (a B+-tree descent calls this as soon as
    /// it knows the child). Does nothing for a page that is not addressable.
    #[inline]
    pub fn prefetch_hint(&self, pid: PageId) {
        let Ok(sp) = self.lookup(pid) else { return };
        let index = pid.index();
        let state: *const PageState = sp.state(index);
        prefetch(state.cast());
        prefetch(sp.frame(index).wrapping_add(PAGE_HEADER_SIZE));
    }

    pub fn fix_optimistic(&self, pid: PageId) -> Result<OptimisticGuard<'_>> {
        if pid.is_temp() {
            // Their owners write them through `&mut [u8]` (ExclusiveGuard::data_mut).
            return Err(Error::InvalidPageId { pid, reason: "temporary pages are private to their owner and cannot be read optimistically" });
        }
        let sp = self.lookup(pid)?;
        let index = pid.index();
        let st = sp.state(index);
        let mut backoff = Backoff(0);
        loop {
            let w = st.load();
            match w.state() {
                EVICTED if self.sequential_miss(sp, index) => {}
                EVICTED => {
                    if st.try_lock_evicted(w) {
                        self.load(sp, index)?;
                        st.unlock_exclusive_unchanged(false);
                    }
                }
                LOCKED => backoff.snooze(),
                _ => {
                    self.counters.hits.add_cheap(1);
                    if st.clear_mark(w) && w.is_prefetched() {
                        self.counters.prefetch_hits.add(1);
                    }
                    return Ok(OptimisticGuard { bm: self, sp, index, frame: sp.frame(index), seen: w });
                }
            }
        }
    }

    /// Runs `f` on an optimistic view of `pid` until it completes without interference
    /// (`f` returns `Err(Restart)` or validation fails: retry). After 64 failed tries the
    /// read falls back to a shared latch, so it always terminates.
    pub fn read_optimistic<T>(&self, pid: PageId, mut f: impl FnMut(&OptimisticGuard<'_>) -> Result<T, Restart>) -> Result<T> {
        for _ in 0..64 {
            let g = self.fix_optimistic(pid)?;
            if let Ok(v) = f(&g) {
                if g.validate() {
                    return Ok(v);
                }
            }
        }
        let s = self.fix_shared(pid)?;
        // Under the shared latch nothing can change, so the view validates.
        let g = OptimisticGuard { bm: self, sp: s.sp, index: s.index, frame: s.frame, seen: s.sp.state(s.index).load() };
        f(&g).map_err(|_| Error::Inconsistent(format!("optimistic read of {pid} restarted under a shared latch")))
    }

    // ----------------------------------------------------------------- alloc / free

    /// Allocates a persistent page whose payload holds at least `bytes` bytes (the smallest
    /// class that fits). Returns it zeroed and exclusively latched.
    pub fn alloc(&self, bytes: usize) -> Result<ExclusiveGuard<'_>> {
        self.alloc_in(bytes, false)
    }

    /// Allocates a temporary page (same budget; written to a scratch file if evicted; gone
    /// after [`free`](Self::free) or restart).
    pub fn alloc_temp(&self, bytes: usize) -> Result<ExclusiveGuard<'_>> {
        self.alloc_in(bytes, true)
    }

    fn alloc_in(&self, bytes: usize, temp: bool) -> Result<ExclusiveGuard<'_>> {
        self.alloc_with(bytes, temp, None).map(|(g, _)| g)
    }

    /// Allocates a persistent page and logs it: `log` is called with the new id while the
    /// class's bitmap is locked (so a checkpoint's copy of the bitmap never holds an
    /// allocation whose record is not in the log) and returns the record's LSN, which
    /// becomes the page's LSN. Nothing is allocated if `log` fails.
    pub(crate) fn alloc_logged(&self, bytes: usize, log: &dyn Fn(PageId) -> Result<u64>) -> Result<(ExclusiveGuard<'_>, u64)> {
        self.alloc_with(bytes, false, Some(log))
    }

    fn alloc_with(&self, bytes: usize, temp: bool, log: Option<&dyn Fn(PageId) -> Result<u64>>) -> Result<(ExclusiveGuard<'_>, u64)> {
        self.refuse_if_read_only("allocating pages")?;
        let class = (bytes as u64)
            .checked_add(PAGE_HEADER_SIZE as u64)
            .and_then(|total| self.classes.class_for(total))
            .ok_or_else(|| Error::InvalidInput(format!("page of {bytes} bytes is larger than the largest size class")))?;
        let size = self.classes.page_size(class);
        let pool = self.pool_size();
        if size + self.metadata.load(Ordering::Relaxed) > pool {
            return Err(Error::PoolTooSmall { needed: size + self.metadata.load(Ordering::Relaxed), pool });
        }
        let sp = self.space_or_create(class, temp, None)?;
        // Memory first: once the allocation is logged, it must not fail any more.
        self.reserve(size)?;
        let (index, lsn) = {
            let mut bm = sp.bitmap.lock();
            let index = bm.alloc();
            let fail = |bm: &mut ClassBitmap, e: Error| {
                bm.free(index);
                self.release(size);
                Err(e)
            };
            if index > PageId::MAX_INDEX {
                return fail(&mut bm, Error::InvalidInput("size class is out of page ids".into()));
            }
            if let Err(e) = self.ensure_addressable(sp, index) {
                return fail(&mut bm, e);
            }
            let lsn = match log.map(|f| f(sp.pid(index))) {
                None => 0,
                Some(Ok(lsn)) => lsn,
                Some(Err(e)) => return fail(&mut bm, e),
            };
            (index, lsn)
        };
        let st = sp.state(index);
        let mut backoff = Backoff(0);
        let mut g = loop {
            let w = st.load();
            if w.state() == EVICTED && st.try_lock_evicted(w) {
                // An EVICTED frame is unbacked, hence zero: nothing to clear.
                sp.resident_bytes.fetch_add(size, Ordering::Relaxed);
                self.resident.read().insert(sp.pid(index));
                break ExclusiveGuard { bm: self, sp, index, frame: sp.frame(index), _not_send: Default::default() };
            }
            if w.is_unlatched() && st.try_lock_exclusive(w) {
                // A stray fix (of an id not yet handed out) loaded the slot's old bytes; the
                // page is resident and counted already.
                self.release(size);
                let mut g = ExclusiveGuard { bm: self, sp, index, frame: sp.frame(index), _not_send: Default::default() };
                g.zero();
                // SAFETY: the guard's frame, latched exclusively.
                unsafe { set_frame_lsn(g.frame, 0) };
                break g;
            }
            backoff.snooze();
        };
        if lsn > 0 {
            g.set_page_lsn(lsn);
        }
        Ok((g, lsn))
    }

    /// Frees `pid`. Waits for other latches on it to be released; the caller must not hold
    /// one (use [`ExclusiveGuard::free`] to free a page you have latched).
    pub fn free(&self, pid: PageId) -> Result<()> {
        self.refuse_if_read_only("freeing pages")?;
        let sp = self.lookup(pid)?;
        let index = pid.index();
        let st = sp.state(index);
        let mut backoff = Backoff(0);
        loop {
            let w = st.load();
            let got = match w.state() {
                EVICTED => st.try_lock_evicted(w),
                _ if w.is_unlatched() => st.try_lock_exclusive(w),
                _ => false,
            };
            if got {
                break;
            }
            backoff.snooze();
        }
        self.free_locked(sp, index)
    }

    /// Frees a page whose exclusive latch the caller holds (resident or not).
    pub(crate) fn free_locked(&self, sp: &Space, index: u64) -> Result<()> {
        let st = sp.state(index);
        let pid = sp.pid(index);

        let resident = self.resident.read().remove(pid);
        let mut bm = sp.bitmap.lock();
        if !bm.free(index) {
            drop(bm);
            debug_assert!(!resident);
            st.unlock_still_evicted();
            return Err(Error::InvalidPageId { pid, reason: "double free: page is not allocated" });
        }
        drop(bm);
        self.dirty.lock().remove(&pid);
        self.forget_remote(pid);
        if resident {
            sp.frames.discard(index, 1);
            sp.resident_bytes.fetch_sub(sp.page_size(), Ordering::Relaxed);
            self.release(sp.page_size());
        }
        st.unlock_evicted();
        Ok(())
    }

    /// Whether `pid` is currently allocated.
    pub fn is_allocated(&self, pid: PageId) -> bool {
        self.lookup(pid).is_ok_and(|sp| sp.bitmap.lock().is_allocated(pid.index()))
    }

    // ----------------------------------------------------------------- pool size

    /// Changes the cap. Growing is immediate; shrinking evicts down to the new cap (waiting
    /// a bounded time for pinned pages, else the old cap is restored and OutOfMemory returned).
    pub fn set_pool_size(&self, bytes: u64) -> Result<()> {
        // A cap that cannot hold the metadata plus one page can never be met, however much
        // is evicted: refuse it up front, changing nothing.
        let needed = self.metadata.load(Ordering::Relaxed).saturating_add(self.classes.min_page());
        if bytes < needed {
            return Err(Error::PoolTooSmall { needed, pool: bytes });
        }
        let old = self.pool.swap(bytes, Ordering::AcqRel);
        if bytes < old {
            // Reservations that read the old cap and have not completed must fail their
            // compare-and-swap: change the word they compare against. Every reservation
            // that did complete is then included in the `used` read below.
            self.used.fetch_add(SHRINK_GENERATION, Ordering::AcqRel);
        }
        let max_pages = bytes / self.classes.min_page();
        // The resident set must have room for every page the new pool can hold.
        if max_pages.saturating_mul(2) > self.resident.read().capacity() as u64 {
            let Some(bigger) = ResidentSet::try_with_capacity(max_pages) else {
                self.pool.store(old, Ordering::Release);
                return Err(resident_set_too_big(bytes, ResidentSet::memory_bytes_for(max_pages)));
            };
            let extra = bigger.memory_bytes() - self.resident.read().memory_bytes();
            if let Err(e) = self.charge_metadata(extra) {
                self.pool.store(old, Ordering::Release);
                return Err(e);
            }
            let mut rs = self.resident.write();
            rs.for_each(|p| bigger.insert(p));
            *rs = bigger;
        }
        let start = Instant::now();
        let mut backoff = Backoff(0);
        loop {
            let used = self.used_bytes();
            if used <= bytes {
                return Ok(());
            }
            let freed = match self.evict(used - bytes) {
                Ok(freed) => freed,
                Err(e) => {
                    // E.g. the disk is full and only dirty pages are left: as when pinned
                    // pages remain, the shrink is abandoned and the old cap restored.
                    self.pool.store(old.max(self.used_bytes()), Ordering::Release);
                    return Err(e);
                }
            };
            if freed == 0 && self.evictors.load(Ordering::Acquire) == 0 {
                if start.elapsed() >= self.pin_wait {
                    self.pool.store(old.max(used), Ordering::Release);
                    return Err(Error::OutOfMemory {
                        requested: used - bytes,
                        used,
                        limit: bytes,
                        pinned: used - self.metadata.load(Ordering::Relaxed),
                        waited_ms: start.elapsed().as_millis() as u64,
                    });
                }
                backoff.snooze();
            }
        }
    }

    // ----------------------------------------------------------------- flush

    /// Writes every dirty persistent page, fsyncs the data files, persists the allocation
    /// table (atomically) and the log's checkpoint record, and deletes the log segments that
    /// recovery no longer needs. Temporary pages are not written.
    ///
    /// Only the pages in the dirty table are visited (not the whole pool). Transactions may
    /// run meanwhile: pages they dirty after the checkpoint began stay in the dirty table and
    /// keep the log from being truncated past their first change. The calling thread must not
    /// hold page latches (a checkpoint waits for them).
    pub fn checkpoint(&self) -> Result<()> {
        let _one = self.checkpoint_lock.lock();
        self.checkpoint_locked()
    }

    /// Runs a checkpoint if more than the configured volume of log accumulated since the last
    /// one began and no other checkpoint is running (called after commits).
    pub(crate) fn maybe_checkpoint(&self) -> Result<()> {
        if self.wal.end().saturating_sub(self.last_checkpoint.load(Ordering::Relaxed)) < self.checkpoint_every {
            return Ok(());
        }
        match self.checkpoint_lock.try_lock() {
            Some(_one) => self.checkpoint_locked(),
            None => Ok(()),
        }
    }

    fn checkpoint_locked(&self) -> Result<()> {
        if self.read_only {
            // Nothing to write unless someone changed a page, which is refused.
            if self.dirty.lock().is_empty() {
                return Ok(());
            }
            return Err(Error::ReadOnly { dir: self.dir.clone(), op: "checkpointing changed pages" });
        }
        let began = self.wal.end();
        self.last_checkpoint.store(began, Ordering::Relaxed);
        // Every allocation in the table stored below must have its log record on disk.
        self.wal.flush_all()?;
        let mut dirty: Vec<PageId> = self.dirty.lock().iter().filter(|(_, &lsn)| lsn <= began).map(|(&p, _)| p).collect();
        dirty.sort();
        for batch in dirty.chunks(CLOCK_BATCH) {
            let mut latched: Vec<(PageId, &Space)> = Vec::new();
            for &pid in batch {
                let Ok(sp) = self.lookup(pid) else { continue };
                let st = sp.state(pid.index());
                let mut backoff = Backoff(0);
                loop {
                    let w = st.load();
                    if w.state() == EVICTED || !w.dirty() {
                        break;
                    }
                    if st.try_lock_exclusive(w) {
                        if st.load().dirty() {
                            latched.push((pid, sp));
                        } else {
                            st.unlock_exclusive_unchanged(false);
                        }
                        break;
                    }
                    backoff.snooze();
                }
            }
            let r = if latched.is_empty() { Ok(()) } else { self.write_back(&latched) };
            for &(pid, sp) in &latched {
                sp.state(pid.index()).unlock_exclusive_unchanged(r.is_ok());
            }
            r?;
        }
        // After a failed fsync the kernel may have dropped the error state of pages written
        // before it (Linux reports it once), so nothing written since the last good sync is
        // known to be durable: refuse to report success again until the database is reopened.
        if let Some(path) = self.sync_failed.lock().clone() {
            return Err(Error::io(
                "fsync",
                path,
                std::io::Error::other("an earlier fsync of this file failed; durability is unknown until the database is reopened and checked"),
            ));
        }
        {
            // Every page write so far is made durable, so the double-write area is no longer
            // needed; no batch may be between its double write and its home fsync meanwhile.
            let _batch = self.dw_lock.lock();
            for class in 0..self.classes.count() {
                if let Some(sp) = self.spaces[class * 2].get() {
                    if let Err(e) = sp.file.sync() {
                        *self.sync_failed.lock() = Some(sp.path());
                        return Err(Error::io("fsync", sp.path(), e));
                    }
                }
            }
            self.dw.clear()?;
        }
        let mut table = AllocTable::new(self.classes.count());
        for class in 0..self.classes.count() {
            if let Some(sp) = self.spaces[class * 2].get() {
                table.classes[class] = sp.bitmap.lock().clone();
            }
        }
        // While the table is replaced, a slot allocated in either version counts as durable.
        {
            let mut durable = self.durable.write();
            durable.resize(self.classes.count(), ClassBitmap::default());
            for (d, t) in durable.iter_mut().zip(&table.classes) {
                d.union_with(t);
            }
        }
        table.store(self.backend.as_ref(), &self.dir)?;
        *self.durable.write() = table.classes;
        let oldest_dirty = self.dirty.lock().values().copied().min().unwrap_or(u64::MAX);
        let oldest_tx = self.active.lock().values().copied().min().unwrap_or(u64::MAX);
        let start_lsn = began.min(oldest_dirty).min(oldest_tx);
        let nonce = random_u64();
        CheckpointInfo { start_lsn, next_txid: self.next_txid.load(Ordering::Relaxed), nonce }.store(self.backend.as_ref(), &self.dir)?;
        self.nonce.store(nonce, Ordering::Relaxed);
        self.wal.truncate_before(start_lsn)
    }

    /// Checkpoints and removes the temporary files. Dropping the manager without `close`
    /// also checkpoints, but ignores errors.
    pub fn close(self) -> Result<()> {
        let mut r = self.checkpoint();
        if r.is_ok() && self.warm_restart && self.remote.is_some() {
            r = self.save_hot_set().map(|_| ());
        }
        self.closed.store(true, Ordering::Relaxed);
        let tmp = self.dir.join("tmp");
        for class in 0..self.classes.count() {
            if self.spaces[class * 2 + 1].get().is_some() {
                let _ = self.backend.remove(&temp_file(&self.dir, class as u8));
            }
        }
        let _ = tmp;
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

    // ----------------------------------------------------------------- introspection

    /// A snapshot of the statistics.
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let mut classes = Vec::new();
        let mut reserved = 0;
        let mut direct = true;
        let mut resident = 0;
        for class in 0..self.classes.count() {
            let p = self.spaces[class * 2].get();
            let t = self.spaces[class * 2 + 1].get();
            if p.is_none() && t.is_none() {
                continue;
            }
            let mut cs = ClassStats { class: class as u8, page_size: self.classes.page_size(class as u8), ..Default::default() };
            for sp in [p, t].into_iter().flatten() {
                reserved += sp.frames.mapped_bytes() + sp.states.mapped_bytes();
                direct &= sp.file.is_direct();
                cs.resident_bytes += sp.resident();
                let n = sp.bitmap.lock().allocated();
                if sp.temp {
                    cs.temp_pages = n;
                } else {
                    cs.allocated_pages = n;
                    cs.file_bytes = sp.file.len().unwrap_or(0);
                }
            }
            resident += cs.resident_bytes;
            classes.push(cs);
        }
        Stats {
            pool_bytes: self.pool_size(),
            used_bytes: self.used_bytes(),
            metadata_bytes: self.metadata.load(Ordering::Relaxed),
            resident_bytes: resident,
            peak_resident_bytes: self.peak_bytes(),
            hits: c.hits.get(),
            misses: c.misses.get(),
            pages_read: c.pages_read.get(),
            read_requests: c.read_requests.get(),
            pages_prefetched: c.pages_prefetched.get(),
            prefetch_hits: c.prefetch_hits.get(),
            sequential_windows: c.sequential_windows.get(),
            prefetch_wasted: c.prefetch_wasted.get(),
            io: {
                let (read_queue_depth, read_request_bytes) = c.read_io.snapshot();
                let (write_queue_depth, write_request_bytes) = c.write_io.snapshot();
                IoStats { backend: self.backend.io_name(), read_queue_depth, read_request_bytes, write_queue_depth, write_request_bytes }
            },
            write_requests: c.write_requests.get(),
            dirty_victims: c.dirty_victims.get(),
            pages_cleaned: c.pages_cleaned.get(),
            bytes_read: c.bytes_read.get(),
            pages_written: c.pages_written.get(),
            bytes_written: c.bytes_written.get(),
            evictions: c.evictions.get(),
            remote: self.remote.as_ref().map(|t| super::tier::RemoteStats {
                hits: c.remote_hits.get(),
                misses: c.remote_misses.get(),
                rejected: c.remote_rejected.get(),
                errors: c.remote_errors.get(),
                puts: c.remote_puts.get(),
                ..t.stats()
            }),
            reserved_bytes: reserved,
            madvise_failures: super::region::madvise_failures(),
            direct_io: direct,
            classes,
        }
    }

    /// The allocation of every size class that holds (or held, since this open) persistent
    /// pages, by class: allocated and free page indices as compact ranges.
    pub fn allocation(&self) -> Vec<ClassAllocation> {
        let mut out = Vec::new();
        for class in 0..self.classes.count() {
            let Some(sp) = self.spaces[class * 2].get() else { continue };
            let page_size = sp.page_size();
            let file_pages = sp.file.len().unwrap_or(0) / page_size;
            let bm = sp.bitmap.lock();
            let high_water = bm.high_water();
            out.push(ClassAllocation {
                class: class as u8,
                page_size,
                pages_allocated: bm.allocated(),
                high_water,
                file_pages,
                allocated: bm.runs(),
                free: bm.free_runs(high_water.max(file_pages)),
            });
        }
        out
    }

    /// Reads persistent page `pid` straight from its data file (bypassing the pool, so a
    /// resident page that was changed since shows its older disk copy) and reports its
    /// header and whether it verifies, for inspection. A page that fails verification is
    /// reported, not an error; a temporary page, a class this database does not have and a
    /// page that is not allocated are [`Error::InvalidPageId`].
    pub fn inspect_page(&self, pid: PageId) -> Result<PageInspection> {
        if pid.is_temp() {
            return Err(Error::InvalidPageId { pid, reason: "temporary pages are never stored in the database" });
        }
        if pid.class() as usize >= self.classes.count() {
            return Err(Error::InvalidPageId { pid, reason: "this database has no such size class" });
        }
        let not_allocated = Error::InvalidPageId { pid, reason: "page is not allocated (never allocated or freed)" };
        let Some(sp) = self.spaces[pid.space()].get() else { return Err(not_allocated) };
        if !sp.bitmap.lock().is_allocated(pid.index()) {
            return Err(not_allocated);
        }
        let size = sp.page_size();
        let offset = sp.offset(pid.index());
        let mut image = crate::storage::AlignedBuf::zeroed(size as usize);
        let n = sp.file.read_at(image.io(), offset).map_err(|e| Error::io("read page", sp.path(), e))?;
        Ok(PageInspection {
            pid,
            file: sp.path(),
            offset,
            page_size: size,
            bytes_on_disk: n as u64,
            header: page::Header::parse(&image),
            computed_checksum: page::computed_checksum(&image),
            verdict: page::verify(&image, pid),
        })
    }

    /// Allocated persistent page ids of every class, ascending.
    pub fn allocated_pages(&self) -> Vec<PageId> {
        let mut out = Vec::new();
        for class in 0..self.classes.count() {
            if let Some(sp) = self.spaces[class * 2].get() {
                let bm = sp.bitmap.lock();
                out.extend(bm.iter().map(|i| sp.pid(i)));
            }
        }
        out
    }

    /// Checks the buffer manager's invariants: every resident page is allocated and in the
    /// resident set, per-space resident bytes match the resident set, and used bytes equal
    /// resident bytes plus metadata (exact when no other thread is working).
    pub fn check_invariants(&self) -> Result<()> {
        let rs = self.resident.read();
        let mut by_space = vec![0u64; self.spaces.len()];
        let mut count = 0u64;
        let mut problem = None;
        rs.for_each(|pid| {
            count += 1;
            let Ok(sp) = self.lookup(pid) else {
                problem.get_or_insert(format!("resident set holds unknown page {pid}"));
                return;
            };
            by_space[pid.space()] += sp.page_size();
            if !sp.bitmap.lock().is_allocated(pid.index()) {
                problem.get_or_insert(format!("resident page {pid} is not allocated"));
            }
            if sp.state(pid.index()).load().state() == EVICTED {
                problem.get_or_insert(format!("page {pid} is in the resident set but EVICTED"));
            }
        });
        drop(rs);
        let mut resident = 0;
        for (i, slot) in self.spaces.iter().enumerate() {
            if let Some(sp) = slot.get() {
                if sp.resident() != by_space[i] {
                    problem.get_or_insert(format!("class {} accounts {} resident bytes, resident set has {}", sp.class, sp.resident(), by_space[i]));
                }
                // Every allocated, addressable page that is not EVICTED must be in the set.
                let bm = sp.bitmap.lock();
                for index in 0..sp.states.limit().min(bm.capacity()) {
                    let w = sp.state(index).load();
                    if w.state() != EVICTED && !bm.is_allocated(index) {
                        problem.get_or_insert(format!("page {} is resident but free", sp.pid(index)));
                    }
                }
                resident += sp.resident();
            }
        }
        let used = self.used_bytes();
        let meta = self.metadata.load(Ordering::Relaxed);
        if used != resident + meta {
            problem.get_or_insert(format!("used bytes {used} != resident {resident} + metadata {meta}"));
        }
        if used > self.pool_size() {
            problem.get_or_insert(format!("used bytes {used} exceed the pool {}", self.pool_size()));
        }
        match problem {
            Some(p) => Err(Error::Inconsistent(p)),
            None => Ok(()),
        }
    }

    /// Reads page `pid` straight from disk (bypassing the pool) and verifies it; used by
    /// `check`. Resident dirty pages are skipped (their disk copy is legitimately old).
    pub fn verify_on_disk(&self, pid: PageId, buf: &mut crate::storage::AlignedBuf) -> Result<()> {
        let sp = self.lookup(pid)?;
        let size = sp.page_size() as usize;
        // A free slot holds no page (or a freed one's stale bytes): that is a bad id, not
        // corruption of the database.
        if !sp.bitmap.lock().is_allocated(pid.index()) {
            return Err(Error::InvalidPageId { pid, reason: "page is not allocated (never allocated or freed)" });
        }
        if buf.len() < size {
            return Err(Error::InvalidInput(format!(
                "verify buffer of {} is smaller than page {pid} ({})",
                crate::util::Bytes(buf.len() as u64),
                crate::util::Bytes(size as u64)
            )));
        }
        let w = sp.state(pid.index()).load();
        if w.state() != EVICTED && w.dirty() {
            return Ok(());
        }
        let n = sp.file.read_at(IoBufMut::from_slice(&mut buf.as_mut()[..size]), sp.offset(pid.index())).map_err(|e| Error::io("read page", sp.path(), e))?;
        if n < size {
            return Err(Error::corruption(
                sp.path(),
                Some(pid),
                format!("data file truncated: page needs bytes {}..{}, file ends before", sp.offset(pid.index()), sp.offset(pid.index()) + size as u64),
            ));
        }
        page::verify(&buf[..size], pid).map(|_| ()).map_err(|f| Error::corruption(sp.path(), Some(pid), f.to_string()))
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
