//! A profiling driver for B+-tree lookups: the in-memory shape of `strata bench btree`
//! (8-byte big-endian keys in scrambled order, 100-byte values, a 16 MiB pool, entries of
//! half the pool), then uniform lookups (or, with `scan`, scans of 10..=100 entries) from 1 and 2
//! threads for a few seconds each.
//!
//! ```sh
//! cargo run --release -p strata --example btree_lookup [SECONDS] [ENTRIES] [scan]
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata::{Config, Database, Result};

/// A bijection on u64 (splitmix's finaliser), so keys arrive in random order.
fn scramble(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// This thread's CPU time in seconds (the machine may be shared: lookups per CPU second
/// are steadier than per wall second).
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let seconds: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(77_000);
    // `scan`: scans of 10..=100 entries from random keys instead of lookups (as YCSB E).
    let scans = args.get(3).is_some_and(|a| a == "scan");
    let dir = std::env::temp_dir().join(format!("strata-btree-lookup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let db = Arc::new(Database::create(Config::new(&dir).pool_size(16 << 20).min_page(4096))?);
    let tree = db.create_tree("t")?;
    let value = |i: u64| {
        let mut v = vec![0u8; 100];
        v[..8].copy_from_slice(&i.to_le_bytes());
        v
    };
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut tx = db.begin();
        for &i in chunk {
            tree.insert(&mut tx, &scramble(i).to_be_bytes(), &value(i))?;
        }
        tx.commit()?;
    }
    for threads in [1, 2] {
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (db, stop) = (db.clone(), stop.clone());
                std::thread::spawn(move || -> Result<(u64, f64)> {
                    let cpu0 = thread_cpu();
                    let mut out = Vec::with_capacity(128);
                    let mut r = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(t + 1);
                    let mut ops = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..256 {
                            r = r.wrapping_add(0x9e37_79b9_7f4a_7c15);
                            let i = scramble(r) % n;
                            if scans {
                                let mut left = 10 + r % 91;
                                tree.scan(db.buffer(), &scramble(i).to_be_bytes(), &mut |_, v| {
                                    out.clear();
                                    out.extend_from_slice(v);
                                    left -= 1;
                                    left > 0
                                })?;
                            } else {
                                let found = tree.get(db.buffer(), &scramble(i).to_be_bytes(), &mut out)?;
                                assert!(found && out[..8] == i.to_le_bytes(), "entry {i}");
                            }
                        }
                        ops += 256;
                    }
                    Ok((ops, thread_cpu() - cpu0))
                })
            })
            .collect();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
        let (mut ops, mut cpu) = (0, 0.0);
        for h in handles {
            let (o, c) = h.join().expect("lookup thread")?;
            ops += o;
            cpu += c;
        }
        let s = t0.elapsed().as_secs_f64();
        println!("threads {threads}: {:.3} M lookups/s, {:.3} M per CPU second", ops as f64 / s / 1e6, ops as f64 / cpu / 1e6);
    }
    drop(db);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
