//! A B+-tree over the buffer manager: ordered byte-string keys (up to [`MAX_KEY`] bytes;
//! `u64` ids as 8 big-endian bytes), values of any size up to the largest page the pool
//! can hold, variable-size leaves, optimistic lock coupling, and every change logged.
//!
//! ```no_run
//! # fn demo(db: &strata::Database) -> strata::Result<()> {
//! let tree = db.create_tree("kv")?;
//! let mut tx = db.begin();
//! tree.insert(&mut tx, b"key", b"value")?;       // insert or replace
//! tx.commit()?;                                   // durable when this returns
//! let mut out = Vec::new();
//! assert!(tree.get(db.buffer(), b"key", &mut out)?);
//! tree.scan(db.buffer(), b"", &mut |k, v| { println!("{k:?} {v:?}"); true })?;
//! # Ok(()) }
//! ```
//!
//! # Pages
//! Inner nodes live in the smallest size class. A leaf is allocated in the smallest class
//! that holds what it must: ordinary leaves are pages of the smallest class, a value of
//! 20 MiB gets a leaf of a class that holds it whole (never chopped into pieces). The root
//! is an inner node whose page never changes (a root split moves its entries into two new
//! children), so the catalog names a tree by its root page once.
//!
//! # Concurrency: optimistic lock coupling
//! Readers descend with optimistic guards only (no shared-memory writes): a child's
//! version is taken, then the parent is validated, so the child was the parent's child at
//! that moment; the leaf's bytes are copied out and validated. Any failed validation
//! restarts the descent. Writers descend the same way, upgrade the leaf to the exclusive
//! latch (which fails if it changed), validate the parent, and change the leaf. A leaf
//! without room is split by a separate step that latches exactly the nodes it changes (the
//! node and its parent; a full parent is split first), after which the operation restarts.
//! A page found evicted is loaded by the fix, like any other.
//!
//! Removals shrink the tree the same way (`btree/merge.rs`): an emptied leaf is unlinked, an
//! underfull leaf or inner node is merged with a neighbour under the same parent (up the
//! tree while parents are left underfull), and a root left with a single inner child takes
//! that child's entries, so the tree gets lower again; each change latches exactly the
//! nodes it changes, and the merged-away page is freed when the transaction commits.
//!
//! # Transactions and durability
//! Every change is a logged write of the transaction passed in ([`crate::Transaction`]):
//! a crash loses no committed change and leaves no half-split tree (a split is part of the
//! transaction that needed it and is rolled back with it). The transaction locks each page
//! it changes until it ends (undo is physical), so writers of different leaves proceed in
//! parallel and writers of one leaf take turns; lock waits happen with no latch held.
//! Readers take no locks: they see the latest state of each leaf, committed or not. Each
//! latched change (an insert into a leaf, a split) is an atomic section of the transaction
//! ([`Transaction::begin_section`]): a rollback undoes it under the latches of all its pages
//! at once, so a reader never sees half of a change, forward or backward.
//! After an error from a tree operation, abort the transaction.

mod check;
mod leaf;
mod merge;
pub mod node;
mod scan;

use serde::{Deserialize, Serialize};

pub use check::TreeReport;
pub use node::MAX_KEY;

use crate::buffer::{BufferManager, ExclusiveGuard, OptimisticGuard, Restart, SharedGuard};
use crate::error::{Error, Result};
use crate::storage::{layout::class_file, PageId, PAGE_HEADER_SIZE};
use crate::txn::Transaction;
use node::{Entries, Fences, Src, HDR, KIND_INNER, KIND_LEAF, SLOT, W_UPPER};
/// Optimistic restarts of a lookup before it falls back to shared latches.
const OPTIMISTIC_TRIES: usize = 64;
/// Structural changes one insert may need (a huge value in a full leaf needs three).
const MAX_SPLITS_PER_INSERT: usize = 64;

/// What [`BTree::scan_leaves`] calls with each leaf: (page id, bytes, least key not handed
/// out yet); false stops the scan. Of a key-value leaf only the header, slots and heap are
/// meaningful (the free bytes between slots and heap are not copied).
pub(crate) type LeafVisitor<'a> = dyn FnMut(PageId, &[u8], &[u8]) -> Result<bool> + 'a;

/// A B+-tree, named by its root page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BTree {
    root: u64,
}

