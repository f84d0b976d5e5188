//! Security properties of ionet (see SECURITY.md), each by a test that fails without the
//! protection: nothing from a peer that has not proved the cluster key is delivered or touches
//! exposed memory (raw bytes on the TCP transport and on the InfiniBand side channel);
//! exposure keys are unguessable and die with their exposure; connections and held requests
//! are bounded per server and per peer.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ionet::internals::wire::{FLAG_INLINE_DATA, FLAG_PAYLOAD_OUT, HEADER_LEN, Header, Kind};
use ionet::*;

const T: Duration = Duration::from_secs(20);
const KEY: &[u8] = b"security-test-cluster-key-0123456789";
/// HELLO_ACK flag: the sender has a cluster key (`handshake::HS_HAS_KEY`).
const HS_HAS_KEY: u32 = 1;
/// READY statuses (`handshake`).
const READY_OK: u32 = 0;

fn keyed(scheme: &str) -> Endpoint {
    Endpoint::bind(
        format!("{scheme}://127.0.0.1:0"),
        Config::default().cluster_key(KEY).progress_thread(true),
    )
    .unwrap()
}

fn sockaddr(ep: &Endpoint) -> SocketAddr {
    ep.local_addr().unwrap().resolve().unwrap()[0]
}

fn frame(kind: Kind, f: impl FnOnce(&mut Header), body: &[u8]) -> Vec<u8> {
    let mut h = Header::new(kind, ServiceLevel::Normal);
    f(&mut h);
    h.len = body.len() as u32;
    let mut v = h.encode().to_vec();
    v.extend_from_slice(body);
    v
}

/// A HELLO as a client without the key sends it (nonce, no listen port, limits).
fn hello(eid: u64, claim_key: bool) -> Vec<u8> {
    let mut body = vec![0x5a; 32];
    body.extend_from_slice(&0u16.to_le_bytes());
    body.extend_from_slice(&16384u32.to_le_bytes());
    body.extend_from_slice(&(64u64 << 20).to_le_bytes());
    frame(
        Kind::Hello,
        |h| {
            h.a = eid;
            h.aux = if claim_key { HS_HAS_KEY } else { 0 };
        },
        &body,
    )
}

/// Every frame the server sends until it closes the connection (bounded by `T`).
fn frames_until_close(s: &mut TcpStream) -> Vec<(Header, Vec<u8>)> {
    s.set_read_timeout(Some(T)).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let start = Instant::now();
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                panic!("server kept an unauthenticated connection open")
            }
            // A reset is a close too (the server dropped the socket with our bytes unread).
            Err(_) => break,
        }
        assert!(start.elapsed() < T, "server kept an unauthenticated connection open");
    }
    let mut out = Vec::new();
    let mut rest = &raw[..];
    while rest.len() >= HEADER_LEN {
        let h = Header::decode(&rest[..HEADER_LEN]).expect("server frames decode");
        let end = (HEADER_LEN + h.len as usize).min(rest.len());
        out.push((h, rest[HEADER_LEN..end].to_vec()));
        rest = &rest[end..];
    }
    out
}

/// The frames an attacker would like delivered: a message, a write into memory whose handle
/// leaked, an eager message and a request.
fn payload_frames(target: MemHandle) -> Vec<u8> {
    let mut v = frame(Kind::Unexpected, |h| h.a = 1, b"unauthenticated message");
    v.extend(frame(
        Kind::Put,
        |h| {
            h.a = 77;
            h.b = target.key;
            h.c = target.addr;
        },
        &[0xEE; 64],
    ));
    v.extend(frame(Kind::Eager, |h| h.a = 2, b"eager"));
    v.extend(frame(
        Kind::Request,
        |h| {
            h.a = 3;
            h.b = 1;
            h.aux = 3;
            h.c = 4;
            h.flags = FLAG_PAYLOAD_OUT | FLAG_INLINE_DATA;
        },
        b"hdrdata",
    ));
    v
}

