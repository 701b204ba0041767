//! The tier against one private server: real strata databases whose data is 16 times their
//! pool, read through the tier; results never change, only where pages come from.

mod common;

use std::time::{Duration, Instant};

use common::*;
use strata::{Config, Database, PAGE_HEADER_SIZE};
use strata_remote::{RedisTier, RemoteConfig, RemoteError, DEFAULT_RETRY_INTERVAL};

const MAXMEMORY: u64 = 256 << 20;

#[test]
fn second_pass_hits_the_tier_and_results_are_identical() {
    let vals = values(VALUES, 1);
    let gt = 1i128 << 39;
    let want = expected_scan(&vals, gt);

    // Without the tier.
    let plain_dir = tempfile::tempdir().unwrap();
    let plain = database(plain_dir.path(), None);
    let col = import(&plain, "v", &vals);
    assert!(col.pages.len() >= 256, "{} pages", col.pages.len());
    let order = shuffled(col.pages.len(), 7);
    let plain_scan = scan(&plain, &col, gt);
    assert_eq!((plain_scan.count, plain_scan.sum), want);
    let plain_pages = read_pages(&plain, &col, &order);
    assert!(plain_pages == page_sums(&col, &vals));

    // With it.
    let server = Server::unix(MAXMEMORY);
    let tier = tier(&server.url(), "t1");
    let dir = tempfile::tempdir().unwrap();
    let db = database(dir.path(), Some(tier.clone()));
    let col = import(&db, "v", &vals);
    let first = scan(&db, &col, gt);
    settle(&tier);
    let before = db.buffer().stats();
    let second = scan(&db, &col, gt);
    let after = db.buffer().stats();
    assert_eq!(first, plain_scan);
    assert_eq!(second, plain_scan);
    let r = remote(&db);
    assert!(r.puts > 0 && r.hits > 0, "{r:?}");
    assert!(after.pages_read - before.pages_read < after.misses - before.misses, "some misses of the second scan were served by the tier");
    settle(&tier);
    let hits = remote(&db).hits;
    assert_eq!(read_pages(&db, &col, &order), plain_pages);
    let r = remote(&db);
    assert!(r.hits > hits, "random reads hit too: {r:?}");
    assert!(r.bytes_sent > 0 && r.bytes_received >= r.hits * (64 << 10), "{r:?}");
    assert_eq!((r.rejected, r.errors), (0, 0), "{r:?}");
    assert!(server.dbsize() > 0);
    db.check().unwrap();
}

#[test]
fn server_killed_mid_query_falls_back_to_disk() {
    let vals = values(VALUES, 2);
    let mut server = Server::unix(MAXMEMORY);
    let tier = tier_with(RemoteConfig::new(&server.url()).unwrap().prefix("t2"));
    let dir = tempfile::tempdir().unwrap();
    let db = database(dir.path(), Some(tier.clone()));
    let col = import(&db, "v", &vals);
    let want = page_sums(&col, &vals);
    let order = shuffled(col.pages.len(), 3);
    assert_eq!(read_pages(&db, &col, &order), want);
    settle(&tier);

    // Kill the server a third into the second pass.
    let hits = remote(&db).hits;
    let (head, tail) = order.split_at(order.len() / 3);
    let mut got = read_pages(&db, &col, head);
    server.kill();
    let (before, started) = (tier.counters(), Instant::now());
    got.extend(read_pages(&db, &col, tail));
    assert_failed_fast(&before, &tier.counters(), started.elapsed(), DEFAULT_RETRY_INTERVAL);
    got.sort_unstable();
    assert_eq!(got, want);
    let r = remote(&db);
    assert!(r.hits > hits, "hits before the kill: {r:?}");
    assert!(r.errors > 0, "lookups after the kill failed and were counted: {r:?}");

    // A whole query while the server is gone: correct, from disk, and its lookups fail fast.
    let gt = 1i128 << 38;
    let (before, started) = (tier.counters(), Instant::now());
    let s = scan(&db, &col, gt);
    assert_failed_fast(&before, &tier.counters(), started.elapsed(), DEFAULT_RETRY_INTERVAL);
    assert_eq!((s.count, s.sum), expected_scan(&vals, gt));
    settle(&tier);
    let c = tier.counters();
    assert!(c.get_errors > 0 && c.dropped_offline > 0, "{c:?}");
    assert!(remote(&db).dropped > 0);
    db.check().unwrap();
}