/// An inner node on a descent, with the slot followed (`count` for `upper`).
struct Step<'a> {
    g: OptimisticGuard<'a>,
    idx: usize,
}

/// Where one level of a descent leads: the node was a leaf, or to this child (through this
/// slot, `count` for `upper`, and the child's fences).
enum Next<'a> {
    Leaf,
    Child(usize, OptimisticGuard<'a>, Fences),
}

/// Inner levels beyond which a descent reports a cycle.
const MAX_DEPTH: usize = 48;

/// A validated descent: the inner nodes from the root down, and the leaf.
struct Path<'a> {
    inner: Vec<Step<'a>>,
    leaf: OptimisticGuard<'a>,
}

impl BTree {
    /// Creates an empty tree (a root and one empty leaf), as part of `tx`.
    pub fn create(tx: &mut Transaction<'_>) -> Result<BTree> {
        BTree::create_with(tx, &|size| node::build(size, KIND_LEAF, &Entries::default(), 0..0, 0, [0, 0]))
    }

    /// Creates a tree whose first leaf (a page of the smallest class) has the image that
    /// `leaf_image(payload size)` returns.
    pub(crate) fn create_with(tx: &mut Transaction<'_>, leaf_image: &dyn Fn(usize) -> Vec<u8>) -> Result<BTree> {
        tx.begin_section();
        let mut leaf = tx.alloc_latched(1)?;
        let img = leaf_image(leaf.len());
        write_image(tx, &mut leaf, &img)?;
        let leaf_pid = leaf.pid();
        drop(leaf);
        let mut root = tx.alloc_latched(1)?;
        let img = node::build(root.len(), KIND_INNER, &Entries::default(), 0..0, leaf_pid.raw(), [0, 0]);
        write_image(tx, &mut root, &img)?;
        Ok(BTree { root: root.pid().raw() })
    }

    /// The tree whose root is `root` (as [`root`](Self::root) returned).
    pub fn open(root: PageId) -> BTree {
        BTree { root: root.raw() }
    }

    /// The root page, which never changes.
    pub fn root(&self) -> PageId {
        PageId::from_raw(self.root)
    }

    /// The largest value a key of `key_len` bytes can have in `bm`'s pool: a leaf holding
    /// it alone must fit the largest size class the pool can hold.
    pub fn max_value(bm: &BufferManager, key_len: usize) -> usize {
        BTree::max_leaf(bm).saturating_sub(HDR + SLOT + key_len)
    }

    /// The payload of the largest leaf `bm`'s pool can hold: the largest size class that
    /// leaves room for a few other pages (parent, sibling) beside the leaf.
    pub fn max_leaf(bm: &BufferManager) -> usize {
        let classes = bm.classes();
        let mut best = 0usize;
        for c in 0..classes.count() as u8 {
            let size = classes.page_size(c);
            if size + 4 * classes.min_page() <= bm.pool_size() && size <= u32::MAX as u64 {
                best = size as usize;
            }
        }
        best.saturating_sub(PAGE_HEADER_SIZE)
    }

    fn check_entry(bm: &BufferManager, key: &[u8], value_len: usize) -> Result<()> {
        if key.len() > MAX_KEY {
            return Err(Error::InvalidInput(format!("key of {} bytes is longer than the longest key, {MAX_KEY} bytes", key.len())));
        }
        let max = BTree::max_value(bm, key.len());
        if value_len > max {
            return Err(Error::InvalidInput(format!(
                "value of {value_len} bytes is larger than the largest value this pool can hold in one page ({max} bytes, pool {} bytes): raise the pool size",
                bm.pool_size()
            )));
        }
        Ok(())
    }

    fn corrupt(bm: &BufferManager, pid: PageId, what: &str) -> Error {
        Error::corruption(class_file(bm.dir(), pid.class()), Some(pid), format!("B+-tree node: {what}"))
    }

    /// `Err(corruption)` if `g` validates (its bytes really are impossible), else `Ok(None)`
    /// (a writer intervened: restart).
    fn restart_or_corrupt<T>(bm: &BufferManager, g: &OptimisticGuard<'_>, what: &str) -> Result<Option<T>> {
        if g.validate() {
            Err(BTree::corrupt(bm, g.pid(), what))
        } else {
            Ok(None)
        }
    }

