//! Directed graphs in compressed sparse row (CSR) form, stored in persistent pages.
//!
//! A graph has an *index space* `0..n`: vertex `i` has out-neighbours
//! `neighbours[offsets[i]..offsets[i+1]]` (neighbours are indices too). Each array is a list
//! of pages of one size class, every page full except the last (so element `k` is found by
//! arithmetic), like a [`Column`](super::Column).
//!
//! # Vertex ids
//!
//! Input vertex ids are arbitrary u64; a vertex exists if it appears in some edge.
//! * **Dense** (`renumbered == false`), used when the largest id is at most
//!   `4 * edges + 1024`: the index of a vertex is its id, the index space is
//!   `0..=max_id`, and a bitmap `exists` (u64 words, bit `i % 64` of word `i / 64`) tells
//!   which ids appear in an edge. Offsets cost at most about 32 bytes per edge.
//! * **Renumbered** (`renumbered == true`), for sparse ids: the index of a vertex is its
//!   rank among the distinct ids, which are stored ascending in `ids`; the index space is
//!   `0..vertices`. Lookups of an id binary-search `ids`.
//!
//! Parallel edges and self-loops are kept as given (the graph is a multigraph).
//!
//! # Import
//!
//! [`import_edges`] reads a SNAP text edge list (`u v` per line, `#` starts a comment)
//! that may be far larger than the pool: edges are collected into sorted temporary runs
//! ([`super::extsort`]) and merged by (source, destination); the destinations are sorted
//! and deduplicated separately to learn which ids exist. Renumbering takes two more
//! external sorts (edges by destination to replace destination ids by ranks, then by
//! source rank). On any error every page allocated so far is freed.

use std::io::{BufRead, Read};

use serde::{Deserialize, Serialize};

use super::column::{Column, ColumnPage, ValueFormat};
use super::extsort::{latch_budget, Merger, Plan, RunGen};
use crate::buffer::{BufferManager, ExclusiveGuard, SharedGuard};
use crate::error::{Error, Result};

/// Longest line of an edge list that is not a comment.
const MAX_LINE: usize = 64 << 10;

/// A graph's metadata (kept in the catalog).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Graph {
    /// Vertices (distinct ids that appear in some edge).
    pub vertices: u64,
    /// Edges (as given: parallel edges and self-loops included).
    pub edges: u64,
    /// Size of the index space: `max_id + 1` when dense, `vertices` when renumbered.
    pub index_space: u64,
    /// Whether indices are ranks of the ids in `ids` (else indices are the ids).
    pub renumbered: bool,
    /// Encoding of `neighbours`: `u32le` when the index space fits 32 bits, else `u64le`.
    pub neighbour_format: ValueFormat,
    /// `index_space + 1` u64 offsets into `neighbours`.
    pub offsets: Vec<ColumnPage>,
    /// `edges` neighbour indices, grouped by source index, ascending within a source.
    pub neighbours: Vec<ColumnPage>,
    /// Dense graphs: `ceil(index_space / 64)` u64 words, bit set if the id exists.
    #[serde(default)]
    pub exists: Vec<ColumnPage>,
    /// Renumbered graphs: the `vertices` distinct ids, ascending.
    #[serde(default)]
    pub ids: Vec<ColumnPage>,
}

