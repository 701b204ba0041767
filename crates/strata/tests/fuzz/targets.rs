//! Structure-aware fuzz targets for every parser of untrusted bytes (issue 17, item 1),
//! shared by two drivers: the bounded campaign of `tests/fuzz_targets.rs` (plain
//! `cargo test`, stable Rust) and the `cargo fuzz` targets in `fuzz/` (nightly, libFuzzer).
//!
//! Each target takes the fuzzer's bytes, reads through [`arbitrary::Unstructured`] a
//! description of an input (a valid-looking file, record sequence, CSV text, SQL query ...
//! with chosen corruptions, or plain raw bytes), builds the input and feeds it to the
//! decoder or import path. The rules, checked by the drivers: no panic, no hang (every
//! input's size is bounded by construction), no single allocation sized by an unchecked
//! length field (the test driver's counting allocator), every failure a typed error
//! (the decoders' signatures). Where a target can tell, it also checks a round trip
//! (an undamaged input must decode to what was encoded) and panics if it does not.
#![allow(dead_code)]

use std::borrow::Cow;
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arbitrary::{Arbitrary, Result as AResult, Unstructured};

use strata::access::btree::node;
use strata::access::catalog::Catalog;
use strata::access::column::ColumnPage;
use strata::access::table::csv::{self, CsvOptions};
use strata::access::table::{packed, parquet as pq, pax, ColumnDef, ColumnType, Schema, Value};
use strata::access::ValueFormat;
use strata::storage::backend::OpenMode;
use strata::storage::doublewrite::DoubleWrite;
use strata::storage::wal::record::{self, Body, Compensation};
use strata::storage::wal::{CheckpointInfo, Wal, WalOptions};
use strata::storage::{page, AllocTable, Meta, PageId, SimBackend, StorageBackend};
use strata::util::SplitMix64;
use strata::{Config, Database};

/// What one execution gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The input was accepted (decoded, imported, executed).
    Accepted,
    /// Refused with a typed error.
    Refused,
    /// The fuzzer's bytes ran out before an input was built (nothing was run).
    Exhausted,
}

/// A fuzz target.
pub struct Target {
    /// Its name (also the corpus directory `tests/fuzz-corpus/<name>` and the `cargo fuzz` target).
    pub name: &'static str,
    /// Runs one input.
    pub run: fn(&[u8]) -> Verdict,
    /// Executions of the random part under plain `cargo test` (scaled by the driver).
    pub default_execs: u64,
    /// Longest fuzzer input the bounded driver generates.
    pub max_len: usize,
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target { name: "meta", run: meta, default_execs: 50_000, max_len: 256 },
    Target { name: "catalog", run: catalog, default_execs: 10_000, max_len: 1024 },
    Target { name: "alloc_table", run: alloc_table, default_execs: 20_000, max_len: 2048 },
    Target { name: "page_header", run: page_header, default_execs: 20_000, max_len: 512 },
    Target { name: "wal", run: wal, default_execs: 20_000, max_len: 4096 },
    Target { name: "doublewrite", run: doublewrite, default_execs: 20_000, max_len: 1024 },
    Target { name: "btree_node", run: btree_node, default_execs: 40_000, max_len: 4096 },
    Target { name: "pax_leaf", run: pax_leaf, default_execs: 30_000, max_len: 4096 },
    Target { name: "edge_list", run: edge_list, default_execs: 3_000, max_len: 2048 },
    Target { name: "csr", run: csr, default_execs: 2_000, max_len: 1024 },
    Target { name: "column", run: column, default_execs: 1_500, max_len: 1024 },
    Target { name: "raw_import", run: raw_import, default_execs: 3_000, max_len: 2048 },
    Target { name: "csv", run: csv_import, default_execs: 2_500, max_len: 4096 },
    Target { name: "parquet", run: parquet_import, default_execs: 1_500, max_len: 4096 },
    Target { name: "sql", run: sql, default_execs: 8_000, max_len: 1024 },
    Target { name: "database", run: database, default_execs: 1_000, max_len: 1024 },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

fn verdict<T, E>(r: Result<T, E>) -> Verdict {
    if r.is_ok() {
        Verdict::Accepted
    } else {
        Verdict::Refused
    }
}

fn exhausted<F: FnOnce(&mut Unstructured<'_>) -> AResult<Verdict>>(data: &[u8], f: F) -> Verdict {
    let mut u = Unstructured::new(data);
    f(&mut u).unwrap_or(Verdict::Exhausted)
}

// ------------------------------------------------------------------------- damage

/// A 32-bit value for a length or offset field: the interesting ones and any other.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum W32 {
    Zero,
    One,
    Max,
    Page,
    Small(u8),
    Any(u32),
}

impl W32 {
    fn get(self) -> u32 {
        match self {
            W32::Zero => 0,
            W32::One => 1,
            W32::Max => u32::MAX,
            W32::Page => 4096,
            W32::Small(v) => v as u32,
            W32::Any(v) => v,
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum W64 {
    Zero,
    One,
    Max,
    High,
    Page,
    Small(u16),
    Any(u64),
}

impl W64 {
    fn get(self) -> u64 {
        match self {
            W64::Zero => 0,
            W64::One => 1,
            W64::Max => u64::MAX,
            W64::High => 1 << 63,
            W64::Page => 4096,
            W64::Small(v) => v as u64,
            W64::Any(v) => v,
        }
    }
}

/// One corruption of a byte string (positions are taken modulo its length).
#[derive(Arbitrary, Debug, Clone)]
enum Damage {
    FlipBit(u32),
    SetByte(u32, u8),
    SetU32(u32, W32),
    SetU64(u32, W64),
    Truncate(u32),
    Extend(Vec<u8>),
    Insert(u32, Vec<u8>),
    Remove(u32, u8),
}

fn damage_one(bytes: &mut Vec<u8>, d: &Damage, focus: usize) {
    let n = bytes.len();
    // Positions land in the first `focus` bytes (where the headers and length fields
    // are) as often as anywhere.
    let pos = |p: u32| -> usize {
        if n == 0 {
            0
        } else if p & 1 == 0 {
            (p as usize >> 1) % n.min(focus.max(1))
        } else {
            (p as usize >> 1) % n
        }
    };
    match d {
        Damage::FlipBit(b) if n > 0 => {
            let at = pos(*b);
            bytes[at] ^= 1 << (b >> 29);
        }
        Damage::SetByte(at, v) if n > 0 => {
            let at = pos(*at);
            bytes[at] = *v;
        }
        Damage::SetU32(at, v) if n >= 4 => {
            let at = pos(*at).min(n - 4) & !3;
            bytes[at..at + 4].copy_from_slice(&v.get().to_le_bytes());
        }
        Damage::SetU64(at, v) if n >= 8 => {
            let at = pos(*at).min(n - 8) & !7;
            bytes[at..at + 8].copy_from_slice(&v.get().to_le_bytes());
        }
        Damage::Truncate(at) => bytes.truncate(if n == 0 { 0 } else { *at as usize % n }),
        Damage::Extend(b) => bytes.extend_from_slice(&b[..b.len().min(512)]),
        Damage::Insert(at, b) => {
            let at = pos(*at).min(n);
            bytes.splice(at..at, b[..b.len().min(512)].iter().copied());
        }
        Damage::Remove(at, k) if n > 0 => {
            let at = pos(*at);
            let end = (at + *k as usize).min(n);
            bytes.drain(at..end);
        }
        _ => {}
    }
}

/// Up to four corruptions; returns whether any was applied.
fn damage(u: &mut Unstructured<'_>, bytes: &mut Vec<u8>, focus: usize) -> AResult<bool> {
    let k = u.int_in_range(0..=4u8)?;
    for _ in 0..k {
        let d: Damage = u.arbitrary()?;
        damage_one(bytes, &d, focus);
    }
    Ok(k > 0)
}

/// Like [`damage`] but keeps the length (for fixed-size images).
fn damage_in_place(u: &mut Unstructured<'_>, bytes: &mut [u8], focus: usize) -> AResult<bool> {
    let k = u.int_in_range(0..=4u8)?;
    let n = bytes.len();
    for _ in 0..k {
        let d: Damage = u.arbitrary()?;
        let mut v = bytes.to_vec();
        damage_one(&mut v, &d, focus);
        v.resize(n, 0);
        bytes.copy_from_slice(&v[..n]);
    }
    Ok(k > 0)
}

/// At most `range.end()` of the fuzzer's bytes (as many as it picks, within what is left).
fn bytes_upto(u: &mut Unstructured<'_>, range: std::ops::RangeInclusive<usize>) -> AResult<Vec<u8>> {
    let n = u.int_in_range(range)?.min(u.len());
    Ok(u.bytes(n)?.to_vec())
}

fn crc(b: &[u8]) -> u32 {
    crc32c::crc32c(b)
}

// -------------------------------------------------------------- sample database

/// The files of a small database with every kind of object (a column, a graph, a
/// key-value tree, a table; a committed and an in-flight transaction after the last
/// checkpoint, so the log and the double-write area hold data), built once per process
/// in the in-memory simulated backend.
pub struct Sample {
    pub backend: SimBackend,
    pub dir: PathBuf,
    /// (path relative to `dir`, bytes) of every file.
    pub files: Vec<(String, Vec<u8>)>,
}

fn sim_config(dir: &Path, be: Arc<dyn StorageBackend>) -> Config {
    Config::new(dir).pool_size(1 << 20).min_page(4096).backend(be).warm_restart(false)
}

pub fn sample() -> &'static Sample {
    static S: OnceLock<Sample> = OnceLock::new();
    S.get_or_init(|| {
        let be = SimBackend::new();
        let dir = PathBuf::from("/fuzz/sample");
        let arc: Arc<dyn StorageBackend> = Arc::new(be.clone());
        let db = Database::create(sim_config(&dir, arc)).unwrap();
        let values: Vec<u8> = (0..3000u32).flat_map(|v| v.to_le_bytes()).collect();
        db.import("c", ValueFormat::U32le, &mut values.as_slice(), values.len() as u64, &mut |_| {}).unwrap();
        let edges = "# a graph\n1 2\n2 3\n3 1\n3 4\n10 4\n";
        db.import_edges("g", &mut edges.as_bytes(), &mut |_| {}).unwrap();
        let tree = db.create_tree("kv").unwrap();
        let table = db.create_table("t", Schema::parse("a:i64,s:str,d:date").unwrap()).unwrap();
        let mut tx = db.begin();
        for i in 0..100u64 {
            tree.insert(&mut tx, &i.to_be_bytes(), &vec![i as u8; (i % 40) as usize]).unwrap();
        }
        let rows: Vec<_> =
            (0..100).map(|i| vec![Value::I64(i), Value::Str(format!("row {i} {}", "s".repeat((i % 20) as usize))), Value::Date(i as i32)]).collect();
        table.append(&mut tx, &rows).unwrap();
        tx.commit().unwrap();
        db.checkpoint().unwrap();
        let mut tx = db.begin();
        for i in 100..140u64 {
            tree.insert(&mut tx, &i.to_be_bytes(), b"after the checkpoint").unwrap();
        }
        tx.commit().unwrap();
        let mut tx = db.begin();
        table.append(&mut tx, &rows[..20]).unwrap();
        std::mem::forget(tx);
        db.crash();
        let mut files = Vec::new();
        let mut stack = vec![String::new()];
        while let Some(rel) = stack.pop() {
            let p = if rel.is_empty() { dir.clone() } else { dir.join(&rel) };
            for name in be.list_dir(&p).unwrap() {
                let r = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
                match be.read_file(&dir.join(&r)) {
                    Ok(b) if be.list_dir(&dir.join(&r)).map_or(true, |l| l.is_empty()) => files.push((r, b)),
                    _ => stack.push(r),
                }
            }
        }
        files.sort();
        Sample { backend: be, dir, files }
    })
}

fn sample_file(name: &str) -> &'static [u8] {
    &sample().files.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("the sample database has no {name}")).1
}

