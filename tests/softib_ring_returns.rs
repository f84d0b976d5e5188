//! Regression: fast-RDMA ring slots must flow back to a sender even when the receiver never
//! sends anything itself. A one-way stream of fast-RDMA messages with more in flight than the
//! ring has slots used to stall for good once the ring filled up: the receiver released the
//! slots and asked for an explicit return, but its pump skipped connections with nothing
//! queued and no credits owed, so the return never left.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ionet::{Config, Endpoint, IbConfig, ServiceLevel};

const T: Duration = Duration::from_secs(20);

#[test]
fn one_way_fast_rdma_stream_longer_than_the_ring_completes() {
    let slots = 4u16;
    let cfg = || Config::default().ib(IbConfig::default().ring_slots(slots));
    let srv = Endpoint::bind("softib://127.0.0.1:0", cfg().progress_thread(true)).unwrap();
    let cli = Endpoint::client(cfg()).unwrap();
    let peer = cli.connect(srv.local_addr().unwrap()).unwrap();
    // 32 KiB: above the inline limit, within the fast-RDMA limit.
    let n = 8 * usize::from(slots);
    let msg = Bytes::from(vec![5u8; 32 * 1024]);
    // First contact so the receiver knows the client's peer id.
    let hello = cli.send_unexpected(peer, 1, Bytes::from_static(b"hi"), ServiceLevel::Normal).unwrap();
    cli.wait_timeout(hello, T).unwrap().expect("hello sent").ok().unwrap();
    let u = srv.recv_unexpected(Some(T)).unwrap().expect("hello arrives");
    let receiver = std::thread::spawn(move || {
        let ops: Vec<_> = (0..n).map(|_| srv.recv(u.peer, 2, BytesMut::zeroed(32 * 1024)).unwrap()).collect();
        for op in ops {
            let c = srv.wait_timeout(op, T).unwrap().unwrap_or_else(|| panic!("receive {op} stalled"));
            assert!(c.ok().unwrap().data().unwrap().iter().all(|&b| b == 5));
        }
        srv
    });
    let sends: Vec<_> =
        (0..n).map(|_| cli.send(peer, 2, msg.clone(), ServiceLevel::Normal).unwrap()).collect();
    for op in sends {
        let c = cli
            .wait_timeout(op, T)
            .unwrap()
            .unwrap_or_else(|| panic!("send {op} stalled: ring slots never came back"));
        assert_eq!(c.mechanism, Some(ionet::Mechanism::FastRdma));
        c.ok().unwrap();
    }
    let srv = receiver.join().unwrap();
    assert!(srv.info().counters.credit_msgs > 0, "the slots came back in explicit messages");
}
