//! Structural changes after removals: an emptied leaf is unlinked, an underfull node (leaf
//! or inner node) is merged with a neighbour under the same parent, up the tree as far as
//! the merges leave parents underfull, and a root left with a single inner child takes that
//! child's entries (the tree gets one level lower; the root page never changes).
//!
//! # Concurrency
//! Every change here follows the tree's optimistic lock coupling: an optimistic descent to
//! the node, the transaction's locks on every page the change touches (taken without
//! waiting where the change is optional, so that best-effort work never waits behind
//! another transaction), then the optimistic guards upgraded to exclusive latches (which
//! fails if a page changed since it was read: restart), and one atomic section
//! ([`Transaction::begin_section`]) of logged writes, so a rollback or a crash restores
//! every node of the change together.
//!
//! A merge frees the right node of the pair when the transaction commits; until then its
//! bytes stay as they were, so a reader that reached it through the old parent reads valid
//! data. A merged-away *leaf* keeps its version (its readers and writers validate the parent,
//! which changed). A merged-away *inner* node (and a root's child whose entries moved into
//! the root) has its version bumped at the merge, although its bytes stay: a descent that
//! holds an optimistic guard on it from before the merge would otherwise validate it, and a
//! writer that latched it could change a node that is no longer in the tree (a leaf merge
//! or a split whose parent is a detached node). With the bump, every guard taken before the
//! merge fails validation and restarts from the root, which no longer leads there.

use super::node::{self, Entries, Header, Src, KIND_INNER, KIND_LEAF, SLOT, W_UPPER};
use super::{live_bytes, write_image, BTree, Step, MAX_DEPTH, OPTIMISTIC_TRIES};
use crate::buffer::{BufferManager, OptimisticGuard};
use crate::error::Result;
use crate::storage::PageId;
use crate::txn::Transaction;

/// What a descent for a node `up` levels above the leaves found.
enum Found<'a> {
    /// A validation failed: descend again.
    Restart,
    /// The node is the root (or the tree is not that high): it has no parent.
    NoParent,
    /// The node's parent (with the slot followed), the node, and both their headers, read
    /// and validated.
    Node(Step<'a>, OptimisticGuard<'a>, Header, Header),
}

/// The pair of children to merge: (index of the left one in the parent, left child, right
/// child, the optimistic guard of the neighbour of the underfull node).
type Pair<'a> = (usize, u64, u64, OptimisticGuard<'a>);

impl BTree {
    /// After a removal emptied (`emptied`) or thinned the leaf that holds `key`'s range:
    /// unlinks or merges the leaf, then merges the inner nodes above it that this leaves
    /// underfull, as far up as that goes, and lowers the tree when the root is left with a
    /// single inner child. Best effort throughout.
    pub(super) fn rebalance_after_remove(&self, tx: &mut Transaction<'_>, key: &[u8], emptied: bool, buf: &mut Vec<u8>) -> Result<()> {
        let changed = if emptied { self.unlink_empty_leaf(tx, key, buf)? } else { self.merge_underfull(tx, key, 0, buf)? };
        if !changed {
            return Ok(());
        }
        // The leaf's parent lost an entry: merge it if it is underfull now, then its parent.
        let mut up = 1;
        while up <= MAX_DEPTH && self.merge_underfull(tx, key, up, buf)? {
            up += 1;
        }
        if up > 1 {
            self.collapse_root(tx)?;
        }
        Ok(())
    }

