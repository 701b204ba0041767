//! Access methods: structures built out of pages.
//!
//! * [`column`]: a column of fixed-width integers stored in pages of a size class chosen
//!   for its size.
//! * [`catalog`]: the named columns of a database, persisted atomically at checkpoints.
//! * [`graph`]: directed graphs in CSR form, imported from edge lists.
//! * [`extsort`]: external-sort building blocks over temporary pages (runs, merge).

pub mod btree;
pub mod catalog;
pub mod column;
pub mod extsort;
pub mod graph;
pub mod table;
pub mod temp;

pub use catalog::Catalog;
pub use column::{Column, ColumnPage, ValueFormat};
pub use graph::Graph;
pub use temp::{TempPage, TempRun, TempRunReader};
