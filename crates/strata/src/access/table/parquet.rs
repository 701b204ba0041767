//! Parquet files: their schema as a table [`Schema`] and their rows as [`Value`]s.
//!
//! Reads flat files (every column a top-level primitive, optional or required) through the
//! `parquet` crate's column readers, a batch of rows at a time, so memory stays bounded by the
//! batch and the pages being decoded, not by the file. Types map as:
//!
//! | Parquet (physical, logical/converted)                  | strata  |
//! |--------------------------------------------------------|---------|
//! | `INT32`, `INT64`, signed `INT(8..64)`, `UINT(8..32)`    | `i64`   |
//! | `UINT(64)`                                              | `i64` (a value above `i64::MAX` is an error) |
//! | `FLOAT`, `DOUBLE`                                       | `f64`   |
//! | `INT32` `DATE`                                          | `date`  |
//! | `BOOLEAN`                                               | `bool`  |
//! | `BYTE_ARRAY` `STRING`/`UTF8`, `ENUM`, `JSON`            | `str`   |
//! | `BYTE_ARRAY` without annotation, `BSON`                 | `bytes` |
//!
//! Anything else (decimals, timestamps, times, `INT96`, fixed-length byte arrays, lists,
//! maps, structs) is refused up front with an error naming the column and its type. Every
//! strata column is nullable, so optional and required columns both read.
//!
//! Codecs: uncompressed and Snappy (the `parquet` crate is built with only its `snap`
//! feature, to keep the build small); a file with another codec fails with the crate's
//! "codec not supported" error naming it.

use std::fs::File;
use std::path::Path;

use ::parquet::basic::{ConvertedType, LogicalType, Repetition, Type as PhysicalType};
use ::parquet::column::reader::ColumnReader;
use ::parquet::data_type::ByteArray;
use ::parquet::file::reader::FileReader;
use ::parquet::file::serialized_reader::SerializedFileReader;
use ::parquet::schema::types::{ColumnDescriptor, SchemaDescriptor};

use super::schema::{ColumnDef, ColumnType, Schema, Value};
use crate::error::{Error, Result};

/// Rows decoded per batch.
const BATCH_ROWS: usize = 4096;

/// How a Parquet column's values become [`Value`]s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Conv {
    Bool,
    Int32,
    UInt32,
    Date32,
    Int64,
    UInt64,
    Float,
    Double,
    Utf8,
    Binary,
}

impl Conv {
    fn column_type(self) -> ColumnType {
        match self {
            Conv::Bool => ColumnType::Bool,
            Conv::Int32 | Conv::UInt32 | Conv::Int64 | Conv::UInt64 => ColumnType::I64,
            Conv::Date32 => ColumnType::Date,
            Conv::Float | Conv::Double => ColumnType::F64,
            Conv::Utf8 => ColumnType::Str,
            Conv::Binary => ColumnType::Bytes,
        }
    }
}

/// The conversion for a leaf column, or `None` if strata has no type for it.
fn conv_of(col: &ColumnDescriptor) -> Option<Conv> {
    use ConvertedType as C;
    let logical = col.logical_type_ref();
    let converted = col.converted_type();
    // Files written before logical types carry only the converted type; newer ones carry
    // both (consistent), so the logical type decides when there is one.
    Some(match (col.physical_type(), logical) {
        (PhysicalType::BOOLEAN, None) if converted == C::NONE => Conv::Bool,
        (PhysicalType::INT32, None) => match converted {
            C::NONE | C::INT_8 | C::INT_16 | C::INT_32 => Conv::Int32,
            C::UINT_8 | C::UINT_16 | C::UINT_32 => Conv::UInt32,
            C::DATE => Conv::Date32,
            _ => return None,
        },
        (PhysicalType::INT32, Some(LogicalType::Integer(t))) if t.bit_width <= 32 => {
            if t.is_signed {
                Conv::Int32
            } else {
                Conv::UInt32
            }
        }
        (PhysicalType::INT32, Some(LogicalType::Date)) => Conv::Date32,
        (PhysicalType::INT64, None) => match converted {
            C::NONE | C::INT_64 => Conv::Int64,
            C::UINT_64 => Conv::UInt64,
            _ => return None,
        },
        (PhysicalType::INT64, Some(LogicalType::Integer(t))) if t.bit_width == 64 => {
            if t.is_signed {
                Conv::Int64
            } else {
                Conv::UInt64
            }
        }
        (PhysicalType::FLOAT, None) if converted == C::NONE => Conv::Float,
        (PhysicalType::DOUBLE, None) if converted == C::NONE => Conv::Double,
        (PhysicalType::BYTE_ARRAY, None) => match converted {
            C::UTF8 | C::ENUM | C::JSON => Conv::Utf8,
            C::NONE | C::BSON => Conv::Binary,
            _ => return None,
        },
        (PhysicalType::BYTE_ARRAY, Some(LogicalType::String | LogicalType::Enum | LogicalType::Json)) => Conv::Utf8,
        (PhysicalType::BYTE_ARRAY, Some(LogicalType::Bson)) => Conv::Binary,
        _ => return None,
    })
}

