//! Pin-down cache lookup cost at 10 000 cached entries (target: a hit under 100 ns).
//!
//! Run: `cargo bench -p ionet --bench regcache`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use ionet::MemKeys;
use ionet::internals::regcache::{Origin, RegCache, RegCacheConfig, RegError, Registrar};
use ionet::types::Access;

/// Registers nothing; hands out distinct keys.
struct NoopRegistrar(u32);

impl Registrar for NoopRegistrar {
    type Handle = u32;
    fn register(&mut self, _addr: usize, _len: usize, _access: Access) -> Result<(u32, MemKeys), RegError> {
        self.0 += 1;
        Ok((self.0, MemKeys { lkey: self.0, rkey: self.0 }))
    }
    fn deregister(&mut self, _h: u32) {}
}

const ENTRIES: usize = 10_000;
/// 64 KiB buffers 128 KiB apart, so no two entries merge.
const STRIDE: usize = 128 << 10;
const LEN: usize = 64 << 10;
const BASE: usize = 0x7f00_0000_0000;

fn filled_cache() -> RegCache<NoopRegistrar> {
    let cfg = RegCacheConfig::default().max_entries(ENTRIES).max_pinned_bytes(ENTRIES * LEN);
    let mut c = RegCache::new(NoopRegistrar(0), cfg).unwrap();
    for i in 0..ENTRIES {
        let r = c.acquire(BASE + i * STRIDE, LEN, Access::READ_WRITE, Origin::Owned).unwrap();
        c.release(r).unwrap();
    }
    assert_eq!(c.stats().entries as usize, ENTRIES);
    c
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("regcache_10k");
    // Addresses spread over the whole cache (a multiplicative walk) so the B-tree path and the
    // slab slot differ between iterations.
    let addr_of = |i: usize| BASE + (i.wrapping_mul(7919) % ENTRIES) * STRIDE + 4096;

    let mut cache = filled_cache();
    let mut i = 0usize;
    g.bench_function("acquire_release_hit", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let r = cache.acquire(black_box(addr_of(i)), 8192, Access::READ_WRITE, Origin::Owned).unwrap();
            let k = r.keys();
            cache.release(r).unwrap();
            k
        })
    });
    assert_eq!(cache.stats().registrations as usize, ENTRIES, "every benchmark lookup was a hit");

    let cache = filled_cache();
    let mut i = 0usize;
    g.bench_function("check_if_registered_hit", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            cache.check_if_registered(black_box(addr_of(i)), 8192)
        })
    });
    g.bench_function("check_if_registered_miss", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            // Between two entries: never covered.
            cache.check_if_registered(black_box(addr_of(i) + LEN), 8192)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
