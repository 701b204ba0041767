//! External sort, graph import and BFS against straightforward in-memory references, through
//! pools many times smaller than the data.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use strata::access::{Catalog, ValueFormat};
use strata::ops::{bfs, sort_column, BfsResult, SortResult};
use strata::{Config, Database};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn db(dir: &tempfile::TempDir, min_page: u64, pool: u64) -> Database {
    Database::create(Config::new(dir.path().join("db")).min_page(min_page).pool_size(pool)).unwrap()
}

fn temp_pages(db: &Database) -> u64 {
    db.buffer().stats().classes.iter().map(|c| c.temp_pages).sum()
}

/// The contract's answer for `sort` computed in memory (values as i128, checksum on the
/// u64 two's complement image).
fn sort_reference(mut vals: Vec<i128>, top: usize) -> SortResult {
    vals.sort_unstable();
    let k = top.min(vals.len());
    let checksum = vals.iter().enumerate().fold(0u64, |s, (i, &v)| s.wrapping_add((i as u64 + 1).wrapping_mul(v as u64)));
    SortResult { first: vals[..k].to_vec(), last: vals[vals.len() - k..].to_vec(), checksum }
}

fn import_values(db: &Database, name: &str, format: ValueFormat, vals: &[i128]) {
    let bytes: Vec<u8> = match format {
        ValueFormat::U32le => vals.iter().flat_map(|&v| (v as u32).to_le_bytes()).collect(),
        _ => vals.iter().flat_map(|&v| (v as u64).to_le_bytes()).collect(),
    };
    db.import(name, format, &mut &bytes[..], bytes.len() as u64, &mut |_| {}).unwrap();
}

/// Sorts through `pool` and compares with the reference; returns the bytes written (spills).
fn check_sort(min_page: u64, pool: u64, format: ValueFormat, vals: Vec<i128>, top: usize, threads: &[usize]) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let db = db(&dir, min_page, pool);
    import_values(&db, "v", format, &vals);
    let col = db.column("v").unwrap();
    let want = sort_reference(vals, top);
    let written = db.buffer().stats().bytes_written;
    for &t in threads {
        let got = sort_column(db.buffer(), &col, top, t).unwrap();
        assert_eq!(got, want, "{format:?} pool {pool} min_page {min_page} threads {t}");
        assert_eq!(temp_pages(&db), 0, "every temporary page is freed");
        db.buffer().check_invariants().unwrap();
    }
    assert!(db.buffer().peak_bytes() <= pool);
    let spilled = db.buffer().stats().bytes_written - written;
    db.check().unwrap();
    spilled
}

#[test]
fn sort_of_random_u64_sixteen_times_the_pool() {
    // 3 M values (24 MiB) through a 2 MiB pool of 4 KiB pages: many runs that spill.
    let mut r = Rng(1);
    let vals: Vec<i128> = (0..3_000_000).map(|_| r.next() as i128).collect();
    let spilled = check_sort(4096, 2 << 20, ValueFormat::U64le, vals, 10, &[2]);
    assert!(spilled >= 20 << 20, "runs must spill: {spilled} bytes written");
}

#[test]
fn sort_of_duplicate_heavy_u32_with_a_large_top() {
    let mut r = Rng(2);
    let vals: Vec<i128> = (0..4_000_000).map(|_| (r.next() % 100) as i128).collect();
    check_sort(4096, 2 << 20, ValueFormat::U32le, vals, 1000, &[1]);
}

#[test]
fn sort_with_many_extreme_values_over_many_runs() {
    // Runs that end in the largest key tie with exhausted runs in the merge.
    let mut r = Rng(4);
    let vals: Vec<i128> = (0..300_000).map(|_| [0, 1, u64::MAX as i128][(r.next() % 3) as usize]).collect();
    check_sort(4096, 1 << 20, ValueFormat::U64le, vals, 10, &[1, 3]);
    let vals: Vec<i128> = (0..300_000).map(|_| [i64::MIN as i128, -1, i64::MAX as i128][(r.next() % 3) as usize]).collect();
    check_sort(4096, 1 << 20, ValueFormat::I64le, vals, 10, &[2]);
    let vals: Vec<i128> = (0..300_000).map(|_| if r.next().is_multiple_of(4) { u32::MAX as i128 } else { (r.next() % 1000) as i128 }).collect();
    check_sort(64 << 10, 1 << 20, ValueFormat::U32le, vals, 10, &[1, 2]);
}

