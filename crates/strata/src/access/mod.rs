//! Access methods: structures built out of pages.
//!
//! * [`column`]: a column of fixed-width integers stored in pages of a size class chosen
//!   for its size.
//! * [`catalog`]: the named columns of a database, persisted atomically at checkpoints.

pub mod catalog;
pub mod column;
pub mod temp;

pub use catalog::Catalog;
pub use column::{Column, ColumnPage, ValueFormat};
pub use temp::{TempPage, TempRun, TempRunReader};
