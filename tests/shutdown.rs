//! `Endpoint::shutdown`: pending operations complete once with `Closed`, waiting threads
//! return, later posts and connects are refused, and the peer sees the connection go.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ionet::{Config, Endpoint, Error, Payload, ServiceLevel};

const LONG: Duration = Duration::from_secs(10);

/// The client has a progress thread: nobody else drives it while the server is served.
fn shutdown_fails_what_is_pending(scheme: &str) {
    let srv = Endpoint::bind(format!("{scheme}://127.0.0.1:0"), Config::default()).unwrap();
    let cli = Endpoint::client(Config::default().progress_thread(true)).unwrap();
    let peer = cli.connect(srv.local_addr().unwrap()).unwrap();

    // The server holds one request unanswered; a thread waits for the next one.
    let held =
        cli.request(peer, 1, Bytes::from_static(b"held"), Payload::None, ServiceLevel::Normal).unwrap();
    let req = srv.next_request(Some(LONG)).unwrap().expect("the request");
    let s2 = srv.clone();
    let waiter = std::thread::spawn(move || s2.next_request(None).map(|r| r.is_some()));

    // The client: a receive nobody matches, and the held request.
    let recv = cli.recv(peer, 5, BytesMut::zeroed(8)).unwrap();
    cli.shutdown();
    for op in [held, recv] {
        let c = cli.wait_timeout(op, LONG).unwrap().expect("a pending operation never completed");
        assert!(matches!(c.result, Err(Error::Closed)), "{scheme}: {op}: {:?}", c.result);
    }
    assert!(cli.wait_any(Some(Duration::ZERO)).unwrap().is_none(), "{scheme}: a second completion");
    assert!(matches!(
        cli.send(peer, 1, Bytes::from_static(b"late"), ServiceLevel::Normal),
        Err(Error::Closed)
    ));
    assert!(matches!(cli.connect(srv.local_addr().unwrap()), Err(Error::Closed)));
    cli.shutdown();

    // The server's answer goes nowhere; its shutdown ends the waiting thread.
    let _ = req.reply(Bytes::from_static(b"too late"));
    srv.shutdown();
    assert!(matches!(waiter.join().unwrap(), Err(Error::Closed)), "{scheme}: next_request after shutdown");
    assert!(matches!(srv.next_request(Some(Duration::ZERO)), Err(Error::Closed)));
    assert!(matches!(srv.recv_unexpected(Some(Duration::ZERO)), Err(Error::Closed)));
}

#[test]
fn shutdown_fails_what_is_pending_over_tcp() {
    shutdown_fails_what_is_pending("tcp");
}

#[test]
fn shutdown_fails_what_is_pending_over_softib() {
    shutdown_fails_what_is_pending("softib");
}

/// A server that shuts down drops its connections: its clients' pending operations fail as
/// lost, naming the server's address.
#[test]
fn clients_of_a_server_that_shut_down_see_the_peer_lost() {
    for scheme in ["tcp", "softib"] {
        let srv = Endpoint::bind(format!("{scheme}://127.0.0.1:0"), Config::default()).unwrap();
        let addr = srv.local_addr().unwrap();
        let cli = Endpoint::client(Config::default().progress_thread(true)).unwrap();
        let peer = cli.connect(&addr).unwrap();
        let op = cli.request(peer, 1, Bytes::from_static(b"q"), Payload::None, ServiceLevel::Normal).unwrap();
        let req = srv.next_request(Some(LONG)).unwrap().expect("the request");
        std::mem::forget(req);
        srv.shutdown();
        let c = cli.wait_timeout(op, LONG).unwrap().expect("the client never heard");
        match c.result {
            Err(Error::PeerLost { reason, .. }) => {
                assert!(reason.contains(&addr.port().to_string()), "{scheme}: {reason}")
            }
            other => panic!("{scheme}: {other:?}"),
        }
    }
}

/// Shutting down with the progress thread running, and dropping clones afterwards.
#[test]
fn shutdown_with_a_progress_thread() {
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default().progress_thread(true)).unwrap();
    let waiter = {
        let s = srv.clone();
        std::thread::spawn(move || s.next_request(None).err())
    };
    srv.shutdown();
    assert!(matches!(waiter.join().unwrap(), Some(Error::Closed)));
    drop(srv);
}

/// A server that drops its endpoint can bind the same address again at once: the listener
/// closes with the last handle, not when a thread of the endpoint's own next looks.
fn dropped_server_address_is_free_at_once(scheme: &str, progress_thread: bool) {
    let cfg = || Config::default().progress_thread(progress_thread);
    let mut srv = Endpoint::bind(format!("{scheme}://127.0.0.1:0"), cfg()).unwrap();
    let addr = srv.local_addr().unwrap();
    for round in 0..5 {
        // A client of its own: one whose connection the old server closed an instant ago
        // might send into that closed connection, which is not what this looks at.
        let cli = Endpoint::client(Config::default().progress_thread(true)).unwrap();
        let peer = cli.connect(&addr).unwrap();
        let op = cli.request(peer, 1, Bytes::from_static(b"q"), Payload::None, ServiceLevel::Normal).unwrap();
        let what = format!("{scheme} (progress thread {progress_thread}): round {round}");
        let req = srv.next_request(Some(LONG)).unwrap();
        let req = req.unwrap_or_else(|| panic!("{what}: no request; client: {:?}", cli.test(op)));
        req.reply(Bytes::from_static(b"a")).unwrap();
        // Without a progress thread the server sends the reply only while driven.
        let deadline = Instant::now() + LONG;
        let c = loop {
            if let Some(c) = cli.test(op).unwrap() {
                break c;
            }
            assert!(Instant::now() < deadline, "{what}: no reply");
            let _ = srv.try_progress();
            std::thread::yield_now();
        };
        assert!(c.result.is_ok(), "{what}: {:?}", c.result);
        drop(srv);
        srv = match Endpoint::bind(&addr, cfg()) {
            Ok(s) => s,
            Err(e) => panic!("{what}: {e}"),
        };
    }
}

#[test]
fn a_dropped_server_address_is_free_at_once() {
    for scheme in ["tcp", "softib"] {
        for progress_thread in [false, true] {
            dropped_server_address_is_free_at_once(scheme, progress_thread);
        }
    }
}