#[test]
fn sort_of_distinct_i64_needs_several_merge_passes() {
    // 64 KiB pages in a 1 MiB pool: a merge fan-in of a few runs, so 1.5 M values
    // (12 MiB) take several passes.
    let n = 1_500_000i128;
    let vals: Vec<i128> = (0..n).map(|i| ((i * 7_919) % n - n / 2) * 1_000_000_007).collect();
    check_sort(64 << 10, 1 << 20, ValueFormat::I64le, vals, 7, &[3]);
    let mut r = Rng(3);
    let vals: Vec<i128> = (0..200_000).map(|_| r.next() as i64 as i128).collect();
    check_sort(4096, 1 << 20, ValueFormat::I64le, vals, 10, &[1, 2]);
}

#[test]
fn sort_of_small_and_empty_columns() {
    for (vals, top) in [(vec![], 10), (vec![5], 10), (vec![3, 1, 2], 0), (vec![9, 9, 1, 1, 4], 2), ((0..100).rev().collect::<Vec<i128>>(), 1000)] {
        check_sort(4096, 1 << 20, ValueFormat::U32le, vals, top, &[1, 4]);
    }
    check_sort(4096, 1 << 20, ValueFormat::U64le, vec![u64::MAX as i128, 0, u64::MAX as i128], 2, &[1]);
    check_sort(4096, 1 << 20, ValueFormat::I64le, vec![i64::MIN as i128, i64::MAX as i128, -1, 0], 3, &[2]);
    // A column that was imported and is empty.
    let dir = tempfile::tempdir().unwrap();
    let db = db(&dir, 4096, 1 << 20);
    db.import("e", ValueFormat::U64le, &mut &[][..], 0, &mut |_| {}).unwrap();
    let r = sort_column(db.buffer(), &db.column("e").unwrap(), 10, 2).unwrap();
    assert_eq!(r, SortResult { first: vec![], last: vec![], checksum: 0 });
}

// ----------------------------------------------------------------------------- graphs

fn bfs_reference(edges: &[(u64, u64)], s: u64) -> BfsResult {
    let mut adj: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for &(u, v) in edges {
        adj.entry(u).or_default().push(v);
    }
    let mut dist = BTreeMap::from([(s, 0u64)]);
    let mut q = VecDeque::from([s]);
    while let Some(u) = q.pop_front() {
        let d = dist[&u];
        for &v in adj.get(&u).map(|v| v.as_slice()).unwrap_or(&[]) {
            dist.entry(v).or_insert_with(|| {
                q.push_back(v);
                d + 1
            });
        }
    }
    BfsResult { reached: dist.len() as u64, max_depth: dist.values().copied().max().unwrap(), depth_sum: dist.values().fold(0u64, |a, &d| a.wrapping_add(d)) }
}

fn edge_text(edges: &[(u64, u64)]) -> String {
    let mut s = String::from("# a test graph\n\n");
    for (i, (u, v)) in edges.iter().enumerate() {
        match i % 5 {
            0 => s.push_str(&format!("{u}\t{v}\n")),
            1 => s.push_str(&format!("  {u}   {v}  # comment\n")),
            2 => s.push_str(&format!("{u} {v}\r\n")),
            _ => s.push_str(&format!("{u} {v}\n")),
        }
    }
    s
}

/// A random graph with self-loops, parallel edges, a second component that the first
/// cannot reach, and sinks (vertices with in-edges only).
fn random_graph(r: &mut Rng, n: u64, m: usize, scale: u64) -> Vec<(u64, u64)> {
    let mut edges: Vec<(u64, u64)> = Vec::with_capacity(m + 100);
    for _ in 0..m {
        // Skewed: low ids are hubs.
        let u = (r.next() % n).min(r.next() % n);
        let v = r.next() % n;
        edges.push((u * scale, v * scale));
    }
    for i in 0..50 {
        edges.push((i * scale, i * scale)); // self-loops
        edges.push((i * scale, (i + 1) * scale));
        edges.push((i * scale, (i + 1) * scale)); // parallel edges
    }
    // Another component, unreachable from the first: n..n+20 in a chain and a loop-only vertex.
    for i in n..n + 20 {
        edges.push((i * scale, (i + 1) * scale));
    }
    edges.push(((n + 40) * scale, (n + 40) * scale));
    edges
}

fn sources_to_try(edges: &[(u64, u64)]) -> Vec<u64> {
    let srcs: BTreeSet<u64> = edges.iter().map(|e| e.0).collect();
    let sink = edges.iter().map(|e| e.1).find(|v| !srcs.contains(v)).expect("a sink");
    vec![edges[0].0, edges[edges.len() / 2].0, edges[edges.len() - 1].0, edges[edges.len() - 3].0, sink]
}

