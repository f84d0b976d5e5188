//! Streamed request payloads over `tcp://`: a request's OUT payload above the inline limit
//! follows the request at once (STREAM frames) and waits in the server's socket until the
//! server posts a pull that covers it, instead of waiting for the server's PULLs.
//!
//! The wire-level tests play the server by hand, so they see exactly which frames the client
//! sends and when; the others run two endpoints and check what users see: the bytes, pulls in
//! any order and size, answers without pulling, cancellation, and a connection that stays
//! usable afterwards.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::{raw_hello, read_until_closed};
use ionet::internals::wire::{FLAG_ABORT, FLAG_PAYLOAD_OUT, FLAG_STREAMED, HEADER_LEN, Header, Kind};
use ionet::*;

mod common;

const T: Duration = Duration::from_secs(20);
/// The HELLO flag saying "I read STREAM frames" (`HS_STREAMS` in the handshake module).
const HS_STREAMS: u32 = 2;

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len).map(|i| ((i as u64).wrapping_mul(31).wrapping_add(seed) % 251) as u8).collect()
}

fn wait_ok(ep: &Endpoint, op: OpId) -> Completion {
    let c = ep.wait_timeout(op, T).unwrap().expect("completion in time");
    assert!(c.result.is_ok(), "{:?}", c.result);
    c
}

fn read_frame(s: &mut TcpStream) -> (Header, Vec<u8>) {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let h = Header::decode(&h).unwrap();
    let mut body = vec![0u8; h.len as usize];
    s.read_exact(&mut body).unwrap();
    (h, body)
}

fn write_frame(s: &mut TcpStream, h: Header, body: &[u8]) {
    let mut v = h.encode().to_vec();
    v.extend_from_slice(body);
    s.write_all(&v).unwrap();
}

/// Plays a server's side of the handshake (no key), announcing `hs_flags` in its HELLO_ACK.
fn raw_accept(l: &TcpListener, hs_flags: u32) -> TcpStream {
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let (hello, _) = read_frame(&mut s);
    assert_eq!(hello.kind, Kind::Hello);
    let mut ack = Header::new(Kind::HelloAck, hello.sl);
    ack.a = 4242;
    ack.aux = hs_flags;
    // nonce, listen port, eager limit, largest message
    let mut body = vec![7u8; 32];
    body.extend_from_slice(&0u16.to_le_bytes());
    body.extend_from_slice(&16384u32.to_le_bytes());
    body.extend_from_slice(&(64u64 << 20).to_le_bytes());
    ack.len = body.len() as u32;
    write_frame(&mut s, ack, &body);
    let (auth, _) = read_frame(&mut s);
    assert_eq!(auth.kind, Kind::Auth);
    write_frame(&mut s, Header::new(Kind::Ready, hello.sl), &[]);
    s
}

/// A client endpoint with its own progress thread posts a 256 KiB write to a raw server.
fn client_writes_to_raw_server(hs_flags: u32) -> (TcpStream, Endpoint, OpId, Vec<u8>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let cli = Endpoint::client(Config::default().progress_thread(true)).unwrap();
    let p = cli.connect(format!("tcp://127.0.0.1:{port}").as_str()).unwrap();
    let data = pattern(256 << 10, 3);
    let op = cli
        .request(
            p,
            9,
            Bytes::from_static(b"hdr"),
            Payload::Out(Bytes::from(data.clone()).into()),
            ServiceLevel::Bulk,
        )
        .unwrap();
    let s = raw_accept(&l, hs_flags);
    (s, cli, op, data)
}

