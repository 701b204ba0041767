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

/// Checks one table leaf (its bytes) and returns the rows it holds: (first row id, count).
pub type PaxCheck<'a> = &'a dyn Fn(PageId, &[u8]) -> Result<(u64, u64)>;

struct Walk<'a> {
    bm: &'a BufferManager,
    report: TreeReport,
    leaf_depth: Option<u32>,
    visit: &'a mut dyn FnMut(PageId),
    pax: Option<PaxCheck<'a>>,
    /// The row id the next table leaf must start with (rows are dense, in leaf order).
    next_row: Option<u64>,
}

fn bad(pid: PageId, what: String) -> Error {
    Error::Inconsistent(format!("B+-tree page {pid}: {what}"))
}

/// Checks the tree at `root`; `pax` checks table leaves (a tree of key-value leaves passes
/// `None`). Returns the report and, for a table, the row id after the last row.
pub fn check(bm: &BufferManager, root: PageId, visit: &mut dyn FnMut(PageId), pax: Option<PaxCheck<'_>>) -> Result<(TreeReport, Option<u64>)> {
    let mut w = Walk {
        bm,
        report: TreeReport { leaves_per_class: vec![0; bm.classes().count()], ..Default::default() },
        leaf_depth: None,
        visit,
        next_row: pax.map(|_| 0),
        pax,
    };
    w.node(root, None, None, 1, true)?;
    w.report.height = w.leaf_depth.unwrap_or(0);
    Ok((w.report, w.next_row))
}

impl Walk<'_> {
    fn node(&mut self, pid: PageId, lo: Option<&[u8]>, hi: Option<&[u8]>, depth: u32, is_root: bool) -> Result<()> {
        if depth > 48 {
            return Err(bad(pid, "deeper than 48 levels (a cycle?)".into()));
        }
        (self.visit)(pid);
        self.report.bytes += self.bm.classes().page_size(pid.class());
        let g = self.bm.fix_shared(pid)?;
        let d = g.data();
        if node::is_table_leaf(d[0]) && !is_root {
            let Some(pax) = self.pax else { return Err(bad(pid, "a table leaf in a key-value tree".into())) };
            let (first, count) = pax(pid, d)?;
            drop(g);
            let last = first.checked_add(count).ok_or_else(|| bad(pid, format!("row ids {first} + {count} overflow")))?;
            if self.next_row.is_some_and(|n| n != first) {
                return Err(bad(pid, format!("rows start at {first}, the leaf before ends at {}", self.next_row.unwrap_or(0))));
            }
            let (fk, lk) = (first.to_be_bytes(), (last.max(1) - 1).to_be_bytes());
            if count > 0 && (lo.is_some_and(|lo| &fk[..] < lo) || hi.is_some_and(|hi| &lk[..] >= hi)) {
                return Err(bad(pid, format!("rows {first}..{last} lie outside the range its parent gives it")));
            }
            self.next_row = Some(last);
            self.leaf(pid, depth, count)?;
            return Ok(());
        }
        let (h, e) = node::decode(d).map_err(|_| bad(pid, "impossible node header or slot".into()))?;
        let upper = d.word(W_UPPER);
        drop(g);
        if is_root && h.kind != KIND_INNER {
            return Err(bad(pid, "the root is not an inner node".into()));
        }
        order(pid, &e, lo, hi)?;
        if h.kind == KIND_LEAF {
            if self.pax.is_some() {
                return Err(bad(pid, "a key-value leaf in a table".into()));
            }
            return self.leaf(pid, depth, e.len() as u64);
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

    fn leaf(&mut self, pid: PageId, depth: u32, entries: u64) -> Result<()> {
        match self.leaf_depth {
            None => self.leaf_depth = Some(depth),
            Some(d) if d != depth => return Err(bad(pid, format!("leaf at depth {depth}, other leaves at {d}"))),
            _ => {}
        }
        self.report.leaves_per_class[pid.class() as usize] += 1;
        self.report.entries += entries;
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

/// The shape of the tree at `root` from its inner nodes alone (leaves are counted by their
/// page ids, never read): height, inner nodes, leaves per class, bytes. `entries` is left 0.
/// Cheap next to [`check`]: it reads the inner nodes, a small fraction of the tree.
pub fn shape(bm: &BufferManager, root: PageId) -> Result<TreeReport> {
    let mut report = TreeReport { leaves_per_class: vec![0; bm.classes().count()], ..Default::default() };
    // The height, from the leftmost path (all leaves are at one depth).
    let mut height = 1;
    let mut pid = root;
    loop {
        let g = bm.fix_shared(pid)?;
        let d = g.data();
        if d[0] != KIND_INNER {
            break;
        }
        let (h, e) = node::decode(d).map_err(|_| bad(pid, "impossible node header or slot".into()))?;
        pid = PageId::from_raw(if h.count > 0 { e.child(0) } else { d.word(W_UPPER) });
        height += 1;
        if height > 48 {
            return Err(bad(pid, "deeper than 48 levels (a cycle?)".into()));
        }
    }
    report.height = height;
    let mut level = vec![root];
    for depth in 1..height {
        let mut next = Vec::new();
        for &pid in &level {
            let g = bm.fix_shared(pid)?;
            let d = g.data();
            let (_, e) = node::decode(d).map_err(|_| bad(pid, "impossible node header or slot".into()))?;
            report.inner_nodes += 1;
            report.bytes += bm.classes().page_size(pid.class());
            next.extend((0..e.len()).map(|i| PageId::from_raw(e.child(i))));
            next.push(PageId::from_raw(d.word(W_UPPER)));
        }
        if depth + 1 == height {
            for pid in &next {
                report.leaves_per_class[pid.class() as usize] += 1;
                report.bytes += bm.classes().page_size(pid.class());
            }
        }
        level = next;
    }
    Ok(report)
}
