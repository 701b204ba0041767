//! The database façade: a buffer manager plus the catalog of named columns.

use std::collections::HashSet;
use std::io::{BufRead, Read};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

use crate::access::btree::{BTree, TreeReport};
use crate::access::table::{pax, Schema, Table, Value};
use crate::access::{Catalog, Column, Graph, ValueFormat};
use crate::buffer::{BufferManager, Cleaner, CleanerOptions, CleanerStats, Config};
use crate::error::{Error, Result};
use crate::storage::AlignedBuf;
use crate::txn::{LockTable, Transaction};

/// A database: pages managed by a [`BufferManager`], named columns in a [`Catalog`].
pub struct Database {
    /// Dropped first: the cleaner's thread is joined before the manager goes.
    cleaner: Option<Cleaner>,
    bm: Arc<BufferManager>,
    catalog: Mutex<Catalog>,
    /// The catalog as the file holds it (`None` after a failed replacement: unknown): a
    /// checkpoint rewrites the file only when the catalog differs (reading a database
    /// writes nothing, also on a full disk).
    stored_catalog: Mutex<Option<Catalog>>,
    locks: LockTable,
}

/// What [`Database::check`] found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CheckReport {
    /// Pages whose checksum and id were verified on disk.
    pub pages_verified: u64,
    /// Columns checked.
    pub columns: u64,
    /// Graphs checked.
    pub graphs: u64,
    /// Key-value trees checked, by name.
    pub trees: std::collections::BTreeMap<String, TreeReport>,
    /// Tables checked, by name.
    pub tables: std::collections::BTreeMap<String, TreeReport>,
    /// Allocated pages that no column references (left by an interrupted import; harmless).
    pub unreferenced_pages: u64,
}

/// A source of rows for [`Database::load_table`]: called once with a sink, it hands every
/// row to the sink and returns how many it handed.
pub type RowFeed<'a> = dyn FnMut(&mut dyn FnMut(&[Value]) -> Result<()>) -> Result<u64> + 'a;

/// Checks the name of a new object.
fn check_name(kind: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 255 || name.chars().any(|c| c.is_control()) {
        return Err(Error::InvalidInput(format!("invalid {kind} name {name:?}")));
    }
    Ok(())
}

impl Database {
    /// Creates a new database.
    pub fn create(config: Config) -> Result<Database> {
        let backend = config.backend.clone();
        let dir = config.dir.clone();
        let cleaner = config.cleaner;
        // The catalog must exist before the meta file makes the directory a database.
        let bm = BufferManager::create_with(config, &[crate::access::catalog::CATALOG_FILE], |be, dir| Catalog::default().store(be, dir))?;
        debug_assert!(backend.exists(&Catalog::path(&dir)));
        Database::with(bm, Catalog::default(), cleaner)
    }

    /// Opens an existing database.
    pub fn open(config: Config) -> Result<Database> {
        let cleaner = config.cleaner;
        let bm = BufferManager::open(config)?;
        let catalog = Catalog::load(bm.backend().as_ref(), bm.dir())?;
        let db = Database::with(bm, catalog, cleaner)?;
        if !db.catalog.lock().loading.is_empty() {
            // Part of recovering from a failed import, so it may use the reserved space; best
            // effort: what cannot be dropped now is dropped by a later open, and readers
            // must not fail for it.
            let _ = db.bm.with_disk_reserve(|_| {
                db.drop_unfinished_loads();
                db.checkpoint()
            });
        }
        Ok(db)
    }

    /// Opens an existing database for reading only: no recovery, no checkpoint, no file
    /// created or changed (see [`BufferManager::open_read_only`]: a shared directory lock,
    /// and [`Error::RecoveryPending`] when recovery is due). Changes fail with
    /// [`Error::ReadOnly`]; `close` writes nothing.
    pub fn open_read_only(config: Config) -> Result<Database> {
        let bm = BufferManager::open_read_only(config)?;
        let catalog = Catalog::load(bm.backend().as_ref(), bm.dir())?;
        Database::with(bm, catalog, None)
    }

    fn with(bm: BufferManager, catalog: Catalog, cleaner: Option<CleanerOptions>) -> Result<Database> {
        let bm = Arc::new(bm);
        let cleaner = match cleaner {
            Some(opts) => Some(Cleaner::start(bm.clone(), opts).map_err(|e| Error::io("start the cleaner thread", bm.dir(), e))?),
            None => None,
        };
        Ok(Database { cleaner, bm, stored_catalog: Mutex::new(Some(catalog.clone())), catalog: Mutex::new(catalog), locks: LockTable::default() })
    }

