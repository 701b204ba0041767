//! Operators over access methods. Each takes its memory from the buffer manager.

pub mod scan;

pub use scan::{scan_gt, ScanResult};