/// A peer that does not hold the cluster key gets nothing delivered and writes no byte of
/// exposed memory over `tcp://`, however it orders its frames: pipelined right behind a bad
/// proof (before the server's verdict is out), instead of the proof, or claiming a key.
#[test]
fn tcp_unauthenticated_peer_delivers_nothing_and_touches_nothing() {
    let srv = keyed("tcp");
    let mut buf = srv.alloc(4096).unwrap();
    buf.fill(0x11);
    let x = srv.expose(buf, Access::READ_WRITE).unwrap();
    let leaked = x.handle();
    let sa = sockaddr(&srv);
    type Attack = fn(&mut TcpStream, MemHandle);
    let attacks: [(&str, Attack); 4] = [
        ("frames pipelined behind a zero proof", |s, h| {
            s.write_all(&hello(41, false)).unwrap();
            let mut ack = [0u8; HEADER_LEN];
            s.read_exact(&mut ack).unwrap();
            let ack = Header::decode(&ack).unwrap();
            let mut body = vec![0u8; ack.len as usize];
            s.read_exact(&mut body).unwrap();
            let mut v = frame(Kind::Auth, |h| h.a = 41, &[0u8; 32]);
            v.extend(payload_frames(h));
            s.write_all(&v).unwrap();
        }),
        ("frames pipelined behind an empty proof", |s, h| {
            let mut v = hello(42, false);
            v.extend(frame(Kind::Auth, |h| h.a = 42, b""));
            v.extend(payload_frames(h));
            s.write_all(&v).unwrap();
        }),
        ("frames instead of the proof", |s, h| {
            let mut v = hello(43, false);
            v.extend(payload_frames(h));
            s.write_all(&v).unwrap();
        }),
        ("claims a key, replays the server's own proof", |s, h| {
            s.write_all(&hello(44, true)).unwrap();
            let mut ack = [0u8; HEADER_LEN];
            s.read_exact(&mut ack).unwrap();
            let ack = Header::decode(&ack).unwrap();
            let mut body = vec![0u8; ack.len as usize];
            s.read_exact(&mut body).unwrap();
            let proof = body[body.len() - 32..].to_vec();
            let mut v = frame(Kind::Auth, |h| h.a = 44, &proof);
            v.extend(payload_frames(h));
            s.write_all(&v).unwrap();
        }),
    ];
    let failures_before = srv.info().counters.auth_failures;
    for (name, attack) in attacks {
        let mut s = TcpStream::connect(sa).unwrap();
        attack(&mut s, leaked);
        let frames = frames_until_close(&mut s);
        for (h, _) in &frames {
            assert!(
                !(h.kind == Kind::Ready && h.aux == READY_OK),
                "{name}: the server accepted a peer without the key"
            );
            assert!(
                matches!(h.kind, Kind::HelloAck | Kind::Ready),
                "{name}: the server answered a frame of an unauthenticated peer: {:?}",
                h.kind
            );
        }
    }
    assert!(srv.info().counters.auth_failures > failures_before);
    assert!(
        srv.recv_unexpected(Some(Duration::from_millis(200))).unwrap().is_none(),
        "a message was delivered"
    );
    assert!(srv.next_request(Some(Duration::ZERO)).unwrap().is_none(), "a request was delivered");
    srv.with_exposed(&x, |b| assert!(b.iter().all(|&v| v == 0x11), "exposed memory was written")).unwrap();
    // The server still serves a client with the key.
    let cli = Endpoint::client(Config::default().cluster_key(KEY)).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    let c = cli.wait(
        cli.put(p, Bytes::from_static(b"ok"), leaked.slice(0, 2).unwrap(), ServiceLevel::Normal).unwrap(),
    );
    c.unwrap().ok().unwrap();
    srv.with_exposed(&x, |b| assert_eq!(&b[..2], b"ok")).unwrap();
}

/// The InfiniBand side channel (`softib://`) tells a peer without the key nothing about its
/// queue pairs or its fast-RDMA ring (no `IB_INFO`), whatever that peer sends after a bad or
/// missing proof — so it can never connect a queue pair, the only way to reach memory.
#[test]
fn ib_side_channel_reveals_nothing_before_authentication() {
    // A handshake timeout far beyond the test's read timeout: a refused peer must be cut off
    // because it was refused, not because its handshake eventually timed out.
    let srv = Endpoint::bind(
        "softib://127.0.0.1:0",
        Config::default().cluster_key(KEY).progress_thread(true).handshake_timeout(Duration::from_secs(600)),
    )
    .unwrap();
    let sa = sockaddr(&srv);
    // A plausible IB_INFO (its contents do not matter: it must not be read at all).
    let info = vec![0u8; 60];
    for (name, proof) in
        [("zero proof", Some(vec![0u8; 32])), ("empty proof", Some(Vec::new())), ("no proof", None)]
    {
        let mut s = TcpStream::connect(sa).unwrap();
        let mut v = hello(51, false);
        if let Some(p) = &proof {
            v.extend(frame(Kind::Auth, |h| h.a = 51, p));
        }
        v.extend(frame(Kind::IbInfo, |_| {}, &info));
        v.extend(frame(Kind::IbReady, |_| {}, b""));
        s.write_all(&v).unwrap();
        for (h, _) in frames_until_close(&mut s) {
            assert_ne!(h.kind, Kind::IbInfo, "{name}: queue-pair details sent to a peer without the key");
            assert!(!(h.kind == Kind::Ready && h.aux == READY_OK), "{name}: accepted without the key");
        }
    }
    assert!(srv.info().counters.auth_failures >= 1);
    assert_eq!(srv.info().peers_connected, 0);
    // A keyed client still gets in.
    let cli = Endpoint::client(Config::default().cluster_key(KEY)).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    cli.wait(cli.send_unexpected(p, 1, Bytes::from_static(b"in"), ServiceLevel::Normal).unwrap())
        .unwrap()
        .ok()
        .unwrap();
    assert_eq!(&srv.recv_unexpected(Some(T)).unwrap().unwrap().data[..], b"in");
}

