//! Hash aggregation (groupby / distinct / general aggregates) and the equi-join against
//! straightforward in-memory references, on seeded random inputs: all three value formats,
//! empty columns, duplicate-heavy and all-distinct keys, and pools of a few MiB over data many
//! times larger (many spills, recursive partitioning), always within the pool.

use std::collections::HashMap;

use strata::access::{Column, ValueFormat};
use strata::ops::{aggregate, distinct, groupby_mod, join_count_with_stats, Aggregates, DistinctResult, Group, GroupSink, GroupbyModResult, JoinResult};
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
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}

/// A value as the column stores it: the raw bits (u32 zero-extended, i64 two's complement).
fn value(format: ValueFormat, raw: u64) -> i128 {
    match format {
        ValueFormat::U32le => raw as u32 as i128,
        ValueFormat::U64le => raw as i128,
        ValueFormat::I64le => raw as i64 as i128,
    }
}

fn encode(format: ValueFormat, raw: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len() * format.width());
    for &v in raw {
        if format == ValueFormat::U32le {
            out.extend_from_slice(&(v as u32).to_le_bytes());
        } else {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

fn db(dir: &std::path::Path, pool: u64) -> Database {
    Database::create(Config::new(dir.join("db")).min_page(4096).pool_size(pool)).unwrap()
}

fn import(db: &Database, name: &str, format: ValueFormat, raw: &[u64]) -> Column {
    let bytes = encode(format, raw);
    db.import(name, format, &mut &bytes[..], bytes.len() as u64, &mut |_| {}).unwrap()
}

fn ref_counts(format: ValueFormat, raw: &[u64]) -> HashMap<i128, u64> {
    let mut m = HashMap::new();
    for &r in raw {
        *m.entry(value(format, r)).or_insert(0u64) += 1;
    }
    m
}

fn ref_distinct(format: ValueFormat, raw: &[u64]) -> DistinctResult {
    let m = ref_counts(format, raw);
    let top = m.iter().map(|(&v, &c)| (std::cmp::Reverse(c), v)).min();
    DistinctResult { groups: m.len() as u64, top_value: top.map(|t| t.1), top_count: top.map_or(0, |t| t.0 .0) }
}

fn ref_mod(format: ValueFormat, raw: &[u64], m: u64) -> GroupbyModResult {
    let mut counts = vec![0u64; m as usize];
    for &r in raw {
        counts[value(format, r).rem_euclid(m as i128) as usize] += 1;
    }
    GroupbyModResult { groups: counts.iter().filter(|&&c| c > 0).count() as u64, counts }
}

fn ref_join(fa: ValueFormat, a: &[u64], fb: ValueFormat, b: &[u64]) -> JoinResult {
    let m = ref_counts(fb, b);
    let mut out = JoinResult::default();
    for &r in a {
        let v = value(fa, r);
        if let Some(&c) = m.get(&v) {
            out.matches += c as u128;
            out.checksum = out.checksum.wrapping_add((v as u64).wrapping_mul(c));
        }
    }
    out
}

struct Groups(Vec<Group>);

impl GroupSink for Groups {
    fn add(&mut self, g: &Group) -> strata::Result<()> {
        self.0.push(*g);
        Ok(())
    }
    fn merge(&mut self, other: Self) -> strata::Result<()> {
        self.0.extend(other.0);
        Ok(())
    }
}

/// Runs every operator on `raw` (column "a") and `raw_b` (column "b") and compares.
fn check_all(db: &Database, format: ValueFormat, raw: &[u64], raw_b: &[u64], threads: usize, moduli: &[u64]) {
    let bm = db.buffer();
    let a = db.column("a").unwrap();
    let b = db.column("b").unwrap();
    assert_eq!(distinct(bm, &a, threads).unwrap(), ref_distinct(format, raw), "distinct {format:?} threads {threads}");
    for &m in moduli {
        assert_eq!(groupby_mod(bm, &a, m, threads).unwrap(), ref_mod(format, raw, m), "mod {m} {format:?}");
    }
    let (r, stats) = join_count_with_stats(bm, &a, &b, threads).unwrap();
    assert_eq!(r, ref_join(format, raw, format, raw_b), "join {format:?} threads {threads} {stats:?}");
    assert!(bm.peak_bytes() <= bm.pool_size(), "peak {} > pool {}", bm.peak_bytes(), bm.pool_size());
}

fn assert_clean(db: &Database) {
    let st = db.buffer().stats();
    assert_eq!(st.classes.iter().map(|c| c.temp_pages).sum::<u64>(), 0, "every temporary page freed");
    assert!(st.peak_resident_bytes <= st.pool_bytes);
    db.check().unwrap();
}

#[test]
fn millions_of_values_through_a_2_mib_pool() {
    let t = tempfile::tempdir().unwrap();
    let pool = 2 << 20;
    let db = db(t.path(), pool);
    let mut rng = Rng(1);
    // 3 M nearly distinct u32 (12 MiB, 6x the pool; its hash table state is 24x).
    let raw: Vec<u64> = (0..3_000_000).map(|_| rng.next() & 0xffff_ffff).collect();
    // 1.5 M values from a range that overlaps `raw` in part.
    let raw_b: Vec<u64> = (0..1_500_000).map(|i| if i % 2 == 0 { raw[rng.below(raw.len() as u64) as usize] } else { rng.next() & 0xffff_ffff }).collect();
    import(&db, "a", ValueFormat::U32le, &raw);
    import(&db, "b", ValueFormat::U32le, &raw_b);
    let bm = db.buffer();
    let a = db.column("a").unwrap();
    let b = db.column("b").unwrap();

    let d = distinct(bm, &a, 2).unwrap();
    assert_eq!(d, ref_distinct(ValueFormat::U32le, &raw));
    for (m, threads) in [(1000u64, 2usize), (256, 1), (1, 3)] {
        assert_eq!(groupby_mod(bm, &a, m, threads).unwrap(), ref_mod(ValueFormat::U32le, &raw, m), "mod {m}");
    }
    // General aggregates over ~300 K groups, with spills.
    let key = |r: u64| r % 300_007;
    let (groups, stats) = aggregate(bm, &a, Aggregates::ALL, key, 2, || Groups(Vec::new())).unwrap();
    assert!(stats.spilled_records > 0 && stats.depth >= 1, "{stats:?}");
    let mut want: HashMap<u64, (u64, i128, i128, i128)> = HashMap::new();
    for &r in &raw {
        let v = r as i128;
        let e = want.entry(key(r)).or_insert((0, 0, v, v));
        e.0 += 1;
        e.1 += v;
        e.2 = e.2.min(v);
        e.3 = e.3.max(v);
    }
    assert_eq!(groups.0.len(), want.len());
    for g in &groups.0 {
        assert_eq!(Some(&(g.count, g.sum, g.min, g.max)), want.get(&g.key), "group {}", g.key);
    }

    let (r, stats) = join_count_with_stats(bm, &a, &b, 2).unwrap();
    assert!(!stats.in_memory && stats.spilled_records >= 4_500_000, "{stats:?}");
    assert_eq!(r, ref_join(ValueFormat::U32le, &raw, ValueFormat::U32le, &raw_b));
    assert!(r.matches > 700_000);
    // Build on the other side: same result.
    assert_eq!(join_count_with_stats(bm, &b, &a, 1).unwrap().0, r);
    assert!(bm.peak_bytes() <= pool);
    assert!(bm.stats().bytes_written > 24 << 20, "the operators spilled through the scratch file");
    assert_clean(&db);
}

#[test]
fn duplicate_heavy_and_skewed_keys() {
    let t = tempfile::tempdir().unwrap();
    let pool = 2 << 20;
    let db = db(t.path(), pool);
    let mut rng = Rng(2);
    // Five distinct signed values, 2 M of them: tiny tables, enormous join output.
    let vals = [-7i64, -1, 0, 3, i64::MIN];
    let raw: Vec<u64> = (0..2_000_000).map(|_| vals[rng.below(5) as usize] as u64).collect();
    let raw_b: Vec<u64> = (0..1_000_000).map(|_| vals[rng.below(4) as usize] as u64).collect();
    import(&db, "a", ValueFormat::I64le, &raw);
    import(&db, "b", ValueFormat::I64le, &raw_b);
    check_all(&db, ValueFormat::I64le, &raw, &raw_b, 2, &[7, 2, 1000]);
    let r = join_count_with_stats(db.buffer(), &db.column("a").unwrap(), &db.column("b").unwrap(), 3).unwrap();
    assert!(r.1.in_memory && r.0.matches > 300_000_000_000, "{r:?}");

    // Skew: half the values are one value, the rest nearly distinct, on both sides: the join
    // must partition (many distinct values) with one partition holding ~1 M copies.
    let t2 = tempfile::tempdir().unwrap();
    let db2 = self::db(t2.path(), pool);
    let raw: Vec<u64> = (0..2_000_000).map(|i| if i % 2 == 0 { 42 } else { rng.next() }).collect();
    let raw_b: Vec<u64> = (0..1_000_000).map(|i| if i % 2 == 0 { 42 } else { raw[rng.below(2_000_000) as usize] }).collect();
    import(&db2, "a", ValueFormat::U64le, &raw);
    import(&db2, "b", ValueFormat::U64le, &raw_b);
    check_all(&db2, ValueFormat::U64le, &raw, &raw_b, 2, &[3, 1 << 20]);
    let (r, stats) = join_count_with_stats(db2.buffer(), &db2.column("a").unwrap(), &db2.column("b").unwrap(), 2).unwrap();
    assert!(!stats.in_memory, "{stats:?}");
    assert!(r.matches >= 500_000u128 * 1_000_000, "{r:?}");
    assert_clean(&db);
    assert_clean(&db2);
}

#[test]
fn large_partitions_use_cache_sized_buckets() {
    // A 16 MiB pool: partitions of ~100 K keys are aggregated / joined in buckets that fit
    // the CPU cache, inside the operator's table page.
    let t = tempfile::tempdir().unwrap();
    let pool = 16 << 20;
    let db = db(t.path(), pool);
    let mut rng = Rng(4);
    let raw: Vec<u64> = (0..1_500_000).map(|_| rng.below(3_000_000)).collect();
    let raw_b: Vec<u64> = (0..1_000_000).map(|_| rng.below(3_000_000)).collect();
    let a = import(&db, "a", ValueFormat::U32le, &raw);
    let b = import(&db, "b", ValueFormat::U32le, &raw_b);
    let bm = db.buffer();
    let want: HashMap<i128, u64> = ref_counts(ValueFormat::U32le, &raw);
    for threads in [1, 2] {
        let (groups, stats) = aggregate(bm, &a, Aggregates::COUNT, |r| r, threads, || Groups(Vec::new())).unwrap();
        assert!(threads > 1 || stats.cache_partitions > 0, "{stats:?}");
        assert_eq!(groups.0.len(), want.len());
        for g in &groups.0 {
            assert_eq!(Some(&g.count), want.get(&(g.key as i128)));
        }
        let (r, stats) = join_count_with_stats(bm, &a, &b, threads).unwrap();
        assert!(!stats.in_memory && (threads > 1 || stats.cache_partitions > 0), "{stats:?}");
        assert_eq!(r, ref_join(ValueFormat::U32le, &raw, ValueFormat::U32le, &raw_b));
    }
    assert!(bm.peak_bytes() <= pool);
    assert_clean(&db);
}

#[test]
fn every_format_random_inputs_and_thread_counts() {
    let mut rng = Rng(3);
    for (case, format) in [ValueFormat::U32le, ValueFormat::U64le, ValueFormat::I64le].into_iter().enumerate() {
        for (pool, n, range) in [(1u64 << 20, 300_000u64, 1u64 << 62), (1 << 20, 300_000, 20_000), (16 << 20, 100_000, 5_000)] {
            let t = tempfile::tempdir().unwrap();
            let db = db(t.path(), pool);
            let gen = |rng: &mut Rng, n: u64| -> Vec<u64> {
                (0..n)
                    .map(|_| {
                        let k = rng.below(range);
                        match format {
                            ValueFormat::U32le => k & 0xffff_ffff,
                            ValueFormat::U64le => k.wrapping_mul(0xdead_beef_0000_0001),
                            ValueFormat::I64le => (k as i64 - (range / 2) as i64) as u64,
                        }
                    })
                    .collect()
            };
            let raw = gen(&mut rng, n);
            let raw_b = gen(&mut rng, n / 3 + case as u64);
            import(&db, "a", format, &raw);
            import(&db, "b", format, &raw_b);
            let threads = 1 + (rng.below(4) as usize);
            check_all(&db, format, &raw, &raw_b, threads, &[1, 10, 256, 65_537]);
            assert_clean(&db);
        }
    }
}

#[test]
fn empty_columns_and_single_values() {
    let t = tempfile::tempdir().unwrap();
    let db = db(t.path(), 1 << 20);
    for format in [ValueFormat::U32le, ValueFormat::U64le, ValueFormat::I64le] {
        let name = format.name();
        let empty = import(&db, &format!("e{name}"), format, &[]);
        assert_eq!(empty.count, 0);
        let one = import(&db, &format!("o{name}"), format, &[u64::MAX]);
        let bm = db.buffer();
        assert_eq!(distinct(bm, &empty, 3).unwrap(), DistinctResult { groups: 0, top_value: None, top_count: 0 });
        assert_eq!(groupby_mod(bm, &empty, 4, 2).unwrap(), GroupbyModResult { groups: 0, counts: vec![0; 4] });
        assert_eq!(join_count_with_stats(bm, &empty, &one, 2).unwrap().0, JoinResult::default());
        assert_eq!(join_count_with_stats(bm, &one, &empty, 1).unwrap().0, JoinResult::default());
        let v = value(format, u64::MAX);
        assert_eq!(distinct(bm, &one, 1).unwrap(), DistinctResult { groups: 1, top_value: Some(v), top_count: 1 });
        assert_eq!(groupby_mod(bm, &one, 5, 1).unwrap(), ref_mod(format, &[u64::MAX], 5));
        assert_eq!(join_count_with_stats(bm, &one, &one, 1).unwrap().0, JoinResult { matches: 1, checksum: v as u64 });
        assert!(groupby_mod(bm, &one, 0, 1).is_err(), "modulus 0 is refused");
    }
    assert_clean(&db);
}

#[test]
fn a_modulus_far_larger_than_the_pool_streams_its_counts_from_temporary_pages() {
    // 2^20 remainders (8 MiB of counts, 16 MiB of pairs) from a 1 MiB pool: the counts come
    // out of a merge of sorted runs in temporary pages, in remainder order.
    let t = tempfile::tempdir().unwrap();
    let pool = 1 << 20;
    let db = db(t.path(), pool);
    let mut rng = Rng(9);
    let m = 1u64 << 20;
    for (format, mask) in [(ValueFormat::U32le, 0xffff_ffff), (ValueFormat::I64le, u64::MAX)] {
        let raw: Vec<u64> = (0..700_000).map(|_| rng.next() & mask).collect();
        let name = format.name();
        let col = import(&db, name, format, &raw);
        let bm = db.buffer();
        let want = ref_mod(format, &raw, m);
        for (modulus, threads) in [(m, 2usize), (m - 3, 1)] {
            let want = if modulus == m { want.clone() } else { ref_mod(format, &raw, modulus) };
            let mut it = strata::ops::groupby_mod_counts(bm, &col, modulus, threads).unwrap();
            assert_eq!((it.modulus(), it.groups()), (modulus, want.groups), "{format:?} mod {modulus}");
            let mut got = Vec::new();
            while let Some(c) = it.next_count().unwrap() {
                got.push(c);
            }
            assert!(it.next_count().unwrap().is_none(), "no count after the last remainder");
            assert_eq!(got.len(), want.counts.len(), "{format:?} mod {modulus}");
            assert!(got == want.counts, "{format:?} mod {modulus}: counts differ from the reference");
            drop(it);
            assert!(bm.peak_bytes() <= pool, "peak {} > pool {pool}", bm.peak_bytes());
        }
        // Dropping the counts half-read frees the merge's pages.
        let mut it = strata::ops::groupby_mod_counts(bm, &col, m, 2).unwrap();
        for _ in 0..m / 2 {
            it.next_count().unwrap();
        }
        drop(it);
        assert_clean(&db);
    }
}
