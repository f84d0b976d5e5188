//! Faults at the Endpoint level on `softib://`, injected through the provider's `FaultPlan`
//! (`IbConfig::soft_faults` for every queue pair of an endpoint, `IbConfig::soft_hook` to reach
//! its live queue pairs): each ends in correct results or typed errors, every operation
//! completes exactly once, nothing hangs, and the engine's resources are back afterwards.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ionet::internals::ib::soft::{FaultPlan, SoftHook};
use ionet::*;

mod common;
use common::pattern;

const T: Duration = Duration::from_secs(30);

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
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
    let mut sent = false;
    let sp = loop {
        assert!(Instant::now() < deadline, "introduction");
        sent = sent || cli.test(op).unwrap().is_some();
        if let Some(u) = srv.recv_unexpected(Some(Duration::from_millis(5))).unwrap() {
            break u.peer;
        }
    };
    if !sent {
        wait_ok(&cli, op);
    }
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

fn hooked(cfg: Config, ib: IbConfig) -> (Config, SoftHook) {
    let hook = SoftHook::new();
    (cfg.ib(ib.soft_hook(hook.clone())), hook)
}

fn expect_lost(ep: &Endpoint, op: OpId, peer: PeerId, what: &str) {
    match wait(ep, op).result {
        Err(Error::PeerLost { peer: p, .. }) => assert_eq!(p, peer, "{what}"),
        other => panic!("{what}: expected PeerLost, got {other:?}"),
    }
}

fn nothing_more(ep: &Endpoint, what: &str) {
    assert!(ep.wait_any(Some(Duration::from_millis(100))).unwrap().is_none(), "{what}: a second completion");
}

/// After a fault tore the connection down, the client's next request redials and is served.
fn recovers(srv: &Endpoint, cli: &Endpoint, p: PeerId) {
    let data = pattern(300_000, 77);
    let q = cli
        .request(p, 9, Bytes::from_static(b"again"), Payload::Out(data.clone().into()), ServiceLevel::Normal)
        .unwrap();
    let deadline = Instant::now() + T;
    let req = loop {
        assert!(Instant::now() < deadline, "the client's new request never arrived");
        let _ = cli.test(q);
        if let Some(r) = srv.next_request(Some(Duration::from_millis(5))).unwrap() {
            break r;
        }
    };
    let c = wait_ok(srv, req.pull_into(BytesMut::zeroed(data.len()), 0).unwrap());
    assert!(c.data().unwrap()[..] == data[..]);
    wait_ok(srv, req.reply(Bytes::from_static(b"ok")).unwrap());
    assert_eq!(wait_ok(cli, q).reply.as_deref(), Some(&b"ok"[..]));
}

/// The server's queue pair fails (QP error) or its next RDMA_READ is refused (remote access
/// error) in the middle of pulling a 32 MiB write: the pull fails with a typed error, the
/// server's other op on that client fails PeerLost, the client's request fails PeerLost —
/// each exactly once — everything is released, and the client's next request works.
fn pull_broken_midway(plan: FaultPlan, check_pull: impl Fn(&Error) -> bool) {
    let len = 32 << 20;
    let (srv_cfg, hook) = hooked(Config::default().max_message(len), IbConfig::default());
    let cli_cfg = Config::default().max_message(len).progress_thread(true);
    let (srv, cli, p, sp) = pair(srv_cfg, cli_cfg);
    let q = cli
        .request(p, 1, Bytes::from_static(b"w"), Payload::Out(pattern(len, 3).into()), ServiceLevel::Normal)
        .unwrap();
    let req = srv.next_request(Some(T)).unwrap().expect("request");
    // The first units go out (and on softib are done) now; the rest wait for their completions.
    let x = req.pull_into(BytesMut::zeroed(len), 0).unwrap();
    let rv = srv.recv(sp, 5, BytesMut::zeroed(8)).unwrap();
    assert_eq!(srv.info().rdma.unwrap().transfers, 1, "mid-transfer");
    assert_eq!(hook.set_all(&plan), 1, "one queue pair to break");
    let c = wait(&srv, x);
    assert!(c.result.as_ref().is_err_and(&check_pull), "{plan:?}: pull ended with {:?}", c.result);
    assert!(c.buf.into_recv().is_some(), "the pull's buffer comes back");
    expect_lost(&srv, rv, sp, "the server's receive");
    drop(req);
    nothing_more(&srv, "server");
    expect_lost(&cli, q, p, "the client's request");
    nothing_more(&cli, "client");
    idle(&srv, "server");
    idle(&cli, "client");
    assert!(srv.info().counters.peers_lost >= 1);
    recovers(&srv, &cli, p);
}

#[test]
fn qp_error_mid_transfer() {
    pull_broken_midway(FaultPlan::qp_error_after(0), |e| matches!(e, Error::PeerLost { .. }));
}

#[test]
fn remote_access_error_mid_transfer() {
    pull_broken_midway(FaultPlan::remote_access(1), |e| matches!(e, Error::RemoteAccess(_)));
}