/// Exposure keys are 64 random bits (every bit position varies across keys, none repeats, none
/// is the address), and a key dies with its exposure: dropped or revoked, it is refused.
fn exposure_keys_are_unguessable_and_revocable(scheme: &str) {
    let srv =
        Endpoint::bind(format!("{scheme}://127.0.0.1:0"), Config::default().progress_thread(true)).unwrap();
    let xs: Vec<Exposure> =
        (0..64).map(|_| srv.expose(srv.alloc(64).unwrap(), Access::READ_WRITE).unwrap()).collect();
    let keys: Vec<u64> = xs.iter().map(|x| x.handle().key).collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), keys.len(), "a key repeated");
    let (any, all) = keys.iter().fold((0u64, u64::MAX), |(o, a), k| (o | k, a & k));
    assert_eq!((any, all), (u64::MAX, 0), "some key bit never varies: keys are not 64 random bits");
    assert!(xs.iter().all(|x| x.handle().key != x.handle().addr));
    let cli = Endpoint::client(Config::default()).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    let mut xs = xs.into_iter();
    let (dropped, revoked, live) = (xs.next().unwrap(), xs.next().unwrap(), xs.next().unwrap());
    let (hd, hr, hl) = (dropped.handle(), revoked.handle(), live.handle());
    drop(dropped);
    srv.revoke(revoked).unwrap();
    for h in [hd, hr] {
        let c = cli.wait(
            cli.put(p, Bytes::from_static(b"late"), h.slice(0, 4).unwrap(), ServiceLevel::Normal).unwrap(),
        );
        assert!(matches!(c.unwrap().result, Err(Error::RemoteAccess(_))), "a dead key was accepted");
        let c =
            cli.wait(cli.get(p, BytesMut::zeroed(4), h.slice(0, 4).unwrap(), ServiceLevel::Normal).unwrap());
        assert!(matches!(c.unwrap().result, Err(Error::RemoteAccess(_))), "a dead key was accepted");
    }
    cli.wait(cli.put(p, Bytes::from_static(b"live"), hl.slice(0, 4).unwrap(), ServiceLevel::Normal).unwrap())
        .unwrap()
        .ok()
        .unwrap();
    srv.with_exposed(&live, |b| assert_eq!(&b[..4], b"live")).unwrap();
}

/// A server accepts at most `max_peers` peers; the next one is refused with a typed error and
/// delivers nothing, and the admitted ones keep working.
fn connection_limit_refuses_extra_peers(scheme: &str) {
    let srv = Endpoint::bind(
        format!("{scheme}://127.0.0.1:0"),
        Config::default().max_peers(2).progress_thread(true),
    )
    .unwrap();
    let addr = srv.local_addr().unwrap();
    let clients: Vec<(Endpoint, PeerId)> = (0..3)
        .map(|_| {
            let c = Endpoint::client(Config::default()).unwrap();
            let p = c.connect(&addr).unwrap();
            (c, p)
        })
        .collect();
    for (i, (c, p)) in clients.iter().enumerate().take(2) {
        c.wait(c.send_unexpected(*p, 1, Bytes::from(vec![i as u8]), ServiceLevel::Normal).unwrap())
            .unwrap()
            .ok()
            .unwrap();
    }
    let (c, p) = &clients[2];
    let r = c
        .wait(c.send_unexpected(*p, 1, Bytes::from_static(b"third"), ServiceLevel::Normal).unwrap())
        .unwrap();
    assert!(r.result.is_err(), "a third peer was admitted past max_peers = 2");
    let mut got: Vec<u8> = (0..2).map(|_| srv.recv_unexpected(Some(T)).unwrap().unwrap().data[0]).collect();
    got.sort_unstable();
    assert_eq!(got, [0, 1]);
    assert!(
        srv.recv_unexpected(Some(Duration::from_millis(200))).unwrap().is_none(),
        "the refused peer delivered"
    );
    let (c, p) = &clients[0];
    c.wait(c.send_unexpected(*p, 1, Bytes::from_static(b"again"), ServiceLevel::Normal).unwrap())
        .unwrap()
        .ok()
        .unwrap();
    assert_eq!(&srv.recv_unexpected(Some(T)).unwrap().unwrap().data[..], b"again");
}