/// A column's Parquet type in words, for messages: `INT64 (Timestamp { .. })`.
fn type_in_words(col: &ColumnDescriptor) -> String {
    match (col.logical_type_ref(), col.converted_type()) {
        (Some(l), _) => format!("{:?} ({l:?})", col.physical_type()),
        (None, ConvertedType::NONE) => format!("{:?}", col.physical_type()),
        (None, c) => format!("{:?} ({c:?})", col.physical_type()),
    }
}

/// The table schema of a Parquet schema and each column's conversion.
fn describe(path: &Path, descr: &SchemaDescriptor) -> Result<(Schema, Vec<Conv>)> {
    let unsupported = |what: String| Error::InvalidInput(format!("{}: {what}; strata imports only flat columns of {}", path.display(), SUPPORTED));
    for field in descr.root_schema().get_fields() {
        if field.is_group() {
            return Err(unsupported(format!("column {:?} is nested (a list, map or struct)", field.name())));
        }
        if field.get_basic_info().has_repetition() && field.get_basic_info().repetition() == Repetition::REPEATED {
            return Err(unsupported(format!("column {:?} is repeated", field.name())));
        }
    }
    let mut columns = Vec::with_capacity(descr.num_columns());
    let mut convs = Vec::with_capacity(descr.num_columns());
    for col in descr.columns() {
        let conv = conv_of(col).ok_or_else(|| unsupported(format!("column {:?} has type {}", col.name(), type_in_words(col))))?;
        columns.push(ColumnDef { name: col.name().to_owned(), ty: conv.column_type() });
        convs.push(conv);
    }
    let schema = Schema::new(columns).map_err(|e| match e {
        Error::InvalidInput(m) => Error::InvalidInput(format!("{}: {m}", path.display())),
        e => e,
    })?;
    Ok((schema, convs))
}

/// The Parquet types [`read_parquet`] reads, for messages.
const SUPPORTED: &str = "INT32/INT64 (signed, or unsigned up to 64 bits), FLOAT, DOUBLE, DATE, BOOLEAN, \
                         BYTE_ARRAY (STRING, ENUM, JSON, BSON or plain)";

fn parquet_error(path: &Path, e: ::parquet::errors::ParquetError) -> Error {
    match e {
        ::parquet::errors::ParquetError::External(inner) => match inner.downcast::<std::io::Error>() {
            Ok(io) => Error::io("read", path, *io),
            Err(other) => Error::InvalidInput(format!("{}: cannot read it as Parquet: {other}", path.display())),
        },
        e => Error::InvalidInput(format!("{}: cannot read it as Parquet: {e}", path.display())),
    }
}

/// Runs one call into the `parquet` crate, turning its errors and its panics into errors.
///
/// The crate panics on some damaged input (its documented `get_vlq_int` assertion, for one:
/// a byte flip in a page header found it), and an import must fail with an error, not take
/// the process down. Only the crate's own calls are guarded, never the caller's `f`, whose
/// panics are bugs that should surface. After a caught panic the reader is dropped unused.
fn guarded<T>(path: &Path, call: impl FnOnce() -> ::parquet::errors::Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)) {
        Ok(result) => result.map_err(|e| parquet_error(path, e)),
        Err(panic) => {
            let what = panic.downcast_ref::<String>().map(String::as_str).or_else(|| panic.downcast_ref::<&str>().copied()).unwrap_or("a panic");
            Err(Error::InvalidInput(format!("{}: damaged Parquet data (the reader failed: {what})", path.display())))
        }
    }
}

fn open(path: &Path) -> Result<SerializedFileReader<File>> {
    let mut file = File::open(path).map_err(|e| Error::io("open", path, e))?;
    check_footer(path, &mut file)?;
    guarded(path, || SerializedFileReader::new(file))
}

/// Checks the counts in the file's footer (its Thrift metadata) against the bytes that hold
/// them before the `parquet` crate decodes it: the crate sizes vectors by them (a schema
/// element's `num_children`, for one, went into `Vec::with_capacity`: a damaged footer of a
/// 2 KiB file made it allocate 1 GiB, and up to 16 GiB is possible). Refused: a list, set or
/// map claiming more elements than bytes remain, or a schema element claiming more children
/// than elements follow it. Anything else odd is left to the crate, which reports it.
fn check_footer(path: &Path, file: &mut File) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let io = |e| Error::io("read", path, e);
    let len = file.seek(SeekFrom::End(0)).map_err(io)?;
    if len < 12 {
        return Ok(());
    }
    let mut tail = [0u8; 8];
    file.seek(SeekFrom::End(-8)).map_err(io)?;
    file.read_exact(&mut tail).map_err(io)?;
    let meta_len = u32::from_le_bytes(tail[..4].try_into().unwrap()) as u64;
    if &tail[4..] != b"PAR1" || meta_len > len - 12 {
        return Ok(());
    }
    let mut meta = vec![0u8; meta_len as usize];
    file.seek(SeekFrom::End(-8 - meta_len as i64)).map_err(io)?;
    file.read_exact(&mut meta).map_err(io)?;
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    match thrift::check_file_metadata(&meta) {
        Err(thrift::Bad::Count(what)) => Err(Error::InvalidInput(format!("{}: cannot read it as Parquet: damaged footer ({what})", path.display()))),
        // Malformed in another way: the crate's own error says how.
        Err(thrift::Bad::Malformed) | Ok(()) => Ok(()),
    }
}