    /// One level of an optimistic descent for `key` from `g` (the root when `is_root`; its
    /// fences, a search hint, are `fences`): the node's kind is checked; for an inner node,
    /// the child's version is taken (after a prefetch of its state word and frame) between
    /// two validations of `g`, so the child was `g`'s child at that moment. `None`: restart.
    fn step<'a>(bm: &'a BufferManager, g: &OptimisticGuard<'a>, is_root: bool, key: &[u8], fences: Fences, buf: &mut Vec<u8>) -> Result<Option<Next<'a>>> {
        let kind = g.read_u64(node::W_KIND_COUNT) as u8;
        if kind != KIND_INNER {
            if is_root {
                return BTree::restart_or_corrupt(bm, g, "the root is not an inner node");
            }
            if kind != KIND_LEAF && !node::is_table_leaf(kind) {
                return BTree::restart_or_corrupt(bm, g, "unknown node kind");
            }
            return Ok(Some(Next::Leaf));
        }
        // The whole header is checked (not only the count the search needs): scans and
        // writers rely on a validated descent having passed only well-formed inner nodes.
        let Ok(h) = node::header(g) else { return BTree::restart_or_corrupt(bm, g, "impossible header") };
        let Ok((idx, child, fences)) = node::inner_child_at(g, h.count, key, fences, buf) else {
            return BTree::restart_or_corrupt(bm, g, "impossible slot");
        };
        let child = PageId::from_raw(child);
        bm.prefetch_hint(child);
        if !g.validate() {
            return Ok(None);
        }
        let c = match bm.fix_optimistic(child) {
            Ok(c) => c,
            Err(e) => return if g.validate() { Err(e) } else { Ok(None) },
        };
        if !g.validate() {
            return Ok(None);
        }
        Ok(Some(Next::Child(idx, c, fences)))
    }

