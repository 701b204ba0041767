//! Tables: rows of typed, nullable columns in a B+-tree keyed by row id, with PAX leaves.
//!
//! ```no_run
//! # fn demo(db: &strata::Database) -> strata::Result<()> {
//! use strata::access::table::{Schema, Value};
//! let table = db.create_table("people", Schema::parse("name:str,born:date,score:f64")?)?;
//! let mut tx = db.begin();
//! let ids = table.append(&mut tx, &[vec![Value::Str("Ada".into()), Value::Date(-47_000), Value::Null]])?;
//! tx.commit()?;                                        // durable when this returns
//! let row = table.get(db.buffer(), ids.start)?;        // Some(vec![Str("Ada"), Date(..), Null])
//! table.scan(db.buffer(), 0, &mut |id, row| { println!("{id}: {row:?}"); true })?;
//! # Ok(()) }
//! ```
//!
//! Rows get dense ids in insertion order (0, 1, 2, ...); the tree's keys are the ids as 8
//! big-endian bytes, and each leaf holds a run of consecutive rows, either in the plain PAX
//! format of [`pax`] (fixed-size values column by column at the start of the page, long
//! strings at its end) or packed ([`packed`]: frame-of-reference bit packing, decimal
//! floats, string dictionaries; expanded into the plain layout to be read). Small appends
//! go to a plain last leaf in place while all their rows fit; larger ones rewrite that
//! leaf (or a packed last leaf that was not full) packed with its rows followed by new
//! ones, then fill new leaves linked at the right edge of the tree (no split: tables grow
//! at the end): packed while the rest does not fit one plain leaf, and only where packing
//! holds more rows than plain; a rest that fits one plain leaf gets one, with room for
//! later small appends. A
//! leaf is a page of the smallest size class unless a row needs more: a row with a 50 MiB
//! string gets a plain leaf of a class that holds it whole. The next row id lives in the root's header
//! and is written last by each append; the number of committed rows beside it is written
//! when the appending transaction commits (just before its commit record, as a logged change
//! of that transaction: a rollback restores it, recovery redoes it for a committed one).
//!
//! Appends are changes of the caller's [`Transaction`]: a crash loses no committed row, and
//! a rolled-back append leaves the table as it was. An append locks the table's root until
//! its transaction ends, so appenders take turns (their rows get consecutive ids), and the
//! rows of an open appender always come after every committed row. Readers take no locks
//! (optimistic lock coupling, as for key-value trees) and see committed rows (read
//! committed): [`Table::rows`] counts the rows committed so far, and a reader that sees
//! `rows() == n` finds every row below `n`, for good (only a table's end is ever rolled
//! back, and it lies at or above the committed count). The committed rows are visible from
//! the moment the commit record is appended, before it is durable: a crash in between loses
//! them with the commit (which was not acknowledged); a failed log flush rolls them back.

pub mod csv;
mod fsst;
pub mod packed;
pub mod parquet;
pub mod pax;
pub mod schema;
pub mod text;

use std::ops::Range;

use serde::{Deserialize, Serialize};

pub use schema::{ColumnDef, ColumnType, Schema, Value};

use crate::access::btree::node::{COMMITTED_SET, KIND_PACKED, W_COMMITTED, W_TREE};
use crate::access::btree::{write_image, BTree, TreeReport};
use crate::buffer::BufferManager;
use crate::error::{Error, Result};
use crate::storage::{layout::class_file, PageId};
use crate::txn::Transaction;

/// What [`Table::scan_pages`] calls with each leaf: its page id, the leaf and its first row
/// not handed out before.
pub(crate) type PageVisitor<'a> = dyn FnMut(PageId, LeafPage<'_>, usize) -> Result<bool> + 'a;

/// A table leaf as [`Table::scan_pages`] hands it out.
pub(crate) enum LeafPage<'p> {
    /// A plain leaf: its bytes and checked header.
    Plain(&'p [u8], pax::Leaf),
    /// A packed leaf, opened (its blocks checked), for the reader to expand what it needs.
    Packed(packed::PackedLeaf<'p>),
}

impl LeafPage<'_> {
    /// The id of the leaf's first row.
    pub(crate) fn first(&self) -> u64 {
        match self {
            LeafPage::Plain(_, l) => l.first,
            LeafPage::Packed(p) => p.header.first,
        }
    }

    /// The rows the leaf holds.
    pub(crate) fn count(&self) -> usize {
        match self {
            LeafPage::Plain(_, l) => l.count,
            LeafPage::Packed(p) => p.header.count,
        }
    }
}

