//! The key-value B+-tree (`strata::access::btree`) against `BTreeMap`: random operation
//! sequences through tiny pools (nodes evicted mid-operation), many threads at once with
//! invariant checks, huge values in leaves of large classes, reopen and every crash point.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use strata::access::btree::BTree;
use strata::storage::{CrashMode, SimBackend};
use strata::util::SplitMix64;
use strata::{Config, Database, Error};

fn config(dir: &std::path::Path, pool: u64) -> Config {
    Config::new(dir).pool_size(pool).min_page(4096)
}

fn contents(db: &Database, tree: &BTree) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut last: Option<Vec<u8>> = None;
    tree.scan(db.buffer(), b"", &mut |k, v| {
        assert!(last.as_deref().is_none_or(|l| l < k), "scan out of order");
        last = Some(k.to_vec());
        out.insert(k.to_vec(), v.to_vec());
        true
    })
    .unwrap();
    out
}

fn assert_same(db: &Database, tree: &BTree, model: &BTreeMap<Vec<u8>, Vec<u8>>) {
    assert_eq!(&contents(db, tree), model);
    let mut out = Vec::new();
    for (k, v) in model {
        assert!(tree.get(db.buffer(), k, &mut out).unwrap(), "key {k:?} missing");
        assert_eq!(&out, v);
    }
    let report = db.check().unwrap();
    let r = report.trees.values().next().unwrap();
    assert_eq!(r.entries, model.len() as u64);
}

#[derive(Clone, Debug)]
enum Op {
    Put(Vec<u8>, usize),
    Remove(Vec<u8>),
    Get(Vec<u8>),
    Scan(Vec<u8>, usize),
    Commit,
    Abort,
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        (0u64..400).prop_map(|k| k.to_be_bytes().to_vec()),
        proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(0u8), any::<u8>()], 0..40),
        (0u64..50, 0usize..=1024).prop_map(|(k, n)| {
            let mut v = k.to_be_bytes().to_vec();
            v.resize(n.max(8), b'x');
            v
        }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (key(), prop_oneof![8 => 0usize..300, 1 => 1000usize..5000, 1 => 20_000usize..120_000]).prop_map(|(k, n)| Op::Put(k, n)),
        2 => key().prop_map(Op::Remove),
        2 => key().prop_map(Op::Get),
        1 => (key(), 0usize..50).prop_map(|(k, n)| Op::Scan(k, n)),
        1 => Just(Op::Commit),
        1 => Just(Op::Abort),
    ]
}

fn value(k: &[u8], n: usize, salt: u64) -> Vec<u8> {
    let mut r = SplitMix64(k.iter().fold(salt, |a, &b| a.wrapping_mul(31).wrapping_add(b as u64)));
    (0..n).map(|_| r.next_u64() as u8).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, max_shrink_iters: 200, ..ProptestConfig::default() })]
    /// Random operations in transactions that commit or abort, through a 512 KiB pool of
    /// 4 KiB inner nodes: every read agrees with a `BTreeMap`, the tree verifies, and a
    /// reopen finds exactly the committed state.
    #[test]
    fn tree_behaves_like_a_btreemap(ops in proptest::collection::vec(op(), 1..300)) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("db");
        let db = Database::create(config(&dir, 512 << 10)).unwrap();
        let tree = db.create_tree("t").unwrap();
        let mut committed: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut model = committed.clone();
        let mut tx = db.begin();
        let mut out = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Put(k, n) => {
                    let v = value(&k, n, i as u64);
                    tree.insert(&mut tx, &k, &v).unwrap();
                    model.insert(k, v);
                }
                Op::Remove(k) => prop_assert_eq!(tree.remove(&mut tx, &k).unwrap(), model.remove(&k).is_some()),
                Op::Get(k) => {
                    let hit = tree.get(db.buffer(), &k, &mut out).unwrap();
                    prop_assert_eq!(hit.then(|| out.clone()), model.get(&k).cloned());
                }
                Op::Scan(k, n) => {
                    let mut got = Vec::new();
                    tree.scan(db.buffer(), &k, &mut |k, v| { got.push((k.to_vec(), v.to_vec())); got.len() < n }).unwrap();
                    let want: Vec<_> = model.range(k..).take(n.max(1)).map(|(k, v)| (k.clone(), v.clone())).collect();
                    prop_assert_eq!(got, want);
                }
                Op::Commit => {
                    std::mem::replace(&mut tx, db.begin()).commit().unwrap();
                    committed = model.clone();
                }
                Op::Abort => {
                    std::mem::replace(&mut tx, db.begin()).abort().unwrap();
                    model = committed.clone();
                }
            }
        }
        tx.commit().unwrap();
        assert_same(&db, &tree, &model);
        db.close().unwrap();
        let db = Database::open(config(&dir, 512 << 10)).unwrap();
        let tree = db.tree("t").unwrap();
        assert_same(&db, &tree, &model);
    }
}

#[test]
fn sequential_and_random_loads_through_a_tiny_pool() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let db = Database::create(config(&dir, 256 << 10)).unwrap();
    let seq = db.create_tree("seq").unwrap();
    let rnd = db.create_tree("rnd").unwrap();
    let mut model_seq = BTreeMap::new();
    let mut model_rnd = BTreeMap::new();
    let mut r = SplitMix64(7);
    for batch in 0..40u64 {
        let mut tx = db.begin();
        for i in 0..250u64 {
            let id = batch * 250 + i;
            let v = value(&id.to_be_bytes(), 100, 1);
            seq.insert(&mut tx, &id.to_be_bytes(), &v).unwrap();
            model_seq.insert(id.to_be_bytes().to_vec(), v);
            let k = r.next_u64().to_be_bytes();
            let v = value(&k, (r.next_u64() % 200) as usize, 2);
            rnd.insert(&mut tx, &k, &v).unwrap();
            model_rnd.insert(k.to_vec(), v);
        }
        tx.commit().unwrap();
    }
    let report = db.check().unwrap();
    assert!(report.trees["seq"].height >= 3, "{report:?}");
    // Appends fill leaves: far fewer leaves than a half-full tree would have.
    let leaves: u64 = report.trees["seq"].leaves_per_class.iter().sum();
    assert!(leaves < 10_000 * 124 / 4096 * 3 / 2 + 2, "{leaves} leaves for 10000 appends of 124 bytes");
    assert_same_named(&db, &seq, &model_seq);
    assert_same_named(&db, &rnd, &model_rnd);
    assert!(db.buffer().stats().evictions > 0, "the pool was meant to be too small");
}