// ------------------------------------------------------------------------ meta

#[derive(Arbitrary, Debug)]
struct MetaDesc {
    version: W32,
    shift: u8,
    any_shift: Option<u32>,
    created: u64,
    reserved: u32,
    reseal: bool,
}

fn meta_bytes(u: &mut Unstructured<'_>) -> AResult<Vec<u8>> {
    if u.ratio(1, 5)? {
        return bytes_upto(u, 0..=64);
    }
    let d: MetaDesc = u.arbitrary()?;
    let mut b = vec![0u8; 32];
    b[0..8].copy_from_slice(b"STRATADB");
    let version = if u.ratio(1, 2)? { 1 } else { d.version.get() };
    b[8..12].copy_from_slice(&version.to_le_bytes());
    let shift = d.any_shift.unwrap_or(9 + (d.shift as u32 % 24));
    b[12..16].copy_from_slice(&shift.to_le_bytes());
    b[16..24].copy_from_slice(&d.created.to_le_bytes());
    b[24..28].copy_from_slice(&d.reserved.to_le_bytes());
    let c = crc(&b[..28]);
    b[28..32].copy_from_slice(&c.to_le_bytes());
    if damage(u, &mut b, 32)? && d.reseal && b.len() >= 32 {
        let c = crc(&b[..28]);
        b[28..32].copy_from_slice(&c.to_le_bytes());
    }
    Ok(b)
}

/// The meta file decoder.
pub fn meta(data: &[u8]) -> Verdict {
    exhausted(data, |u| {
        let b = meta_bytes(u)?;
        let r = Meta::decode(&b, Path::new("/db/strata.meta"));
        if let Ok(m) = &r {
            assert_eq!(Meta::decode(&m.encode(), Path::new("x")).ok(), Some(*m), "meta round trip");
        }
        Ok(verdict(r))
    })
}

// --------------------------------------------------------------------- catalog

/// A JSON value from a small grammar that knows the catalog's keys.
fn json_value(u: &mut Unstructured<'_>, depth: u32) -> AResult<serde_json::Value> {
    use serde_json::Value as J;
    const KEYS: &[&str] = &[
        "columns",
        "graphs",
        "trees",
        "tables",
        "format",
        "pages",
        "count",
        "pid",
        "root",
        "schema",
        "name",
        "type",
        "vertices",
        "edges",
        "index_space",
        "renumbered",
        "neighbour_format",
        "offsets",
        "neighbours",
        "exists",
        "ids",
        "columns",
        "U32le",
        "I64le",
        "str",
        "i64",
    ];
    let choice = if depth == 0 { u.int_in_range(0..=4u8)? } else { u.int_in_range(0..=7u8)? };
    Ok(match choice {
        0 => J::Null,
        1 => J::Bool(u.arbitrary()?),
        2 => {
            let text = match u.int_in_range(0..=6u8)? {
                0 => "18446744073709551615".to_owned(),
                1 => "18446744073709551616".to_owned(),
                2 => "-1".to_owned(),
                3 => "1e400".to_owned(),
                4 => "0.5".to_owned(),
                5 => format!("{}", u.arbitrary::<u32>()?),
                _ => format!("{}", u.arbitrary::<u64>()?),
            };
            serde_json::from_str(&text).unwrap_or(J::Null)
        }
        3 => J::String(if u.arbitrary()? { KEYS[u.choose_index(KEYS.len())?].to_owned() } else { u.arbitrary::<String>()?.chars().take(40).collect() }),
        4 => J::Array(Vec::new()),
        5 | 6 => {
            let mut m = serde_json::Map::new();
            for _ in 0..u.int_in_range(0..=4u8)? {
                let k = if u.ratio(4, 5)? { KEYS[u.choose_index(KEYS.len())?].to_owned() } else { u.arbitrary::<String>()?.chars().take(20).collect() };
                m.insert(k, json_value(u, depth - 1)?);
            }
            J::Object(m)
        }
        _ => {
            let mut a = Vec::new();
            for _ in 0..u.int_in_range(0..=4u8)? {
                a.push(json_value(u, depth - 1)?);
            }
            J::Array(a)
        }
    })
}

/// Replaces, removes or duplicates one node of `v` chosen by `u`.
fn mutate_json(u: &mut Unstructured<'_>, v: &mut serde_json::Value) -> AResult<()> {
    use serde_json::Value as J;
    let here = match v {
        J::Object(m) if !m.is_empty() => !u.ratio(3, 4)?,
        J::Array(a) if !a.is_empty() => !u.ratio(3, 4)?,
        _ => true,
    };
    if here {
        *v = json_value(u, 3)?;
        return Ok(());
    }
    match v {
        J::Object(m) => {
            let keys: Vec<String> = m.keys().cloned().collect();
            let k = &keys[u.choose_index(keys.len())?];
            match u.int_in_range(0..=5u8)? {
                0 => {
                    m.remove(k);
                }
                1 => {
                    let val = m[k].clone();
                    m.insert(format!("{k}x"), val);
                }
                _ => mutate_json(u, m.get_mut(k).unwrap())?,
            }
        }
        J::Array(a) => {
            let i = u.choose_index(a.len())?;
            match u.int_in_range(0..=5u8)? {
                0 => {
                    a.remove(i);
                }
                1 => {
                    let val = a[i].clone();
                    a.insert(i, val);
                }
                _ => mutate_json(u, &mut a[i])?,
            }
        }
        _ => unreachable!(),
    }
    Ok(())
}

fn catalog_bytes(u: &mut Unstructured<'_>, base: &[u8]) -> AResult<Vec<u8>> {
    if u.ratio(1, 8)? {
        return bytes_upto(u, 0..=256);
    }
    let mut json: serde_json::Value = serde_json::from_slice(&base[12..]).expect("the sample catalog is JSON");
    for _ in 0..u.int_in_range(1..=3u8)? {
        mutate_json(u, &mut json)?;
    }
    let mut text = serde_json::to_vec(&json).unwrap();
    if u.ratio(1, 6)? {
        damage(u, &mut text, 64)?;
    }
    let mut out = b"STRATCAT".to_vec();
    let c = if u.ratio(1, 10)? { u.arbitrary()? } else { crc(&text) };
    out.extend_from_slice(&c.to_le_bytes());
    out.extend_from_slice(&text);
    Ok(out)
}

/// The catalog decoder (magic, checksum, JSON into the catalog's types).
pub fn catalog(data: &[u8]) -> Verdict {
    exhausted(data, |u| {
        let b = catalog_bytes(u, sample_file("catalog.json"))?;
        let r = Catalog::decode(&b, Path::new("/db/catalog.json"));
        if let Ok(c) = &r {
            assert_eq!(Catalog::decode(&c.encode(), Path::new("x")).ok().as_ref(), Some(c), "catalog round trip");
        }
        Ok(verdict(r))
    })
}

// ---------------------------------------------------------------- alloc table

const AT_BLOCK: usize = 4096;
const AT_HEAD: usize = 16;

#[derive(Arbitrary, Debug)]
struct AtEntry {
    class: u8,
    claimed: Option<W32>,
    words: Vec<u64>,
}

/// Seals `stream` into checksummed allocation-table blocks, with optional wrong block
/// numbers and counts.
fn at_blocks(stream: &[u8], wrong_no: Option<(usize, u32)>, wrong_count: Option<u32>) -> Vec<u8> {
    let payload = AT_BLOCK - AT_HEAD;
    let n = stream.len().div_ceil(payload).max(1);
    let mut out = vec![0u8; n * AT_BLOCK];
    for (b, block) in out.chunks_exact_mut(AT_BLOCK).enumerate() {
        let chunk = stream.get(b * payload..((b + 1) * payload).min(stream.len())).unwrap_or(&[]);
        block[4..8].copy_from_slice(b"SAT1");
        let no = match wrong_no {
            Some((k, v)) if k % n == b => v,
            _ => b as u32,
        };
        block[8..12].copy_from_slice(&no.to_le_bytes());
        block[12..16].copy_from_slice(&wrong_count.unwrap_or(n as u32).to_le_bytes());
        block[AT_HEAD..AT_HEAD + chunk.len()].copy_from_slice(chunk);
        let c = crc(&block[4..]);
        block[0..4].copy_from_slice(&c.to_le_bytes());
    }
    out
}

fn reseal_at(bytes: &mut [u8]) {
    for block in bytes.chunks_exact_mut(AT_BLOCK) {
        let c = crc(&block[4..]);
        block[0..4].copy_from_slice(&c.to_le_bytes());
    }
}

