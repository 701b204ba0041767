//! The key-value stores of `bench btree` behind [`KvStore`] (strata's B+-tree, redb, LMDB, the
//! sharded `BTreeMap`) against a `BTreeMap` model: batches written from two threads, every
//! key looked up, scans from random starts (across shard boundaries) compared entry by entry;
//! and the benchmark itself run in this process (no child executable).

use std::collections::BTreeMap;

use strata_bench::kv::{key_of, value_of, BTreeMapStore, Key, KvStore, LmdbStore, RedbStore, StrataKv, Val};
use strata_bench::workload::Rng;
use strata_bench::Options;

const N: u64 = 3000;

fn check(store: &dyn KvStore) {
    // Two writers, batches of 100, each thread its half; then some updates of thread 0's keys.
    std::thread::scope(|s| {
        for t in 0..2u64 {
            s.spawn(move || {
                let mut sess = store.session().unwrap();
                let mine: Vec<u64> = (0..N).filter(|i| i % 2 == t).collect();
                for chunk in mine.chunks(100) {
                    let batch: Vec<(Key, Val)> = chunk.iter().map(|&i| (key_of(i), value_of(i, 0))).collect();
                    sess.put(&batch).unwrap();
                }
            });
        }
    });
    let mut model: BTreeMap<Key, Val> = (0..N).map(|i| (key_of(i), value_of(i, 0))).collect();
    let mut sess = store.session().unwrap();
    for i in (0..N).step_by(31) {
        let v = value_of(i, 9);
        sess.put(&[(key_of(i), v)]).unwrap();
        model.insert(key_of(i), v);
    }
    let mut out = Vec::new();
    for (k, v) in &model {
        assert!(sess.get(k, &mut out).unwrap(), "{}: key {k:?} missing", store.name());
        assert_eq!(&out[..], &v[..], "{}", store.name());
    }
    assert!(!sess.get(&key_of(N + 1), &mut out).unwrap(), "{}: a key never inserted", store.name());
    let mut rng = Rng::new(5);
    for round in 0..200 {
        let start: Key = if round == 0 { [0; 8] } else { rng.next_u64().to_be_bytes() };
        let n = 1 + rng.below(150) as usize;
        let mut got: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let seen = sess.scan(&start, n, &mut |k, v| got.push((k.to_vec(), v.to_vec()))).unwrap();
        let want: Vec<(Vec<u8>, Vec<u8>)> = model.range(start..).take(n).map(|(k, v)| (k.to_vec(), v.to_vec())).collect();
        assert_eq!(seen, want.len(), "{}: scan of {n} from {start:?}", store.name());
        assert_eq!(got, want, "{}: scan of {n} from {start:?}", store.name());
    }
}

#[test]
fn every_store_matches_the_model() {
    let t = tempfile::tempdir().unwrap();
    check(&BTreeMapStore::new());
    let d = t.path().join("redb");
    std::fs::create_dir(&d).unwrap();
    check(&RedbStore::create(&d, 1 << 20).unwrap());
    let d = t.path().join("lmdb");
    std::fs::create_dir(&d).unwrap();
    check(&LmdbStore::create(&d, 64 << 20, 8).unwrap());
    // A pool of 64 pages: the tree (~400 KiB) is evicted and reloaded as it goes.
    check(&StrataKv::create(&t.path().join("strata"), 256 << 10, 4096).unwrap());
}

#[test]
fn btree_bench_in_process() {
    let t = tempfile::tempdir().unwrap();
    let opts = Options {
        threads: Some(vec![2]),
        pool: Some(1 << 20),
        seconds: Some(0.03),
        dir: Some(t.path().to_owned()),
        memory: Some("in".into()),
        engines: Some(vec!["strata".into(), "btreemap".into()]),
        ..Options::default()
    };
    let v = strata_bench::run("btree", &opts).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6, "{v}");
    for r in runs {
        assert_eq!(r["params"]["rss"], "shared: every engine in this process");
        for e in ["strata", "btreemap"] {
            let f = &r["engines"][e];
            assert!(f.get("failed").is_none(), "{e}: {r}");
            assert_eq!(f["not_found"], 0, "{e}: {r}");
            assert_eq!(f["verify_missing"], 0, "{e}: {r}");
        }
        assert!(r["ratios"]["btreemap"].as_f64().is_some_and(|x| x > 0.0), "{r}");
    }
    assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0, "scratch directory removed");
}
