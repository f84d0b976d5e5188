//! A peer killed with SIGKILL in the middle of a large server-based RDMA transfer — a write
//! (the server pulls) and, separately, a read (the server pushes) — over `softib://` across
//! processes and over `tcp://`:
//!
//! - the survivor fails every operation it had on that peer exactly once with `PeerLost`
//!   (transfers, a posted receive, a rendezvous send), hangs on nothing, and keeps serving its
//!   other peers;
//! - everything the dead peer held is back, asserted through `Endpoint::info()`: queue pairs
//!   (with their credits and ring slots), transfers and their RDMA bytes in flight, zone
//!   buffers, FIN waits (rendezvous sends, rendezvous-sent reply headers), open requests,
//!   queued messages, pool buffers, and registration-cache references.
//!
//! Both directions of survival are covered: the server survives a client (`server_survives_*`,
//! the victim client lives in the agent process), and a client survives a server
//! (`client_survives_*`, the victim server lives in the agent). Whichever side moves the data
//! runs without a progress thread, so the transfer is deterministically unfinished when the
//! kill lands: on softib the first transfer units are posted and executed when the pull or
//! push is posted and the rest wait for completions nobody polls yet; on tcp the 32 MiB halves
//! do not fit the socket buffers of a peer that is not reading.

mod conformance;

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use conformance::*;
use ionet::{Direction, Info, ServiceLevel};

agent_entry!();

/// Halves of 32 MiB: more than loopback TCP buffers hold, so a tcp push or pull cannot finish
/// while its peer does not read or send.
const BIG: usize = 64 << 20;
const HALF: usize = BIG / 2;
/// A reply header larger than a ring slot: the server registers it and waits for the
/// client's FIN after the client fetched it by RDMA.
const LARGE_HEADER: usize = 100 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// The client writes: the server pulls its data (RDMA_READ).
    Write,
    /// The client reads: the server pushes into its buffer (RDMA_WRITE).
    Read,
}

fn cfg() -> Config {
    Config::default().max_message(BIG).max_header(256 << 10)
}

fn expect_lost(ep: &Ep, op: OpId, peer: PeerId, what: &str) {
    let c = wait(ep, op);
    match &c.result {
        Err(Error::PeerLost { peer: p, .. }) => assert_eq!(*p, peer, "{what}: the dead peer"),
        other => panic!("{what}: expected PeerLost, got {other:?}"),
    }
}

/// No completion left: every op completed once and was reaped.
fn nothing_more(ep: &Ep, what: &str) {
    assert!(ep.wait_any(Some(Duration::from_millis(200))).unwrap().is_none(), "{what}: a second completion");
}

/// Serves one request of a healthy peer completely: pulls or pushes its payload, replies.
fn serve_one(srv: &Ep, data: &[u8]) {
    let req = srv.next_request(Some(T)).unwrap().expect("the healthy peer's request");
    let len = req.payload_len() as usize;
    match req.direction() {
        Direction::Out => {
            let c = wait_ok(srv, req.pull_into(BytesMut::zeroed(len), 0).unwrap());
            assert!(c.data().unwrap()[..] == data[..len], "healthy peer's data");
        }
        Direction::In => {
            wait_ok(srv, req.push_from(Bytes::copy_from_slice(&data[..len]), 0).unwrap());
        }
        Direction::None => {}
    }
    wait_ok(srv, req.reply(Bytes::from_static(b"ok")).unwrap());
}