fn alloc_table_bytes(u: &mut Unstructured<'_>) -> AResult<(Vec<u8>, usize)> {
    let n_classes = u.int_in_range(1..=30usize)?;
    let b = match u.int_in_range(0..=9u8)? {
        0 => bytes_upto(u, 0..=64)?,
        1 | 2 => {
            // The sample's table, damaged and (usually) resealed.
            let mut b = sample_file("alloc.table").to_vec();
            damage(u, &mut b, 64)?;
            if u.ratio(3, 4)? {
                reseal_at(&mut b);
            }
            b
        }
        _ => {
            let entries: Vec<AtEntry> = u.arbitrary()?;
            let mut s = Vec::new();
            let n = if u.ratio(1, 6)? { u.arbitrary::<W32>()?.get() } else { entries.len() as u32 };
            s.extend_from_slice(&n.to_le_bytes());
            for e in entries.iter().take(40) {
                s.push(e.class % (n_classes as u8 + 2));
                let words = &e.words[..e.words.len().min(600)];
                s.extend_from_slice(&e.claimed.map_or(words.len() as u32, W32::get).to_le_bytes());
                for w in words {
                    s.extend_from_slice(&w.to_le_bytes());
                }
            }
            let wrong_no = if u.ratio(1, 10)? { Some((u.arbitrary::<u8>()? as usize, u.arbitrary::<W32>()?.get())) } else { None };
            let wrong_count = if u.ratio(1, 10)? { Some(u.arbitrary::<W32>()?.get()) } else { None };
            let mut b = at_blocks(&s, wrong_no, wrong_count);
            if u.ratio(1, 5)? {
                damage(u, &mut b, 64)?;
            }
            b
        }
    };
    Ok((b, n_classes))
}

/// The allocation table decoder (blocks, checksums, the bitmap stream).
pub fn alloc_table(data: &[u8]) -> Verdict {
    exhausted(data, |u| {
        let (b, n) = alloc_table_bytes(u)?;
        let r = AllocTable::decode(&b, n, Path::new("/db/alloc.table"));
        if let Ok(t) = &r {
            let again = AllocTable::decode(&t.encode(), n, Path::new("x")).expect("alloc table round trip");
            for (a, b) in t.classes.iter().zip(&again.classes) {
                assert_eq!(a.allocated(), b.allocated(), "alloc table round trip");
            }
        }
        Ok(verdict(r))
    })
}

// ----------------------------------------------------------------- page header

/// The page header verifier on sealed page images with damaged headers and payloads.
pub fn page_header(data: &[u8]) -> Verdict {
    exhausted(data, |u| {
        let size = if u.arbitrary()? { 4096 } else { 8192 };
        let mut img = vec![0u8; size];
        let pid = PageId::from_raw(u.arbitrary::<W64>()?.get());
        if u.ratio(1, 6)? {
            let raw = &bytes_upto(u, 0..=size)?;
            img[..raw.len()].copy_from_slice(raw);
        } else {
            let fill = &bytes_upto(u, 0..=64)?;
            for (i, b) in img[32..].iter_mut().enumerate() {
                *b = fill.get(i % fill.len().max(1)).copied().unwrap_or(0);
            }
            page::seal(&mut img, pid, u.arbitrary::<W64>()?.get());
            damage_in_place(u, &mut img, 32)?;
        }
        let asked = if u.ratio(4, 5)? { pid } else { PageId::from_raw(u.arbitrary::<W64>()?.get()) };
        let _ = page::Header::parse(&img);
        Ok(verdict(page::verify(&img, asked)))
    })
}

// ------------------------------------------------------------------------- wal

#[derive(Arbitrary, Debug)]
enum ArbBody {
    Update { pid: u64, offset: u32, zeros: bool, after: Vec<u8> },
    Alloc(u64),
    Free(u64),
    Commit,
    Abort,
    ClrWrite { undo_next: u64, pid: u64, offset: u32, bytes: Vec<u8> },
    ClrFree { undo_next: u64, pid: u64 },
    ClrReclaim { undo_next: u64, pid: u64 },
    Flush(u64),
}

impl ArbBody {
    fn body(&self) -> Body<'static> {
        let p = PageId::from_raw;
        match self {
            ArbBody::Update { pid, offset, zeros, after } => {
                let after = after[..after.len().min(300)].to_vec();
                let before = if *zeros { vec![0; after.len()] } else { after.iter().map(|b| b ^ 0x5a).collect() };
                Body::Update { pid: p(*pid), offset: *offset, before: Cow::Owned(before), after: Cow::Owned(after) }
            }
            ArbBody::Alloc(pid) => Body::Alloc { pid: p(*pid) },
            ArbBody::Free(pid) => Body::Free { pid: p(*pid) },
            ArbBody::Commit => Body::Commit,
            ArbBody::Abort => Body::Abort,
            ArbBody::ClrWrite { undo_next, pid, offset, bytes } => Body::Clr {
                undo_next: *undo_next,
                action: Compensation::Write { pid: p(*pid), offset: *offset, bytes: Cow::Owned(bytes[..bytes.len().min(300)].to_vec()) },
            },
            ArbBody::ClrFree { undo_next, pid } => Body::Clr { undo_next: *undo_next, action: Compensation::Free { pid: p(*pid) } },
            ArbBody::ClrReclaim { undo_next, pid } => Body::Clr { undo_next: *undo_next, action: Compensation::Reclaim { pid: p(*pid) } },
            ArbBody::Flush(d) => Body::Flush { durable_before: *d },
        }
    }
}

/// A corruption of one record that keeps its checksum valid (so the body parser is
/// reached): a field overwritten, then the record's CRC recomputed.
#[derive(Arbitrary, Debug)]
struct SealedDamage {
    record: u8,
    at: u16,
    value: W32,
    wide: Option<W64>,
}

/// Walks `bytes` record by record from `lsn` as recovery's end-of-log scan does; checks
/// that every decoded record re-encodes to one that decodes the same.
fn walk(bytes: &[u8], mut lsn: u64) -> usize {
    let (mut at, mut n) = (0usize, 0);
    while at < bytes.len() {
        match record::decode(&bytes[at..], lsn) {
            Ok(rec) => {
                // Readers step by the length field (a full update over zeros, as older
                // builds wrote it, re-encodes shorter).
                let len = record::claimed_len(&bytes[at..]).expect("a decoded record has a length");
                assert!(record::HEADER_LEN + rec.body.encoded_len() <= len, "a record re-encodes at most as long as it is");
                let mut again = Vec::new();
                record::encode(&mut again, rec.lsn, rec.txid, rec.prev_lsn, &rec.body);
                // An update over zeros written as a plain update decodes to the same body
                // but re-encodes shorter: compare what decodes, not the bytes.
                assert_eq!(record::decode(&again, lsn).as_ref(), Ok(&rec), "log record round trip");
                at += len;
                lsn += len as u64;
                n += 1;
            }
            Err(_) => break,
        }
    }
    n
}

/// Log records and segments: a valid record sequence with chosen corruptions, decoded
/// record by record, then laid out as segments (with the checkpoint record) in a simulated
/// directory and opened as the log (end-of-log and torn-tail detection) and read back.
pub fn wal(data: &[u8]) -> Verdict {
    exhausted(data, |u| {
        let start = if u.ratio(3, 4)? { 1 } else { 1 + u.arbitrary::<u32>()? as u64 };
        let mut bytes = Vec::new();
        let mut starts = Vec::new();
        if u.ratio(1, 8)? {
            bytes = bytes_upto(u, 0..=512)?;
        } else {
            let bodies: Vec<ArbBody> = u.arbitrary()?;
            let mut lsn = start;
            for (i, b) in bodies.iter().take(24).enumerate() {
                starts.push(bytes.len());
                let prev = if i == 0 { 0 } else { lsn - 1 };
                lsn += record::encode(&mut bytes, lsn, u.int_in_range(0..=3u64)?, prev, &b.body()) as u64;
            }
            for _ in 0..u.int_in_range(0..=2u8)? {
                let d: SealedDamage = u.arbitrary()?;
                if starts.is_empty() {
                    break;
                }
                let k = d.record as usize % starts.len();
                let (s, e) = (starts[k], starts.get(k + 1).copied().unwrap_or(bytes.len()));
                let len = e - s;
                match d.wide {
                    Some(w) if len >= 8 => {
                        let at = s + (d.at as usize % (len - 7));
                        bytes[at..at + 8].copy_from_slice(&w.get().to_le_bytes());
                    }
                    _ if len >= 4 => {
                        // Mostly the length field and the body's length words.
                        let at = if d.at & 1 == 0 { s + 4 } else { s + (d.at as usize >> 1) % (len - 3) };
                        bytes[at..at + 4].copy_from_slice(&d.value.get().to_le_bytes());
                    }
                    _ => {}
                }
                let end = (s + record::claimed_len(&bytes[s..]).unwrap_or(len)).min(bytes.len());
                if end >= s + 4 {
                    let c = crc(&bytes[s + 4..end]);
                    bytes[s..s + 4].copy_from_slice(&c.to_le_bytes());
                }
            }
            damage(u, &mut bytes, 64)?;
        }
        let decoded = walk(&bytes, start);

        // The same bytes as the log of a database directory.
        let be = Arc::new(SimBackend::new());
        let dir = Path::new("/fuzz/wal-db");
        let wal_dir = dir.join("wal");
        be.create_dir_all(&wal_dir).unwrap();
        let split = if starts.len() > 1 && u.ratio(1, 3)? { starts[1 + u.choose_index(starts.len() - 1)?] } else { bytes.len() };
        let split = if u.ratio(1, 10)? { u.int_in_range(0..=bytes.len())? } else { split.min(bytes.len()) };
        let write = |lsn: u64, b: &[u8]| {
            let f = be.open(&wal_dir.join(format!("{lsn:016x}.log")), OpenMode::Buffered, true).unwrap();
            f.write_at(b, 0).unwrap();
            f.sync().unwrap();
        };
        write(start, &bytes[..split]);
        if split < bytes.len() {
            let gap = if u.ratio(1, 5)? { u.int_in_range(0..=64u64)? } else { 0 };
            write(start + split as u64 + gap, &bytes[split..]);
        }
        let from = if u.ratio(3, 4)? || starts.is_empty() { start } else { start + starts[u.choose_index(starts.len())?] as u64 };
        let mut ck = b"SCK1".to_vec();
        ck.extend_from_slice(&from.to_le_bytes());
        ck.extend_from_slice(&u.arbitrary::<u64>()?.to_le_bytes());
        ck.extend_from_slice(&u.arbitrary::<u64>()?.to_le_bytes());
        let c = crc(&ck);
        ck.extend_from_slice(&c.to_le_bytes());
        if u.ratio(1, 4)? {
            damage(u, &mut ck, 32)?;
        }
        be.write_atomic(&wal_dir.join("checkpoint"), &ck).unwrap();
        let ckpt = CheckpointInfo::load(be.as_ref(), dir);
        let opts = WalOptions { segment_size: 4096, group_commit: false };
        let from = match ckpt {
            Ok(Some(c)) => c.start_lsn,
            _ => from,
        };
        let r = Wal::open(be.clone(), dir, from, opts).and_then(|w| {
            let mut n = 0;
            for rec in w.reader(from) {
                rec?;
                n += 1;
                assert!(n <= 1 + bytes.len() / record::HEADER_LEN, "the log reader returned more records than fit its bytes");
            }
            Ok(())
        });
        Ok(if decoded > 0 && r.is_ok() { Verdict::Accepted } else { verdict(r) })
    })
}

