//! Dropping `softib://` endpoints unpins everything they pinned: their pools, rings, zone
//! buffers and cached registrations (owned, mapped and opted-in foreign memory). A pin left
//! behind would keep memory locked for the life of the process and make later registrations
//! of the same pages look free.
//!
//! One test per binary on purpose: it reads the process-wide `VmLck`, which concurrent tests
//! would disturb.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ionet::*;

mod common;
use common::vm_held_kib;

const T: Duration = Duration::from_secs(20);
const LEN: usize = 1 << 20;

fn wait_ok(ep: &Endpoint, op: OpId) -> Completion {
    let c = ep.wait_timeout(op, T).unwrap().expect("op completes");
    c.result.as_ref().unwrap();
    c
}

/// One server and one client doing a server-based RDMA write and read from plain memory (and,
/// with `cache`, keeping those registrations cached), a pool-buffer send, then both dropped.
fn session(cache: bool, data: &Bytes, buf: BytesMut) -> BytesMut {
    let srv = Endpoint::bind("softib://127.0.0.1:0", Config::default().progress_thread(true)).unwrap();
    let cfg = Config::default().progress_thread(true).ib(IbConfig::default().cache_foreign(cache));
    let cli = Endpoint::client(cfg).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();

    let w = cli
        .request(p, 1, Bytes::new(), Payload::Out(SendBuf::from(data.clone())), ServiceLevel::Bulk)
        .unwrap();
    let req = srv.next_request(Some(T)).unwrap().expect("write request");
    let c = wait_ok(&srv, req.pull_into(RecvBuf::from(BytesMut::zeroed(LEN)), 0).unwrap());
    assert_eq!(c.mechanism, Some(Mechanism::ServerRdma));
    wait_ok(&srv, req.reply(Bytes::new()).unwrap());
    wait_ok(&cli, w);

    let r = cli.request(p, 2, Bytes::new(), Payload::In(RecvBuf::from(buf)), ServiceLevel::Bulk).unwrap();
    let req = srv.next_request(Some(T)).unwrap().expect("read request");
    let mut pooled = srv.alloc(LEN).unwrap();
    pooled.set_len(LEN).unwrap();
    wait_ok(&srv, req.push_from(SendBuf::Registered(pooled), 0).unwrap());
    wait_ok(&srv, req.reply(Bytes::new()).unwrap());
    let c = wait_ok(&cli, r);
    let back = match c.buf {
        OpBuf::Recv(RecvBuf::Mut(b)) => b,
        other => panic!("read buffer came back as {other:?}"),
    };
    if cache {
        // The application's side of leave_pinned: nothing cached may outlive the memory.
        cli.invalidate_registrations(data);
        cli.invalidate_registrations(&back);
    }
    drop((cli, srv));
    back
}

#[test]
fn dropped_endpoints_leave_nothing_pinned() {
    let data = Bytes::from(vec![3u8; LEN]);
    let mut buf = BytesMut::zeroed(LEN);
    let base = vm_held_kib();
    for round in 0..3 {
        for cache in [false, true] {
            buf = session(cache, &data, buf);
            // Teardown is synchronous for the endpoint; give any provider thread a moment.
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while vm_held_kib() > base && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            assert_eq!(vm_held_kib(), base, "round {round}, cache_foreign {cache}: pins left behind");
        }
    }
}