fn assert_same_named(db: &Database, tree: &BTree, model: &BTreeMap<Vec<u8>, Vec<u8>>) {
    assert_eq!(&contents(db, tree), model);
    let mut out = Vec::new();
    for (k, v) in model {
        assert!(tree.get(db.buffer(), k, &mut out).unwrap());
        assert_eq!(&out, v);
    }
}

#[test]
fn huge_values_get_leaves_of_large_classes_and_limits_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let db = Database::create(Config::new(&dir).pool_size(64 << 20)).unwrap();
    let tree = db.create_tree("blobs").unwrap();
    let big = value(b"big", 20 << 20, 3);
    let mut tx = db.begin();
    for i in 0..50u64 {
        tree.insert(&mut tx, &i.to_be_bytes(), &value(&i.to_be_bytes(), 1000, 4)).unwrap();
    }
    tree.insert(&mut tx, &25u64.to_be_bytes(), &big).unwrap();
    tx.commit().unwrap();
    let max = BTree::max_value(db.buffer(), 8);
    let mut tx = db.begin();
    let err = tree.insert(&mut tx, &99u64.to_be_bytes(), &vec![0u8; max + 1]).unwrap_err();
    assert!(matches!(err, Error::InvalidInput(ref m) if m.contains(&max.to_string()) && m.contains("raise the pool")), "{err}");
    let err = tree.insert(&mut tx, &[0u8; 1025], b"v").unwrap_err();
    assert!(err.to_string().contains("1024"), "{err}");
    tx.abort().unwrap();
    let report = db.check().unwrap();
    let r = &report.trees["blobs"];
    let classes = db.buffer().classes();
    let class_of_big = (0..classes.count()).find(|&c| classes.page_size(c as u8) >= (20 << 20) + 4096).unwrap();
    assert_eq!(r.leaves_per_class[class_of_big], 1, "{r:?}");
    db.close().unwrap();
    let db = Database::open(Config::new(&dir).pool_size(64 << 20)).unwrap();
    let tree = db.tree("blobs").unwrap();
    let mut out = Vec::new();
    assert!(tree.get(db.buffer(), &25u64.to_be_bytes(), &mut out).unwrap());
    assert!(out == big, "the 20 MiB value reads back whole");
    let mut n = 0;
    tree.scan(db.buffer(), b"", &mut |_, _| {
        n += 1;
        true
    })
    .unwrap();
    assert_eq!(n, 50);
}

/// Four writers (each its own keys, committing in batches, some batches rolled back) and
/// two readers at once through a pool far smaller than the tree. Readers check what must
/// hold at every moment: a key whose batch committed before the read began is found with
/// its value; every value found is one some writer wrote for that key; scans are ordered.
#[test]
fn writers_and_readers_at_once_keep_every_invariant() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let db = Arc::new(Database::create(config(&dir, 160 << 10)).unwrap());
    let tree = db.create_tree("t").unwrap();
    const WRITERS: u64 = 4;
    const BATCHES: u64 = 30;
    const PER: u64 = 12;
    // Per writer: number of the last committed batch + 1.
    let committed: Arc<Vec<AtomicU64>> = Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));
    let retries = AtomicU64::new(0);
    let retries = &retries;
    let key = |w: u64, b: u64, i: u64| ((b * PER + i) * WRITERS + w).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes();
    let val = |k: &[u8; 8]| value(k, (u64::from_be_bytes(*k) % 300) as usize, 9);
    std::thread::scope(|s| {
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let (db, committed) = (db.clone(), committed.clone());
            writers.push(s.spawn(move || {
                for b in 0..BATCHES {
                    let mut rolled_back = false;
                    loop {
                        let mut tx = db.begin();
                        // Deadlocks between writers are refused at once (`Deadlock`); the
                        // short wait bounds the other waits.
                        tx.set_lock_wait(std::time::Duration::from_millis(50));
                        let r = (0..PER).try_for_each(|i| tree.insert(&mut tx, &key(w, b, i), &val(&key(w, b, i))));
                        match r {
                            Ok(()) if b % 7 == 3 && !rolled_back => {
                                // Rolled back once, then redone.
                                tx.abort().unwrap();
                                rolled_back = true;
                                continue;
                            }
                            Ok(()) => tx.commit().unwrap(),
                            Err(e) if e.is_lock_conflict() => {
                                drop(tx);
                                // Back off for a moment so that the winner can finish.
                                let n = retries.fetch_add(1, Ordering::Relaxed);
                                std::thread::sleep(std::time::Duration::from_micros(50 + (n * 7919 + w * 104_729) % 500));
                                continue;
                            }
                            Err(e) => panic!("{e}"),
                        }
                        break;
                    }
                    committed[w as usize].store(b + 1, Ordering::Release);
                }
            }));
        }
        for r in 0..2u64 {
            let (db, committed, done) = (db.clone(), committed.clone(), done.clone());
            s.spawn(move || {
                let mut rng = SplitMix64(r);
                let mut out = Vec::new();
                let mut rounds = 0u64;
                while !done.load(Ordering::Acquire) || rounds < 10 {
                    rounds += 1;
                    let w = rng.next_u64() % WRITERS;
                    let upto = committed[w as usize].load(Ordering::Acquire);
                    if upto > 0 {
                        let b = rng.next_u64() % upto;
                        let k = key(w, b, rng.next_u64() % PER);
                        assert!(tree.get(db.buffer(), &k, &mut out).unwrap(), "committed key {k:?} not found");
                        assert_eq!(out, val(&k));
                    }
                    let start = rng.next_u64().to_be_bytes();
                    let mut last: Option<Vec<u8>> = None;
                    let mut n = 0;
                    tree.scan(db.buffer(), &start, &mut |k, v| {
                        assert!(k >= &start[..] && last.as_deref().is_none_or(|l| l < k), "scan order: start {start:?} last {last:?} key {k:?}");
                        assert_eq!(v, val(k.try_into().unwrap()), "a value nobody wrote");
                        last = Some(k.to_vec());
                        n += 1;
                        n < 200
                    })
                    .unwrap();
                }
            });
        }
        // The readers loop until the writers are done (or one of them failed).
        let failed = writers.into_iter().map(|h| h.join()).filter(|r| r.is_err()).count();
        done.store(true, Ordering::Release);
        assert_eq!(failed, 0, "a writer failed");
    });
    let mut model = BTreeMap::new();
    for w in 0..WRITERS {
        for b in 0..BATCHES {
            for i in 0..PER {
                let k = key(w, b, i);
                model.insert(k.to_vec(), val(&k));
            }
        }
    }
    assert_same(&db, &tree, &model);
    assert!(db.buffer().stats().evictions > 0);
    eprintln!("{} batches retried after a lock timeout", retries.load(Ordering::Relaxed));
}

