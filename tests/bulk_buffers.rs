//! `ionet::buf::bulk_zeroed`: application buffers for bulk transfers, aligned so the kernel's
//! copies run at full speed and, from 2 MiB, faulted in as transparent huge pages without
//! leaving the huge-page advice behind on the heap.

mod common;

use ionet::buf::bulk_zeroed;

/// A `/proc/vmstat` counter: huge-page faults or collapses that found no free huge page.
fn vmstat(name: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn bulk_buffers_are_zeroed_exact_and_aligned_by_size() {
    for (len, align) in
        [(1, 64), (100, 64), (4096, 4096), (65_537, 4096), (2 << 20, 2 << 20), ((8 << 20) + 3, 2 << 20)]
    {
        for _ in 0..3 {
            let b = bulk_zeroed(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % align, 0, "{len}-byte buffer at {:p}", b.as_ptr());
            assert!(b.iter().all(|&x| x == 0), "{len}-byte buffer is not zeroed");
        }
    }
}

#[test]
fn large_bulk_buffers_get_huge_pages_even_in_reused_memory_and_keep_no_advice() {
    if !common::thp_in_madvise_mode() {
        return;
    }
    // Leave 4 KiB pages in the heap where the buffer will most likely be carved.
    common::heap_serves_large_blocks();
    let mut old = vec![1u8; 8 << 20];
    std::hint::black_box(&mut old);
    let old_range = old.as_ptr() as usize..old.as_ptr() as usize + old.len();
    drop(old);
    let (fallbacks, failed) = (vmstat("thp_fault_fallback"), vmstat("thp_collapse_alloc_failed"));
    let b = bulk_zeroed(4 << 20);
    let addr = b.as_ptr() as usize;
    println!("buffer reuses the freed 4 KiB pages: {}", old_range.contains(&addr));
    let (huge_kib, flags) = common::smaps_of(addr).expect("the buffer is mapped");
    // The advice is gone once the pages are in: heap memory keeps it after `free`.
    assert!(!flags.split_whitespace().any(|f| f == "hg"), "advice left on the buffer's memory: {flags}");
    if (vmstat("thp_fault_fallback"), vmstat("thp_collapse_alloc_failed")) != (fallbacks, failed) {
        println!("huge pages not checked: the kernel had none free");
        return;
    }
    assert!(huge_kib >= 4096, "a 4 MiB bulk buffer has {huge_kib} KiB of huge pages");
}
