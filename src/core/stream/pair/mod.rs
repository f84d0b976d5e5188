//! Two sessions, a client and a server endpoint, joined by in-memory byte queues on a virtual
//! clock: the whole protocol, handshake included, with no socket and no real time, so every
//! test here is fast and deterministic. A step moves at most `chunk` bytes per read or write,
//! so frames arrive in pieces, and each queue holds at most `capacity` bytes, so writers are
//! refused and resumed as a socket would.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::backend::{Cmd, GetCmd, PullCmd, PushCmd, RecvCmd, ReplyCmd, RequestCmd, SendCmd};
use crate::buffers::buf::{OpBuf, RecvBuf, SendBuf};
use crate::comm::{Mechanism, Origin};
use crate::completions::Completions;
use crate::config::Config;
use crate::error::Error;
use crate::op::{Completion, Direction, Payload, RequestMeta, Unexpected, status};
use crate::types::{OpId, PeerId, ServiceLevel, Tag};

use super::link::RecvInto;
use super::{Action, Delivery, IoVec, LinkId, Session, Settings};

mod parking;

const SERVER_ADDR: &str = "10.0.0.2:7000";

/// One end of the pair.
struct End {
    s: Session,
    done: Vec<Completion>,
    unexpected: VecDeque<Unexpected>,
    requests: VecDeque<RequestMeta>,
    /// Does not read its links (a peer that asks without reading the answers).
    deaf: bool,
}

impl End {
    fn new(now: Instant, cfg: &Config, id: u64, listen_port: u16) -> End {
        let core = Arc::new(Completions::default());
        End {
            s: Session::new(now, Settings::new(cfg, id, listen_port), core),
            done: Vec::new(),
            unexpected: VecDeque::new(),
            requests: VecDeque::new(),
            deaf: false,
        }
    }

    fn collect(&mut self) {
        self.done.extend(self.s.ops.take_done());
        for d in self.s.delivered.drain(..) {
            match d {
                Delivery::Unexpected(u) => self.unexpected.push_back(u),
                Delivery::Request(r) => self.requests.push_back(r),
                Delivery::PeerGone(p) => self.requests.retain(|r| r.peer != p),
            }
        }
    }
}

/// One byte stream each way between a client link and a server link.
struct Wire {
    client: LinkId,
    server: LinkId,
    /// Bytes in flight: client to server, server to client.
    up: VecDeque<u8>,
    down: VecDeque<u8>,
    /// The side that closed it (its peer reads what is left, then the end of the stream).
    client_closed: bool,
    server_closed: bool,
}

/// The pair and its clock.
struct Pair {
    client: End,
    server: End,
    wires: Vec<Wire>,
    now: Instant,
    /// Bytes moved per read or write at most.
    chunk: usize,
    /// Bytes a queue holds at most.
    capacity: usize,
    /// Dials the server does not answer: their bytes go nowhere.
    black_hole: bool,
    next_op: u64,
}

impl Pair {
    fn new(cfg: Config) -> Pair {
        Pair::with(cfg.clone(), cfg)
    }

    fn with(client: Config, server: Config) -> Pair {
        let now = Instant::now();
        Pair {
            client: End::new(now, &client, 1, 0),
            server: End::new(now, &server, 2, 7000),
            wires: Vec::new(),
            now,
            chunk: usize::MAX,
            capacity: 1 << 20,
            black_hole: false,
            next_op: 0,
        }
    }

    fn server_addr() -> SocketAddr {
        SERVER_ADDR.parse().unwrap()
    }

    /// The client's peer for the server.
    fn connect(&mut self) -> PeerId {
        self.client.s.connect(Pair::server_addr()).unwrap()
    }