/// A tree workload on the simulated filesystem, crashed at every sync point (and with torn
/// writes): each image recovers to a tree that verifies and holds exactly the batches
/// acknowledged before the crash (or also the one in flight).
#[test]
fn every_crash_point_recovers_a_whole_tree() {
    let batches: u64 = std::env::var("STRATA_CRASH_TREE_BATCHES").ok().and_then(|v| v.parse().ok()).unwrap_or(24);
    let cfg =
        |be: SimBackend| Config::new("/db").pool_size(160 << 10).min_page(4096).wal_segment_size(64 << 10).checkpoint_every(32 << 10).backend(Arc::new(be));
    let be = SimBackend::new();
    let db = Database::create(cfg(be.clone())).unwrap();
    let tree = db.create_tree("t").unwrap();
    db.checkpoint().unwrap();
    let mut models = vec![BTreeMap::new()];
    let mut rng = SplitMix64(5);
    be.set_label(0);
    be.capture_at_syncs(1, 11, vec![CrashMode::DropUnsynced, CrashMode::KeepUnsynced, CrashMode::Torn { sector: 512 }]);
    let mut images = 0u64;
    for b in 1..=batches {
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = models.last().unwrap().clone();
        let mut tx = db.begin();
        for _ in 0..30 {
            let k = (rng.next_u64() % 2000).to_be_bytes();
            if rng.next_u64().is_multiple_of(5) {
                tree.remove(&mut tx, &k).unwrap();
                model.remove(&k[..]);
            } else {
                let v = value(&k, (rng.next_u64() % 400) as usize, b);
                tree.insert(&mut tx, &k, &v).unwrap();
                model.insert(k.to_vec(), v);
            }
        }
        tx.commit().unwrap();
        models.push(model);
        be.set_label(b);
        for cap in be.take_captures() {
            images += 1;
            let db = Database::open(cfg(cap.image)).unwrap_or_else(|e| panic!("sync point {}: {e}", cap.sync_point));
            let tree = db.tree("t").unwrap();
            let got = contents(&db, &tree);
            let l = cap.label as usize;
            assert!(got == models[l] || models.get(l + 1) == Some(&got), "sync point {}: tree is neither state {l} nor {}", cap.sync_point, l + 1);
            db.check().unwrap();
            std::mem::forget(db);
        }
    }
    be.stop_capturing();
    assert!(images >= 100, "only {images} crash images");
    eprintln!("tree crash consistency: {batches} batches, {images} crash images recovered");
}

/// Removing every key of a leaf unlinks it and frees its page at commit (a rolled-back
/// removal keeps it): a tree whose keys are removed gives its pages back.
#[test]
fn emptied_leaves_are_unlinked_and_freed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let db = Database::create(config(&dir, 512 << 10)).unwrap();
    let tree = db.create_tree("t").unwrap();
    let mut model = BTreeMap::new();
    let mut tx = db.begin();
    for i in 0..3000u64 {
        let k = i.to_be_bytes().to_vec();
        let v = value(&k, 200, 1);
        tree.insert(&mut tx, &k, &v).unwrap();
        model.insert(k, v);
    }
    tx.commit().unwrap();
    let leaves = |db: &Database| db.check().unwrap().trees["t"].leaves_per_class.iter().sum::<u64>();
    let full = leaves(&db);
    assert!(full > 100, "{full} leaves");
    // A removal of half the keys that rolls back changes nothing.
    let mut tx = db.begin();
    for i in 0..1500u64 {
        assert!(tree.remove(&mut tx, &i.to_be_bytes()).unwrap());
    }
    tx.abort().unwrap();
    assert_eq!(leaves(&db), full);
    assert_same(&db, &tree, &model);
    // Remove the first half, every third key of the rest, then the last keys one by one.
    let mut tx = db.begin();
    for i in (0..1500u64).chain((1500..3000).step_by(3)) {
        assert!(tree.remove(&mut tx, &i.to_be_bytes()).unwrap());
        model.remove(&i.to_be_bytes()[..]);
    }
    tx.commit().unwrap();
    let after = leaves(&db);
    assert!(after < full * 6 / 10, "{after} of {full} leaves left");
    assert_eq!(db.check().unwrap().unreferenced_pages, 0, "the unlinked leaves were freed");
    assert_same(&db, &tree, &model);
    let mut tx = db.begin();
    for k in model.keys().cloned().collect::<Vec<_>>() {
        assert!(tree.remove(&mut tx, &k).unwrap());
    }
    tx.commit().unwrap();
    model.clear();
    assert_same(&db, &tree, &model);
    assert!(leaves(&db) <= 3, "an empty tree keeps only the leaves that are their parents' only children");
    db.close().unwrap();
    // Reopened, it verifies and takes new keys.
    let db = Database::open(config(&dir, 512 << 10)).unwrap();
    let tree = db.tree("t").unwrap();
    let mut tx = db.begin();
    for i in (0..3000u64).step_by(7) {
        let k = i.to_be_bytes().to_vec();
        let v = value(&k, 300, 2);
        tree.insert(&mut tx, &k, &v).unwrap();
        model.insert(k, v);
    }
    tx.commit().unwrap();
    assert_same(&db, &tree, &model);
}