/// Just enough of Thrift's compact protocol to walk a Parquet footer and check its counts.
mod thrift {
    pub enum Bad {
        /// A count larger than the bytes (or elements) that could hold it.
        Count(String),
        /// Not walkable (left to the `parquet` crate to report).
        Malformed,
    }

    struct Reader<'a> {
        b: &'a [u8],
        at: usize,
    }

    const MAX_DEPTH: u32 = 64;

    /// Reads (or skips) one field: `(field id, depth, reader, compact type)`.
    type FieldFn<'f> = dyn FnMut(i64, u32, &mut Reader<'_>, u8) -> Result<(), Bad> + 'f;

    impl Reader<'_> {
        fn byte(&mut self) -> Result<u8, Bad> {
            let v = *self.b.get(self.at).ok_or(Bad::Malformed)?;
            self.at += 1;
            Ok(v)
        }
        fn varint(&mut self) -> Result<u64, Bad> {
            let mut v = 0u64;
            for shift in (0..64).step_by(7) {
                let b = self.byte()?;
                v |= u64::from(b & 0x7f) << shift;
                if b & 0x80 == 0 {
                    return Ok(v);
                }
            }
            Err(Bad::Malformed)
        }
        fn zigzag(&mut self) -> Result<i64, Bad> {
            let v = self.varint()?;
            Ok((v >> 1) as i64 ^ -((v & 1) as i64))
        }
        fn skip(&mut self, n: u64) -> Result<(), Bad> {
            let end = (self.at as u64).checked_add(n).filter(|&e| e <= self.b.len() as u64).ok_or(Bad::Malformed)?;
            self.at = end as usize;
            Ok(())
        }
        fn remaining(&self) -> u64 {
            (self.b.len() - self.at) as u64
        }
        /// A container's element count, refused if the remaining bytes cannot hold it
        /// (every element takes at least one byte).
        fn count(&mut self, n: u64, what: &str) -> Result<u64, Bad> {
            if n > self.remaining() {
                return Err(Bad::Count(format!("a {what} of {n} elements in {} bytes", self.remaining())));
            }
            Ok(n)
        }
        /// Skips a value of compact type `ty`.
        fn value(&mut self, ty: u8, depth: u32) -> Result<(), Bad> {
            if depth > MAX_DEPTH {
                return Err(Bad::Malformed);
            }
            match ty {
                1 | 2 => Ok(()), // a boolean field: the value is in the type
                3 => self.skip(1),
                4..=6 => self.varint().map(drop),
                7 => self.skip(8),
                8 => {
                    let n = self.varint()?;
                    self.skip(n)
                }
                9 | 10 => {
                    let (n, elem) = self.list_header()?;
                    for _ in 0..n {
                        // Booleans in a list take a byte each.
                        if elem == 1 || elem == 2 {
                            self.skip(1)?;
                        } else {
                            self.value(elem, depth + 1)?;
                        }
                    }
                    Ok(())
                }
                11 => {
                    let n = self.varint()?;
                    let n = self.count(n.saturating_mul(2), "map")? / 2;
                    if n == 0 {
                        return Ok(());
                    }
                    let kv = self.byte()?;
                    for _ in 0..n {
                        self.value(kv >> 4, depth + 1)?;
                        self.value(kv & 15, depth + 1)?;
                    }
                    Ok(())
                }
                12 => self.fields(depth + 1, &mut |_, depth, r, ty| r.value(ty, depth + 1)),
                _ => Err(Bad::Malformed),
            }
        }
        fn list_header(&mut self) -> Result<(u64, u8), Bad> {
            let h = self.byte()?;
            let n = if h >> 4 == 15 { self.varint()? } else { u64::from(h >> 4) };
            Ok((self.count(n, "list")?, h & 15))
        }
        /// Walks a struct's fields, calling `f(id, depth, reader, type)` for each, which
        /// must read (or skip) the field's value.
        fn fields(&mut self, depth: u32, f: &mut FieldFn<'_>) -> Result<(), Bad> {
            if depth > MAX_DEPTH {
                return Err(Bad::Malformed);
            }
            let mut id = 0i64;
            loop {
                let h = self.byte()?;
                let ty = h & 15;
                if ty == 0 {
                    return Ok(());
                }
                id = if h >> 4 == 0 { self.zigzag()? } else { id + i64::from(h >> 4) };
                f(id, depth, self, ty)?;
            }
        }
    }

    /// Walks `FileMetaData`: every container count against the bytes, and the schema
    /// (field 2, a list of `SchemaElement`) for `num_children` (field 5) against the
    /// elements that follow each element.
    pub fn check_file_metadata(b: &[u8]) -> Result<(), Bad> {
        let mut r = Reader { b, at: 0 };
        r.fields(0, &mut |id, depth, r, ty| {
            if id != 2 || ty != 9 {
                return r.value(ty, depth + 1);
            }
            let (n, elem) = r.list_header()?;
            if elem != 12 {
                return Err(Bad::Malformed);
            }
            for i in 0..n {
                let left = n - i - 1;
                r.fields(depth + 1, &mut |id, depth, r, ty| {
                    if id == 5 && ty == 5 {
                        let children = r.zigzag()?;
                        if children < 0 || children as u64 > left {
                            return Err(Bad::Count(format!("a schema element with {children} children, {left} elements after it")));
                        }
                        return Ok(());
                    }
                    r.value(ty, depth + 1)
                })?;
            }
            Ok(())
        })
    }
}