/// Whether packed leaves written into `bm`'s database get a column directory: from format
/// version 2 on (a database of version 1 keeps the leaves its builds read).
fn with_directory(bm: &BufferManager) -> bool {
    bm.format_version() >= 2
}

/// A table: its schema and the tree of its rows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Table {
    /// The columns.
    pub schema: Schema,
    tree: BTree,
}

impl Table {
    /// Creates an empty table as part of `tx` (usually [`crate::Database::create_table`]).
    pub fn create(tx: &mut Transaction<'_>, schema: Schema) -> Result<Table> {
        let tree = BTree::create_with(tx, &|size| {
            // Capacity for rows without long strings, or half the page for the fixed-size
            // values when the table has string columns.
            let var = if schema.columns.iter().any(|c| c.ty.is_var()) { 1 } else { 0 };
            let probe = vec![Value::Str("x".repeat(13)); var];
            let (_, cap) = pax::plan(&schema, size, &[probe]);
            let cap = if var == 1 { (cap / 2).max(1) } else { cap };
            pax::build(size, &schema, 0, cap, &[])
        })?;
        tx.write_u64(tree.root(), W_COMMITTED, COMMITTED_SET)?;
        Ok(Table { schema, tree })
    }

    /// The table with `schema` whose tree has its root at `root`.
    pub fn open(schema: Schema, root: PageId) -> Table {
        Table { schema, tree: BTree::open(root) }
    }

    /// The root page of the table's tree.
    pub fn root(&self) -> PageId {
        self.tree.root()
    }

    /// The number of committed rows: rows `0..rows()` are there and stay (read committed;
    /// the rows of a transaction still appending come after them). A table created before
    /// the committed count was kept counts every appended row, as [`appended`](Self::appended).
    pub fn rows(&self, bm: &BufferManager) -> Result<u64> {
        let [appended, committed] = self.tree.root_words(bm)?;
        Ok(if committed & COMMITTED_SET != 0 { committed & !COMMITTED_SET } else { appended })
    }

    /// The number of rows appended so far, committed or not (the next row id).
    pub fn appended(&self, bm: &BufferManager) -> Result<u64> {
        Ok(self.tree.root_words(bm)?[0])
    }

    fn corrupt(&self, bm: &BufferManager, pid: PageId, what: &str) -> Error {
        Error::corruption(class_file(bm.dir(), pid.class()), Some(pid), format!("table leaf: {what}"))
    }

    /// Checks that `row` has the schema's columns and types.
    fn check_row(&self, i: usize, row: &[Value]) -> Result<()> {
        if row.len() != self.schema.len() {
            return Err(Error::InvalidInput(format!("row {i} has {} values, the table has {} columns", row.len(), self.schema.len())));
        }
        for (v, c) in row.iter().zip(&self.schema.columns) {
            if let Some(ty) = v.ty() {
                if ty != c.ty {
                    return Err(Error::InvalidInput(format!("row {i}, column {:?}: a {} value for a {} column", c.name, ty.name(), c.ty.name())));
                }
            }
        }
        Ok(())
    }

    /// `Err` naming the row (`what()`, called only then) if a row that needs `bytes` of a
    /// leaf is larger than the largest page `bm`'s pool can hold.
    pub fn check_row_size(bm: &BufferManager, bytes: usize, what: impl FnOnce() -> String) -> Result<()> {
        let max = BTree::max_leaf(bm);
        if bytes > max {
            return Err(Error::InvalidInput(format!(
                "{} needs a page of {bytes} bytes, larger than the largest page this pool can hold ({max} bytes, pool {} bytes): raise the pool size",
                what(),
                bm.pool_size()
            )));
        }
        Ok(())
    }

