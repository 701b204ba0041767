//! `strata`: strata's B+-tree, not merged into this branch yet: every run reports it as
//! failed, saying so.

use std::path::Path;

use super::{Key, KvSession, KvStore, Val};
use crate::{EResult, EngineError};

/// strata's B+-tree (placeholder).
pub struct StrataKv;

impl StrataKv {
    /// Fails: the B+-tree is not in this build.
    pub fn create(_dir: &Path, _pool: u64, _min_page: u64) -> EResult<StrataKv> {
        Err(EngineError("strata's B+-tree is not in this build yet".into()))
    }
}

impl KvStore for StrataKv {
    fn name(&self) -> &'static str {
        "strata"
    }
    fn session(&self) -> EResult<Box<dyn KvSession + '_>> {
        Err(EngineError("strata's B+-tree is not in this build yet".into()))
    }
}

#[allow(dead_code)]
fn _unused(_: &Key, _: &Val) {}