    /// Descends optimistically to the leaf for `key`, keeping the inner nodes passed.
    /// `None`: restart.
    fn descend<'a>(&self, bm: &'a BufferManager, key: &[u8], buf: &mut Vec<u8>) -> Result<Option<Path<'a>>> {
        let mut inner: Vec<Step<'a>> = Vec::new();
        let mut g = bm.fix_optimistic(self.root())?;
        let mut fences = Fences::default();
        loop {
            match BTree::step(bm, &g, inner.is_empty(), key, fences, buf)? {
                None => return Ok(None),
                Some(Next::Leaf) => return Ok(Some(Path { inner, leaf: g })),
                Some(Next::Child(idx, c, f)) => {
                    if inner.len() > MAX_DEPTH {
                        return Err(BTree::corrupt(bm, g.pid(), "the tree is deeper than any real tree (a cycle?)"));
                    }
                    inner.push(Step { g, idx });
                    g = c;
                    fences = f;
                }
            }
        }
    }

    /// [`descend`](Self::descend) keeping no path (lookups): the leaf alone, with its
    /// fences (a search hint).
    fn descend_leaf<'a>(&self, bm: &'a BufferManager, key: &[u8], buf: &mut Vec<u8>) -> Result<Option<(OptimisticGuard<'a>, Fences)>> {
        let mut g = bm.fix_optimistic(self.root())?;
        let mut fences = Fences::default();
        for depth in 0..=MAX_DEPTH {
            match BTree::step(bm, &g, depth == 0, key, fences, buf)? {
                None => return Ok(None),
                Some(Next::Leaf) => return Ok(Some((g, fences))),
                Some(Next::Child(_, c, f)) => {
                    g = c;
                    fences = f;
                }
            }
        }
        Err(BTree::corrupt(bm, g.pid(), "the tree is deeper than any real tree (a cycle?)"))
    }

    /// Looks `key` up; on a hit its value is copied into `out` and `true` returned.
    pub fn get(&self, bm: &BufferManager, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        let mut buf = Vec::new();
        for _ in 0..OPTIMISTIC_TRIES {
            let Some((leaf, fences)) = self.descend_leaf(bm, key, &mut buf)? else { continue };
            let g = &leaf;
            match leaf::find(g, key, fences, &mut buf) {
                Ok(Some((off, len))) => {
                    out.resize(len, 0);
                    g.read(off, out);
                    if g.validate() {
                        return Ok(true);
                    }
                }
                Ok(None) => {
                    if g.validate() {
                        return Ok(false);
                    }
                }
                Err(_) => {
                    BTree::restart_or_corrupt::<()>(bm, g, "impossible leaf")?;
                }
            }
        }
        self.get_shared(bm, key, out)
    }

    /// [`get`](Self::get) with shared latches, coupled top-down (always terminates).
    fn get_shared(&self, bm: &BufferManager, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        let mut buf = Vec::new();
        let g = self.leaf_shared(bm, key, &mut buf)?;
        let d = g.data();
        if d[0] != KIND_LEAF {
            return Err(Error::InvalidInput(format!("page {} is a table leaf, not a key-value leaf: use the table's methods", g.pid())));
        }
        match leaf::find(d, key, Fences::default(), &mut buf).map_err(|_| BTree::corrupt(bm, g.pid(), "impossible leaf"))? {
            Some((off, len)) => {
                out.clear();
                out.extend_from_slice(&d[off..off + len]);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The leaf for `key`, under a shared latch, reached by shared latches coupled top-down.
    fn leaf_shared<'a>(&self, bm: &'a BufferManager, key: &[u8], buf: &mut Vec<u8>) -> Result<SharedGuard<'a>> {
        let mut g = bm.fix_shared(self.root())?;
        for depth in 0..=MAX_DEPTH {
            let d = g.data();
            if depth > 0 && (d[0] == KIND_LEAF || node::is_table_leaf(d[0])) {
                return Ok(g);
            }
            let h = node::header(d).map_err(|_| BTree::corrupt(bm, g.pid(), "impossible header"))?;
            if h.kind != KIND_INNER {
                return Err(BTree::corrupt(bm, g.pid(), "a leaf where an inner node belongs"));
            }
            let (_, child) = node::inner_child(d, &h, key, buf).map_err(|_| BTree::corrupt(bm, g.pid(), "impossible slot"))?;
            g = bm.fix_shared(PageId::from_raw(child))?;
        }
        Err(BTree::corrupt(bm, g.pid(), "the tree is deeper than any real tree (a cycle?)"))
    }

    /// Reads the leaf that holds `key` with `f`, which sees its bytes through an optimistic
    /// guard (and returns `Err(Restart)` for bytes it finds impossible) and whose result
    /// counts once the leaf validates; after repeated restarts, under a shared latch.
    pub(crate) fn read_leaf<T>(&self, bm: &BufferManager, key: &[u8], f: &mut dyn FnMut(PageId, &dyn Src) -> Result<T, Restart>) -> Result<T> {
        let mut buf = Vec::new();
        for _ in 0..OPTIMISTIC_TRIES {
            let Some((leaf, _)) = self.descend_leaf(bm, key, &mut buf)? else { continue };
            let g = &leaf;
            match f(g.pid(), g) {
                Ok(v) if g.validate() => return Ok(v),
                Ok(_) => {}
                Err(Restart) => BTree::restart_or_corrupt::<()>(bm, g, "impossible leaf").map(drop)?,
            }
        }
        let g = self.leaf_shared(bm, key, &mut buf)?;
        f(g.pid(), &g.data()).map_err(|_| BTree::corrupt(bm, g.pid(), "impossible leaf"))
    }

    /// The leaf that holds `key`, locked by `tx` (waiting with no latch held) and latched
    /// exclusively, for a change in place (table appends).
    pub(crate) fn lock_leaf<'a>(&self, tx: &mut Transaction<'a>, key: &[u8]) -> Result<ExclusiveGuard<'a>> {
        let bm = tx.buffer();
        let mut buf = Vec::new();
        loop {
            let Some(path) = self.descend(bm, key, &mut buf)? else { continue };
            if let Some(g) = self.latch_leaf(tx, path)? {
                return Ok(g);
            }
        }
    }

    /// The tree words of the root's header ([`node::tree_words`]: a table's next row id and
    /// its committed rows), read optimistically, together.
    pub(crate) fn root_words(&self, bm: &BufferManager) -> Result<[u64; 2]> {
        loop {
            let g = bm.fix_optimistic(self.root())?;
            let w = node::tree_words(&g);
            if g.validate() {
                return Ok(w);
            }
        }
    }

    /// Inserts `key` with `value`, replacing the value if the key is present.
    pub fn insert(&self, tx: &mut Transaction<'_>, key: &[u8], value: &[u8]) -> Result<()> {
        let bm = tx.buffer();
        BTree::check_entry(bm, key, value.len())?;
        let mut buf = Vec::new();
        let mut splits = 0;
        loop {
            let Some(path) = self.descend(bm, key, &mut buf)? else { continue };
            let Some(mut g) = self.latch_leaf(tx, path)? else { continue };
            kv_leaf(&g)?;
            tx.begin_section();
            if leaf::upsert(tx, &mut g, key, value, &mut buf)? {
                return Ok(());
            }
            g.release_unchanged();
            if self.make_room(tx, key, SLOT + key.len() + value.len(), true, &mut buf)? {
                splits += 1;
                if splits > MAX_SPLITS_PER_INSERT {
                    return Err(Error::Inconsistent(format!("insert of a {}-byte value did not find room after {splits} splits", value.len())));
                }
            }
        }
    }

    /// Removes `key`; returns whether it was present. A leaf left empty is unlinked from its
    /// parent and freed when the transaction commits (unless it is its parent's only child);
    /// a leaf left less than a quarter full is merged with a neighbour when both fit in half
    /// a page; an inner node that this leaves less than a quarter full is merged with a
    /// neighbour in turn, up the tree, and a root left with one inner child takes that
    /// child's entries (the tree gets lower). See `btree/merge.rs` (all best effort: an underfull
    /// node is a valid node).
    pub fn remove(&self, tx: &mut Transaction<'_>, key: &[u8]) -> Result<bool> {
        let bm = tx.buffer();
        let mut buf = Vec::new();
        loop {
            let Some(path) = self.descend(bm, key, &mut buf)? else { continue };
            let Some(mut g) = self.latch_leaf(tx, path)? else { continue };
            kv_leaf(&g)?;
            tx.begin_section();
            let removed = leaf::remove(tx, &mut g, key, &mut buf)?;
            let h = node::header(g.data()).ok();
            let emptied = removed && h.is_some_and(|h| h.count == 0);
            let underfull = removed && h.is_some_and(|h| live_bytes(&h, g.len()) < node::room(g.len()) / 4);
            drop(g);
            if emptied || underfull {
                self.rebalance_after_remove(tx, key, emptied, &mut buf)?;
            }
            return Ok(removed);
        }
    }

    /// Takes the transaction's lock on the path's leaf (waiting with no latch held), then
    /// its exclusive latch, and validates the parent. `None`: restart.
    fn latch_leaf<'a>(&self, tx: &mut Transaction<'_>, path: Path<'a>) -> Result<Option<ExclusiveGuard<'a>>> {
        let pid = path.leaf.pid();
        if !tx.holds(pid) {
            drop(path);
            // A leaf merged away and freed meanwhile is not locked: the restart does not
            // lead there again.
            tx.lock_if_allocated(pid)?;
            return Ok(None);
        }
        let Ok(g) = path.leaf.upgrade() else { return Ok(None) };
        if !path.inner.last().expect("a leaf has a parent").g.validate() {
            g.release_unchanged();
            return Ok(None);
        }
        Ok(Some(g))
    }

    /// One structural change that makes room for an entry of `need` bytes (slot included)
    /// for `key` in its leaf (`leaf`), or for a separator in the leaf's parent (`!leaf`):
    /// splits that node, or the lowest ancestor whose parent has room for a separator (the
    /// root in place, by moving its halves into two new children).
    fn make_room(&self, tx: &mut Transaction<'_>, key: &[u8], need: usize, leaf: bool, buf: &mut Vec<u8>) -> Result<bool> {
        let bm = tx.buffer();
        let Some(mut path) = self.descend(bm, key, buf)? else { return Ok(false) };
        // The node to split is at `level` (path.inner.len() = the leaf).
        let mut level = if leaf { path.inner.len() } else { path.inner.len() - 1 };
        while level > 0 {
            match has_room(&path.inner[level - 1].g, SLOT + MAX_KEY) {
                None => return Ok(false),
                Some(true) => break,
                Some(false) => level -= 1,
            }
        }
        if !path.inner.iter().all(|s| s.g.validate()) {
            return Ok(false);
        }
        // Locks first, with no latch held.
        let mut wanted = vec![if level == path.inner.len() { path.leaf.pid() } else { path.inner[level].g.pid() }];
        if level > 0 {
            wanted.push(path.inner[level - 1].g.pid());
        }
        let mut waited = false;
        for pid in wanted {
            if !tx.holds(pid) {
                tx.lock_if_allocated(pid)?;
                waited = true;
            }
        }
        if waited {
            return Ok(false);
        }
        // Everything below is one atomic section: its pages are latched together.
        tx.begin_section();
        if level == 0 {
            let root = path.inner.swap_remove(0);
            let Ok(g) = root.g.upgrade() else { return Ok(false) };
            return split_root(tx, g).map(|()| true);
        }
        let parent_step = path.inner.remove(level - 1);
        let idx = parent_step.idx;
        let Ok(mut pg) = parent_step.g.upgrade() else { return Ok(false) };
        let target = if level - 1 == path.inner.len() { path.leaf } else { path.inner.remove(level - 1).g };
        let Ok(mut ng) = target.upgrade() else {
            pg.release_unchanged();
            return Ok(false);
        };
        if ng.data()[0] == KIND_LEAF {
            split_leaf(tx, &mut pg, idx, ng, key, need, buf)?;
        } else {
            split_inner(tx, &mut pg, idx, &mut ng)?;
        }
        Ok(true)
    }

    /// Links `leaf` (allocated and filled by `tx`) as the new last leaf of the tree, for the
    /// keys from `first_key` on, which must be greater than every key in the tree (appends
    /// of a table): it becomes the `upper` child of the lowest inner node on the right edge,
    /// whose old `upper` gets the separator `first_key`. A full inner node is split first.
    pub(crate) fn append_leaf(&self, tx: &mut Transaction<'_>, first_key: &[u8], leaf: PageId) -> Result<()> {
        let bm = tx.buffer();
        let mut buf = Vec::new();
        let mut splits = 0;
        loop {
            let Some(mut path) = self.descend(bm, first_key, &mut buf)? else { continue };
            let bottom = path.inner.pop().expect("a leaf has a parent");
            match has_room(&bottom.g, SLOT + first_key.len()) {
                None => continue,
                Some(false) => {
                    drop((bottom, path));
                    if self.make_room(tx, first_key, 0, false, &mut buf)? {
                        splits += 1;
                        if splits > MAX_SPLITS_PER_INSERT {
                            return Err(Error::Inconsistent(format!("append of leaf {leaf} did not find room after {splits} splits")));
                        }
                    }
                    continue;
                }
                Some(true) => {}
            }
            let old = path.leaf.pid();
            if bottom.idx != node::header(&bottom.g).map(|h| h.count).unwrap_or(usize::MAX) {
                // Not on the right edge (the key is not past every leaf): a caller's mistake
                // or a concurrent change; a validated path says which.
                if bottom.g.validate() {
                    return Err(Error::InvalidInput(format!("appended key {first_key:?} is not greater than every key of the tree")));
                }
                continue;
            }
            let pid = bottom.g.pid();
            if !tx.holds(pid) {
                drop((bottom, path));
                tx.lock_if_allocated(pid)?;
                continue;
            }
            let Ok(mut g) = bottom.g.upgrade() else { continue };
            tx.begin_section();
            let count = node::header(g.data()).map_err(|_| BTree::corrupt(bm, pid, "impossible inner node"))?.count;
            return relink(tx, &mut g, count, Some(first_key), old, leaf);
        }
    }

    /// Verifies the tree (see [`TreeReport`]); `visit` is called with every page.
    pub fn check(&self, bm: &BufferManager, visit: &mut dyn FnMut(PageId)) -> Result<TreeReport> {
        check::check(bm, self.root(), visit, None).map(|(r, _)| r)
    }

    /// The tree's height, inner nodes, leaves per size class and bytes, from its inner
    /// nodes alone (`entries` is 0): cheap statistics without reading the leaves.
    pub fn shape(&self, bm: &BufferManager) -> Result<TreeReport> {
        check::shape(bm, self.root())
    }

    /// [`check`](Self::check) of a table's tree: `pax` checks each leaf and returns its
    /// rows; also returns the row id after the last row.
    pub(crate) fn check_table(&self, bm: &BufferManager, visit: &mut dyn FnMut(PageId), pax: check::PaxCheck<'_>) -> Result<(TreeReport, u64)> {
        check::check(bm, self.root(), visit, Some(pax)).map(|(r, n)| (r, n.unwrap_or(0)))
    }
}

