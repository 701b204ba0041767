//! The buffer manager's side of the second memory tier, against an in-memory tier that can
//! lose, corrupt, replay old objects or fail: results never change, only where they come from.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use strata::buffer::{RemoteStats, RemoteTier};
use strata::{BufferManager, Config, PageId};

#[derive(Debug, Default)]
struct MemTier {
    objects: Mutex<HashMap<PageId, Vec<u8>>>,
    meta: Mutex<HashMap<String, Vec<u8>>>,
    down: AtomicBool,
}

impl RemoteTier for MemTier {
    fn put(&self, pid: PageId, image: &[u8]) {
        if !self.down.load(Ordering::Relaxed) {
            self.objects.lock().insert(pid, image.to_vec());
        }
    }
    fn get(&self, pid: PageId, _len: usize) -> Result<Option<Vec<u8>>, String> {
        if self.down.load(Ordering::Relaxed) {
            return Err("connection refused".into());
        }
        Ok(self.objects.lock().get(&pid).cloned())
    }
    fn remove(&self, pid: PageId) {
        self.objects.lock().remove(&pid);
    }
    fn put_meta(&self, name: &str, bytes: &[u8]) -> Result<(), String> {
        self.meta.lock().insert(name.to_owned(), bytes.to_vec());
        Ok(())
    }
    fn get_meta(&self, name: &str) -> Result<Option<Vec<u8>>, String> {
        Ok(self.meta.lock().get(name).cloned())
    }
}

fn pages(bm: &BufferManager, n: u64) -> Vec<PageId> {
    (0..n)
        .map(|i| {
            let mut g = bm.alloc(60_000).unwrap();
            g.write_u64(0, i);
            g.write_u64(59_992, !i);
            g.pid()
        })
        .collect()
}

fn read_all(bm: &BufferManager, pids: &[PageId]) -> Vec<(u64, u64)> {
    pids.iter().map(|&p| bm.read_optimistic(p, |g| Ok((g.read_u64(0), g.read_u64(59_992)))).unwrap()).collect()
}

fn remote(bm: &BufferManager) -> RemoteStats {
    bm.stats().remote.expect("tier configured")
}

#[test]
fn victims_come_back_from_the_tier_and_bad_objects_never_do() {
    let tmp = tempfile::tempdir().unwrap();
    let tier = Arc::new(MemTier::default());
    // 40 pages of 64 KiB through a 1 MiB pool.
    let bm = BufferManager::create(Config::new(tmp.path().join("db")).pool_size(1 << 20).remote_tier(tier.clone())).unwrap();
    let pids = pages(&bm, 40);
    let expected: Vec<(u64, u64)> = (0..40).map(|i| (i, !i)).collect();
    assert_eq!(read_all(&bm, &pids), expected);
    let before = bm.stats();
    assert_eq!(read_all(&bm, &pids), expected);
    let after = bm.stats();
    let r = remote(&bm);
    assert!(r.puts > 0 && r.hits > 0, "{r:?}");
    assert!(after.pages_read - before.pages_read < after.misses - before.misses, "some misses were served by the tier, not the disk");

    // Tamper with every object: all rejected, results unchanged.
    for img in tier.objects.lock().values_mut() {
        img[5000] ^= 1;
    }
    let rejected = remote(&bm).rejected;
    assert_eq!(read_all(&bm, &pids), expected);
    assert!(remote(&bm).rejected > rejected);

    // Stale objects: remember images, change every page (write-back makes the old images
    // stale), put the old images back behind the manager's back.
    assert_eq!(read_all(&bm, &pids), expected);
    let old: HashMap<PageId, Vec<u8>> = tier.objects.lock().clone();
    assert!(!old.is_empty());
    for (i, &p) in pids.iter().enumerate() {
        bm.fix_exclusive(p).unwrap().write_u64(0, 1000 + i as u64);
    }
    let changed: Vec<(u64, u64)> = (0..40).map(|i| (1000 + i, !i)).collect();
    assert_eq!(read_all(&bm, &pids), changed);
    tier.objects.lock().extend(old);
    let rejected = remote(&bm).rejected;
    assert_eq!(read_all(&bm, &pids), changed, "an old version from the tier is never used");
    assert!(remote(&bm).rejected > rejected, "stale objects were offered and rejected");

    // The tier goes away: errors, still correct.
    tier.down.store(true, Ordering::Relaxed);
    assert_eq!(read_all(&bm, &pids), changed);
    assert!(remote(&bm).errors > 0);
    tier.down.store(false, Ordering::Relaxed);

    // A freed page's object is dropped; a new page in its slot is not served from it.
    let victim = pids[3];
    bm.free(victim).unwrap();
    assert!(!tier.objects.lock().contains_key(&victim));
    bm.check_invariants().unwrap();
    bm.close().unwrap();

    // After a restart nothing in the tier is trusted until pages are evicted again.
    let bm = BufferManager::open(Config::new(tmp.path().join("db")).pool_size(1 << 20).remote_tier(tier.clone())).unwrap();
    let live: Vec<PageId> = pids.iter().copied().filter(|&p| p != victim).collect();
    let hits = remote(&bm).hits;
    let _ = read_all(&bm, &live[..10]);
    assert_eq!(remote(&bm).hits, hits);
}