/// A server holds at most `requests_per_peer` unanswered requests from one peer: the rest wait
/// in the transport (back-pressure), and each answer lets exactly one more in.
fn held_requests_are_bounded_per_peer(scheme: &str) {
    let limit = 4;
    let srv = Endpoint::bind(
        format!("{scheme}://127.0.0.1:0"),
        Config::default().requests_per_peer(limit).progress_thread(true),
    )
    .unwrap();
    let cli = Endpoint::client(Config::default().progress_thread(true)).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    let n = 10;
    let ops: Vec<OpId> = (0..n)
        .map(|i| {
            cli.request(p, 1, Bytes::from(vec![i as u8; 100]), Payload::None, ServiceLevel::Normal).unwrap()
        })
        .collect();
    let mut held: Vec<Request> =
        (0..limit).map(|_| srv.next_request(Some(T)).unwrap().expect("a request")).collect();
    assert!(
        srv.next_request(Some(Duration::from_millis(300))).unwrap().is_none(),
        "more than requests_per_peer = {limit} requests were taken in"
    );
    let mut answered = 0;
    while let Some(r) = held.pop() {
        srv.wait(r.reply(Bytes::from_static(b"done")).unwrap()).unwrap().ok().unwrap();
        answered += 1;
        if answered + held.len() < n {
            held.push(srv.next_request(Some(T)).unwrap().expect("an answer lets the next request in"));
        }
    }
    assert_eq!(answered, n);
    for op in ops {
        assert_eq!(cli.wait(op).unwrap().ok().unwrap().reply.as_deref(), Some(&b"done"[..]));
    }
}

/// A request header above the server's `max_header` is refused without reaching the
/// application, and the server keeps serving.
fn oversized_request_header_is_refused(scheme: &str) {
    let srv = Endpoint::bind(
        format!("{scheme}://127.0.0.1:0"),
        Config::default().max_header(1024).progress_thread(true),
    )
    .unwrap();
    // The client reconnects after the server drops it, while this thread waits on the server.
    let cli = Endpoint::client(Config::default().progress_thread(true)).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    let big = cli.request(p, 1, Bytes::from(vec![1u8; 8192]), Payload::None, ServiceLevel::Normal);
    if let Ok(op) = big {
        let c = cli.wait(op).unwrap();
        assert!(c.result.is_err(), "an 8 KiB header passed a 1 KiB limit: {:?}", c.result);
    }
    assert!(
        srv.next_request(Some(Duration::from_millis(200))).unwrap().is_none(),
        "oversized header delivered"
    );
    let ok = cli.request(p, 1, Bytes::from(vec![2u8; 1000]), Payload::None, ServiceLevel::Normal).unwrap();
    let r = srv.next_request(Some(T)).unwrap().expect("a request within the limit");
    assert_eq!(r.header().len(), 1000);
    srv.wait(r.reply(Bytes::new()).unwrap()).unwrap().ok().unwrap();
    cli.wait(ok).unwrap().ok().unwrap();
}

/// A connection that never completes its handshake — silent, or trickling a byte at a time —
/// is closed once the handshake timeout passes, so idle sockets cannot pile up.
fn slow_handshakes_are_cut_off(scheme: &str) {
    let timeout = Duration::from_millis(300);
    let srv = Endpoint::bind(
        format!("{scheme}://127.0.0.1:0"),
        Config::default().handshake_timeout(timeout).connect_timeout(timeout).progress_thread(true),
    )
    .unwrap();
    let sa = sockaddr(&srv);
    let hello = hello(61, false);
    for trickle in [false, true] {
        let mut s = TcpStream::connect(sa).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let start = Instant::now();
        let mut sent = 0;
        let closed = loop {
            assert!(start.elapsed() < T, "trickle={trickle}: the server kept a half-open handshake");
            if trickle && sent < hello.len() - 1 {
                if s.write_all(&hello[sent..sent + 1]).is_err() {
                    break true;
                }
                sent += 1;
            }
            let mut b = [0u8; 64];
            match s.read(&mut b) {
                Ok(0) => break true,
                Ok(_) => {}
                Err(e)
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => break true,
            }
        };
        assert!(closed);
    }
}

macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod tcp { $( #[test] fn $name() { super::$name("tcp") } )* }
        mod softib { $( #[test] fn $name() { super::$name("softib") } )* }
    };
}

both!(
    exposure_keys_are_unguessable_and_revocable,
    connection_limit_refuses_extra_peers,
    held_requests_are_bounded_per_peer,
    oversized_request_header_is_refused,
    slow_handshakes_are_cut_off,
);
