//! Inspection and recovery: `strata dump alloc-table|page` (read-only, like `stats` and
//! `check`) and `strata recover` (contract: docs/cli.md). Read-only commands open the
//! database with [`Database::open_read_only`]: they share the directory lock with each other,
//! never recover, checkpoint or write, and refuse with the recovery-pending error when the
//! log holds work for recovery, which `strata recover` does.

use std::path::{Path, PathBuf};

use clap::Subcommand;
use strata::buffer::ClassAllocation;
use strata::storage::page::Header;
use strata::storage::{FileBackend, Meta, PageId};
use strata::util::Bytes;
use strata::{Config, Database, Error};

/// `strata dump ...`
#[derive(Subcommand)]
pub enum DumpCmd {
    /// Each size class's allocated and free page ranges (read-only).
    AllocTable {
        dir: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Read one page from disk, print its header and whether it verifies (read-only).
    Page {
        dir: PathBuf,
        /// The page: CLASS:INDEX as printed in errors (`c3:17`), or a raw 64-bit id.
        #[arg(allow_negative_numbers = true)]
        page_id: String,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

pub fn dump(what: DumpCmd) -> Result<(), Error> {
    match what {
        DumpCmd::AllocTable { dir, json } => alloc_table(&dir, json),
        DumpCmd::Page { dir, page_id, json } => page(&dir, &page_id, json),
    }
}

/// The configuration of a read-only command: a pool that holds the buffer manager's table
/// and a few of the database's smallest pages (these commands read little through it).
pub fn read_only_config(dir: &Path, pool: Option<u64>) -> Result<Config, Error> {
    let pool = match pool {
        Some(p) => p,
        None => {
            // The smallest page decides what the pool must hold; a directory without a
            // database gets the usual error here.
            let meta = Meta::load(&FileBackend::default(), dir)?;
            (16u64 << 20).max(meta.classes.min_page().saturating_mul(4))
        }
    };
    Ok(Config::new(dir).pool_size(pool))
}

fn print_json(v: &serde_json::Value) -> Result<(), Error> {
    let s = serde_json::to_string(v).map_err(|e| Error::InvalidInput(format!("cannot encode output: {e}")))?;
    println!("{s}");
    Ok(())
}

/// `first..last` (both included), or `first` alone, comma-separated; `none` when empty.
fn ranges_text(ranges: &[(u64, u64)]) -> String {
    if ranges.is_empty() {
        return "none".to_owned();
    }
    ranges.iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}..{b}") }).collect::<Vec<_>>().join(", ")
}

fn alloc_table(dir: &Path, json: bool) -> Result<(), Error> {
    let db = Database::open_read_only(read_only_config(dir, None)?)?;
    let bm = db.buffer();
    let classes: Vec<ClassAllocation> = bm.allocation();
    if json {
        return print_json(&serde_json::json!({
            "min_page": bm.classes().min_page(),
            "pages_allocated": classes.iter().map(|c| c.pages_allocated).sum::<u64>(),
            "classes": classes,
        }));
    }
    println!("database {} (smallest page {})", dir.display(), Bytes(bm.classes().min_page()));
    if classes.is_empty() {
        println!("no pages allocated");
    }
    for c in &classes {
        println!(
            "class {} ({} pages): {} allocated, high water {}, {} pages in the file",
            c.class,
            Bytes(c.page_size),
            c.pages_allocated,
            c.high_water,
            c.file_pages
        );
        println!("  allocated: {}", ranges_text(&c.allocated));
        println!("  free:      {}", ranges_text(&c.free));
    }
    Ok(())
}

fn page(dir: &Path, page_id: &str, json: bool) -> Result<(), Error> {
    let pid: PageId = page_id.parse().map_err(Error::InvalidInput)?;
    let db = Database::open_read_only(read_only_config(dir, None)?)?;
    let r = db.buffer().inspect_page(pid)?;
    let h = r.header;
    let checksum_ok = h.checksum == r.computed_checksum;
    let magic_ok = h.magic == Header::MAGIC;
    let id_ok = h.page_id == pid.raw();
    let ok = r.verdict.is_ok();
    let fault = match (&r.verdict, r.bytes_on_disk < r.page_size) {
        (Ok(_), _) => None,
        (Err(f), false) => Some(f.to_string()),
        (Err(f), true) => Some(format!("data file ends {} bytes into the page ({f})", r.bytes_on_disk)),
    };
    if json {
        return print_json(&serde_json::json!({
            "page": pid.to_string(), "raw": pid.raw(), "class": pid.class(), "index": pid.index(),
            "file": r.file, "offset": r.offset, "page_size": r.page_size, "bytes_on_disk": r.bytes_on_disk,
            "header": {"checksum": h.checksum, "magic": h.magic, "page_id": PageId::from_raw(h.page_id).to_string(),
                "page_id_raw": h.page_id, "lsn": h.lsn, "reserved": h.reserved},
            "computed_checksum": r.computed_checksum,
            "checksum_ok": checksum_ok, "magic_ok": magic_ok, "id_ok": id_ok,
            "ok": ok, "fault": fault,
        }));
    }
    let mark = |good: bool| if good { "ok" } else { "BAD" };
    println!("page {pid} (raw {}): {} at offset {} of {}", pid.raw(), Bytes(r.page_size), r.offset, r.file.display());
    println!("  checksum  {:#010x}  computed {:#010x}  {}", h.checksum, r.computed_checksum, mark(checksum_ok));
    println!("  magic     {:#010x}  {}", h.magic, mark(magic_ok));
    println!("  page id   {} (raw {})  {}", PageId::from_raw(h.page_id), h.page_id, mark(id_ok));
    println!("  lsn       {}", h.lsn);
    println!("  reserved  {}", h.reserved);
    match fault {
        None => println!("verifies: yes"),
        Some(f) => println!("verifies: no: {f}"),
    }
    Ok(())
}

/// `strata recover DIR`: opens the database read-write (which recovers it), checkpoints and
/// closes, then says what recovery did.
pub fn recover(dir: &Path, pool: u64, json: bool) -> Result<(), Error> {
    let db = Database::open(Config::new(dir).pool_size(pool))?;
    let r = db.buffer().recovery_report();
    db.close()?;
    let recovered = r.records > 0 || r.pages_restored > 0;
    if json {
        return print_json(&serde_json::json!({
            "op": "recover", "recovered": recovered, "log_records": r.records, "redone": r.redone,
            "rolled_back": r.losers, "pages_restored": r.pages_restored,
            "pages_discarded": r.pages_discarded,
        }));
    }
    if recovered {
        println!(
            "recovered {}: {} log records after the last checkpoint, {} changes redone, {} transactions rolled back ({} pages they allocated freed unread), {} pages restored from the double-write area; checkpointed",
            dir.display(),
            r.records,
            r.redone,
            r.losers,
            r.pages_discarded,
            r.pages_restored
        );
    } else {
        println!("{}: nothing to recover (closed cleanly); checkpointed", dir.display());
    }
    Ok(())
}