#[test]
fn warm_restart_loads_the_hot_set_from_the_tier_only_if_nothing_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let tier = Arc::new(MemTier::default());
    let config = || Config::new(&dir).pool_size(1 << 20).remote_tier(tier.clone()).warm_restart(true);
    let bm = BufferManager::create(config()).unwrap();
    let pids = pages(&bm, 40);
    let expected: Vec<(u64, u64)> = (0..40).map(|i| (i, !i)).collect();
    assert_eq!(read_all(&bm, &pids[30..]), expected[30..]);
    bm.close().unwrap();
    assert!(tier.meta.lock().contains_key(strata::buffer::hotset::SNAPSHOT));

    // Warm: the pool is filled from the tier at open, before any fix.
    let bm = BufferManager::open(config()).unwrap();
    let warm = remote(&bm).hits;
    assert!(warm >= 8, "the hot set came from the tier ({warm} pages)");
    let misses = bm.stats().misses;
    assert_eq!(read_all(&bm, &pids[30..]), expected[30..]);
    assert!(bm.stats().misses - misses < 10, "the last pages read before close are resident after the warm open");
    // A change made durable after the snapshot makes it stale.
    bm.fix_exclusive(pids[35]).unwrap().write_u64(0, 4242);
    bm.checkpoint().unwrap();
    drop(bm); // Drop checkpoints but does not save a new snapshot.
    let tampered_old = tier.meta.lock().clone();
    let bm = BufferManager::open(config()).unwrap();
    assert_eq!(remote(&bm).hits, 0, "a snapshot older than the last checkpoint is ignored");
    assert_eq!(bm.read_optimistic(pids[35], |g| Ok(g.read_u64(0))).unwrap(), 4242);
    bm.close().unwrap();
    // A snapshot of another database (or a damaged one) is ignored too.
    *tier.meta.lock() = tampered_old;
    let bm = BufferManager::open(config()).unwrap();
    assert_eq!(remote(&bm).hits, 0);
    assert_eq!(bm.read_optimistic(pids[35], |g| Ok(g.read_u64(0))).unwrap(), 4242);
}

#[test]
fn prefetch_takes_pages_from_the_tier_too() {
    let tmp = tempfile::tempdir().unwrap();
    let tier = Arc::new(MemTier::default());
    let bm = BufferManager::create(Config::new(tmp.path().join("db")).pool_size(1 << 20).remote_tier(tier.clone())).unwrap();
    let pids = pages(&bm, 40);
    let expected: Vec<(u64, u64)> = (0..40).map(|i| (i, !i)).collect();
    assert_eq!(read_all(&bm, &pids), expected);
    let (hits, read) = (remote(&bm).hits, bm.stats().pages_read);
    let loaded = bm.prefetch(&pids[..4]);
    assert!(loaded > 0);
    assert!(remote(&bm).hits > hits, "prefetched pages came from the tier");
    assert_eq!(bm.stats().pages_read, read, "and not from the disk");
    assert_eq!(read_all(&bm, &pids[..4]), expected[..4]);
    bm.check_invariants().unwrap();
}
