//! Table schemas and the values of their columns.
//!
//! A table has a schema of typed columns: `i64`, `f64`, `date` (days since 1970-01-01),
//! `bool`, `str` (UTF-8) and `bytes`. Every column is nullable.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The type of a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ColumnType {
    /// Signed 64-bit integer.
    I64,
    /// 64-bit IEEE float.
    F64,
    /// A calendar date, stored as days since 1970-01-01 (i32).
    Date,
    /// true / false.
    Bool,
    /// A UTF-8 string.
    Str,
    /// A byte string.
    Bytes,
}

impl ColumnType {
    /// Every type, in the order of their names in messages.
    pub const ALL: [ColumnType; 6] = [ColumnType::I64, ColumnType::F64, ColumnType::Date, ColumnType::Bool, ColumnType::Str, ColumnType::Bytes];

    /// The name used in schemas and messages (`i64`, `f64`, `date`, `bool`, `str`, `bytes`).
    pub fn name(self) -> &'static str {
        match self {
            ColumnType::I64 => "i64",
            ColumnType::F64 => "f64",
            ColumnType::Date => "date",
            ColumnType::Bool => "bool",
            ColumnType::Str => "str",
            ColumnType::Bytes => "bytes",
        }
    }

    /// Parses a type name (see [`name`](Self::name)).
    pub fn parse(s: &str) -> Option<ColumnType> {
        ColumnType::ALL.into_iter().find(|t| t.name() == s)
    }

    /// Bytes of the value in a leaf's fixed-size area: 8 for numbers, 4 for dates, 1 for
    /// booleans, 16 for the header of a string or byte string.
    pub fn fixed_width(self) -> usize {
        match self {
            ColumnType::I64 | ColumnType::F64 => 8,
            ColumnType::Date => 4,
            ColumnType::Bool => 1,
            ColumnType::Str | ColumnType::Bytes => 16,
        }
    }

    /// Whether values have a variable-size part.
    pub fn is_var(self) -> bool {
        matches!(self, ColumnType::Str | ColumnType::Bytes)
    }
}

/// One column of a schema.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnDef {
    /// The column's name.
    pub name: String,
    /// Its type.
    #[serde(rename = "type")]
    pub ty: ColumnType,
}

/// The columns of a table, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schema {
    /// The columns.
    pub columns: Vec<ColumnDef>,
}

/// The most columns a table may have.
pub const MAX_COLUMNS: usize = 1024;

impl Schema {
    /// A schema of `columns`, checked: at least one column, at most [`MAX_COLUMNS`], names
    /// non-empty, without control characters and unique.
    pub fn new(columns: Vec<ColumnDef>) -> Result<Schema> {
        if columns.is_empty() {
            return Err(Error::InvalidInput("a table needs at least one column".into()));
        }
        if columns.len() > MAX_COLUMNS {
            return Err(Error::InvalidInput(format!("a table has at most {MAX_COLUMNS} columns, not {}", columns.len())));
        }
        for (i, c) in columns.iter().enumerate() {
            if c.name.is_empty() || c.name.len() > 255 || c.name.chars().any(|ch| ch.is_control()) {
                return Err(Error::InvalidInput(format!("invalid column name {:?} (column {})", c.name, i + 1)));
            }
            if columns[..i].iter().any(|o| o.name == c.name) {
                return Err(Error::InvalidInput(format!("column name {:?} appears twice", c.name)));
            }
        }
        Ok(Schema { columns })
    }

    /// Parses `"name:type,name:type,..."` (types as in [`ColumnType::name`]).
    pub fn parse(spec: &str) -> Result<Schema> {
        let mut cols = Vec::new();
        for (i, part) in spec.split(',').enumerate() {
            let part = part.trim();
            let (name, ty) = part.rsplit_once(':').ok_or_else(|| Error::InvalidInput(format!("schema entry {} ({part:?}) is not name:type", i + 1)))?;
            let ty = ColumnType::parse(ty.trim()).ok_or_else(|| {
                let names: Vec<_> = ColumnType::ALL.iter().map(|t| t.name()).collect();
                Error::InvalidInput(format!("schema entry {} ({part:?}): unknown type {:?}; types are {}", i + 1, ty.trim(), names.join(", ")))
            })?;
            cols.push(ColumnDef { name: name.trim().to_owned(), ty });
        }
        Schema::new(cols)
    }

    /// The number of columns.
    pub fn len(&self) -> usize {
        self.columns.len()
    }

    /// Never true for a checked schema.
    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    /// The index of column `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// `name:type,...`, the form [`parse`](Self::parse) reads.
    pub fn to_spec(&self) -> String {
        self.columns.iter().map(|c| format!("{}:{}", c.name, c.ty.name())).collect::<Vec<_>>().join(",")
    }
}

/// One value of a row.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// An `i64`.
    I64(i64),
    /// An `f64`.
    F64(f64),
    /// A date, in days since 1970-01-01.
    Date(i32),
    /// A boolean.
    Bool(bool),
    /// A string.
    Str(String),
    /// A byte string.
    Bytes(Vec<u8>),
}

impl Value {
    /// Makes `self` the string `text`, reusing the buffer it holds if it is a string.
    pub fn set_str(&mut self, text: &str) {
        match self {
            Value::Str(buf) => {
                buf.clear();
                buf.push_str(text);
            }
            _ => *self = Value::Str(text.to_owned()),
        }
    }

    /// Makes `self` the byte string `data`, reusing the buffer it holds if it is one.
    pub fn set_bytes(&mut self, data: &[u8]) {
        match self {
            Value::Bytes(buf) => {
                buf.clear();
                buf.extend_from_slice(data);
            }
            _ => *self = Value::Bytes(data.to_vec()),
        }
    }

    /// The value's type (`None` for NULL).
    pub fn ty(&self) -> Option<ColumnType> {
        match self {
            Value::Null => None,
            Value::I64(_) => Some(ColumnType::I64),
            Value::F64(_) => Some(ColumnType::F64),
            Value::Date(_) => Some(ColumnType::Date),
            Value::Bool(_) => Some(ColumnType::Bool),
            Value::Str(_) => Some(ColumnType::Str),
            Value::Bytes(_) => Some(ColumnType::Bytes),
        }
    }

    /// Bytes of the variable-size part stored in a leaf (strings of at most 12 bytes are
    /// inline in their header and take none).
    pub fn var_len(&self) -> usize {
        match self {
            Value::Str(s) if s.len() > 12 => s.len(),
            Value::Bytes(b) if b.len() > 12 => b.len(),
            _ => 0,
        }
    }
}