fn check_graph(min_page: u64, pool: u64, edges: &[(u64, u64)], renumbered: bool) {
    let dir = tempfile::tempdir().unwrap();
    let d = db(&dir, min_page, pool);
    let text = edge_text(edges);
    let g = d.import_edges("g", &mut text.as_bytes(), &mut |_| {}).unwrap();
    assert_eq!(g.renumbered, renumbered);
    assert_eq!(g.edges, edges.len() as u64);
    let ids: BTreeSet<u64> = edges.iter().flat_map(|&(u, v)| [u, v]).collect();
    assert_eq!(g.vertices, ids.len() as u64);
    assert_eq!(temp_pages(&d), 0);
    d.check().unwrap();
    let sources = sources_to_try(edges);
    for (k, &s) in sources.iter().enumerate() {
        let got = bfs(d.buffer(), &g, s, 1 + k % 3).unwrap();
        assert_eq!(got, bfs_reference(edges, s), "source {s}");
    }
    assert_eq!(bfs(d.buffer(), &g, *sources.last().unwrap(), 2).unwrap(), BfsResult { reached: 1, max_depth: 0, depth_sum: 0 });
    let missing = (0..).map(|i| i * 3 + 1).find(|i| !ids.contains(i)).unwrap();
    let e = bfs(d.buffer(), &g, missing, 1).unwrap_err().to_string();
    assert!(e.contains("does not exist") && e.contains(&missing.to_string()), "{e}");
    assert_eq!(temp_pages(&d), 0);
    assert!(d.buffer().peak_bytes() <= pool);
    d.buffer().check_invariants().unwrap();
    d.close().unwrap();
    // Persisted: reopen, check, same answer.
    let d = Database::open(Config::new(dir.path().join("db")).pool_size(pool)).unwrap();
    assert_eq!(d.check().unwrap().graphs, 1);
    let g = d.graph("g").unwrap();
    assert_eq!(bfs(d.buffer(), &g, sources[0], 2).unwrap(), bfs_reference(edges, sources[0]));
}

#[test]
fn bfs_on_dense_graphs_larger_than_the_pool() {
    let mut r = Rng(11);
    // 300 k edges: about 3.6 MiB of text and 4.8 MiB of edges in runs, through 1 MiB.
    check_graph(4096, 1 << 20, &random_graph(&mut r, 60_000, 300_000, 1), false);
    check_graph(64 << 10, 2 << 20, &random_graph(&mut r, 2_000, 20_000, 1), false);
}

#[test]
fn bfs_on_renumbered_sparse_ids() {
    let mut r = Rng(12);
    check_graph(4096, 1 << 20, &random_graph(&mut r, 30_000, 150_000, 1 << 40), true);
    // Ids up to u64::MAX.
    let edges = vec![(u64::MAX, 0), (0, u64::MAX - 1), (u64::MAX - 1, 7), (7, u64::MAX)];
    let dir = tempfile::tempdir().unwrap();
    let d = db(&dir, 4096, 1 << 20);
    let g = d.import_edges("big", &mut edge_text(&edges).as_bytes(), &mut |_| {}).unwrap();
    assert!(g.renumbered);
    assert_eq!(bfs(d.buffer(), &g, 7, 1).unwrap(), bfs_reference(&edges, 7));
    d.check().unwrap();
}

#[test]
fn bad_edge_lists_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let d = db(&dir, 4096, 1 << 20);
    let mut r = Rng(5);
    let good: String = (0..100_000).map(|_| format!("{} {}\n", r.next() % 5000, r.next() % 5000)).collect();
    d.import_edges("ok", &mut good.as_bytes(), &mut |_| {}).unwrap();
    let pages = d.buffer().allocated_pages().len();
    let catalog = d.catalog();
    for (bad, line, what) in [
        (format!("{good}1 2 3\n"), 100_001, "two vertex ids"),
        (format!("# c\n{good}7 x\n"), 100_002, "not a non-negative integer"),
        (format!("{good}18446744073709551616 1\n"), 100_001, "does not fit"),
        (format!("1 2\n-3 4\n{good}"), 2, "not a non-negative integer"),
        ("1\n".to_owned(), 1, "two vertex ids"),
    ] {
        let e = d.import_edges("bad", &mut bad.as_bytes(), &mut |_| {}).unwrap_err().to_string();
        assert!(e.contains(&format!("line {line}")) && e.contains(what), "{e}");
        assert_eq!(d.buffer().allocated_pages().len(), pages, "pages of the failed import are freed");
        assert_eq!(d.catalog(), catalog, "nothing added to the catalog");
        assert_eq!(temp_pages(&d), 0);
        d.check().unwrap();
    }
    let e = d.import_edges("ok", &mut "1 2\n".as_bytes(), &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("already exists"), "{e}");
    assert!(d.graph("nope").unwrap_err().to_string().contains("no graph named \"nope\""));
    d.close().unwrap();
    let d = Database::open(Config::new(dir.path().join("db")).pool_size(1 << 20)).unwrap();
    let report = d.check().unwrap();
    assert_eq!((report.graphs, report.unreferenced_pages), (1, 0));
}