impl Graph {
    /// Every page of the graph with the name of the array it belongs to.
    pub fn pages(&self) -> impl Iterator<Item = (&'static str, &ColumnPage)> + '_ {
        let arrays: [(&'static str, &Vec<ColumnPage>); 4] =
            [("offsets", &self.offsets), ("neighbours", &self.neighbours), ("exists", &self.exists), ("ids", &self.ids)];
        arrays.into_iter().flat_map(|(name, pages)| pages.iter().map(move |p| (name, p)))
    }

    /// Width in bytes of a neighbour index.
    pub fn neighbour_width(&self) -> usize {
        self.neighbour_format.width()
    }

    /// The index of vertex `id`, or `None` if no edge mentions it.
    pub fn index_of(&self, bm: &BufferManager, id: u64) -> Result<Option<u64>> {
        if !self.renumbered {
            if id >= self.index_space {
                return Ok(None);
            }
            let mut c = ArrayCursor::new(bm, &self.exists, 8)?;
            let word = c.get(id / 64)?;
            return Ok((word >> (id % 64) & 1 == 1).then_some(id));
        }
        let mut c = ArrayCursor::new(bm, &self.ids, 8)?;
        let (mut lo, mut hi) = (0u64, self.vertices);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match c.get(mid)?.cmp(&id) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(Some(mid)),
            }
        }
        Ok(None)
    }

    /// The checks of [`verify`](Self::verify) that read no page: the neighbour format and
    /// every array's length against the counts (`vertices`, `edges`, `index_space`, which
    /// come from the catalog). Whatever sizes memory by these counts (a traversal's visited
    /// bitmap) checks this first, so a damaged catalog gives an error, not a huge allocation.
    pub fn check_shape(&self, bm: &BufferManager, name: &str) -> Result<()> {
        let bad = |what: String| Error::Inconsistent(format!("graph {name:?}: {what}"));
        let nw = self.neighbour_width();
        if self.neighbour_format == ValueFormat::I64le || (nw == 4 && self.index_space > 1 << 32) {
            return Err(bad(format!("neighbour format {} cannot hold indices below {}", self.neighbour_format.name(), self.index_space)));
        }
        let (words, ids) = if self.renumbered { (0, self.vertices) } else { (self.index_space.div_ceil(64), 0) };
        if self.renumbered && self.index_space != self.vertices {
            return Err(bad(format!("renumbered with {} vertices but an index space of {}", self.vertices, self.index_space)));
        }
        for (array, pages, width, len) in [
            ("offsets", &self.offsets, 8, self.index_space.checked_add(1).ok_or_else(|| bad("index space overflows".into()))?),
            ("neighbours", &self.neighbours, nw, self.edges),
            ("exists", &self.exists, 8, words),
            ("ids", &self.ids, 8, ids),
        ] {
            check_array_shape(bm, pages, width, len).map_err(|e| bad(format!("{array}: {e}")))?;
        }
        Ok(())
    }

    /// Checks the structure: array lengths, full pages, offsets non-decreasing from 0 to
    /// `edges`, neighbours inside the index space, `exists`/`ids` consistent with
    /// `vertices`. Reads every page of the graph.
    pub fn verify(&self, bm: &BufferManager, name: &str) -> Result<()> {
        self.check_shape(bm, name)?;
        let bad = |what: String| Error::Inconsistent(format!("graph {name:?}: {what}"));
        let nw = self.neighbour_width();
        // Offsets: from 0, non-decreasing, up to `edges`.
        let mut prev = 0u64;
        let mut first = true;
        for_each_value(bm, &self.offsets, 8, |i, v| {
            if (first && v != 0) || v < prev || v > self.edges {
                return Err(bad(format!("offset {i} is {v} (previous {prev}, edges {})", self.edges)));
            }
            first = false;
            prev = v;
            Ok(())
        })?;
        if prev != self.edges {
            return Err(bad(format!("last offset is {prev}, expected {} edges", self.edges)));
        }
        for_each_value(bm, &self.neighbours, nw, |i, v| {
            if v >= self.index_space {
                return Err(bad(format!("neighbour {i} is {v}, outside the index space of {}", self.index_space)));
            }
            Ok(())
        })?;
        let mut count = 0u64;
        for_each_value(bm, &self.exists, 8, |i, v| {
            let valid = if (i + 1) * 64 > self.index_space { (1u64 << (self.index_space % 64)).wrapping_sub(1) } else { u64::MAX };
            if v & !valid != 0 {
                return Err(bad(format!("exists bitmap has bits set beyond the index space in word {i}")));
            }
            count += v.count_ones() as u64;
            Ok(())
        })?;
        let mut last: Option<u64> = None;
        for_each_value(bm, &self.ids, 8, |i, v| {
            if last.is_some_and(|l| l >= v) {
                return Err(bad(format!("ids are not strictly ascending at {i}")));
            }
            last = Some(v);
            count += 1;
            Ok(())
        })?;
        if count != self.vertices {
            return Err(bad(format!("claims {} vertices, {} found", self.vertices, count)));
        }
        Ok(())
    }
}

/// Checks that `pages` hold exactly `len` values of `width` bytes, in pages of one class,
/// each full but the last.
fn check_array_shape(bm: &BufferManager, pages: &[ColumnPage], width: usize, len: u64) -> std::result::Result<(), String> {
    let Some(first) = pages.first() else {
        return if len == 0 { Ok(()) } else { Err(format!("no pages for {len} values")) };
    };
    let class = first.page_id().class();
    if (class as usize) >= bm.classes().count() {
        return Err(format!("page {} has an invalid size class", first.page_id()));
    }
    let per_page = (bm.payload_size(class) / width) as u64;
    let mut total = 0u64;
    for (k, p) in pages.iter().enumerate() {
        if p.page_id().class() != class {
            return Err(format!("page {} is of another size class than the first", p.page_id()));
        }
        let last = k + 1 == pages.len();
        if p.count as u64 > per_page || (!last && p.count as u64 != per_page) || p.count == 0 {
            return Err(format!("page {} holds {} values (pages hold {per_page}, all full but the last)", p.page_id(), p.count));
        }
        total += p.count as u64;
    }
    if total != len {
        return Err(format!("pages hold {total} values, expected {len}"));
    }
    Ok(())
}

/// Calls `f(index, value)` for each value of a paged array, in order.
fn for_each_value(bm: &BufferManager, pages: &[ColumnPage], width: usize, mut f: impl FnMut(u64, u64) -> Result<()>) -> Result<()> {
    let mut i = 0u64;
    for p in pages {
        let g = bm.fix_shared(p.page_id())?;
        for c in g.data()[..p.count as usize * width].chunks_exact(width) {
            f(i, decode(c))?;
            i += 1;
        }
    }
    Ok(())
}

#[inline]
fn decode(c: &[u8]) -> u64 {
    if c.len() == 4 {
        u32::from_le_bytes(c.try_into().unwrap()) as u64
    } else {
        u64::from_le_bytes(c.try_into().unwrap())
    }
}

// ------------------------------------------------------------------ paged arrays

/// Random and sequential access to a paged array of u32/u64 values, keeping the last page
/// it used latched (shared).
pub(crate) struct ArrayCursor<'a, 'g> {
    bm: &'a BufferManager,
    pages: &'g [ColumnPage],
    width: usize,
    per_page: u64,
    cur: Option<(usize, SharedGuard<'a>)>,
}

impl<'a, 'g> ArrayCursor<'a, 'g> {
    pub(crate) fn new(bm: &'a BufferManager, pages: &'g [ColumnPage], width: usize) -> Result<ArrayCursor<'a, 'g>> {
        let per_page = match pages.first() {
            Some(p) if (p.page_id().class() as usize) < bm.classes().count() => (bm.payload_size(p.page_id().class()) / width) as u64,
            Some(p) => return Err(Error::Inconsistent(format!("page {} has an invalid size class", p.page_id()))),
            None => 1,
        };
        Ok(ArrayCursor { bm, pages, width, per_page, cur: None })
    }