/// The table schema of the Parquet file at `path` (see the module doc for the type mapping).
pub fn schema_of_parquet(path: &Path) -> Result<Schema> {
    let reader = open(path)?;
    Ok(describe(path, reader.metadata().file_metadata().schema_descr())?.0)
}

/// One batch of a column's values.
enum Values {
    Bool(Vec<bool>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bytes(Vec<ByteArray>),
}

/// A column being read: its reader and the current batch.
struct Column {
    reader: ColumnReader,
    conv: Conv,
    max_def: i16,
    /// Definition levels of the batch (empty for a required column).
    def: Vec<i16>,
    /// The batch's non-NULL values.
    values: Values,
    /// The next of `values` to hand out.
    next: usize,
}

impl Column {
    fn new(reader: ColumnReader, conv: Conv, max_def: i16) -> Column {
        let values = match conv {
            Conv::Bool => Values::Bool(Vec::new()),
            Conv::Int32 | Conv::UInt32 | Conv::Date32 => Values::I32(Vec::new()),
            Conv::Int64 | Conv::UInt64 => Values::I64(Vec::new()),
            Conv::Float => Values::F32(Vec::new()),
            Conv::Double => Values::F64(Vec::new()),
            Conv::Utf8 | Conv::Binary => Values::Bytes(Vec::new()),
        };
        Column { reader, conv, max_def, def: Vec::new(), values, next: 0 }
    }

    /// Reads the next `rows` rows; returns how many there were.
    fn read_batch(&mut self, rows: usize) -> ::parquet::errors::Result<usize> {
        self.def.clear();
        self.next = 0;
        let def = Some(&mut self.def);
        let (records, _, _) = match (&mut self.reader, &mut self.values) {
            (ColumnReader::BoolColumnReader(r), Values::Bool(v)) => {
                v.clear();
                r.read_records(rows, def, None, v)?
            }
            (ColumnReader::Int32ColumnReader(r), Values::I32(v)) => {
                v.clear();
                r.read_records(rows, def, None, v)?
            }
            (ColumnReader::Int64ColumnReader(r), Values::I64(v)) => {
                v.clear();
                r.read_records(rows, def, None, v)?
            }
            (ColumnReader::FloatColumnReader(r), Values::F32(v)) => {
                v.clear();
                r.read_records(rows, def, None, v)?
            }
            (ColumnReader::DoubleColumnReader(r), Values::F64(v)) => {
                v.clear();
                r.read_records(rows, def, None, v)?
            }
            (ColumnReader::ByteArrayColumnReader(r), Values::Bytes(v)) => {
                v.clear();
                r.read_records(rows, def, None, v)?
            }
            _ => return Err(::parquet::errors::ParquetError::General("the column reader does not match the column's type".into())),
        };
        Ok(records)
    }

