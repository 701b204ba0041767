//! Operators over access methods. Each takes its memory from the buffer manager.

pub mod bfs;
pub mod groupby;
pub mod join;
pub mod scan;
pub mod sort;
pub(crate) mod spill;
#[cfg(any(test, feature = "testing"))]
pub mod torture;
#[cfg(any(test, feature = "testing"))]
pub mod torture_tree;

pub use bfs::{bfs, BfsResult};
pub use groupby::{
    aggregate, distinct, groupby_mod, groupby_mod_counts, Aggregates, DistinctResult, Group, GroupSink, GroupbyModResult, ModCounts, SpillStats,
};
pub use join::{join_count, join_count_with_stats, JoinResult, JoinStats};
pub use scan::{scan_gt, ScanResult};
pub use sort::{sort_column, sort_column_stream, SortResult, SortStream};
