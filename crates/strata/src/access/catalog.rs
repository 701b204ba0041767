//! The catalog: which columns exist and which pages hold them.
//!
//! Stored as `catalog.json` in the database directory: an 8-byte magic `STRATCAT`, a
//! little-endian CRC-32C of the rest, then JSON. Replaced atomically after the pages and the
//! allocation table are durable (so the catalog never names a page the table does not).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::btree::BTree;
use super::column::Column;
use super::graph::Graph;
use super::table::Table;
use crate::error::{Error, Result};
use crate::storage::StorageBackend;

const MAGIC: &[u8; 8] = b"STRATCAT";
/// File name of the catalog.
pub const CATALOG_FILE: &str = "catalog.json";

/// The named objects of a database.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Catalog {
    /// Columns by name.
    pub columns: BTreeMap<String, Column>,
    /// Graphs by name (absent in catalogs written before graphs existed).
    #[serde(default)]
    pub graphs: BTreeMap<String, Graph>,
    /// Key-value B+-trees by name (absent in catalogs written before trees existed).
    #[serde(default)]
    pub trees: BTreeMap<String, BTree>,
    /// Tables by name (absent in catalogs written before tables existed).
    #[serde(default)]
    pub tables: BTreeMap<String, Table>,
    /// Tables an import is creating: invisible (not in `tables`) until the import has
    /// finished; a read-write open drops those left by an import that failed or crashed,
    /// so that their pages are not lost to the database.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub loading: BTreeMap<String, Table>,
}

impl Catalog {
    /// Path of the catalog of database `dir`.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(CATALOG_FILE)
    }

    /// Encodes with magic and checksum.
    pub fn encode(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).expect("catalog serialises");
        let mut out = Vec::with_capacity(json.len() + 12);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&crc32c::crc32c(&json).to_le_bytes());
        out.extend_from_slice(&json);
        out
    }

    /// Decodes and verifies.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Catalog> {
        if bytes.len() < 12 || &bytes[..8] != MAGIC {
            return Err(Error::corruption(path, None, "catalog has no valid header"));
        }
        let stored = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
        if crc32c::crc32c(&bytes[12..]) != stored {
            return Err(Error::corruption(path, None, "catalog checksum mismatch"));
        }
        serde_json::from_slice(&bytes[12..]).map_err(|e| Error::corruption(path, None, format!("catalog does not parse: {e}")))
    }

    /// Loads the catalog of database `dir`.
    pub fn load(backend: &dyn StorageBackend, dir: &Path) -> Result<Catalog> {
        let path = Catalog::path(dir);
        if !backend.exists(&path) {
            return Err(Error::corruption(&path, None, "catalog file is missing"));
        }
        let bytes = backend.read_file(&path).map_err(|e| Error::io("read", &path, e))?;
        Catalog::decode(&bytes, &path)
    }

    /// Writes the catalog of database `dir` atomically.
    pub fn store(&self, backend: &dyn StorageBackend, dir: &Path) -> Result<()> {
        let path = Catalog::path(dir);
        backend.write_atomic(&path, &self.encode()).map_err(|e| Error::io("write", &path, e))
    }

    /// The column `name`.
    pub fn column(&self, name: &str) -> Result<&Column> {
        self.columns.get(name).ok_or_else(|| Error::NotFound { kind: "column", name: name.to_owned() })
    }

    /// The key-value tree `name`.
    pub fn tree(&self, name: &str) -> Result<&BTree> {
        self.trees.get(name).ok_or_else(|| Error::NotFound { kind: "tree", name: name.to_owned() })
    }

    /// The table `name`.
    pub fn table(&self, name: &str) -> Result<&Table> {
        self.tables.get(name).ok_or_else(|| Error::NotFound { kind: "table", name: name.to_owned() })
    }

    /// Whether any object (column, graph, tree, table) is called `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.columns.contains_key(name)
            || self.graphs.contains_key(name)
            || self.trees.contains_key(name)
            || self.tables.contains_key(name)
            || self.loading.contains_key(name)
    }

    /// The graph `name`.
    pub fn graph(&self, name: &str) -> Result<&Graph> {
        self.graphs.get(name).ok_or_else(|| Error::NotFound { kind: "graph", name: name.to_owned() })
    }
}