// ----------------------------------------------------------------- double-write

#[derive(Arbitrary, Debug)]
struct DwEntry {
    pid: u64,
    lsn: u64,
    big: bool,
    fill: u8,
    off: Option<W64>,
    size: Option<W64>,
    tear: bool,
}

/// The double-write area's reader (`saved`) on a batch with chosen corruptions.
pub fn doublewrite(data: &[u8]) -> Verdict {
    exhausted(data, |u| {
        let bytes = if u.ratio(1, 8)? {
            let mut b = bytes_upto(u, 0..=128)?;
            b.resize(if u.arbitrary()? { 4096 } else { 4096 + b.len() }, 0);
            b
        } else {
            let entries: Vec<DwEntry> = u.arbitrary()?;
            let entries = &entries[..entries.len().min(6)];
            let count = if u.ratio(1, 8)? { u.arbitrary::<W32>()?.get() as usize } else { entries.len() };
            let hlen = (16 + 24 * entries.len()).next_multiple_of(4096);
            let mut h = vec![0u8; hlen];
            h[0..4].copy_from_slice(b"SDW1");
            h[8..12].copy_from_slice(&(count as u32).to_le_bytes());
            let claimed_hlen = if u.ratio(1, 8)? { u.arbitrary::<W32>()?.get() } else { hlen as u32 };
            h[12..16].copy_from_slice(&claimed_hlen.to_le_bytes());
            let mut images = Vec::new();
            let mut off = hlen as u64;
            for (i, e) in entries.iter().enumerate() {
                let size = if e.big { 8192 } else { 4096 };
                let mut img = vec![e.fill; size];
                page::seal(&mut img, PageId::from_raw(e.pid), e.lsn);
                if e.tear {
                    img[size / 2] ^= 0xff;
                }
                let at = 16 + 24 * i;
                h[at..at + 8].copy_from_slice(&e.pid.to_le_bytes());
                h[at + 8..at + 16].copy_from_slice(&e.off.map_or(off, W64::get).to_le_bytes());
                h[at + 16..at + 24].copy_from_slice(&e.size.map_or(size as u64, W64::get).to_le_bytes());
                off += size as u64;
                images.extend_from_slice(&img);
            }
            let c = crc(&h[8..]);
            h[4..8].copy_from_slice(&c.to_le_bytes());
            h.extend_from_slice(&images);
            if u.ratio(1, 4)? {
                damage(u, &mut h, 64)?;
            }
            h
        };
        let be = SimBackend::new();
        let dir = Path::new("/fuzz/dw");
        be.create_dir_all(dir).unwrap();
        let f = be.open(&dir.join("doublewrite.pages"), OpenMode::Buffered, true).unwrap();
        f.write_at(&bytes, 0).unwrap();
        f.sync().unwrap();
        drop(f);
        let r = DoubleWrite::open(&be, dir).and_then(|d| d.saved());
        if let Ok(saved) = &r {
            for s in saved {
                assert_eq!(page::verify(&s.image, s.pid), Ok(s.lsn), "a saved image verifies");
            }
        }
        Ok(match r {
            Ok(v) if v.is_empty() => Verdict::Refused,
            r => verdict(r),
        })
    })
}

// ------------------------------------------------------------------ B+-tree node

/// B+-tree node images (leaf and inner) built from arbitrary sorted entries, damaged, then
/// searched and decoded as readers do (optimistically: an impossible value is a restart).
pub fn btree_node(data: &[u8]) -> Verdict {
    exhausted(data, |u| {
        let size = if u.ratio(3, 4)? { 4096 - 32 } else { 8192 - 32 };
        let leaf = u.arbitrary::<bool>()?;
        let mut e = node::Entries::default();
        let (img, built) = if u.ratio(1, 8)? {
            let mut img = vec![0u8; size];
            let raw = &bytes_upto(u, 0..=size)?;
            img[..raw.len()].copy_from_slice(raw);
            (img, false)
        } else {
            let mut kvs: Vec<(Vec<u8>, Vec<u8>, u64)> = u.arbitrary()?;
            for kv in &mut kvs {
                kv.0.truncate(node::MAX_KEY.min(200));
                kv.1.truncate(300);
            }
            kvs.sort_by(|a, b| a.0.cmp(&b.0));
            kvs.dedup_by(|a, b| a.0 == b.0);
            for (k, v, w) in &kvs {
                let mut next = e.clone();
                if leaf {
                    next.push(k, v, v.len() as u64);
                } else {
                    next.push(k, &[], *w);
                }
                if node::need(&next, 0..next.len(), leaf) > node::room(size) {
                    break;
                }
                e = next;
            }
            let kind = if leaf { node::KIND_LEAF } else { node::KIND_INNER };
            (node::build(size, kind, &e, 0..e.len(), u.arbitrary()?, [u.arbitrary()?, u.arbitrary()?]), true)
        };
        let mut img = img;
        let damaged = damage_in_place(u, &mut img, node::HDR + 16 * node::SLOT)?;
        let key: Vec<u8> = u.arbitrary()?;
        let mut buf = Vec::new();
        // The descent's search reads word 0 alone (no header check): it must stay in bounds.
        let w0 = u64::from_le_bytes(img[..8].try_into().unwrap());
        if let Ok(count) = node::slot_count(&img[..], w0) {
            let fences = node::Fences { lo: u.arbitrary()?, hi: u.arbitrary()? };
            if let Ok((i, _, _)) = node::inner_child_at(&img[..], count, &key, fences, &mut buf) {
                assert!(i <= count, "child index {i} beyond {count} slots");
            }
            if let Ok((i, _)) = node::lower_bound_in(&img[..], count, &key, fences, &mut buf) {
                assert!(i <= count, "slot index {i} beyond {count} slots");
            }
        }
        let Ok(h) = node::header(&img[..]) else { return Ok(Verdict::Refused) };
        let lower = node::lower_bound(&img[..], h.count, &key, &mut buf);
        let upper = node::upper_bound(&img[..], h.count, &key, &mut buf);
        let child = node::inner_child(&img[..], &h, &key, &mut buf);
        if built && !damaged {
            // A sorted node: the interpolating search finds what bisection finds.
            assert_eq!(lower, node::lower_bound_bisect(&img[..], h.count, &key, &mut buf), "lower bound");
            assert_eq!(upper, node::upper_bound_bisect(&img[..], h.count, &key, &mut buf), "upper bound");
            assert_eq!(lower.map(|(i, _)| i), Ok((0..e.len()).take_while(|&i| e.key(i) < &key[..]).count()), "lower bound");
            let hinted = node::inner_child_at(&img[..], h.count, &key, node::Fences::default(), &mut buf);
            assert_eq!(child, hinted.map(|(i, c, _)| (i, c)), "child");
        }
        let r = node::decode(&img);
        if built && !damaged {
            let (_, d) = r.as_ref().expect("an undamaged node decodes");
            assert_eq!(d.len(), e.len(), "node round trip");
            for i in 0..d.len() {
                assert_eq!(d.key(i), e.key(i), "node round trip");
            }
        }
        Ok(verdict(r))
    })
}

// ---------------------------------------------------------------------- PAX leaf

fn arb_type(u: &mut Unstructured<'_>) -> AResult<ColumnType> {
    Ok([ColumnType::I64, ColumnType::F64, ColumnType::Date, ColumnType::Bool, ColumnType::Str, ColumnType::Bytes][u.choose_index(6)?])
}

fn arb_value(u: &mut Unstructured<'_>, ty: ColumnType) -> AResult<Value> {
    if u.ratio(1, 6)? {
        return Ok(Value::Null);
    }
    Ok(match ty {
        ColumnType::I64 => Value::I64(u.arbitrary()?),
        ColumnType::F64 => Value::F64(u.arbitrary()?),
        ColumnType::Date => Value::Date(u.arbitrary()?),
        ColumnType::Bool => Value::Bool(u.arbitrary()?),
        ColumnType::Str => {
            let s: String = u.arbitrary()?;
            Value::Str(s.chars().take(if u.ratio(1, 10)? { 2000 } else { 30 }).collect())
        }
        ColumnType::Bytes => {
            let b: Vec<u8> = u.arbitrary()?;
            Value::Bytes(b[..b.len().min(100)].to_vec())
        }
    })
}

fn arb_schema(u: &mut Unstructured<'_>, max: usize) -> AResult<Schema> {
    let n = u.int_in_range(1..=max)?;
    let mut cols = Vec::new();
    for i in 0..n {
        cols.push(ColumnDef { name: format!("c{i}"), ty: arb_type(u)? });
    }
    Ok(Schema::new(cols).expect("a valid schema"))
}