#[test]
fn a_write_above_the_inline_limit_streams_behind_its_request() {
    let (mut s, cli, op, data) = client_writes_to_raw_server(HS_STREAMS);
    let (req, body) = read_frame(&mut s);
    assert_eq!(req.kind, Kind::Request);
    assert_eq!(req.flags & (FLAG_PAYLOAD_OUT | FLAG_STREAMED), FLAG_PAYLOAD_OUT | FLAG_STREAMED);
    assert_eq!((req.c, &body[..]), (data.len() as u64, &b"hdr"[..]));
    // No PULL was sent: the payload comes anyway, in order, straight behind the request.
    let mut got = Vec::new();
    while got.len() < data.len() {
        let (h, body) = read_frame(&mut s);
        assert_eq!((h.kind, h.b, h.c), (Kind::Stream, req.b, got.len() as u64));
        got.extend_from_slice(&body);
    }
    assert!(got == data, "streamed bytes differ");
    let mut reply = Header::new(Kind::Reply, req.sl);
    reply.b = req.b;
    reply.len = 2;
    write_frame(&mut s, reply, b"ok");
    let c = wait_ok(&cli, op);
    assert_eq!(c.reply.as_deref(), Some(&b"ok"[..]));
    assert_eq!(c.len(), data.len());
}

/// A server that does not say it reads streams gets the old protocol: nothing follows the
/// request until it asks with a PULL.
#[test]
fn a_server_that_does_not_read_streams_is_asked_to_pull() {
    let (mut s, cli, op, data) = client_writes_to_raw_server(0);
    let (req, _) = read_frame(&mut s);
    assert_eq!(req.kind, Kind::Request);
    assert_eq!(req.flags & FLAG_STREAMED, 0);
    s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut one = [0u8; 1];
    assert!(s.read(&mut one).is_err(), "the client sent something before being asked to");
    s.set_read_timeout(Some(T)).unwrap();
    let mut pull = Header::new(Kind::Pull, req.sl);
    (pull.a, pull.b, pull.c, pull.aux) = (1, req.b, 0, data.len() as u32);
    write_frame(&mut s, pull, &[]);
    let (h, body) = read_frame(&mut s);
    assert_eq!((h.kind, h.a), (Kind::PullData, 1));
    assert!(body == data);
    let mut reply = Header::new(Kind::Reply, req.sl);
    reply.b = req.b;
    write_frame(&mut s, reply, &[]);
    wait_ok(&cli, op);
}

/// A server endpoint with a progress thread and a client connected to it.
fn pair(cli_cfg: Config) -> (Endpoint, Endpoint, PeerId) {
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default().progress_thread(true)).unwrap();
    let cli = Endpoint::client(cli_cfg).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    (srv, cli, p)
}

fn write(cli: &Endpoint, p: PeerId, data: &[u8]) -> OpId {
    let payload = Payload::Out(Bytes::copy_from_slice(data).into());
    cli.request(p, 1, Bytes::new(), payload, ServiceLevel::Bulk).unwrap()
}

/// A write the server pulls in one piece and answers: the server gets `data` whole and the
/// client's write completes.
fn write_arrives_whole(srv: &Endpoint, cli: &Endpoint, p: PeerId, data: &[u8], what: &str) {
    let op = write(cli, p, data);
    let req = srv.next_request(Some(T)).unwrap().expect(what);
    let c = wait_ok(srv, req.pull_into(BytesMut::zeroed(data.len()), 0).unwrap());
    assert!(c.data().unwrap()[..] == data[..], "{what}: the bytes");
    wait_ok(srv, req.reply(Bytes::new()).unwrap());
    wait_ok(cli, op);
}

