//! CSV files: reading them into rows of [`Value`]s (with a first pass that infers or checks
//! the schema) and writing rows out.
//!
//! # The format read and written
//! RFC 4180, with a choice of delimiter:
//! - A field may be quoted with `"`; a quoted field may hold the delimiter, CR, LF and doubled
//!   quotes (`""` for one `"`). Records end with LF or CR LF; the last one may lack it.
//! - An **empty unquoted field is NULL**; a quoted empty field (`""`) is the empty string
//!   (as PostgreSQL's `COPY ... CSV` does). The empty string is a `str` and nothing else: in
//!   an `i64` column it is an error, not NULL.
//! - A UTF-8 byte order mark at the start of the file is skipped. Every field must be UTF-8.
//! - Fields are not trimmed: ` 12` is not an `i64`.
//! - Leniencies, as most readers have them: a `"` inside an unquoted field is an ordinary
//!   character (`5'10"`), and so is a CR not followed by LF. Text after the closing quote of
//!   a quoted field (`"a"b`) is an error, since it usually means a quote inside a field was not
//!   doubled and the field boundaries cannot be trusted.
//! - Blank lines: in a file of one column a blank line is a row holding NULL (that is how
//!   [`CsvWriter`] writes such a row); in a wider file, where it cannot be a row, it is
//!   skipped.
//! - Every record must have as many fields as the header (or the schema, or the first record):
//!   a ragged row is an error.
//! - At most [`MAX_RECORD_BYTES`] bytes of field text in one record and
//!   [`MAX_COLUMNS`] fields: the reader holds one record at a time,
//!   so its memory is bounded whatever the file.
//!
//! Error messages name the file, the physical line where the record starts (1-based, the
//! header is line 1) and the column: `data.csv line 17, column "price" (3): "abc" is not a f64`.
//!
//! # Why not the `csv` crate
//! `csv` (and `csv-core` under it) is well kept and fast, but it does not tell a quoted empty
//! field from an unquoted one: both come out as the same empty field, and its author declined
//! to add that because it would change `csv-core`'s API (BurntSushi/rust-csv#114). NULL versus
//! the empty string is part of strata's contract, so this module has its own small streaming
//! tokenizer (`Tokenizer`) over a `BufReader`.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::Path;

use super::schema::{ColumnDef, ColumnType, Schema, Value, MAX_COLUMNS};
use super::text::{self, parse_value};
use crate::error::{Error, Result};

/// The most bytes of field text one record may hold.
pub const MAX_RECORD_BYTES: usize = 256 << 20;

/// The UTF-8 byte order mark.
const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// How a CSV file is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CsvOptions {
    /// The field separator (`,` by default; `;` and `\t` are common). Must not be `"`, CR or LF.
    pub delimiter: u8,
    /// Whether the first record is a header of column names (true by default).
    pub header: bool,
}

impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions { delimiter: b',', header: true }
    }
}

/// One record: the text of its fields one after another in `buf`, and where each ends.
#[derive(Default)]
struct Record {
    buf: Vec<u8>,
    /// (end offset in `buf`, whether the field was quoted), one per field.
    fields: Vec<(usize, bool)>,
    /// The physical line (1-based) where the record starts.
    line: u64,
}

impl Record {
    fn len(&self) -> usize {
        self.fields.len()
    }

    /// Field `i`'s text and whether it was quoted. `i < self.len()`.
    fn field(&self, i: usize) -> (&[u8], bool) {
        let start = if i == 0 { 0 } else { self.fields[i - 1].0 };
        let (end, quoted) = self.fields[i];
        (&self.buf[start..end], quoted)
    }

    /// A blank line: one empty unquoted field.
    fn is_blank(&self) -> bool {
        self.fields == [(0, false)]
    }
}

/// Where the tokenizer is inside a record.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// At the start of a field.
    Start,
    /// Inside an unquoted field.
    Unquoted,
    /// After a CR in an unquoted field (a line end if LF follows).
    UnquotedCr,
    /// Inside a quoted field.
    Quoted,
    /// After a `"` inside a quoted field: a doubled quote or the closing one.
    QuoteInQuoted,
    /// After a CR that followed a closing quote.
    ClosedCr,
}

/// A streaming RFC 4180 tokenizer: hands out one record at a time from a buffered reader,
/// counting physical lines and bytes consumed.
struct Tokenizer<'p, R: Read> {
    reader: BufReader<io::Chain<io::Cursor<Vec<u8>>, R>>,
    path: &'p Path,
    delimiter: u8,
    /// The physical line the next byte is on (1-based).
    line: u64,
    /// Bytes consumed so far (a skipped byte order mark included).
    bytes: u64,
}

impl<'p, R: Read> Tokenizer<'p, R> {
    /// A tokenizer over `inner` (named `path` in messages), skipping a byte order mark.
    fn new(inner: R, path: &'p Path, delimiter: u8) -> Result<Self> {
        Self::with_capacity(inner, path, delimiter, 256 << 10)
    }

    /// [`new`](Self::new) with a read buffer of `capacity` bytes (tests use tiny ones to cut
    /// records at every byte).
    fn with_capacity(mut inner: R, path: &'p Path, delimiter: u8, capacity: usize) -> Result<Self> {
        if matches!(delimiter, b'"' | b'\r' | b'\n') {
            return Err(Error::InvalidInput(format!("the CSV delimiter cannot be {:?}", char::from(delimiter))));
        }
        // Read up to three bytes to look for a byte order mark; put them back if it is not one.
        let mut head = Vec::with_capacity(3);
        (&mut inner).take(3).read_to_end(&mut head).map_err(|e| Error::io("read", path, e))?;
        let mut bytes = 0;
        if head == BOM {
            head.clear();
            bytes = 3;
        }
        let reader = BufReader::with_capacity(capacity, io::Cursor::new(head).chain(inner));
        Ok(Tokenizer { reader, path, delimiter, line: 1, bytes })
    }

    fn error(&self, line: u64, what: &str) -> Error {
        Error::InvalidInput(format!("{} line {line}: {what}", self.path.display()))
    }

