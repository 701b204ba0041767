//! The buffer manager: size classes over virtual-memory reservations, page states and
//! latches, one memory budget with clock eviction, guards and temporary pages.

mod alloc;
mod budget;
mod checkpoint;
mod cleaner;
mod config;
mod evict;
mod fix;
mod guard;
pub mod hotset;
mod inspect;
mod io_workers;
mod load;
mod logged;
mod manager;
pub mod partial;
pub mod readahead;
mod recovery;
mod recycle;
mod region;
mod remote;
mod resident;
pub mod ring;
mod sequential;
#[doc(hidden)]
pub mod slots;
mod space;
pub mod state;
mod stats;
pub mod tier;
mod writeback;

pub use cleaner::{Cleaner, CleanerOptions, CleanerStats};
pub use config::{default_backend, Config, PartialReads, DEFAULT_MIN_PAGE, DEFAULT_POOL, DEFAULT_RECYCLE_MIN_PAGE};
pub use guard::{ExclusiveGuard, OptimisticGuard, Restart, SharedGuard};
pub use manager::{BufferManager, ClassAllocation, PageInspection, RecoveryReport};
pub use partial::PartialRead;
pub use readahead::{FilePages, Morsel, PageSource, ReadAhead, ReadAheadStats};
pub use ring::Ring;
pub use stats::{Bucket, ClassStats, Contention, IoStats, Stats};
pub use tier::{Fetched, RemoteStats, RemoteTier};
