//! Breadth-first search over a CSR [`Graph`] (`bfs GRAPH --source V`), level by level, with
//! every byte of its state in buffer-managed temporary pages.
//!
//! * **Visited set**: a bitmap over the graph's index space in temporary pages, allocated
//!   lazily (a page is created the first time one of its bits is set).
//! * **Frontier**: a sorted, duplicate-free [`Run`] of vertex indices.
//! * **Expansion** (parallel, `threads` workers): workers take morsels of the frontier, look
//!   up each vertex's offsets and neighbours (ascending frontier order makes the accesses
//!   to the CSR pages sequential), drop neighbours already visited (the bitmap is read-only
//!   during expansion: shared latches only), and feed the rest to their own run generator,
//!   which sorts and deduplicates its workspace before spilling it.
//! * **Next frontier** (one thread): the candidate runs are merged without duplicates; each
//!   candidate not yet visited is marked (ascending, so the bitmap is written page after
//!   page) and appended to the next frontier.
//!
//! Like the sort, what each thread keeps latched (workspace, a frontier page, one offsets
//! and one neighbours page, a few bitmap pages, a run page) stays within its share of half
//! the pool; the merge keeps one page per candidate run.

use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;

use crate::access::extsort::{latch_budget, page_at_most, Merger, Plan, Record, Run, RunGen, RunWriter};
use crate::access::graph::ArrayCursor;
use crate::access::{Graph, TempPage, ValueFormat};
use crate::buffer::{BufferManager, ExclusiveGuard, SharedGuard};
use crate::error::{Error, Result};
use crate::storage::PAGE_HEADER_SIZE;

/// Result of [`bfs`] (contract: `bfs GRAPH --source V`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BfsResult {
    /// Vertices reachable from the source, the source included.
    pub reached: u64,
    /// Largest hop distance from the source.
    pub max_depth: u64,
    /// Sum of the hop distances, mod 2^64.
    pub depth_sum: u64,
}

/// Runs a BFS from the vertex with id `source` following edges `u -> v`.
pub fn bfs(bm: &BufferManager, graph: &Graph, source: u64, threads: usize) -> Result<BfsResult> {
    // The visited bitmap is sized by the index space: check it against the arrays first
    // (a damaged catalog entry must be an error, not a huge allocation).
    graph.check_shape(bm, "traversed")?;
    let s =
        graph.index_of(bm, source)?.ok_or_else(|| Error::InvalidInput(format!("source vertex {source} does not exist in the graph (no edge mentions it)")))?;
    match graph.neighbour_format {
        ValueFormat::U32le => run::<u32>(bm, graph, s, threads),
        _ => run::<u64>(bm, graph, s, threads),
    }
}

/// Slots of the per-thread cache of latched bitmap pages (direct-mapped).
const PROBE_SLOTS: usize = 4;
/// Frontier vertices per expansion morsel.
const MORSEL: u32 = 2048;

/// The visited bitmap, in lazily allocated temporary pages.
struct Visited<'a> {
    bm: &'a BufferManager,
    pages: Vec<Option<TempPage<'a>>>,
    payload: usize,
    bits_per_page: u64,
}