/// Thinning a tree (removing most keys of every leaf, none emptied) merges the underfull
/// leaves with their neighbours: the tree gives most of its pages back, checks out, and
/// holds exactly the keys left, before and after a reopen; a thinning that rolls back keeps
/// every leaf and key.
#[test]
fn underfull_leaves_merge_with_their_neighbours() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let db = Database::create(config(&dir, 1 << 20)).unwrap();
    let tree = db.create_tree("t").unwrap();
    let mut model = BTreeMap::new();
    let mut tx = db.begin();
    for i in 0..4000u64 {
        let k = i.to_be_bytes().to_vec();
        let v = value(&k, 150, 1);
        tree.insert(&mut tx, &k, &v).unwrap();
        model.insert(k, v);
    }
    tx.commit().unwrap();
    let leaves = |db: &Database| db.check().unwrap().trees["t"].leaves_per_class.iter().sum::<u64>();
    let full = leaves(&db);
    assert!(full > 150, "{full} leaves");
    let thin = |tx: &mut strata::Transaction<'_>, model: &mut BTreeMap<Vec<u8>, Vec<u8>>| {
        for i in (0..4000u64).filter(|i| i % 10 != 0) {
            assert!(tree.remove(tx, &i.to_be_bytes()).unwrap());
            model.remove(&i.to_be_bytes()[..]);
        }
    };
    let mut rolled = model.clone();
    let mut tx = db.begin();
    thin(&mut tx, &mut rolled);
    tx.abort().unwrap();
    assert_eq!(leaves(&db), full);
    assert_same(&db, &tree, &model);
    let mut tx = db.begin();
    thin(&mut tx, &mut model);
    tx.commit().unwrap();
    let after = leaves(&db);
    // A tenth of the bytes is left: without merges every leaf would stay.
    assert!(after * 4 < full, "{after} of {full} leaves left");
    assert_eq!(db.check().unwrap().unreferenced_pages, 0, "the merged-away leaves were freed");
    assert_same(&db, &tree, &model);
    db.close().unwrap();
    let db = Database::open(config(&dir, 1 << 20)).unwrap();
    let tree = db.tree("t").unwrap();
    assert_same(&db, &tree, &model);
    // The merged leaves split again as keys come back.
    let mut tx = db.begin();
    for i in 0..4000u64 {
        let k = i.to_be_bytes().to_vec();
        let v = value(&k, 150, 3);
        tree.insert(&mut tx, &k, &v).unwrap();
        model.insert(k, v);
    }
    tx.commit().unwrap();
    assert_same(&db, &tree, &model);
}

/// The tree's report from [`Database::check`] (which verifies every tree first).
fn tree_report(db: &Database) -> strata::access::btree::TreeReport {
    db.check().unwrap().trees["t"].clone()
}

/// Deletions thin the inner nodes too: a tree of height 3 whose keys are mostly removed
/// (the first half in key order, then most of the rest at random) merges its underfull
/// inner nodes with their neighbours (the separator pulled down from the root between
/// them), frees the merged-away pages, checks out and holds exactly the keys left, before
/// and after a reopen; a removal that rolls back keeps every node; removing all but a few
/// keys leaves the root with one inner child, whose entries it takes (height 2 again).
#[test]
fn underfull_inner_nodes_merge_and_the_tree_gets_lower() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let db = Database::create(config(&dir, 1 << 20)).unwrap();
    let tree = db.create_tree("t").unwrap();
    const N: u64 = 12_000;
    let mut model = BTreeMap::new();
    let mut order: Vec<u64> = (0..N).collect();
    let mut rng = SplitMix64(17);
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let mut tx = db.begin();
    for &i in &order {
        let k = i.to_be_bytes().to_vec();
        let v = value(&k, 300, 1);
        tree.insert(&mut tx, &k, &v).unwrap();
        model.insert(k, v);
    }
    tx.commit().unwrap();
    let full = tree_report(&db);
    assert!(full.height >= 3 && full.inner_nodes >= 15, "{full:?}");
    // Removals that roll back keep every node.
    let mut tx = db.begin();
    for i in 0..N * 9 / 10 {
        assert!(tree.remove(&mut tx, &i.to_be_bytes()).unwrap());
    }
    tx.abort().unwrap();
    let rolled = tree_report(&db);
    assert_eq!((rolled.height, rolled.inner_nodes, rolled.bytes), (full.height, full.inner_nodes, full.bytes));
    assert_same(&db, &tree, &model);
    // The first half in key order, then 90% of the rest at random, over a few commits.
    let mut gone: Vec<u64> = (0..N / 2).collect();
    let mut rest: Vec<u64> = (N / 2..N).filter(|_| !rng.next_u64().is_multiple_of(10)).collect();
    for i in (1..rest.len()).rev() {
        rest.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    gone.extend(rest);
    for chunk in gone.chunks(2000) {
        let mut tx = db.begin();
        for &i in chunk {
            assert!(tree.remove(&mut tx, &i.to_be_bytes()).unwrap());
            model.remove(&i.to_be_bytes()[..]);
        }
        tx.commit().unwrap();
    }
    let thin = tree_report(&db);
    eprintln!(
        "inner merges: {} -> {} inner nodes, {} -> {} leaves, height {} -> {}, {} -> {} KiB",
        full.inner_nodes,
        thin.inner_nodes,
        full.leaves_per_class.iter().sum::<u64>(),
        thin.leaves_per_class.iter().sum::<u64>(),
        full.height,
        thin.height,
        full.bytes >> 10,
        thin.bytes >> 10
    );
    // A twentieth of the keys is left: without inner merges every inner node would stay.
    assert!(thin.inner_nodes * 4 <= full.inner_nodes, "{} of {} inner nodes left", thin.inner_nodes, full.inner_nodes);
    assert!(thin.bytes * 5 < full.bytes, "{} of {} bytes left", thin.bytes, full.bytes);
    assert_eq!(db.check().unwrap().unreferenced_pages, 0, "the merged-away nodes were freed");
    assert_same(&db, &tree, &model);
    db.close().unwrap();
    let db = Database::open(config(&dir, 1 << 20)).unwrap();
    let tree = db.tree("t").unwrap();
    assert_same(&db, &tree, &model);
    // All but a few keys: the root is left with one inner child and takes its entries.
    let mut tx = db.begin();
    for k in model.keys().skip(5).cloned().collect::<Vec<_>>() {
        assert!(tree.remove(&mut tx, &k).unwrap());
        model.remove(&k);
    }
    tx.commit().unwrap();
    let low = tree_report(&db);
    assert_eq!((low.height, low.inner_nodes), (2, 1), "{low:?}");
    assert_eq!(db.check().unwrap().unreferenced_pages, 0);
    assert_same(&db, &tree, &model);
    // The tree grows again as keys come back.
    let mut tx = db.begin();
    for i in (0..N).step_by(2) {
        let k = i.to_be_bytes().to_vec();
        let v = value(&k, 300, 3);
        tree.insert(&mut tx, &k, &v).unwrap();
        model.insert(k, v);
    }
    tx.commit().unwrap();
    assert!(tree_report(&db).height >= 3);
    assert_same(&db, &tree, &model);
    db.close().unwrap();
    let db = Database::open(config(&dir, 1 << 20)).unwrap();
    let tree = db.tree("t").unwrap();
    assert_same(&db, &tree, &model);
}