/// `Err` unless the latched leaf is a key-value leaf.
fn kv_leaf(g: &ExclusiveGuard<'_>) -> Result<()> {
    if g.data()[0] != KIND_LEAF {
        return Err(Error::InvalidInput(format!("page {} is a table leaf, not a key-value leaf: use the table's methods", g.pid())));
    }
    Ok(())
}

/// Whether the inner node has room for a new slot with a key of `need - SLOT` bytes once
/// its dead bytes are reclaimed (`None`: impossible header, restart).
fn has_room<S: Src + ?Sized>(s: &S, need: usize) -> Option<bool> {
    let h = node::header(s).ok()?;
    Some(h.heap - (HDR + h.count * SLOT) + h.dead >= need)
}

/// Writes a node image over the latched page, logging only the bytes that differ.
pub(crate) fn write_image(tx: &mut Transaction<'_>, g: &mut ExclusiveGuard<'_>, img: &[u8]) -> Result<()> {
    let ranges = node::diff_ranges(g.data(), img);
    for r in ranges {
        tx.write_latched(g, r.start, &img[r])?;
    }
    Ok(())
}

/// Bytes a node's live entries take (slots and heap, dead heap bytes not counted).
fn live_bytes(h: &node::Header, size: usize) -> usize {
    (h.count * SLOT + size.saturating_sub(h.heap)).saturating_sub(h.dead)
}

