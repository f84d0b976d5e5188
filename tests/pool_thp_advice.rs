//! Pool chunks ask for transparent huge pages; when a chunk's memory goes back to the heap,
//! that advice must go with it, or the application's later allocations there get huge pages
//! (and near-free pins) it never asked for.
//!
//! One test per binary on purpose: it changes the process's malloc settings and reads its
//! memory map.

mod common;

use ionet::*;

#[test]
fn freed_pool_chunks_take_their_huge_page_advice_with_them() {
    if !common::thp_in_madvise_mode() {
        return;
    }
    common::heap_serves_large_blocks();
    let ep = Endpoint::bind("tcp://127.0.0.1:0", Config::default()).unwrap();
    let buf = ep.alloc(1 << 20).unwrap();
    let addr = buf.as_ptr() as usize;
    let live = common::smaps_of(addr).expect("a live pool buffer is mapped").1;
    assert!(live.split_whitespace().any(|f| f == "hg"), "a live chunk is advised: {live}");
    drop(buf);
    drop(ep);
    if let Some((_, after)) = common::smaps_of(addr) {
        assert!(!after.split_whitespace().any(|f| f == "hg"), "advice left on freed heap memory: {after}");
    }
}