    /// Row `i` of the batch, in order (rows must be taken 0, 1, 2, ...).
    fn value(&mut self, i: usize) -> std::result::Result<Value, String> {
        if self.max_def > 0 {
            match self.def.get(i) {
                Some(&d) if d < self.max_def => return Ok(Value::Null),
                Some(_) => {}
                None => return Err("fewer definition levels than rows".into()),
            }
        }
        let k = self.next;
        self.next += 1;
        let missing = || "fewer values than rows".to_owned();
        Ok(match (&self.values, self.conv) {
            (Values::Bool(v), _) => Value::Bool(*v.get(k).ok_or_else(missing)?),
            (Values::I32(v), Conv::Date32) => Value::Date(*v.get(k).ok_or_else(missing)?),
            // An unsigned 32-bit value is stored in an INT32's bits.
            (Values::I32(v), Conv::UInt32) => Value::I64(i64::from(*v.get(k).ok_or_else(missing)? as u32)),
            (Values::I32(v), _) => Value::I64(i64::from(*v.get(k).ok_or_else(missing)?)),
            (Values::I64(v), Conv::UInt64) => {
                let u = *v.get(k).ok_or_else(missing)? as u64; // the bits of a UINT_64
                Value::I64(i64::try_from(u).map_err(|_| format!("unsigned value {u} is too large for i64"))?)
            }
            (Values::I64(v), _) => Value::I64(*v.get(k).ok_or_else(missing)?),
            (Values::F32(v), _) => Value::F64(f64::from(*v.get(k).ok_or_else(missing)?)),
            (Values::F64(v), _) => Value::F64(*v.get(k).ok_or_else(missing)?),
            (Values::Bytes(v), Conv::Utf8) => {
                let b = v.get(k).ok_or_else(missing)?.data();
                Value::Str(std::str::from_utf8(b).map_err(|e| format!("invalid UTF-8 at byte {} of the string", e.valid_up_to()))?.to_owned())
            }
            (Values::Bytes(v), _) => Value::Bytes(v.get(k).ok_or_else(missing)?.data().to_vec()),
        })
    }
}

/// Reads every row of the Parquet file at `path`, calling `f` with each (a slice of
/// `schema.len()` values, reused between calls) and `progress` with an estimate of the file
/// bytes consumed so far (compressed row-group sizes, pro rata within a row group) after each
/// batch. Returns the schema (as [`schema_of_parquet`] gives it) and the number of rows. An
/// error from `f` stops the read and is returned as is; errors in the file name the column
/// and the row (0-based over the file).
pub fn read_parquet(path: &Path, progress: &mut dyn FnMut(u64), f: &mut dyn FnMut(&[Value]) -> Result<()>) -> Result<(Schema, u64)> {
    let reader = open(path)?;
    let meta = reader.metadata();
    let (schema, convs) = describe(path, meta.file_metadata().schema_descr())?;
    let mut row: Vec<Value> = Vec::with_capacity(schema.len());
    let mut rows = 0u64;
    let mut bytes_before = 0u64;
    for g in 0..reader.num_row_groups() {
        let group = guarded(path, || reader.get_row_group(g))?;
        let group_meta = meta.row_group(g);
        let group_rows = u64::try_from(group_meta.num_rows()).unwrap_or(0);
        let group_bytes = u64::try_from(group_meta.compressed_size()).unwrap_or(0);
        let mut columns = Vec::with_capacity(convs.len());
        for (c, &conv) in convs.iter().enumerate() {
            let max_def = group.metadata().column(c).column_descr().max_def_level();
            columns.push(Column::new(guarded(path, || group.get_column_reader(c))?, conv, max_def));
        }
        let mut done = 0u64;
        while done < group_rows {
            let want = usize::try_from(group_rows - done).map_or(BATCH_ROWS, |left| left.min(BATCH_ROWS));
            for (c, col) in columns.iter_mut().enumerate() {
                let got = guarded(path, || col.read_batch(want))?;
                if got != want {
                    let name = &schema.columns[c].name;
                    return Err(Error::InvalidInput(format!(
                        "{}: column {name:?} of row group {g} ends after {} of its {group_rows} rows",
                        path.display(),
                        done + got as u64
                    )));
                }
            }
            for i in 0..want {
                row.clear();
                for (c, col) in columns.iter_mut().enumerate() {
                    let v = col.value(i).map_err(|problem| {
                        Error::InvalidInput(format!("{} row {}, column {:?} ({}): {problem}", path.display(), rows, schema.columns[c].name, c + 1))
                    })?;
                    row.push(v);
                }
                f(&row)?;
                rows += 1;
            }
            done += want as u64;
            progress(bytes_before + group_bytes.saturating_mul(done) / group_rows.max(1));
        }
        bytes_before += group_bytes;
    }
    Ok((schema, rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::sync::Arc;

    use ::parquet::basic::Compression;
    use ::parquet::data_type::{BoolType, ByteArrayType, DoubleType, FloatType, Int32Type, Int64Type};
    use ::parquet::file::properties::WriterProperties;
    use ::parquet::file::writer::SerializedFileWriter;
    use ::parquet::schema::parser::parse_message_type;

    use Value::{Bool, Bytes, Date, Null, Str, F64, I64};

    /// The data of one column, NULL as `None`.
    #[derive(Clone)]
    enum Data {
        Bool(Vec<Option<bool>>),
        I32(Vec<Option<i32>>),
        I64(Vec<Option<i64>>),
        F32(Vec<Option<f32>>),
        F64(Vec<Option<f64>>),
        Bytes(Vec<Option<Vec<u8>>>),
    }

    /// Values and definition levels (None for a required column) of `data`.
    fn split<T: Clone>(data: &[Option<T>], required: bool) -> (Vec<T>, Option<Vec<i16>>) {
        let values = data.iter().flatten().cloned().collect();
        let def = (!required).then(|| data.iter().map(|v| i16::from(v.is_some())).collect());
        (values, def)
    }

    /// Writes a Parquet file of `message` with one row group per element of `groups` (each a
    /// column list in schema order).
    fn write(dir: &tempfile::TempDir, message: &str, compression: Compression, groups: &[Vec<Data>]) -> PathBuf {
        let path = dir.path().join("data.parquet");
        let schema = Arc::new(parse_message_type(message).unwrap());
        let required: Vec<bool> = schema.get_fields().iter().map(|f| f.get_basic_info().repetition() == Repetition::REQUIRED).collect();
        let props = Arc::new(WriterProperties::builder().set_compression(compression).set_data_page_row_count_limit(1000).build());
        let mut w = SerializedFileWriter::new(File::create(&path).unwrap(), schema, props).unwrap();
        for group in groups {
            let mut rg = w.next_row_group().unwrap();
            for (c, data) in group.iter().enumerate() {
                let mut col = rg.next_column().unwrap().unwrap();
                let req = required[c];
                match data {
                    Data::Bool(d) => {
                        let (v, def) = split(d, req);
                        col.typed::<BoolType>().write_batch(&v, def.as_deref(), None).unwrap();
                    }
                    Data::I32(d) => {
                        let (v, def) = split(d, req);
                        col.typed::<Int32Type>().write_batch(&v, def.as_deref(), None).unwrap();
                    }
                    Data::I64(d) => {
                        let (v, def) = split(d, req);
                        col.typed::<Int64Type>().write_batch(&v, def.as_deref(), None).unwrap();
                    }
                    Data::F32(d) => {
                        let (v, def) = split(d, req);
                        col.typed::<FloatType>().write_batch(&v, def.as_deref(), None).unwrap();
                    }
                    Data::F64(d) => {
                        let (v, def) = split(d, req);
                        col.typed::<DoubleType>().write_batch(&v, def.as_deref(), None).unwrap();
                    }
                    Data::Bytes(d) => {
                        let (v, def) = split(d, req);
                        let v: Vec<ByteArray> = v.into_iter().map(ByteArray::from).collect();
                        col.typed::<ByteArrayType>().write_batch(&v, def.as_deref(), None).unwrap();
                    }
                }
                col.close().unwrap();
            }
            rg.close().unwrap();
        }
        w.close().unwrap();
        path
    }

    fn read_all(path: &Path) -> Result<(Schema, Vec<Vec<Value>>)> {
        let mut rows = Vec::new();
        let (schema, n) = read_parquet(path, &mut |_| {}, &mut |r| {
            rows.push(r.to_vec());
            Ok(())
        })?;
        assert_eq!(n, rows.len() as u64);
        Ok((schema, rows))
    }

    /// Values equal, NaN equal to NaN and floats compared by bits.
    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (F64(x), F64(y)) => x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
            (x, y) => x == y,
        }
    }

    const ALL_TYPES: &str = "message m {
        optional int64 a;
        required int32 b;
        optional int32 d (DATE);
        optional boolean flag;
        optional double x;
        optional float y;
        optional binary s (UTF8);
        optional binary raw;
        optional int32 u (UINT_32);
        optional int64 big (INTEGER(64,false));
        optional int32 small (INTEGER(16,true));
        required binary e (ENUM);
    }";