/// The split index of inner entries `e` (the entry pushed up), balancing bytes.
fn middle(e: &Entries, leaf: bool) -> usize {
    let total = node::need(e, 0..e.len(), leaf);
    let mut acc = 0;
    for i in 0..e.len() {
        acc += SLOT + e.heap_bytes(i, leaf);
        if acc * 2 >= total {
            return i.clamp(1, e.len().saturating_sub(2).max(1));
        }
    }
    e.len() / 2
}

/// Replaces the parent's pointer at `idx` (a slot, or `upper` when `idx == count`) by
/// `left` with separator `sep` followed by `right`; or, without `sep`, just repoints it.
fn relink(tx: &mut Transaction<'_>, pg: &mut ExclusiveGuard<'_>, idx: usize, sep: Option<&[u8]>, left: PageId, right: PageId) -> Result<()> {
    let (h, mut e) = node::decode(pg.data()).map_err(|_| BTree::corrupt(tx.buffer(), pg.pid(), "impossible inner node"))?;
    debug_assert_eq!(h.kind, KIND_INNER);
    let d = pg.data();
    let mut upper = d.word(W_UPPER);
    let tree = node::tree_words(d);
    let at = |e: &Entries, upper: u64, i: usize| if i < e.len() { e.child(i) } else { upper };
    if idx > e.len() || at(&e, upper, idx) != left.raw() {
        return Err(BTree::corrupt(tx.buffer(), pg.pid(), "child pointer moved under a latched parent"));
    }
    let target = match sep {
        Some(sep) => {
            e.insert(idx, sep, &[], left.raw());
            idx + 1
        }
        None => idx,
    };
    if target < e.len() {
        e.items[target].2 = right.raw();
    } else {
        upper = right.raw();
    }
    let img = node::build(pg.len(), KIND_INNER, &e, 0..e.len(), upper, tree);
    write_image(tx, pg, &img)
}

