//! The table commands: `import-csv`, `import-parquet`, `export`, and the table queries
//! (`query ... get TABLE --row N`, `query ... rows TABLE`).

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use serde::ser::{Serialize, SerializeMap, Serializer};
use strata::access::table::csv::{infer_schema, read_rows, CsvOptions, CsvWriter};
use strata::access::table::parquet::{read_parquet, schema_of_parquet};
use strata::access::table::text::value_to_json;
use strata::access::table::{Schema, Value};
use strata::util::Bytes;
use strata::{Config, Database, Error};

use crate::progress;

/// `strata import-csv`.
#[derive(Args)]
pub struct ImportCsvArgs {
    dir: PathBuf,
    /// The table (created if absent; appended to if present, with the same columns).
    table: String,
    /// CSV file to read.
    #[arg(long)]
    from: PathBuf,
    /// Field separator: one character (`\t` or `tab` for a tab).
    #[arg(long, default_value = ",")]
    delimiter: String,
    /// The first line is data, not column names (columns are then named c0, c1, ...).
    #[arg(long)]
    no_header: bool,
    /// Column names and types, "name:type,..." (types i64, f64, date, bool, str, bytes);
    /// inferred from the data when absent.
    #[arg(long)]
    schema: Option<String>,
    /// Buffer pool size.
    #[arg(long, default_value = "64MiB", value_parser = crate::parse_size)]
    pool: u64,
    /// Print one JSON object instead of text and progress.
    #[arg(long)]
    json: bool,
}

/// `strata import-parquet`.
#[derive(Args)]
pub struct ImportParquetArgs {
    dir: PathBuf,
    /// The table (created if absent; appended to if present, with the same columns).
    table: String,
    /// Parquet file to read.
    #[arg(long)]
    from: PathBuf,
    /// Buffer pool size.
    #[arg(long, default_value = "64MiB", value_parser = crate::parse_size)]
    pool: u64,
    /// Print one JSON object instead of text and progress.
    #[arg(long)]
    json: bool,
}

/// `strata export`.
#[derive(Args)]
pub struct ExportArgs {
    dir: PathBuf,
    table: String,
    /// CSV file to write (replaced if it exists).
    #[arg(long)]
    to: PathBuf,
    /// Buffer pool size.
    #[arg(long, default_value = "64MiB", value_parser = crate::parse_size)]
    pool: u64,
    /// Print one JSON object instead of text and progress.
    #[arg(long)]
    json: bool,
}

fn delimiter(s: &str) -> Result<u8, Error> {
    let d = match s {
        "\\t" | "tab" => b'\t',
        s if s.len() == 1 => s.as_bytes()[0],
        _ => return Err(Error::InvalidInput(format!("--delimiter must be one ASCII character (or \\t), not {s:?}"))),
    };
    if matches!(d, b'"' | b'\r' | b'\n') {
        return Err(Error::InvalidInput(format!("--delimiter cannot be {s:?} (quotes and line breaks have their own meaning in CSV)")));
    }
    Ok(d)
}

/// What an import prints.
struct Loaded<'a> {
    op: &'static str,
    table: &'a str,
    rows: u64,
    schema: Schema,
    started: Instant,
    pool: u64,
}

fn finish_import(db: Database, l: Loaded<'_>, json: bool) -> Result<(), Error> {
    let table = db.table(l.table)?;
    let table_rows = table.rows(db.buffer())?;
    let st = db.buffer().stats();
    db.close()?;
    let seconds = l.started.elapsed().as_secs_f64();
    if json {
        let columns: Vec<_> = l.schema.columns.iter().map(|c| serde_json::json!({"name": c.name, "type": c.ty.name()})).collect();
        crate::cmd::print_json(&serde_json::json!({
            "op": l.op, "table": l.table, "rows": l.rows, "table_rows": table_rows, "columns": columns,
            "schema": l.schema.to_spec(), "seconds": seconds, "pool_bytes": l.pool,
            "peak_resident_bytes": st.peak_resident_bytes, "bytes_read": st.bytes_read, "bytes_written": st.bytes_written,
            "peak_rss_bytes": strata::util::peak_rss_bytes(),
        }))
    } else {
        println!("imported {} rows into {} ({} rows; columns {}) in {seconds:.2} s", l.rows, l.table, table_rows, l.schema.to_spec());
        Ok(())
    }
}

/// Reports the committed rows on the progress bar's message.
fn committed_message(pb: &indicatif::ProgressBar) -> impl FnMut(u64) + '_ {
    move |rows| pb.set_message(format!("importing ({rows} rows committed)"))
}

