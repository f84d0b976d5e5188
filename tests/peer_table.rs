//! A server forgets the peers that leave it (`tests/peer_churn.rs` churns 20 000 of them):
//! what the application still has to read of a peer keeps its record until it is read, and an
//! id of a forgotten peer fails cleanly.

use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ionet::internals::wire::{Header, Kind};
use ionet::*;

mod common;
use common::raw_hello_as;

const T: Duration = Duration::from_secs(30);

fn server(scheme: &str) -> Endpoint {
    Endpoint::bind(format!("{scheme}://127.0.0.1:0"), Config::default().progress_thread(true)).unwrap()
}

fn wait_for_peers(ep: &Endpoint, n: usize) {
    let start = Instant::now();
    while ep.info().gauges.peers != n {
        assert!(start.elapsed() < T, "{} peer records held, expected {n}", ep.info().gauges.peers);
        thread::sleep(Duration::from_millis(5));
    }
}

/// A send to `peer` fails with `PeerLost`, at posting or on completion.
fn assert_peer_lost(ep: &Endpoint, peer: PeerId) {
    let err = match ep.send_unexpected(peer, 1, Bytes::from_static(b"x"), ServiceLevel::Normal) {
        Err(e) => e,
        Ok(op) => ep.wait_timeout(op, T).unwrap().expect("completes").result.unwrap_err(),
    };
    assert!(matches!(err, Error::PeerLost { .. }), "{err:?}");
}

/// An unexpected message from a peer that has left keeps the peer's record (and its budget)
/// until the application reads it; then the record goes.
fn unread_messages_keep_a_departed_peer_until_read(scheme: &str) {
    let srv = server(scheme);
    {
        let cli = Endpoint::client(Config::default()).unwrap();
        let p = cli.connect(srv.local_addr().unwrap()).unwrap();
        cli.wait(cli.send_unexpected(p, 9, Bytes::from_static(b"last words"), ServiceLevel::Normal).unwrap())
            .unwrap()
            .ok()
            .unwrap();
        wait_for_peers(&srv, 1);
        // Queued for the application before the client leaves.
        let start = Instant::now();
        while srv.info().gauges.buffered_bytes != 10 {
            assert!(start.elapsed() < T, "the message never arrived");
            thread::sleep(Duration::from_millis(5));
        }
    }
    // The client is gone; its message is not read yet.
    thread::sleep(Duration::from_millis(200));
    assert_eq!(srv.info().gauges.peers, 1, "the record went while its message was unread");
    let u = srv.recv_unexpected(Some(T)).unwrap().expect("the message");
    assert_eq!(&u.data[..], b"last words");
    wait_for_peers(&srv, 0);
    // Its id now fails cleanly.
    assert_peer_lost(&srv, u.peer);
}

/// A client that reconnects after its connection was lost is served under a new id, and the
/// old id fails with `PeerLost`.
fn a_reconnected_peer_gets_a_new_id(scheme: &str) {
    let srv = server(scheme);
    let addr = srv.local_addr().unwrap();
    let ask = |cli: &Endpoint, p: PeerId| {
        let op = cli.request(p, 1, Bytes::from_static(b"q"), Payload::None, ServiceLevel::Normal).unwrap();
        let r = srv.next_request(Some(T)).unwrap().expect("a request");
        let who = r.peer();
        srv.wait(r.reply(Bytes::new()).unwrap()).unwrap().ok().unwrap();
        cli.wait(op).unwrap().ok().unwrap();
        who
    };
    let first = {
        let cli = Endpoint::client(Config::default().progress_thread(true)).unwrap();
        let p = cli.connect(&addr).unwrap();
        ask(&cli, p)
    };
    wait_for_peers(&srv, 0);
    let cli = Endpoint::client(Config::default().progress_thread(true)).unwrap();
    let p = cli.connect(&addr).unwrap();
    let second = ask(&cli, p);
    assert_ne!(first, second);
    assert_peer_lost(&srv, first);
}

/// A peer that reconnects (same endpoint id) while its earlier unexpected messages are unread
/// does not get a fresh budget: they stay counted against it.
#[test]
fn unread_messages_stay_counted_across_a_reconnection() {
    use std::io::Write;
    let srv = server("tcp");
    let sa = srv.local_addr().unwrap().resolve().unwrap()[0];
    let send = |n: usize| {
        let mut s = std::net::TcpStream::connect(sa).unwrap();
        raw_hello_as(&mut s, 77);
        for _ in 0..n {
            let mut h = Header::new(Kind::Unexpected, ServiceLevel::Normal);
            h.a = 5;
            h.len = 1000;
            s.write_all(&h.encode()).unwrap();
            s.write_all(&[7u8; 1000]).unwrap();
        }
        s
    };
    let wait_buffered = |n: usize| {
        let start = Instant::now();
        while srv.info().gauges.buffered_bytes != n {
            assert!(start.elapsed() < T, "{} bytes counted, expected {n}", srv.info().gauges.buffered_bytes);
            thread::sleep(Duration::from_millis(5));
        }
    };
    drop(send(10));
    wait_buffered(10_000);
    let again = send(1);
    wait_buffered(11_000);
    for _ in 0..11 {
        assert_eq!(srv.recv_unexpected(Some(T)).unwrap().expect("a message").data.len(), 1000);
    }
    wait_buffered(0);
    drop(again);
    wait_for_peers(&srv, 0);
}

macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod tcp { $( #[test] fn $name() { super::$name("tcp") } )* }
        mod softib { $( #[test] fn $name() { super::$name("softib") } )* }
    };
}

both!(unread_messages_keep_a_departed_peer_until_read, a_reconnected_peer_gets_a_new_id);
