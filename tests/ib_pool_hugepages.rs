//! Pool buffers of 64 KiB and more come from 2 MiB huge-page chunks that the InfiniBand
//! engine pins whole: registering one buffer must not pin (`mlock`) its sub-range on its own,
//! which would split the chunk's mapping — and its huge page — at the buffer's edges.

use std::time::Duration;

use ionet::*;

const CHUNK: usize = 2 << 20;

/// The `[start, end)` of the mapping in `/proc/self/maps` that contains `addr`.
fn mapping_of(addr: usize) -> (usize, usize) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .find_map(|l| {
            let range = l.split_whitespace().next()?;
            let (a, b) = range.split_once('-')?;
            let (a, b) = (usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?);
            (a <= addr && addr < b).then_some((a, b))
        })
        .expect("the buffer is mapped")
}

/// `AnonHugePages` of the mapping starting at `start`, in KiB (for the log only: whether the
/// kernel found a free huge page is not ours to assert).
fn huge_kib(start: usize) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let head = format!("{start:x}-");
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
    lines.next()?;
    lines
        .take_while(|l| !l.contains('-') || l.contains(':'))
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[test]
fn registered_pool_buffers_keep_their_chunk_mapping_whole() {
    let ep = Endpoint::bind("softib://127.0.0.1:0", Config::default()).unwrap();
    // One buffer registered, the other half of its chunk not yet handed out: a lone pin of
    // the buffer's range would show as a split of the mapping there. (Once both halves are
    // pinned the kernel merges the two mappings again, but the huge page stays split.)
    let first = ep.alloc(1 << 20).unwrap();
    assert!(first.is_registered());
    let pool = ep.info().pool;
    assert_eq!(pool.chunks, 1, "{pool:?}");
    let chunk = first.addr() - first.addr() % CHUNK;
    let (start, end) = mapping_of(first.addr());
    assert!(
        start <= chunk && end >= chunk + CHUNK,
        "buffer {:#x}: mapping {start:#x}-{end:#x} split inside chunk {chunk:#x}",
        first.addr()
    );
    let second = ep.alloc(1 << 20).unwrap();
    assert_eq!(ep.info().pool.chunks, 1, "two 1 MiB buffers share one chunk");
    assert_eq!(second.addr() - second.addr() % CHUNK, chunk);
    let bufs = [first, second];
    eprintln!("chunk {chunk:#x}: AnonHugePages {:?} KiB", huge_kib(mapping_of(chunk).0));

    // Data still moves through them (server-based RDMA reads straight from the sender's buffer).
    let srv = Endpoint::bind("softib://127.0.0.1:0", Config::default().progress_thread(true)).unwrap();
    let p = ep.connect(srv.local_addr().unwrap()).unwrap();
    let mut out = bufs.into_iter().next().unwrap();
    for (i, x) in out.iter_mut().enumerate() {
        *x = (i % 251) as u8;
    }
    let t = Duration::from_secs(20);
    let hello = ep.send_unexpected(p, 0, bytes::Bytes::from_static(b"hi"), ServiceLevel::Normal).unwrap();
    ep.wait_timeout(hello, t).unwrap().expect("hello sent").result.unwrap();
    let sp = srv.recv_unexpected(Some(t)).unwrap().expect("hello").peer;
    let r = srv.recv(sp, 1, srv.alloc(1 << 20).unwrap()).unwrap();
    let s = ep.send(p, 1, out, ServiceLevel::Normal).unwrap();
    let sc = ep.wait_timeout(s, t).unwrap().expect("send completes");
    assert_eq!(sc.mechanism, Some(Mechanism::ServerRdma));
    sc.result.unwrap();
    let rc = srv.wait_timeout(r, t).unwrap().expect("receive completes");
    let got = rc.data().unwrap();
    assert!(got.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8));
}