#[test]
fn hung_server_costs_timeouts_not_stalls() {
    let vals = values(VALUES, 9);
    let server = Server::unix(MAXMEMORY);
    // A retry interval well above the response timeout: a tier that waited for the timeout
    // on every lookup would then exceed what assert_failed_fast allows per interval.
    let retry = Duration::from_secs(2);
    let tier = tier_with(RemoteConfig::new(&server.url()).unwrap().prefix("t9").retry_interval(retry));
    let dir = tempfile::tempdir().unwrap();
    let db = database(dir.path(), Some(tier.clone()));
    let col = import(&db, "v", &vals);
    let want = page_sums(&col, &vals);
    let order = shuffled(col.pages.len(), 9);
    assert_eq!(read_pages(&db, &col, &order), want);
    settle(&tier);
    assert_eq!(read_pages(&db, &col, &order), want);
    assert!(remote(&db).hits > 0);

    // Frozen: the first lookup waits for the response timeout, then the server is marked
    // down and lookups fail at once, with one probe per retry interval.
    server.pause();
    let errors = remote(&db).errors;
    let (before, started) = (tier.counters(), Instant::now());
    assert_eq!(read_pages(&db, &col, &order), want);
    assert_failed_fast(&before, &tier.counters(), started.elapsed(), retry);
    server.resume();
    let r = remote(&db);
    assert!(r.errors > errors, "{r:?}");

    // Thawed: work resumes once a probe finds the server again (after the retry interval).
    wait_until("hits again after the thaw", || {
        assert_eq!(read_pages(&db, &col, &order), want);
        settle(&tier);
        let hits = remote(&db).hits;
        assert_eq!(read_pages(&db, &col, &order), want);
        remote(&db).hits > hits
    });
}

#[test]
fn flushed_or_restarted_server_costs_misses_not_results() {
    let vals = values(VALUES, 3);
    let mut server = Server::unix(MAXMEMORY);
    let tier = tier(&server.url(), "t3");
    let dir = tempfile::tempdir().unwrap();
    let db = database(dir.path(), Some(tier.clone()));
    let col = import(&db, "v", &vals);
    let want = page_sums(&col, &vals);
    let order = shuffled(col.pages.len(), 4);
    assert_eq!(read_pages(&db, &col, &order), want);
    settle(&tier);
    assert_eq!(read_pages(&db, &col, &order), want);
    let r = remote(&db);
    assert!(r.hits > 0, "{r:?}");

    // FLUSHALL behind the tier's back: misses.
    settle(&tier);
    let _: () = server.cmd(&[b"FLUSHALL"]);
    let (hits, misses) = (r.hits, r.misses);
    assert_eq!(read_pages(&db, &col, &order), want);
    let r = remote(&db);
    assert!(r.misses > misses, "{r:?}");
    // Only pages resident at the start (at most the pool's 16 frames), evicted and put again
    // during the pass, can hit.
    assert!(r.hits - hits <= 16 && r.misses - misses > 200, "nothing left to hit: {r:?}");

    // Restart: the pooled connections are dead, the server is empty. Misses (or errors while
    // reconnecting), same results.
    settle(&tier);
    server.restart();
    let (misses, errors) = (r.misses, r.errors);
    assert_eq!(read_pages(&db, &col, &order), want);
    let r = remote(&db);
    assert!(r.misses + r.errors > misses + errors, "{r:?}");

    // Work resumes: after the retry interval the writer reconnects and stores again.
    wait_until("hits again after the restart", || {
        assert_eq!(read_pages(&db, &col, &order), want);
        settle(&tier);
        let hits = remote(&db).hits;
        assert_eq!(read_pages(&db, &col, &order), want);
        remote(&db).hits > hits
    });
    assert!(server.dbsize() > 0);
    assert!(tier.counters().reconnects > 0, "{:?}", tier.counters());
}