/// The bytes land where each pull says, whatever the order the pulls come in and however
/// their edges fall against the stream's frames (1 MiB).
#[test]
fn pulls_in_any_order_and_size_get_their_bytes() {
    let (srv, cli, p) = pair(Config::default().progress_thread(true));
    let data = pattern((3 << 20) + 5, 11);
    let op = write(&cli, p, &data);
    let req = srv.next_request(Some(T)).unwrap().expect("request");
    assert_eq!(req.payload_len(), data.len() as u64);
    // Edges inside frames and across them; the last pull posted first, the first one last.
    let edges = [0usize, 100_001, (2 << 20) + 7, data.len()];
    let pulls: Vec<(usize, OpId)> = (0..3)
        .rev()
        .map(|i| {
            let (a, b) = (edges[i], edges[i + 1]);
            (a, req.pull_into(BytesMut::zeroed(b - a), a as u64).unwrap())
        })
        .collect();
    for (at, op) in pulls {
        let c = wait_ok(&srv, op);
        let got = c.data().unwrap();
        assert!(got[..] == data[at..at + got.len()], "pull at {at}");
    }
    wait_ok(&srv, req.reply(Bytes::from_static(b"ok")).unwrap());
    assert_eq!(wait_ok(&cli, op).reply.as_deref(), Some(&b"ok"[..]));
}

/// A server may answer having pulled part of a payload, or none: the rest is discarded (by the
/// server if it is already on its way, else the client stops sending it), and the next request
/// on the same connection is served intact.
#[test]
fn an_answer_before_the_payload_is_pulled_leaves_the_connection_usable() {
    let (srv, cli, p) = pair(Config::default().progress_thread(true));
    for pulled in [0usize, 1 << 20] {
        let data = pattern(8 << 20, pulled as u64);
        let op = write(&cli, p, &data);
        let req = srv.next_request(Some(T)).unwrap().expect("request");
        if pulled > 0 {
            let c = wait_ok(&srv, req.pull_into(BytesMut::zeroed(pulled), 0).unwrap());
            assert!(c.data().unwrap()[..] == data[..pulled]);
        }
        wait_ok(&srv, req.reply_error("refused").unwrap());
        let c = cli.wait_timeout(op, T).unwrap().expect("the write completes");
        assert!(matches!(&c.result, Err(Error::Remote(m)) if m == "refused"), "{:?}", c.result);
        // The next write on the same connection arrives whole.
        write_arrives_whole(&srv, &cli, p, &pattern(3 << 20, 99), "the next write");
    }
}

/// A client that gives up on a streamed write (its deadline passes while the server has not
/// pulled) gets its buffer back at once, although most of the payload never left: the server
/// learns the stream stopped, its pull fails, and the connection serves the next request.
#[test]
fn a_cancelled_streamed_write_completes_at_once_and_the_server_learns_it() {
    let (srv, cli, p) = pair(Config::default().progress_thread(true));
    // Far more than the sockets hold, so most of it is still queued at the client.
    let data = pattern(32 << 20, 5);
    let op = write(&cli, p, &data);
    let req = srv.next_request(Some(T)).unwrap().expect("request");
    cli.set_deadline(op, Instant::now() + Duration::from_millis(200)).unwrap();
    let c = cli.wait_timeout(op, T).unwrap().expect("the cancelled write completes");
    assert!(matches!(c.result, Err(Error::Timeout)), "{:?}", c.result);
    assert!(c.buf.into_send().is_some(), "the buffer comes back");
    // The server pulls the whole payload: it gets what was sent, then word of the stop.
    let pull = req.pull_into(BytesMut::zeroed(data.len()), 0).unwrap();
    let c = srv.wait_timeout(pull, T).unwrap().expect("the pull ends");
    assert!(matches!(c.result, Err(Error::PeerCancelled)), "{:?}", c.result);
    drop(req);
    write_arrives_whole(&srv, &cli, p, &pattern(2 << 20, 77), "the next write");
}