#[test]
fn catalogs_without_graphs_still_load() {
    let json = br#"{"columns":{}}"#;
    let mut bytes = b"STRATCAT".to_vec();
    bytes.extend_from_slice(&crc32c::crc32c(json).to_le_bytes());
    bytes.extend_from_slice(json);
    let c = Catalog::decode(&bytes, std::path::Path::new("catalog.json")).unwrap();
    assert!(c.graphs.is_empty() && c.columns.is_empty());
}

#[test]
fn structures_written_with_a_large_pool_work_through_a_tiny_one() {
    // Pages are sized for the pool of the import (up to a sixteenth of it); a later query
    // with a pool a few times those pages still completes (one CSR page latched at a time).
    let dir = tempfile::tempdir().unwrap();
    let mut r = Rng(21);
    let edges = random_graph(&mut r, 60_000, 300_000, 1);
    let vals: Vec<i128> = (0..400_000).map(|_| (r.next() >> 11) as i128).collect();
    {
        let d = db(&dir, 4096, 64 << 20);
        d.import_edges("g", &mut edge_text(&edges).as_bytes(), &mut |_| {}).unwrap();
        import_values(&d, "v", ValueFormat::U64le, &vals);
        d.close().unwrap();
    }
    let pool = 128 << 10;
    let d = Database::open(Config::new(dir.path().join("db")).pool_size(pool)).unwrap();
    let g = d.graph("g").unwrap();
    let biggest = g.pages().map(|(_, p)| d.buffer().classes().page_size(p.page_id().class())).max().unwrap();
    assert!(biggest >= 32 << 10, "the test needs pages large for the pool ({biggest})");
    for (s, threads) in [(edges[0].0, 2), (edges[7].0, 1)] {
        assert_eq!(bfs(d.buffer(), &g, s, threads).unwrap(), bfs_reference(&edges, s));
    }
    let got = sort_column(d.buffer(), &d.column("v").unwrap(), 5, 2).unwrap();
    assert_eq!(got, sort_reference(vals, 5));
    assert!(d.buffer().peak_bytes() <= pool);
    assert_eq!(temp_pages(&d), 0);
    d.check().unwrap();
}

#[test]
fn a_top_far_larger_than_the_pool_streams_first_and_last_from_temporary_pages() {
    // 400 K i64 values, top 300 K (first and last overlap): 4.8 MiB of result from a 1 MiB pool.
    let dir = tempfile::tempdir().unwrap();
    let pool = 1 << 20;
    let db = db(&dir, 4096, pool);
    let mut r = Rng(17);
    let vals: Vec<i128> = (0..400_000).map(|_| (r.next() as i64 >> 20) as i128).collect();
    import_values(&db, "v", ValueFormat::I64le, &vals);
    let col = db.column("v").unwrap();
    let want = sort_reference(vals, 300_000);
    for threads in [1, 2] {
        let mut s = strata::ops::sort_column_stream(db.buffer(), &col, 300_000, threads).unwrap();
        assert_eq!((s.len(), s.top()), (400_000, 300_000));
        let mut first = Vec::new();
        while let Some(v) = s.next_first().unwrap() {
            first.push(v);
        }
        let mut last = Vec::new();
        while let Some(v) = s.next_last().unwrap() {
            last.push(v);
        }
        assert!(first == want.first && last == want.last, "threads {threads}: first/last differ from the reference");
        assert_eq!(s.checksum().unwrap(), want.checksum);
        assert!(s.next_first().unwrap().is_none() && s.next_last().unwrap().is_none());
        drop(s);
        assert_eq!(temp_pages(&db), 0, "every temporary page is freed");
    }
    // The last values without reading the first ones; then a stream dropped half-read.
    let mut s = strata::ops::sort_column_stream(db.buffer(), &col, 300_000, 2).unwrap();
    assert_eq!(s.checksum().unwrap(), want.checksum);
    assert_eq!(s.next_first().unwrap(), None, "the first values were passed by the merge");
    assert_eq!(s.next_last().unwrap(), Some(want.last[0]));
    drop(s);
    let mut s = strata::ops::sort_column_stream(db.buffer(), &col, 300_000, 1).unwrap();
    for _ in 0..1000 {
        s.next_first().unwrap();
    }
    drop(s);
    assert_eq!(temp_pages(&db), 0, "a half-read stream frees its pages");
    assert!(db.buffer().peak_bytes() <= pool);
    db.check().unwrap();
}