    /// Appends `rows` as part of `tx`; returns the ids they got. Each row is checked against
    /// the schema first (nothing is appended if one does not match), and must fit one page
    /// of the largest size class the pool can hold. Locks the table until `tx` ends.
    pub fn append(&self, tx: &mut Transaction<'_>, rows: &[Vec<Value>]) -> Result<Range<u64>> {
        let bm = tx.buffer();
        let (mut largest, mut largest_at) = (0, 0);
        for (i, row) in rows.iter().enumerate() {
            self.check_row(i, row)?;
            let bytes = pax::row_bytes(&self.schema, row);
            if bytes > largest {
                (largest, largest_at) = (bytes, i);
            }
        }
        Table::check_row_size(bm, largest, || format!("row {largest_at}"))?;
        let root = self.tree.root();
        let dir = with_directory(bm);
        tx.lock(root)?;
        let first = tx.read_u64(root, W_TREE)?;
        let end = first.checked_add(rows.len() as u64).ok_or_else(|| Error::InvalidInput("row ids exhausted".into()))?;
        let mut done = self.append_last_leaf(tx, first, rows)?;
        // The rest in new leaves at the right edge.
        let small = bm.payload_size(0);
        while done < rows.len() {
            let id = first + done as u64;
            let rest = &rows[done..];
            tx.begin_section();
            let (mut g, img, n) = match pax::plan(&self.schema, small, rest) {
                (0, _) => {
                    let g = tx.alloc_latched(pax::row_bytes(&self.schema, &rest[0]))?;
                    let (n, cap) = pax::plan(&self.schema, g.len(), rest);
                    let img = pax::build(g.len(), &self.schema, id, cap, &rest[..n]);
                    (g, img, n)
                }
                (n, cap) => {
                    // Packed unless every remaining row fits one plain leaf (the table's tail,
                    // extended in place by later small appends), and only if packing holds
                    // more rows than a plain leaf would.
                    let (k, full) = if n < rest.len() { packed::fit(&self.schema, small, rest, dir) } else { (0, false) };
                    let img = if k > n {
                        packed::encode(small, &self.schema, id, &rest[..k], full, dir)
                    } else {
                        pax::build(small, &self.schema, id, cap, &rest[..n])
                    };
                    (tx.alloc_latched(small)?, img, k.max(n))
                }
            };
            debug_assert!(n > 0);
            write_image(tx, &mut g, &img)?;
            let pid = g.pid();
            drop(g);
            self.tree.append_leaf(tx, &id.to_be_bytes(), pid)?;
            done += n;
        }
        tx.write_u64(root, W_TREE, end)?;
        tx.publish_at_commit(root, W_TREE, W_COMMITTED, COMMITTED_SET)?;
        Ok(first..end)
    }

    /// Appends what it can of `rows` (with ids from `first`) to the table's last leaf, as
    /// part of `tx`; returns how many. All of them in place if they fit a plain leaf;
    /// otherwise a non-empty plain leaf, or a packed one that was not closed, is rewritten
    /// packed with its rows followed by as many new rows as fit (when that holds more rows
    /// than plain in-place appends would); else the plain leaf is filled in place.
    fn append_last_leaf(&self, tx: &mut Transaction<'_>, first: u64, rows: &[Vec<Value>]) -> Result<usize> {
        let bm = tx.buffer();
        let dir = with_directory(bm);
        let mut g = self.tree.lock_leaf(tx, &first.to_be_bytes())?;
        let pid = g.pid();
        let (leaf, plain) = match g.data()[0] {
            KIND_PACKED => {
                let p = packed::header(g.data(), &self.schema).map_err(|_| self.corrupt(bm, pid, "impossible header"))?;
                (pax::Leaf { count: p.count, var: 0, cap: p.count, first: p.first }, if p.full { None } else { Some(false) })
            }
            _ => (pax::header(g.data(), &self.schema).map_err(|_| self.corrupt(bm, pid, "impossible header"))?, Some(true)),
        };
        if leaf.first + leaf.count as u64 != first {
            return Err(self.corrupt(bm, pid, &format!("the last leaf ends at row {}, the table at {first}", leaf.first + leaf.count as u64)));
        }
        let in_place = if plain == Some(true) { pax::fit_in_place(&self.schema, &leaf, rows) } else { 0 };
        // An open packed leaf is repacked only for more rows than a new plain leaf holds
        // (single-row inserts after an import start a plain tail instead).
        let worth = match plain {
            Some(true) => true,
            Some(false) => pax::plan(&self.schema, bm.payload_size(0), rows).0 < rows.len(),
            None => false,
        };
        if in_place < rows.len() && leaf.count > 0 && worth {
            // Repack: the leaf's rows, then the new ones (borrowed, not copied).
            let mut old = Vec::with_capacity(leaf.count);
            if plain == Some(true) {
                let mut row = Vec::new();
                for i in 0..leaf.count {
                    pax::read_row(g.data(), &self.schema, &leaf, i, &mut row).map_err(|_| self.corrupt(bm, pid, "a row is unreadable"))?;
                    old.push(std::mem::take(&mut row));
                }
            } else {
                packed::rows(g.data(), &self.schema, &mut old).map_err(|_| self.corrupt(bm, pid, "a row is unreadable"))?;
            }
            let new = &rows[..rows.len().min(packed::max_rows(g.len()))];
            let all: Vec<&[Value]> = old.iter().chain(new).map(Vec::as_slice).collect();
            let (k, full) = packed::fit(&self.schema, g.len(), &all, dir);
            let (plain_rows, _) = pax::plan(&self.schema, g.len(), &all);
            if k > plain_rows.max(leaf.count + in_place) {
                tx.begin_section();
                let img = packed::encode(g.len(), &self.schema, leaf.first, &all[..k], full, dir);
                write_image(tx, &mut g, &img)?;
                return Ok(k - leaf.count);
            }
        }
        if in_place > 0 {
            tx.begin_section();
            for (at, bytes) in pax::append_writes(g.data(), &self.schema, &leaf, &rows[..in_place]) {
                tx.write_latched(&mut g, at, &bytes)?;
            }
        }
        Ok(in_place)
    }

