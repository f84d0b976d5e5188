//! Two `softib://` endpoints configured differently — receive-buffer size, fast-RDMA limit and
//! hence ring-slot size — exchange messages around both sides' limits in both directions.
//!
//! The regression: the engine decided whether a message fits a SEND (inline) or a ring slot
//! (fast RDMA) from its *own* receive-buffer and slot sizes. A sender with larger buffers than
//! its peer then SENT messages that overflowed the peer's receive buffers (`LocLenErr` at the
//! peer, both queue pairs in error: the connection lost), or wrote past the peer's slots. Now
//! each side learns the other's limits in the side-channel info and uses the minimum; what does
//! not fit the peer moves by the next mechanism up, and an unexpected message larger than the
//! peer's slots is refused with a typed error.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ionet::*;

mod common;
use common::pattern;

const T: Duration = Duration::from_secs(20);

/// `recv_size` bytes per receive buffer, inline up to what fits one, fast RDMA up to `fast_max`.
fn config(recv_size: u32, fast_max: usize) -> Config {
    let mut p = Policy::for_scheme(Scheme::SoftIb);
    for sl in ServiceLevel::ALL {
        p.set(sl, Thresholds { inline_max: recv_size as usize, fast_max });
    }
    Config::default().policy(p).max_message(4 << 20).ib(IbConfig::default().recv_size(recv_size))
}

fn wait_ok(ep: &Endpoint, op: OpId, what: &str) -> Completion {
    let c = ep.wait_timeout(op, T).unwrap().unwrap_or_else(|| panic!("{what}: no completion"));
    if let Err(e) = &c.result {
        panic!("{what} failed: {e}");
    }
    c
}

/// Sends `len` bytes from `a` to `b` (tagged), checks the bytes and that both sides report the
/// same mechanism; returns it.
fn one_way(a: &Endpoint, pa: PeerId, b: &Endpoint, pb: PeerId, len: usize, what: &str) -> Mechanism {
    let data = pattern(len, len as u64);
    let r = b.recv(pb, 9, BytesMut::zeroed(len)).unwrap();
    let s = a.send(pa, 9, Bytes::from(data.clone()), ServiceLevel::Normal).unwrap();
    let rc = wait_ok(b, r, what);
    let sc = wait_ok(a, s, what);
    assert_eq!(rc.len(), len, "{what}: length");
    assert!(rc.data().unwrap() == data, "{what}: bytes");
    assert_eq!(sc.mechanism, rc.mechanism, "{what}: both sides name the same mechanism");
    sc.mechanism.unwrap()
}