    /// Reads the next record into `rec`; false at the end of the file.
    fn next_record(&mut self, rec: &mut Record) -> Result<bool> {
        rec.buf.clear();
        rec.fields.clear();
        rec.line = self.line;
        let delim = self.delimiter;
        let mut state = State::Start;
        let mut quoted = false;
        let mut consumed_any = false;
        loop {
            let chunk = self.reader.fill_buf().map_err(|e| Error::io("read", self.path, e))?;
            if chunk.is_empty() {
                // End of file.
                return match state {
                    State::Start if !consumed_any => Ok(false),
                    State::Quoted => Err(self.error(rec.line, "a quoted field is not closed before the end of the file")),
                    _ => {
                        // A CR right before the end of the file ends the line.
                        Self::end_field(rec, quoted);
                        self.check_fields(rec)?;
                        Ok(true)
                    }
                };
            }
            let mut i = 0;
            let mut done = false;
            while i < chunk.len() && !done {
                let c = chunk[i];
                match state {
                    State::Start => {
                        if c == b'"' {
                            quoted = true;
                            state = State::Quoted;
                            i += 1;
                        } else {
                            // Look at `c` again as the first byte of an unquoted field.
                            state = State::Unquoted;
                        }
                    }
                    State::Unquoted => {
                        let rest = &chunk[i..];
                        let n = rest.iter().position(|&b| b == delim || b == b'\n' || b == b'\r').unwrap_or(rest.len());
                        rec.buf.extend_from_slice(&rest[..n]);
                        i += n;
                        if let Some(&c) = chunk.get(i) {
                            i += 1;
                            if c == delim {
                                Self::end_field(rec, false);
                                state = State::Start;
                            } else if c == b'\n' {
                                self.line += 1;
                                Self::end_field(rec, false);
                                done = true;
                            } else {
                                state = State::UnquotedCr;
                            }
                        }
                    }
                    State::UnquotedCr => {
                        if c == b'\n' {
                            i += 1;
                            self.line += 1;
                            Self::end_field(rec, false);
                            done = true;
                        } else {
                            // A bare CR is part of the field; look at `c` again.
                            rec.buf.push(b'\r');
                            state = State::Unquoted;
                        }
                    }
                    State::Quoted => {
                        let rest = &chunk[i..];
                        let n = rest.iter().position(|&b| b == b'"').unwrap_or(rest.len());
                        self.line += rest[..n].iter().filter(|&&b| b == b'\n').count() as u64;
                        rec.buf.extend_from_slice(&rest[..n]);
                        i += n;
                        if i < chunk.len() {
                            i += 1;
                            state = State::QuoteInQuoted;
                        }
                    }
                    State::QuoteInQuoted => {
                        i += 1;
                        if c == b'"' {
                            rec.buf.push(b'"');
                            state = State::Quoted;
                        } else if c == delim {
                            Self::end_field(rec, true);
                            quoted = false;
                            state = State::Start;
                        } else if c == b'\n' {
                            self.line += 1;
                            Self::end_field(rec, true);
                            done = true;
                        } else if c == b'\r' {
                            state = State::ClosedCr;
                        } else {
                            return Err(self.text_after_quote(rec));
                        }
                    }
                    State::ClosedCr => {
                        if c != b'\n' {
                            return Err(self.text_after_quote(rec));
                        }
                        i += 1;
                        self.line += 1;
                        Self::end_field(rec, true);
                        done = true;
                    }
                }
                if state == State::Start && rec.fields.len() > MAX_COLUMNS {
                    return Err(self.error(rec.line, &format!("a record has more than {MAX_COLUMNS} fields (is the delimiter right?)")));
                }
            }
            self.reader.consume(i);
            self.bytes += i as u64;
            consumed_any |= i > 0;
            if rec.buf.len() > MAX_RECORD_BYTES {
                return Err(self.error(rec.line, &format!("a record holds more than {} MiB (is a quote not closed?)", MAX_RECORD_BYTES >> 20)));
            }
            if done {
                self.check_fields(rec)?;
                return Ok(true);
            }
        }
    }

    fn end_field(rec: &mut Record, quoted: bool) {
        rec.fields.push((rec.buf.len(), quoted));
    }

    fn check_fields(&self, rec: &Record) -> Result<()> {
        if rec.fields.len() > MAX_COLUMNS {
            return Err(self.error(rec.line, &format!("a record has more than {MAX_COLUMNS} fields (is the delimiter right?)")));
        }
        Ok(())
    }

    fn text_after_quote(&self, rec: &Record) -> Error {
        let field = rec.fields.len() + 1;
        self.error(self.line, &format!("text after the closing quote of field {field} (a quote inside a quoted field must be doubled: \"\")"))
    }
}

/// Field `i` of `rec` as text: `None` for NULL (empty and unquoted).
fn field_text(rec: &Record, i: usize) -> std::result::Result<Option<&str>, String> {
    let (bytes, quoted) = rec.field(i);
    if bytes.is_empty() && !quoted {
        return Ok(None);
    }
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(Some(s)),
        Err(e) => Err(format!("invalid UTF-8 at byte {} of the field", e.valid_up_to())),
    }
}

/// The message for a problem with one field.
fn field_error(path: &Path, line: u64, name: &str, col: usize, problem: &str) -> Error {
    Error::InvalidInput(format!("{} line {line}, column {name:?} ({}): {problem}", path.display(), col + 1))
}

/// Opens `path` for reading.
fn open<'p>(path: &'p Path, opts: &CsvOptions) -> Result<Tokenizer<'p, File>> {
    let file = File::open(path).map_err(|e| Error::io("open", path, e))?;
    Tokenizer::new(file, path, opts.delimiter)
}

/// The error for a record whose field count is not `want`.
fn ragged(path: &Path, rec: &Record, want: usize, source: &str) -> Error {
    Error::InvalidInput(format!("{} line {}: {} fields, but {source} has {want}", path.display(), rec.line, rec.len()))
}

/// What pass 1 over a CSV file found.
#[derive(Clone, Debug, PartialEq)]
pub struct Inferred {
    /// The schema: the one given, or the inferred one.
    pub schema: Schema,
    /// Data rows (the header not counted).
    pub rows: u64,
    /// Bytes in the file.
    pub bytes: u64,
    /// The most bytes a row needs in a table leaf of the schema (an upper bound: its field
    /// text counted as if every field were a long string), to refuse a row that no page of
    /// the pool could hold before anything is written.
    pub max_row_bytes: usize,
}

