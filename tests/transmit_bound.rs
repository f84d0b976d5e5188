//! A peer that asks without reading the answers cannot grow the server's memory: the answers
//! queued for it are bounded by `transmit_bytes_per_peer`, at the bound the server stops
//! reading it, and after `stall_timeout` without progress it is dropped and everything it held
//! is returned, while other peers are served throughout. Reads the process's memory, so it is
//! the only test in its binary.

use std::io::Write;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ionet::internals::wire::{Header, Kind};
use ionet::*;

mod common;
use common::{raw_connect_small_window, raw_hello_as, vm_rss_kib};

const T: Duration = Duration::from_secs(30);
const BOUND: usize = 1 << 20;
const EXPOSED: usize = 64 * 1024;

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < T, "{what}");
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_peer_that_does_not_read_its_answers_is_bounded_then_dropped() {
    let srv = Endpoint::bind(
        "tcp://127.0.0.1:0",
        Config::default()
            .progress_thread(true)
            .transmit_bytes_per_peer(BOUND)
            .stall_timeout(Duration::from_secs(2))
            // The kernel's deadline for the same stall off: the transport's own is under test.
            .tcp_user_timeout(None),
    )
    .unwrap();
    let sa = srv.local_addr().unwrap().resolve().unwrap()[0];
    let mem = srv.expose(srv.alloc(EXPOSED).unwrap(), Access::READ | Access::WRITE).unwrap();
    let h = mem.handle();
    let baseline = vm_rss_kib();

    // The hostile peer: 4000 GETs of the whole 64 KiB exposure (250 MiB of answers) and as many
    // PUTs, none of the answers ever read. Its socket's receive buffer is kept small so the
    // kernel holds little of the answers on its side.
    let mut s = raw_connect_small_window(sa, 64 * 1024);
    raw_hello_as(&mut s, 900);
    let flood = thread::spawn(move || {
        let mut frames = Vec::new();
        for i in 0..4000u64 {
            let mut get = Header::new(Kind::Get, ServiceLevel::Normal);
            get.a = i;
            get.b = h.key;
            get.c = h.addr;
            get.aux = EXPOSED as u32;
            frames.extend_from_slice(&get.encode());
            let mut put = Header::new(Kind::Put, ServiceLevel::Normal);
            put.a = i;
            put.b = h.key;
            put.c = h.addr;
            put.len = 8;
            frames.extend_from_slice(&put.encode());
            frames.extend_from_slice(&i.to_le_bytes());
        }
        // Blocks once the server stops reading; fails once the server drops the connection.
        let _ = s.write_all(&frames);
        s
    });

    // A well-behaved client is served while the server holds the hostile one at its bound.
    let cli = Endpoint::client(Config::default()).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    let srv2 = srv.clone();
    let echo = thread::spawn(move || {
        for _ in 0..50 {
            let r = srv2.next_request(Some(T)).unwrap().expect("a request");
            let hdr = r.header().clone();
            srv2.wait(r.reply(hdr).unwrap()).unwrap().ok().unwrap();
        }
    });
    let mut most = 0;
    for i in 0..50u8 {
        let op = cli.request(p, 1, Bytes::from(vec![i; 32]), Payload::None, ServiceLevel::Normal).unwrap();
        let c = cli.wait_timeout(op, T).unwrap().expect("an answer while another peer floods").ok().unwrap();
        assert_eq!(c.reply.as_deref(), Some(&[i; 32][..]));
        let g = srv.info().gauges;
        most = most.max(g.transmit_bytes);
        assert!(
            g.transmit_bytes <= BOUND + EXPOSED + 1024,
            "{} bytes queued for a peer bounded at {BOUND}",
            g.transmit_bytes
        );
        thread::sleep(Duration::from_millis(20));
    }
    echo.join().unwrap();
    wait_until("the server never paused the peer that does not read", || srv.info().gauges.peers_paused == 1);
    let g = srv.info().gauges;
    assert!(g.transmit_bytes <= BOUND + EXPOSED + 1024, "{} bytes queued", g.transmit_bytes);
    let grown = vm_rss_kib().saturating_sub(baseline);
    assert!(grown < 32 * 1024, "the server grew by {grown} KiB for a peer bounded at 1 MiB");

    // After the stall timeout the hostile peer is dropped and what it held is returned.
    wait_until("the stalled peer was never dropped", || srv.info().gauges.peers_paused == 0);
    wait_until("the dropped peer's answers were not freed", || srv.info().gauges.transmit_bytes == 0);
    drop(flood.join().unwrap());
    // The good client is still connected and served.
    let op = cli.send_unexpected(p, 3, Bytes::from_static(b"still here"), ServiceLevel::Normal).unwrap();
    cli.wait(op).unwrap().ok().unwrap();
    assert_eq!(&srv.recv_unexpected(Some(T)).unwrap().unwrap().data[..], b"still here");
    assert_eq!(srv.info().gauges.peers, 1, "the dropped peer's record is left");
    assert!(most > 0, "the flood never queued an answer");
}
