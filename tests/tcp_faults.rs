//! Faults over `tcp://` (a peer process killed mid-rendezvous, hostile bytes on the wire) and
//! the TCP engine's fast paths (direct waits, one-buffer small frames).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::{raw_hello, read_until_closed};
use ionet::internals::wire::{Header, Kind};
use ionet::*;

mod common;

const T: Duration = Duration::from_secs(20);

/// Runs only as the child of `peer_killed_mid_rendezvous_*`: connects, announces a large
/// rendezvous send, says so, then stops driving progress so the body never completes.
#[test]
#[ignore]
fn child_rendezvous_sender() {
    let Ok(addr) = std::env::var("IONET_TEST_SERVER") else { return };
    let cli = Endpoint::client(Config::default()).unwrap();
    let p = cli.connect(addr.as_str()).unwrap();
    let op = cli.send_unexpected(p, 1, Bytes::from_static(b"ready"), ServiceLevel::Normal).unwrap();
    cli.wait(op).unwrap().ok().unwrap();
    // One round of progress writes the announcement (RTS); the receiver has not posted yet, so
    // no CTS can be back. Without further progress the body never follows.
    let big = cli.send(p, 2, Bytes::from(vec![5u8; 8 << 20]), ServiceLevel::Normal).unwrap();
    assert!(cli.test(big).unwrap().is_none());
    println!("announced");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn peer_killed_mid_rendezvous_fails_once_and_others_are_served() {
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default().progress_thread(true)).unwrap();
    let addr = srv.local_addr().unwrap().to_string();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["child_rendezvous_sender", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("IONET_TEST_SERVER", &addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let u = srv.recv_unexpected(Some(T)).unwrap().expect("child said ready");
    assert_eq!(&u.data[..], b"ready");
    let victim = u.peer;
    // Wait until the child reports it announced the transfer (then it stops progressing).
    let mut out = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("announced") {
        let n = out.read(&mut buf).unwrap();
        assert!(n > 0, "child exited early");
        seen.extend_from_slice(&buf[..n]);
    }
    let r = srv.recv(victim, 2, BytesMut::zeroed(8 << 20)).unwrap();
    // The receive is matched to the announcement, its body will never finish.
    assert!(srv.wait_timeout(r, Duration::from_millis(200)).unwrap().is_none());
    child.kill().unwrap();
    child.wait().unwrap();
    let c = srv.wait_timeout(r, T).unwrap().expect("receive fails after the kill");
    assert!(matches!(c.result, Err(Error::PeerLost { peer, .. }) if peer == victim), "{:?}", c.result);
    assert!(c.buf.into_recv().is_some(), "the buffer comes back");
    assert!(srv.wait_any(Some(Duration::from_millis(100))).unwrap().is_none(), "exactly once");
    // Later operations on the dead peer fail at once, and other peers are served.
    let r2 = srv.recv(victim, 3, BytesMut::zeroed(8)).unwrap();
    assert!(matches!(srv.wait_timeout(r2, T).unwrap().unwrap().result, Err(Error::PeerLost { .. })));
    let other = Endpoint::client(Config::default()).unwrap();
    let p = other.connect(addr.as_str()).unwrap();
    let op = other.send_unexpected(p, 9, Bytes::from_static(b"still there?"), ServiceLevel::Normal).unwrap();
    other.wait(op).unwrap().ok().unwrap();
    let u = srv.recv_unexpected(Some(T)).unwrap().unwrap();
    assert_eq!(&u.data[..], b"still there?");
    assert_ne!(u.peer, victim);
    assert!(srv.info().counters.peers_lost >= 1);
}

#[test]
fn hostile_bytes_close_the_connection_and_nothing_else() {
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default().progress_thread(true)).unwrap();
    let sa = srv.local_addr().unwrap().resolve().unwrap()[0];
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("garbage before hello", b"GET / HTTP/1.1\r\n\r\n".repeat(4), false),
        ("data frame before hello", Header::new(Kind::Eager, ServiceLevel::Normal).encode().to_vec(), false),
        (
            "oversized hello",
            {
                let mut h = Header::new(Kind::Hello, ServiceLevel::Normal);
                h.len = u32::MAX;
                h.encode().to_vec()
            },
            false,
        ),
        (
            "eager above the limit",
            {
                let mut h = Header::new(Kind::Eager, ServiceLevel::Normal);
                h.len = 1 << 30;
                h.encode().to_vec()
            },
            true,
        ),
        (
            "bad version",
            {
                let mut b = Header::new(Kind::Eager, ServiceLevel::Normal).encode();
                b[2] = 9;
                b.to_vec()
            },
            true,
        ),
        (
            "data for an unknown transfer",
            {
                let mut h = Header::new(Kind::Data, ServiceLevel::Normal);
                h.b = 12345;
                h.len = 4;
                let mut v = h.encode().to_vec();
                v.extend_from_slice(b"abcd");
                v
            },
            true,
        ),
        (
            "reply for an unknown request",
            {
                let mut h = Header::new(Kind::Reply, ServiceLevel::Normal);
                h.b = 777;
                h.encode().to_vec()
            },
            true,
        ),
        (
            "second hello",
            {
                let mut h = Header::new(Kind::Hello, ServiceLevel::Normal);
                h.len = 46;
                let mut v = h.encode().to_vec();
                v.extend_from_slice(&[0u8; 46]);
                v
            },
            true,
        ),
    ];
    for (name, bytes, after_hello) in cases {
        let mut s = TcpStream::connect(sa).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        if after_hello {
            raw_hello(&mut s);
        }
        s.write_all(&bytes).unwrap();
        // The server closes the connection: read returns EOF (or reset), never hangs.
        read_until_closed(&mut s, T, name);
    }
    assert!(srv.info().counters.protocol_errors >= 5);
    // The server still serves a well-behaved client.
    let cli = Endpoint::client(Config::default()).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    cli.wait(cli.send_unexpected(p, 1, Bytes::from_static(b"ok"), ServiceLevel::Normal).unwrap())
        .unwrap()
        .ok()
        .unwrap();
    assert_eq!(&srv.recv_unexpected(Some(T)).unwrap().unwrap().data[..], b"ok");
}

