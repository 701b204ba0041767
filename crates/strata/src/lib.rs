//! strata: a buffer manager with variable-size pages in one memory budget.
//!
//! The crate is layered, and data flows one way:
//!
//! * [`storage`]: files, the storage-backend trait every byte to disk goes through, the
//!   meta file, page ids and size classes, the allocation table and the on-disk page format.
//! * [`buffer`]: one virtual-memory reservation per size class (page id → address by
//!   arithmetic), a 64-bit state word per page (optimistic / shared / exclusive latching),
//!   one hard memory budget over all classes with clock eviction, and temporary pages.
//! * [`txn`]: transactions (page locks, commit, rollback) over the buffer manager's logged
//!   page operations; crash recovery itself runs when the buffer manager opens.
//! * [`access`]: access methods built on pages (columns and their catalog).
//! * [`ops`]: operators over access methods (scan).
//! * [`db`]: the database façade that ties a buffer manager and a catalog together.
//!
//! Lower layers never import higher ones.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod access;
pub mod buffer;
pub mod db;
pub(crate) mod durability;
pub mod error;
pub mod ops;
pub(crate) mod sharded;
pub mod sql;
pub mod storage;
pub(crate) mod sync;
#[cfg(test)]
pub(crate) mod testutil;
pub mod txn;
pub mod util;

pub use buffer::{BufferManager, Config, ExclusiveGuard, OptimisticGuard, SharedGuard, Stats};
pub use db::Database;
pub use txn::Transaction;

pub use error::{Error, Result};
pub use storage::{PageId, PAGE_HEADER_SIZE};
