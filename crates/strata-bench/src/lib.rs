//! Benchmark harness for strata, with honest baselines measured in the same process run.
//!
//! Every engine implements one small page-access trait, [`PageStore`], over the *same* data
//! files (strata's own class files: page `i` of a size class lives at byte `i * page_size`),
//! so all engines read the same bytes from the same place on the same device:
//!
//! * `strata`: the buffer manager under test ([`engines::StrataStore`]).
//! * `hashpool`: the classic design (PostgreSQL, SMILE): fixed-size frames allocated up
//!   front, a partitioned hash table page → frame, pin and usage counts, clock sweep, one
//!   page size per pool, `O_DIRECT` reads ([`engines::HashPool`]).
//! * `static-split`: two hashpools of different page sizes sharing the memory 75 % / 25 %
//!   (Kùzu before its variable-size buffer manager) ([`engines::StaticSplit`]).
//! * `mmap`: the files mapped read-only; the OS page cache decides (LMDB style)
//!   ([`engines::MmapStore`]), capped by a cgroup v2 `memory.max` where the machine allows.
//! * `raw`: `O_DIRECT` reads with no cache at all: the device limit ([`engines::RawStore`]).
//!
//! `bench btree` compares key-value B-trees instead, behind [`kv::KvStore`]: strata's B+-tree,
//! redb, LMDB (heed) and an in-memory `BTreeMap`.
//!
//! The benchmarks ([`benchmarks`]) alternate engines within one run and print one JSON object
//! each (see `docs/cli.md`); [`plot`] draws a PNG of the throughputs.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod benchmarks;
pub mod dataset;
pub mod engines;
pub mod harness;
pub mod kv;
pub mod machine;
pub mod plot;
pub mod workload;

use std::fmt;
use std::ops::Range;

pub use benchmarks::{run, Options, BENCHMARKS};

/// One page of a data set: which data file (`file`, an index into the data set's files)
/// and which page of it (`index`; the page lives at byte `index * page_size` of the file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Page {
    /// The data file.
    pub file: u16,
    /// The page within the file.
    pub index: u64,
}

impl Page {
    /// Page `index` of file `file`.
    pub const fn new(file: u16, index: u64) -> Page {
        Page { file, index }
    }
}

/// Why an engine could not do what it was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineError(pub String);

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EngineError {}

impl From<strata::Error> for EngineError {
    fn from(e: strata::Error) -> Self {
        EngineError(e.to_string())
    }
}

impl From<std::io::Error> for EngineError {
    fn from(e: std::io::Error) -> Self {
        EngineError(e.to_string())
    }
}

/// Result of an engine operation.
pub type EResult<T> = Result<T, EngineError>;

/// Counters an engine keeps (for hit rates and bytes read in a measurement window).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCounters {
    /// Page accesses that found the page cached (None: the engine does not know, e.g. mmap).
    pub hits: Option<u64>,
    /// Page accesses that had to read it.
    pub misses: Option<u64>,
    /// Bytes read from the data files.
    pub bytes_read: u64,
}

impl IoCounters {
    /// `self - earlier`, field by field.
    pub fn since(&self, earlier: &IoCounters) -> IoCounters {
        IoCounters {
            hits: self.hits.zip(earlier.hits).map(|(a, b)| a.saturating_sub(b)),
            misses: self.misses.zip(earlier.misses).map(|(a, b)| a.saturating_sub(b)),
            bytes_read: self.bytes_read.saturating_sub(earlier.bytes_read),
        }
    }
}

/// The memory an engine holds for pages right now (for timelines such as mixed-size's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryUse {
    /// Physical bytes of resident pages by page size: `(page size, bytes)`.
    pub resident: Vec<(u64, u64)>,
    /// Virtual bytes reserved for frames.
    pub virtual_bytes: u64,
}

impl MemoryUse {
    /// Resident bytes of pages of `page_size`.
    pub fn resident_of(&self, page_size: u64) -> u64 {
        self.resident.iter().filter(|(s, _)| *s == page_size).map(|(_, b)| b).sum()
    }
}

/// Read access to the pages of a data set, implemented by strata and every baseline.
///
/// Readers get the page's *payload*: the bytes after strata's 32-byte page header, so that
/// every engine hands out exactly the same bytes for the same page.
pub trait PageStore: Sync {
    /// The engine's name as it appears in the JSON output.
    fn name(&self) -> &'static str;

    /// Page size of data file `file` (bytes, header included).
    fn page_size(&self, file: u16) -> usize;

    /// Calls `f` with the payload of `page` while the page is held (pinned / latched).
    fn read(&self, page: Page, f: &mut dyn FnMut(&[u8])) -> EResult<()>;

    /// Holds *all* of `pages` at once (as an operator that needs several pages resident at
    /// the same time does), then calls `f(i, payload)` for each, then releases them. Fails if
    /// the engine cannot hold them all.
    fn read_pinned(&self, pages: &[Page], f: &mut dyn FnMut(usize, &[u8])) -> EResult<()>;

    /// Reads a batch of independent pages and calls `f(i, payload of pages[i])` for each, in
    /// order (duplicates allowed; pages need not be held at the same time). This is how a
    /// caller asks for a queue depth larger than its thread count: an engine that can have
    /// all of the batch's reads in flight at once (`raw` through io_uring, `strata` through
    /// its batch load) overrides it.
    ///
    /// The default reads the pages one after the other with [`PageStore::read`]: synchronous
    /// reads, so for engines that keep it (hashpool, static-split, mmap) the queue depth stays
    /// the thread count whatever the batch size.
    fn read_batch(&self, pages: &[Page], f: &mut dyn FnMut(usize, &[u8])) -> EResult<()> {
        for (i, &p) in pages.iter().enumerate() {
            self.read(p, &mut |d| f(i, d))?;
        }
        Ok(())
    }

    /// Calls `f(index, payload)` for pages `range` of `file`, in order. Engines that have a
    /// better way to read a range than page by page (large sequential reads) override it.
    fn scan(&self, file: u16, range: Range<u64>, f: &mut dyn FnMut(u64, &[u8])) -> EResult<()> {
        for index in range {
            self.read(Page::new(file, index), &mut |d| f(index, d))?;
        }
        Ok(())
    }

    /// A snapshot of the engine's counters.
    fn counters(&self) -> IoCounters;

    /// The memory the engine holds for pages now, where it can tell (None: it cannot, e.g.
    /// mmap, whose memory is the OS page cache's).
    fn memory(&self) -> Option<MemoryUse> {
        None
    }

    /// Engine-specific facts for the JSON output (cache capacity, whether memory is capped,
    /// whether I/O is direct, ...).
    fn describe(&self) -> serde_json::Map<String, serde_json::Value> {
        serde_json::Map::new()
    }
}