#[test]
fn tampered_objects_are_rejected() {
    let vals = values(VALUES, 4);
    let server = Server::unix(MAXMEMORY);
    let tier = tier(&server.url(), "t4");
    let dir = tempfile::tempdir().unwrap();
    let db = database(dir.path(), Some(tier.clone()));
    let col = import(&db, "v", &vals);
    let want = page_sums(&col, &vals);
    let sequential: Vec<usize> = (0..col.pages.len()).collect();
    assert_eq!(read_pages(&db, &col, &sequential), want);
    settle(&tier);
    assert_eq!(read_pages(&db, &col, &sequential), want);
    settle(&tier);

    // Pages 0 and 1 were evicted long ago and are stored: flip bytes of one, truncate the other.
    let (k0, k1) = (key("t4", col.pages[0].page_id(), 0), key("t4", col.pages[1].page_id(), 0));
    let exists: u64 = server.cmd(&[b"EXISTS", k0.as_bytes(), k1.as_bytes()]);
    assert_eq!(exists, 2);
    let _: u64 = server.cmd(&[b"SETRANGE", k0.as_bytes(), b"5000", b"\xde\xad\xbe\xef"]);
    let _: () = server.cmd(&[b"SET", k1.as_bytes(), b"short"]);
    let rejected = remote(&db).rejected;
    assert_eq!(read_pages(&db, &col, &[0, 1]), want[..2].to_vec());
    let r = remote(&db);
    assert_eq!(r.rejected, rejected + 2, "{r:?}");

    // And a whole scan over everything (including whatever else is stored) stays right.
    let gt = 1i128 << 39;
    let s = scan(&db, &col, gt);
    assert_eq!((s.count, s.sum), expected_scan(&vals, gt));
}

#[test]
fn wrong_password_is_a_clear_error_without_the_password() {
    let secret = "Sup3r-s3cret-pw";
    let server = Server::tcp(MAXMEMORY, &["--requirepass", secret]);
    let port = server.port();

    let wrong = format!("redis://default:Wr0ng-guess-pw@127.0.0.1:{port}");
    let e = RedisTier::connect(RemoteConfig::new(&wrong).unwrap()).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, RemoteError::AuthFailed { .. }), "{e:?}");
    assert_eq!(msg, format!("remote tier redis://default:***@127.0.0.1:{port}: authentication failed (wrong user or password)"));
    for shown in [msg, format!("{e:?}")] {
        assert!(!shown.contains("Wr0ng-guess-pw") && !shown.contains(secret), "{shown}");
    }

    // Without a password.
    let e = RedisTier::connect(RemoteConfig::new(&format!("redis://127.0.0.1:{port}")).unwrap()).unwrap_err();
    assert!(matches!(e, RemoteError::AuthRequired { .. }), "{e:?}");

    // An ACL user: right and wrong.
    let _: () = server.cmd(&[b"ACL", b"SETUSER", b"alice", b"on", b">alice-pw-123", b"~*", b"+@all"]);
    let e = RedisTier::connect(RemoteConfig::new(&format!("redis://alice:nope-nope@127.0.0.1:{port}")).unwrap()).unwrap_err();
    assert!(matches!(e, RemoteError::AuthFailed { .. }) && !e.to_string().contains("nope-nope"), "{e:?}");
    let alice = tier(&format!("redis://alice:alice-pw-123@127.0.0.1:{port}"), "t6");
    assert!(!format!("{alice:?}").contains("alice-pw-123"));

    // The right password works end to end, and nothing shows it.
    let url = format!("redis://:{secret}@127.0.0.1:{port}");
    let config = RemoteConfig::new(&url).unwrap().prefix("t6");
    assert!(!format!("{config:?} {config}").contains(secret));
    let tier = tier_with(config);
    assert!(!format!("{tier:?}").contains(secret));
    let vals = values(VALUES / 4, 6);
    let dir = tempfile::tempdir().unwrap();
    let db = database(dir.path(), Some(tier.clone()));
    let col = import(&db, "v", &vals);
    let order = shuffled(col.pages.len(), 6);
    assert_eq!(read_pages(&db, &col, &order), page_sums(&col, &vals));
    settle(&tier);
    assert_eq!(read_pages(&db, &col, &order), page_sums(&col, &vals));
    assert!(remote(&db).hits > 0);

    // Nobody listening: a connect error, quickly.
    drop((db, tier, alice));
    drop(server);
    let guard = hang_guard("connecting to a closed port");
    let e = RedisTier::connect(RemoteConfig::new(&format!("redis://:{secret}@127.0.0.1:{port}")).unwrap()).unwrap_err();
    drop(guard);
    assert!(matches!(e, RemoteError::Connect { .. }) && !e.to_string().contains(secret), "{e:?}");
}

