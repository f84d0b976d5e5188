//! `Endpoint::on_request` and zero-timeout polling of `next_request`: what a server's own
//! worker pool builds on (stripefs's io and meta servers do).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ionet::{Config, Endpoint, Payload, ServiceLevel};

const LONG: Duration = Duration::from_secs(10);

fn pair() -> (Endpoint, Endpoint, ionet::PeerId) {
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default()).unwrap();
    let cli = Endpoint::client(Config::default()).unwrap();
    let peer = cli.connect(srv.local_addr().unwrap()).unwrap();
    (srv, cli, peer)
}

fn ask(cli: &Endpoint, peer: ionet::PeerId, i: u8) -> ionet::OpId {
    cli.request(peer, 7, Bytes::from(vec![i]), Payload::None, ServiceLevel::Normal).unwrap()
}

#[test]
fn the_hook_runs_once_per_queued_request() {
    let (srv, cli, peer) = pair();
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    srv.on_request(move || {
        s.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    assert!(srv.on_request(|| {}).is_err(), "one hook per endpoint");
    let ops: Vec<_> = (0..3).map(|i| ask(&cli, peer, i)).collect();
    let client = std::thread::spawn(move || {
        for op in ops {
            assert!(cli.wait(op).unwrap().result.is_ok());
        }
    });
    for _ in 0..3 {
        let req = srv.next_request(Some(LONG)).unwrap().expect("a request");
        req.reply(Bytes::from_static(b"ok")).unwrap();
    }
    client.join().unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 3);
}

/// Nothing but zero-timeout calls drives the server: each must look at the network itself.
#[test]
fn a_zero_timeout_looks_at_the_network() {
    let (srv, cli, peer) = pair();
    let op = ask(&cli, peer, 1);
    let client = std::thread::spawn(move || cli.wait(op).unwrap().reply);
    let deadline = Instant::now() + LONG;
    let req = loop {
        if let Some(r) = srv.next_request(Some(Duration::ZERO)).unwrap() {
            break r;
        }
        assert!(Instant::now() < deadline, "zero-timeout polls never saw the request");
        std::thread::yield_now();
    };
    assert_eq!(req.header().as_ref(), [1]);
    let reply = req.reply(Bytes::from_static(b"ok")).unwrap();
    // Zero-timeout waits drive the reply out too.
    while srv.wait_timeout(reply, Duration::ZERO).unwrap().is_none() {
        assert!(Instant::now() < deadline, "the reply never went out");
    }
    assert_eq!(client.join().unwrap().as_deref(), Some(&b"ok"[..]));
}

/// The completion hook runs once per completion queued for the application, and not for
/// detached operations.
#[test]
fn the_completion_hook_runs_once_per_queued_completion() {
    let (srv, cli, peer) = pair();
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    cli.on_complete(move || {
        s.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    assert!(cli.on_complete(|| {}).is_err(), "one hook per endpoint");
    let server = std::thread::spawn(move || {
        for _ in 0..4 {
            let req = srv.next_request(Some(LONG)).unwrap().expect("a request");
            req.reply(Bytes::from_static(b"ok")).unwrap();
        }
        srv
    });
    let ops: Vec<_> = (0..3).map(|i| ask(&cli, peer, i)).collect();
    let detached = ask(&cli, peer, 9);
    cli.detach(detached).unwrap();
    for op in ops {
        assert!(cli.wait(op).unwrap().result.is_ok());
    }
    let srv = server.join().unwrap();
    // The detached request is answered too; let it complete before counting.
    let last = ask(&cli, peer, 10);
    let srv2 = std::thread::spawn(move || {
        let req = srv.next_request(Some(LONG)).unwrap().expect("a request");
        req.reply(Bytes::from_static(b"ok")).unwrap();
    });
    assert!(cli.wait(last).unwrap().result.is_ok());
    srv2.join().unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 4, "three requests and the last, not the detached one");
}