#[test]
fn vanished_peer_mid_transfer() {
    pull_broken_midway(FaultPlan::vanish_after(0), |e| matches!(e, Error::PeerLost { .. }));
}

/// RDMA_READ completions delayed, in order and (beyond the spec) overtaken by later work
/// requests' completions, while the server sends the same client zero-copy fast-RDMA messages
/// on the same queue pair: every pull reads the right bytes, every message arrives.
fn delayed_reads(reorder: bool) {
    let ib = IbConfig::default().soft_faults(FaultPlan::delayed_reads(Duration::from_millis(30), reorder));
    let srv_cfg = Config::default().progress_thread(true).ib(ib);
    let (srv, cli, p, sp) = pair(srv_cfg, Config::default().progress_thread(true));
    for round in 0..3u64 {
        let len = 4 << 20;
        let data = pattern(len, round);
        let msgs: Vec<Vec<u8>> = (0..8).map(|i| pattern(20_000, 100 * round + i)).collect();
        let recvs: Vec<OpId> =
            (0..8).map(|i| cli.recv(p, 100 + i, BytesMut::zeroed(20_000)).unwrap()).collect();
        let q = cli
            .request(p, 1, Bytes::from_static(b"w"), Payload::Out(data.clone().into()), ServiceLevel::Normal)
            .unwrap();
        let req = srv.next_request(Some(T)).unwrap().expect("request");
        // Half into plain memory (zone buffers), half into a pool buffer (direct).
        let half = len / 2;
        let x1 = req.pull_into(BytesMut::zeroed(half), 0).unwrap();
        let x2 = req.pull_into(srv.alloc(len - half).unwrap(), half as u64).unwrap();
        let sends: Vec<OpId> = msgs
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let mut b = srv.alloc(m.len()).unwrap();
                b.copy_from_slice(m);
                srv.send(sp, 100 + i as u64, b, ServiceLevel::Normal).unwrap()
            })
            .collect();
        let mut got = wait_ok(&srv, x1).data().unwrap().to_vec();
        got.extend_from_slice(&wait_ok(&srv, x2).data().unwrap());
        assert!(got == data, "round {round}: pulled bytes (reorder {reorder})");
        for s in sends {
            wait_ok(&srv, s);
        }
        wait_ok(&srv, req.reply(Bytes::from_static(b"ok")).unwrap());
        assert_eq!(wait_ok(&cli, q).reply.as_deref(), Some(&b"ok"[..]));
        for (i, r) in recvs.into_iter().enumerate() {
            assert!(wait_ok(&cli, r).data().unwrap()[..] == msgs[i][..], "round {round}: message {i}");
        }
    }
    nothing_more(&srv, "server");
    nothing_more(&cli, "client");
    idle(&srv, "server");
    idle(&cli, "client");
    assert_eq!(srv.info().counters.peers_lost + cli.info().counters.peers_lost, 0);
}

#[test]
fn delayed_read_completions() {
    delayed_reads(false);
}

#[test]
fn reordered_read_completions() {
    delayed_reads(true);
}

/// Injected RNR (the peer "had no receive posted" for the next 4 deliveries): the provider
/// retries, the data arrives, and the RNR counter the stress test relies on counts them.
#[test]
fn injected_rnr_is_retried_and_counted() {
    let ib = IbConfig::default().soft_faults(FaultPlan::rnr(4));
    let (srv, cli, p, sp) =
        pair(Config::default().progress_thread(true), Config::default().progress_thread(true).ib(ib));
    let recvs: Vec<OpId> = (0..10).map(|i| srv.recv(sp, i, BytesMut::zeroed(30_000)).unwrap()).collect();
    for i in 0..10u64 {
        let len = if i % 2 == 0 { 100 } else { 30_000 };
        wait_ok(&cli, cli.send(p, i, Bytes::from(pattern(len, i)), ServiceLevel::Normal).unwrap());
    }
    for (i, r) in recvs.into_iter().enumerate() {
        let len = if i % 2 == 0 { 100 } else { 30_000 };
        assert!(wait_ok(&srv, r).data().unwrap()[..] == pattern(len, i as u64)[..]);
    }
    let ci = cli.info();
    let rdma = ci.rdma.unwrap();
    assert_eq!(rdma.provider.rnr_retries, Some(4), "every injected RNR was retried once");
    assert_eq!(rdma.port.rnr_nak_retries, Some(4), "a software port carries this context only");
    assert_eq!(srv.info().rdma.unwrap().provider.rnr_retries, Some(0));
    assert_eq!(ci.counters.wc_rnr_retry_exceeded, 0, "retried within the count");
    assert_eq!(ci.counters.wc_errors, 0);
    assert_eq!(ci.counters.peers_lost, 0);
}

