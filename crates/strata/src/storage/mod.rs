//! The storage layer: everything that touches files.
//!
//! * [`backend`]: the [`StorageBackend`]/[`StorageFile`] traits every byte to disk goes
//!   through (O_DIRECT by default, buffered fallback).
//! * `faulty` and `sim` (feature `testing`): a fault-injecting wrapper (errnos, a file
//!   system that fills up) and a simulated file system that captures crash images.
//! * [`dirlock`]: the database directory's lock (one open of a database at a time).
//! * [`layout`]: page ids, size classes and where a page lives in which file.
//! * [`page`]: the on-disk page header (CRC-32C, page id, LSN) and its verification.
//! * [`meta`]: the database's meta file, written atomically.
//! * [`alloc_table`]: the per-class allocation bitmaps and their checksummed file.
//! * [`wal`]: the write-ahead log (records, segments, group commit, end-of-log detection).
//! * [`doublewrite`]: the double-write area that makes in-place page writes tear-proof.
//! * [`readonly`]: the backend wrapper of read-only opens, which refuses every write.
//! * [`reserve`]: disk space kept back so that recovery works on a full disk.

pub mod alloc_table;
pub mod backend;
pub mod dirlock;
pub mod doublewrite;
#[cfg(any(test, feature = "testing"))]
pub mod faulty;
pub mod layout;
pub mod meta;
pub mod page;
pub mod readonly;
pub mod reserve;
#[cfg(any(test, feature = "testing"))]
pub mod sim;
#[cfg(target_os = "linux")]
pub mod uring;
pub mod wal;

pub use alloc_table::{AllocTable, ClassBitmap};
pub use backend::{atomic_write_temp, AlignedBuf, FileBackend, IoBufMut, StorageBackend, StorageFile};
pub use backend::{ReadReq, WriteReq};
pub use dirlock::DirLock;
#[cfg(any(test, feature = "testing"))]
pub use faulty::{Faults, FaultyBackend};
pub use layout::{PageId, SizeClasses, MAX_CLASSES};
pub use meta::Meta;
pub use page::PAGE_HEADER_SIZE;
pub use readonly::ReadOnlyBackend;
#[cfg(any(test, feature = "testing"))]
pub use sim::{Capture, CrashMode, SimBackend};
#[cfg(target_os = "linux")]
pub use uring::UringBackend;