/// Removers thin a tree of height 3 (merging leaves and inner nodes) while an inserter
/// adds keys among theirs and readers look up the keys nobody removes and scan: every
/// lookup finds its key with its value, every scan is in order with values somebody wrote,
/// and at the end the tree holds exactly the model, verifies, and has fewer inner nodes.
#[test]
fn removals_merge_inner_nodes_while_others_read_and_write() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let db = Arc::new(Database::create(config(&dir, 256 << 10)).unwrap());
    let tree = db.create_tree("t").unwrap();
    const N: u64 = 10_000;
    const REMOVERS: u64 = 3;
    const BATCH: usize = 25;
    // Prefilled keys are even, the inserter's odd; every 16th prefilled key stays.
    let key = |i: u64| (i * 2).to_be_bytes();
    let kept = |i: u64| i.is_multiple_of(16);
    let val = |k: &[u8; 8]| value(k, 200 + (u64::from_be_bytes(*k) % 150) as usize, 4);
    let mut tx = db.begin();
    for i in 0..N {
        tree.insert(&mut tx, &key(i), &val(&key(i))).unwrap();
    }
    tx.commit().unwrap();
    let full = tree_report(&db);
    assert!(full.height >= 3 && full.inner_nodes >= 8, "{full:?}");
    let done = Arc::new(AtomicBool::new(false));
    let retries = AtomicU64::new(0);
    let retries = &retries;
    // Runs `batch` in transactions until one commits (after a lock timeout or deadlock);
    // every 5th batch is rolled back once first.
    let run = |db: &Database, n: u64, batch: &dyn Fn(&mut strata::Transaction<'_>) -> strata::Result<()>| {
        let mut rolled_back = false;
        loop {
            let mut tx = db.begin();
            tx.set_lock_wait(std::time::Duration::from_millis(50));
            match batch(&mut tx) {
                Ok(()) if n % 5 == 2 && !rolled_back => {
                    tx.abort().unwrap();
                    rolled_back = true;
                }
                Ok(()) => return tx.commit().unwrap(),
                Err(e) if e.is_lock_conflict() => {
                    drop(tx);
                    let r = retries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(std::time::Duration::from_micros(50 + (r * 7919 + n * 104_729) % 500));
                }
                Err(e) => panic!("{e}"),
            }
        }
    };
    let inserted: Vec<u64> = (0..N).step_by(40).collect();
    std::thread::scope(|s| {
        let mut writers = Vec::new();
        for w in 0..REMOVERS {
            let db = db.clone();
            writers.push(s.spawn(move || {
                let mine: Vec<u64> = (0..N).filter(|&i| i % REMOVERS == w && !kept(i)).collect();
                for (n, chunk) in mine.chunks(BATCH).enumerate() {
                    run(&db, n as u64, &|tx| {
                        for &i in chunk {
                            assert!(tree.remove(tx, &key(i))?, "key {i} of remover {w} missing");
                        }
                        Ok(())
                    });
                }
            }));
        }
        {
            let (db, inserted) = (db.clone(), &inserted);
            writers.push(s.spawn(move || {
                for (n, chunk) in inserted.chunks(BATCH / 5).enumerate() {
                    run(&db, n as u64, &|tx| chunk.iter().try_for_each(|&i| tree.insert(tx, &(i * 2 + 1).to_be_bytes(), &val(&(i * 2 + 1).to_be_bytes()))));
                }
            }));
        }
        for r in 0..2u64 {
            let (db, done) = (db.clone(), done.clone());
            s.spawn(move || {
                let mut rng = SplitMix64(r + 100);
                let mut out = Vec::new();
                let mut rounds = 0u64;
                while !done.load(Ordering::Acquire) || rounds < 10 {
                    rounds += 1;
                    let i = rng.next_u64() % (N / 16) * 16;
                    let k = key(i);
                    assert!(tree.get(db.buffer(), &k, &mut out).unwrap(), "kept key {i} not found");
                    assert_eq!(out, val(&k));
                    let start = (rng.next_u64() % (2 * N)).to_be_bytes();
                    let mut last: Option<Vec<u8>> = None;
                    let mut kept_seen = 0;
                    let mut n = 0;
                    tree.scan(db.buffer(), &start, &mut |k, v| {
                        assert!(k >= &start[..] && last.as_deref().is_none_or(|l| l < k), "scan order: start {start:?} last {last:?} key {k:?}");
                        let k8: [u8; 8] = k.try_into().unwrap();
                        assert_eq!(v, val(&k8), "a value nobody wrote");
                        let x = u64::from_be_bytes(k8);
                        if x.is_multiple_of(2) && kept(x / 2) {
                            kept_seen += 1;
                        }
                        last = Some(k.to_vec());
                        n += 1;
                        n < 100
                    })
                    .unwrap();
                    // The kept keys in the range the scan covered were all handed out.
                    let from = u64::from_be_bytes(start);
                    let to = last.as_deref().map_or(2 * N, |l| u64::from_be_bytes(l.try_into().unwrap()) + 1);
                    let want = (from.div_ceil(32)..to.div_ceil(32)).filter(|&j| j * 32 < 2 * N).count();
                    assert_eq!(kept_seen, want, "kept keys in scan {from}..{to}");
                }
            });
        }
        let failed = writers.into_iter().map(|h| h.join()).filter(|r| r.is_err()).count();
        done.store(true, Ordering::Release);
        assert_eq!(failed, 0, "a writer failed");
    });
    let mut model = BTreeMap::new();
    for i in (0..N).filter(|&i| kept(i)) {
        model.insert(key(i).to_vec(), val(&key(i)).to_vec());
    }
    for &i in &inserted {
        let k = (i * 2 + 1).to_be_bytes();
        model.insert(k.to_vec(), val(&k));
    }
    assert_same(&db, &tree, &model);
    let thin = tree_report(&db);
    eprintln!(
        "concurrent inner merges: {} -> {} inner nodes, height {} -> {}, {} batches retried",
        full.inner_nodes,
        thin.inner_nodes,
        full.height,
        thin.height,
        retries.load(Ordering::Relaxed)
    );
    assert!(thin.inner_nodes * 2 <= full.inner_nodes, "{} of {} inner nodes left", thin.inner_nodes, full.inner_nodes);
    assert_eq!(db.check().unwrap().unreferenced_pages, 0);
    assert!(db.buffer().stats().evictions > 0);
}