/// PAX table leaves built from an arbitrary schema and rows, damaged, then read (header,
/// every row, verify, the in-place append planner).
pub fn pax_leaf(data: &[u8]) -> Verdict {
    exhausted(data, |u| {
        let schema = arb_schema(u, 6)?;
        let size = if u.ratio(3, 4)? { 4096 - 32 } else { 16384 - 32 };
        let mut rows = Vec::new();
        for _ in 0..u.int_in_range(1..=60u32)? {
            let mut r = Vec::new();
            for c in &schema.columns {
                r.push(arb_value(u, c.ty)?);
            }
            rows.push(r);
        }
        packed_leaf(data, &schema, size, &rows);
        let mut img = if u.ratio(1, 8)? {
            let mut img = vec![0u8; size];
            let raw = &bytes_upto(u, 0..=size)?;
            img[..raw.len()].copy_from_slice(raw);
            img
        } else {
            let (n, cap) = pax::plan(&schema, size, &rows);
            if n == 0 {
                return Ok(Verdict::Refused);
            }
            let cap = if u.ratio(1, 4)? { n.max(cap.saturating_sub(u.int_in_range(0..=3)?)) } else { cap };
            rows.truncate(n);
            pax::build(size, &schema, u.arbitrary()?, cap, &rows)
        };
        damage_in_place(u, &mut img, 128)?;
        let Ok(leaf) = pax::header(&img[..], &schema) else { return Ok(Verdict::Refused) };
        let mut out = Vec::new();
        for i in 0..leaf.count.min(80) {
            let _ = pax::read_row(&img[..], &schema, &leaf, i, &mut out);
        }
        let r = pax::verify(&img, &schema, &leaf);
        let _ = pax::fit_in_place(&schema, &leaf, &rows[..rows.len().min(3)]);
        Ok(verdict(r))
    })
}

/// Packed leaves whose strings were compressed (`packed::TAG_FSST`), for the check that
/// the fuzz targets reach that decoder.
pub static PACKED_COMPRESSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

const WORDS: [&str; 24] = [
    "furious",
    "sly",
    "careful",
    "ideas",
    "foxes",
    "pinto beans",
    "sleep",
    "cajole",
    "haggle",
    "blithely",
    "quickly",
    "according to",
    "among",
    "the",
    "final",
    "regular",
    "deposits",
    "requests",
    "accounts",
    "packages",
    "ironic",
    "even",
    "theodolites",
    "excuses",
];

/// The packed form of the same rows (`pax_leaf`'s second half, consuming no input so that
/// the corpus keeps its meaning): it expands into the rows, and damaged copies (bytes
/// changed by a generator seeded from the input) expand or fail, never panic. Then the
/// same with every string replaced by text from a small vocabulary (seeded from the
/// input), which compresses, so that the compressed-strings decoder is fuzzed too.
fn packed_leaf(data: &[u8], schema: &Schema, size: usize, rows: &[Vec<Value>]) {
    packed_leaf_of(data, schema, size, rows);
    let mut r = SplitMix64(data.iter().fold(17u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3)));
    let mut words = |len: usize| -> String {
        let mut s = String::new();
        while s.len() < len {
            s.push_str(WORDS[r.below(WORDS.len() as u64) as usize]);
            s.push(' ');
        }
        s
    };
    let worded: Vec<Vec<Value>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|v| match v {
                    Value::Str(s) => Value::Str(words(20 + s.len().min(200) * 2)),
                    Value::Bytes(b) => Value::Bytes(words(20 + b.len() * 2).into_bytes()),
                    v => v.clone(),
                })
                .collect()
        })
        .collect();
    packed_leaf_of(data, schema, size, &worded);
}

fn packed_leaf_of(data: &[u8], schema: &Schema, size: usize, rows: &[Vec<Value>]) {
    let (n, _) = packed::fit(schema, size, rows, true);
    if n == 0 {
        return;
    }
    let good = packed::encode(size, schema, 3, &rows[..n], n < rows.len(), true);
    let mut out = Vec::new();
    let leaf = packed::expand(&good, schema, None, &mut out).expect("a packed image expands");
    let mut row = Vec::new();
    for (i, want) in rows[..n].iter().enumerate() {
        pax::read_row(&out[..], schema, &leaf, i, &mut row).expect("an expanded row reads");
        assert_eq!(format!("{row:?}"), format!("{want:?}"), "row {i} of a packed leaf");
    }
    let used = packed::header(&good[..], schema).expect("a packed header").used;
    if packed::encodings(&good, schema).expect("a packed leaf's blocks").contains(&packed::TAG_FSST) {
        PACKED_COMPRESSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let mut r = SplitMix64(data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3)));
    for _ in 0..4 {
        let mut img = good.clone();
        for _ in 0..1 + r.below(6) {
            let at = r.below(used as u64) as usize;
            img[at] = if r.below(2) == 0 { img[at] ^ (1 << r.below(8)) } else { r.below(256) as u8 };
        }
        let need: Vec<bool> = (0..schema.len()).map(|_| r.below(2) == 0).collect();
        if let Ok(leaf) = packed::expand(&img, schema, Some(&need), &mut out) {
            let _ = pax::verify(&out, schema, &leaf);
        }
        let _ = packed::read_row(&img[..], schema, r.below(n as u64 + 1) as usize, &mut row);
    }
}

// ------------------------------------------------- databases of the import targets

thread_local! {
    /// A small database per thread for the import targets (simulated backend), replaced
    /// every few hundred uses so that what the imports leave stays small.
    static DB: RefCell<Option<(Database, u64)>> = const { RefCell::new(None) };
}

fn with_db<T>(f: impl FnOnce(&Database, u64) -> T) -> T {
    DB.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(_, n)| *n >= 200) {
            if let Some((db, _)) = slot.take() {
                db.crash();
            }
            let be: Arc<dyn StorageBackend> = Arc::new(SimBackend::new());
            let db = Database::create(sim_config(Path::new("/fuzz/import"), be)).unwrap();
            let table = db.create_table("t", Schema::parse("id:i64,a:i64,b:f64,d:date,f:bool,s:str").unwrap()).unwrap();
            let mut tx = db.begin();
            let rows: Vec<Vec<Value>> = (0..24)
                .map(|i| {
                    let n = |v: Value| if i % 5 == 3 { Value::Null } else { v };
                    vec![
                        Value::I64(i),
                        n(Value::I64(i * 7 - 50)),
                        n(Value::F64(i as f64 / 3.0 - 2.0)),
                        n(Value::Date(i as i32 * 400 - 3000)),
                        n(Value::Bool(i % 2 == 0)),
                        n(Value::Str(format!("s{i}{}", "é".repeat(i as usize % 4)))),
                    ]
                })
                .collect();
            table.append(&mut tx, &rows).unwrap();
            tx.commit().unwrap();
            db.create_table("empty", Schema::parse("x:i64").unwrap()).unwrap();
            *slot = Some((db, 0));
        }
        let (db, n) = slot.as_mut().unwrap();
        *n += 1;
        f(db, *n)
    })
}

// -------------------------------------------------------------------- edge list

fn number(u: &mut Unstructured<'_>) -> AResult<String> {
    Ok(match u.int_in_range(0..=9u8)? {
        0..=4 => u.int_in_range(0..=40u64)?.to_string(),
        5 => u.arbitrary::<u16>()?.to_string(),
        6 => (u64::MAX - u.int_in_range(0..=3u64)?).to_string(),
        7 => "18446744073709551616".into(),
        8 => format!("{:0>30}", u.int_in_range(0..=9u8)?),
        _ => ["-1", "1.5", "x", "+3", "0x10", "1e3", "١"][u.choose_index(7)?].into(),
    })
}

fn edge_text(u: &mut Unstructured<'_>) -> AResult<Vec<u8>> {
    if u.ratio(1, 8)? {
        return bytes_upto(u, 0..=512);
    }
    let mut t = Vec::new();
    for _ in 0..u.int_in_range(0..=40u8)? {
        let sep = [" ", "\t", "  ", " \t "][u.choose_index(4)?];
        match u.int_in_range(0..=11u8)? {
            0 => t.extend_from_slice(b"# comment"),
            1 => {}
            2 => t.extend_from_slice(format!("{}{sep}{}{sep}{}", number(u)?, number(u)?, number(u)?).as_bytes()),
            3 => t.extend_from_slice(number(u)?.as_bytes()),
            4 => t.extend_from_slice(format!("{}{sep}{} # trailing", number(u)?, number(u)?).as_bytes()),
            5 => {
                // A line longer than the reader's limit (64 KiB), as a comment or not.
                if u.arbitrary()? {
                    t.push(b'#');
                }
                t.extend(std::iter::repeat_n(b'7', (64 << 10) + 2));
            }
            6 => t.extend_from_slice(&bytes_upto(u, 0..=8)?),
            _ => t.extend_from_slice(format!("{sep}{}{sep}{}", number(u)?, number(u)?).as_bytes()),
        }
        t.extend_from_slice(if u.ratio(1, 5)? { b"\r\n" } else { b"\n" });
    }
    if u.ratio(1, 4)? {
        t.pop();
    }
    Ok(t)
}

/// The edge-list import (text reader, parser, CSR build), then the graph's own check and a
/// BFS over it.
pub fn edge_list(data: &[u8]) -> Verdict {
    exhausted(data, |u| {
        let text = edge_text(u)?;
        let source = u.int_in_range(0..=12u64)?;
        Ok(with_db(|db, n| {
            let name = format!("g{n}");
            let r = db.import_edges(&name, &mut text.as_slice(), &mut |_| {});
            if let Ok(g) = &r {
                g.verify(db.buffer(), &name).expect("an imported graph verifies");
                let _ = strata::ops::bfs::bfs(db.buffer(), g, source, 1);
            }
            verdict(r)
        }))
    })
}

// ------------------------------------------------------------------------- CSR

#[derive(Arbitrary, Debug)]
enum CsrDamage {
    /// A catalog field of the graph replaced (as a damaged catalog would give it).
    Vertices(W64),
    Edges(W64),
    IndexSpace(W64),
    Renumbered,
    Format,
    PageCount {
        array: u8,
        page: u8,
        count: W32,
    },
    PageId {
        array: u8,
        page: u8,
        pid: W64,
    },
    DropPage {
        array: u8,
    },
    /// Bytes of a page's payload overwritten (as a page written wrong but checksummed).
    Payload {
        array: u8,
        page: u8,
        at: u16,
        value: W64,
    },
}

fn array_of(g: &mut strata::access::graph::Graph, a: u8) -> &mut Vec<ColumnPage> {
    match a % 4 {
        0 => &mut g.offsets,
        1 => &mut g.neighbours,
        2 => &mut g.exists,
        _ => &mut g.ids,
    }
}