    /// `n` rows of every supported type starting at row `start`, as Parquet columns and as
    /// the values strata should read.
    fn all_types(start: usize, n: usize) -> (Vec<Data>, Vec<Vec<Value>>) {
        let rows: Vec<usize> = (start..start + n).collect();
        let opt = |i: usize, k: usize| !i.is_multiple_of(k);
        let a: Vec<_> = rows.iter().map(|&i| opt(i, 3).then_some(i as i64 * 1_000_003 - 7)).collect();
        let b: Vec<_> = rows.iter().map(|&i| Some(i as i32 - 5)).collect();
        let d: Vec<_> = rows.iter().map(|&i| opt(i, 4).then_some(i as i32 - 719_528)).collect();
        let flag: Vec<_> = rows.iter().map(|&i| opt(i, 5).then_some(i % 2 == 0)).collect();
        let specials = [0.1, -0.0, f64::INFINITY, f64::NAN, 5e-324, f64::MAX];
        let x: Vec<_> = rows.iter().map(|&i| opt(i, 6).then_some(specials[i % specials.len()])).collect();
        let y: Vec<_> = rows.iter().map(|&i| opt(i, 7).then_some(i as f32 / 3.0)).collect();
        let s: Vec<_> = rows.iter().map(|&i| opt(i, 2).then(|| format!("név {i}, \"東京\"").into_bytes())).collect();
        let raw: Vec<_> = rows.iter().map(|&i| opt(i, 8).then(|| vec![0, 255, i as u8])).collect();
        let u: Vec<_> = rows.iter().map(|&i| opt(i, 9).then_some((u32::MAX - i as u32) as i32)).collect();
        let big: Vec<_> = rows.iter().map(|&i| opt(i, 10).then_some(i64::MAX - i as i64)).collect();
        let small: Vec<_> = rows.iter().map(|&i| opt(i, 11).then_some(-(i as i32 % 30_000))).collect();
        let e: Vec<_> = rows.iter().map(|&i| Some(if i % 2 == 0 { b"red".to_vec() } else { Vec::new() })).collect();
        let expected = (0..n)
            .map(|k| {
                vec![
                    a[k].map_or(Null, I64),
                    I64(i64::from(b[k].unwrap())),
                    d[k].map_or(Null, Date),
                    flag[k].map_or(Null, Bool),
                    x[k].map_or(Null, F64),
                    y[k].map_or(Null, |v| F64(f64::from(v))),
                    s[k].clone().map_or(Null, |v| Str(String::from_utf8(v).unwrap())),
                    raw[k].clone().map_or(Null, Bytes),
                    u[k].map_or(Null, |v| I64(i64::from(v as u32))),
                    big[k].map_or(Null, I64),
                    small[k].map_or(Null, |v| I64(i64::from(v))),
                    Str(String::from_utf8(e[k].clone().unwrap()).unwrap()),
                ]
            })
            .collect();
        let data = vec![
            Data::I64(a),
            Data::I32(b),
            Data::I32(d),
            Data::Bool(flag),
            Data::F64(x),
            Data::F32(y),
            Data::Bytes(s),
            Data::Bytes(raw),
            Data::I32(u),
            Data::I64(big),
            Data::I32(small),
            Data::Bytes(e),
        ];
        (data, expected)
    }