/// With `rnr_retry(0)` the first receiver-not-ready fails the send: the connection is lost and
/// the engine counts the status it saw.
#[test]
fn rnr_past_the_retry_count_is_counted_by_the_engine() {
    let (cli_cfg, hook) = hooked(Config::default().progress_thread(true), IbConfig::default().rnr_retry(0));
    let (srv, cli, p, _sp) = pair(Config::default().progress_thread(true), cli_cfg);
    assert_eq!(hook.set_all(&FaultPlan::rnr(1)), 1);
    // A small send completes once copied out; the failure of its work request then loses the
    // peer.
    let _ = cli.send(p, 1, Bytes::from(pattern(100, 1)), ServiceLevel::Normal).unwrap();
    let deadline = std::time::Instant::now() + T;
    while cli.info().counters.peers_lost == 0 {
        assert!(std::time::Instant::now() < deadline, "the connection survived an RNR past its retry count");
        std::thread::sleep(Duration::from_millis(5));
    }
    let c = cli.info().counters;
    assert_eq!(c.wc_rnr_retry_exceeded, 1);
    assert_eq!(c.wc_retry_exceeded, 0);
    assert_eq!(c.wc_errors, 1, "flushes that follow are not errors of their own");
    assert_eq!(srv.info().counters.wc_errors, 0);
}

/// The client's queue pair behaves as if the server vanished while it sends: its send fails
/// PeerLost, its other op on the server too, the server notices the client is gone and fails
/// its receive for it — each exactly once; then the client reconnects.
#[test]
fn vanished_peer_while_sending() {
    let (cli_cfg, hook) = hooked(Config::default().progress_thread(true), IbConfig::default());
    let (srv, cli, p, sp) = pair(Config::default().progress_thread(true), cli_cfg);
    let rs = srv.recv(sp, 1, BytesMut::zeroed(1 << 20)).unwrap();
    let rc = cli.recv(p, 2, BytesMut::zeroed(8)).unwrap();
    assert_eq!(hook.set_all(&FaultPlan::vanish_after(0)), 1);
    let s = cli.send(p, 1, Bytes::from(pattern(1 << 20, 1)), ServiceLevel::Normal).unwrap();
    expect_lost(&cli, s, p, "the client's send");
    expect_lost(&cli, rc, p, "the client's receive");
    expect_lost(&srv, rs, sp, "the server's receive");
    let c = cli.info().counters;
    assert_eq!(c.wc_retry_exceeded, 1, "the fabric stopped acknowledging: one RetryExcErr");
    assert_eq!(c.wc_errors, 1);
    nothing_more(&cli, "client");
    nothing_more(&srv, "server");
    idle(&cli, "client");
    idle(&srv, "server");
    // Operations for a peer the server cannot dial fail at once: it is forgotten.
    expect_lost(&srv, srv.recv(sp, 3, BytesMut::zeroed(8)).unwrap(), sp, "a receive for the lost client");
    wait_ok(&cli, cli.send_unexpected(p, 0, Bytes::from_static(b"back"), ServiceLevel::Normal).unwrap());
    let u = srv.recv_unexpected(Some(T)).unwrap().expect("the client is back");
    // The client keeps its id for the server (it dialled it); the server knows the client
    // that came back under a new one.
    assert_ne!(u.peer, sp, "a forgotten peer's id came back");
    expect_lost(
        &srv,
        srv.recv(sp, 3, BytesMut::zeroed(8)).unwrap(),
        sp,
        "the forgotten id after the reconnection",
    );
    let sp = u.peer;
    let data = pattern(1 << 20, 2);
    let rs = srv.recv(sp, 3, BytesMut::zeroed(1 << 20)).unwrap();
    wait_ok(&cli, cli.send(p, 3, Bytes::from(data.clone()), ServiceLevel::Normal).unwrap());
    assert!(wait_ok(&srv, rs).data().unwrap()[..] == data[..]);
}

/// Regression: a request whose oversized header could not be staged for the server's RDMA
/// (pool exhausted) returned an error from `request` but stayed in the engine; when the peer
/// was later lost the engine completed that unknown op (a debug assertion, or a phantom
/// completion).
#[test]
fn request_whose_header_cannot_be_staged_completes_once() {
    let big_headers = || Config::default().max_header(256 << 10);
    let srv_cfg = big_headers().progress_thread(true);
    // The client's pool cannot hold a 100 KiB staging buffer.
    let (srv, cli, p, _) = pair(srv_cfg, big_headers().pool_limits(64 << 10, 0));
    let q = cli.request(p, 1, vec![1u8; 100 << 10], Payload::None, ServiceLevel::Normal);
    // Refused at once, or completed with the error: either way it must be gone afterwards.
    if let Ok(op) = q {
        assert!(wait(&cli, op).result.is_err(), "the request fails");
    }
    drop(srv);
    // The peer is lost; nothing else completes.
    let op = cli.recv(p, 2, BytesMut::zeroed(8)).unwrap();
    assert!(wait(&cli, op).result.is_err());
    nothing_more(&cli, "client");
}