/// CSR graphs (imported from arbitrary edges) whose catalog entry or page payloads are
/// damaged, then checked (`Graph::verify`), searched (`index_of`) and traversed (BFS): an
/// error, never a panic or an allocation sized by a damaged count.
pub fn csr(data: &[u8]) -> Verdict {
    exhausted(data, |u| {
        let mut text = String::new();
        let sparse = u.ratio(1, 3)?;
        for _ in 0..u.int_in_range(1..=60u8)? {
            let (a, b) = (u.int_in_range(0..=50u64)?, u.int_in_range(0..=50u64)?);
            let k = if sparse { 1_000_003 } else { 1 };
            text.push_str(&format!("{} {}\n", a * k, b * k));
        }
        let damages: Vec<CsrDamage> = u.arbitrary()?;
        let source = u.int_in_range(0..=60u64)?;
        Ok(with_db(|db, n| {
            let name = format!("csr{n}");
            let mut g = db.import_edges(&name, &mut text.as_bytes(), &mut |_| {}).expect("a valid edge list imports");
            for d in damages.iter().take(3) {
                match d {
                    CsrDamage::Vertices(v) => g.vertices = v.get(),
                    CsrDamage::Edges(v) => g.edges = v.get(),
                    CsrDamage::IndexSpace(v) => g.index_space = v.get(),
                    CsrDamage::Renumbered => g.renumbered = !g.renumbered,
                    CsrDamage::Format => g.neighbour_format = if g.neighbour_format == ValueFormat::U32le { ValueFormat::U64le } else { ValueFormat::U32le },
                    CsrDamage::PageCount { array, page, count } => {
                        let v = array_of(&mut g, *array);
                        if !v.is_empty() {
                            let k = *page as usize % v.len();
                            v[k].count = count.get();
                        }
                    }
                    CsrDamage::PageId { array, page, pid } => {
                        let v = array_of(&mut g, *array);
                        if !v.is_empty() {
                            let k = *page as usize % v.len();
                            // Another allocated page of the database, or any id.
                            v[k].pid = pid.get();
                        }
                    }
                    CsrDamage::DropPage { array } => {
                        let v = array_of(&mut g, *array);
                        v.pop();
                    }
                    CsrDamage::Payload { array, page, at, value } => {
                        let v = array_of(&mut g, *array);
                        if !v.is_empty() {
                            let p = v[*page as usize % v.len()].page_id();
                            if let Ok(mut guard) = db.buffer().fix_exclusive(p) {
                                let len = db.buffer().payload_size(p.class());
                                let at = (*at as usize % len.saturating_sub(8).max(1)) & !7;
                                guard.write(at, &value.get().to_le_bytes());
                            }
                        }
                    }
                }
            }
            let r = g.verify(db.buffer(), &name);
            let _ = g.index_of(db.buffer(), source);
            // BFS is given only graphs that verify? No: `strata bfs` reads the catalog's
            // graph as is, so it must survive a damaged one too.
            let b = strata::ops::bfs::bfs(db.buffer(), &g, source, 1);
            if r.is_ok() {
                verdict(b)
            } else {
                Verdict::Refused
            }
        }))
    })
}

// ---------------------------------------------------------------------- column

#[derive(Arbitrary, Debug)]
enum ColumnDamage {
    Count(W64),
    Format(u8),
    PageCount { page: u8, count: W32 },
    PageId { page: u8, pid: W64 },
    Duplicate(u8),
    Drop(u8),
}

/// Column pages read by the operators (scan, sort, group-by, distinct, join) through a
/// column whose catalog entry is damaged (counts, page ids, format): an error, never a
/// panic or an out-of-page slice.
pub fn column(data: &[u8]) -> Verdict {
    exhausted(data, |u| {
        let format = [ValueFormat::U32le, ValueFormat::U64le, ValueFormat::I64le][u.choose_index(3)?];
        let n = u.int_in_range(0..=3000usize)?;
        let seed: u64 = u.arbitrary()?;
        let values: Vec<u8> = (0..n * format.width()).map(|i| (seed.rotate_left(i as u32 % 64) as u8) ^ (i as u8)).collect();
        let damages: Vec<ColumnDamage> = u.arbitrary()?;
        let (gt, top, m) = (u.arbitrary::<i64>()? as i128, u.int_in_range(0..=20usize)?, u.int_in_range(1..=100u64)?);
        Ok(with_db(|db, k| {
            let mut c = db.import(&format!("col{k}"), format, &mut values.as_slice(), values.len() as u64, &mut |_| {}).expect("a valid column imports");
            let good = c.clone();
            for d in damages.iter().take(3) {
                let len = c.pages.len();
                match d {
                    ColumnDamage::Count(v) => c.count = v.get(),
                    ColumnDamage::Format(f) => c.format = [ValueFormat::U32le, ValueFormat::U64le, ValueFormat::I64le][*f as usize % 3],
                    ColumnDamage::PageCount { page, count } if len > 0 => c.pages[*page as usize % len].count = count.get(),
                    ColumnDamage::PageId { page, pid } if len > 0 => c.pages[*page as usize % len].pid = pid.get(),
                    ColumnDamage::Duplicate(page) if len > 0 => {
                        let p = c.pages[*page as usize % len];
                        c.pages.push(p);
                        c.count = c.count.wrapping_add(p.count as u64);
                    }
                    ColumnDamage::Drop(page) if len > 0 => {
                        let p = c.pages.remove(*page as usize % len);
                        c.count = c.count.wrapping_sub(p.count as u64);
                    }
                    _ => {}
                }
            }
            let bm = db.buffer();
            let r = strata::ops::scan::scan_gt(bm, &c, gt, 1).map(|_| ());
            let _ = strata::ops::sort::sort_column(bm, &c, top, 1);
            let _ = strata::ops::groupby::groupby_mod(bm, &c, m, 1);
            let _ = strata::ops::groupby::distinct(bm, &c, 1);
            let _ = strata::ops::join::join_count(bm, &c, &good, 1);
            verdict(r)
        }))
    })
}

// ------------------------------------------------------------------ raw import

/// The raw column import (`strata import`): values of a format read from a byte stream
/// whose claimed length may be wrong.
pub fn raw_import(data: &[u8]) -> Verdict {
    exhausted(data, |u| {
        let format = [ValueFormat::U32le, ValueFormat::U64le, ValueFormat::I64le][u.choose_index(3)?];
        let bytes = bytes_upto(u, 0..=1500)?;
        let len = match u.int_in_range(0..=5u8)? {
            0 => u.arbitrary::<W64>()?.get(),
            1 => bytes.len() as u64 + u.int_in_range(1..=9u64)?,
            2 => (bytes.len() as u64).saturating_sub(u.int_in_range(1..=9u64)?),
            _ => bytes.len() as u64,
        };
        Ok(with_db(|db, n| {
            let r = db.import(&format!("c{n}"), format, &mut bytes.as_slice(), len, &mut |_| {});
            if let Ok(c) = &r {
                assert_eq!(c.count * format.width() as u64, len, "an imported column holds what was claimed");
            }
            verdict(r)
        }))
    })
}

// ------------------------------------------------------------------------- CSV