    #[test]
    fn every_supported_type_reads_back() {
        for compression in [Compression::UNCOMPRESSED, Compression::SNAPPY] {
            let dir = tempfile::tempdir().unwrap();
            // Row groups larger and smaller than a batch, and an empty one.
            let (g1, mut expected) = all_types(0, 10_000);
            let (g2, e2) = all_types(10_000, 3);
            let (g3, _) = all_types(0, 0);
            expected.extend(e2);
            let path = write(&dir, ALL_TYPES, compression, &[g1, g2, g3]);
            let (schema, rows) = read_all(&path).unwrap();
            assert_eq!(schema.to_spec(), "a:i64,b:i64,d:date,flag:bool,x:f64,y:f64,s:str,raw:bytes,u:i64,big:i64,small:i64,e:str");
            assert_eq!(schema_of_parquet(&path).unwrap(), schema);
            assert_eq!(rows.len(), expected.len());
            for (i, (got, want)) in rows.iter().zip(&expected).enumerate() {
                assert!(got.iter().zip(want).all(|(g, w)| same(g, w)), "row {i}: {got:?} != {want:?}");
            }
            // Spot checks of the conversions.
            assert_eq!(rows[1][2], Date(-719_527));
            assert_eq!(rows[1][8], I64(i64::from(u32::MAX) - 1));
            assert_eq!(rows[1][9], I64(i64::MAX - 1));
        }
    }

