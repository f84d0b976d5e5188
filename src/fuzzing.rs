//! Entry points for the cargo-fuzz targets in `fuzz/` and for the corpus-replay test. Each
//! takes arbitrary bytes, as a peer could send them, and must neither panic nor allocate from
//! announced lengths; whatever decodes must re-encode to the same bytes.
//!
//! | target        | peer bytes                                                          |
//! |---------------|---------------------------------------------------------------------|
//! | `wire_frames` | TCP frame headers and frame streams                                 |
//! | `handshake`   | one HELLO / HELLO_ACK / AUTH, TCP and IB side channel alike         |
//! | `ib_side`     | a whole IB side-channel conversation: handshake, then `IB_INFO`     |
//! | `ib_message`  | IB engine messages, segment lists, queue-pair and `IB_INFO` records |
//! | `mem_handle`  | memory handles carried in requests                                  |
//! | `tcp_session` | a live TCP server fed the bytes after an honest handshake           |

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::buffers::buf::RecvBuf;
use crate::config::Config;
use crate::endpoint::{Endpoint, Request};
use crate::expose::MemHandle;
use crate::handshake::{ClientHandshake, HelloInfo, ServerHandshake};
use crate::op::Direction;
use crate::types::{OpId, ServiceLevel, WaitMode};
use crate::wire::{self, HEADER_LEN, Header, Kind, Limits};

/// Limits a default endpoint applies.
fn limits() -> Limits {
    Limits { eager: 16 * 1024, chunk: 64 << 20, header: 64 * 1024, message: 64 << 20 }
}

/// Frame headers: a stream of frames, and every 40-byte window as a header.
pub fn wire(data: &[u8]) {
    let _ = wire::scan_stream(data, &limits());
    for w in data.windows(HEADER_LEN).step_by(7) {
        if let Ok(h) = Header::decode(w) {
            assert_eq!(&h.encode()[..], w, "decode/encode round trip");
            let _ = h.check_limits(&limits());
        }
    }
}

/// The handshake, both sides: bytes as a HELLO to a server (with and without a key), and as a
/// HELLO_ACK to a client that sent a HELLO.
pub fn handshake(data: &[u8]) {
    let Some((head, body)) = data.split_at_checked(HEADER_LEN) else { return };
    let Ok(h) = Header::decode(head) else { return };
    if h.check_limits(&Limits { eager: 0, chunk: 0, header: 0, message: 0 }).is_err() {
        return;
    }
    let body = &body[..body.len().min(h.len as usize)];
    for key in [None, Some(b"fuzzing-cluster-key-0123456789ab".to_vec())] {
        let mut s = ServerHandshake::new(1, 0, 16384, 1 << 20, key.clone());
        if s.on_hello(&h, body).is_ok() {
            let _ = s.on_auth(&h, body);
        }
        let (mut c, _) = ClientHandshake::start(
            ServiceLevel::Normal,
            HelloInfo::new(2, 0, 16384, 1 << 20, key.is_some()),
            key,
        );
        let _ = c.on_hello_ack(&h, body);
    }
}

/// The InfiniBand side channel as a stream: frames are cut exactly as the side channel cuts
/// them (handshake-sized limits, handshake kinds only), then fed in order to a server and a
/// client handshake (with and without a cluster key), and `IB_INFO` bodies to the info decoder.
pub fn ib_side(data: &[u8]) {
    let key = Some(b"fuzzing-cluster-key-0123456789ab".to_vec());
    let mut servers = [
        ServerHandshake::new(1, 0, 16384, 1 << 20, None),
        ServerHandshake::new(1, 0, 16384, 1 << 20, key.clone()),
    ];
    let mut clients = [
        ClientHandshake::start(ServiceLevel::Bulk, HelloInfo::new(2, 0, 16384, 1 << 20, false), None).0,
        ClientHandshake::start(ServiceLevel::Bulk, HelloInfo::new(2, 0, 16384, 1 << 20, true), key).0,
    ];
    let side_limits = Limits { eager: 0, chunk: 0, header: 0, message: 0 };
    let mut rest = data;
    while let Some((head, after)) = rest.split_at_checked(HEADER_LEN) {
        let Ok(h) = Header::decode(head) else { return };
        if h.check_limits(&side_limits).is_err() || !h.kind.is_handshake() {
            return;
        }
        let Some((body, after)) = after.split_at_checked(h.len as usize) else { return };
        rest = after;
        match h.kind {
            Kind::Hello => servers.iter_mut().for_each(|s| drop(s.on_hello(&h, body))),
            Kind::Auth => servers.iter_mut().for_each(|s| drop(s.on_auth(&h, body))),
            Kind::HelloAck => clients.iter_mut().for_each(|c| drop(c.on_hello_ack(&h, body))),
            #[cfg(target_os = "linux")]
            Kind::IbInfo => crate::ib::engine::fuzz_decoders(body),
            _ => {}
        }
    }
}

