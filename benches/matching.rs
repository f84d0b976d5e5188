//! Tag matching: a posted receive meeting its message, with many other (peer, tag) keys live,
//! and an early arrival taken by a later post.
//!
//! Run: `cargo bench -p ionet --bench matching`

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ionet::internals::fuzzing::ids;
use ionet::internals::matching::{Arrival, Matcher};
use ionet::types::{OpId, PeerId};

fn peer(p: u32) -> PeerId {
    ids(p, 0).0
}

fn op_id(o: u64) -> OpId {
    ids(0, o).1
}

/// Live keys besides the measured one: 64 peers × 16 tags with a receive posted each.
fn busy_matcher() -> Matcher<u32, u32> {
    let mut m = Matcher::new();
    let mut op = 1_000_000u64;
    for p in 0..64u32 {
        for t in 0..16u64 {
            op += 1;
            m.post(peer(p), 1000 + t, op_id(op), 0).unwrap();
        }
    }
    m
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("matching");
    g.throughput(Throughput::Elements(1));
    let mut m = busy_matcher();
    let mut op = 0u64;
    g.bench_function("post_then_arrive_1k_live_keys", |b| {
        b.iter(|| {
            op += 1;
            m.post(peer(7), 3, op_id(op), 1).unwrap();
            match m.arrive(peer(7), black_box(3), 2) {
                Arrival::Matched(o, r) => (o, r),
                _ => unreachable!("a receive was posted"),
            }
        })
    });
    let mut m = busy_matcher();
    g.bench_function("arrive_early_then_post", |b| {
        b.iter(|| {
            op += 1;
            assert!(matches!(m.arrive(peer(9), black_box(4), 5), Arrival::Queued));
            m.post(peer(9), 4, op_id(op), 1).unwrap_err()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