/// Candidate types of a column while inferring, as a bit set.
const CAND_I64: u8 = 1;
const CAND_F64: u8 = 2;
const CAND_DATE: u8 = 4;
const CAND_BOOL: u8 = 8;
const CAND_ALL: u8 = CAND_I64 | CAND_F64 | CAND_DATE | CAND_BOOL;

/// The candidate types (of those still in `cands`) that the non-NULL field `s` parses as.
///
/// Two rules keep inference from changing data: an integer literal too large for `i64` is
/// neither `i64` nor `f64` (as `f64` it would lose digits), so its column becomes `str`; and a
/// field counts as `f64` only if it has a digit or is `NaN`, `inf` or `-inf` exactly as
/// [`text::format_f64`] writes them, so that words like `Nan`, `Inf` or `infinity` in a column
/// of names do not make it a float column.
fn candidates_of(s: &str, cands: u8) -> u8 {
    let mut out = 0;
    if cands & (CAND_I64 | CAND_F64) != 0 {
        match s.parse::<i64>() {
            Ok(_) => out |= CAND_I64 | CAND_F64,
            Err(_) if text::is_integer_literal(s) => {} // too large: str
            Err(_) => {
                if cands & CAND_F64 != 0 && text::parse_f64(s).is_some() && (s.bytes().any(|b| b.is_ascii_digit()) || matches!(s, "NaN" | "inf" | "-inf")) {
                    out |= CAND_F64;
                }
            }
        }
    }
    if cands & CAND_DATE != 0 && text::parse_date(s).is_some() {
        out |= CAND_DATE;
    }
    if cands & CAND_BOOL != 0 && text::parse_bool(s).is_some() {
        out |= CAND_BOOL;
    }
    out & cands
}

/// The narrowest type of a column given its remaining candidates and whether it had any
/// non-NULL field.
fn chosen_type(cands: u8, seen: bool) -> ColumnType {
    if !seen {
        return ColumnType::Str;
    }
    [(CAND_I64, ColumnType::I64), (CAND_F64, ColumnType::F64), (CAND_DATE, ColumnType::Date), (CAND_BOOL, ColumnType::Bool)]
        .into_iter()
        .find(|(bit, _)| cands & bit != 0)
        .map_or(ColumnType::Str, |(_, ty)| ty)
}

/// Column names from a header record: empty names become `c<i>` (the name the column would
/// have without a header), and a name seen before gets `_2`, `_3`, ... appended until it is
/// unique.
fn header_names(path: &Path, rec: &Record) -> Result<Vec<String>> {
    let mut names: Vec<String> = Vec::with_capacity(rec.len());
    for i in 0..rec.len() {
        let (bytes, _) = rec.field(i);
        let name = std::str::from_utf8(bytes)
            .map_err(|_| Error::InvalidInput(format!("{} line {}: the name of column {} is not valid UTF-8", path.display(), rec.line, i + 1)))?;
        let base = if name.is_empty() { format!("c{i}") } else { name.to_owned() };
        let mut name = base.clone();
        let mut n = 2;
        while names.contains(&name) {
            name = format!("{base}_{n}");
            n += 1;
        }
        names.push(name);
    }
    Ok(names)
}

/// Pass 1 over a CSV file.
///
/// With `given`, checks the file against it: every record has `given.len()` fields (the
/// header too, whose names are otherwise ignored: the schema's names win) and every field
/// parses as its column's type. Without it, infers a schema: names from the header (an
/// empty name becomes `c<i>`, a repeated one gets `_2`, `_3`, ... appended) or `c0`, `c1`,
/// ... without one; each column's type is the narrowest of
/// `i64`, `f64`, `date`, `bool` (in that order) that every non-NULL field parses as, else
/// `str` (also for a column of only NULLs, and for a column holding an integer too large for
/// `i64`); `bytes` is never inferred. Every record must have as many fields as the header, or
/// without one as the first record.
///
/// Errors (as [`Error::InvalidInput`]) name the file, line and column.
pub fn infer_schema(path: &Path, opts: &CsvOptions, given: Option<&Schema>) -> Result<Inferred> {
    if let Some(schema) = given {
        let mut rows = 0;
        let mut max_row_bytes = 0;
        let bytes = scan_rows(path, opts, schema, &mut |_| {}, &mut |row| {
            rows += 1;
            max_row_bytes = max_row_bytes.max(super::pax::row_bytes(schema, row));
            Ok(())
        })?;
        return Ok(Inferred { schema: schema.clone(), rows, bytes, max_row_bytes });
    }

    let mut tok = open(path, opts)?;
    let mut rec = Record::default();
    let mut names: Option<Vec<String>> = None;
    let mut width_source = "the first record";
    if opts.header {
        if !tok.next_record(&mut rec)? {
            return Err(Error::InvalidInput(format!("{} is empty: it has no header line", path.display())));
        }
        names = Some(header_names(path, &rec)?);
        width_source = "the header";
    }
    let mut width = names.as_ref().map(Vec::len);
    let mut cands: Vec<u8> = vec![CAND_ALL; width.unwrap_or(0)];
    let mut seen = vec![false; width.unwrap_or(0)];
    let mut rows = 0u64;
    let mut max_text = 0usize;
    // Blank lines before the width is known: rows of NULL if the file turns out to have one
    // column, skipped otherwise.
    let mut leading_blanks = 0u64;
    while tok.next_record(&mut rec)? {
        let w = match width {
            Some(w) => w,
            None if rec.is_blank() => {
                leading_blanks += 1;
                continue;
            }
            None => {
                let w = rec.len();
                width = Some(w);
                cands = vec![CAND_ALL; w];
                seen = vec![false; w];
                if w == 1 {
                    rows += leading_blanks;
                }
                w
            }
        };
        if w > 1 && rec.is_blank() {
            continue;
        }
        if rec.len() != w {
            return Err(ragged(path, &rec, w, width_source));
        }
        max_text = max_text.max(rec.buf.len());
        for col in 0..w {
            let name = || names.as_ref().map_or_else(|| format!("c{col}"), |n| n[col].clone());
            match field_text(&rec, col) {
                Err(problem) => return Err(field_error(path, rec.line, &name(), col, &problem)),
                Ok(None) => {}
                Ok(Some(s)) => {
                    seen[col] = true;
                    if cands[col] != 0 {
                        cands[col] = candidates_of(s, cands[col]);
                    }
                }
            }
        }
        rows += 1;
    }
    let width = match width {
        Some(w) => w,
        // Nothing but blank lines: one column of NULLs.
        None if leading_blanks > 0 => {
            rows = leading_blanks;
            cands = vec![0];
            seen = vec![false];
            1
        }
        None => return Err(Error::InvalidInput(format!("{} is empty: there are no columns to infer a schema from", path.display()))),
    };
    let names = names.unwrap_or_else(|| (0..width).map(|i| format!("c{i}")).collect());
    let columns = names.into_iter().zip(cands.iter().zip(&seen)).map(|(name, (&c, &s))| ColumnDef { name, ty: chosen_type(c, s) }).collect();
    let schema = Schema::new(columns).map_err(|e| match e {
        Error::InvalidInput(m) => Error::InvalidInput(format!("{} line 1: {m}", path.display())),
        e => e,
    })?;
    let max_row_bytes = super::pax::fixed_end(&schema, 1) + max_text;
    Ok(Inferred { schema, rows, bytes: tok.bytes, max_row_bytes })
}