/// Bytes the [`tcp_session`] server exposes for reading and writing.
const SESSION_EXPOSED: usize = 64 << 10;

/// The [`tcp_session`] server: its address and its exposure.
struct Session {
    addr: SocketAddr,
    exposed: MemHandle,
}

/// A TCP server endpoint for [`tcp_session`], shared by every run in the process, with a
/// thread that takes whatever it delivers (so nothing accumulates between runs). Its socket
/// buffers and transmit bound are small and its stall timeout short, so a few gets from a
/// client that does not read hold it at the bound: paused, read again as the client reads, or
/// the client dropped.
fn session_server() -> &'static Session {
    static SERVER: OnceLock<(Endpoint, Session)> = OnceLock::new();
    let (_, session) = SERVER.get_or_init(|| {
        let cfg = Config::default()
            .progress_thread(true)
            .wait_mode(WaitMode::Block)
            .socket_buffer(16 << 10)
            .transmit_bytes_per_peer(64 << 10)
            .stall_timeout(Duration::from_millis(100));
        let ep = Endpoint::bind("tcp://127.0.0.1:0", cfg).expect("fuzz server binds");
        let addr = ep.local_addr().expect("bound").resolve().expect("ip address")[0];
        let exposure = ep
            .expose(ep.alloc(SESSION_EXPOSED).expect("pool buffer"), crate::types::Access::READ_WRITE)
            .expect("exposure");
        let exposed = exposure.handle();
        // Lives as long as the process: the exposure stays registered.
        std::mem::forget(exposure);
        let drain = ep.clone();
        std::thread::spawn(move || {
            let mut pulls: Vec<(Request, OpId)> = Vec::new();
            loop {
                while let Ok(Some(_)) = drain.recv_unexpected(Some(Duration::ZERO)) {}
                // A small OUT payload is pulled into a scatter list, so hostile pulled and
                // streamed bytes reach the multi-piece direct reads; dropping any other request
                // unanswered sends the client an error reply.
                while let Ok(Some(req)) = drain.next_request(Some(Duration::ZERO)) {
                    if let Some(op) = pull_in_pieces(&req) {
                        pulls.push((req, op));
                    }
                }
                // Answer each pull once it is over, done or failed (a completion taken by
                // `wait_any` below leaves `test` nothing to find: over as well).
                for (req, op) in std::mem::take(&mut pulls) {
                    match drain.test(op) {
                        Ok(None) => pulls.push((req, op)),
                        _ => {
                            let _ = req.reply(Bytes::new());
                        }
                    }
                }
                while let Ok(Some(_)) = drain.wait_any(Some(Duration::from_millis(1))) {}
            }
        });
        (ep, Session { addr, exposed })
    });
    session
}

/// The input with its PUT and GET frames whose key has the top bit clear aimed at the server's
/// exposure (its key, its address plus the frame's offset modulo its length; the length as
/// the input has it), so hostile one-sided accesses reach real memory, in bounds and beyond.
/// Frames are followed as long as their headers decode; the rest goes as it is.
fn aim_at_exposure(data: &[u8], x: &MemHandle) -> Vec<u8> {
    let mut out = data.to_vec();
    let mut at = 0;
    while let Some(raw) = out.get(at..at + HEADER_LEN) {
        let Ok(mut h) = Header::decode(raw) else { break };
        if matches!(h.kind, Kind::Put | Kind::Get) && h.b >> 63 == 0 {
            h.b = x.key;
            h.c = x.addr + h.c % SESSION_EXPOSED as u64;
            out[at..at + HEADER_LEN].copy_from_slice(&h.encode());
        }
        at += HEADER_LEN + h.len as usize;
    }
    out
}

