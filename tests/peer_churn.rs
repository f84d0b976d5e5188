//! Records of peers that connected and went away do not pile up under connect/close churn,
//! each client with a fresh endpoint id (what a keyless server on a network meets). Reads the
//! process's memory, so it is the only test in its binary.

use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use ionet::*;

mod common;
use common::{raw_hello_as, vm_rss_kib};

const T: Duration = Duration::from_secs(30);

/// One complete keyless handshake as endpoint `eid`, then a close: what a client that connects
/// and leaves costs the server.
fn handshake_and_leave(sa: SocketAddr, eid: u64) {
    let mut s = TcpStream::connect(sa).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    raw_hello_as(&mut s, eid);
}

/// Waits until the server holds `n` peer records.
fn wait_for_peers(ep: &Endpoint, n: usize) {
    let start = Instant::now();
    while ep.info().gauges.peers != n {
        assert!(start.elapsed() < T, "{} peer records held, expected {n}", ep.info().gauges.peers);
        thread::sleep(Duration::from_millis(5));
    }
}

/// 20 000 clients, each with a fresh endpoint id, connect and leave: the server's peer table
/// goes back to empty and its memory does not grow with them.
#[test]
fn connect_close_churn_leaves_no_peer_records() {
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default().progress_thread(true)).unwrap();
    let sa = srv.local_addr().unwrap().resolve().unwrap()[0];
    // Warm up the allocator and the tables, then measure.
    for eid in 1..=2_000 {
        handshake_and_leave(sa, eid);
    }
    wait_for_peers(&srv, 0);
    let before = vm_rss_kib();
    for eid in 10_001..=30_000 {
        handshake_and_leave(sa, eid);
    }
    wait_for_peers(&srv, 0);
    let grown = vm_rss_kib().saturating_sub(before);
    assert!(grown < 2048, "20 000 departed peers grew the process by {grown} KiB");
}
