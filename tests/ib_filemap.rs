//! Server-based RDMA straight into and out of a `FileMap`: mapped memory is crate-owned, so the
//! engine registers a stretch of it through the pin-down cache the second time the stretch moves
//! (the first time it is staged: pinning costs more than one copy) and keeps it cached across
//! requests (no zone buffer, no host copy); dropping the map drops those registrations before
//! the unmap.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ionet::*;

const T: Duration = Duration::from_secs(20);
const LEN: usize = 2 << 20;

fn pair() -> (Endpoint, Endpoint, PeerId) {
    let srv = Endpoint::bind("softib://127.0.0.1:0", Config::default().progress_thread(true)).unwrap();
    let cli = Endpoint::client(Config::default().progress_thread(true)).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    (srv, cli, p)
}

/// A mapped, fully allocated, unlinked scratch file.
fn map(len: usize) -> (std::fs::File, Arc<FileMap>) {
    use std::io::Write;
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir =
        if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
    let path = dir.join(format!("ionet-ib-filemap-{}-{n}", std::process::id()));
    let mut f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    f.write_all(&vec![0u8; len]).unwrap();
    // SAFETY: the file is private to this test (unlinked), never shrunk, fully written (so
    // allocated) before any region exists, and written only through the map while mapped.
    let m = unsafe { FileMap::new(&f, len as u64) }.unwrap();
    (f, m)
}

fn snapshot(ep: &Endpoint) -> (CounterSnapshot, RegcacheInfo) {
    let i = ep.info();
    (i.counters, i.regcache.expect("IB endpoints report their cache"))
}

fn wait_ok(ep: &Endpoint, op: OpId) -> Completion {
    let c = ep.wait_timeout(op, T).unwrap().expect("op completes");
    c.result.as_ref().unwrap();
    c
}

/// The client writes `data` (server pulls it into `regions`), then reads it back (server pushes
/// from a readable region of the same bytes); returns what the client read.
fn round_trip(srv: &Endpoint, cli: &Endpoint, p: PeerId, m: &Arc<FileMap>, data: &Bytes) -> BytesMut {
    let w = cli
        .request(p, 1, Bytes::new(), Payload::Out(SendBuf::from(data.clone())), ServiceLevel::Bulk)
        .unwrap();
    let req = srv.next_request(Some(T)).unwrap().expect("write request");
    // Four pieces, like an io server's list for one unit.
    let q = LEN / 4;
    let regions = m.regions_mut((0..4).map(|i| ((i * q) as u64, q))).unwrap();
    let c = wait_ok(srv, req.pull_into(RecvBuf::Mapped(regions), 0).unwrap());
    assert_eq!(c.mechanism, Some(Mechanism::ServerRdma));
    drop(c); // ends the lease
    wait_ok(srv, req.reply(Bytes::new()).unwrap());
    wait_ok(cli, w);

    let r = cli
        .request(p, 2, Bytes::new(), Payload::In(RecvBuf::from(BytesMut::zeroed(LEN))), ServiceLevel::Bulk)
        .unwrap();
    let req = srv.next_request(Some(T)).unwrap().expect("read request");
    let src = m.region(0, LEN).unwrap().into_bytes();
    wait_ok(srv, req.push_from(SendBuf::from(src), 0).unwrap());
    wait_ok(srv, req.reply(Bytes::new()).unwrap());
    let c = wait_ok(cli, r);
    match c.buf {
        OpBuf::Recv(RecvBuf::Mut(b)) => b,
        other => panic!("read buffer came back as {other:?}"),
    }
}

#[test]
fn mapped_regions_move_without_host_copies_from_their_second_use() {
    let (srv, cli, p) = pair();
    let (_f, m) = map(LEN);
    let pattern = |k: usize| Bytes::from((0..LEN).map(|i| (i * k % 251) as u8).collect::<Vec<u8>>());

    // The write is the stretch's first use: staged through zone buffers (exactly once), not
    // registered. The read back is its second: registered, then moved with no host copy.
    let (c0, r0) = snapshot(&srv);
    let data = pattern(13);
    assert!(round_trip(&srv, &cli, p, &m, &data)[..] == data[..], "read back what was written");
    let (c1, r1) = snapshot(&srv);
    assert_eq!(c1.host_copy_bytes - c0.host_copy_bytes, LEN as u64, "only the first use is staged");
    assert_eq!(r1.misses - r0.misses, 1, "the second use registers the stretch once");

    // From then on: no copy, no registration.
    let data = pattern(7);
    assert!(round_trip(&srv, &cli, p, &m, &data)[..] == data[..]);
    let (c2, r2) = snapshot(&srv);
    assert_eq!(c2.host_copies, c1.host_copies, "no zone-buffer copy on the server");
    assert_eq!(r2.misses, r1.misses);

    // Third use: every lookup hits, nothing is registered or copied.
    let data = pattern(3);
    assert!(round_trip(&srv, &cli, p, &m, &data)[..] == data[..]);
    let (c3, r3) = snapshot(&srv);
    assert_eq!(c3.host_copies, c2.host_copies);
    assert_eq!(r3.misses, r2.misses, "cached across requests");
    assert!(r3.hits > r2.hits);
    assert_eq!(r3.in_use, r2.in_use, "no reference outlives its op");

    // Dropping the map (no region is alive) drops its registrations before the unmap.
    let entries = r3.entries;
    drop(m);
    let r4 = snapshot(&srv).1;
    assert!(r4.entries < entries, "entries {entries} -> {}", r4.entries);
    assert!(r4.pinned_bytes + LEN as u64 <= r3.pinned_bytes, "the mapping is no longer pinned");

    // A new map (possibly at the same address) is registered afresh and still correct.
    let (_f2, m2) = map(LEN);
    for k in [5, 11] {
        let data = pattern(k);
        assert!(round_trip(&srv, &cli, p, &m2, &data)[..] == data[..]);
    }
    assert!(snapshot(&srv).1.misses > r4.misses, "registered again");
}

#[test]
fn plain_memory_is_still_staged_through_zone_buffers() {
    // The control: the same pull into ordinary memory copies out of a zone buffer, so the test
    // above would fail if mapped memory were treated like it.
    let (srv, cli, p) = pair();
    let data = Bytes::from(vec![5u8; LEN]);
    let w = cli
        .request(p, 1, Bytes::new(), Payload::Out(SendBuf::from(data.clone())), ServiceLevel::Bulk)
        .unwrap();
    let req = srv.next_request(Some(T)).unwrap().expect("write request");
    let c0 = snapshot(&srv).0;
    let c = wait_ok(&srv, req.pull_into(RecvBuf::from(BytesMut::zeroed(LEN)), 0).unwrap());
    assert_eq!(c.mechanism, Some(Mechanism::ServerRdma));
    assert!(snapshot(&srv).0.host_copies > c0.host_copies, "staged through a zone buffer");
    wait_ok(&srv, req.reply(Bytes::new()).unwrap());
    wait_ok(&cli, w);
}