/// What must be back once a dead peer's operations have failed, compared with `base` taken
/// before the peer appeared (IB engine state; TCP has none of it).
fn released(now: &Info, base: &Info, what: &str) {
    assert_eq!(now.pending_ops, 0, "{what}: operations left pending");
    let (Some(r), Some(b)) = (now.rdma, base.rdma) else { return };
    assert_eq!(r.queue_pairs, b.queue_pairs, "{what}: the dead peer's queue pairs (credits, ring slots)");
    assert_eq!(r.transfers, 0, "{what}: transfers");
    assert_eq!(r.rdma_bytes_in_flight, 0, "{what}: RDMA bytes in flight (bulk scheduler)");
    assert_eq!(r.zone_bytes_held, 0, "{what}: zone buffers");
    assert_eq!(r.zone_waiting, 0, "{what}: zone waiters");
    assert_eq!(r.fin_waits, 0, "{what}: FIN waits (rendezvous sends, reply headers)");
    assert_eq!(r.open_requests, 0, "{what}: open requests");
    assert_eq!(r.queued_msgs, 0, "{what}: queued messages");
    assert_eq!(now.pool.in_use_bytes, 0, "{what}: pool buffers still held");
    let (rc, bc) = (now.regcache.unwrap(), base.regcache.unwrap());
    // Each pool buffer (cached for reuse) keeps one registration; nothing else may.
    assert_eq!(
        rc.in_use - bc.in_use,
        now.pool.created - base.pool.created,
        "{what}: registration-cache references beyond the pool's own"
    );
}

/// Drives `victim` (in the agent) and the server until the server holds `n` requests.
fn requests(srv: &Ep, victim: &Ep, n: usize) -> Vec<Request> {
    let mut v = Vec::new();
    let deadline = Instant::now() + T;
    while v.len() < n {
        assert!(Instant::now() < deadline, "requests did not arrive");
        // The victim has no progress thread on softib: let it set up and send.
        let _ = victim.wait_any(Some(Duration::from_millis(2)));
        if let Some(r) = srv.next_request(Some(Duration::from_millis(5))).unwrap() {
            v.push(r);
        }
    }
    v.sort_by_key(|r| r.tag());
    v
}