/// Regression (found by the benchmark suite): after a header read came up short and its body was to
/// be read straight into the user's buffer, a stale "socket drained" note made the next turn
/// skip the read of a frame that followed the body, so a reply could sit unread forever. The
/// byte timing is forced with a raw client.
#[test]
fn a_frame_right_after_a_directly_read_body_is_not_left_unread() {
    // Blocking waits: a busy-polling driver would retry the read on its next round anyway.
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default().wait_mode(WaitMode::Block)).unwrap();
    let sa = srv.local_addr().unwrap().resolve().unwrap()[0];
    let mut s = TcpStream::connect(sa).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let hs = std::thread::spawn(move || {
        raw_hello(&mut s);
        s
    });
    // Drive the server until the raw client is in, and learn its peer id.
    let mut s = loop {
        let _ = srv.recv_unexpected(Some(Duration::from_millis(10))).unwrap();
        if hs.is_finished() {
            break hs.join().unwrap();
        }
    };
    let frame = |kind: Kind, tag: u64, len: usize| {
        let mut h = Header::new(kind, ServiceLevel::Normal);
        h.a = tag;
        h.len = len as u32;
        h.encode()
    };
    s.write_all(&frame(Kind::Unexpected, 0, 2)).unwrap();
    s.write_all(b"hi").unwrap();
    let peer = srv.recv_unexpected(Some(T)).unwrap().expect("hello message").peer;
    let eager = srv.info().eager_limit;
    let big = srv.recv(peer, 1, BytesMut::zeroed(eager)).unwrap();
    let small = srv.recv(peer, 2, BytesMut::zeroed(4)).unwrap();
    // 1. The header alone: a short read, then the body is awaited straight into the buffer.
    s.write_all(&frame(Kind::Eager, 1, eager)).unwrap();
    assert!(srv.wait_timeout(big, Duration::from_millis(100)).unwrap().is_none());
    // 2. The body and a whole second frame in one write: one readiness edge for both.
    let mut rest = vec![9u8; eager];
    rest.extend_from_slice(&frame(Kind::Eager, 2, 4));
    rest.extend_from_slice(b"next");
    s.write_all(&rest).unwrap();
    assert!(srv.wait_timeout(big, T).unwrap().expect("body").is_ok());
    let c =
        srv.wait_timeout(small, Duration::from_secs(5)).unwrap().expect("the second frame was left unread");
    assert_eq!(&c.data().unwrap()[..], b"next");
}

/// Connects `cli` to `srv` with one unexpected message (a thread drives the server meanwhile);
/// returns the client's peer id on the server.
fn hello(srv: &Endpoint, cli: &Endpoint, p: PeerId) -> PeerId {
    let s = srv.clone();
    let got = std::thread::spawn(move || s.recv_unexpected(Some(T)).unwrap().expect("hello").peer);
    cli.wait(cli.send_unexpected(p, 0, Bytes::from_static(b"hello"), ServiceLevel::Normal).unwrap())
        .unwrap()
        .ok()
        .unwrap();
    got.join().unwrap()
}

