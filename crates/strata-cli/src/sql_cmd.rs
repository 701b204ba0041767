//! `strata sql DIR --pool SIZE [--threads N] [--json | --csv] "QUERY"` (or `--file Q.sql`):
//! runs one query and streams its rows to stdout as they are produced (nothing is
//! collected, so a result larger than memory goes out in constant memory).

use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use strata::access::table::csv::CsvWriter;
use strata::access::table::text::{value_to_json, value_to_text};
use strata::access::table::{ColumnDef, ColumnType, Schema, Value};
use strata::sql::OutColumn;
use strata::{Database, Error};

/// `strata sql`.
#[derive(Args)]
pub struct SqlArgs {
    dir: PathBuf,
    /// The query (one statement: SELECT ... or EXPLAIN SELECT ...).
    #[arg(required_unless_present = "file", conflicts_with = "file")]
    query: Option<String>,
    /// Read the query from this file instead.
    #[arg(long)]
    file: Option<PathBuf>,
    /// Buffer pool size.
    #[arg(long, value_parser = crate::parse_size)]
    pool: u64,
    /// Worker threads: an aggregation over a table scan, or over filters, projections and
    /// hash-join probes above one, runs on this many, taking morsels of the scan's rows;
    /// sorts and what lies above an aggregation run on one.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Print one JSON object: {"columns", "rows", "seconds", "pool_bytes",
    /// "peak_resident_bytes", "peak_rss_bytes"}.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print CSV: a header and the rows.
    #[arg(long)]
    csv: bool,
}

/// Rows kept to size the columns of the text table before the first line is printed; the
/// rest are streamed with those widths.
const TEXT_SAMPLE_ROWS: usize = 200;
/// The widest cell of the text table (longer values are cut, with `…`).
const TEXT_MAX_WIDTH: usize = 48;

pub(crate) fn stdout_err(e: io::Error) -> Error {
    Error::io("write", "stdout", e)
}

/// Writes the rows in one of the three forms.
pub(crate) enum Out<W: Write> {
    Json { out: W, first: bool },
    Csv(CsvWriter<W>),
    Text { out: W, columns: Vec<OutColumn>, sample: Option<Vec<Vec<String>>>, widths: Vec<usize>, numeric: Vec<bool> },
}

fn cell(v: &Value) -> String {
    let s = value_to_text(v).unwrap_or_else(|| "NULL".into());
    let s: String = s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if s.chars().count() > TEXT_MAX_WIDTH {
        let mut t: String = s.chars().take(TEXT_MAX_WIDTH - 1).collect();
        t.push('…');
        t
    } else {
        s
    }
}

/// Runs `q` and prints its rows as `strata sql` does (a text table, then the row count and
/// the seconds since `started`).
/// With `keep`, also the rows' values as text (NULL as "NULL") into it.
pub(crate) fn print_result(
    db: &Database,
    q: &strata::sql::Prepared,
    pool: u64,
    started: Instant,
    mut keep: Option<&mut Vec<Vec<String>>>,
) -> Result<(), Error> {
    let stdout = io::stdout();
    let mut out = Out::new(BufWriter::new(stdout.lock()), &q.columns, false, false).map_err(stdout_err)?;
    let mut rows = 0u64;
    q.execute(db.buffer(), &mut |row| {
        if let Some(k) = keep.as_deref_mut() {
            k.push(row.iter().map(|v| value_to_text(v).unwrap_or_else(|| "NULL".into())).collect());
        }
        rows += 1;
        out.row(row).map_err(stdout_err)?;
        Ok(true)
    })?;
    let st = db.buffer().stats();
    out.finish(rows, started.elapsed().as_secs_f64(), pool, st.peak_resident_bytes).map_err(stdout_err)
}

impl<W: Write> Out<W> {
    pub(crate) fn new(mut out: W, columns: &[OutColumn], json: bool, csv: bool) -> io::Result<Self> {
        if json {
            out.write_all(b"{\"columns\":")?;
            let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
            serde_json::to_writer(&mut out, &names)?;
            out.write_all(b",\"rows\":[")?;
            Ok(Out::Json { out, first: true })
        } else if csv {
            // Result columns may repeat a name, so the schema is built without Schema::new's checks.
            let schema = Schema { columns: columns.iter().map(|c| ColumnDef { name: c.name.clone(), ty: c.ty.unwrap_or(ColumnType::Str) }).collect() };
            Ok(Out::Csv(CsvWriter::new(out, &schema)?))
        } else {
            let numeric = columns.iter().map(|c| matches!(c.ty, Some(ColumnType::I64 | ColumnType::F64))).collect();
            let widths = columns.iter().map(|c| c.name.chars().count().min(TEXT_MAX_WIDTH)).collect();
            Ok(Out::Text { out, columns: columns.to_vec(), sample: Some(Vec::new()), widths, numeric })
        }
    }

    pub(crate) fn row(&mut self, row: &[Value]) -> io::Result<()> {
        match self {
            Out::Json { out, first } => {
                out.write_all(if *first { b"[" } else { b",[" })?;
                *first = false;
                for (i, v) in row.iter().enumerate() {
                    if i > 0 {
                        out.write_all(b",")?;
                    }
                    serde_json::to_writer(&mut *out, &value_to_json(v))?;
                }
                out.write_all(b"]")
            }
            Out::Csv(w) => w.write_row(row),
            Out::Text { sample, widths, .. } => {
                let cells: Vec<String> = row.iter().map(cell).collect();
                for (w, c) in widths.iter_mut().zip(&cells) {
                    *w = (*w).max(c.chars().count());
                }
                match sample {
                    Some(s) if s.len() < TEXT_SAMPLE_ROWS => {
                        s.push(cells);
                        Ok(())
                    }
                    _ => {
                        self.flush_sample()?;
                        self.text_line(&cells)
                    }
                }
            }
        }
    }