fn server_survives(net: &Net, dir: Dir) {
    let ib = net.is_ib();
    // The survivor: here, driven only by this thread.
    let srv = net.bind(cfg());
    let addr = srv.local_addr().unwrap();
    // Checked bytes for the healthy peer; the dead peer's payload is never checked.
    let data = pattern(8 << 20, 7);
    let bulk = vec![0x5a; BIG];
    // A healthy client (here, with a progress thread); one request served first.
    let good = net.local_client(cfg().progress_thread(true));
    let gp = good.connect(&addr).unwrap();
    let gq = good
        .request(
            gp,
            1,
            Bytes::from_static(b"W"),
            Payload::Out(Bytes::from(data[..1 << 20].to_vec()).into()),
            ServiceLevel::Bulk,
        )
        .unwrap();
    serve_one(&srv, &data);
    wait_ok(&good, gq);
    let base = srv.info();

    // The victim: a client in the agent, without a progress thread: it moves only while the
    // test drives it, so what it has not done yet (read pushed data on tcp, fetch a reply
    // header on softib) stays undone when it dies. One-sided RDMA needs no CPU on its side.
    let victim = net.client(cfg());
    let vp = victim.connect(&addr).unwrap();
    let payload = match dir {
        Dir::Write => Payload::Out(Bytes::from(bulk.clone()).into()),
        Dir::Read => Payload::In(BytesMut::zeroed(BIG).into()),
    };
    let _vq = victim.request(vp, 1, Bytes::from_static(b"big"), payload, ServiceLevel::Bulk).unwrap();
    let _vh =
        victim.request(vp, 2, Bytes::from_static(b"hdr"), Payload::None, ServiceLevel::Control).unwrap();
    let mut reqs = requests(&srv, &victim, 2).into_iter();
    let (big, hdr) = (reqs.next().unwrap(), reqs.next().unwrap());
    let dead = big.peer();

    // Everything a server can have going with a client, at once:
    // the transfer, half into or out of plain memory (zone buffers), half a pool buffer (direct);
    let (x1, x2) = match dir {
        Dir::Write => (
            big.pull_into(BytesMut::zeroed(HALF), 0).unwrap(),
            big.pull_into(RBuf::pool(HALF), HALF as u64).unwrap(),
        ),
        Dir::Read => (
            big.push_from(Bytes::copy_from_slice(&bulk[..HALF]), 0).unwrap(),
            big.push_from(SBuf::pool(bulk[HALF..].to_vec()), HALF as u64).unwrap(),
        ),
    };
    // a reply whose header the client must fetch (then FIN);
    let r = hdr.reply(vec![5u8; LARGE_HEADER]).unwrap();
    wait_ok(&srv, r);
    // a receive posted for the victim and a rendezvous send it will never take.
    let rv = srv.recv(dead, 9, BytesMut::zeroed(64)).unwrap();
    let sd = srv.send(dead, 10, Bytes::from(data[..4 << 20].to_vec()), ServiceLevel::Normal).unwrap();
    if !ib && dir == Dir::Write {
        // On tcp the client sends the pulled data: let it fill the socket buffers (the server
        // reads nothing until the test drives it).
        for _ in 0..5 {
            let _ = victim.wait_any(Some(Duration::from_millis(10)));
        }
    }
    // The healthy client's next request waits meanwhile.
    let gq = good
        .request(
            gp,
            1,
            Bytes::from_static(b"W"),
            Payload::Out(Bytes::from(data[..(8 << 20)].to_vec()).into()),
            ServiceLevel::Bulk,
        )
        .unwrap();

    let mid = srv.info();
    if let Some(m) = mid.rdma {
        assert_eq!(m.transfers, 2, "both halves are moving");
        assert!(m.rdma_bytes_in_flight > 0, "RDMA in flight when the peer dies");
        assert!(m.zone_bytes_held > 0, "zone buffers in use when the peer dies");
        assert!(m.fin_waits >= 2, "the rendezvous send and the reply header wait for FINs");
        assert!(m.queue_pairs > base.rdma.unwrap().queue_pairs);
    }
    net.agent().kill();

    let what = format!("server survives a client killed mid-{dir:?}");
    for (op, name) in [(x1, "transfer (zone)"), (x2, "transfer (pool)"), (rv, "receive"), (sd, "send")] {
        expect_lost(&srv, op, dead, &format!("{what}: {name}"));
    }
    drop(big);
    nothing_more(&srv, &what);
    // The other client is served, whole.
    serve_one(&srv, &data);
    let c = wait_ok(&good, gq);
    assert_eq!(c.reply.as_deref(), Some(&b"ok"[..]));
    let now = srv.info();
    assert!(now.counters.peers_lost >= 1);
    released(&now, &base, &what);
    // Later operations on the dead peer fail at once.
    expect_lost(&srv, srv.recv(dead, 11, BytesMut::zeroed(8)).unwrap(), dead, &what);
}

