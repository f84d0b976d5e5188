//! A peer that stops taking what it is sent (its process stopped with Ctrl-Z, its host gone
//! quiet behind a zero window, its endpoint no longer giving back credits) is dropped once it
//! has taken nothing for `stall_timeout`, so that the replies queued for it fail instead of
//! waiting, and their waiters with them, for as long as the peer stays stopped.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ionet::internals::wire::{Header, Kind};
use ionet::*;

mod common;
use common::{raw_connect_small_window, raw_hello_as};

/// The test's patience: far past the stall timeout below.
const T: Duration = Duration::from_secs(30);

#[test]
fn replies_to_a_peer_that_stopped_reading_fail_after_the_stall_timeout() {
    const REQUESTS: u64 = 256;
    let srv = Endpoint::bind(
        "tcp://127.0.0.1:0",
        Config::default().progress_thread(true).stall_timeout(Duration::from_secs(2)),
    )
    .unwrap();
    let sa = srv.local_addr().unwrap().resolve().unwrap()[0];
    // The stopped peer: it sends its requests and never reads again. A small receive buffer,
    // so its kernel takes little of the answers on its behalf.
    let mut s = raw_connect_small_window(sa, 64 * 1024);
    raw_hello_as(&mut s, 901);
    let mut frames = Vec::new();
    for id in 0..REQUESTS {
        let mut h = Header::new(Kind::Request, ServiceLevel::Normal);
        (h.a, h.b, h.aux, h.len) = (1, id, 4, 4);
        frames.extend_from_slice(&h.encode());
        frames.extend_from_slice(b"page");
    }
    s.write_all(&frames).unwrap();

    // Each answered with 60 KiB: 15 MiB, far more than the two sockets hold.
    let page = Bytes::from(vec![7u8; 60 << 10]);
    let replies: Vec<OpId> = (0..REQUESTS)
        .map(|_| {
            let req = srv.next_request(Some(T)).unwrap().expect("the stopped peer's request");
            req.reply(page.clone()).unwrap()
        })
        .collect();
    let last = *replies.last().unwrap();
    let done = srv.wait_timeout(last, T).unwrap().expect("a reply to a peer that reads nothing never ended");
    assert!(done.result.is_err(), "the last reply reached a peer that reads nothing: {:?}", done.result);
    let start = Instant::now();
    while srv.info().gauges.peers > 0 {
        assert!(start.elapsed() < T, "the stopped peer is still connected");
        thread::sleep(Duration::from_millis(10));
    }
    drop(s);
}

/// Over verbs no kernel watches the connection: a peer whose endpoint stops running gives back
/// no credits and no ring slots, and without a deadline of the transport's own the replies
/// queued behind them waited for as long as it stayed stopped.
#[test]
fn replies_to_a_softib_peer_that_stopped_giving_credits_fail_after_the_stall_timeout() {
    // Several times the client's receive buffers and ring slots together (16 and 8).
    const REQUESTS: usize = 96;
    let srv = Endpoint::bind(
        "softib://127.0.0.1:0",
        Config::default().progress_thread(true).stall_timeout(Duration::from_secs(2)),
    )
    .unwrap();
    // The client has no progress thread: once the test stops driving it, its endpoint takes
    // nothing off its receive queue and gives nothing back, as a stopped process would.
    let cli = Arc::new(Endpoint::client(Config::default()).unwrap());
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    let reqs: Vec<OpId> = (0..REQUESTS)
        .map(|i| {
            cli.request(p, 1, Bytes::from(format!("page {i}")), Payload::None, ServiceLevel::Normal).unwrap()
        })
        .collect();
    // Driven until the server holds every request (their sends need the server's credits).
    let stop = Arc::new(AtomicBool::new(false));
    let driver = {
        let (cli, stop) = (cli.clone(), stop.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                cli.try_progress().unwrap();
                thread::yield_now();
            }
        })
    };
    let held: Vec<Request> =
        (0..REQUESTS).map(|_| srv.next_request(Some(T)).unwrap().expect("the client's request")).collect();
    stop.store(true, Ordering::Release);
    driver.join().unwrap();

    let replies: Vec<OpId> =
        held.into_iter().map(|r| r.reply(Bytes::from_static(b"answer")).unwrap()).collect();
    // Each ends once: the few the client's buffers and slots took, the rest with the peer lost
    // for the cause.
    let mut lost = 0;
    for op in replies {
        let done = srv
            .wait_timeout(op, T)
            .unwrap()
            .expect("a reply to a peer that gives no credits back never ended");
        match done.result {
            Ok(_) => assert_eq!(lost, 0, "a reply went after one failed"),
            Err(Error::PeerLost { reason, .. }) => {
                assert!(reason.contains("stall_timeout"), "the cause is not named: {reason}");
                lost += 1;
            }
            Err(e) => panic!("a reply failed otherwise: {e}"),
        }
    }
    assert!(lost >= REQUESTS - 24, "only {lost} of {REQUESTS} replies failed");
    let start = Instant::now();
    while srv.info().gauges.peers > 0 {
        assert!(start.elapsed() < T, "the stopped peer is still connected");
        thread::sleep(Duration::from_millis(10));
    }
    let info = srv.info();
    assert_eq!(info.pending_ops, 0, "operations left");
    assert_eq!(info.rdma.expect("IB engine").queued_msgs, 0, "messages left queued for the lost peer");
    drop(reqs);
}