/// Pages of 2 MiB, stored as two 1 MiB chunks each.
#[test]
fn two_mib_pages_round_trip_in_chunks() {
    let server = Server::unix(MAXMEMORY);
    let tier = tier(&server.url(), "t7");
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(Config::new(dir.path().join("db")).pool_size(8 << 20).min_page(64 << 10).remote_tier(tier.clone())).unwrap();
    let payload = (2 << 20) - PAGE_HEADER_SIZE;
    let n = 12u64;
    let pattern = |page: u64, at: usize| (page << 32) ^ (at as u64).wrapping_mul(0x9e37_79b9);
    let offsets = [0usize, 8, (1 << 20) - PAGE_HEADER_SIZE - 8, (1 << 20) - 8, 1 << 20, payload - 8];
    let pids: Vec<_> = (0..n)
        .map(|i| {
            let mut g = db.buffer().alloc(payload).unwrap();
            let mut buf = vec![0u8; payload];
            for (k, c) in buf.chunks_exact_mut(8).enumerate() {
                c.copy_from_slice(&pattern(i, k * 8).to_le_bytes());
            }
            g.write(0, &buf);
            g.pid()
        })
        .collect();
    db.checkpoint().unwrap();
    assert_eq!(db.buffer().classes().page_size(pids[0].class()), 2 << 20);
    let check = |order: &[usize]| {
        for &i in order {
            let g = db.buffer().fix_shared(pids[i]).unwrap();
            for &at in &offsets {
                assert_eq!(u64::from_le_bytes(g.data()[at..at + 8].try_into().unwrap()), pattern(i as u64, at), "page {i} at {at}");
            }
            let all: u64 = g.data().chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).fold(0, u64::wrapping_add);
            let want = (0..payload / 8).map(|k| pattern(i as u64, k * 8)).fold(0, u64::wrapping_add);
            assert_eq!(all, want, "page {i}");
        }
    };
    let order = shuffled(n as usize, 9);
    check(&order);
    settle(&tier);
    // Stored pages have both chunks, 1 MiB each.
    let stored: Vec<_> = pids.iter().filter(|&&p| server.cmd::<u64>(&[b"EXISTS", key("t7", p, 0).as_bytes()]) == 1).collect();
    assert!(!stored.is_empty());
    for &&p in &stored {
        for chunk in 0..2 {
            let len: u64 = server.cmd(&[b"STRLEN", key("t7", p, chunk).as_bytes()]);
            assert_eq!(len, 1 << 20, "{p:?} chunk {chunk}");
        }
    }
    let hits = remote(&db).hits;
    check(&order);
    check(&order);
    let r = remote(&db);
    assert!(r.hits > hits && r.bytes_received >= 2 << 20, "{r:?}");
    assert_eq!(r.rejected, 0);

    // One chunk missing: a miss, not an error.
    settle(&tier);
    let victims: Vec<_> = pids.iter().filter(|&&p| server.cmd::<u64>(&[b"EXISTS", key("t7", p, 1).as_bytes()]) == 1).collect();
    for &&p in &victims {
        let _: u64 = server.cmd(&[b"DEL", key("t7", p, 1).as_bytes()]);
    }
    let (misses, hits) = (r.misses, r.hits);
    check(&order);
    let r = remote(&db);
    assert!(r.misses > misses && r.errors == 0 && r.rejected == 0, "{r:?}");
    // Only pages resident at the start (at most 4 in the 8 MiB pool) can have been stored whole again.
    assert!(r.hits - hits <= 4, "{r:?}");
}