    /// The values of page `p`.
    #[inline]
    fn page(&mut self, p: usize) -> Result<&[u8]> {
        if self.cur.as_ref().is_none_or(|(q, _)| *q != p) {
            self.cur = None;
            let page = self.pages.get(p).ok_or_else(|| Error::Inconsistent(format!("array access beyond its {} pages", self.pages.len())))?;
            self.cur = Some((p, self.bm.fix_shared(page.page_id())?));
        }
        let (_, g) = self.cur.as_ref().expect("current page");
        // The count comes from the catalog: a damaged one must not slice past the page.
        let count = self.pages[p].count;
        g.data()
            .get(..count as usize * self.width)
            .ok_or_else(|| Error::Inconsistent(format!("page {} claims {count} values, more than it holds", self.pages[p].page_id())))
    }

    /// Value `i`.
    #[inline]
    pub(crate) fn get(&mut self, i: u64) -> Result<u64> {
        let (p, k) = ((i / self.per_page) as usize, (i % self.per_page) as usize);
        let w = self.width;
        let bytes = self.page(p)?;
        let c = bytes.get(k * w..k * w + w).ok_or_else(|| Error::Inconsistent(format!("array index {i} beyond its values")))?;
        Ok(decode(c))
    }

    /// Calls `f` with the raw bytes of values `start..end`, page by page.
    #[inline]
    pub(crate) fn for_range(&mut self, mut start: u64, end: u64, mut f: impl FnMut(&[u8]) -> Result<()>) -> Result<()> {
        while start < end {
            let (p, k) = ((start / self.per_page) as usize, (start % self.per_page) as usize);
            let w = self.width;
            let bytes = self.page(p)?;
            let n = ((bytes.len() / w).saturating_sub(k) as u64).min(end - start) as usize;
            if n == 0 {
                return Err(Error::Inconsistent(format!("array range ends at {end}, beyond its values")));
            }
            f(&bytes[k * w..(k + n) * w])?;
            start += n as u64;
        }
        Ok(())
    }

