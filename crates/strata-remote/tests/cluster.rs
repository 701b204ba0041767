//! The tier against a 3-node Redis/Valkey Cluster on loopback (made with `--cluster create`).

mod common;

use common::*;
use strata::{Config, Database, PAGE_HEADER_SIZE};

#[test]
fn cluster_serves_hits_spreads_pages_and_keeps_chunks_together() {
    let mut cluster = Cluster::start(256 << 20);
    let url = cluster.url();

    // A column 16 times the pool.
    let vals = values(VALUES, 11);
    let tier = tier(&url, "c1");
    assert!(tier.config().is_cluster());
    let dir = tempfile::tempdir().unwrap();
    let db = database(dir.path(), Some(tier.clone()));
    let col = import(&db, "v", &vals);
    let want = page_sums(&col, &vals);
    let order = shuffled(col.pages.len(), 11);
    let gt = 1i128 << 39;
    let s = scan(&db, &col, gt);
    assert_eq!((s.count, s.sum), expected_scan(&vals, gt));
    settle(&tier);
    let s = scan(&db, &col, gt);
    assert_eq!((s.count, s.sum), expected_scan(&vals, gt));
    assert_eq!(read_pages(&db, &col, &order), want);
    let r = remote(&db);
    assert!(r.hits > 0 && r.errors == 0 && r.rejected == 0, "{r:?}");
    for n in &cluster.nodes {
        assert!(n.dbsize() > 0, "every node holds some pages (hash tags spread them)");
    }

    // Pages of 2 MiB: both chunks on one node, read back with one MGET.
    let tier2 = common::tier(&url, "c2");
    let dir2 = tempfile::tempdir().unwrap();
    let db2 = Database::create(Config::new(dir2.path().join("db")).pool_size(8 << 20).min_page(64 << 10).remote_tier(tier2.clone())).unwrap();
    let payload = (2 << 20) - PAGE_HEADER_SIZE;
    let pids: Vec<_> = (0..10u64)
        .map(|i| {
            let mut g = db2.buffer().alloc(payload).unwrap();
            g.write_u64(0, i);
            g.write_u64((1 << 20) - 8, i * 3);
            g.write_u64(payload - 8, !i);
            g.pid()
        })
        .collect();
    db2.checkpoint().unwrap();
    let check = || {
        for &i in &shuffled(pids.len(), 3) {
            let g = db2.buffer().fix_shared(pids[i]).unwrap();
            let at = |o: usize| u64::from_le_bytes(g.data()[o..o + 8].try_into().unwrap());
            assert_eq!((at(0), at((1 << 20) - 8), at(payload - 8)), (i as u64, i as u64 * 3, !(i as u64)));
        }
    };
    check();
    settle(&tier2);
    // KEYS lists a node's own keys (EXISTS would answer MOVED for the others').
    let per_node: Vec<Vec<String>> = cluster.nodes.iter().map(|n| n.cmd(&[b"KEYS", b"c2:*"])).collect();
    let mut together = 0;
    for &p in &pids {
        let (k0, k1) = (key("c2", p, 0), key("c2", p, 1));
        for keys in &per_node {
            assert_eq!(keys.contains(&k0), keys.contains(&k1), "both chunks of {p:?} on the same node: {per_node:?}");
            together += keys.contains(&k0) as usize;
        }
    }
    assert!(together > 0);
    let hits = remote(&db2).hits;
    check();
    let r = remote(&db2);
    assert!(r.hits > hits && r.rejected == 0, "{r:?}");

    // One node killed: its pages fail or miss, the others still hit, results stay right.
    settle(&tier);
    cluster.nodes[2].kill();
    let guard = hang_guard("a pass and a scan with one cluster node killed");
    assert_eq!(read_pages(&db, &col, &order), want);
    let s = scan(&db, &col, gt);
    drop(guard);
    assert_eq!((s.count, s.sum), expected_scan(&vals, gt));
    let r = remote(&db);
    assert!(r.errors > 0, "{r:?}");
    db.check().unwrap();
}