/// A pull posted while the payload already waits in the server's socket is filled before
/// `pull_into` returns: the posting thread reads the bytes itself. (Otherwise they would wait
/// for a driver asleep in epoll, where no new edge comes for bytes that are already there: up to
/// its 200 ms re-check in block mode.)
#[test]
fn a_pull_posted_while_the_stream_waits_is_filled_at_once() {
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default().wait_mode(WaitMode::Block)).unwrap();
    let cli = Endpoint::client(Config::default().progress_thread(true)).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    let data = pattern(64 << 10, 21);
    let op = write(&cli, p, &data);
    let req = srv.next_request(Some(T)).unwrap().expect("request");
    // The client's progress thread sends the 64 KiB at once; give it time, then let the server
    // read the STREAM header and find no pull for it.
    std::thread::sleep(Duration::from_millis(100));
    assert!(srv.wait_any(Some(Duration::from_millis(20))).unwrap().is_none());
    let pending = srv.info().pending_ops;
    let pull = req.pull_into(BytesMut::zeroed(data.len()), 0).unwrap();
    assert_eq!(srv.info().pending_ops, pending, "the pull was not filled when pull_into returned");
    let c = wait_ok(&srv, pull);
    assert!(c.data().unwrap()[..] == data[..]);
    let reply = req.reply(Bytes::new()).unwrap();
    wait_ok(&srv, reply);
    wait_ok(&cli, op);
}

/// Pulls of a streamed payload may not go back over bytes already routed, nor overlap.
#[test]
fn pulls_that_overlap_or_go_back_are_refused() {
    let (srv, cli, p) = pair(Config::default().progress_thread(true));
    let data = pattern(2 << 20, 1);
    let op = write(&cli, p, &data);
    let req = srv.next_request(Some(T)).unwrap().expect("request");
    let first = req.pull_into(BytesMut::zeroed(1 << 20), 0).unwrap();
    assert!(req.pull_into(BytesMut::zeroed(4096), 4096).is_err(), "overlapping pull accepted");
    wait_ok(&srv, first);
    assert!(req.pull_into(BytesMut::zeroed(4096), 0).is_err(), "pull of routed bytes accepted");
    let rest = wait_ok(&srv, req.pull_into(BytesMut::zeroed(1 << 20), 1 << 20).unwrap());
    assert!(rest.data().unwrap()[..] == data[1 << 20..]);
    wait_ok(&srv, req.reply(Bytes::new()).unwrap());
    wait_ok(&cli, op);
}

/// With streaming off, writes are pulled, and still arrive whole.
#[test]
fn with_streaming_off_payloads_are_pulled() {
    let (srv, cli, p) = pair(Config::default().progress_thread(true).stream_requests(false));
    write_arrives_whole(&srv, &cli, p, &pattern(3 << 20, 8), "the write");
}

/// A STREAM frame that does not continue an open stream closes the connection.
#[test]
fn stray_stream_frames_are_protocol_errors() {
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default().progress_thread(true)).unwrap();
    let sa = srv.local_addr().unwrap().resolve().unwrap()[0];
    let stream = |b: u64, c: u64, body: &[u8]| {
        let mut h = Header::new(Kind::Stream, ServiceLevel::Normal);
        (h.b, h.c, h.len) = (b, c, body.len() as u32);
        let mut v = h.encode().to_vec();
        v.extend_from_slice(body);
        v
    };
    let request = |id: u64, len: u64| {
        let mut h = Header::new(Kind::Request, ServiceLevel::Normal);
        (h.b, h.c, h.flags) = (id, len, FLAG_PAYLOAD_OUT | FLAG_STREAMED);
        h.encode().to_vec()
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("unknown request", stream(5, 0, b"abcd")),
        ("wrong offset", [request(6, 100), stream(6, 50, b"abcd")].concat()),
        ("past the end", [request(7, 3), stream(7, 0, b"abcd")].concat()),
        ("abort at the wrong offset", {
            let mut h = Header::new(Kind::Stream, ServiceLevel::Normal);
            (h.b, h.c, h.flags) = (8, 9, FLAG_ABORT);
            [request(8, 100), h.encode().to_vec()].concat()
        }),
    ];
    let before = srv.info().counters.protocol_errors;
    for (name, bytes) in &cases {
        let mut s = TcpStream::connect(sa).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        raw_hello(&mut s);
        s.write_all(bytes).unwrap();
        read_until_closed(&mut s, T, name);
    }
    assert!(srv.info().counters.protocol_errors >= before + cases.len() as u64);
}