    /// Releases the latched page.
    pub(crate) fn release(&mut self) {
        self.cur = None;
    }
}

/// Writes a new paged array of u32/u64 values into persistent pages; the pages of an
/// unfinished writer are freed when it is dropped.
struct ArrayWriter<'a> {
    bm: &'a BufferManager,
    width: usize,
    payload: usize,
    per_page: usize,
    pages: Vec<ColumnPage>,
    cur: Option<ExclusiveGuard<'a>>,
    count: usize,
    flushed: usize,
    stage: Vec<u8>,
}

impl<'a> ArrayWriter<'a> {
    /// A writer for about `len` values (which picks the page size).
    fn new(bm: &'a BufferManager, width: usize, len: u64) -> ArrayWriter<'a> {
        let payload = Column::page_payload_for(bm, len.saturating_mul(width as u64));
        let per_page = payload / width;
        let stage_cap = (per_page * width).min(16 << 10);
        ArrayWriter { bm, width, payload, per_page, pages: Vec::new(), cur: None, count: 0, flushed: 0, stage: Vec::with_capacity(stage_cap) }
    }

    fn flush(&mut self) {
        if let Some(g) = self.cur.as_mut() {
            g.write(self.flushed, &self.stage);
            self.flushed += self.stage.len();
            self.stage.clear();
        }
    }

    #[inline]
    fn push(&mut self, v: u64) -> Result<()> {
        if self.cur.is_none() {
            let g = self.bm.alloc(self.payload)?;
            self.pages.push(ColumnPage { pid: g.pid().raw(), count: 0 });
            self.cur = Some(g);
            self.count = 0;
            self.flushed = 0;
        }
        if self.width == 4 {
            self.stage.extend_from_slice(&(v as u32).to_le_bytes());
        } else {
            self.stage.extend_from_slice(&v.to_le_bytes());
        }
        self.count += 1;
        if self.stage.len() == self.stage.capacity() || self.count == self.per_page {
            self.flush();
        }
        if self.count == self.per_page {
            self.seal();
        }
        Ok(())
    }

    fn seal(&mut self) {
        if self.cur.is_some() {
            self.flush();
            self.pages.last_mut().expect("page of the current guard").count = self.count as u32;
            self.cur = None;
        }
    }

    /// Finishes the array; the pages are handed to `owned`.
    fn finish(mut self, owned: &mut OwnedPages<'a>) -> Vec<ColumnPage> {
        self.seal();
        let pages = std::mem::take(&mut self.pages);
        owned.pages.extend(pages.iter().copied());
        pages
    }
}

impl Drop for ArrayWriter<'_> {
    fn drop(&mut self) {
        self.cur = None;
        for p in &self.pages {
            let _ = self.bm.free(p.page_id());
        }
    }
}

/// Persistent pages of a graph under construction, freed when dropped unless disarmed.
struct OwnedPages<'a> {
    bm: &'a BufferManager,
    pages: Vec<ColumnPage>,
}

