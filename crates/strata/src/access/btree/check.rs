//! Verification of a whole tree: node formats, key order, separators against children,
//! leaves at one depth, inner nodes in the smallest class, every page reached once.

use serde::Serialize;

use super::node::{self, Entries, Src, KIND_INNER, KIND_LEAF, W_UPPER};
use crate::buffer::BufferManager;
use crate::error::{Error, Result};
use crate::storage::PageId;

/// What [`super::BTree::check`] found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TreeReport {
    /// Levels, leaves included.
    pub height: u32,
    /// Inner nodes.
    pub inner_nodes: u64,
    /// Leaves per size class (index: class).
    pub leaves_per_class: Vec<u64>,
    /// Entries in the leaves.
    pub entries: u64,
    /// Bytes of the pages of the tree.
    pub bytes: u64,
}

struct Walk<'a> {
    bm: &'a BufferManager,
    report: TreeReport,
    leaf_depth: Option<u32>,
    visit: &'a mut dyn FnMut(PageId),
}

fn bad(pid: PageId, what: String) -> Error {
    Error::Inconsistent(format!("B+-tree page {pid}: {what}"))
}

pub fn check(bm: &BufferManager, root: PageId, visit: &mut dyn FnMut(PageId)) -> Result<TreeReport> {
    let mut w = Walk { bm, report: TreeReport { leaves_per_class: vec![0; bm.classes().count()], ..Default::default() }, leaf_depth: None, visit };
    w.node(root, None, None, 1, true)?;
    w.report.height = w.leaf_depth.unwrap_or(0);
    Ok(w.report)
}

impl Walk<'_> {
    fn node(&mut self, pid: PageId, lo: Option<&[u8]>, hi: Option<&[u8]>, depth: u32, is_root: bool) -> Result<()> {
        if depth > 48 {
            return Err(bad(pid, "deeper than 48 levels (a cycle?)".into()));
        }
        (self.visit)(pid);
        let (h, e, upper) = {
            let g = self.bm.fix_shared(pid)?;
            let d = g.data();
            let (h, e) = node::decode(d).map_err(|_| bad(pid, "impossible node header or slot".into()))?;
            (h, e, d.word(W_UPPER))
        };
        self.report.bytes += self.bm.classes().page_size(pid.class());
        if is_root && h.kind != KIND_INNER {
            return Err(bad(pid, "the root is not an inner node".into()));
        }
        order(pid, &e, lo, hi)?;
        if h.kind == KIND_LEAF {
            match self.leaf_depth {
                None => self.leaf_depth = Some(depth),
                Some(d) if d != depth => return Err(bad(pid, format!("leaf at depth {depth}, other leaves at {d}"))),
                _ => {}
            }
            self.report.leaves_per_class[pid.class() as usize] += 1;
            self.report.entries += e.len() as u64;
            return Ok(());
        }
        if pid.class() != 0 {
            return Err(bad(pid, format!("inner node in size class {}, not the smallest", pid.class())));
        }
        self.report.inner_nodes += 1;
        for i in 0..=e.len() {
            let child = if i < e.len() { e.child(i) } else { upper };
            let clo = if i == 0 { lo } else { Some(e.key(i - 1)) };
            let chi = if i < e.len() { Some(e.key(i)) } else { hi };
            self.node(PageId::from_raw(child), clo, chi, depth + 1, false)?;
        }
        Ok(())
    }
}

/// Keys strictly increasing and within `[lo, hi)`.
fn order(pid: PageId, e: &Entries, lo: Option<&[u8]>, hi: Option<&[u8]>) -> Result<()> {
    for i in 0..e.len() {
        let k = e.key(i);
        if i > 0 && e.key(i - 1) >= k {
            return Err(bad(pid, format!("keys out of order at slot {i}")));
        }
        if lo.is_some_and(|lo| k < lo) || hi.is_some_and(|hi| k >= hi) {
            return Err(bad(pid, format!("key at slot {i} lies outside the range its parent gives it")));
        }
    }
    Ok(())
}
