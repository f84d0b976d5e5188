//! Frame-header encode / decode / limit check: paid once per message on every transport.
//!
//! Run: `cargo bench -p ionet --bench wire`

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ionet::ServiceLevel;
use ionet::internals::wire::{Header, Kind, Limits};

fn header() -> Header {
    let mut h = Header::new(Kind::Eager, ServiceLevel::Normal);
    h.len = 4096;
    h.a = 0x5346_494f;
    h.b = 42;
    h
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("wire");
    g.throughput(Throughput::Elements(1));
    let h = header();
    g.bench_function("header_encode", |b| b.iter(|| black_box(&h).encode()));
    let bytes = h.encode();
    g.bench_function("header_decode", |b| b.iter(|| Header::decode(black_box(&bytes)).unwrap()));
    let lim = Limits { eager: 16 << 10, chunk: 1 << 20, header: 64 << 10, message: 64 << 20 };
    g.bench_function("header_decode_and_check_limits", |b| {
        b.iter(|| {
            let h = Header::decode(black_box(&bytes)).unwrap();
            h.check_limits(black_box(&lim)).unwrap();
            h
        })
    });
    let mut bad = bytes;
    bad[0] ^= 0xff;
    g.bench_function("header_decode_rejects_bad_magic", |b| {
        b.iter(|| Header::decode(black_box(&bad)).is_err())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