/// A workload that merges inner nodes (a tree of height 3 thinned batch by batch, in key
/// order and at random, among a few inserts), crashed at every sync point (and with torn
/// writes): each image recovers to a tree that verifies and holds exactly the batches
/// acknowledged before the crash (or also the one in flight).
#[test]
fn every_crash_point_during_inner_merges_recovers_a_whole_tree() {
    let cfg =
        |be: SimBackend| Config::new("/db").pool_size(160 << 10).min_page(4096).wal_segment_size(64 << 10).checkpoint_every(32 << 10).backend(Arc::new(be));
    let be = SimBackend::new();
    let db = Database::create(cfg(be.clone())).unwrap();
    let tree = db.create_tree("t").unwrap();
    const N: u64 = 4000;
    let mut model = BTreeMap::new();
    let mut tx = db.begin();
    for i in 0..N {
        let k = i.to_be_bytes();
        let v = value(&k, 250, 0);
        tree.insert(&mut tx, &k, &v).unwrap();
        model.insert(k.to_vec(), v);
    }
    tx.commit().unwrap();
    db.checkpoint().unwrap();
    let full = tree_report(&db);
    assert!(full.height >= 3 && full.inner_nodes >= 4, "{full:?}");
    let mut models = vec![model];
    let mut rng = SplitMix64(23);
    be.set_label(0);
    // Every 16th sync point: the workload passes about 1600 (page write-backs of a tree
    // ten times the pool), and each image is recovered and verified whole.
    be.capture_at_syncs(16, 13, vec![CrashMode::DropUnsynced, CrashMode::KeepUnsynced, CrashMode::Torn { sector: 512 }]);
    let mut images = 0u64;
    let batches = 20u64;
    for b in 1..=batches {
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = models.last().unwrap().clone();
        let mut tx = db.begin();
        // A run of keys in order (emptied leaves, underfull parents), then random ones.
        let from = (b - 1) * N / batches;
        for i in from..from + N / batches - 10 {
            tree.remove(&mut tx, &i.to_be_bytes()).unwrap();
            model.remove(&i.to_be_bytes()[..]);
        }
        for _ in 0..60 {
            let k = (rng.next_u64() % N).to_be_bytes();
            if rng.next_u64().is_multiple_of(8) {
                let v = value(&k, 100, b);
                tree.insert(&mut tx, &k, &v).unwrap();
                model.insert(k.to_vec(), v);
            } else {
                tree.remove(&mut tx, &k).unwrap();
                model.remove(&k[..]);
            }
        }
        tx.commit().unwrap();
        models.push(model);
        be.set_label(b);
        for cap in be.take_captures() {
            images += 1;
            let db = Database::open(cfg(cap.image)).unwrap_or_else(|e| panic!("sync point {}: {e}", cap.sync_point));
            let tree = db.tree("t").unwrap();
            let got = contents(&db, &tree);
            let l = cap.label as usize;
            assert!(got == models[l] || models.get(l + 1) == Some(&got), "sync point {}: tree is neither state {l} nor {}", cap.sync_point, l + 1);
            db.check().unwrap();
            // Dropped, not forgotten: each image holds a whole tree of several MiB.
            drop(db);
        }
    }
    be.stop_capturing();
    let thin = tree_report(&db);
    eprintln!(
        "crashes during inner merges: {images} images, {} -> {} inner nodes, height {} -> {}",
        full.inner_nodes, thin.inner_nodes, full.height, thin.height
    );
    assert!(thin.inner_nodes < full.inner_nodes, "no inner node merged: {} -> {}", full.inner_nodes, thin.inner_nodes);
    assert!(images >= 100, "only {images} crash images");
    assert_same(&db, &tree, models.last().unwrap());
}

