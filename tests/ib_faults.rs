//! Faults at the Endpoint level on `softib://`, injected through the provider's `FaultPlan`
//! (`IbConfig::soft_faults` for every queue pair of an endpoint, `IbConfig::soft_hook` to reach
//! its live queue pairs): each ends in correct results or typed errors, every operation
//! completes exactly once, nothing hangs, and the engine's resources are back afterwards.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ionet::*;

const T: Duration = Duration::from_secs(30);

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

fn wait(ep: &Endpoint, op: OpId) -> Completion {
    ep.wait_timeout(op, T).unwrap().unwrap_or_else(|| panic!("{op} did not complete in {T:?}"))
}

fn wait_ok(ep: &Endpoint, op: OpId) -> Completion {
    let c = wait(ep, op);
    if let Err(e) = &c.result {
        panic!("{op} failed: {e}");
    }
    c
}

/// The engine holds nothing for transfers any more.
fn idle(ep: &Endpoint, what: &str) {
    let i = ep.info();
    let r = i.rdma.expect("IB engine");
    assert_eq!(i.pending_ops, 0, "{what}: pending ops");
    assert_eq!(r.transfers, 0, "{what}: transfers");
    assert_eq!(r.rdma_bytes_in_flight, 0, "{what}: RDMA bytes in flight");
    assert_eq!(r.zone_bytes_held, 0, "{what}: zone buffers");
    assert_eq!(r.zone_waiting, 0, "{what}: zone waiters");
    assert_eq!(r.fin_waits, 0, "{what}: FIN waits");
    assert_eq!(r.queued_msgs, 0, "{what}: queued messages");
}

/// A server endpoint (driven by the test thread unless `progress`) and a client connected to
/// it, introduced; returns (server, client, client's view of the server, server's view of the
/// client).
fn pair(srv_cfg: Config, cli_cfg: Config) -> (Endpoint, Endpoint, PeerId, PeerId) {
    init_tracing();
    let srv = Endpoint::bind("softib://127.0.0.1:0", srv_cfg).unwrap();
    let cli = Endpoint::client(cli_cfg).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    let op = cli.send_unexpected(p, 0, Bytes::from_static(b"hi"), ServiceLevel::Normal).unwrap();
    // The server has no progress thread in some tests: drive both.
    let deadline = Instant::now() + T;
    let sp = loop {
        assert!(Instant::now() < deadline, "introduction");
        let _ = cli.test(op).unwrap();
        if let Some(u) = srv.recv_unexpected(Some(Duration::from_millis(5))).unwrap() {
            break u.peer;
        }
    };
    (srv, cli, p, sp)
}

/// Regression: a transfer cancelled while some of its units waited for a zone buffer left
/// those units' bytes counted as "in flight" by the bulk scheduler when the buffer was granted
/// after the transfer had ended, eating the per-peer and per-endpoint RDMA caps for good.
#[test]
fn cancelled_transfer_gives_back_its_waiting_units() {
    // One zone buffer per size class, so most units of an 8 MiB receive wait for one.
    let srv_cfg = Config::default().ib(IbConfig::default().zone_bytes_per_class(64 << 10));
    let (srv, cli, p, sp) = pair(srv_cfg, Config::default().progress_thread(true));
    let len = 8 << 20;
    let s = cli.send(p, 1, Bytes::from(pattern(len, 1)), ServiceLevel::Normal).unwrap();
    // The announcement arrives while the server waits; then the receive matches it and its
    // first units go out (the server is driven by this thread alone).
    let _ = srv.wait_any(Some(Duration::from_millis(100))).unwrap();
    let r = srv.recv(sp, 1, BytesMut::zeroed(len)).unwrap();
    let mid = srv.info().rdma.unwrap();
    assert_eq!(mid.transfers, 1);
    assert!(mid.zone_waiting > 0, "units wait for zone buffers: {mid:?}");
    srv.cancel(r).unwrap();
    let c = wait(&srv, r);
    assert!(matches!(c.result, Err(Error::Cancelled)), "{:?}", c.result);
    // The sender learns the receiver gave up.
    let c = wait(&cli, s);
    assert!(matches!(c.result, Err(Error::PeerCancelled)), "{:?}", c.result);
    // Let late grants drain.
    assert!(srv.wait_any(Some(Duration::from_millis(100))).unwrap().is_none(), "one completion each");
    idle(&srv, "after the cancel");
    // And the next transfer moves whole.
    let data = pattern(len, 2);
    let r = srv.recv(sp, 2, BytesMut::zeroed(len)).unwrap();
    let s = cli.send(p, 2, Bytes::from(data.clone()), ServiceLevel::Normal).unwrap();
    let c = wait_ok(&srv, r);
    assert!(c.data().unwrap()[..] == data[..]);
    wait_ok(&cli, s);
    idle(&srv, "after the next transfer");
}