/// Pass 2: reads every data row of the file as values of `schema`'s types and calls `f` with
/// each (a slice of `schema.len()` values, reused between calls). `progress` is called with
/// the bytes consumed so far after each row. Returns the number of rows. The same rules and
/// errors as [`infer_schema`] with a given schema; an error from `f` stops the read and is
/// returned as is.
pub fn read_rows(path: &Path, opts: &CsvOptions, schema: &Schema, progress: &mut dyn FnMut(u64), f: &mut dyn FnMut(&[Value]) -> Result<()>) -> Result<u64> {
    let mut rows = 0u64;
    scan_rows(path, opts, schema, progress, &mut |values| {
        rows += 1;
        f(values)
    })?;
    Ok(rows)
}

/// Reads every row of `path` as `schema`'s types; returns the bytes in the file.
fn scan_rows(path: &Path, opts: &CsvOptions, schema: &Schema, progress: &mut dyn FnMut(u64), f: &mut dyn FnMut(&[Value]) -> Result<()>) -> Result<u64> {
    let mut tok = open(path, opts)?;
    let mut rec = Record::default();
    let width = schema.len();
    if opts.header {
        if !tok.next_record(&mut rec)? {
            return Err(Error::InvalidInput(format!("{} is empty: it has no header line", path.display())));
        }
        if rec.len() != width {
            return Err(Error::InvalidInput(format!(
                "{} line {}: the header has {} fields, but the schema has {width} columns",
                path.display(),
                rec.line,
                rec.len()
            )));
        }
    }
    let mut values: Vec<Value> = Vec::with_capacity(width);
    while tok.next_record(&mut rec)? {
        if width > 1 && rec.is_blank() {
            continue;
        }
        if rec.len() != width {
            return Err(ragged(path, &rec, width, "the schema"));
        }
        values.clear();
        for (col, def) in schema.columns.iter().enumerate() {
            let value = match field_text(&rec, col) {
                Ok(None) => Ok(Value::Null),
                Ok(Some(s)) => parse_value(def.ty, s),
                Err(problem) => Err(problem),
            };
            values.push(value.map_err(|problem| field_error(path, rec.line, &def.name, col, &problem))?);
        }
        f(&values)?;
        progress(tok.bytes);
    }
    progress(tok.bytes);
    Ok(tok.bytes)
}

/// Writes rows as CSV: a header of the schema's names, `,` between fields, `\n` after each
/// record, NULL as an empty unquoted field, and values in their text form
/// ([`text::value_to_text`]). A field is quoted (with inner quotes doubled) when it holds `,`,
/// `"`, CR or LF, is empty (so the empty string is not read back as NULL) or starts with a
/// byte order mark. [`read_rows`] with default options reads the output back to the same
/// values.
///
/// Write errors are `io::Error`s for the caller to name its file in. Each record goes to `W`
/// in one `write_all`; give it a `BufWriter` for files.
pub struct CsvWriter<W: Write> {
    out: W,
    width: usize,
    line: Vec<u8>,
}

impl<W: Write> CsvWriter<W> {
    /// A writer of rows of `schema` to `out`; writes the header.
    pub fn new(out: W, schema: &Schema) -> io::Result<Self> {
        let mut w = CsvWriter { out, width: schema.len(), line: Vec::new() };
        w.line.clear();
        for (i, c) in schema.columns.iter().enumerate() {
            if i > 0 {
                w.line.push(b',');
            }
            push_field(&mut w.line, &c.name);
        }
        w.line.push(b'\n');
        w.out.write_all(&w.line)?;
        Ok(w)
    }

    /// Writes one row: as many values as the schema has columns, each NULL or of its column's
    /// type (a value of another type is written in its own text form).
    pub fn write_row(&mut self, row: &[Value]) -> io::Result<()> {
        if row.len() != self.width {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("a row of {} values for a table of {} columns", row.len(), self.width)));
        }
        self.line.clear();
        for (i, v) in row.iter().enumerate() {
            if i > 0 {
                self.line.push(b',');
            }
            match v {
                Value::Null => {}
                Value::Str(s) => push_field(&mut self.line, s),
                v => push_field(&mut self.line, &text::value_to_text(v).unwrap_or_default()),
            }
        }
        self.line.push(b'\n');
        self.out.write_all(&self.line)
    }

    /// Flushes and returns the output.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Appends a non-NULL field, quoted if it must be.