    /// The background cleaner's figures, when one runs ([`Config::cleaner`]).
    pub fn cleaner_stats(&self) -> Option<CleanerStats> {
        self.cleaner.as_ref().map(Cleaner::stats)
    }

    /// Begins a transaction (see [`crate::txn`]).
    pub fn begin(&self) -> Transaction<'_> {
        Transaction::begin(&self.bm, &self.locks)
    }

    /// The lock table of this database's transactions.
    pub fn locks(&self) -> &LockTable {
        &self.locks
    }

    /// The buffer manager.
    pub fn buffer(&self) -> &BufferManager {
        &self.bm
    }

    /// A copy of the catalog.
    pub fn catalog(&self) -> Catalog {
        self.catalog.lock().clone()
    }

    /// The column `name`.
    pub fn column(&self, name: &str) -> Result<Column> {
        self.catalog.lock().column(name).cloned()
    }

    /// Appends `len` bytes of values read from `input` to column `name` (created if
    /// absent), then checkpoints. On error nothing changes.
    pub fn import(&self, name: &str, format: ValueFormat, input: &mut dyn Read, len: u64, progress: &mut dyn FnMut(u64)) -> Result<Column> {
        if name.is_empty() || name.len() > 255 || name.chars().any(|c| c.is_control()) {
            return Err(Error::InvalidInput(format!("invalid column name {name:?}")));
        }
        let mut col = match self.catalog.lock().columns.get(name) {
            Some(c) if c.format != format => {
                return Err(Error::InvalidInput(format!("column {name:?} holds {} values, cannot append {}", c.format.name(), format.name())))
            }
            Some(c) => c.clone(),
            None => Column::new(format),
        };
        col.append(&self.bm, input, len, progress)?;
        let mut next = self.catalog();
        next.columns.insert(name.to_owned(), col.clone());
        self.bm.checkpoint()?;
        self.store_catalog(&next)?;
        *self.catalog.lock() = next;
        Ok(col)
    }

    /// Creates the key-value B+-tree `name` (see [`crate::access::btree`]): durable when
    /// this returns.
    pub fn create_tree(&self, name: &str) -> Result<BTree> {
        check_name("tree", name)?;
        // One creator at a time, so that two cannot both take the name.
        let mut catalog = self.catalog.lock();
        if catalog.contains(name) {
            return Err(Error::InvalidInput(format!("an object named {name:?} already exists")));
        }
        let mut tx = self.begin();
        let tree = BTree::create(&mut tx)?;
        tx.commit()?;
        let mut next = catalog.clone();
        next.trees.insert(name.to_owned(), tree);
        self.store_catalog(&next)?;
        *catalog = next;
        Ok(tree)
    }

    /// The key-value tree `name`.
    pub fn tree(&self, name: &str) -> Result<BTree> {
        self.catalog.lock().tree(name).copied()
    }

    /// Creates the empty table `name` with `schema` (see [`crate::access::table`]): durable
    /// when this returns.
    pub fn create_table(&self, name: &str, schema: Schema) -> Result<Table> {
        self.create_table_in(name, schema, false)
    }

    /// [`create_table`](Self::create_table), the table entered as `loading` (invisible
    /// until [`publish_table`](Self::publish_table)) if `loading`.
    fn create_table_in(&self, name: &str, schema: Schema, loading: bool) -> Result<Table> {
        check_name("table", name)?;
        let mut catalog = self.catalog.lock();
        if catalog.contains(name) {
            return Err(Error::InvalidInput(format!("an object named {name:?} already exists")));
        }
        let mut tx = self.begin();
        let table = Table::create(&mut tx, schema)?;
        tx.commit()?;
        let mut next = catalog.clone();
        if loading {
            next.loading.insert(name.to_owned(), table.clone());
        } else {
            next.tables.insert(name.to_owned(), table.clone());
        }
        if let Err(e) = self.store_catalog(&next) {
            // Give the new pages back (if that fails too, e.g. on a full disk, they stay
            // allocated but unreferenced: `check` reports them, harmless).
            let _ = self.free_table_pages(&table);
            return Err(e);
        }
        *catalog = next;
        Ok(table)
    }

    /// Makes the loaded table `name` visible (durable when this returns).
    fn publish_table(&self, name: &str) -> Result<()> {
        let mut catalog = self.catalog.lock();
        let mut next = catalog.clone();
        let table = next.loading.remove(name).ok_or_else(|| Error::NotFound { kind: "table", name: name.to_owned() })?;
        next.tables.insert(name.to_owned(), table);
        self.store_catalog(&next)?;
        *catalog = next;
        Ok(())
    }

    /// Drops the tables that an import was creating when it failed or the process died
    /// (best effort: one that cannot be dropped now stays for the next open). Returns how
    /// many were dropped.
    fn drop_unfinished_loads(&self) -> u64 {
        let names: Vec<String> = self.catalog.lock().loading.keys().cloned().collect();
        names.iter().filter(|n| self.drop_table(n).is_ok()).count() as u64
    }

    /// The table `name`.
    pub fn table(&self, name: &str) -> Result<Table> {
        self.catalog.lock().table(name).cloned()
    }

    /// Removes the table `name` and frees its pages: durable when this returns (a crash
    /// after the catalog no longer names it leaves its pages unreferenced, which `check`
    /// reports and which is harmless).
    pub fn drop_table(&self, name: &str) -> Result<()> {
        let table = {
            let mut catalog = self.catalog.lock();
            let table = match catalog.loading.get(name) {
                Some(t) => t.clone(),
                None => catalog.table(name)?.clone(),
            };
            let mut next = catalog.clone();
            if next.loading.remove(name).is_none() {
                next.tables.remove(name);
            }
            self.store_catalog(&next)?;
            *catalog = next;
            table
        };
        self.free_table_pages(&table)
    }

    /// Frees every page of `table` in one transaction (durable when this returns).
    fn free_table_pages(&self, table: &Table) -> Result<()> {
        let mut pages = Vec::new();
        table.check(&self.bm, &mut |pid| pages.push(pid))?;
        let mut tx = self.begin();
        for pid in pages {
            tx.free(pid)?;
        }
        tx.commit()
    }

    /// Appends the rows that `feed` hands to its sink to table `name`, created with `schema`
    /// if absent (if present, its schema must be `schema`). Rows are appended in batches and
    /// committed every few MiB, so that a load of any size keeps its undo state and the log
    /// bounded; `committed(rows)` is called after each commit with the rows committed so
    /// far. On error the transaction in progress is rolled back: a table this call created
    /// is dropped again (where that fails too, e.g. on a full disk, by the next read-write
    /// open); a table that existed keeps the rows of the commits reported. A table this
    /// call creates is invisible until the load has finished, so a crash leaves none.
    /// Returns the rows appended.
    pub fn load_table(&self, name: &str, schema: &Schema, feed: &mut RowFeed<'_>, committed: &mut dyn FnMut(u64)) -> Result<u64> {
        if self.catalog.lock().loading.contains_key(name) {
            // Left by an earlier load of this name that failed.
            self.drop_table(name)?;
        }
        let (table, created) = match self.catalog.lock().tables.get(name) {
            Some(t) if t.schema != *schema => {
                return Err(Error::InvalidInput(format!("table {name:?} has the columns {}, the input has {}", t.schema.to_spec(), schema.to_spec())))
            }
            Some(t) => (Some(t.clone()), false),
            None => (None, true),
        };
        // A table this call creates stays invisible until the load has finished: if it fails
        // (a full disk, bad input, a crash), the table is dropped, now or at the next open.
        let table = match table {
            Some(t) => t,
            None => self.create_table_in(name, schema.clone(), true)?,
        };
        let r = self.append_batched(&table, feed, committed).and_then(|n| if created { self.publish_table(name).map(|()| n) } else { Ok(n) });
        // On a full disk (or after a failed log write, when nothing more can be logged in
        // this process) freeing the pages would likely fail half-way and lose them: the
        // table stays invisible, and the next open (once recovery has given the log's space
        // back) or the next load of the same name drops it.
        if let Err(e) = &r {
            let full = matches!(e, Error::DiskFull { .. }) || self.bm.durability.wal.check_failed().is_err();
            if created && !full {
                let _ = self.drop_table(name);
            }
        }
        r
    }

    fn append_batched(&self, table: &Table, feed: &mut RowFeed<'_>, committed: &mut dyn FnMut(u64)) -> Result<u64> {
        /// Row bytes handed to one `append` (large enough that packed leaves are seldom
        /// repacked: each append rewrites the open last leaf once).
        const BATCH: usize = 1 << 20;
        /// Row bytes per transaction.
        const COMMIT: usize = 4 << 20;
        let mut tx = self.begin();
        let mut batch: Vec<Vec<Value>> = Vec::new();
        let (mut batch_bytes, mut tx_bytes, mut done) = (0usize, 0usize, 0u64);
        let width = table.schema.len();
        let mut sink = |row: &[Value]| -> Result<()> {
            batch_bytes += pax::row_bytes(&table.schema, row) - pax::fixed_end(&table.schema, 0) + 8 * width;
            batch.push(row.to_vec());
            if batch_bytes >= BATCH {
                table.append(&mut tx, &batch)?;
                done += batch.len() as u64;
                batch.clear();
                tx_bytes += std::mem::take(&mut batch_bytes);
                if tx_bytes >= COMMIT {
                    std::mem::replace(&mut tx, self.begin()).commit()?;
                    tx_bytes = 0;
                    committed(done);
                }
            }
            Ok(())
        };
        let rows = feed(&mut sink)?;
        if !batch.is_empty() {
            table.append(&mut tx, &batch)?;
            done += batch.len() as u64;
        }
        tx.commit()?;
        committed(done);
        debug_assert_eq!(rows, done);
        Ok(done)
    }

    /// The graph `name`.
    pub fn graph(&self, name: &str) -> Result<Graph> {
        self.catalog.lock().graph(name).cloned()
    }

    /// Imports a SNAP text edge list (`u v` per line, `#` comments) as the new graph `name`
    /// (see [`crate::access::graph`]), then checkpoints. `progress` is called with the input
    /// bytes consumed. On error nothing is added and the pages allocated are freed.
    pub fn import_edges(&self, name: &str, input: &mut dyn BufRead, progress: &mut dyn FnMut(u64)) -> Result<Graph> {
        if name.is_empty() || name.len() > 255 || name.chars().any(|c| c.is_control()) {
            return Err(Error::InvalidInput(format!("invalid graph name {name:?}")));
        }
        if self.catalog.lock().graphs.contains_key(name) {
            return Err(Error::InvalidInput(format!("graph {name:?} already exists")));
        }
        let graph = crate::access::graph::import_edges(&self.bm, input, progress)?;
        let mut next = self.catalog();
        next.graphs.insert(name.to_owned(), graph.clone());
        let stored = self.bm.checkpoint().and_then(|()| self.store_catalog(&next));
        if let Err(e) = stored {
            for (_, p) in graph.pages() {
                let _ = self.bm.free(p.page_id());
            }
            return Err(e);
        }
        *self.catalog.lock() = next;
        Ok(graph)
    }

    /// Writes all dirty pages and persists the allocation table and the catalog.
    pub fn checkpoint(&self) -> Result<()> {
        self.bm.checkpoint()?;
        if self.bm.is_read_only() {
            return Ok(());
        }
        let catalog = self.catalog.lock().clone();
        if self.stored_catalog.lock().as_ref() == Some(&catalog) {
            return Ok(());
        }
        self.store_catalog(&catalog)
    }

    /// Replaces the catalog file with `next` (atomically).
    fn store_catalog(&self, next: &Catalog) -> Result<()> {
        *self.stored_catalog.lock() = None;
        next.store(self.bm.backend().as_ref(), self.bm.dir())?;
        *self.stored_catalog.lock() = Some(next.clone());
        Ok(())
    }

    /// Simulates the death of the process, for crash tests and the recovery benchmark: the
    /// cleaner thread stops (a dead process runs no thread), nothing else of this database
    /// runs (no rollback of open transactions, no checkpoint, no close; its memory and open
    /// files are leaked), and the directory lock is released as the kernel releases it when
    /// a process dies, so that the database can be opened (and recovered) again in this
    /// process. Leak the open transactions first (`std::mem::forget`).
    pub fn crash(mut self) {
        if let Some(c) = self.cleaner.take() {
            c.stop();
        }
        drop(self.bm.take_dir_lock());
        std::mem::forget(self);
    }

    /// Checkpoints and closes.
    pub fn close(mut self) -> Result<()> {
        if let Some(c) = self.cleaner.take() {
            c.stop();
        }
        self.checkpoint()?;
        match Arc::try_unwrap(self.bm) {
            Ok(bm) => bm.close(),
            // Nobody else holds it (the cleaner was joined above); were it shared, dropping
            // our reference leaves the last owner's drop to checkpoint.
            Err(_) => Ok(()),
        }
    }

    /// Verifies everything: every allocated page's checksum and id on disk, the catalog
    /// against the allocation table (every referenced page allocated, none referenced twice,
    /// counts that fit their pages), and the buffer manager's own invariants.
    pub fn check(&self) -> Result<CheckReport> {
        let mut report = CheckReport::default();
        let allocated = self.bm.allocated_pages();
        let largest = allocated.iter().map(|p| self.bm.classes().page_size(p.class())).max().unwrap_or(4096);
        // The buffer is sized by the allocation table's largest class. A page is written to
        // its class's data file before the table that marks it allocated is stored, so a
        // page larger than both the pool and every data file can only come from a damaged
        // table: refuse it before allocating a buffer that size.
        let largest_file = self.bm.allocation().iter().map(|c| c.file_pages * c.page_size).max().unwrap_or(0);
        if largest > self.bm.pool_size().max(largest_file) {
            let pid = allocated.iter().find(|p| self.bm.classes().page_size(p.class()) == largest).expect("the largest page");
            return Err(Error::Inconsistent(format!(
                "page {pid} is allocated and {largest} bytes, larger than the buffer pool ({} bytes) and than every data file: the allocation table is damaged",
                self.bm.pool_size()
            )));
        }
        let mut buf = AlignedBuf::zeroed(largest as usize);
        for &pid in &allocated {
            self.bm.verify_on_disk(pid, &mut buf)?;
            report.pages_verified += 1;
        }
        let allocated: HashSet<_> = allocated.into_iter().collect();
        let mut referenced = HashSet::new();
        let catalog = self.catalog();
        for (name, col) in &catalog.columns {
            report.columns += 1;
            let mut total = 0u64;
            for p in &col.pages {
                let pid = p.page_id();
                if !allocated.contains(&pid) {
                    return Err(Error::Inconsistent(format!("column {name:?} references page {pid}, which is not allocated")));
                }
                if !referenced.insert(pid) {
                    return Err(Error::Inconsistent(format!("page {pid} is referenced twice (column {name:?})")));
                }
                let capacity = self.bm.payload_size(pid.class()) / col.format.width();
                if p.count as usize > capacity {
                    return Err(Error::Inconsistent(format!("column {name:?} claims {} values in page {pid}, which holds {capacity}", p.count)));
                }
                total += p.count as u64;
            }
            if total != col.count {
                return Err(Error::Inconsistent(format!("column {name:?} claims {} values, its pages hold {total}", col.count)));
            }
        }
        for (name, graph) in &catalog.graphs {
            report.graphs += 1;
            for (array, p) in graph.pages() {
                let pid = p.page_id();
                if !allocated.contains(&pid) {
                    return Err(Error::Inconsistent(format!("graph {name:?} ({array}) references page {pid}, which is not allocated")));
                }
                if !referenced.insert(pid) {
                    return Err(Error::Inconsistent(format!("page {pid} is referenced twice (graph {name:?}, {array})")));
                }
            }
            // Counts per page and in total, and the CSR structure.
            graph.verify(&self.bm, name)?;
        }
        for (name, tree) in &catalog.trees {
            let mut problem = None;
            let r = tree.check(&self.bm, &mut |pid| {
                if problem.is_none() {
                    if !allocated.contains(&pid) {
                        problem = Some(format!("tree {name:?} references page {pid}, which is not allocated"));
                    } else if !referenced.insert(pid) {
                        problem = Some(format!("page {pid} is referenced twice (tree {name:?})"));
                    }
                }
            })?;
            if let Some(p) = problem {
                return Err(Error::Inconsistent(p));
            }
            report.trees.insert(name.clone(), r);
        }
        for (name, table) in catalog.tables.iter().chain(&catalog.loading) {
            let mut problem = None;
            let r = table.check(&self.bm, &mut |pid| {
                if problem.is_none() {
                    if !allocated.contains(&pid) {
                        problem = Some(format!("table {name:?} references page {pid}, which is not allocated"));
                    } else if !referenced.insert(pid) {
                        problem = Some(format!("page {pid} is referenced twice (table {name:?})"));
                    }
                }
            })?;
            if let Some(p) = problem {
                return Err(Error::Inconsistent(p));
            }
            if catalog.tables.contains_key(name) {
                report.tables.insert(name.clone(), r);
            }
        }
        report.unreferenced_pages = (allocated.len() - referenced.len()) as u64;
        self.bm.check_invariants()?;
        Ok(report)
    }
}