/// A per-thread scratch file for the path-based readers (CSV, Parquet).
fn scratch(ext: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{:?}.{ext}", std::thread::current().id()).replace(['(', ')'], ""))
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Flavour {
    Int,
    Float,
    Date,
    Bool,
    Text,
    Hex,
    Mixed,
}

fn csv_field(u: &mut Unstructured<'_>, fl: Flavour, delim: u8) -> AResult<Vec<u8>> {
    let fl = if let Flavour::Mixed = fl { [Flavour::Int, Flavour::Float, Flavour::Date, Flavour::Bool, Flavour::Text][u.choose_index(5)?] } else { fl };
    let text: String = match fl {
        Flavour::Int => match u.int_in_range(0..=5u8)? {
            0 => "9223372036854775808".into(),
            1 => "-9223372036854775808".into(),
            _ => u.arbitrary::<i64>()?.to_string(),
        },
        Flavour::Float => ["1e308", "1e309", "NaN", "-inf", "0.1", "-0", ".5", "5.", "1_0"][u.choose_index(9)?].into(),
        Flavour::Date => match u.int_in_range(0..=4u8)? {
            0 => "2024-02-29".into(),
            1 => "2023-02-29".into(),
            2 => "-5000000-01-01".into(),
            3 => "9999999-12-31".into(),
            _ => format!("{:04}-{:02}-{:02}", u.int_in_range(0..=9999u32)?, u.int_in_range(0..=13u32)?, u.int_in_range(0..=32u32)?),
        },
        Flavour::Bool => ["true", "false", "TRUE", "t", "f", "0", "1", "yes"][u.choose_index(8)?].into(),
        Flavour::Text => {
            let s: String = u.arbitrary()?;
            s.chars().take(40).collect()
        }
        Flavour::Hex => ["\\x00ff", "\\xzz", "\\x0", "0x00"][u.choose_index(4)?].into(),
        Flavour::Mixed => unreachable!(),
    };
    let mut out = Vec::new();
    let needs_quotes = text.bytes().any(|b| b == delim || b == b'"' || b == b'\n' || b == b'\r');
    match u.int_in_range(0..=59u8)? {
        0..=3 => {}                                  // NULL (empty unquoted)
        4 => out.extend_from_slice(b"\"\""),         // the empty string
        5 => out.extend_from_slice(text.as_bytes()), // unquoted, even when it should not be
        6 => {
            // Text after the closing quote, or an unterminated quote.
            out.push(b'"');
            out.extend_from_slice(text.as_bytes());
            if u.arbitrary()? {
                out.extend_from_slice(b"\"x");
            }
        }
        7 => {
            out.extend_from_slice(text.as_bytes());
            out.push(0xff); // invalid UTF-8
        }
        _ if needs_quotes || u.ratio(1, 4)? => {
            out.push(b'"');
            for b in text.bytes() {
                if b == b'"' {
                    out.push(b'"');
                }
                out.push(b);
            }
            out.push(b'"');
        }
        _ => out.extend_from_slice(text.as_bytes()),
    }
    Ok(out)
}

fn csv_text(u: &mut Unstructured<'_>) -> AResult<(Vec<u8>, CsvOptions, Option<Schema>)> {
    let delimiter = match u.int_in_range(0..=9u8)? {
        0 => b';',
        1 => b'\t',
        2 => b'|',
        3 => u.arbitrary()?,
        _ => b',',
    };
    let opts = CsvOptions { delimiter, header: u.ratio(3, 4)? };
    if u.ratio(1, 10)? {
        return Ok((bytes_upto(u, 0..=512)?, opts, None));
    }
    let ncols = u.int_in_range(1..=5usize)?;
    let mut flavours = Vec::new();
    for _ in 0..ncols {
        flavours.push(u.arbitrary::<Flavour>()?);
    }
    let eol: &[u8] = [b"\n".as_slice(), b"\r\n", b"\r"][if u.ratio(4, 5)? { 0 } else { 1 + u.choose_index(2)? }];
    let mut t = Vec::new();
    if u.ratio(1, 10)? {
        t.extend_from_slice(&[0xEF, 0xBB, 0xBF]);
    }
    if opts.header {
        for i in 0..ncols {
            if i > 0 {
                t.push(delimiter);
            }
            match u.int_in_range(0..=9u8)? {
                0 => {}
                1 => t.extend_from_slice(b"c0"), // a duplicate name
                2 => t.extend_from_slice(b"\"a,\"\"b\""),
                _ => t.extend_from_slice(format!("c{i}").as_bytes()),
            }
        }
        t.extend_from_slice(eol);
    }
    for _ in 0..u.int_in_range(0..=24u8)? {
        let width = if u.ratio(1, 20)? { u.int_in_range(0..=ncols + 1)? } else { ncols };
        for i in 0..width {
            if i > 0 {
                t.push(delimiter);
            }
            t.extend_from_slice(&csv_field(u, flavours[i % ncols], delimiter)?);
        }
        t.extend_from_slice(eol);
    }
    if u.ratio(1, 3)? && !t.is_empty() {
        t.truncate(t.len() - eol.len());
    }
    let given = if u.ratio(1, 4)? { Some(arb_schema(u, ncols + 1)?) } else { None };
    Ok((t, opts, given))
}

/// The CSV import: tokenizer, schema inference (or a given schema checked), row conversion.
pub fn csv_import(data: &[u8]) -> Verdict {
    exhausted(data, |u| {
        let (text, opts, given) = csv_text(u)?;
        let path = scratch("csv");
        std::fs::write(&path, &text).unwrap();
        let r = csv::infer_schema(&path, &opts, given.as_ref()).and_then(|inf| {
            let mut rows = 0u64;
            let n = csv::read_rows(&path, &opts, &inf.schema, &mut |_| {}, &mut |row| {
                assert_eq!(row.len(), inf.schema.len(), "a CSV row has the schema's width");
                for (v, c) in row.iter().zip(&inf.schema.columns) {
                    assert!(v.ty().is_none_or(|t| t == c.ty), "a CSV value has its column's type");
                }
                rows += 1;
                Ok(())
            })?;
            assert_eq!(n, rows, "read_rows counts the rows it gave");
            assert_eq!(n, inf.rows, "both passes see the same rows");
            Ok(())
        });
        Ok(verdict(r))
    })
}

// --------------------------------------------------------------------- Parquet

fn parquet_file(u: &mut Unstructured<'_>) -> AResult<Vec<u8>> {
    use parquet::data_type::{BoolType, ByteArray, ByteArrayType, DoubleType, FloatType, Int32Type, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;

    const TYPES: &[&str] = &[
        "int64 {}",
        "int32 {}",
        "int32 {} (DATE)",
        "double {}",
        "float {}",
        "boolean {}",
        "binary {} (UTF8)",
        "binary {}",
        "int64 {} (UINT_64)",
        "int32 {} (UINT_32)",
    ];
    let ncols = u.int_in_range(1..=4usize)?;
    let mut message = String::from("message m { ");
    let mut kinds = Vec::new();
    for i in 0..ncols {
        let k = u.choose_index(TYPES.len())?;
        let optional = u.arbitrary::<bool>()?;
        message.push_str(&format!("{} {}; ", if optional { "optional" } else { "required" }, TYPES[k].replace("{}", &format!("c{i}"))));
        kinds.push((k, optional));
    }
    message.push('}');
    let Ok(schema) = parse_message_type(&message) else { return Ok(Vec::new()) };
    let rows = u.int_in_range(0..=40usize)?;
    let mut out = Vec::new();
    let props = WriterProperties::builder().set_data_page_row_count_limit(u.int_in_range(1..=50usize)?).build();
    let mut w = SerializedFileWriter::new(&mut out, Arc::new(schema), Arc::new(props)).unwrap();
    for _ in 0..u.int_in_range(0..=2u8)? {
        let mut rg = w.next_row_group().unwrap();
        for &(k, optional) in &kinds {
            let mut def = Vec::new();
            for _ in 0..rows {
                def.push(if optional { i16::from(u.ratio(3, 4)?) } else { 1 });
            }
            let present = def.iter().filter(|&&d| d == 1).count();
            let def_arg = if optional { Some(def.as_slice()) } else { None };
            let mut col = rg.next_column().unwrap().unwrap();
            match k {
                0 | 8 => {
                    let v: Vec<i64> = (0..present).map(|_| u.arbitrary()).collect::<AResult<_>>()?;
                    col.typed::<Int64Type>().write_batch(&v, def_arg, None).unwrap();
                }
                1 | 2 | 9 => {
                    let v: Vec<i32> = (0..present).map(|_| u.arbitrary()).collect::<AResult<_>>()?;
                    col.typed::<Int32Type>().write_batch(&v, def_arg, None).unwrap();
                }
                3 => {
                    let v: Vec<f64> = (0..present).map(|_| u.arbitrary()).collect::<AResult<_>>()?;
                    col.typed::<DoubleType>().write_batch(&v, def_arg, None).unwrap();
                }
                4 => {
                    let v: Vec<f32> = (0..present).map(|_| u.arbitrary()).collect::<AResult<_>>()?;
                    col.typed::<FloatType>().write_batch(&v, def_arg, None).unwrap();
                }
                5 => {
                    let v: Vec<bool> = (0..present).map(|_| u.arbitrary()).collect::<AResult<_>>()?;
                    col.typed::<BoolType>().write_batch(&v, def_arg, None).unwrap();
                }
                _ => {
                    let v: Vec<ByteArray> =
                        (0..present).map(|_| u.arbitrary::<Vec<u8>>().map(|b| ByteArray::from(b[..b.len().min(40)].to_vec()))).collect::<AResult<_>>()?;
                    col.typed::<ByteArrayType>().write_batch(&v, def_arg, None).unwrap();
                }
            }
            col.close().unwrap();
        }
        rg.close().unwrap();
    }
    w.close().unwrap();
    Ok(out)
}

/// The Parquet import on arbitrary bytes and on valid files (arbitrary schema and values)
/// with chosen damage, biased to the footer (the Thrift metadata and its length).
pub fn parquet_import(data: &[u8]) -> Verdict {
    exhausted(data, |u| {
        let mut bytes = if u.ratio(1, 6)? {
            let mut b = bytes_upto(u, 0..=512)?;
            if u.arbitrary()? {
                b.extend_from_slice(b"PAR1");
            }
            b
        } else {
            parquet_file(u)?
        };
        if u.ratio(3, 4)? {
            let n = bytes.len();
            // Damage in the footer (the last 8 bytes are its length and the magic).
            let mut tail = bytes.split_off(n.saturating_sub(u.int_in_range(8..=200usize)?));
            damage(u, &mut tail, 16)?;
            if u.ratio(1, 3)? {
                damage(u, &mut bytes, 64)?;
            }
            bytes.extend_from_slice(&tail);
        }
        let path = scratch("parquet");
        std::fs::write(&path, &bytes).unwrap();
        let mut rows = 0u64;
        let r = pq::read_parquet(&path, &mut |_| {}, &mut |row| {
            rows += 1;
            assert!(rows <= 1 << 20, "a small Parquet file gives a bounded number of rows");
            let _ = row;
            Ok(())
        });
        let _ = pq::schema_of_parquet(&path);
        Ok(verdict(r))
    })
}

// ------------------------------------------------------------------------- SQL

fn sql_expr(u: &mut Unstructured<'_>, depth: u32, out: &mut String) -> AResult<()> {
    const COLS: &[&str] = &["id", "a", "b", "d", "f", "s", "a", "b", "s", "t.a", "x", "nope", "*"];
    const LITS: &[&str] = &[
        "0",
        "1",
        "-1",
        "9223372036854775807",
        "-9223372036854775808",
        "9223372036854775808",
        "2.5",
        "1e308",
        "NULL",
        "TRUE",
        "'x'",
        "''",
        "'%a_'",
        "DATE '2000-02-29'",
        "DATE '2001-02-29'",
        "INTERVAL '1' MONTH",
        "INTERVAL '-99999999' YEAR",
        "'1999-12-31'",
    ];
    const BIN: &[&str] = &["+", "-", "*", "/", "%", "||", "=", "<>", "<", "<=", ">", ">=", "AND", "OR", "LIKE", "NOT LIKE"];
    if depth == 0 {
        let pool = if u.arbitrary()? { COLS } else { LITS };
        out.push_str(pool[u.choose_index(pool.len())?]);
        return Ok(());
    }
    match u.int_in_range(0..=13u8)? {
        0 | 1 => out.push_str(COLS[u.choose_index(COLS.len())?]),
        2 => out.push_str(LITS[u.choose_index(LITS.len())?]),
        3..=5 => {
            out.push('(');
            sql_expr(u, depth - 1, out)?;
            out.push_str(&format!(" {} ", BIN[u.choose_index(BIN.len())?]));
            sql_expr(u, depth - 1, out)?;
            out.push(')');
        }
        6 => {
            out.push_str(["NOT ", "-", "+"][u.choose_index(3)?]);
            sql_expr(u, depth - 1, out)?;
        }
        7 => {
            sql_expr(u, depth - 1, out)?;
            out.push_str([" IS NULL", " IS NOT NULL"][u.choose_index(2)?]);
        }
        8 => {
            sql_expr(u, depth - 1, out)?;
            out.push_str(if u.arbitrary()? { " BETWEEN " } else { " NOT IN (" });
            sql_expr(u, depth - 1, out)?;
            out.push_str(if out.ends_with('(') { ", " } else { " AND " });
            sql_expr(u, depth - 1, out)?;
            if out.contains(" NOT IN (") && !out.ends_with(')') {
                out.push(')');
            }
        }
        9 => {
            out.push_str("CASE WHEN ");
            sql_expr(u, depth - 1, out)?;
            out.push_str(" THEN ");
            sql_expr(u, depth - 1, out)?;
            out.push_str(" ELSE ");
            sql_expr(u, depth - 1, out)?;
            out.push_str(" END");
        }
        10 => {
            const F: &[&str] = &["abs(", "length(", "upper(", "lower(", "coalesce(", "count(", "sum(", "avg(", "min(", "max(", "EXTRACT(YEAR FROM ", "CAST("];
            let f = F[u.choose_index(F.len())?];
            out.push_str(f);
            sql_expr(u, depth - 1, out)?;
            if f == "CAST(" {
                out.push_str([" AS BIGINT", " AS DOUBLE", " AS VARCHAR", " AS DATE", " AS BOOLEAN"][u.choose_index(5)?]);
            } else if f == "coalesce(" {
                out.push_str(", ");
                sql_expr(u, depth - 1, out)?;
            }
            out.push(')');
        }
        11 => {
            out.push_str("SUBSTRING(");
            sql_expr(u, depth - 1, out)?;
            out.push_str(" FROM ");
            sql_expr(u, depth - 1, out)?;
            out.push_str(" FOR ");
            sql_expr(u, depth - 1, out)?;
            out.push(')');
        }
        13 => {
            // Subqueries: uncorrelated scalars, correlated aggregates, EXISTS and IN (the
            // outer query's alias is x when its FROM has one).
            const SUB: &[(&str, &str)] = &[
                ("(SELECT ", " FROM t AS y)"),
                ("(SELECT max(", ") FROM t AS y WHERE y.a = x.a)"),
                ("(SELECT 0.5 * sum(", ") FROM t WHERE t.s = x.s AND t.id = x.id)"),
                ("EXISTS (SELECT ", " FROM t AS y WHERE y.a = x.a AND y.b < x.b)"),
                ("NOT EXISTS (SELECT 1 FROM t AS y WHERE y.id = x.id AND ", ")"),
                ("x.a IN (SELECT ", " FROM t AS y WHERE y.s = x.s)"),
                ("(WITH w AS (SELECT a FROM t) SELECT count(", ") FROM w)"),
            ];
            let (pre, post) = SUB[u.choose_index(SUB.len())?];
            out.push_str(pre);
            sql_expr(u, depth - 1, out)?;
            out.push_str(post);
        }
        _ => {
            sql_expr(u, depth - 1, out)?;
            out.push_str(" LIKE ");
            sql_expr(u, depth - 1, out)?;
            out.push_str(" ESCAPE ");
            out.push_str(["'\\'", "''", "'ab'", "'%'"][u.choose_index(4)?]);
        }
    }
    Ok(())
}

fn sql_text(u: &mut Unstructured<'_>) -> AResult<String> {
    if u.ratio(1, 8)? {
        let s: String = u.arbitrary()?;
        return Ok(s.chars().take(300).collect());
    }
    let mut q = String::new();
    if u.ratio(1, 8)? {
        q.push_str("EXPLAIN ");
    }
    q.push_str("SELECT ");
    for i in 0..u.int_in_range(1..=4u8)? {
        if i > 0 {
            q.push_str(", ");
        }
        let depth = u.int_in_range(0..=4u32)?;
        sql_expr(u, depth, &mut q)?;
        if u.ratio(1, 4)? {
            q.push_str(" AS c");
        }
    }
    q.push_str(
        [" FROM t", " FROM t AS x", " FROM empty", " FROM nope", "", " FROM t, t", " FROM t JOIN t ON 1"][if u.ratio(4, 5)? { 0 } else { u.choose_index(7)? }],
    );
    // GROUP BY and ORDER BY are refused by this slice of SQL: rarely.
    let clauses: [(&str, u32, u8); 5] = [(" WHERE ", 3, 2), (" GROUP BY ", 1, 20), (" HAVING ", 2, 6), (" ORDER BY ", 1, 20), (" LIMIT ", 0, 3)];
    for (kw, depth, one_in) in clauses {
        if u.ratio(1, one_in)? {
            q.push_str(kw);
            if depth == 0 {
                q.push_str(["0", "1", "5", "-1", "18446744073709551615", "a", "NULL"][u.choose_index(7)?]);
                if u.arbitrary()? {
                    q.push_str(" OFFSET ");
                    q.push_str(["0", "3", "-2", "99999999999999999999"][u.choose_index(4)?]);
                }
            } else {
                sql_expr(u, depth, &mut q)?;
            }
        }
    }
    if u.ratio(1, 10)? {
        let mut b = q.into_bytes();
        damage(u, &mut b, 64)?;
        q = String::from_utf8_lossy(&b).into_owned();
    }
    Ok(q)
}

/// SQL: text (assembled from a small grammar, or arbitrary) parsed, bound and planned
/// against a catalog with a table of 24 rows, then executed (at most 1000 result rows).
pub fn sql(data: &[u8]) -> Verdict {
    exhausted(data, |u| {
        let q = sql_text(u)?;
        Ok(with_db(|db, _| {
            let r = strata::sql::prepare(&db.catalog(), &q).and_then(|p| {
                let mut rows = 0u32;
                p.execute(db.buffer(), &mut |row| {
                    assert_eq!(row.len(), p.columns.len(), "a result row has the result's width");
                    rows += 1;
                    Ok(rows < 1000)
                })
            });
            verdict(r)
        }))
    })
}

// ---------------------------------------------------------------- whole database

/// A double-write batch of 1 to 3 of the sample's pages of class 0 (see [`database`]).
fn doublewrite_batch(u: &mut Unstructured<'_>) -> AResult<Vec<u8>> {
    let pages = sample_file("class-00.pages");
    let n = u.int_in_range(1..=3usize)?;
    let hlen = (16 + 24 * n).next_multiple_of(4096);
    let mut h = vec![0u8; hlen];
    h[0..4].copy_from_slice(b"SDW1");
    h[8..12].copy_from_slice(&(n as u32).to_le_bytes());
    h[12..16].copy_from_slice(&(hlen as u32).to_le_bytes());
    let mut images = Vec::new();
    for i in 0..n {
        let k = u.choose_index(pages.len() / 4096)?;
        let mut img = pages[k * 4096..(k + 1) * 4096].to_vec();
        let hdr = page::Header::parse(&img);
        let pid = PageId::from_raw(hdr.page_id);
        if u.arbitrary()? {
            damage_in_place(u, &mut img[32..], 256)?;
            page::seal(&mut img, pid, hdr.lsn + u.int_in_range(0..=1_000_000u64)?);
        }
        let at = 16 + 24 * i;
        h[at..at + 8].copy_from_slice(&pid.raw().to_le_bytes());
        h[at + 8..at + 16].copy_from_slice(&((hlen + 4096 * i) as u64).to_le_bytes());
        h[at + 16..at + 24].copy_from_slice(&4096u64.to_le_bytes());
        images.extend_from_slice(&img);
    }
    let c = crc(&h[8..]);
    h[4..8].copy_from_slice(&c.to_le_bytes());
    h.extend_from_slice(&images);
    Ok(h)
}

/// The sample database with one file replaced by a structure-aware mutation of it (the
/// file's own mutator for the meta file, catalog and allocation table; corruptions with
/// resealed checksums elsewhere), opened (recovery included), checked and read.
pub fn database(data: &[u8]) -> Verdict {
    exhausted(data, |u| {
        let s = sample();
        let (name, base) = &s.files[u.choose_index(s.files.len())?];
        let bytes = match name.as_str() {
            "strata.meta" => meta_bytes(u)?,
            "catalog.json" => catalog_bytes(u, base)?,
            "alloc.table" => alloc_table_bytes(u)?.0,
            // The sample's area is empty (its last checkpoint cleared it): a batch of its own
            // pages instead, some with a higher LSN and changed (resealed) contents, which
            // recovery copies home before it reads them.
            "doublewrite.pages" if base.is_empty() && u.ratio(3, 4)? => doublewrite_batch(u)?,
            _ => {
                let mut b = base.clone();
                if name.ends_with(".pages") && !b.is_empty() && u.ratio(1, 2)? {
                    // Damage inside one page, then reseal it, so the page's content (not
                    // its checksum) is what is wrong.
                    let pages = b.len() / 4096;
                    let k = u.choose_index(pages.max(1))?;
                    let (lo, hi) = (k * 4096, ((k + 1) * 4096).min(b.len()));
                    let mut img = b[lo..hi].to_vec();
                    let hdr = page::Header::parse(&img);
                    damage_in_place(u, &mut img[32..], 256)?;
                    if hdr.magic == page::Header::MAGIC {
                        page::seal(&mut img, PageId::from_raw(hdr.page_id), hdr.lsn);
                    }
                    b[lo..hi].copy_from_slice(&img);
                } else {
                    damage(u, &mut b, 64)?;
                }
                b
            }
        };
        let be = s.backend.crash_image(0, strata::storage::CrashMode::KeepUnsynced);
        let path = s.dir.join(name);
        if name.ends_with(".pages") || name.ends_with(".log") {
            let f = be.open(&path, OpenMode::Buffered, true).unwrap();
            f.set_len(0).unwrap();
            f.write_at(&bytes, 0).unwrap();
            f.sync().unwrap();
        } else {
            be.write_atomic(&path, &bytes).unwrap();
        }
        let arc: Arc<dyn StorageBackend> = Arc::new(be);
        let r = Database::open(sim_config(&s.dir, arc)).and_then(|db| {
            let report = db.check();
            if let Ok(t) = db.table("t") {
                let _ = t.get(db.buffer(), 10);
            }
            if let Ok(g) = db.graph("g") {
                let _ = strata::ops::bfs::bfs(db.buffer(), &g, 1, 1);
            }
            if let Ok(q) = strata::sql::prepare(&db.catalog(), "SELECT count(*), min(s) FROM t") {
                let _ = q.execute(db.buffer(), &mut |_| Ok(true));
            }
            // Closed, not crashed: `crash` leaks the database on purpose (a simulated kill),
            // which adds up over millions of executions. Closing checkpoints a database
            // that may be damaged: one more path that must give an error, not a panic.
            let closed = db.close();
            report.and(closed)
        });
        Ok(verdict(r))
    })
}
