//! Configuration of a buffer manager, built fluently (in the style of foyer's builders).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::storage::wal::WalOptions;
use crate::storage::StorageBackend;

/// Default smallest page: 64 KiB (use 4 KiB on small devices).
pub const DEFAULT_MIN_PAGE: u64 = 64 << 10;
/// Default log volume after which a commit triggers a checkpoint: 64 MiB.
pub const DEFAULT_CHECKPOINT_EVERY: u64 = 64 << 20;
/// Default pool: 256 MiB.
pub const DEFAULT_POOL: u64 = 256 << 20;

/// The storage backend of a new [`Config`]: io_uring for page data where the kernel allows
/// it (`STRATA_IO=posix` turns it off), else `pread`/`pwrite`.
pub fn default_backend() -> Arc<dyn StorageBackend> {
    #[cfg(target_os = "linux")]
    return Arc::new(crate::storage::UringBackend::new());
    #[cfg(not(target_os = "linux"))]
    return Arc::new(crate::storage::FileBackend::default());
}

/// Smallest page size whose frames are recycled by default ([`Config::frame_recycling`]).
pub const DEFAULT_RECYCLE_MIN_PAGE: u64 = 256 << 10;

/// How to open or create a database's buffer manager.
#[derive(Clone, Debug)]
pub struct Config {
    pub(crate) dir: PathBuf,
    pub(crate) pool_size: u64,
    pub(crate) min_page: Option<u64>,
    pub(crate) backend: Arc<dyn StorageBackend>,
    pub(crate) pin_wait: Duration,
    pub(crate) wal: WalOptions,
    pub(crate) checkpoint_every: u64,
    pub(crate) disk_reserve: u64,
    pub(crate) warm_restart: bool,
    pub(crate) remote: Option<Arc<dyn super::tier::RemoteTier>>,
    pub(crate) cleaner: Option<super::cleaner::CleanerOptions>,
    pub(crate) sequential_readahead: bool,
    /// Whether scans read cold pages into rings instead of frames.
    pub(crate) scan_rings: bool,
    /// When scan rings read only the parts of pages a scan needs.
    pub(crate) partial_reads: PartialReads,
    /// Smallest page size whose frames are recycled; `None`: recycling off.
    pub(crate) frame_recycling: Option<u64>,
    /// Partitions of the resident set and clock; `None`: chosen at open.
    pub(crate) clock_partitions: Option<usize>,
}

/// When scan rings read only the parts of pages their scan needs
/// ([`Config::partial_reads`]). Fewer bytes (measured at TPC-H SF 1: 1.6-2.8x fewer on the
/// line-item queries), more requests (a page's parts are read apart, where whole adjacent
/// pages are one request): worth it while the scan waits for its reads, a cost (CPU of the
/// I/O threads, requests) while it does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartialReads {
    /// Whole pages always.
    Off,
    /// The default: the batches after the scan waited for its ring (it is bound by the
    /// reads) are read in parts, for a while after each wait; whole pages while it keeps up
    /// (it is bound by its own work; the whole pages also keep the ring's prediction of
    /// the parts up to date).
    WhenWaiting,
    /// Every batch in parts, as far as the parts save enough of a page (measured: slower
    /// than whole pages where the scan is bound by its own work, Q1 and Q21 of TPC-H).
    Always,
}

impl PartialReads {
    /// The default, or what `STRATA_PARTIAL_READS` says.
    fn from_env() -> PartialReads {
        match std::env::var("STRATA_PARTIAL_READS").as_deref() {
            Ok("1" | "on" | "true" | "always") => PartialReads::Always,
            Ok("0" | "off" | "false") => PartialReads::Off,
            _ => PartialReads::WhenWaiting,
        }
    }
}

impl Config {
    /// A configuration for the database in `dir` with default settings.
    pub fn new(dir: impl AsRef<Path>) -> Config {
        Config {
            dir: dir.as_ref().to_owned(),
            pool_size: DEFAULT_POOL,
            min_page: None,
            backend: default_backend(),
            pin_wait: Duration::from_secs(1),
            wal: WalOptions::default(),
            checkpoint_every: DEFAULT_CHECKPOINT_EVERY,
            disk_reserve: crate::storage::reserve::DEFAULT_RESERVE,
            warm_restart: false,
            remote: None,
            cleaner: None,
            sequential_readahead: true,
            scan_rings: !matches!(std::env::var("STRATA_SCAN_RINGS").as_deref(), Ok("0" | "off" | "false")),
            partial_reads: PartialReads::from_env(),
            frame_recycling: match std::env::var("STRATA_FRAME_RECYCLING").as_deref() {
                Ok("0" | "off" | "false") => None,
                Ok("1" | "on" | "true" | "all") => Some(0),
                _ => Some(DEFAULT_RECYCLE_MIN_PAGE),
            },
            clock_partitions: None,
        }
    }

    /// Whether loads of pages of at least `min_page` bytes take the physical memory of
    /// evicted pages of their size instead of fresh zeroed memory ([`crate::buffer`]'s
    /// `recycle` module: `UFFDIO_MOVE`, Linux 6.8+; where the kernel lacks it, recycling is
    /// off whatever is asked); `None` turns it off. Default: pages of 256 KiB and more
    /// ([`DEFAULT_RECYCLE_MIN_PAGE`]), where it was measured to pay at every thread count
    /// (a 1 MiB miss costs 183 instead of 428 us of CPU at one thread, 288 instead of 468 at
    /// eight); for small pages each move's TLB flush costs more than the page faults it
    /// saves once several threads run (bench/README, "Frame recycling"). The environment
    /// variable `STRATA_FRAME_RECYCLING` changes the default: `0`/`off` (off), `1`/`all`
    /// (every size). Which mechanism is used shows in
    /// [`crate::buffer::Stats::frame_recycling`].
    pub fn frame_recycling(mut self, min_page: Option<u64>) -> Config {
        self.frame_recycling = min_page;
        self
    }