pub fn import_csv(a: ImportCsvArgs) -> Result<(), Error> {
    let opts = CsvOptions { delimiter: delimiter(&a.delimiter)?, header: !a.no_header };
    let given = a.schema.as_deref().map(Schema::parse).transpose()?;
    let config = crate::cmd::config(&a.dir, a.pool, true);
    let db = Database::open(config)?;
    let started = Instant::now();
    let existing = db.catalog().tables.get(&a.table).map(|t| t.schema.clone());
    if let (Some(have), Some(given)) = (&existing, &given) {
        if have != given {
            return Err(Error::InvalidInput(format!("table {:?} has the columns {}, --schema gives {}", a.table, have.to_spec(), given.to_spec())));
        }
    }
    // Pass 1 checks every row (against the table's schema when appending) before anything
    // is written, so that a bad row leaves the table as it was.
    let len = std::fs::metadata(&a.from).map_err(|e| Error::io("stat", &a.from, e))?.len();
    let inferred = infer_schema(&a.from, &opts, existing.as_ref().or(given.as_ref()))?;
    let schema = inferred.schema;
    strata::access::table::Table::check_row_size(db.buffer(), inferred.max_row_bytes, || format!("the longest row of {}", a.from.display()))?;
    let pb = progress::bytes(len, "importing", a.json);
    let rows =
        db.load_table(&a.table, &schema, &mut |sink| read_rows(&a.from, &opts, &schema, &mut |b| pb.set_position(b), sink), &mut committed_message(&pb))?;
    pb.finish_and_clear();
    finish_import(db, Loaded { op: "import-csv", table: &a.table, rows, schema, started, pool: a.pool }, a.json)
}

pub fn import_parquet(a: ImportParquetArgs) -> Result<(), Error> {
    let schema = schema_of_parquet(&a.from)?;
    let len = std::fs::metadata(&a.from).map_err(|e| Error::io("stat", &a.from, e))?.len();
    let db = Database::open(Config::new(&a.dir).pool_size(a.pool))?;
    let started = Instant::now();
    let pb = progress::bytes(len, "importing", a.json);
    let rows =
        db.load_table(&a.table, &schema, &mut |sink| read_parquet(&a.from, &mut |b| pb.set_position(b), sink).map(|(_, n)| n), &mut committed_message(&pb))?;
    pb.finish_and_clear();
    finish_import(db, Loaded { op: "import-parquet", table: &a.table, rows, schema, started, pool: a.pool }, a.json)
}

pub fn export(a: ExportArgs) -> Result<(), Error> {
    let db = Database::open(Config::new(&a.dir).pool_size(a.pool))?;
    let started = Instant::now();
    let table = db.table(&a.table)?;
    let total = table.rows(db.buffer())?;
    let file = File::create(&a.to).map_err(|e| Error::io("create", &a.to, e))?;
    let written = write_csv(&db, &table, file, total, a.json);
    let rows = match written {
        Ok(n) => n,
        Err(e) => {
            // No half-written file is left behind.
            let _ = std::fs::remove_file(&a.to);
            return Err(e.into_error(&a.to));
        }
    };
    let st = db.buffer().stats();
    db.close()?;
    let seconds = started.elapsed().as_secs_f64();
    if a.json {
        crate::cmd::print_json(&serde_json::json!({
            "op": "export", "table": a.table, "rows": rows, "to": a.to, "seconds": seconds, "pool_bytes": a.pool,
            "peak_resident_bytes": st.peak_resident_bytes, "peak_rss_bytes": strata::util::peak_rss_bytes(),
        }))
    } else {
        let size = std::fs::metadata(&a.to).map(|m| m.len()).unwrap_or(0);
        println!("exported {rows} rows of {} to {} ({}) in {seconds:.2} s", a.table, a.to.display(), Bytes(size));
        Ok(())
    }
}

/// An export failure: from the database, or writing the file.
enum ExportError {
    Db(Error),
    Write(std::io::Error),
}

impl ExportError {
    fn into_error(self, path: &Path) -> Error {
        match self {
            ExportError::Db(e) => e,
            ExportError::Write(e) => Error::io("write", path, e),
        }
    }
}

fn write_csv(db: &Database, table: &strata::access::table::Table, file: File, total: u64, quiet: bool) -> Result<u64, ExportError> {
    let pb = progress::count(total, "exporting rows", quiet);
    let mut w = CsvWriter::new(BufWriter::with_capacity(1 << 20, file), &table.schema).map_err(ExportError::Write)?;
    let mut failed = None;
    let mut rows = 0u64;
    table
        .scan(db.buffer(), 0, &mut |_, row| {
            if let Err(e) = w.write_row(row) {
                failed = Some(e);
                return false;
            }
            rows += 1;
            if rows.is_multiple_of(4096) {
                pb.set_position(rows);
            }
            true
        })
        .map_err(ExportError::Db)?;
    if let Some(e) = failed {
        return Err(ExportError::Write(e));
    }
    let out = w.finish().map_err(ExportError::Write)?;
    out.into_inner().map_err(|e| ExportError::Write(e.into_error()))?.sync_all().map_err(ExportError::Write)?;
    pb.finish_and_clear();
    Ok(rows)
}

/// A row as a JSON object with the columns in schema order.
pub struct RowJson<'a> {
    pub schema: &'a Schema,
    pub row: &'a [Value],
}

impl Serialize for RowJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.row.len()))?;
        for (c, v) in self.schema.columns.iter().zip(self.row) {
            m.serialize_entry(&c.name, &value_to_json(v))?;
        }
        m.end()
    }
}

/// The text form of a row for people: `name=value, ...` (NULL as NULL).
pub fn row_text(schema: &Schema, row: &[Value]) -> String {
    schema
        .columns
        .iter()
        .zip(row)
        .map(|(c, v)| format!("{}={}", c.name, strata::access::table::text::value_to_text(v).unwrap_or_else(|| "NULL".into())))
        .collect::<Vec<_>>()
        .join(", ")
}