fn client_survives(net: &Net, dir: Dir) {
    let data = pattern(8 << 20, 9);
    let bulk = vec![0x5a; BIG];
    // The survivor: a client here, with a progress thread (so it answers the victim server's
    // handshake and, on tcp, feeds its pulls). Its lent buffers are deregistered after their
    // operations, so every registration the dead server's transfers made must be gone below;
    // kept registrations would outlive them by design.
    let cli = net.client(cfg().progress_thread(true).cache_foreign(false));
    assert!(!cli.is_remote());
    // A healthy server here, serving from a thread.
    let healthy = net.local_bind(cfg().progress_thread(true));
    let hp = cli.connect(healthy.local_addr().unwrap()).unwrap();
    let h2 = healthy.clone();
    let d2 = data.clone();
    let healthy_thread = std::thread::spawn(move || {
        for _ in 0..2 {
            serve_one(&h2, &d2);
        }
    });
    let q = cli
        .request(hp, 1, Bytes::new(), Payload::In(BytesMut::zeroed(1 << 20).into()), ServiceLevel::Bulk)
        .unwrap();
    wait_ok(&cli, q);
    let base = cli.info();

    // The victim: a server in the agent, without a progress thread (it moves only while the
    // test asks it something).
    let victim = net.bind(cfg());
    assert!(victim.is_remote());
    let vp = cli.connect(victim.local_addr().unwrap()).unwrap();
    let payload = match dir {
        Dir::Write => Payload::Out(Bytes::from(bulk.clone()).into()),
        Dir::Read => Payload::In(BytesMut::zeroed(BIG).into()),
    };
    let q = cli.request(vp, 1, Bytes::from_static(b"big"), payload, ServiceLevel::Bulk).unwrap();
    let rv = cli.recv(vp, 9, BytesMut::zeroed(64)).unwrap();
    let sd = cli.send(vp, 10, Bytes::from(data[..4 << 20].to_vec()), ServiceLevel::Normal).unwrap();
    let req = victim.next_request(Some(T)).unwrap().expect("the victim got the request");
    match dir {
        Dir::Write => {
            req.pull_into(BytesMut::zeroed(HALF), 0).unwrap();
            req.pull_into(RBuf::pool(HALF), HALF as u64).unwrap();
        }
        Dir::Read => {
            req.push_from(Bytes::copy_from_slice(&bulk[..HALF]), 0).unwrap();
            req.push_from(SBuf::pool(bulk[HALF..].to_vec()), HALF as u64).unwrap();
        }
    }
    // The send rides its own (Normal) queue pair and waits for the victim's limits; the victim
    // answers that handshake only while asked something: ask until the send is placed.
    let placed = Instant::now() + T;
    while cli.info().rdma.is_some_and(|m| m.fin_waits == 0) && Instant::now() < placed {
        let _ = victim.wait_any(Some(Duration::from_millis(5)));
    }
    let mid = cli.info();
    if let (Some(m), Some(rc)) = (mid.rdma, mid.regcache) {
        assert!(
            rc.in_use > base.regcache.unwrap().in_use,
            "the client's buffers are registered for the server"
        );
        assert!(m.fin_waits >= 1, "the rendezvous send waits for its FIN");
    }
    net.agent().kill();

    let what = format!("client survives a server killed mid-{dir:?}");
    for (op, name) in [(q, "request"), (rv, "receive"), (sd, "send")] {
        expect_lost(&cli, op, vp, &format!("{what}: {name}"));
    }
    nothing_more(&cli, &what);
    // The other server still serves this client.
    let q = cli
        .request(
            hp,
            1,
            Bytes::new(),
            Payload::Out(Bytes::from(data[..(2 << 20)].to_vec()).into()),
            ServiceLevel::Bulk,
        )
        .unwrap();
    assert_eq!(wait_ok(&cli, q).reply.as_deref(), Some(&b"ok"[..]));
    healthy_thread.join().unwrap();
    let now = cli.info();
    assert!(now.counters.peers_lost >= 1);
    released(&now, &base, &what);
    if let (Some(rc), Some(bc)) = (now.regcache, base.regcache) {
        assert_eq!(rc.entries, bc.entries, "{what}: the registrations of the client's buffers are gone");
        assert_eq!(rc.pinned_bytes, bc.pinned_bytes, "{what}: pinned bytes");
    }
}

#[test]
fn softib_server_survives_client_killed_mid_write() {
    server_survives(&Net::new("softib", Place::RemoteClients), Dir::Write);
}

#[test]
fn softib_server_survives_client_killed_mid_read() {
    server_survives(&Net::new("softib", Place::RemoteClients), Dir::Read);
}

#[test]
fn softib_client_survives_server_killed_mid_write() {
    client_survives(&Net::new("softib", Place::RemoteServers), Dir::Write);
}

#[test]
fn softib_client_survives_server_killed_mid_read() {
    client_survives(&Net::new("softib", Place::RemoteServers), Dir::Read);
}

#[test]
fn tcp_server_survives_client_killed_mid_write() {
    server_survives(&Net::new("tcp", Place::RemoteClients), Dir::Write);
}

#[test]
fn tcp_server_survives_client_killed_mid_read() {
    server_survives(&Net::new("tcp", Place::RemoteClients), Dir::Read);
}

#[test]
fn tcp_client_survives_server_killed_mid_write() {
    client_survives(&Net::new("tcp", Place::RemoteServers), Dir::Write);
}

#[test]
fn tcp_client_survives_server_killed_mid_read() {
    client_survives(&Net::new("tcp", Place::RemoteServers), Dir::Read);
}