    /// Row `id`, or `None` if the table has no such row.
    pub fn get(&self, bm: &BufferManager, id: u64) -> Result<Option<Vec<Value>>> {
        let mut row = Vec::with_capacity(self.schema.len());
        let found = self.tree.read_leaf(bm, &id.to_be_bytes(), &mut |_, s| {
            if s.word(0) as u8 == KIND_PACKED {
                let p = packed::header(s, &self.schema)?;
                if id < p.first || id - p.first >= p.count as u64 {
                    return Ok(false);
                }
                packed::read_row(s, &self.schema, (id - p.first) as usize, &mut row)?;
                return Ok(true);
            }
            let leaf = pax::header(s, &self.schema)?;
            if id < leaf.first || id - leaf.first >= leaf.count as u64 {
                return Ok(false);
            }
            pax::read_row(s, &self.schema, &leaf, (id - leaf.first) as usize, &mut row)?;
            Ok(true)
        })?;
        Ok(found.then_some(row))
    }

    /// Calls `f(id, row)` for every row from id `from` on, in id order, until `f` returns
    /// false. Each leaf is read whole (a validated copy) before its rows are handed out.
    pub fn scan(&self, bm: &BufferManager, from: u64, f: &mut dyn FnMut(u64, &[Value]) -> bool) -> Result<()> {
        let mut row = Vec::with_capacity(self.schema.len());
        let mut img = Vec::new();
        self.tree.scan_leaves(bm, &from.to_be_bytes(), None, None, &mut |pid, page, next| {
            let next = next.try_into().map(u64::from_be_bytes).unwrap_or(from).max(from);
            let (page, leaf) = self.plain_image(bm, pid, page, &mut img)?;
            for i in 0..leaf.count {
                let id = leaf.first + i as u64;
                if id < next {
                    continue;
                }
                pax::read_row(page, &self.schema, &leaf, i, &mut row).map_err(|_| self.corrupt(bm, pid, &format!("row {id} is unreadable")))?;
                if !f(id, &row) {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }

    /// Calls `f(pid, leaf, start)` for every leaf in row-id order, until `f` returns false:
    /// the leaf (its bytes, a validated copy or the latched page, with its checked header;
    /// a packed leaf opened, for `f` to expand what it reads), and the index of its first
    /// row not handed out before (a scan that restarts after a concurrent change revisits a
    /// leaf; rows below `start` were seen already). For readers that decode only some
    /// columns ([`crate::sql`]'s vectorized scan). Starts at the leaf holding row `from`
    /// (rows below it are not handed out). `to`, if given, is a row id the caller stops at
    /// (`f` returns false there): leaves beyond it are not read ahead. `need`, if given,
    /// marks the columns `f` reads: of packed leaves only those are opened, and cold ones
    /// are read from the disk in part ([`packed::ColumnRead`]).
    pub(crate) fn scan_pages(&self, bm: &BufferManager, from: u64, to: Option<u64>, need: Option<&[bool]>, f: &mut PageVisitor<'_>) -> Result<()> {
        let end = to.map(u64::to_be_bytes);
        let partial = need.map(|need| packed::ColumnRead::new(&self.schema, need));
        let partial = partial.as_ref().map(|p| p as &dyn crate::buffer::PartialRead);
        self.tree.scan_leaves(bm, &from.to_be_bytes(), end.as_ref().map(|k| &k[..]), partial, &mut |pid, page, next| {
            let next = next.try_into().map(u64::from_be_bytes).unwrap_or(from).max(from);
            let leaf = if page[0] == KIND_PACKED {
                LeafPage::Packed(packed::PackedLeaf::open_columns(page, &self.schema, need).map_err(|_| self.corrupt(bm, pid, "impossible packed leaf"))?)
            } else {
                LeafPage::Plain(page, pax::header(page, &self.schema).map_err(|_| self.corrupt(bm, pid, "impossible header"))?)
            };
            let start = next.saturating_sub(leaf.first()).min(leaf.count() as u64) as usize;
            f(pid, leaf, start)
        })
    }

    /// The plain image of a (copied or latched) leaf and its checked header: the page
    /// itself if it is plain, else its expansion into `img`.
    fn plain_image<'p>(&self, bm: &BufferManager, pid: PageId, page: &'p [u8], img: &'p mut Vec<u8>) -> Result<(&'p [u8], pax::Leaf)> {
        if page[0] == KIND_PACKED {
            let leaf = packed::expand(page, &self.schema, None, img).map_err(|_| self.corrupt(bm, pid, "impossible packed leaf"))?;
            let img: &'p Vec<u8> = img;
            return Ok((&img[..], leaf));
        }
        let leaf = pax::header(page, &self.schema).map_err(|_| self.corrupt(bm, pid, "impossible header"))?;
        Ok((page, leaf))
    }

    /// How many of the table's leaves are packed, and how many leaves it has (reads every
    /// leaf).
    pub fn packed_leaves(&self, bm: &BufferManager) -> Result<(u64, u64)> {
        let (mut packed, mut all) = (0, 0);
        self.tree.scan_leaves(bm, &0u64.to_be_bytes(), None, None, &mut |_, page, _| {
            all += 1;
            packed += (page[0] == KIND_PACKED) as u64;
            Ok(true)
        })?;
        Ok((packed, all))
    }

    /// A corruption error naming leaf `pid` of this table.
    pub(crate) fn corrupt_leaf(&self, bm: &BufferManager, pid: PageId, what: &str) -> Error {
        self.corrupt(bm, pid, what)
    }

    /// The table's rows, tree height, inner nodes, leaves per size class and bytes, from
    /// the inner nodes alone (see [`BTree::shape`]; `entries` is the row count).
    pub fn shape(&self, bm: &BufferManager) -> Result<TreeReport> {
        let mut r = self.tree.shape(bm)?;
        r.entries = self.rows(bm)?;
        Ok(r)
    }

    /// Verifies the table: the tree (order, separators against leaves, depth, classes),
    /// every row readable, ids dense from 0 and ending at [`appended`](Self::appended), the
    /// committed rows no more than that. `visit` is called with every page.
    pub fn check(&self, bm: &BufferManager, visit: &mut dyn FnMut(PageId)) -> Result<TreeReport> {
        let (report, end) = self.tree.check_table(bm, visit, &|pid, page| {
            let bad = |what: &str| Error::Inconsistent(format!("table leaf {pid}: {what}"));
            let mut img = Vec::new();
            let (page, leaf) = if page[0] == KIND_PACKED {
                packed::header(page, &self.schema).map_err(|_| bad("impossible packed header (or a schema that does not match)"))?;
                if !packed::checksums_match(page, &self.schema).unwrap_or(false) {
                    return Err(bad("a column block does not match its checksum in the leaf's directory"));
                }
                let leaf = packed::expand(page, &self.schema, None, &mut img).map_err(|_| bad("an impossible packed column"))?;
                (&img[..], leaf)
            } else {
                (page, pax::header(page, &self.schema).map_err(|_| bad("impossible header (or a schema that does not match)"))?)
            };
            pax::verify(page, &self.schema, &leaf).map_err(|_| bad("a row is unreadable"))?;
            Ok((leaf.first, leaf.count as u64))
        })?;
        let rows = self.appended(bm)?;
        if end != rows {
            return Err(Error::Inconsistent(format!("the table says it has {rows} rows, its leaves hold {end}")));
        }
        let committed = self.rows(bm)?;
        if committed > rows {
            return Err(Error::Inconsistent(format!("the table says {committed} of its {rows} rows are committed")));
        }
        Ok(report)
    }
}