/// Splits (or grows) the full leaf `lg`, child `idx` of `pg`, so that an entry of `need`
/// bytes for `key` finds room when the insert restarts.
fn split_leaf(
    tx: &mut Transaction<'_>,
    pg: &mut ExclusiveGuard<'_>,
    idx: usize,
    mut lg: ExclusiveGuard<'_>,
    key: &[u8],
    need: usize,
    buf: &mut Vec<u8>,
) -> Result<()> {
    let bm = tx.buffer();
    let (_, mut e) = node::decode(lg.data()).map_err(|_| BTree::corrupt(bm, lg.pid(), "impossible leaf"))?;
    let (p, found) = node::lower_bound(lg.data(), e.len(), key, buf).map_err(|_| BTree::corrupt(bm, lg.pid(), "impossible leaf"))?;
    if found {
        // The insert replaces it: leave it out, the restarted insert adds the new value.
        e.items.remove(p);
    }
    let n = e.len();
    let cap = node::room(lg.len());
    let left_pid = lg.pid();
    if n == 0 {
        // Even an empty leaf of this class is too small: move to a larger page.
        let mut ng = tx.alloc_latched(HDR + need)?;
        let img = node::build(ng.len(), KIND_LEAF, &e, 0..0, 0, [0, 0]);
        write_image(tx, &mut ng, &img)?;
        relink(tx, pg, idx, None, left_pid, ng.pid())?;
        drop(ng);
        if found {
            let img = node::build(lg.len(), KIND_LEAF, &e, 0..0, 0, [0, 0]);
            write_image(tx, &mut lg, &img)?;
        } else {
            lg.release_unchanged();
        }
        return tx.free(left_pid);
    }
    let big = need > cap / 2;
    let total = node::need(&e, 0..n, true);
    // (split index, whether the new entry will go right)
    let (m, goes_right) = if p == n {
        (n, true)
    } else if (big || n == 1) && p == 0 {
        (0, false)
    } else if big {
        (p, false)
    } else {
        let mut acc = 0;
        let mut m = n / 2;
        for i in 0..n {
            acc += SLOT + e.heap_bytes(i, true) + if i == p { need } else { 0 };
            if acc * 2 >= total + need {
                m = (i + 1).clamp(1, n - 1);
                break;
            }
        }
        (m, p > m)
    };
    let sep: Vec<u8> = if m == n { key.to_vec() } else { e.key(m).to_vec() };
    let right_need = HDR + node::need(&e, m..n, true) + if goes_right { need } else { 0 };
    let mut rg = tx.alloc_latched(right_need.max(1))?;
    let rimg = node::build(rg.len(), KIND_LEAF, &e, m..n, 0, [0, 0]);
    write_image(tx, &mut rg, &rimg)?;
    let limg = node::build(lg.len(), KIND_LEAF, &e, 0..m, 0, [0, 0]);
    write_image(tx, &mut lg, &limg)?;
    relink(tx, pg, idx, Some(&sep), left_pid, rg.pid())
}