    /// Partitions of the resident-page set and the clock: a power of two from 1 to 64
    /// (anything else is refused at open with [`crate::Error::InvalidConfig`]). Each has its
    /// own slots and its own clock hand, so that misses and evictions on different cores
    /// share no cache line; an eviction starts in a partition chosen per thread (a cursor that
    /// advances by one at each eviction) and moves on when
    /// that one has nothing to give. Default: the number of CPUs rounded up to a power of
    /// two, at most 64, and no more than a pool of this size can give every partition 64
    /// slots (so a small pool gets one partition and the set costs no extra memory).
    pub fn clock_partitions(mut self, n: usize) -> Config {
        self.clock_partitions = Some(n);
        self
    }

    /// The hard cap on resident page bytes plus the buffer manager's own metadata.
    pub fn pool_size(mut self, bytes: u64) -> Config {
        self.pool_size = bytes;
        self
    }

    /// The smallest page size: fixed at creation; when given at open it must match.
    pub fn min_page(mut self, bytes: u64) -> Config {
        self.min_page = Some(bytes);
        self
    }

    /// The storage backend all file I/O goes through.
    pub fn backend(mut self, backend: Arc<dyn StorageBackend>) -> Config {
        self.backend = backend;
        self
    }

    /// How long a fix waits for pinned pages to be released before it reports
    /// [`crate::Error::OutOfMemory`].
    pub fn pin_wait(mut self, wait: Duration) -> Config {
        self.pin_wait = wait;
        self
    }

    /// Size at which the write-ahead log starts a new segment file (default 16 MiB; log
    /// truncation after a checkpoint removes whole segments).
    pub fn wal_segment_size(mut self, bytes: u64) -> Config {
        self.wal.segment_size = bytes;
        self
    }

    /// Disk space a read-write open keeps back in the file `DIR/reserve` (default 1 MiB; 0:
    /// none), given back to recovery on the next open, so that a database whose disk filled
    /// up can still be recovered and read (see [`crate::storage::reserve`]).
    pub fn disk_reserve(mut self, bytes: u64) -> Config {
        self.disk_reserve = bytes;
        self
    }

    /// Log bytes after which a committing transaction runs a checkpoint (bounding recovery
    /// time and log size); `u64::MAX` turns automatic checkpoints off.
    pub fn checkpoint_every(mut self, log_bytes: u64) -> Config {
        self.checkpoint_every = log_bytes;
        self
    }

    /// Whether concurrent commits share one log fsync (default on; off only to measure it).
    pub fn group_commit(mut self, on: bool) -> Config {
        self.wal.group_commit = on;
        self
    }

    /// A second memory tier for clean pages evicted from the pool (see
    /// [`super::tier`]); misses try it before the disk.
    pub fn remote_tier(mut self, tier: Arc<dyn super::tier::RemoteTier>) -> Config {
        self.remote = Some(tier);
        self
    }

    /// Two-tier fast restart (needs a remote tier): `close` stores the resident pages and a
    /// snapshot of their ids in the remote tier, and `open` warms the pool from there when
    /// the database has not changed since (see [`super::hotset`]).
    pub fn warm_restart(mut self, on: bool) -> Config {
        self.warm_restart = on;
        self
    }

    /// A background cleaner (see [`super::cleaner`]) that writes back dirty pages just
    /// ahead of the clock, so that evictions rarely write. [`crate::Database`] starts it at
    /// open; a bare [`super::BufferManager`] ignores it (start a [`super::Cleaner`]).
    pub fn cleaner(mut self, opts: super::cleaner::CleanerOptions) -> Config {
        self.cleaner = Some(opts);
        self
    }

    /// Whether a scan reads the pages ahead of it that are not in memory into a ring of its
    /// own buffers (charged to the pool while the scan runs) instead of into their frames
    /// ([`crate::buffer::ring`]): the kernel then neither zeroes nor reclaims a frame per
    /// page, and the scan pushes nothing else out of the pool. Off: such pages are read
    /// ahead into their frames. Default on; the environment variable `STRATA_SCAN_RINGS=0`
    /// turns it off.
    pub fn scan_rings(mut self, on: bool) -> Config {
        self.scan_rings = on;
        self
    }

    /// When scan rings read of each page only the parts the scan needs, where its reader
    /// says which ([`crate::buffer::partial`]: a table scan reads the blocks of the columns
    /// its query names of packed leaves with a column directory), instead of whole pages;
    /// see [`PartialReads`]. Default [`PartialReads::WhenWaiting`]; the environment
    /// variable `STRATA_PARTIAL_READS` changes it: `0`/`off`, `1`/`on`/`always`.
    pub fn partial_reads(mut self, mode: PartialReads) -> Config {
        self.partial_reads = mode;
        self
    }

    /// Whether a thread's misses of consecutive pages of one file load windows of the pages
    /// after them (see [`super::sequential`]; default on).
    pub fn sequential_readahead(mut self, on: bool) -> Config {
        self.sequential_readahead = on;
        self
    }

    /// The database directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pool size in bytes.
    pub fn pool(&self) -> u64 {
        self.pool_size
    }
}