impl<'a> Visited<'a> {
    fn new(bm: &'a BufferManager, index_space: u64, page: u64) -> Visited<'a> {
        let payload = page as usize - PAGE_HEADER_SIZE;
        let bits_per_page = payload as u64 * 8;
        let n = index_space.div_ceil(bits_per_page) as usize;
        Visited { bm, pages: (0..n).map(|_| None).collect(), payload, bits_per_page }
    }
}

/// Read-only access to the bitmap during expansion, caching a few shared latches.
struct Probe<'a, 'v> {
    vis: &'v Visited<'a>,
    slots: [Option<(u64, SharedGuard<'a>)>; PROBE_SLOTS],
}

impl<'a, 'v> Probe<'a, 'v> {
    fn new(vis: &'v Visited<'a>) -> Probe<'a, 'v> {
        Probe { vis, slots: Default::default() }
    }

    /// Whether index `w` is visited.
    #[inline]
    fn test(&mut self, w: u64) -> Result<bool> {
        let (p, bit) = (w / self.vis.bits_per_page, w % self.vis.bits_per_page);
        let slot = &mut self.slots[p as usize % PROBE_SLOTS];
        if slot.as_ref().is_none_or(|(q, _)| *q != p) {
            *slot = None;
            match self.vis.pages.get(p as usize) {
                Some(Some(page)) => *slot = Some((p, page.shared()?)),
                Some(None) => return Ok(false),
                None => return Err(Error::Inconsistent(format!("vertex index {w} beyond the graph's index space"))),
            }
        }
        let (_, g) = slot.as_ref().expect("latched bitmap page");
        Ok(g.data()[(bit / 8) as usize] >> (bit % 8) & 1 == 1)
    }
}

/// Marks vertices visited (one thread, ascending order), one latched page at a time.
struct Marker<'a, 'v> {
    vis: &'v mut Visited<'a>,
    cur: Option<(u64, ExclusiveGuard<'a>)>,
}

impl<'a> Marker<'a, '_> {
    /// Marks `w`; returns whether it was not visited before.
    #[inline]
    fn mark(&mut self, w: u64) -> Result<bool> {
        let (p, bit) = (w / self.vis.bits_per_page, w % self.vis.bits_per_page);
        if self.cur.as_ref().is_none_or(|(q, _)| *q != p) {
            self.cur = None;
            let slot = self.vis.pages.get_mut(p as usize).ok_or_else(|| Error::Inconsistent(format!("vertex index {w} beyond the graph's index space")))?;
            let g = match slot {
                Some(page) => page.exclusive()?,
                None => {
                    let (page, g) = TempPage::alloc(self.vis.bm, self.vis.payload)?;
                    *slot = Some(page);
                    g
                }
            };
            self.cur = Some((p, g));
        }
        let (_, g) = self.cur.as_mut().expect("latched bitmap page");
        let byte = &mut g.data_mut().expect("temporary page")[(bit / 8) as usize];
        let mask = 1u8 << (bit % 8);
        let fresh = *byte & mask == 0;
        *byte |= mask;
        Ok(fresh)
    }
}

/// Largest page size of a paged array (0 if empty).
fn max_page(bm: &BufferManager, pages: &[crate::access::ColumnPage]) -> u64 {
    pages.iter().map(|p| p.page_id().class()).max().map_or(0, |c| bm.classes().page_size(c))
}

fn run<T: Record>(bm: &BufferManager, graph: &Graph, source: u64, threads: usize) -> Result<BfsResult> {
    let plan = Plan::new(bm);
    let budget = latch_budget(bm);
    let width = graph.neighbour_width();
    let graph_pages = max_page(bm, &graph.offsets) + max_page(bm, &graph.neighbours);
    let min = bm.classes().min_page();
    // Per thread: workspace + frontier page + run page + offsets and neighbours pages +
    // PROBE_SLOTS bitmap pages (a sixteenth of the thread's share each, at most).
    let per_thread_min = 4 * min + 2 * plan.run_page + graph_pages + PROBE_SLOTS as u64 * min;
    let threads = threads.clamp(1, (budget / per_thread_min).max(1) as usize);
    let share = budget / threads as u64;
    // Pages written by an import with a much larger pool can be large for this one: then
    // hold one CSR page at a time (the offsets page is released before the neighbours are
    // read; ascending frontier order makes re-fixing it a hit).
    let tight = graph_pages > share / 2;
    let graph_pages = if tight { max_page(bm, &graph.offsets).max(max_page(bm, &graph.neighbours)) } else { graph_pages };
    let bitmap_bytes = graph.index_space.div_ceil(8) + PAGE_HEADER_SIZE as u64;
    let vis_page = page_at_most(bm, (share / 16).min(1 << 20).min(bitmap_bytes.next_power_of_two()));
    let fixed = 2 * plan.run_page + graph_pages + PROBE_SLOTS as u64 * vis_page;
    let workspace = plan.workspace(bm, share.saturating_sub(fixed));

    let mut visited = Visited::new(bm, graph.index_space, vis_page);
    let mut result = BfsResult { reached: 1, max_depth: 0, depth_sum: 0 };
    let mut frontier = {
        Marker { vis: &mut visited, cur: None }.mark(source)?;
        let mut w = RunWriter::<T>::new(bm, plan.run_page);
        w.push(T::from_u64(source))?;
        w.finish()
    };
    let mut depth = 0u64;
    while frontier.len() > 0 {
        depth += 1;
        // Expansion.
        let morsels: Vec<(usize, u32, u32)> = frontier
            .pages()
            .iter()
            .enumerate()
            .flat_map(|(p, &(_, count))| (0..count).step_by(MORSEL as usize).map(move |a| (p, a, (a + MORSEL).min(count))))
            .collect();
        let next = AtomicUsize::new(0);
        let (vis, front) = (&visited, &frontier);
        let worker = || -> Result<Vec<Run<'_>>> {
            let mut gen = RunGen::<T>::new(bm, workspace, plan.run_page, true);
            let mut probe = Probe::new(vis);
            let mut off = ArrayCursor::new(bm, &graph.offsets, 8)?;
            let mut nb = ArrayCursor::new(bm, &graph.neighbours, width)?;
            let mut fpage: Option<(usize, SharedGuard<'_>)> = None;
            while let Some(&(p, a, b)) = morsels.get(next.fetch_add(1, Ordering::Relaxed)) {
                if fpage.as_ref().is_none_or(|(q, _)| *q != p) {
                    drop(fpage.take()); // release the old page before latching the next
                    fpage = Some((p, bm.fix_shared(front.pages()[p].0)?));
                }
                let (_, fg) = fpage.as_ref().expect("frontier page");
                for k in a as usize..b as usize {
                    let v = T::load(&fg.data()[k * T::SIZE..]).to_u64();
                    let (lo, hi) = (off.get(v)?, off.get(v + 1)?);
                    if tight {
                        off.release();
                    }
                    nb.for_range(lo, hi, |bytes| {
                        for c in bytes.chunks_exact(width) {
                            let w = if width == 4 { u32::load(c) as u64 } else { u64::load(c) };
                            if !probe.test(w)? {
                                gen.push(T::from_u64(w))?;
                            }
                        }
                        Ok(())
                    })?;
                    if tight {
                        nb.release();
                    }
                }
            }
            drop((fpage, probe, off, nb));
            gen.finish()
        };
        let runs = if threads == 1 || morsels.len() == 1 {
            worker()?
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads.min(morsels.len())).map(|_| s.spawn(worker)).collect();
                let mut runs = Vec::new();
                let mut first_err = None;
                for h in handles {
                    match h.join().expect("bfs worker panicked") {
                        Ok(r) => runs.extend(r),
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
                first_err.map_or(Ok(runs), Err)
            })?
        };
        drop(std::mem::replace(&mut frontier, RunWriter::<T>::new(bm, plan.run_page).finish()));
        // Next frontier: candidates in order, without duplicates, not yet visited.
        let merge_budget = budget.saturating_sub(plan.run_page + vis_page);
        let mut m = Merger::<T>::new(bm, runs, plan, plan.fan_in(merge_budget), true)?;
        let mut marker = Marker { vis: &mut visited, cur: None };
        let mut out = RunWriter::<T>::new(bm, plan.run_page);
        while let Some(w) = m.next()? {
            if marker.mark(w.to_u64())? {
                out.push(w)?;
            }
        }
        drop((m, marker));
        let found = out.len();
        frontier = out.finish();
        if found > 0 {
            result.reached += found;
            result.max_depth = depth;
            result.depth_sum = result.depth_sum.wrapping_add(depth.wrapping_mul(found));
        }
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::graph::import_edges;
    use crate::Config;
    use std::collections::{BTreeMap, VecDeque};

    fn reference(edges: &[(u64, u64)], s: u64) -> BfsResult {
        let mut adj: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for &(u, v) in edges {
            adj.entry(u).or_default().push(v);
        }
        let mut dist = BTreeMap::from([(s, 0u64)]);
        let mut q = VecDeque::from([s]);
        while let Some(u) = q.pop_front() {
            let d = dist[&u];
            for &v in adj.get(&u).map(|v| v.as_slice()).unwrap_or(&[]) {
                if let std::collections::btree_map::Entry::Vacant(e) = dist.entry(v) {
                    e.insert(d + 1);
                    q.push_back(v);
                }
            }
        }
        BfsResult {
            reached: dist.len() as u64,
            max_depth: dist.values().copied().max().unwrap_or(0),
            depth_sum: dist.values().fold(0u64, |a, &d| a.wrapping_add(d)),
        }
    }

    #[test]
    fn bfs_matches_a_reference_on_small_graphs() {
        let dir = tempfile::tempdir().unwrap();
        let bm = BufferManager::create(Config::new(dir.path().join("db")).min_page(4096).pool_size(1 << 20)).unwrap();
        let mut seed = 3u64;
        let mut rng = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for (n, m, scale) in [(50u64, 120usize, 1u64), (2000, 6000, 1), (300, 900, 1 << 40)] {
            let edges: Vec<(u64, u64)> = (0..m).map(|_| ((rng() % n) * scale, (rng() % n) * scale)).collect();
            let text: String = edges.iter().map(|(u, v)| format!("{u} {v}\n")).collect();
            let g = import_edges(&bm, &mut text.as_bytes(), &mut |_| {}).unwrap();
            assert_eq!(g.renumbered, scale > 1);
            for &(s, _) in edges.iter().take(5) {
                for threads in [1, 2] {
                    assert_eq!(bfs(&bm, &g, s, threads).unwrap(), reference(&edges, s), "n {n} source {s}");
                }
            }
            // A vertex with only in-edges.
            let sources: std::collections::BTreeSet<u64> = edges.iter().map(|e| e.0).collect();
            if let Some(&(_, v)) = edges.iter().find(|e| !sources.contains(&e.1)) {
                assert_eq!(bfs(&bm, &g, v, 2).unwrap(), BfsResult { reached: 1, max_depth: 0, depth_sum: 0 });
            }
            let e = bfs(&bm, &g, u64::MAX - 1, 1).unwrap_err().to_string();
            assert!(e.contains("does not exist"), "{e}");
        }
        assert_eq!(crate::testutil::temp_pages(&bm), 0);
        bm.check_invariants().unwrap();
    }
}
