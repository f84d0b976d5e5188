//! A peer that stops taking what it is sent (its process stopped with Ctrl-Z, its host gone
//! quiet behind a zero window) is dropped once it has taken nothing for `stall_timeout`, so
//! that the replies queued for it fail instead of waiting, and their waiters with them, for as
//! long as the peer stays stopped.

use std::io::Write;
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
