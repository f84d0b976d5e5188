//! The buffer pool under concurrency: buffers come back from whatever thread drops them while
//! others allocate, and on InfiniBand every buffer carries a device registration. Checked: the
//! byte limit holds, no registration is made twice for live memory or dropped while its
//! buffer is out, and when everything is gone every registration has been dropped exactly once.

use std::collections::HashSet;
use std::sync::Arc;

use crate::buffers::buf::{BufPool, MemKeys, PoolRegistrar};
use crate::error::{Error, Result};
use crate::sync::Mutex;

/// A device that records which addresses are registered.
#[derive(Debug)]
struct Device {
    registered: Mutex<HashSet<usize>>,
    /// Addresses a test thread holds as a `RegisteredBuf` right now.
    out: Mutex<HashSet<usize>>,
    made: Mutex<(usize, usize)>,
    /// Most buffers the pool may have out at once (its byte limit in pages).
    limit: usize,
}

impl PoolRegistrar for Device {
    fn register(&self, mem: &mut [u8]) -> Result<MemKeys> {
        let addr = mem.as_ptr() as usize;
        assert!(self.registered.lock().unwrap().insert(addr), "{addr:#x} registered twice");
        self.made.lock().unwrap().0 += 1;
        Ok(MemKeys { lkey: 1, rkey: 2 })
    }
    fn deregister(&self, mem: &[u8], keys: MemKeys) {
        let addr = mem.as_ptr() as usize;
        assert_eq!(keys, MemKeys { lkey: 1, rkey: 2 }, "keys travel with their memory");
        assert!(!self.out.lock().unwrap().contains(&addr), "{addr:#x} deregistered while in use");
        assert!(self.registered.lock().unwrap().remove(&addr), "{addr:#x} deregistered twice");
        self.made.lock().unwrap().1 += 1;
    }
}

const PAGE: usize = 4096;

impl Device {
    fn new(limit: usize) -> Arc<Device> {
        Arc::new(Device {
            registered: Mutex::new(HashSet::new()),
            out: Mutex::new(HashSet::new()),
            made: Mutex::new((0, 0)),
            limit,
        })
    }
}

fn take(pool: &BufPool, dev: &Device, len: usize) -> Option<crate::buffers::buf::RegisteredBuf> {
    match pool.alloc(len) {
        Ok(b) => {
            assert!(b.is_registered());
            let mut out = dev.out.lock().unwrap();
            out.insert(b.addr());
            assert!(out.len() <= dev.limit, "more buffers out than the byte limit allows");
            Some(b)
        }
        Err(Error::Exhausted(_)) => None,
        Err(e) => panic!("{e}"),
    }
}

fn give(dev: &Device, b: crate::buffers::buf::RegisteredBuf) {
    dev.out.lock().unwrap().remove(&b.addr());
    drop(b);
}

/// Two threads allocate and drop against a pool with room for two pages and a cache of one,
/// one of them handing its buffer to the other to drop.
#[test]
fn loom_pool_alloc_and_give_back_across_threads() {
    loom::model(|| {
        let dev = Device::new(2);
        let pool = BufPool::with_registrar(2 * PAGE as u64, PAGE as u64, dev.clone());
        let first = take(&pool, &dev, 100).expect("an empty pool has room");
        let (p2, d2) = (pool.clone(), dev.clone());
        let other = loom::thread::spawn(move || {
            // Drops a buffer allocated elsewhere, then allocates and drops its own.
            give(&d2, first);
            if let Some(b) = take(&p2, &d2, PAGE) {
                give(&d2, b);
            }
        });
        let mine = take(&pool, &dev, 10);
        let stats = pool.stats();
        assert!(stats.in_use_bytes + stats.cached_bytes <= 2 * PAGE as u64, "{stats:?}");
        if let Some(b) = mine {
            give(&dev, b);
        }
        other.join().unwrap();
        let s = pool.stats();
        assert_eq!(s.in_use_bytes, 0, "{s:?}");
        assert!(s.cached_bytes <= PAGE as u64);
        drop(pool);
        let (made, dropped) = *dev.made.lock().unwrap();
        assert_eq!(made, dropped, "registrations leaked");
        assert!(dev.registered.lock().unwrap().is_empty());
    });
}

/// A pool whose limit is one page, contended: exactly one of two threads gets the page at a
/// time and the loser gets `Exhausted`, never a second page.
#[test]
fn loom_pool_limit_holds_under_contention() {
    loom::model(|| {
        let dev = Device::new(1);
        let pool = BufPool::with_registrar(PAGE as u64, 0, dev.clone());
        let (p2, d2) = (pool.clone(), dev.clone());
        let other = loom::thread::spawn(move || take(&p2, &d2, PAGE).map(|b| give(&d2, b)).is_some());
        let mine = take(&pool, &dev, PAGE);
        let got_mine = mine.is_some();
        if let Some(b) = mine {
            give(&dev, b);
        }
        let got_other = other.join().unwrap();
        assert!(got_mine || got_other, "the page was free for someone");
        drop(pool);
        let (made, dropped) = *dev.made.lock().unwrap();
        assert_eq!(made, dropped);
    });
}