    /// A validated descent to the node `up` levels above the leaf of `key` (0: the leaf),
    /// with its parent. Levels count from the leaves, which all lie at one depth, so a root
    /// split or a lowered root meanwhile does not change which node is meant.
    fn node_with_parent<'a>(&self, bm: &'a BufferManager, key: &[u8], up: usize, buf: &mut Vec<u8>) -> Result<Found<'a>> {
        let Some(mut path) = self.descend(bm, key, buf)? else { return Ok(Found::Restart) };
        let depth = path.inner.len();
        if up >= depth {
            return Ok(Found::NoParent);
        }
        let node = if up == 0 {
            path.leaf
        } else {
            path.inner.truncate(depth - up + 1);
            path.inner.pop().expect("the path is deeper than `up`").g
        };
        let parent = path.inner.pop().expect("a node below the root has a parent");
        let (Ok(ph), Ok(nh)) = (node::header(&parent.g), node::header(&node)) else { return Ok(Found::Restart) };
        if !parent.g.validate() || !node.validate() {
            return Ok(Found::Restart);
        }
        Ok(Found::Node(parent, node, ph, nh))
    }

    /// Unlinks the empty leaf that holds `key`'s range from its parent (its range joins the
    /// next child's, or the previous child becomes `upper`) and frees it at commit: the
    /// simplest merge, and the one that keeps a tree whose keys were removed from keeping its
    /// pages. Best effort: a leaf that is its parent's only child, or that changes under
    /// us, stays (an empty leaf is a valid leaf). Returns whether the leaf was unlinked.
    fn unlink_empty_leaf(&self, tx: &mut Transaction<'_>, key: &[u8], buf: &mut Vec<u8>) -> Result<bool> {
        let bm = tx.buffer();
        for _ in 0..OPTIMISTIC_TRIES {
            let (parent, leaf, ph, lh) = match self.node_with_parent(bm, key, 0, buf)? {
                Found::Restart => continue,
                Found::NoParent => return Ok(false),
                Found::Node(p, l, ph, lh) => (p, l, ph, lh),
            };
            if lh.kind != KIND_LEAF || lh.count != 0 || ph.count == 0 {
                return Ok(false);
            }
            let (ppid, lpid) = (parent.g.pid(), leaf.pid());
            if !tx.holds(ppid) || !tx.holds(lpid) {
                // Optimistic guards hold no latch: the lock waits need not release them.
                tx.lock_if_allocated(ppid)?;
                tx.lock_if_allocated(lpid)?;
                continue;
            }
            let idx = parent.idx;
            let Ok(mut pg) = parent.g.upgrade() else { continue };
            let Ok(lg) = leaf.upgrade() else {
                pg.release_unchanged();
                continue;
            };
            tx.begin_section();
            let (h, mut e) = node::decode(pg.data()).map_err(|_| BTree::corrupt(bm, ppid, "impossible inner node"))?;
            let mut upper = pg.data().word(W_UPPER);
            let tree = node::tree_words(pg.data());
            let child_at = |e: &Entries, i: usize| if i < e.len() { e.child(i) } else { upper };
            if child_at(&e, idx) != lpid.raw() {
                return Err(BTree::corrupt(bm, ppid, "child pointer moved under a latched parent"));
            }
            if idx < h.count {
                e.items.remove(idx);
            } else {
                upper = e.child(h.count - 1);
                e.items.pop();
            }
            let img = node::build(pg.len(), KIND_INNER, &e, 0..e.len(), upper, tree);
            write_image(tx, &mut pg, &img)?;
            drop((pg, lg));
            tx.free(lpid)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Merges the node `up` levels above the leaf that holds `key`'s range (0: that leaf),
    /// when it is less than a quarter full, with a neighbour under the same parent if the
    /// entries of both fit in half of its page: the right one of the pair (the node and the
    /// next child, or for the parent's last child the previous child and the node) gives
    /// its entries to the left one, the parent's pointer to the right one is repointed to
    /// the left one and the separator between them removed, and the right page is freed
    /// when the transaction commits. For inner nodes the separator comes down between the
    /// two nodes' entries: the left node's `upper` becomes the child of that separator, the
    /// right node's `upper` the merged node's `upper` (slot word 1 is the child for keys
    /// below the slot's key, `upper` the child for keys at or above the last one).
    ///
    /// One atomic section: parent and both nodes latched together, every change logged, so
    /// a rollback or a crash restores both nodes and the parent. Best effort: a lock another
    /// transaction holds is not waited for, and a change under us gives up after a few
    /// tries (an underfull node is a valid node). Returns whether it merged (the parent
    /// lost an entry and may be underfull now).
    fn merge_underfull(&self, tx: &mut Transaction<'_>, key: &[u8], up: usize, buf: &mut Vec<u8>) -> Result<bool> {
        let bm = tx.buffer();
        let leaf = up == 0;
        let kind = if leaf { KIND_LEAF } else { KIND_INNER };
        let what = if leaf { "impossible leaf" } else { "impossible inner node" };
        for _ in 0..OPTIMISTIC_TRIES {
            let (parent, node, ph, nh) = match self.node_with_parent(bm, key, up, buf)? {
                Found::Restart => continue,
                Found::NoParent => return Ok(false),
                Found::Node(p, n, ph, nh) => (p, n, ph, nh),
            };
            if nh.kind != kind || ph.count == 0 || live_bytes(&nh, node.len()) >= node::room(node.len()) / 4 {
                return Ok(false);
            }
            let Some(chosen) = pick_pair(bm, &parent, &ph, &node, &nh) else { continue };
            let Some((i, a, b, other)) = chosen else { return Ok(false) };
            let (apid, bpid) = (PageId::from_raw(a), PageId::from_raw(b));
            for pid in [parent.g.pid(), apid, bpid] {
                if !tx.holds(pid) && !tx.try_lock(pid)? {
                    return Ok(false);
                }
            }
            if !parent.g.validate() {
                continue;
            }
            let idx = parent.idx;
            tx.begin_section();
            let Ok(mut pg) = parent.g.upgrade() else { continue };
            let Ok(ng) = node.upgrade() else {
                pg.release_unchanged();
                continue;
            };
            let Ok(og) = other.upgrade() else {
                pg.release_unchanged();
                ng.release_unchanged();
                continue;
            };
            let (mut ag, bg) = if idx == i { (ng, og) } else { (og, ng) };
            let (Ok((ah, mut ea)), Ok((bh, eb))) = (node::decode(ag.data()), node::decode(bg.data())) else {
                let pid = if node::decode(ag.data()).is_err() { ag.pid() } else { bg.pid() };
                return Err(BTree::corrupt(bm, pid, what));
            };
            let (h, mut e) = node::decode(pg.data()).map_err(|_| BTree::corrupt(bm, pg.pid(), "impossible inner node"))?;
            let mut upper = pg.data().word(W_UPPER);
            let tree = node::tree_words(pg.data());
            let child_at = |e: &Entries, j: usize| if j < e.len() { e.child(j) } else { upper };
            if i >= h.count || child_at(&e, i) != a || child_at(&e, i + 1) != b {
                return Err(BTree::corrupt(bm, pg.pid(), "child pointer moved under a latched parent"));
            }
            // The merged node: the left node's entries, for inner nodes the separator pulled
            // down (its child: the left node's `upper`), then the right node's entries.
            let merged_upper = if leaf {
                0
            } else {
                ea.push(e.key(i), &[], ag.data().word(W_UPPER));
                bg.data().word(W_UPPER)
            };
            for j in 0..eb.len() {
                ea.push(eb.key(j), if leaf { eb.value(j) } else { &[] }, eb.items[j].2);
            }
            if ah.kind != kind || bh.kind != kind || node::need(&ea, 0..ea.len(), leaf) > node::room(ag.len()) / 2 {
                pg.release_unchanged();
                ag.release_unchanged();
                bg.release_unchanged();
                return Ok(false);
            }
            let img = node::build(ag.len(), kind, &ea, 0..ea.len(), merged_upper, node::tree_words(ag.data()));
            write_image(tx, &mut ag, &img)?;
            if i + 1 < h.count {
                e.items[i + 1].2 = a;
            } else {
                upper = a;
            }
            e.items.remove(i);
            let img = node::build(pg.len(), KIND_INNER, &e, 0..e.len(), upper, tree);
            write_image(tx, &mut pg, &img)?;
            if leaf {
                // Its readers and writers validate the parent, which changed.
                bg.release_unchanged();
            } else {
                // Bytes unchanged, version bumped: see the module doc.
                drop(bg);
            }
            drop((pg, ag));
            tx.free(bpid)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Lowers the tree by one level when the root has no separator and its single child
    /// (`upper`) is an inner node: the child's entries and `upper` move into the root (whose
    /// page, and tree word, stay), and the child is freed at commit. Its version is bumped
    /// though its bytes stay (see the module doc). Best effort, like the merges.
    fn collapse_root(&self, tx: &mut Transaction<'_>) -> Result<()> {
        let bm = tx.buffer();
        for _ in 0..OPTIMISTIC_TRIES {
            let root = bm.fix_optimistic(self.root())?;
            let Ok(rh) = node::header(&root) else { continue };
            let child = PageId::from_raw(root.read_u64(W_UPPER));
            if !root.validate() {
                continue;
            }
            if rh.kind != KIND_INNER || rh.count != 0 {
                return Ok(());
            }
            let c = match bm.fix_optimistic(child) {
                Ok(c) => c,
                Err(e) => return if root.validate() { Err(e) } else { Ok(()) },
            };
            let Ok(ch) = node::header(&c) else { continue };
            if !c.validate() || !root.validate() {
                continue;
            }
            if ch.kind != KIND_INNER {
                // The root's only child is a leaf: the lowest a tree gets.
                return Ok(());
            }
            for pid in [root.pid(), child] {
                if !tx.holds(pid) && !tx.try_lock(pid)? {
                    return Ok(());
                }
            }
            tx.begin_section();
            let Ok(mut rg) = root.upgrade() else { continue };
            let Ok(cg) = c.upgrade() else {
                rg.release_unchanged();
                continue;
            };
            let (rh, _) = node::decode(rg.data()).map_err(|_| BTree::corrupt(bm, rg.pid(), "impossible root"))?;
            let (ch, e) = node::decode(cg.data()).map_err(|_| BTree::corrupt(bm, child, "impossible inner node"))?;
            if rh.count != 0 || rg.data().word(W_UPPER) != child.raw() || ch.kind != KIND_INNER {
                return Err(BTree::corrupt(bm, rg.pid(), "child pointer moved under a latched root"));
            }
            let img = node::build(rg.len(), KIND_INNER, &e, 0..e.len(), cg.data().word(W_UPPER), node::tree_words(rg.data()));
            write_image(tx, &mut rg, &img)?;
            drop((rg, cg));
            return tx.free(child);
        }
        Ok(())
    }
}

/// The pair `(i, i + 1)` of `parent`'s children to merge, the underfull `node` (child
/// `parent.idx`, header `nh`) one of them: with the previous child first (removals in key
/// order thinned it already), else the next one; a pair qualifies when both are of the
/// node's kind and their entries (with the separator that comes down between inner nodes)
/// fit in half of the left one's page. `None`: the parent changed, restart; `Some(None)`:
/// no neighbour fits.
fn pick_pair<'a>(bm: &'a BufferManager, parent: &Step<'a>, ph: &Header, node: &OptimisticGuard<'a>, nh: &Header) -> Option<Option<Pair<'a>>> {
    let idx = parent.idx;
    let p = &parent.g;
    let child = |j: usize| if j < ph.count { node::slot(p, j).map(|s| s.3) } else { Ok(p.word(W_UPPER)) };
    let mut chosen = None;
    for i in [idx.checked_sub(1), (idx < ph.count).then_some(idx)].into_iter().flatten() {
        let (Ok(a), Ok(b)) = (child(i), child(i + 1)) else { break };
        let sep = if nh.kind == KIND_INNER {
            match node::slot(p, i) {
                Ok((_, len, _, _)) => SLOT + len,
                Err(_) => break,
            }
        } else {
            0
        };
        let Ok(other) = bm.fix_optimistic(PageId::from_raw(if idx == i { b } else { a })) else { break };
        let Ok(oh) = node::header(&other) else { break };
        let left_len = if idx == i { node.len() } else { other.len() };
        let fits = oh.kind == nh.kind && live_bytes(nh, node.len()) + live_bytes(&oh, other.len()) + sep <= node::room(left_len) / 2;
        if !other.validate() || !p.validate() {
            break;
        }
        if fits {
            chosen = Some((i, a, b, other));
            break;
        }
    }
    if !p.validate() {
        return None;
    }
    Some(chosen)
}