/// Splits the full inner node `ng`, child `idx` of `pg`.
fn split_inner(tx: &mut Transaction<'_>, pg: &mut ExclusiveGuard<'_>, idx: usize, ng: &mut ExclusiveGuard<'_>) -> Result<()> {
    let bm = tx.buffer();
    let (_, e) = node::decode(ng.data()).map_err(|_| BTree::corrupt(bm, ng.pid(), "impossible inner node"))?;
    if e.len() < 3 {
        return Err(BTree::corrupt(bm, ng.pid(), "a full inner node with fewer than three separators"));
    }
    let upper = ng.data().word(W_UPPER);
    let tree = node::tree_words(ng.data());
    let m = middle(&e, false);
    let sep = e.key(m).to_vec();
    let mut rg = tx.alloc_latched(1)?;
    let rimg = node::build(rg.len(), KIND_INNER, &e, m + 1..e.len(), upper, [0, 0]);
    write_image(tx, &mut rg, &rimg)?;
    let limg = node::build(ng.len(), KIND_INNER, &e, 0..m, e.child(m), tree);
    write_image(tx, ng, &limg)?;
    relink(tx, pg, idx, Some(&sep), ng.pid(), rg.pid())
}

/// Splits the full root in place: its halves move into two new inner nodes.
fn split_root(tx: &mut Transaction<'_>, mut g: ExclusiveGuard<'_>) -> Result<()> {
    let bm = tx.buffer();
    let (_, e) = node::decode(g.data()).map_err(|_| BTree::corrupt(bm, g.pid(), "impossible root"))?;
    if e.len() < 3 {
        return Err(BTree::corrupt(bm, g.pid(), "a full root with fewer than three separators"));
    }
    let upper = g.data().word(W_UPPER);
    let tree = node::tree_words(g.data());
    let m = middle(&e, false);
    let mut a = tx.alloc_latched(1)?;
    let img = node::build(a.len(), KIND_INNER, &e, 0..m, e.child(m), [0, 0]);
    write_image(tx, &mut a, &img)?;
    let mut b = tx.alloc_latched(1)?;
    let img = node::build(b.len(), KIND_INNER, &e, m + 1..e.len(), upper, [0, 0]);
    write_image(tx, &mut b, &img)?;
    let mut top = Entries::default();
    top.push(e.key(m), &[], a.pid().raw());
    let img = node::build(g.len(), KIND_INNER, &top, 0..1, b.pid().raw(), tree);
    write_image(tx, &mut g, &img)
}