impl Drop for OwnedPages<'_> {
    fn drop(&mut self) {
        for p in &self.pages {
            let _ = self.bm.free(p.page_id());
        }
    }
}

// ----------------------------------------------------------------------- parsing

/// Parses one line of an edge list: `None` for blank and comment lines.
fn parse_line(line: &[u8], lineno: u64) -> Result<Option<(u64, u64)>> {
    let content = match line.iter().position(|&b| b == b'#') {
        Some(k) => &line[..k],
        None => line,
    };
    let mut tokens = content.split(|b| b.is_ascii_whitespace()).filter(|t| !t.is_empty());
    let Some(a) = tokens.next() else { return Ok(None) };
    let excerpt = || {
        let s = String::from_utf8_lossy(&line[..line.len().min(80)]);
        let s = s.trim_end();
        if line.len() > 80 {
            format!("{s}...")
        } else {
            s.to_owned()
        }
    };
    let (Some(b), None) = (tokens.next(), tokens.next()) else {
        return Err(Error::InvalidInput(format!("edge list line {lineno}: expected two vertex ids `u v`, found {:?}", excerpt())));
    };
    let id = |t: &[u8]| -> Result<u64> {
        if !t.iter().all(u8::is_ascii_digit) {
            return Err(Error::InvalidInput(format!(
                "edge list line {lineno}: vertex id {:?} is not a non-negative integer (line {:?})",
                String::from_utf8_lossy(&t[..t.len().min(40)]),
                excerpt()
            )));
        }
        // All ASCII digits: the only possible failure is overflow.
        t.iter().try_fold(0u64, |v, &c| v.checked_mul(10)?.checked_add((c - b'0') as u64)).ok_or_else(|| {
            Error::InvalidInput(format!(
                "edge list line {lineno}: vertex id {} does not fit in 64 bits (ids are u64, at most {})",
                String::from_utf8_lossy(&t[..t.len().min(40)]),
                u64::MAX
            ))
        })
    };
    Ok(Some((id(a)?, id(b)?)))
}

/// Reads lines of at most [`MAX_LINE`] bytes (longer comment lines are skipped).
struct Lines<'r> {
    input: &'r mut dyn BufRead,
    buf: Vec<u8>,
    lineno: u64,
    bytes: u64,
}

impl Lines<'_> {
    /// The next line (without its newline) and its number, or `None` at the end.
    fn next(&mut self) -> Result<Option<(u64, &[u8])>> {
        self.buf.clear();
        let n =
            (&mut *self.input).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut self.buf).map_err(|e| Error::io("read edge list", "<edge list input>", e))?;
        if n == 0 {
            return Ok(None);
        }
        self.lineno += 1;
        self.bytes += n as u64;
        if self.buf.last() == Some(&b'\n') {
            self.buf.pop();
        } else if n > MAX_LINE {
            // A very long line: fine if it is a comment (skip the rest), else an error.
            if !self.buf.contains(&b'#') {
                return Err(Error::InvalidInput(format!("edge list line {}: longer than {} bytes", self.lineno, MAX_LINE)));
            }
            self.skip_rest()?;
        }
        Ok(Some((self.lineno, &self.buf)))
    }

    fn skip_rest(&mut self) -> Result<()> {
        loop {
            let chunk = self.input.fill_buf().map_err(|e| Error::io("read edge list", "<edge list input>", e))?;
            if chunk.is_empty() {
                return Ok(());
            }
            let (used, done) = match chunk.iter().position(|&b| b == b'\n') {
                Some(k) => (k + 1, true),
                None => (chunk.len(), false),
            };
            self.input.consume(used);
            self.bytes += used as u64;
            if done {
                return Ok(());
            }
        }
    }
}

// ------------------------------------------------------------------------ import

