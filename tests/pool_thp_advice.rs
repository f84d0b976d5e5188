//! Pool chunks ask for transparent huge pages; when a chunk's memory goes back to the heap,
//! that advice must go with it, or the application's later allocations there get huge pages
//! (and near-free pins) it never asked for.
//!
//! One test per binary on purpose: it changes the process's malloc settings and reads its
//! memory map.

use ionet::*;

/// `VmFlags` of the mapping that contains `addr`, if one does.
fn vm_flags(addr: usize) -> Option<String> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((a, b)) = range.split_once('-')
            && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
        {
            inside = a <= addr && addr < b;
            continue;
        }
        if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
            return Some(flags.trim().to_string());
        }
    }
    None
}

#[test]
fn freed_pool_chunks_take_their_huge_page_advice_with_them() {
    let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if !mode.contains("[madvise]") {
        println!("skipped: transparent huge pages are not in madvise mode here ({})", mode.trim());
        return;
    }
    // Serve large blocks from the heap and keep freed memory mapped, as a long-running
    // process's malloc ends up doing once its mmap threshold has grown.
    // SAFETY: mallopt only changes allocator tuning; no allocation is in flight on this thread,
    // and other threads' allocations stay valid under either setting.
    unsafe {
        assert_eq!(libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20), 1);
        assert_eq!(libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20), 1);
    }
    let ep = Endpoint::bind("tcp://127.0.0.1:0", Config::default()).unwrap();
    let buf = ep.alloc(1 << 20).unwrap();
    let addr = buf.as_ptr() as usize;
    let live = vm_flags(addr).expect("a live pool buffer is mapped");
    assert!(live.split_whitespace().any(|f| f == "hg"), "a live chunk is advised: {live}");
    drop(buf);
    drop(ep);
    if let Some(after) = vm_flags(addr) {
        assert!(!after.split_whitespace().any(|f| f == "hg"), "advice left on freed heap memory: {after}");
    }
}