/// Sorted key sets for the node search tests: big-endian integers spread evenly, clustered
/// and skewed ones (interpolation guesses far off), short keys, and keys sharing their first
/// 8 bytes (equal prefix words everywhere).
fn key_set() -> impl Strategy<Value = Vec<Vec<u8>>> {
    use proptest::collection::{btree_set, vec};
    prop_oneof![
        btree_set(any::<u64>(), 0..170).prop_map(|s| s.into_iter().map(|k| k.to_be_bytes().to_vec()).collect()),
        btree_set((0u64..3, 0u64..100), 0..170).prop_map(|s| s.into_iter().map(|(hi, lo)| ((hi << 62) | (lo * lo * lo)).to_be_bytes().to_vec()).collect()),
        btree_set(vec(prop_oneof![Just(b'a'), Just(0u8), Just(0xffu8), any::<u8>()], 0..12), 0..150).prop_map(|s| s.into_iter().collect()),
        btree_set(vec(any::<u8>(), 0..5), 0..150).prop_map(|s| s
            .into_iter()
            .map(|t| {
                let mut k = b"user0000".to_vec();
                k.extend(t);
                k
            })
            .collect()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, max_shrink_iters: 500, ..ProptestConfig::default() })]
    /// The searches of leaves and inner nodes (interpolation on the prefix words, then a
    /// gallop and a bisection) against a plain partition of the sorted keys and against the
    /// bisection alone, for every key of the node, keys next to them and random keys.
    #[test]
    fn node_search_finds_what_bisection_finds(keys in key_set(), extra in proptest::collection::vec(prop_oneof![
        any::<u64>().prop_map(|k| k.to_be_bytes().to_vec()),
        proptest::collection::vec(any::<u8>(), 0..12),
    ], 0..20), wrong in proptest::collection::vec((any::<Option<u64>>(), any::<Option<u64>>()), 1..4)) {
        use strata::access::btree::node;
        let (mut leaf, mut inner) = (node::Entries::default(), node::Entries::default());
        for (i, k) in keys.iter().enumerate() {
            leaf.push(k, b"v", 1);
            inner.push(k, &[], 1000 + i as u64);
        }
        let size = (node::HDR + node::need(&leaf, 0..leaf.len(), true)).max(4064).next_multiple_of(8);
        let images = [
            node::build(size, node::KIND_LEAF, &leaf, 0..leaf.len(), 0, [0, 0]),
            node::build(size, node::KIND_INNER, &inner, 0..inner.len(), 7, [0, 0]),
        ];
        let mut probes: Vec<Vec<u8>> = vec![Vec::new(), vec![0xff; 9], b"user0000".to_vec()];
        for k in &keys {
            probes.push(k.clone());
            let mut above = k.clone();
            above.push(0);
            probes.push(above);
            if let Some(p) = k.iter().rposition(|&b| b > 0) {
                let mut below = k[..=p].to_vec();
                below[p] -= 1;
                probes.push(below);
            }
        }
        probes.extend(extra);
        let mut buf = Vec::new();
        for img in &images {
            let w0 = u64::from_le_bytes(img[..8].try_into().unwrap());
            let count = node::slot_count(&img[..], w0).unwrap();
            prop_assert_eq!(count, keys.len());
            for p in &probes {
                let lower = keys.partition_point(|k| k < p);
                let upper = keys.partition_point(|k| k <= p);
                let (i, found) = node::lower_bound(&img[..], count, p, &mut buf).unwrap();
                prop_assert_eq!((i, found), (lower, keys.get(lower) == Some(p)), "lower bound of {:?}", p);
                prop_assert_eq!((i, found), node::lower_bound_bisect(&img[..], count, p, &mut buf).unwrap());
                prop_assert_eq!(node::upper_bound(&img[..], count, p, &mut buf).unwrap(), upper, "upper bound of {:?}", p);
                prop_assert_eq!(node::upper_bound_bisect(&img[..], count, p, &mut buf).unwrap(), upper);
                // Fence hints, right (the node's own key range, as a parent gives them) or
                // wrong (any words: an unvalidated parent), change nothing but the cost.
                let right = node::Fences { lo: keys.first().map(|k| node::prefix(k)), hi: keys.last().map(|k| node::prefix(k).saturating_add(1)) };
                let hints = std::iter::once(right).chain(wrong.iter().map(|&(lo, hi)| node::Fences { lo, hi }));
                for f in hints {
                    prop_assert_eq!(node::lower_bound_in(&img[..], count, p, f, &mut buf).unwrap(), (lower, keys.get(lower) == Some(p)), "lower bound of {:?} with {:?}", p, f);
                    if img[0] == node::KIND_INNER {
                        let child = if upper == count { 7 } else { 1000 + upper as u64 };
                        let (i, c, cf) = node::inner_child_at(&img[..], count, p, f, &mut buf).unwrap();
                        prop_assert_eq!((i, c), (upper, child), "child for {:?} with {:?}", p, f);
                        // The child's fences: the separators around it, the node's own at the ends.
                        let lo = if upper > 0 { Some(node::prefix(&keys[upper - 1])) } else { f.lo };
                        let hi = if upper < count { Some(node::prefix(&keys[upper])) } else { f.hi };
                        prop_assert_eq!(cf, node::Fences { lo, hi });
                    }
                }
            }
        }
    }
}

/// A scan over leaves that are not in memory reads the leaves ahead of it (the stream
/// turns on at the first leaf it misses) and still hands out every entry once, in order,
/// from any start key; a second scan of a tree that no longer fits is read ahead again.
#[test]
fn cold_scans_read_ahead_and_hand_out_every_entry_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let mut model = BTreeMap::new();
    {
        let db = Database::create(config(&dir, 1 << 20)).unwrap();
        let tree = db.create_tree("t").unwrap();
        for batch in 0..20u64 {
            let mut tx = db.begin();
            for i in 0..200u64 {
                let id = batch * 200 + i;
                let v = value(&id.to_be_bytes(), 300, 3);
                tree.insert(&mut tx, &id.to_be_bytes(), &v).unwrap();
                model.insert(id.to_be_bytes().to_vec(), v);
            }
            tx.commit().unwrap();
        }
        db.checkpoint().unwrap();
    }
    // About 1.3 MiB of entries through a 512 KiB pool: every scan misses. Read ahead into
    // the frames, or into scan rings (outside the pool).
    for rings in [false, true] {
        let db = Database::open(config(&dir, 512 << 10).scan_rings(rings)).unwrap();
        let tree = db.tree("t").unwrap();
        for round in 0..2 {
            let before = db.buffer().stats();
            assert_eq!(contents(&db, &tree), model, "round {round}, rings {rings}");
            let after = db.buffer().stats();
            if rings {
                assert!(after.ring_pages > before.ring_pages, "round {round}: nothing read into a ring: {after:?}");
                assert!(after.ring_hits > before.ring_hits, "round {round}: no leaf taken from a ring");
                assert!(after.ring_bytes > 0 && after.peak_resident_bytes <= after.pool_bytes, "{after:?}");
            } else {
                assert!(after.pages_prefetched > before.pages_prefetched, "round {round}: nothing read ahead: {after:?}");
                assert!(after.prefetch_hits > before.prefetch_hits, "round {round}: no leaf read ahead was used");
                assert_eq!(after.ring_pages, 0);
            }
        }
        // From a key in the middle: exactly the entries at and after it.
        let start = 1234u64.to_be_bytes();
        let mut got = Vec::new();
        tree.scan(db.buffer(), &start, &mut |k, _| {
            got.push(k.to_vec());
            true
        })
        .unwrap();
        let want: Vec<Vec<u8>> = model.range(start.to_vec()..).map(|(k, _)| k.clone()).collect();
        assert_eq!(got, want);
        // The pool's accounting holds the ring bytes (kept for the next scan).
        db.check().unwrap();
    }
}

