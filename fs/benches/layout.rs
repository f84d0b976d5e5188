//! Layout mapping: offset → (server, local offset), the plan of a contiguous 1 MiB access over
//! 4 servers, and the plan of E4's list access (768 tile rows).
//!
//! Run: `cargo bench -p stripefs --bench layout`

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use stripefs::layout::{Extent, Layout, ListIo};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("layout");
    let l = Layout::new(0, 4, 64 << 10).unwrap();
    g.throughput(Throughput::Elements(1));
    let mut off = 0u64;
    g.bench_function("locate_offset", |b| {
        b.iter(|| {
            off = off.wrapping_add(0x9e37_79b9) & ((1 << 40) - 1);
            l.locate(black_box(off), 4)
        })
    });
    g.bench_function("plan_contiguous_1MiB_4_servers", |b| {
        b.iter(|| l.plan([Extent::new(black_box(3 << 20), 1 << 20)]))
    });
    // E4: a 1024×768 tile of 24 B elements in a 2048×1536 array: 768 rows of 24 KiB, 48 KiB apart.
    let rows: Vec<Extent> = (0..768u64).map(|i| Extent::new(i * 48 * 1024, 24 * 1024)).collect();
    let list = ListIo::new(vec![Extent::new(0, 768 * 24 * 1024)], rows).unwrap();
    g.throughput(Throughput::Elements(768));
    g.bench_function("plan_list_768_tile_rows", |b| b.iter(|| black_box(&list).plan(&l)));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
