//! Tables: rows of typed, nullable columns in a B+-tree keyed by row id, with PAX leaves.

pub mod csv;
pub mod parquet;
pub mod schema;
pub mod text;

pub use schema::{ColumnDef, ColumnType, Schema, Value};