#[test]
fn budget_keeps_the_server_bounded() {
    let vals = values(VALUES, 8);
    let server = Server::unix(MAXMEMORY);
    let budget = 1u64 << 20; // 16 pages of 64 KiB
    let tier = tier_with(RemoteConfig::new(&server.url()).unwrap().prefix("t8").budget(budget));
    let dir = tempfile::tempdir().unwrap();
    let db = database(dir.path(), Some(tier.clone()));
    let col = import(&db, "v", &vals);
    let want = page_sums(&col, &vals);
    let mut max_keys = 0;
    for seed in 0..3 {
        assert_eq!(read_pages(&db, &col, &shuffled(col.pages.len(), seed)), want);
        settle(&tier);
        max_keys = max_keys.max(server.dbsize());
        let c = tier.counters();
        assert!(c.stored_bytes <= budget, "{c:?}");
    }
    let c = tier.counters();
    assert!(c.budget_evictions > 0 && c.pages_sent > 32, "{c:?}");
    assert!(max_keys <= budget / (64 << 10), "{max_keys} objects of 64 KiB for a budget of {budget}");
    assert!(max_keys > 0);
    // The values' memory as the server counts it (allocator size classes included).
    let dataset = server.memory("used_memory_dataset");
    assert!(dataset < budget * 3 / 2, "used_memory_dataset {dataset} for a budget of {budget} (used_memory {})", server.memory("used_memory"));

    // A queue smaller than a page: every put is dropped and counted, nothing is stored.
    let server = Server::unix(MAXMEMORY);
    let tier = tier_with(RemoteConfig::new(&server.url()).unwrap().prefix("t8").queue(1000));
    let dir = tempfile::tempdir().unwrap();
    let db = database(dir.path(), Some(tier.clone()));
    let col = import(&db, "v", &vals[..VALUES / 8]);
    assert_eq!(read_pages(&db, &col, &shuffled(col.pages.len(), 1)), page_sums(&col, &vals[..VALUES / 8]));
    settle(&tier);
    let r = remote(&db);
    assert!(r.puts > 0 && r.dropped == r.puts, "{r:?}");
    assert_eq!(server.dbsize(), 0);
}

#[test]
fn warm_restart_fills_the_pool_from_the_server() {
    let vals = values(VALUES, 5);
    let server = Server::unix(MAXMEMORY);
    let dir = tempfile::tempdir().unwrap();
    let config = |t: std::sync::Arc<RedisTier>| Config::new(dir.path().join("db")).pool_size(POOL).min_page(64 << 10).remote_tier(t).warm_restart(true);
    let db = Database::create(config(tier(&server.url(), "warm"))).unwrap();
    let col = import(&db, "v", &vals);
    let all: Vec<usize> = (0..col.pages.len()).collect();
    assert_eq!(read_pages(&db, &col, &all[..40]), page_sums(&col, &vals)[..40]);
    db.close().unwrap();
    // The snapshot lists the pages resident at close.
    let snap: Vec<u8> = server.cmd(&[b"GET", b"warm:meta:hot-set"]);
    let hot: Vec<usize> = snap[20..snap.len() - 4]
        .chunks_exact(12)
        .map(|e| u64::from_le_bytes(e[0..8].try_into().unwrap()))
        .map(|raw| col.pages.iter().position(|p| p.page_id().raw() == raw).expect("a column page"))
        .collect();
    assert!(hot.len() >= 8, "{} pages in the snapshot", hot.len());

    let db = Database::open(config(tier(&server.url(), "warm"))).unwrap();
    let r = remote(&db);
    assert_eq!(r.hits, hot.len() as u64, "the whole hot set came from the server at open: {r:?}");
    assert_eq!(db.buffer().stats().pages_read, 0, "nothing was read from disk");
    let misses = db.buffer().stats().misses;
    let sums = page_sums(&col, &vals);
    let want: Vec<(usize, u128)> = {
        let mut w: Vec<(usize, u128)> = hot.iter().map(|&i| sums[i]).collect();
        w.sort_unstable();
        w
    };
    assert_eq!(read_pages(&db, &col, &hot), want);
    assert_eq!(db.buffer().stats().misses, misses, "the hot set is resident after a warm open");
    db.close().unwrap();

    // The server lost everything: the open is cold but correct.
    server.cmd::<()>(&[b"FLUSHALL"]);
    let db = Database::open(config(tier(&server.url(), "warm"))).unwrap();
    assert_eq!(remote(&db).hits, 0);
    assert_eq!(read_pages(&db, &col, &hot), want);
}
