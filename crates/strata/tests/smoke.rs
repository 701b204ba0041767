use strata::{BufferManager, Config};

#[test]
fn alloc_write_evict_reload() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let bm = BufferManager::create(Config::new(&db).min_page(4096).pool_size(1 << 20)).unwrap();
    let mut pids = Vec::new();
    for i in 0..200u64 {
        let mut g = bm.alloc(if i % 3 == 0 { 20_000 } else { 3000 }).unwrap();
        g.write_u64(0, i * 7);
        g.write(8, &[i as u8; 13]);
        pids.push(g.pid());
    }
    assert!(bm.used_bytes() <= 1 << 20);
    for (i, &p) in pids.iter().enumerate() {
        let g = bm.fix_shared(p).unwrap();
        assert_eq!(u64::from_le_bytes(g.data()[..8].try_into().unwrap()), i as u64 * 7);
        assert_eq!(&g.data()[8..21], &[i as u8; 13]);
        drop(g);
        let v = bm.read_optimistic(p, |o| Ok(o.read_u64(0))).unwrap();
        assert_eq!(v, i as u64 * 7);
    }
    bm.check_invariants().unwrap();
    let st = bm.stats();
    assert!(st.evictions > 0 && st.misses > 0, "{st:?}");
    assert!(st.peak_resident_bytes <= 1 << 20);
    bm.close().unwrap();
    let bm = BufferManager::open(Config::new(&db).pool_size(1 << 20)).unwrap();
    for (i, &p) in pids.iter().enumerate() {
        let g = bm.fix_exclusive(p).unwrap();
        assert_eq!(u64::from_le_bytes(g.data()[..8].try_into().unwrap()), i as u64 * 7);
    }
    bm.free(pids[0]).unwrap();
    assert!(bm.fix_shared(pids[0]).is_err());
    assert!(bm.free(pids[0]).is_err());
}