/// The largest OUT payload the [`tcp_session`] server pulls (in uneven pieces); larger ones get
/// an error reply.
const SESSION_PULL_MAX: u64 = 256 << 10;

/// Pulls a request's whole OUT payload, up to [`SESSION_PULL_MAX`], into a list of three uneven
/// pieces.
fn pull_in_pieces(req: &Request) -> Option<OpId> {
    let n = req.payload_len();
    if req.direction() != Direction::Out || n == 0 || n > SESSION_PULL_MAX {
        return None;
    }
    let n = n as usize;
    let cuts = [n / 5, n / 2, n];
    let mut at = 0;
    let list: Vec<BytesMut> = cuts
        .iter()
        .map(|&end| {
            let piece = BytesMut::zeroed(end - at);
            at = end;
            piece
        })
        .collect();
    req.pull_into(RecvBuf::List(list), 0).ok()
}

/// Frames after an honest keyless handshake, on a live server: the whole TCP receive path
/// (rendezvous, requests, pulls and pushes, put/get against a live exposure) sees them. The
/// client reads nothing until it has written everything, through a small receive buffer, so
/// answers back up at the server (see `session_server`). The run ends when the server has
/// read everything and closed or answered EOF, or dropped the client, so each input is
/// processed completely before the next. A panic on the server's progress thread aborts the
/// fuzzer like one here.
pub fn tcp_session(data: &[u8]) {
    // One endpoint id for every run: each connection supersedes the last instead of adding a
    // peer to the server's table.
    const EID: u64 = 0x1f0e_d00d;
    let session = session_server();
    let Ok(sock) = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None) else { return };
    let _ = sock.set_recv_buffer_size(8 << 10);
    if sock.connect(&session.addr.into()).is_err() {
        return;
    }
    let mut s = TcpStream::from(sock);
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.set_nodelay(true);
    let mut hello = Header::new(Kind::Hello, ServiceLevel::Normal);
    hello.a = EID;
    hello.len = 46;
    let mut out = hello.encode().to_vec();
    out.extend_from_slice(&[0u8; 32 + 2]); // nonce, listen port (none)
    out.extend_from_slice(&16384u32.to_le_bytes()); // eager limit
    out.extend_from_slice(&(64u64 << 20).to_le_bytes()); // largest message
    let mut auth = Header::new(Kind::Auth, ServiceLevel::Normal);
    auth.a = EID;
    if s.write_all(&out).is_err() || read_frame(&mut s).is_none() {
        return;
    }
    if s.write_all(&auth.encode()).is_err() || read_frame(&mut s).map(|h| h.kind) != Some(Kind::Ready) {
        return;
    }
    let _ = s.write_all(&aim_at_exposure(data, &session.exposed));
    let _ = s.shutdown(Shutdown::Write);
    // Whatever the server answers, until it closes (on a protocol error or on our EOF).
    let mut sink = [0u8; 4096];
    while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
    // No TIME_WAIT: millions of runs must not exhaust the ephemeral ports.
    let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
}

fn read_frame(s: &mut TcpStream) -> Option<Header> {
    let mut head = [0u8; HEADER_LEN];
    s.read_exact(&mut head).ok()?;
    let h = Header::decode(&head).ok()?;
    let mut body = vec![0u8; (h.len as usize).min(wire::MAX_HANDSHAKE_PAYLOAD)];
    s.read_exact(&mut body).ok()?;
    Some(h)
}

/// Memory handles carried inside requests.
pub fn mem_handle(data: &[u8]) {
    if let Ok(h) = MemHandle::from_bytes(data) {
        assert_eq!(&h.to_bytes()[..], data, "handle round trip");
    }
}

/// InfiniBand engine messages (prefix + header + payload), segment lists, and the side-channel
/// queue-pair information.
#[cfg(target_os = "linux")]
pub fn ib_message(data: &[u8]) {
    crate::ib::engine::fuzz_decoders(data);
}

/// Ids for benchmarks of the sans-IO matcher (`benches/matching.rs`): peer and operation ids
/// are otherwise only minted by an endpoint.
pub fn ids(peer: u32, op: u64) -> (crate::types::PeerId, crate::types::OpId) {
    (crate::types::PeerId(u64::from(peer)), crate::types::OpId(op))
}