/// A Block-mode server with a single connection waits on that socket directly instead of in
/// epoll. Kept busy by a ping-pong, it must still notice and serve a client that connects.
#[test]
fn a_busy_lone_connection_does_not_starve_new_clients() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default().wait_mode(WaitMode::Block)).unwrap();
    let addr = srv.local_addr().unwrap().to_string();
    let a = Endpoint::client(Config::default().wait_mode(WaitMode::Block)).unwrap();
    let pa = a.connect(addr.as_str()).unwrap();
    let peer_a = hello(&srv, &a, pa);
    let stop = Arc::new(AtomicBool::new(false));
    // The server echoes A's pings until A says "last"; A pings until told to stop.
    let echo = {
        let srv = srv.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            loop {
                let r = srv.recv(peer_a, 1, BytesMut::zeroed(8)).unwrap();
                srv.set_deadline(r, Instant::now() + T).unwrap();
                let c = srv.wait(r).unwrap().ok().unwrap();
                if c.data().unwrap() == "last" {
                    break;
                }
                srv.wait(srv.send(peer_a, 2, Bytes::from_static(b"pong"), ServiceLevel::Normal).unwrap())
                    .unwrap()
                    .ok()
                    .unwrap();
                n += 1;
            }
            n
        })
    };
    let pinger = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let r = a.recv(pa, 2, BytesMut::zeroed(8)).unwrap();
                a.set_deadline(r, Instant::now() + T).unwrap();
                a.wait(a.send(pa, 1, Bytes::from_static(b"ping"), ServiceLevel::Normal).unwrap())
                    .unwrap()
                    .ok()
                    .unwrap();
                a.wait(r).unwrap().ok().unwrap();
            }
            a.wait(a.send(pa, 1, Bytes::from_static(b"last"), ServiceLevel::Normal).unwrap())
                .unwrap()
                .ok()
                .unwrap();
            a
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    let b = Endpoint::client(Config::default().wait_mode(WaitMode::Block)).unwrap();
    let pb = b.connect(addr.as_str()).unwrap();
    let op = b.send_unexpected(pb, 7, Bytes::from_static(b"new client"), ServiceLevel::Normal).unwrap();
    b.set_deadline(op, Instant::now() + T).unwrap();
    b.wait(op).unwrap().ok().expect("the new client got through the handshake");
    // The echo thread drives the server; this thread just waits for B's message to surface.
    let u = srv.recv_unexpected(Some(T)).unwrap().expect("the new client's message arrived");
    assert_eq!(&u.data[..], b"new client");
    assert_ne!(u.peer, peer_a);
    stop.store(true, Ordering::Relaxed);
    let _a = pinger.join().unwrap();
    assert!(echo.join().unwrap() > 0, "the ping-pong ran");
}

/// A Block-mode client waiting on its only connection (directly on the socket) learns at once
/// that the server went away: the receive fails with `PeerLost`, once.
#[test]
fn a_direct_wait_sees_the_peer_close() {
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default().wait_mode(WaitMode::Block)).unwrap();
    let cli = Endpoint::client(Config::default().wait_mode(WaitMode::Block)).unwrap();
    let p = cli.connect(srv.local_addr().unwrap().to_string().as_str()).unwrap();
    hello(&srv, &cli, p);
    let r = cli.recv(p, 1, BytesMut::zeroed(8)).unwrap();
    cli.set_deadline(r, Instant::now() + T).unwrap();
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(srv);
    });
    let c = cli.wait(r).unwrap();
    assert!(matches!(c.result, Err(Error::PeerLost { .. })), "{:?}", c.result);
    assert!(cli.wait_any(Some(Duration::from_millis(100))).unwrap().is_none(), "exactly once");
    closer.join().unwrap();
}

/// Small frames are written from one stack buffer, larger ones as header + payload iovecs: the
/// bytes must be the same either way, around the boundary too.
#[test]
fn small_and_large_frames_around_the_one_buffer_limit_arrive_intact() {
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default().wait_mode(WaitMode::Block)).unwrap();
    let cli = Endpoint::client(Config::default().wait_mode(WaitMode::Block)).unwrap();
    let p = cli.connect(srv.local_addr().unwrap().to_string().as_str()).unwrap();
    let peer = hello(&srv, &cli, p);
    let sizes = [0usize, 1, 200, 215, 216, 217, 218, 1000];
    let recvs: Vec<OpId> =
        sizes.iter().map(|&n| srv.recv(peer, n as u64, BytesMut::zeroed(n)).unwrap()).collect();
    let s = srv.clone();
    let check = std::thread::spawn(move || {
        for (op, n) in recvs.into_iter().zip(sizes) {
            s.set_deadline(op, Instant::now() + T).unwrap();
            let c = s.wait(op).unwrap().ok().unwrap();
            let want: Vec<u8> = (0..n).map(|i| (i * 7 + n) as u8).collect();
            assert_eq!(c.data().unwrap(), want, "{n}-byte message");
        }
    });
    for n in sizes {
        let data: Vec<u8> = (0..n).map(|i| (i * 7 + n) as u8).collect();
        cli.wait(cli.send(p, n as u64, Bytes::from(data), ServiceLevel::Normal).unwrap())
            .unwrap()
            .ok()
            .unwrap();
    }
    check.join().unwrap();
}