    fn post(&mut self, client: bool, cmd: Cmd) -> OpId {
        self.next_op += 1;
        let op = OpId(self.next_op);
        let end = if client { &mut self.client } else { &mut self.server };
        // An eager send on an idle link goes out at once, as the TCP driver sends it: as much
        // as the link takes now, the rest queued.
        if let Some(e) = end.s.eager_now(&cmd) {
            let n = match self.wires.iter_mut().find(|w| if client { w.client } else { w.server } == e.link) {
                Some(w) if !(w.client_closed || w.server_closed) => {
                    let q = if client { &mut w.up } else { &mut w.down };
                    let room = self.capacity.saturating_sub(q.len()).min(self.chunk);
                    let mut iov = IoVec::default();
                    e.slices(&cmd, &mut iov);
                    let mut n = 0;
                    for s in iov.slices() {
                        let take = s.len().min(room - n);
                        q.extend(&s[..take]);
                        n += take;
                    }
                    n
                }
                _ => 0,
            };
            end.s.eager_written(op, cmd, e, n);
            return op;
        }
        end.s.post(op, cmd).expect("posted");
        op
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// Moves bytes and runs both sessions until nothing changes.
    fn drive(&mut self) {
        for _ in 0..10_000 {
            if !self.step() {
                return;
            }
        }
        panic!("the pair never settled");
    }

    /// One round; returns whether anything moved.
    fn step(&mut self) -> bool {
        let mut moved = self.apply_actions();
        // Reads first, so that what they queue is written in the same round.
        for i in 0..self.wires.len() {
            moved |= self.read(i, true);
            moved |= self.read(i, false);
            moved |= self.write(i, true);
            moved |= self.write(i, false);
        }
        moved |= self.apply_actions();
        let now = self.now;
        self.client.s.handle_timeout(now);
        self.server.s.handle_timeout(now);
        moved |= self.apply_actions();
        self.client.collect();
        self.server.collect();
        moved
    }

    fn apply_actions(&mut self) -> bool {
        let mut any = false;
        while let Some(a) = self.client.s.poll_action() {
            any = true;
            match a {
                Action::Dial { link, addr, .. } => {
                    assert_eq!(addr, Pair::server_addr());
                    self.client.s.dial_started(self.now, link);
                    if self.black_hole {
                        continue;
                    }
                    let server = self.server.s.new_link_id();
                    let remote: SocketAddr = format!("10.0.0.1:{}", 40000 + link.0).parse().unwrap();
                    self.server.s.accepted(server, remote);
                    self.server.s.admit(self.now, server);
                    self.wires.push(Wire {
                        client: link,
                        server,
                        up: VecDeque::new(),
                        down: VecDeque::new(),
                        client_closed: false,
                        server_closed: false,
                    });
                    self.client.s.link_up(self.now, link);
                    self.client.s.link_writable(link);
                }
                Action::Close { link, farewell } => {
                    if let Some(w) = self.wires.iter_mut().find(|w| w.client == link) {
                        w.up.extend(farewell.iter().flatten());
                        w.client_closed = true;
                    }
                }
                Action::Classify { .. } | Action::Resume { .. } => {}
            }
        }
        while let Some(a) = self.server.s.poll_action() {
            any = true;
            if let Action::Close { link, farewell } = a
                && let Some(w) = self.wires.iter_mut().find(|w| w.server == link)
            {
                w.down.extend(farewell.iter().flatten());
                w.server_closed = true;
            }
        }
        any
    }

    fn write(&mut self, i: usize, client: bool) -> bool {
        let (end, w) = if client {
            (&mut self.client, &mut self.wires[i])
        } else {
            (&mut self.server, &mut self.wires[i])
        };
        let (link, q, closed) = if client {
            (w.client, &mut w.up, w.client_closed || w.server_closed)
        } else {
            (w.server, &mut w.down, w.server_closed || w.client_closed)
        };
        if closed {
            return false;
        }
        let room = self.capacity.saturating_sub(q.len()).min(self.chunk);
        let mut iov = IoVec::default();
        if !end.s.transmit(link, &mut iov) {
            return false;
        }
        if room == 0 {
            drop(iov);
            end.s.transmit_blocked(link);
            return false;
        }
        {
            let mut n = 0;
            for s in iov.slices() {
                let take = s.len().min(room - n);
                q.extend(&s[..take]);
                n += take;
                if n == room {
                    break;
                }
            }
            drop(iov);
            end.s.transmitted(link, n);
        }
        true
    }

    fn read(&mut self, i: usize, client: bool) -> bool {
        let chunk = self.chunk;
        let (end, w) = if client {
            (&mut self.client, &mut self.wires[i])
        } else {
            (&mut self.server, &mut self.wires[i])
        };
        if end.deaf {
            return false;
        }
        let (link, q, eof, mine_closed) = if client {
            (w.client, &mut w.down, w.server_closed, w.client_closed)
        } else {
            (w.server, &mut w.up, w.client_closed, w.server_closed)
        };
        if mine_closed {
            return false;
        }
        let was_full = q.len() >= self.capacity;
        let mut moved = false;
        // One read a round.
        {
            let n = match end.s.recv_buffers(link) {
                RecvInto::Paused => return false,
                RecvInto::Staging(buf) => fill(&mut [buf], q, chunk),
                RecvInto::Direct(mut iov) => {
                    let mut bufs: Vec<&mut [u8]> = iov.iter_mut().map(|s| &mut **s).collect();
                    fill(&mut bufs, q, chunk)
                }
            };
            end.s.received(link, n);
            if n == 0 {
                if eof && q.is_empty() {
                    end.s.link_failed(link, "connection closed by peer".into());
                    if client {
                        w.client_closed = true;
                    } else {
                        w.server_closed = true;
                    }
                    moved = true;
                }
            } else {
                moved = true;
            }
        }
        if was_full && q.len() < self.capacity {
            // The writer on the other end was refused: it may write again.
            let (other, link) =
                if client { (&mut self.server, w.server) } else { (&mut self.client, w.client) };
            other.s.link_writable(link);
        }
        moved
    }

    /// Cuts every wire: both ends see their stream break.
    fn cut(&mut self) {
        for w in &mut self.wires {
            if !w.client_closed {
                self.client.s.link_failed(w.client, "connection reset".into());
            }
            if !w.server_closed {
                self.server.s.link_failed(w.server, "connection reset".into());
            }
            w.client_closed = true;
            w.server_closed = true;
            w.up.clear();
            w.down.clear();
        }
    }

    fn take(&mut self, client: bool, op: OpId) -> Completion {
        let end = if client { &mut self.client } else { &mut self.server };
        let i = end.done.iter().position(|c| c.op == op).unwrap_or_else(|| panic!("{op} not complete"));
        end.done.remove(i)
    }

    fn pending(&self, client: bool, op: OpId) -> bool {
        let end = if client { &self.client } else { &self.server };
        !end.done.iter().any(|c| c.op == op)
    }
}

/// Copies up to `chunk` queued bytes into `bufs`, in order.
fn fill(bufs: &mut [&mut [u8]], q: &mut VecDeque<u8>, chunk: usize) -> usize {
    let mut n = 0;
    for b in bufs.iter_mut() {
        let take = b.len().min(q.len()).min(chunk - n);
        for (d, s) in b[..take].iter_mut().zip(q.drain(..take)) {
            *d = s;
        }
        n += take;
        if n == chunk || q.is_empty() {
            break;
        }
    }
    n
}

fn send(peer: PeerId, tag: Tag, data: Vec<u8>) -> Cmd {
    Cmd::Send(SendCmd { peer, tag, sl: ServiceLevel::Normal, buf: SendBuf::from(data), unexpected: false })
}

fn recv(peer: PeerId, tag: Tag, cap: usize) -> Cmd {
    Cmd::Recv(RecvCmd { peer, tag, buf: RecvBuf::from(BytesMut::zeroed(cap)) })
}

fn bytes_of(c: &Completion) -> Vec<u8> {
    let n = *c.result.as_ref().expect("succeeded");
    match &c.buf {
        OpBuf::Recv(RecvBuf::Mut(b)) => b[..n].to_vec(),
        other => panic!("not a receive buffer: {other:?}"),
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// The server's id for the client, known once something of the client arrived.
fn client_of(p: &Pair) -> PeerId {
    p.server.s.peers.iter().next().map(|(id, _)| id).expect("the client is known")
}

#[test]
fn tags_match_and_messages_keep_their_order_per_peer_and_class() {
    let mut p = Pair::new(Config::default());
    p.chunk = 7;
    let srv = p.connect();
    let a = p.post(true, send(srv, 1, b"first".to_vec()));
    let b = p.post(true, send(srv, 2, b"other tag".to_vec()));
    let c = p.post(true, send(srv, 1, b"second".to_vec()));
    p.drive();
    let peer = client_of(&p);
    let r1 = p.post(false, recv(peer, 1, 64));
    let r2 = p.post(false, recv(peer, 1, 64));
    let r3 = p.post(false, recv(peer, 2, 64));
    p.drive();
    assert_eq!(bytes_of(&p.take(false, r1)), b"first");
    assert_eq!(bytes_of(&p.take(false, r2)), b"second");
    assert_eq!(bytes_of(&p.take(false, r3)), b"other tag");
    for op in [a, b, c] {
        assert!(p.take(true, op).result.is_ok());
    }
}

#[test]
fn eager_up_to_the_limit_and_rendezvous_above_it_deliver_every_byte() {
    let cfg = Config::default();
    let limit = Settings::new(&cfg, 0, 0).eager_limit;
    for (len, mech) in [
        (limit - 1, Mechanism::Inline),
        (limit, Mechanism::Inline),
        (limit + 1, Mechanism::ServerRdma),
        (3 << 20, Mechanism::ServerRdma),
    ] {
        let mut p = Pair::new(cfg.clone());
        p.chunk = 10_000;
        let srv = p.connect();
        let data = pattern(len, len as u8);
        let s = p.post(true, send(srv, 5, data.clone()));
        p.drive();
        let peer = client_of(&p);
        let r = p.post(false, recv(peer, 5, len));
        p.drive();
        let got = p.take(false, r);
        assert_eq!(got.mechanism, Some(mech), "{len} bytes");
        assert_eq!(bytes_of(&got), data, "{len} bytes");
        let sent = p.take(true, s);
        assert_eq!((sent.result.ok(), sent.mechanism), (Some(len), Some(mech)), "{len} bytes");
    }
}

#[test]
fn a_receive_cancelled_before_its_message_leaves_the_message_to_the_next() {
    let mut p = Pair::new(Config::default());
    let srv = p.connect();
    let hello = p.post(true, send(srv, 9, b"x".to_vec()));
    p.drive();
    p.take(true, hello);
    let peer = client_of(&p);
    let first = p.post(false, recv(peer, 3, 16));
    p.server.s.cancel(first, Error::Cancelled);
    p.drive();
    assert!(matches!(p.take(false, first).result, Err(Error::Cancelled)));
    p.post(true, send(srv, 3, b"kept".to_vec()));
    let second = p.post(false, recv(peer, 3, 16));
    p.drive();
    assert_eq!(bytes_of(&p.take(false, second)), b"kept");
}

#[test]
fn a_receive_cancelled_after_its_rendezvous_matched_fails_once_and_the_body_is_discarded() {
    let mut p = Pair::new(Config::default());
    p.chunk = 4096;
    let srv = p.connect();
    let big = pattern(1 << 20, 1);
    let s = p.post(true, send(srv, 4, big));
    p.drive();
    let peer = client_of(&p);
    let r = p.post(false, recv(peer, 4, 1 << 20));
    // Matched and answered; part of the body is on its way.
    for _ in 0..6 {
        p.step();
    }
    assert!(p.pending(false, r), "still receiving");
    p.server.s.cancel(r, Error::Cancelled);
    p.drive();
    assert!(matches!(p.take(false, r).result, Err(Error::Cancelled)));
    assert!(p.take(true, s).result.is_ok(), "the sender finishes its bytes");
    // The link is still in step: a later message arrives whole.
    let s2 = p.post(true, send(srv, 4, b"after".to_vec()));
    let r2 = p.post(false, recv(peer, 4, 16));
    p.drive();
    assert_eq!(bytes_of(&p.take(false, r2)), b"after");
    assert!(p.take(true, s2).result.is_ok());
    assert!(p.server.done.is_empty() && p.client.done.is_empty(), "each op completed once");
}

/// A request carrying `len` OUT bytes, pulled by the server in two halves, then answered.
fn request_out(cfg: Config, len: usize) -> (Option<Mechanism>, Vec<u8>) {
    let mut p = Pair::new(cfg);
    p.chunk = 8192;
    let srv = p.connect();
    let data = pattern(len, 3);
    let req = p
        .post(true, request(srv, 1, ServiceLevel::Bulk, b"write", Payload::Out(SendBuf::from(data.clone()))));
    p.drive();
    let meta = p.server.requests.pop_front().expect("the request arrived");
    assert_eq!((meta.dir, meta.len, &meta.header[..]), (Direction::Out, len as u64, &b"write"[..]));
    let half = len / 2;
    let mut got = Vec::new();
    for (off, n) in [(0, half), (half, len - half)] {
        let pull = p.post(false, pull(&meta, off as u64, n));
        p.drive();
        got.extend(bytes_of(&p.take(false, pull)));
    }
    let reply = p.post(
        false,
        Cmd::Reply(ReplyCmd {
            peer: meta.peer,
            req: meta.id,
            sl: meta.sl,
            header: Bytes::from_static(b"ok"),
            status: status::OK,
        }),
    );
    p.drive();
    assert!(p.take(false, reply).result.is_ok());
    let done = p.take(true, req);
    assert_eq!(done.result.as_ref().ok(), Some(&len));
    assert_eq!(done.reply.as_deref(), Some(&b"ok"[..]));
    assert_eq!(got, data);
    (done.mechanism, got)
}

#[test]
fn a_request_payload_goes_inline_streamed_or_pulled() {
    assert_eq!(request_out(Config::default(), 1000).0, Some(Mechanism::Inline));
    assert_eq!(request_out(Config::default(), 3 << 20).0, Some(Mechanism::ServerRdma));
    let pulled = Config { stream_requests: false, ..Config::default() };
    assert_eq!(request_out(pulled, 3 << 20).0, Some(Mechanism::ServerRdma));
}

#[test]
fn a_request_in_payload_is_pushed_into_the_clients_buffer() {
    let mut p = Pair::new(Config::default());
    let srv = p.connect();
    let len = 200_000;
    let req = p.post(
        true,
        request(srv, 2, ServiceLevel::Normal, b"read", Payload::In(RecvBuf::from(BytesMut::zeroed(len)))),
    );
    p.drive();
    let meta = p.server.requests.pop_front().expect("the request arrived");
    assert_eq!(meta.dir, Direction::In);
    let data = pattern(len, 9);
    let push = p.post(
        false,
        Cmd::Push(PushCmd {
            peer: meta.peer,
            req: meta.id,
            sl: meta.sl,
            offset: 0,
            buf: SendBuf::from(data.clone()),
        }),
    );
    let reply = p.post(false, reply(&meta));
    p.drive();
    assert!(p.take(false, push).result.is_ok() && p.take(false, reply).result.is_ok());
    let done = p.take(true, req);
    assert_eq!(bytes_of(&done), data);
}

#[test]
fn a_lost_peer_fails_every_operation_on_it_once() {
    let mut p = Pair::new(Config::default());
    p.chunk = 4096;
    let srv = p.connect();
    let big = p.post(true, send(srv, 1, pattern(2 << 20, 0)));
    let waiting = p.post(true, recv(srv, 7, 16));
    p.drive();
    let peer = client_of(&p);
    let r = p.post(false, recv(peer, 1, 2 << 20));
    for _ in 0..8 {
        p.step();
    }
    assert!(p.pending(false, r), "cut mid-transfer");
    p.cut();
    p.drive();
    for op in [big, waiting] {
        assert!(matches!(p.take(true, op).result, Err(Error::PeerLost { .. })), "{op}");
    }
    assert!(matches!(p.take(false, r).result, Err(Error::PeerLost { .. })));
    assert!(p.client.done.is_empty() && p.server.done.is_empty(), "each failed once");
}

#[test]
fn unexpected_messages_past_the_budget_stop_reading_until_taken() {
    let cfg = Config { unexpected_per_peer: 4, ..Config::default() };
    let mut p = Pair::new(cfg);
    // Small reads, so that what the server does not read stays on the link.
    p.chunk = 150;
    let srv = p.connect();
    for i in 0..10u8 {
        let cmd = Cmd::Send(SendCmd {
            peer: srv,
            tag: 0,
            sl: ServiceLevel::Normal,
            buf: SendBuf::from(vec![i; 100]),
            unexpected: true,
        });
        p.post(true, cmd);
    }
    p.drive();
    assert_eq!(p.server.unexpected.len(), 4, "held to the budget");
    assert!(!p.wires[0].up.is_empty(), "the rest waits on the link, unread");
    let mut seen = Vec::new();
    while seen.len() < 10 {
        let u = p.server.unexpected.pop_front().expect("more arrive as they are taken");
        seen.push(u.data[0]);
        p.server.s.unexpected_taken(u.peer, u.data.len());
        p.drive();
        assert!(p.server.unexpected.len() <= 4);
    }
    assert_eq!(seen, (0..10).collect::<Vec<u8>>());
}

#[test]
fn a_peer_that_reads_no_answers_is_paused_at_the_transmit_bound_then_dropped() {
    let server = Config {
        transmit_bytes_per_peer: 64 << 10,
        stall_timeout: Duration::from_secs(2),
        ..Config::default()
    };
    let mut p = Pair::with(Config::default(), server);
    p.capacity = 16 << 10;
    let srv = p.connect();
    let pool = crate::buffers::buf::BufPool::new(1 << 20, 1 << 20);
    let exposed = p.server.s.exposures.insert(pool.alloc(32 << 10).unwrap(), crate::types::Access::READ, 0);
    let hello = p.post(true, send(srv, 0, b"hi".to_vec()));
    p.drive();
    p.take(true, hello);
    p.client.deaf = true;
    let mut gets = Vec::new();
    for _ in 0..8 {
        let local = RecvBuf::from(BytesMut::zeroed(32 << 10));
        gets.push(
            p.post(true, Cmd::Get(GetCmd { peer: srv, sl: ServiceLevel::Normal, local, remote: exposed })),
        );
    }
    p.drive();
    assert_eq!(p.server.s.tx_paused.len(), 1, "paused at the bound");
    let queued = p.server.s.peers.iter().map(|(_, q)| q.d.tx_bytes).sum::<usize>();
    assert!(queued < (64 << 10) + (32 << 10) + 1024, "bounded: {queued} bytes queued");
    p.advance(Duration::from_secs(1));
    p.drive();
    assert_eq!(p.server.s.peers.len(), 1, "not yet");
    p.advance(Duration::from_millis(1100));
    p.drive();
    assert!(p.server.s.tx_paused.is_empty());
    assert!(p.wires[0].server_closed, "the stalled peer was dropped");
}

#[test]
fn a_dial_the_server_never_answers_fails_at_the_handshake_deadline() {
    let cfg = Config { handshake_timeout: Duration::from_secs(3), ..Config::default() };
    let mut p = Pair::new(cfg);
    p.black_hole = true;
    let srv = p.connect();
    let s = p.post(true, send(srv, 1, b"lost".to_vec()));
    p.drive();
    p.advance(Duration::from_secs(2));
    p.drive();
    assert!(p.pending(true, s));
    p.advance(Duration::from_secs(20));
    p.drive();
    let r = p.take(true, s).result;
    assert!(matches!(r, Err(Error::PeerLost { .. })), "{r:?}");
}

#[test]
fn a_silent_accepted_connection_is_dropped_at_the_handshake_deadline() {
    let cfg = Config { handshake_timeout: Duration::from_secs(3), ..Config::default() };
    let mut p = Pair::new(cfg);
    let link = p.server.s.new_link_id();
    p.server.s.accepted(link, "10.0.0.9:1234".parse().unwrap());
    p.server.s.admit(p.now, link);
    assert_eq!(p.server.s.admission.len(), 1);
    p.advance(Duration::from_secs(4));
    p.drive();
    assert_eq!((p.server.s.admission.len(), p.server.s.link_count()), (0, 0));
}

#[test]
fn the_default_eager_limit_is_what_the_receiver_can_buffer() {
    let d = Settings::new(&Config::default(), 0, 0);
    assert_eq!((d.eager_limit, d.eager_origin), (crate::comm::TCP_EAGER_MAX, Origin::TransportDefault));
    let small = Settings::new(&Config::default().early_bytes_per_peer(128 << 10), 0, 0);
    assert_eq!((small.eager_limit, small.eager_origin), (16 << 10, Origin::ReceiveBudget));
    for sl in ServiceLevel::ALL {
        assert_eq!(small.policy.thresholds(sl).inline_max, 16 << 10, "the table follows the budget");
    }
    let set = Settings::new(&Config::default().eager_limit(8 << 10), 0, 0);
    assert_eq!((set.eager_limit, set.eager_origin), (8 << 10, Origin::Application));
}

#[test]
fn a_connection_sends_eagerly_only_up_to_the_smaller_end_s_limit() {
    // The server buffers less, so it advertises a lower limit than the client would use. The
    // sends are posted before the handshake tells the client so, as an application posts
    // right after `connect`.
    let (server_cfg, server_limit) = thrifty_server();
    assert!(server_limit < Settings::new(&Config::default(), 0, 0).eager_limit);
    for (len, mech) in [(server_limit, Mechanism::Inline), (server_limit + 1, Mechanism::ServerRdma)] {
        let mut p = Pair::with(Config::default(), server_cfg.clone());
        let srv = p.connect();
        let data = pattern(len, 3);
        let s = p.post(true, send(srv, 5, data.clone()));
        p.drive();
        let peer = client_of(&p);
        let r = p.post(false, recv(peer, 5, len));
        p.drive();
        let got = p.take(false, r);
        assert_eq!((got.mechanism, bytes_of(&got)), (Some(mech), data), "{len} bytes");
        assert_eq!(p.take(true, s).mechanism, Some(mech), "{len} bytes");
    }
}

/// A server that buffers less than the client's eager limit, and its limit.
fn thrifty_server() -> (Config, usize) {
    let cfg = Config::default().early_bytes_per_peer(128 << 10);
    let limit = Settings::new(&cfg, 0, 0).eager_limit;
    (cfg, limit)
}

#[test]
fn a_request_posted_before_the_handshake_carries_inline_only_what_the_server_accepts() {
    // Its OUT payload would have gone inline by the client's limit; it goes as a payload the
    // server pulls.
    let (server_cfg, server_limit) = thrifty_server();
    let mut p = Pair::with(Config::default(), server_cfg);
    let srv = p.connect();
    let data = pattern(server_limit + 1, 9);
    let payload = Payload::Out(SendBuf::from(data.clone()));
    let rq = p.post(true, request(srv, 4, ServiceLevel::Normal, b"w", payload));
    p.drive();
    let meta = p.server.requests.pop_front().expect("the request arrived");
    assert_eq!(meta.len, data.len() as u64);
    let pull = p.post(false, pull(&meta, 0, data.len()));
    p.drive();
    assert_eq!(bytes_of(&p.take(false, pull)), data);
    p.post(false, reply(&meta));
    p.drive();
    assert!(p.take(true, rq).result.is_ok());
}

#[test]
fn an_unexpected_message_above_the_server_s_limit_fails_at_the_client_and_the_connection_stays() {
    let (server_cfg, server_limit) = thrifty_server();
    for handshake_first in [false, true] {
        let mut p = Pair::with(Config::default(), server_cfg.clone());
        let srv = p.connect();
        if handshake_first {
            p.drive();
        }
        let unexpected = |len: usize| {
            Cmd::Send(SendCmd {
                peer: srv,
                tag: 1,
                sl: ServiceLevel::Normal,
                buf: SendBuf::from(pattern(len, 1)),
                unexpected: true,
            })
        };
        let big = p.post(true, unexpected(server_limit + 1));
        let fits = p.post(true, unexpected(server_limit));
        p.drive();
        assert!(
            matches!(p.take(true, big).result, Err(Error::TooLarge { .. })),
            "handshake first: {handshake_first}"
        );
        assert_eq!(p.take(true, fits).result.ok(), Some(server_limit));
        assert_eq!(p.server.unexpected.pop_front().map(|u| u.data.len()), Some(server_limit));
    }
}

/// A read request of `cap` bytes, the server's view of it once it arrived.
fn read_request(p: &mut Pair, srv: PeerId, cap: usize) -> (OpId, RequestMeta) {
    let req = p.post(
        true,
        request(srv, 2, ServiceLevel::Normal, b"read", Payload::In(RecvBuf::from(BytesMut::zeroed(cap)))),
    );
    p.drive();
    (req, p.server.requests.pop_front().expect("the request arrived"))
}

fn push(meta: &RequestMeta, offset: u64, data: Vec<u8>) -> Cmd {
    Cmd::Push(PushCmd { peer: meta.peer, req: meta.id, sl: meta.sl, offset, buf: SendBuf::from(data) })
}

fn reply(meta: &RequestMeta) -> Cmd {
    Cmd::Reply(ReplyCmd {
        peer: meta.peer,
        req: meta.id,
        sl: meta.sl,
        header: Bytes::new(),
        status: status::OK,
    })
}

fn request(peer: PeerId, tag: Tag, sl: ServiceLevel, header: &'static [u8], payload: Payload) -> Cmd {
    Cmd::Request(RequestCmd { peer, tag, sl, header: Bytes::from_static(header), payload })
}

/// A pull of `len` bytes at `offset` of `meta`'s OUT payload into a fresh buffer.
fn pull(meta: &RequestMeta, offset: u64, len: usize) -> Cmd {
    Cmd::Pull(PullCmd {
        peer: meta.peer,
        req: meta.id,
        sl: meta.sl,
        offset,
        buf: RecvBuf::from(BytesMut::zeroed(len)),
    })
}

#[test]
fn a_cancelled_request_tells_its_server_which_then_moves_no_bytes_for_it() {
    let mut p = Pair::new(Config::default());
    let srv = p.connect();
    let (req, meta) = read_request(&mut p, srv, 100_000);
    assert!(!p.server.s.request_cancelled(meta.peer, meta.id));
    p.client.s.cancel(req, Error::Cancelled);
    p.drive();
    assert!(p.server.s.request_cancelled(meta.peer, meta.id), "the notice reached the server");
    assert!(matches!(p.take(true, req).result, Err(Error::Cancelled)));
    let pu = p.post(false, push(&meta, 0, pattern(50_000, 1)));
    assert!(!p.server.s.wants_transmit(), "the push queued nothing");
    let re = p.post(false, reply(&meta));
    p.drive();
    assert!(matches!(p.take(false, pu).result, Err(Error::PeerCancelled)));
    assert!(matches!(p.take(false, re).result, Err(Error::PeerCancelled)));
    assert_eq!(p.server.s.sreqs.len(), 0, "the request is closed");
    // The bare reply that still went lets the client forget the request.
    assert!(p.client.s.peers.get(srv).is_some_and(|c| c.cancelled_reqs.is_empty()), "client forgot it");
    assert!(!p.server.s.request_cancelled(meta.peer, meta.id), "an answered request is not open");
    // Exactly once on both sides, and the connection goes on.
    assert!(p.client.done.is_empty() && p.server.done.is_empty());
    let (req, meta) = read_request(&mut p, srv, 10);
    p.post(false, push(&meta, 0, pattern(10, 2)));
    p.post(false, reply(&meta));
    p.drive();
    assert_eq!(bytes_of(&p.take(true, req)), pattern(10, 2));
}

#[test]
fn cancel_notices_for_unknown_or_answered_requests_are_ignored() {
    use crate::wire::{Header, Kind};
    let mut p = Pair::new(Config::default());
    let srv = p.connect();
    let (req, meta) = read_request(&mut p, srv, 16);
    p.post(false, reply(&meta));
    p.drive();
    assert!(p.take(true, req).result.is_ok());
    p.server.done.clear();
    // A peer sends notices for the request just answered, for ids it never used and for the
    // extremes, on the connection the request came by.
    assert_eq!(p.wires.len(), 1, "one connection");
    let w = 0;
    for id in [meta.id, meta.id + 1, 0, u64::MAX, 1 << 40] {
        let mut h = Header::new(Kind::CancelRequest, ServiceLevel::Normal);
        h.b = id;
        p.wires[w].up.extend(h.encode());
    }
    p.drive();
    assert_eq!(p.server.s.sreqs.len(), 0, "no request opened or kept");
    assert!(p.server.done.is_empty() && p.server.requests.is_empty(), "nothing completed or delivered");
    assert_eq!(p.server.s.link_count(), p.wires.len(), "the connection stands");
    // A request after them is served normally and is not cancelled.
    let (req, meta) = read_request(&mut p, srv, 16);
    assert!(!p.server.s.request_cancelled(meta.peer, meta.id));
    p.post(false, push(&meta, 0, pattern(16, 4)));
    p.post(false, reply(&meta));
    p.drive();
    assert_eq!(bytes_of(&p.take(true, req)), pattern(16, 4));
}

/// A streamed payload the server does not pull stops its connection at the first byte no pull
/// covers, with more of it in the socket: a notice behind those bytes would never be read. The
/// cancel still reaches the server, which then reads through the rest into the void, and the
/// connection serves the next request.
#[test]
fn a_cancel_reaches_a_server_stalled_in_the_requests_streamed_payload() {
    let mut p = Pair::new(Config::default());
    p.chunk = 64 << 10;
    p.capacity = 256 << 10;
    let srv = p.connect();
    let len = 3 << 20;
    let req = p.post(
        true,
        request(srv, 1, ServiceLevel::Bulk, b"write", Payload::Out(SendBuf::from(pattern(len, 1)))),
    );
    p.drive();
    let meta = p.server.requests.pop_front().expect("the request arrived");
    assert!(p.wires.iter().any(|w| !w.up.is_empty()), "payload bytes wait unread");
    p.client.s.cancel(req, Error::Cancelled);
    p.drive();
    assert!(p.server.s.request_cancelled(meta.peer, meta.id), "the notice got past the payload");
    assert!(p.wires.iter().all(|w| w.up.is_empty()), "the server read through the rest, unpulled");
    let pull = p.post(false, pull(&meta, 0, len));
    let re = p.post(false, reply(&meta));
    p.drive();
    assert!(matches!(p.take(false, pull).result, Err(Error::PeerCancelled)));
    assert!(matches!(p.take(false, re).result, Err(Error::PeerCancelled)));
    assert!(matches!(p.take(true, req).result, Err(Error::Cancelled)));
    // The connection goes on.
    let again = p.post(true, request(srv, 1, ServiceLevel::Bulk, b"again", Payload::None));
    p.drive();
    let meta = p.server.requests.pop_front().expect("the next request arrived");
    p.post(false, reply(&meta));
    p.drive();
    assert!(p.take(true, again).result.is_ok());
}