    fn text_line(&mut self, cells: &[String]) -> io::Result<()> {
        if let Out::Text { out, widths, numeric, .. } = self {
            let mut line = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i > 0 {
                    line.push_str(" | ");
                }
                let w = widths.get(i).copied().unwrap_or(0);
                if numeric.get(i).copied().unwrap_or(false) {
                    line.push_str(&format!("{c:>w$}"));
                } else {
                    line.push_str(&format!("{c:<w$}"));
                }
            }
            writeln!(out, "{}", line.trim_end())?;
        }
        Ok(())
    }

    /// Prints the header and the rows held to size the columns (once).
    fn flush_sample(&mut self) -> io::Result<()> {
        let (sample, columns) = match self {
            Out::Text { sample, columns, .. } => match sample.take() {
                Some(s) => (s, columns.clone()),
                None => return Ok(()),
            },
            _ => return Ok(()),
        };
        let names: Vec<String> = columns.iter().map(|c| c.name.chars().take(TEXT_MAX_WIDTH).collect()).collect();
        self.text_line(&names)?;
        if let Out::Text { out, widths, .. } = self {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            writeln!(out, "{}", rule.join("-+-"))?;
        }
        for cells in sample {
            self.text_line(&cells)?;
        }
        Ok(())
    }

    /// Ends the output: the JSON object's tail fields, the text table's footer (the
    /// seconds in it only with `timed`).
    pub(crate) fn finish(self, rows: u64, seconds: f64, pool: u64, peak_resident: u64) -> io::Result<()> {
        self.finish_timed(rows, seconds, true, pool, peak_resident)
    }

    pub(crate) fn finish_timed(mut self, rows: u64, seconds: f64, timed: bool, pool: u64, peak_resident: u64) -> io::Result<()> {
        self.flush_sample()?;
        match self {
            Out::Json { mut out, .. } => {
                // The tail fields after the rows, in the documented order.
                out.write_all(b"],\"seconds\":")?;
                serde_json::to_writer(&mut out, &seconds)?;
                write!(out, ",\"pool_bytes\":{pool},\"peak_resident_bytes\":{peak_resident},\"peak_rss_bytes\":")?;
                serde_json::to_writer(&mut out, &strata::util::peak_rss_bytes())?;
                out.write_all(b"}")?;
                out.write_all(b"\n")?;
                out.flush()
            }
            Out::Csv(w) => w.finish().map(|_| ()),
            Out::Text { mut out, .. } => {
                let plural = if rows == 1 { "" } else { "s" };
                if timed {
                    writeln!(out, "({rows} row{plural}, {seconds:.3} s)")?;
                } else {
                    writeln!(out, "({rows} row{plural})")?;
                }
                out.flush()
            }
        }
    }
}

pub fn sql(a: SqlArgs) -> Result<(), Error> {
    let text = match (&a.query, &a.file) {
        (Some(q), None) => q.clone(),
        (None, Some(f)) => std::fs::read_to_string(f).map_err(|e| Error::io("read", f, e))?,
        _ => return Err(Error::InvalidInput("give the query as an argument or with --file, not both".into())),
    };
    if a.threads == 0 {
        return Err(Error::InvalidInput("--threads must be at least 1".into()));
    }
    let db = Database::open(crate::cmd::config(&a.dir, a.pool, true))?;
    let started = Instant::now();
    let mut q = strata::sql::prepare_in(&db.catalog(), Some(db.buffer()), &text)?;
    q.set_threads(a.threads);
    let stdout = io::stdout();
    if q.is_explain() && !a.json && !a.csv {
        // The plan as it is, one line per operator.
        let mut out = stdout.lock();
        q.execute(db.buffer(), &mut |row| {
            if let Some(Value::Str(line)) = row.first() {
                writeln!(out, "{line}").map_err(stdout_err)?;
            }
            Ok(true)
        })?;
        return db.close();
    }
    let mut out = Out::new(BufWriter::with_capacity(1 << 16, stdout.lock()), &q.columns, a.json, a.csv).map_err(stdout_err)?;
    let mut rows = 0u64;
    let mut closed = false;
    let r = q.execute(db.buffer(), &mut |row| {
        rows += 1;
        match out.row(row) {
            Ok(()) => Ok(true),
            // A reader that went away (`| head`) ends the query quietly.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                closed = true;
                Ok(false)
            }
            Err(e) => Err(stdout_err(e)),
        }
    });
    if let Err(e) = r {
        // What was written stays written; the error ends the output (exit status non-zero).
        let _ = out.finish_partial();
        return Err(e);
    }
    let st = db.buffer().stats();
    let seconds = started.elapsed().as_secs_f64();
    if !closed {
        match out.finish(rows, seconds, a.pool, st.peak_resident_bytes) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
            r => r.map_err(stdout_err)?,
        }
    }
    db.close()
}

impl<W: Write> Out<W> {
    /// Flushes what was written before an error (no tail: the output is incomplete).
    pub(crate) fn finish_partial(self) -> io::Result<()> {
        match self {
            Out::Json { mut out, .. } => {
                out.write_all(b"\n")?;
                out.flush()
            }
            Out::Csv(w) => w.finish().map(|_| ()),
            mut t @ Out::Text { .. } => {
                if matches!(&t, Out::Text { sample: Some(s), .. } if !s.is_empty()) {
                    t.flush_sample()?;
                }
                if let Out::Text { mut out, .. } = t {
                    out.flush()?;
                }
                Ok(())
            }
        }
    }
}