#[test]
fn differently_configured_endpoints_use_the_smaller_limits() {
    // The server has small receive buffers and slots; the client large ones.
    let srv = Endpoint::bind("softib://127.0.0.1:0", config(4096, 16 << 10).progress_thread(true)).unwrap();
    let cli = Endpoint::client(config(32 << 10, 256 << 10).progress_thread(true)).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    // The introduction is posted before the queue pairs are up: it waits for the peer's limits
    // like any message. 8 KiB would be inline by the client's own buffers; the server's take
    // it by fast RDMA only.
    let hello = pattern(8 << 10, 1);
    let c = wait_ok(
        &cli,
        cli.send_unexpected(p, 1, Bytes::from(hello.clone()), ServiceLevel::Normal).unwrap(),
        "hello",
    );
    assert_eq!(c.mechanism, Some(Mechanism::FastRdma), "posted before the limits were known");
    let u = srv.recv_unexpected(Some(T)).unwrap().expect("introduction");
    assert!(u.data == hello, "introduction bytes");
    let sp = u.peer;

    let srv_slot = srv.info().fast_slots.unwrap().1;
    let cli_slot = cli.info().fast_slots.unwrap().1;
    assert!(cli_slot > 4 * srv_slot, "the slots differ: {cli_slot} vs {srv_slot}");

    // Client → server: the client would send 20 KiB inline and 128 KiB by fast RDMA; the
    // server's 4 KiB buffers and ~20 KiB slots take neither.
    for (len, want) in [
        (1000, Mechanism::Inline),
        (8 << 10, Mechanism::FastRdma),
        (20 << 10, Mechanism::ServerRdma),
        (128 << 10, Mechanism::ServerRdma),
    ] {
        let m = one_way(&cli, p, &srv, sp, len, &format!("client → server {len} B"));
        assert_eq!(m, want, "client → server {len} B");
    }
    // Server → client: the server's own (smaller) limits are already the minimum.
    for (len, want) in
        [(1000, Mechanism::Inline), (8 << 10, Mechanism::FastRdma), (128 << 10, Mechanism::ServerRdma)]
    {
        let m = one_way(&srv, sp, &cli, p, len, &format!("server → client {len} B"));
        assert_eq!(m, want, "server → client {len} B");
    }
    // Requests with inline data, and their replies, follow the same limits.
    let srv2 = srv.clone();
    let t = std::thread::spawn(move || {
        for _ in 0..2 {
            let req = srv2.next_request(Some(T)).unwrap().expect("request");
            let len = req.payload_len() as usize;
            let c = wait_ok(&srv2, req.pull_into(BytesMut::zeroed(len), 0).unwrap(), "pull");
            let ok = c.data().unwrap() == pattern(len, 3);
            wait_ok(&srv2, req.reply(Bytes::from(vec![ok as u8; 6000])).unwrap(), "reply");
        }
    });
    for len in [3000, 20 << 10] {
        let op = cli
            .request(
                p,
                5,
                Bytes::from_static(b"w"),
                Payload::Out(SendBuf::Bytes(Bytes::from(pattern(len, 3)))),
                ServiceLevel::Normal,
            )
            .unwrap();
        let c = wait_ok(&cli, op, "request");
        assert!(c.reply.as_ref().is_some_and(|r| r.len() == 6000 && r[0] == 1), "request of {len} B");
    }
    t.join().unwrap();

    // An unexpected message the client's slots would carry but the server's cannot is refused
    // with the limit, and the connection stays up.
    let big = srv.info().eager_limit + 1;
    match cli.send_unexpected(p, 2, Bytes::from(vec![0u8; big]), ServiceLevel::Normal) {
        Err(Error::TooLarge { max, .. }) => assert!(max < big as u64),
        other => panic!("oversized unexpected message: {other:?}"),
    }
    assert_eq!(one_way(&cli, p, &srv, sp, 100, "after the refusal"), Mechanism::Inline);
    assert_eq!(cli.info().counters.peers_lost, 0);
    assert_eq!(srv.info().counters.peers_lost, 0);
}

/// A send posted while the connection is still being set up waits for the peer's limits; if it
/// is cancelled meanwhile it completes once, cancelled, with its buffer.
#[test]
fn a_send_waiting_for_the_peers_limits_can_be_cancelled() {
    // Accepts the side channel and never answers: the handshake never completes.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("softib://{}", silent.local_addr().unwrap());
    let cli = Endpoint::client(Config::default().progress_thread(true)).unwrap();
    let p = cli.connect(addr.as_str()).unwrap();
    // The first post opens the connection; the listener's backlog completes the TCP handshake
    // and nobody ever answers the client's HELLO.
    let op = cli.send(p, 1, Bytes::from(pattern(5000, 2)), ServiceLevel::Normal).unwrap();
    assert!(cli.wait_timeout(op, Duration::from_millis(50)).unwrap().is_none(), "still waiting");
    assert_eq!(cli.info().rdma.unwrap().queued_msgs, 1, "held, not lost");
    cli.cancel(op).unwrap();
    let c = cli.wait_timeout(op, T).unwrap().expect("cancelled op completes");
    assert!(matches!(c.result, Err(Error::Cancelled)), "{:?}", c.result);
    match c.buf.into_send() {
        Some(SendBuf::Bytes(b)) => assert!(b == pattern(5000, 2), "buffer returned intact"),
        other => panic!("buffer not returned: {other:?}"),
    }
    assert_eq!(cli.info().rdma.unwrap().queued_msgs, 0);
}