/// Scans that read cold leaves into rings while a writer replaces values and adds keys,
/// so that leaves are loaded, changed, split, written back and evicted under the scans:
/// each scan hands out every key committed before it began, once, in order, each with a
/// value some writer wrote for it. (That an image older than a change is never handed out
/// is not visible in these invariants; the ring's unit test checks it.)
#[test]
fn ring_scans_see_committed_keys_while_writers_change_leaves() {
    let tmp = tempfile::tempdir().unwrap();
    let db = Arc::new(Database::create(config(&tmp.path().join("db"), 384 << 10).scan_rings(true)).unwrap());
    let tree = db.create_tree("t").unwrap();
    // A value names its key and version: key, version, 150 bytes of a pattern of both.
    let val = |k: &[u8], ver: u64| {
        let mut v = k.to_vec();
        v.extend(ver.to_be_bytes());
        v.extend((0..150u64).map(|i| (ver.wrapping_mul(31) ^ i ^ k[7] as u64) as u8));
        v
    };
    let valid = |k: &[u8], v: &[u8]| v.len() == 166 && &v[..8] == k && v[16..] == val(k, u64::from_be_bytes(v[8..16].try_into().unwrap()))[16..];
    const BASE: u64 = 3000;
    let mut tx = db.begin();
    for i in 0..BASE {
        let k = (i * 2).to_be_bytes();
        tree.insert(&mut tx, &k, &val(&k, 0)).unwrap();
    }
    tx.commit().unwrap();
    db.checkpoint().unwrap();
    // Keys added by writers (odd ones), committed so far.
    let added = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    std::thread::scope(|s| {
        let writer = {
            let (db, added) = (db.clone(), added.clone());
            s.spawn(move || {
                let mut rng = SplitMix64(5);
                for batch in 0..60u64 {
                    let mut tx = db.begin();
                    for _ in 0..20 {
                        let k = (rng.next_u64() % BASE * 2).to_be_bytes();
                        tree.insert(&mut tx, &k, &val(&k, batch + 1)).unwrap();
                    }
                    let next = added.load(Ordering::Acquire);
                    for j in next..next + 10 {
                        let k = (j * 2 + 1).to_be_bytes();
                        tree.insert(&mut tx, &k, &val(&k, batch + 1)).unwrap();
                    }
                    tx.commit().unwrap();
                    added.store(next + 10, Ordering::Release);
                }
            })
        };
        for _ in 0..2 {
            let (db, added, done) = (db.clone(), added.clone(), done.clone());
            s.spawn(move || {
                let mut scans = 0;
                while !done.load(Ordering::Acquire) || scans < 3 {
                    scans += 1;
                    let odd_before = added.load(Ordering::Acquire);
                    let (mut even, mut odd) = (0u64, 0u64);
                    let mut last: Option<u64> = None;
                    tree.scan(db.buffer(), b"", &mut |k, v| {
                        let x = u64::from_be_bytes(k.try_into().unwrap());
                        assert!(last.is_none_or(|l| l < x), "scan order: {last:?} then {x}");
                        assert!(valid(k, v), "key {x}: a value nobody wrote");
                        if x % 2 == 0 {
                            assert_eq!(x, even * 2, "even key missing before {x}");
                            even += 1;
                        } else if (x - 1) / 2 < odd_before {
                            odd += 1;
                        }
                        last = Some(x);
                        // A slow reader: the leaves in its ring wait long enough for the
                        // writer to change some of them.
                        if x % 16 == 0 {
                            std::thread::sleep(std::time::Duration::from_micros(100));
                        }
                        true
                    })
                    .unwrap();
                    assert_eq!(even, BASE);
                    assert_eq!(odd, odd_before, "odd keys committed before the scan");
                }
            });
        }
        writer.join().unwrap();
        done.store(true, Ordering::Release);
    });
    let stats = db.buffer().stats();
    assert!(stats.ring_hits > 0 && stats.evictions > 0, "{stats:?}");
    db.check().unwrap();
}

/// A writer that waits for the lock of a leaf that the holder empties, unlinks and frees
/// at commit must not keep the lock of the freed leaf: its insert restarts into the leaf
/// that covers the key now, and every allocation that reuses the freed ids takes its lock
/// at once. (Before the fix the waiter was granted the freed leaf's lock and kept it, and
/// the allocation of that id waited the whole lock wait behind it.)
#[test]
fn a_writer_waiting_for_a_leaf_freed_by_a_merge_does_not_keep_its_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let db = Database::create(config(&tmp.path().join("db"), 8 << 20)).unwrap();
    let tree = db.create_tree("t").unwrap();
    let k = |i: u64| i.to_be_bytes();
    let mut tx = db.begin();
    for i in 0..2000u64 {
        tree.insert(&mut tx, &k(i), &[i as u8; 100]).unwrap();
    }
    tx.commit().unwrap();
    let pages = |r: &strata::access::btree::TreeReport| r.inner_nodes + r.leaves_per_class.iter().sum::<u64>();
    let before = pages(&tree.check(db.buffer(), &mut |_| {}).unwrap());

    // The remover holds the leftmost leaf's lock, then the writer waits for it.
    let mut remover = db.begin();
    assert!(tree.remove(&mut remover, &k(0)).unwrap());
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut w = db.begin();
            w.set_lock_wait(std::time::Duration::from_secs(20));
            tree.insert(&mut w, &k(0), b"again").unwrap();
            w
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        // Empty the leaf (and many after it): unlinked and merged away, freed at commit.
        for i in 1..600u64 {
            assert!(tree.remove(&mut remover, &k(i)).unwrap());
        }
        remover.commit().unwrap();
        let w = writer.join().unwrap();
        let after = pages(&tree.check(db.buffer(), &mut |_| {}).unwrap());
        assert!(after < before, "no node was freed: {before} -> {after} pages");
        // Allocate every freed id again (and some more): no allocation waits, and the
        // writer holds none of them.
        // (No lock wait at all: an allocation that had to wait for its lock fails.)
        let mut a = db.begin();
        a.set_lock_wait(std::time::Duration::ZERO);
        for _ in 0..before - after + 8 {
            let p = a.alloc(100).expect("the allocation of a fresh page waited for its lock");
            assert!(!w.holds(p), "the writer holds the lock of page {p}, freed by the remover and allocated again");
        }
        a.abort().unwrap();
        w.commit().unwrap();
    });
    let mut out = Vec::new();
    assert!(tree.get(db.buffer(), &k(0), &mut out).unwrap());
    assert_eq!(out, b"again");
    assert!(!tree.get(db.buffer(), &k(1), &mut out).unwrap());
    tree.check(db.buffer(), &mut |_| {}).unwrap();
}