fn push_field(line: &mut Vec<u8>, s: &str) {
    let needs_quotes = s.is_empty() || s.starts_with('\u{feff}') || s.bytes().any(|b| matches!(b, b',' | b'"' | b'\r' | b'\n'));
    if !needs_quotes {
        line.extend_from_slice(s.as_bytes());
        return;
    }
    line.push(b'"');
    for (i, part) in s.split('"').enumerate() {
        if i > 0 {
            line.extend_from_slice(b"\"\"");
        }
        line.extend_from_slice(part.as_bytes());
    }
    line.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::path::PathBuf;

    use Value::{Bool, Bytes, Date, Null, Str, F64, I64};

    fn s(v: &str) -> Value {
        Str(v.to_owned())
    }

    /// A file holding `content` in a fresh temporary directory.
    fn file(content: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.csv");
        std::fs::write(&path, content).unwrap();
        (dir, path)
    }

    fn read_all(path: &Path, opts: &CsvOptions, schema: &Schema) -> Result<Vec<Vec<Value>>> {
        let mut rows = Vec::new();
        let n = read_rows(path, opts, schema, &mut |_| {}, &mut |r| {
            rows.push(r.to_vec());
            Ok(())
        })?;
        assert_eq!(n, rows.len() as u64);
        Ok(rows)
    }

    /// Infers the schema of `content` and reads it with that schema.
    fn infer_and_read(content: &[u8], opts: CsvOptions) -> Result<(Schema, Vec<Vec<Value>>)> {
        let (_dir, path) = file(content);
        let inferred = infer_schema(&path, &opts, None)?;
        assert_eq!(inferred.bytes, content.len() as u64);
        let rows = read_all(&path, &opts, &inferred.schema)?;
        assert_eq!(inferred.rows, rows.len() as u64);
        // Checking against the inferred schema finds the same; the exact row size is at
        // most the bound from the text.
        let checked = infer_schema(&path, &opts, Some(&inferred.schema))?;
        assert!(checked.max_row_bytes <= inferred.max_row_bytes);
        assert_eq!(Inferred { max_row_bytes: inferred.max_row_bytes, ..checked }, inferred);
        for row in &rows {
            assert!(super::super::pax::row_bytes(&inferred.schema, row) <= checked.max_row_bytes);
        }
        Ok((inferred.schema, rows))
    }

    fn err_of<T: std::fmt::Debug>(r: Result<T>) -> String {
        r.unwrap_err().to_string()
    }

    fn no_header() -> CsvOptions {
        CsvOptions { header: false, ..CsvOptions::default() }
    }

    #[test]
    fn quoted_delimiters_newlines_and_quotes() {
        let (schema, rows) = infer_and_read(b"a,b\n\"x,y\",\"line1\nline2\"\n\"say \"\"hi\"\"\",\"\"\"\"\n", CsvOptions::default()).unwrap();
        assert_eq!(schema.to_spec(), "a:str,b:str");
        assert_eq!(rows, vec![vec![s("x,y"), s("line1\nline2")], vec![s("say \"hi\""), s("\"")]]);
    }

    #[test]
    fn empty_unquoted_is_null_and_quoted_empty_is_the_empty_string() {
        let (schema, rows) = infer_and_read(b"a,b,c\n,\"\",x\n\"\", ,\n", CsvOptions::default()).unwrap();
        assert_eq!(schema.to_spec(), "a:str,b:str,c:str");
        assert_eq!(rows, vec![vec![Null, s(""), s("x")], vec![s(""), s(" "), Null]]);
        // A quoted empty field is not NULL in a number column: it is an error.
        let (_dir, path) = file(b"n\n1\n\n\"\"\n");
        let schema = Schema::parse("n:i64").unwrap();
        let e = err_of(read_all(&path, &CsvOptions::default(), &schema));
        assert!(e.contains("data.csv line 4, column \"n\" (1): \"\" is not an i64"), "{e}");
        // ... and makes an inferred column str.
        assert_eq!(infer_and_read(b"n\n1\n\"\"\n", CsvOptions::default()).unwrap().0.to_spec(), "n:str");
    }

    #[test]
    fn utf8_and_byte_order_mark() {
        let mut content = BOM.to_vec();
        content.extend_from_slice("név,city\nÅsa,東京 😀\n\"é,ü\",\n".as_bytes());
        let (schema, rows) = infer_and_read(&content, CsvOptions::default()).unwrap();
        assert_eq!(schema.to_spec(), "név:str,city:str");
        assert_eq!(rows, vec![vec![s("Åsa"), s("東京 😀")], vec![s("é,ü"), Null]]);
        // Only a byte order mark at the very start is skipped.
        let (_, rows) = infer_and_read("a\n\u{feff}x\n".as_bytes(), CsvOptions::default()).unwrap();
        assert_eq!(rows, vec![vec![s("\u{feff}x")]]);
        // A file that is only a byte order mark is empty.
        let (_dir, path) = file(&BOM);
        assert!(err_of(infer_schema(&path, &CsvOptions::default(), None)).contains("is empty"));
    }

    #[test]
    fn invalid_utf8_is_an_error_naming_line_and_column() {
        let (_dir, path) = file(b"a,b\nx,y\nz,\"w\xff\"\n");
        let e = err_of(infer_schema(&path, &CsvOptions::default(), None));
        assert!(e.contains("line 3, column \"b\" (2): invalid UTF-8 at byte 1"), "{e}");
        let e = err_of(read_all(&path, &CsvOptions::default(), &Schema::parse("a:str,b:str").unwrap()));
        assert!(e.contains("line 3, column \"b\" (2): invalid UTF-8"), "{e}");
        let (_dir, path) = file(b"a,\xc3\n1,2\n");
        assert!(err_of(infer_schema(&path, &CsvOptions::default(), None)).contains("line 1: the name of column 2 is not valid UTF-8"));
    }

    #[test]
    fn one_column_file_blank_lines_are_nulls() {
        let (schema, rows) = infer_and_read(b"x\n1\n\n3\n", CsvOptions::default()).unwrap();
        assert_eq!(schema.to_spec(), "x:i64");
        assert_eq!(rows, vec![vec![I64(1)], vec![Null], vec![I64(3)]]);
        // Without a header, leading blank lines count once the width is known to be 1.
        let (schema, rows) = infer_and_read(b"\n\n7\n", no_header()).unwrap();
        assert_eq!(schema.to_spec(), "c0:i64");
        assert_eq!(rows, vec![vec![Null], vec![Null], vec![I64(7)]]);
        // Only blank lines: one column of NULLs.
        let (schema, rows) = infer_and_read(b"\n\n", no_header()).unwrap();
        assert_eq!(schema.to_spec(), "c0:str");
        assert_eq!(rows, vec![vec![Null], vec![Null]]);
    }

    #[test]
    fn blank_lines_in_a_wider_file_are_skipped() {
        let (_, rows) = infer_and_read(b"a,b\n1,2\n\n3,4\n\n", CsvOptions::default()).unwrap();
        assert_eq!(rows, vec![vec![I64(1), I64(2)], vec![I64(3), I64(4)]]);
        let (_, rows) = infer_and_read(b"\n1,2\n\r\n3,4\n", no_header()).unwrap();
        assert_eq!(rows, vec![vec![I64(1), I64(2)], vec![I64(3), I64(4)]]);
    }

    #[test]
    fn last_line_without_newline() {
        let (_, rows) = infer_and_read(b"a,b\n1,2\n3,4", CsvOptions::default()).unwrap();
        assert_eq!(rows, vec![vec![I64(1), I64(2)], vec![I64(3), I64(4)]]);
        let (_, rows) = infer_and_read(b"a,b\n1,\"x\"", CsvOptions::default()).unwrap();
        assert_eq!(rows, vec![vec![I64(1), s("x")]]);
        let (_, rows) = infer_and_read(b"a,b\n1,", CsvOptions::default()).unwrap();
        assert_eq!(rows, vec![vec![I64(1), Null]]);
        let (_, rows) = infer_and_read(b"a,b\r\n1,2\r", CsvOptions::default()).unwrap();
        assert_eq!(rows, vec![vec![I64(1), I64(2)]]);
    }

    #[test]
    fn header_only() {
        for content in [&b"a,b\n"[..], b"a,b", b"a,b\r\n"] {
            let (schema, rows) = infer_and_read(content, CsvOptions::default()).unwrap();
            assert_eq!(schema.to_spec(), "a:str,b:str");
            assert!(rows.is_empty());
        }
        let (_dir, path) = file(b"");
        assert!(err_of(infer_schema(&path, &CsvOptions::default(), None)).contains("is empty: it has no header line"));
        assert!(err_of(infer_schema(&path, &no_header(), None)).contains("no columns"));
        // With a schema and no header, an empty file has no rows.
        let schema = Schema::parse("a:i64").unwrap();
        assert_eq!(infer_schema(&path, &no_header(), Some(&schema)).unwrap().rows, 0);
        assert!(err_of(infer_schema(&path, &CsvOptions::default(), Some(&schema))).contains("no header line"));
    }

    #[test]
    fn header_names_are_deduplicated() {
        let (schema, _) = infer_and_read(b"a,a,,b,a\n1,2,3,4,5\n", CsvOptions::default()).unwrap();
        let names: Vec<_> = schema.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "a_2", "c2", "b", "a_3"]);
        // A name the schema rejects is an error naming the file.
        let (_dir, path) = file(b"\"a\tb\"\n1\n");
        let e = err_of(infer_schema(&path, &CsvOptions::default(), None));
        assert!(e.contains("data.csv line 1: invalid column name"), "{e}");
    }

    #[test]
    fn ragged_rows_are_errors_with_their_line() {
        let (_dir, path) = file(b"a,b\n1,\"two\nlines\"\n3\n");
        let e = err_of(infer_schema(&path, &CsvOptions::default(), None));
        assert!(e.contains("data.csv line 4: 1 fields, but the header has 2"), "{e}");
        let e = err_of(read_all(&path, &CsvOptions::default(), &Schema::parse("a:i64,b:str").unwrap()));
        assert!(e.contains("data.csv line 4: 1 fields, but the schema has 2"), "{e}");
        let (_dir, path) = file(b"1,2\n3,4,5\n");
        let e = err_of(infer_schema(&path, &no_header(), None));
        assert!(e.contains("line 2: 3 fields, but the first record has 2"), "{e}");
        // The header must match a given schema.
        let (_dir, path) = file(b"a,b,c\n1,2,3\n");
        let e = err_of(infer_schema(&path, &CsvOptions::default(), Some(&Schema::parse("a:i64,b:i64").unwrap())));
        assert!(e.contains("line 1: the header has 3 fields, but the schema has 2 columns"), "{e}");
    }

    #[test]
    fn integer_too_large_for_i64() {
        let content = b"id,n\n1,5\n2,99999999999999999999\n";
        let (_dir, path) = file(content);
        let schema = Schema::parse("id:i64,n:i64").unwrap();
        let e = err_of(infer_schema(&path, &CsvOptions::default(), Some(&schema)));
        assert!(e.contains("data.csv line 3, column \"n\" (2): number 99999999999999999999 is too large for i64"), "{e}");
        let e = err_of(read_all(&path, &CsvOptions::default(), &schema));
        assert!(e.contains("line 3, column \"n\" (2): number 99999999999999999999 is too large"), "{e}");
        // Inferred: str (not f64, which would lose digits), with every digit kept.
        let (schema, rows) = infer_and_read(content, CsvOptions::default()).unwrap();
        assert_eq!(schema.to_spec(), "id:i64,n:str");
        assert_eq!(rows[1][1], s("99999999999999999999"));
        // Even among floats.
        assert_eq!(infer_and_read(b"x\n1.5\n-99999999999999999999\n", CsvOptions::default()).unwrap().0.to_spec(), "x:str");
    }

    #[test]
    fn crlf_line_ends() {
        let (schema, rows) = infer_and_read(b"a,b\r\n1,\"x\r\ny\"\r\n2,\"z\"\r\n3,w\rv\r\n", CsvOptions::default()).unwrap();
        assert_eq!(schema.to_spec(), "a:i64,b:str");
        assert_eq!(rows, vec![vec![I64(1), s("x\r\ny")], vec![I64(2), s("z")], vec![I64(3), s("w\rv")]]);
    }

    #[test]
    fn other_delimiters() {
        let semi = CsvOptions { delimiter: b';', header: true };
        let (schema, rows) = infer_and_read(b"a;b\n1,5;\"x;y\"\n", semi).unwrap();
        assert_eq!(schema.to_spec(), "a:str,b:str");
        assert_eq!(rows, vec![vec![s("1,5"), s("x;y")]]);
        let tab = CsvOptions { delimiter: b'\t', header: true };
        let (schema, rows) = infer_and_read(b"a\tb\n1.5\t\n2\tx y\n", tab).unwrap();
        assert_eq!(schema.to_spec(), "a:f64,b:str");
        assert_eq!(rows, vec![vec![F64(1.5), Null], vec![F64(2.0), s("x y")]]);
        for bad in [b'"', b'\n', b'\r'] {
            let (_dir, path) = file(b"a\n");
            let e = err_of(infer_schema(&path, &CsvOptions { delimiter: bad, header: true }, None));
            assert!(e.contains("delimiter cannot be"), "{e}");
        }
    }

    #[test]
    fn without_header_columns_are_c0_c1() {
        let (schema, rows) = infer_and_read(b"1,x,2024-01-02\n2,,\n", no_header()).unwrap();
        assert_eq!(schema.to_spec(), "c0:i64,c1:str,c2:date");
        assert_eq!(rows, vec![vec![I64(1), s("x"), Date(19_724)], vec![I64(2), Null, Null]]);
    }

    #[test]
    fn type_inference() {
        let content = "i,f,d,b,s,n,mixed,word,nan,big,hex\n\
                       1,1,2024-02-29,true,x,,1,Nan,NaN,1e400,\\x00\n\
                       -2,2.5,1970-01-01,FALSE,2024-01-01,,true,Inf,1.5,,\\x01\n\
                       +3,-inf,0001-01-01,False,1,,,infinity,inf,,\n";
        let (schema, rows) = infer_and_read(content.as_bytes(), CsvOptions::default()).unwrap();
        assert_eq!(schema.to_spec(), "i:i64,f:f64,d:date,b:bool,s:str,n:str,mixed:str,word:str,nan:f64,big:f64,hex:str");
        assert_eq!(rows[0][..4], [I64(1), F64(1.0), Date(19_782), Bool(true)]);
        assert_eq!(rows[2][..4], [I64(3), F64(f64::NEG_INFINITY), Date(-719_162), Bool(false)]);
        assert_eq!(rows[1][9], Null);
        assert_eq!(rows[0][9], F64(f64::INFINITY), "1e400 overflows to inf, as Rust's parser reads it");
        assert_eq!(rows[0][10], s("\\x00"), "bytes are never inferred");
        // A given schema reads what inference would not pick.
        let (_dir, path) = file(b"a,b\n1,\\x00ff\n");
        let rows = read_all(&path, &CsvOptions::default(), &Schema::parse("a:f64,b:bytes").unwrap()).unwrap();
        assert_eq!(rows, vec![vec![F64(1.0), Bytes(vec![0, 255])]]);
        // Wrong types name the field.
        let e = err_of(read_all(&path, &CsvOptions::default(), &Schema::parse("a:date,b:bytes").unwrap()));
        assert!(e.contains("line 2, column \"a\" (1): \"1\" is not a date (YYYY-MM-DD)"), "{e}");
        let (_dir, path) = file(b"price\n1\n2\nabc\n");
        let e = err_of(infer_schema(&path, &CsvOptions::default(), Some(&Schema::parse("price:f64").unwrap())));
        assert_eq!(e, format!("invalid input: {} line 4, column \"price\" (1): \"abc\" is not a f64", path.display()));
    }

    #[test]
    fn malformed_quoting_is_an_error() {
        let (_dir, path) = file(b"a,b\n1,\"open\n2,3\n");
        let e = err_of(infer_schema(&path, &CsvOptions::default(), None));
        assert!(e.contains("line 2: a quoted field is not closed before the end of the file"), "{e}");
        let (_dir, path) = file(b"a,b\n1,2\n\"x\ny\"z,3\n");
        let e = err_of(infer_schema(&path, &CsvOptions::default(), None));
        assert!(e.contains("line 4: text after the closing quote of field 1"), "{e}");
        let (_dir, path) = file(b"a\n\"x\"\rz\n");
        assert!(err_of(infer_schema(&path, &CsvOptions::default(), None)).contains("text after the closing quote"));
        // A quote inside an unquoted field is an ordinary character.
        let (_, rows) = infer_and_read(b"h\n5'10\"\nab\"c\"\n", CsvOptions::default()).unwrap();
        assert_eq!(rows, vec![vec![s("5'10\"")], vec![s("ab\"c\"")]]);
    }

    #[test]
    fn too_many_fields_is_an_error() {
        let wide = vec![b','; MAX_COLUMNS + 5];
        let (_dir, path) = file(&wide);
        let e = err_of(infer_schema(&path, &no_header(), None));
        assert!(e.contains("more than 1024 fields"), "{e}");
        // Exactly MAX_COLUMNS is fine.
        let ok = vec![b','; MAX_COLUMNS - 1];
        let (schema, rows) = infer_and_read(&ok, no_header()).unwrap();
        assert_eq!((schema.len(), rows.len()), (MAX_COLUMNS, 1));
    }

    #[test]
    fn progress_and_errors_from_the_callback() {
        let content = b"a\n1\n2\n3\n";
        let (_dir, path) = file(content);
        let schema = Schema::parse("a:i64").unwrap();
        let mut seen = Vec::new();
        read_rows(&path, &CsvOptions::default(), &schema, &mut |b| seen.push(b), &mut |_| Ok(())).unwrap();
        assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
        assert_eq!(seen.last(), Some(&(content.len() as u64)));
        let mut calls = 0;
        let e = read_rows(&path, &CsvOptions::default(), &schema, &mut |_| {}, &mut |_| {
            calls += 1;
            if calls == 2 {
                Err(Error::InvalidInput("stop".into()))
            } else {
                Ok(())
            }
        });
        assert_eq!(err_of(e), "invalid input: stop");
        assert_eq!(calls, 2);
        let missing = path.with_file_name("missing.csv");
        assert!(matches!(infer_schema(&missing, &CsvOptions::default(), None), Err(Error::Io { .. })));
    }

    #[test]
    fn writer_quotes_what_it_must() {
        let schema = Schema::parse("a:str,\"b\":str,c:i64,d:f64,e:date,f:bool,g:bytes").unwrap();
        let mut w = CsvWriter::new(Vec::new(), &schema).unwrap();
        w.write_row(&[s("plain"), s(""), I64(-1), F64(0.1), Date(0), Bool(true), Bytes(vec![0xab])]).unwrap();
        w.write_row(&[s("a,b"), s("say \"hi\""), Null, F64(f64::NAN), Null, Null, Null]).unwrap();
        w.write_row(&[s("x\ny"), s("\r"), Null, F64(-0.0), Null, Bool(false), Bytes(vec![])]).unwrap();
        w.write_row(&[s("\u{feff}"), s(" "), Null, Null, Null, Null, Null]).unwrap();
        assert!(w.write_row(&[Null]).is_err());
        let out = String::from_utf8(w.finish().unwrap()).unwrap();
        assert_eq!(
            out,
            "a,\"\"\"b\"\"\",c,d,e,f,g\n\
             plain,\"\",-1,0.1,1970-01-01,true,\\xab\n\
             \"a,b\",\"say \"\"hi\"\"\",,NaN,,,\n\
             \"x\ny\",\"\r\",,-0.0,,false,\\x\n\
             \"\u{feff}\", ,,,,,\n"
        );
    }

    /// Records as (start line, [(field text, quoted)]).
    type Records = Vec<(u64, Vec<(Vec<u8>, bool)>)>;

    /// Tokenizes `content` with a read buffer of `capacity` bytes.
    fn tokenize(content: &[u8], capacity: usize) -> std::result::Result<Records, String> {
        let path = Path::new("mem.csv");
        let mut tok = Tokenizer::with_capacity(content, path, b',', capacity).map_err(|e| e.to_string())?;
        let mut rec = Record::default();
        let mut out = Vec::new();
        while tok.next_record(&mut rec).map_err(|e| e.to_string())? {
            out.push((rec.line, (0..rec.len()).map(|i| (rec.field(i).0.to_vec(), rec.field(i).1)).collect()));
        }
        assert_eq!(tok.bytes, content.len() as u64);
        Ok(out)
    }

    #[test]
    fn tokenizer_lines_and_buffer_boundaries() {
        let content = b"\xEF\xBB\xBFa,\"b\nc\"\r\n\"\",x\n\"q\"\"\",\r\n,\n\"a\r\nb\",\"\"\"\"";
        let expected = tokenize(content, 1 << 16).unwrap();
        let lines: Vec<u64> = expected.iter().map(|r| r.0).collect();
        assert_eq!(lines, [1, 3, 4, 5, 6]);
        assert_eq!(expected[0].1, [(b"a".to_vec(), false), (b"b\nc".to_vec(), true)]);
        assert_eq!(expected[2].1, [(b"q\"".to_vec(), true), (vec![], false)]);
        assert_eq!(expected[4].1, [(b"a\r\nb".to_vec(), true), (b"\"".to_vec(), true)]);
        for capacity in 1..8 {
            assert_eq!(tokenize(content, capacity).unwrap(), expected, "capacity {capacity}");
        }
    }

    proptest! {
        #[test]
        fn tokenizer_never_panics_and_ignores_buffer_size(content in proptest::collection::vec(prop_oneof![
            Just(b'a'), Just(b','), Just(b'"'), Just(b'\r'), Just(b'\n'), Just(0xC3), Just(0xA9), Just(0xEF), Just(0xBB), Just(0xBF)
        ], 0..40), capacity in 1usize..6) {
            let big = tokenize(&content, 1 << 16);
            let small = tokenize(&content, capacity);
            prop_assert_eq!(&big, &small);
            // And the whole reader never panics either.
            let (_dir, path) = file(&content);
            for opts in [CsvOptions::default(), no_header()] {
                if let Ok(inferred) = infer_schema(&path, &opts, None) {
                    prop_assert_eq!(read_all(&path, &opts, &inferred.schema).map(|r| r.len() as u64).ok(), Some(inferred.rows));
                }
            }
        }
    }

    /// Values equal, NaN equal to NaN and floats compared by bits.
    fn same(a: &[Value], b: &[Value]) -> bool {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| match (x, y) {
                (F64(x), F64(y)) => x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                (x, y) => x == y,
            })
    }

    fn value_of(ty: ColumnType) -> BoxedStrategy<Value> {
        let v = match ty {
            ColumnType::I64 => any::<i64>().prop_map(I64).boxed(),
            ColumnType::F64 => prop_oneof![
                any::<u64>().prop_map(f64::from_bits),
                Just(-0.0),
                Just(5e-324),
                Just(f64::MAX),
                Just(1e-300),
                Just(f64::INFINITY),
                Just(f64::NEG_INFINITY),
                -1e6..1e6f64,
            ]
            .prop_map(F64)
            .boxed(),
            ColumnType::Date => (-719_528..=2_932_896i32).prop_map(Date).boxed(),
            ColumnType::Bool => any::<bool>().prop_map(Bool).boxed(),
            ColumnType::Str => prop_oneof![any::<String>(), "[a,\"\r\n é東😀\u{feff}\t;]{0,8}", Just(String::new())].prop_map(Str).boxed(),
            ColumnType::Bytes => proptest::collection::vec(any::<u8>(), 0..8).prop_map(Bytes).boxed(),
        };
        prop_oneof![1 => Just(Null), 4 => v].boxed()
    }

    fn table() -> impl Strategy<Value = (Schema, Vec<Vec<Value>>)> {
        proptest::collection::vec(proptest::sample::select(ColumnType::ALL.to_vec()), 1..5).prop_flat_map(|types| {
            let schema = Schema::new(types.iter().enumerate().map(|(i, &ty)| ColumnDef { name: format!("col {i}, \"{}\"", ty.name()), ty }).collect()).unwrap();
            let row: Vec<_> = types.iter().map(|&ty| value_of(ty)).collect();
            (Just(schema), proptest::collection::vec(row, 0..12))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn written_rows_read_back_identical((schema, rows) in table()) {
            let mut w = CsvWriter::new(Vec::new(), &schema).unwrap();
            for r in &rows {
                w.write_row(r).unwrap();
            }
            let bytes = w.finish().unwrap();
            let (_dir, path) = file(&bytes);
            let opts = CsvOptions::default();
            let back = read_all(&path, &opts, &schema).unwrap();
            prop_assert_eq!(back.len(), rows.len());
            for (a, b) in rows.iter().zip(&back) {
                prop_assert!(same(a, b), "{:?} != {:?}", a, b);
            }
            let checked = infer_schema(&path, &opts, Some(&schema)).unwrap();
            prop_assert_eq!(checked.rows, rows.len() as u64);
            prop_assert_eq!(checked.bytes, bytes.len() as u64);
            // Inference reads the same file, with its header names, and its schema reads it all.
            let inferred = infer_schema(&path, &opts, None).unwrap();
            prop_assert_eq!(inferred.rows, rows.len() as u64);
            let names: Vec<_> = inferred.schema.columns.iter().map(|c| &c.name).collect();
            let want: Vec<_> = schema.columns.iter().map(|c| &c.name).collect();
            prop_assert_eq!(names, want);
            prop_assert_eq!(read_all(&path, &opts, &inferred.schema).unwrap().len(), rows.len());
        }
    }
}
