//! The shared structure-aware fuzz targets (see `crates/strata/tests/fuzz/targets.rs`).

#[path = "../../crates/strata/tests/fuzz/targets.rs"]
pub mod targets;
