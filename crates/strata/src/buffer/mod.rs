//! The buffer manager: size classes over virtual-memory reservations, page states and
//! latches, one memory budget with clock eviction, guards and temporary pages.

mod config;
mod guard;
pub mod hotset;
mod logged;
mod manager;
mod recovery;
mod region;
mod resident;
mod space;
pub mod state;
mod stats;
pub mod tier;

pub use config::{Config, DEFAULT_MIN_PAGE, DEFAULT_POOL};
pub use guard::{ExclusiveGuard, OptimisticGuard, Restart, SharedGuard};
pub use manager::BufferManager;
pub use stats::{ClassStats, Stats};
pub use tier::{RemoteStats, RemoteTier};