/// Imports a SNAP text edge list into a new graph (see the module documentation). On error
/// every page allocated by the import is freed. `progress` is called with the input bytes
/// consumed so far.
pub fn import_edges(bm: &BufferManager, input: &mut dyn BufRead, progress: &mut dyn FnMut(u64)) -> Result<Graph> {
    let mut owned = OwnedPages { bm, pages: Vec::new() };
    let g = build(bm, input, progress, &mut owned)?;
    owned.pages.clear();
    Ok(g)
}

fn build<'a>(bm: &'a BufferManager, input: &mut dyn BufRead, progress: &mut dyn FnMut(u64), owned: &mut OwnedPages<'a>) -> Result<Graph> {
    let plan = Plan::new(bm);
    let budget = latch_budget(bm);
    // Parsing: edges (source << 64 | destination) and destinations (deduplicated) go to
    // two run generators sharing the budget 2:1.
    let mut edge_gen = RunGen::<u128>::new(bm, plan.workspace(bm, (budget * 2 / 3).saturating_sub(plan.run_page)), plan.run_page, false);
    let mut dst_gen = RunGen::<u64>::new(bm, plan.workspace(bm, (budget / 3).saturating_sub(plan.run_page)), plan.run_page, true);
    let mut lines = Lines { input, buf: Vec::new(), lineno: 0, bytes: 0 };
    let (mut edges, mut max_id) = (0u64, 0u64);
    let mut reported = 0u64;
    while let Some((lineno, line)) = lines.next()? {
        let Some((u, v)) = parse_line(line, lineno)? else { continue };
        edge_gen.push(((u as u128) << 64) | v as u128)?;
        dst_gen.push(v)?;
        edges += 1;
        max_id = max_id.max(u).max(v);
        if lines.bytes - reported >= 1 << 20 {
            reported = lines.bytes;
            progress(reported);
        }
    }
    progress(lines.bytes);
    let edge_runs = edge_gen.finish()?;
    let dst_runs = dst_gen.finish()?;
    // Writers keep one persistent page each latched (at most a sixteenth of the pool).
    let writer_page = bm.classes().page_size(bm.classes().class_for(Column::page_payload_for(bm, u64::MAX) as u64 + 32).unwrap_or(0));
    let merge_budget = budget.saturating_sub(3 * writer_page);

    let dense = edges == 0 || max_id <= edges.saturating_mul(4).saturating_add(1024);
    if dense {
        let index_space = if edges == 0 { 0 } else { max_id + 1 };
        let neighbour_format = if index_space <= 1 << 32 { ValueFormat::U32le } else { ValueFormat::U64le };
        let mut em = Merger::<u128>::new(bm, edge_runs, plan, plan.fan_in(merge_budget / 2), false)?;
        let mut dm = Merger::<u64>::new(bm, dst_runs, plan, plan.fan_in(merge_budget / 2), true)?;
        let mut offsets = ArrayWriter::new(bm, 8, index_space + 1);
        let mut nbrs = ArrayWriter::new(bm, neighbour_format.width(), edges);
        let mut exists = ArrayWriter::new(bm, 8, index_space.div_ceil(64));
        let (mut e, mut d) = (em.next()?, dm.next()?);
        let (mut pos, mut word, mut vertices) = (0u64, 0u64, 0u64);
        for id in 0..index_space {
            offsets.push(pos)?;
            let mut has = false;
            while let Some(x) = e {
                if (x >> 64) as u64 != id {
                    break;
                }
                nbrs.push(x as u64)?;
                pos += 1;
                has = true;
                e = em.next()?;
            }
            if d == Some(id) {
                has = true;
                d = dm.next()?;
            }
            if has {
                word |= 1 << (id % 64);
                vertices += 1;
            }
            if id % 64 == 63 {
                exists.push(word)?;
                word = 0;
            }
        }
        if index_space % 64 != 0 {
            exists.push(word)?;
        }
        offsets.push(pos)?;
        debug_assert!(e.is_none() && d.is_none() && pos == edges);
        drop((em, dm));
        return Ok(Graph {
            vertices,
            edges,
            index_space,
            renumbered: false,
            neighbour_format,
            offsets: offsets.finish(owned),
            neighbours: nbrs.finish(owned),
            exists: exists.finish(owned),
            ids: Vec::new(),
        });
    }

    // Renumbered. Pass A: the distinct ids (sources and destinations, merged) become `ids`;
    // offsets by source rank; edges go out again as (destination << 64 | source rank).
    let third = merge_budget / 3;
    let mut em = Merger::<u128>::new(bm, edge_runs, plan, plan.fan_in(third), false)?;
    let mut dm = Merger::<u64>::new(bm, dst_runs, plan, plan.fan_in(third), true)?;
    let mut by_dst = RunGen::<u128>::new(bm, plan.workspace(bm, third.saturating_sub(plan.run_page)), plan.run_page, false);
    let mut ids = ArrayWriter::new(bm, 8, 2 * edges);
    let mut offsets = ArrayWriter::new(bm, 8, 2 * edges + 1);
    let (mut e, mut d) = (em.next()?, dm.next()?);
    let (mut rank, mut pos) = (0u64, 0u64);
    loop {
        let id = match (e.map(|x| (x >> 64) as u64), d) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => break,
        };
        ids.push(id)?;
        offsets.push(pos)?;
        while let Some(x) = e {
            if (x >> 64) as u64 != id {
                break;
            }
            by_dst.push(((x as u64 as u128) << 64) | rank as u128)?;
            pos += 1;
            e = em.next()?;
        }
        if d == Some(id) {
            d = dm.next()?;
        }
        rank += 1;
    }
    offsets.push(pos)?;
    drop((em, dm));
    let vertices = rank;
    let ids = ids.finish(owned);
    let offsets = offsets.finish(owned);
    let neighbour_format = if vertices <= 1 << 32 { ValueFormat::U32le } else { ValueFormat::U64le };

    // Pass B: replace destination ids by their ranks (a merge join with `ids`), emitting
    // (source rank << 64 | destination rank).
    let half = merge_budget / 2;
    let mut m = Merger::<u128>::new(bm, by_dst.finish()?, plan, plan.fan_in(half), false)?;
    let mut by_src = RunGen::<u128>::new(bm, plan.workspace(bm, half.saturating_sub(plan.run_page)), plan.run_page, false);
    let mut idc = ArrayCursor::new(bm, &ids, 8)?;
    let mut r = 0u64;
    while let Some(x) = m.next()? {
        let dst = (x >> 64) as u64;
        while idc.get(r)? < dst {
            r += 1;
        }
        by_src.push(((x as u64 as u128) << 64) | r as u128)?;
    }
    idc.release();
    drop(m);

    // Pass C: neighbours in (source rank, destination rank) order.
    let mut m = Merger::<u128>::new(bm, by_src.finish()?, plan, plan.fan_in(merge_budget), false)?;
    let mut nbrs = ArrayWriter::new(bm, neighbour_format.width(), edges);
    while let Some(x) = m.next()? {
        nbrs.push(x as u64)?;
    }
    drop(m);
    Ok(Graph { vertices, edges, index_space: vertices, renumbered: true, neighbour_format, offsets, neighbours: nbrs.finish(owned), exists: Vec::new(), ids })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn bm(pool: u64) -> (tempfile::TempDir, BufferManager) {
        let dir = tempfile::tempdir().unwrap();
        let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(4096).pool_size(pool)).unwrap();
        (dir, bm)
    }

    /// Adjacency (by original id) read back from a graph.
    fn adjacency(bm: &BufferManager, g: &Graph) -> std::collections::BTreeMap<u64, Vec<u64>> {
        let mut ids = Vec::new();
        for_each_value(bm, &g.ids, 8, |_, v| {
            ids.push(v);
            Ok(())
        })
        .unwrap();
        let id = |i: u64| if g.renumbered { ids[i as usize] } else { i };
        let mut off = ArrayCursor::new(bm, &g.offsets, 8).unwrap();
        let mut nb = ArrayCursor::new(bm, &g.neighbours, g.neighbour_width()).unwrap();
        let mut out = std::collections::BTreeMap::new();
        for i in 0..g.index_space {
            let (a, b) = (off.get(i).unwrap(), off.get(i + 1).unwrap());
            let mut list = Vec::new();
            nb.for_range(a, b, |bytes| {
                list.extend(bytes.chunks_exact(g.neighbour_width()).map(|c| id(decode(c))));
                Ok(())
            })
            .unwrap();
            if !list.is_empty() {
                out.insert(id(i), list);
            }
        }
        out
    }

    #[test]
    fn lines_parse_with_comments_and_errors_name_the_line() {
        assert_eq!(parse_line(b"  1\t2 \r", 1).unwrap(), Some((1, 2)));
        assert_eq!(parse_line(b"# comment", 1).unwrap(), None);
        assert_eq!(parse_line(b"   ", 1).unwrap(), None);
        assert_eq!(parse_line(b"3 4 # trailing", 1).unwrap(), Some((3, 4)));
        assert_eq!(parse_line(b"18446744073709551615 0", 1).unwrap(), Some((u64::MAX, 0)));
        for (line, what) in [
            (&b"1"[..], "two vertex ids"),
            (b"1 2 3", "two vertex ids"),
            (b"1 x", "not a non-negative"),
            (b"-1 2", "not a non-negative"),
            (b"18446744073709551616 1", "does not fit"),
        ] {
            let e = parse_line(line, 42).unwrap_err().to_string();
            assert!(e.contains("line 42") && e.contains(what), "{e}");
        }
    }

    #[test]
    fn dense_and_renumbered_graphs_hold_the_edges_and_verify() {
        let (_d, bm) = bm(512 << 10);
        for (text, renumbered) in [("# g\n1 2\n1 2\n2 2\n\n5 1\n2 7 # c\n", false), ("1000000000000 5\n5 1000000000000\n5 5\n77 5\n", true)] {
            let g = import_edges(&bm, &mut text.as_bytes(), &mut |_| {}).unwrap();
            assert_eq!(g.renumbered, renumbered);
            g.verify(&bm, "g").unwrap();
            let mut want: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
            let mut ids = std::collections::BTreeSet::new();
            for l in text.lines() {
                if let Some((u, v)) = parse_line(l.as_bytes(), 0).unwrap() {
                    want.entry(u).or_default().push(v);
                    ids.extend([u, v]);
                }
            }
            want.values_mut().for_each(|l| l.sort_unstable());
            assert_eq!(adjacency(&bm, &g), want);
            assert_eq!(g.vertices, ids.len() as u64);
            for id in [0u64, 1, 2, 3, 5, 7, 77, 1_000_000_000_000, u64::MAX] {
                let got = g.index_of(&bm, id).unwrap();
                assert_eq!(got.is_some(), ids.contains(&id), "id {id}");
            }
        }
        let empty = import_edges(&bm, &mut &b"# nothing\n"[..], &mut |_| {}).unwrap();
        assert_eq!((empty.vertices, empty.edges, empty.index_space), (0, 0, 0));
        empty.verify(&bm, "e").unwrap();
        assert_eq!(crate::testutil::temp_pages(&bm), 0);
    }

    #[test]
    fn a_bad_line_frees_everything() {
        let (_d, bm) = bm(512 << 10);
        let mut text = String::new();
        for i in 0..50_000u64 {
            text.push_str(&format!("{} {}\n", i * 7 % 1000, i % 333));
        }
        text.push_str("12 x\n");
        let before = bm.allocated_pages().len();
        let e = import_edges(&bm, &mut text.as_bytes(), &mut |_| {}).unwrap_err().to_string();
        assert!(e.contains("line 50001"), "{e}");
        assert_eq!(bm.allocated_pages().len(), before);
        assert_eq!(crate::testutil::temp_pages(&bm), 0);
        bm.check_invariants().unwrap();
    }
}