    #[test]
    fn progress_rows_and_callback_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (g1, _) = all_types(0, 5000);
        let (g2, _) = all_types(0, 100);
        let path = write(&dir, ALL_TYPES, Compression::SNAPPY, &[g1, g2]);
        let mut seen = Vec::new();
        let (_, n) = read_parquet(&path, &mut |b| seen.push(b), &mut |_| Ok(())).unwrap();
        assert_eq!(n, 5100);
        assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
        assert_eq!(seen.len(), 3, "two batches of the first group, one of the second");
        let file_len = std::fs::metadata(&path).unwrap().len();
        assert!(*seen.last().unwrap() > 0 && *seen.last().unwrap() <= file_len);
        let mut calls = 0;
        let e = read_parquet(&path, &mut |_| {}, &mut |_| {
            calls += 1;
            if calls == 4097 {
                Err(Error::InvalidInput("stop".into()))
            } else {
                Ok(())
            }
        });
        assert_eq!(e.unwrap_err().to_string(), "invalid input: stop");
        assert_eq!(calls, 4097);
    }

    #[test]
    fn unsupported_types_are_named() {
        let cases = [
            ("message m { optional int64 ts (TIMESTAMP(MICROS,true)); }", "column \"ts\" has type INT64 (Timestamp"),
            ("message m { optional int96 old; }", "column \"old\" has type INT96"),
            ("message m { optional fixed_len_byte_array(16) id (UUID); }", "column \"id\" has type FIXED_LEN_BYTE_ARRAY (Uuid)"),
            ("message m { optional int32 dec (DECIMAL(9,2)); }", "column \"dec\" has type INT32 (Decimal"),
            ("message m { optional int32 ok; optional group g { optional int32 x; } }", "column \"g\" is nested"),
            ("message m { optional group l (LIST) { repeated group list { optional int32 element; } } }", "column \"l\" is nested"),
            ("message m { repeated int32 r; }", "column \"r\" is repeated"),
        ];
        for (message, want) in cases {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("t.parquet");
            let schema = Arc::new(parse_message_type(message).unwrap());
            let w = SerializedFileWriter::new(File::create(&path).unwrap(), schema, Arc::new(WriterProperties::builder().build())).unwrap();
            w.close().unwrap();
            let e = schema_of_parquet(&path).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("strata imports only flat columns"), "{message}: {e}");
            assert_eq!(read_all(&path).unwrap_err().to_string(), e);
        }
    }

    #[test]
    fn bad_values_name_row_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let message = "message m { required int64 n (INTEGER(64,false)); optional binary s (STRING); }";
        let groups = [vec![Data::I64(vec![Some(1), Some(-1)]), Data::Bytes(vec![Some(b"ok".to_vec()), Some(b"x".to_vec())])]];
        let path = write(&dir, message, Compression::UNCOMPRESSED, &groups);
        let e = read_all(&path).unwrap_err().to_string();
        assert!(e.contains("row 1, column \"n\" (1): unsigned value 18446744073709551615 is too large for i64"), "{e}");
        let groups = [vec![Data::I64(vec![Some(1), Some(2)]), Data::Bytes(vec![None, Some(b"\xffx".to_vec())])]];
        let path = write(&dir, message, Compression::UNCOMPRESSED, &groups);
        let e = read_all(&path).unwrap_err().to_string();
        assert!(e.contains("row 1, column \"s\" (2): invalid UTF-8 at byte 0"), "{e}");
    }

    #[test]
    fn empty_and_damaged_files() {
        let dir = tempfile::tempdir().unwrap();
        // No row groups: the schema and no rows.
        let path = write(&dir, ALL_TYPES, Compression::SNAPPY, &[]);
        let (schema, rows) = read_all(&path).unwrap();
        assert_eq!((schema.len(), rows.len()), (12, 0));
        // Not Parquet, missing, truncated: errors, not panics.
        let csv = dir.path().join("x.csv");
        std::fs::write(&csv, "a,b\n1,2\n").unwrap();
        let e = read_all(&csv).unwrap_err().to_string();
        assert!(e.contains("x.csv: cannot read it as Parquet"), "{e}");
        assert!(matches!(read_all(&dir.path().join("missing.parquet")), Err(Error::Io { .. })));
        let (g, _) = all_types(0, 2000);
        let path = write(&dir, ALL_TYPES, Compression::SNAPPY, &[g]);
        let good = std::fs::read(&path).unwrap();
        let bad = dir.path().join("bad.parquet");
        for cut in [0, 4, good.len() / 2, good.len() - 9, good.len() - 1] {
            std::fs::write(&bad, &good[..cut]).unwrap();
            assert!(read_all(&bad).is_err(), "cut at {cut}");
        }
    }

    /// Damaged files fail with errors: the `parquet` crate's panics on bad input are caught.
    #[test]
    fn flipped_bytes_are_errors_or_rows() {
        let dir = tempfile::tempdir().unwrap();
        let (g, _) = all_types(0, 3000);
        let path = write(&dir, ALL_TYPES, Compression::SNAPPY, &[g]);
        let good = std::fs::read(&path).unwrap();
        let bad = dir.path().join("bad.parquet");
        let mut seed = 12345u64;
        let mut damaged = 0;
        // With parquet 60.1, one of these 3000 damaged copies (three flipped bits each) makes
        // the crate panic in a varint of a page header.
        for _ in 0..3000 {
            let mut b = good.clone();
            for _ in 0..3 {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                let pos = usize::try_from(seed >> 33).unwrap() % b.len();
                b[pos] ^= 1 << ((seed >> 20) % 8);
            }
            std::fs::write(&bad, &b).unwrap();
            match read_all(&bad) {
                Ok((_, rows)) => assert!(rows.len() <= 3000),
                Err(e) => {
                    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
                    damaged += u32::from(e.to_string().contains("damaged Parquet data"));
                }
            }
        }
        println!("{damaged} panics caught");
    }

    #[test]
    fn panics_in_the_reader_become_errors() {
        let path = Path::new("x.parquet");
        let e = guarded::<()>(path, || panic!("Num of bytes exceed MAX_VLQ_BYTE_LEN ({})", 10)).unwrap_err();
        assert_eq!(e.to_string(), "invalid input: x.parquet: damaged Parquet data (the reader failed: Num of bytes exceed MAX_VLQ_BYTE_LEN (10))");
        let e = guarded::<()>(path, || panic!("static")).unwrap_err();
        assert!(e.to_string().contains("(the reader failed: static)"));
        assert_eq!(guarded(path, || Ok(5)).unwrap(), 5);
    }
}
