//! Credit accounting and fast-RDMA ring bookkeeping: the per-message cost of flow control on
//! the InfiniBand path.
//!
//! Run: `cargo bench -p ionet --bench flowctl`

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ionet::internals::flowctl::{CreditConfig, Credits, RingConfig, RingReceiver, RingSender, Transmit};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("flowctl");
    g.throughput(Throughput::Elements(1));
    // One message each way per iteration: send one (a credit spent), receive one from the peer
    // carrying a credit back, re-post the buffer it landed in.
    let cfg = CreditConfig::default();
    let mut k: Credits<u32> = Credits::new(&cfg, 16).unwrap();
    g.bench_function("credits_send_receive_repost", |b| {
        b.iter(|| {
            k.push(black_box(1)).unwrap();
            let piggy = match k.poll_transmit() {
                Some(Transmit::Data { piggyback, .. }) => piggyback,
                other => panic!("no credit: {:?}", other.is_some()),
            };
            k.on_message(1).unwrap();
            k.on_repost().unwrap();
            // Whatever became due goes out (a CREDIT now and then).
            while k.poll_transmit().is_some() {}
            piggy
        })
    });
    let mut tx = RingSender::new(8, 64 << 10).unwrap();
    let mut rx = RingReceiver::new(&RingConfig::default().slots(8).slot_size(64 << 10)).unwrap();
    g.bench_function("ring_reserve_write_release_return", |b| {
        b.iter(|| {
            let w = tx.reserve(black_box(4096)).unwrap().expect("a free slot");
            let d = rx.on_write(w.imm).unwrap();
            rx.release(d.slot).unwrap();
            let n = rx.take_returns();
            tx.on_returned(n).unwrap();
            d.len
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
