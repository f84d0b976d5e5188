//! The rules of a reply on tables the test owns: no device, no connection, no clock.

use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::BytesMut;

use super::*;
use crate::buffers::buf::{RecvBuf, RegisteredBuf, SendBuf};
use crate::comm::Mechanism;
use crate::op::OpKind;
use crate::types::ServiceLevel;
use crate::wire::{FLAG_RDV_HEADER, Kind};

use super::super::msg;

const SEG: Segment = Segment { addr: 0x2000, len: 40, rkey: 5 };
const MAX_HEADER: u64 = 64;

/// The tables a reply touches, owned by the test.
struct T {
    ops: Ops,
    peers: Peers<u32, ()>,
    counters: Counters,
    server: PeerId,
    other: PeerId,
}

impl T {
    fn new() -> T {
        let mut peers = Peers::default();
        let server = peers.dialled(([127, 0, 0, 1], 1).into(), 16, || ()).expect("peer");
        let other = peers.dialled(([127, 0, 0, 1], 2).into(), 16, || ()).expect("peer");
        T { ops: Ops::default(), peers, counters: Counters::default(), server, other }
    }

    /// Our request `op` to the server, with an IN buffer of `cap` bytes, in state `st`.
    fn read(&mut self, op: u64, cap: usize, st: OpSt) {
        let buf = OpBuf::Recv(RecvBuf::Mut(BytesMut::zeroed(cap)));
        self.ops.insert(OpId(op), OpKind::Request, self.server, 1, ServiceLevel::Normal, buf, st);
    }

    fn write(&mut self, op: u64, data: &'static [u8]) {
        let buf = OpBuf::Send(SendBuf::Bytes(Bytes::from_static(data)));
        self.ops.insert(
            OpId(op),
            OpKind::Request,
            self.server,
            1,
            ServiceLevel::Normal,
            buf,
            OpSt::WaitReply,
        );
    }

    fn arrived(&mut self, from: PeerId, h: &Header, body: &[u8]) -> Result<ReplyStep, Loss> {
        let cancelled = &mut self.peers[from].cancelled_reqs;
        arrived(&mut self.ops, cancelled, from, h, body.to_vec(), MAX_HEADER)
    }

    fn complete(&mut self, op: u64, st: u32, header: &'static [u8], pushed: u64) {
        let T { ops, peers, counters, .. } = self;
        complete(ops, peers, counters, OpId(op), st, Bytes::from_static(header), pushed);
    }

    /// Completions of `op`: the bytes it reports (or the error) and the reply header.
    fn done(&self, op: u64) -> Vec<Outcome> {
        let got = self.ops.done().iter().filter(|c| c.op == OpId(op));
        got.map(|c| {
            let r = match (&c.buf, &c.result) {
                (OpBuf::Recv(RecvBuf::Mut(b)), Ok(n)) => Ok(b[..*n].to_vec()),
                (_, Ok(n)) => Ok(vec![0; *n]),
                (_, Err(e)) => Err(format!("{e:?}")),
            };
            (r, c.reply.clone())
        })
        .collect()
    }

    fn copied(&self) -> u64 {
        self.counters.host_copy_bytes.load(Ordering::Relaxed)
    }
}

/// A completion as the tests compare it: the bytes or the error, and the reply header kept.
type Outcome = (Result<Vec<u8>, String>, Option<Bytes>);

fn reply(op: u64, pushed: u64) -> Header {
    let mut h = Header::new(Kind::Reply, ServiceLevel::Normal);
    h.b = op;
    h.a = pushed;
    h
}

fn what(r: Result<ReplyStep, Loss>) -> String {
    match r {
        Err(Loss::Protocol(e)) => e.to_string(),
        other => panic!("expected a protocol loss, got {other:?}"),
    }
}

#[test]
fn a_reply_for_no_request_of_its_server_costs_the_server() {
    let mut t = T::new();
    t.read(1, 10, OpSt::WaitReply);
    let (server, other) = (t.server, t.other);
    assert!(what(t.arrived(server, &reply(9, 0), b"")).contains("REPLY for unknown request 9"));
    assert!(
        what(t.arrived(other, &reply(1, 0), b"")).contains("REPLY for unknown request 1"),
        "another peer"
    );
    t.ops.get_mut(&OpId(1)).unwrap().st = OpSt::Moving;
    assert!(what(t.arrived(server, &reply(1, 0), b"")).contains("unknown"), "not waiting for a reply");
    assert!(t.ops.done().is_empty(), "no request completed");
}

#[test]
fn a_reply_for_a_request_cancelled_and_forgotten_goes_once() {
    let mut t = T::new();
    let server = t.server;
    t.peers[server].cancelled_reqs.insert(4);
    assert_eq!(t.arrived(server, &reply(4, 0), b"hdr").unwrap(), ReplyStep::Forget);
    assert!(t.peers[server].cancelled_reqs.is_empty(), "the id is forgotten");
    assert!(what(t.arrived(server, &reply(4, 0), b"")).contains("unknown"), "a second reply");
}

/// The client cannot see the server's RDMA writes: the reply says how far they reach, and a
/// claim beyond the buffer (or any push into a write) is the server's protocol error.
#[test]
fn a_reply_may_claim_pushes_only_within_the_requests_buffer() {
    let mut t = T::new();
    let server = t.server;
    t.read(1, 100, OpSt::WaitReply);
    t.write(2, b"payload");
    assert!(what(t.arrived(server, &reply(1, 101), b"")).contains("beyond the request's buffer"));
    assert!(what(t.arrived(server, &reply(2, 1), b"")).contains("beyond"), "a write has no room");
    let header = Bytes::from_static(b"hi");
    assert_eq!(
        t.arrived(server, &reply(1, 100), b"hi").unwrap(),
        ReplyStep::Complete { op: OpId(1), header }
    );
    assert!(t.ops.done().is_empty(), "completing is the engine's next step");
    t.complete(1, status::OK, b"hi", 100);
    t.complete(2, status::OK, b"", 0);
    assert_eq!(t.done(1), vec![(Ok(vec![0; 100]), Some(Bytes::from_static(b"hi")))]);
    assert_eq!(t.done(2), vec![(Ok(vec![0; 7]), Some(Bytes::new()))], "a write counts its payload");
}

#[test]
fn a_reply_header_by_rendezvous_is_fetched_within_the_header_limit() {
    let mut t = T::new();
    let server = t.server;
    t.read(1, 10, OpSt::WaitReply);
    let mut h = reply(1, 0);
    h.flags = FLAG_RDV_HEADER;
    let mut list = Vec::new();
    msg::encode_segments(&mut list, &[SEG]);
    assert_eq!(
        t.arrived(server, &h, &list).unwrap(),
        ReplyStep::Fetch { op: OpId(1), segs: vec![SEG], len: 40 }
    );
    let mut big = Vec::new();
    msg::encode_segments(&mut big, &[Segment { len: MAX_HEADER as u32 + 1, ..SEG }]);
    assert!(what(t.arrived(server, &h, &big)).contains("segments"), "beyond the largest header");
    list.push(0);
    assert!(what(t.arrived(server, &h, &list)).contains("trailing"));
    assert!(t.ops.done().is_empty());
}

/// A request cancelled here while the server might still write into it waits for the reply;
/// the reply ends it cancelled, whatever it says, and lets the id go.
#[test]
fn a_reply_ends_a_cancelled_request_cancelled() {
    let mut t = T::new();
    let server = t.server;
    t.read(1, 10, OpSt::Cancelling { until: Instant::now() });
    t.peers[server].cancelled_reqs.insert(1);
    assert!(matches!(t.arrived(server, &reply(1, 10), b"hdr").unwrap(), ReplyStep::Complete { .. }));
    t.complete(1, status::OK, b"hdr", 10);
    assert_eq!(t.done(1), vec![(Err("Cancelled".into()), None)]);
    assert!(t.peers[server].cancelled_reqs.is_empty(), "the id is forgotten");
    assert_eq!(t.copied(), 0, "nothing copied for a cancelled read");
}

#[test]
fn a_failed_status_fails_the_request_with_the_header_as_its_reason() {
    let mut t = T::new();
    t.read(1, 10, OpSt::WaitReply);
    t.ops.get_mut(&OpId(1)).unwrap().x.stage_in = Some(RegisteredBuf::unpooled(10));
    t.complete(1, status::APP + 3, b"nope", 10);
    let done = t.done(1);
    assert_eq!(done.len(), 1);
    assert!(done[0].0.as_ref().is_err_and(|e| e.contains("nope")), "{done:?}");
    assert_eq!(done[0].1, None, "no reply header kept");
    assert_eq!(t.copied(), 0, "a failed read copies nothing out of its staging buffer");
}

/// A read the server wrote into a staging buffer: the pushed bytes, and only those, are copied
/// into the caller's buffer; the read counts the furthest of what its pushes and the reply say.
#[test]
fn a_staged_read_copies_what_the_server_pushed() {
    let mut t = T::new();
    t.read(1, 100, OpSt::WaitReply);
    let mut staged = RegisteredBuf::unpooled(100);
    for (i, b) in staged.iter_mut().enumerate() {
        *b = i as u8;
    }
    let o = t.ops.get_mut(&OpId(1)).unwrap();
    o.x.stage_in = Some(staged);
    o.moved = 20;
    o.mech = Some(Mechanism::ServerRdma);
    t.complete(1, status::OK, b"", 60);
    let want: Vec<u8> = (0..60).collect();
    assert_eq!(t.done(1), vec![(Ok(want), Some(Bytes::new()))]);
    assert_eq!(t.copied(), 60);
    assert_eq!(t.counters.msgs_received.load(Ordering::Relaxed), 1);
}

/// The request may have ended (its deadline) while its reply header was fetched: the reply
/// finds nothing to complete.
#[test]
fn a_reply_for_a_request_already_ended_completes_nothing() {
    let mut t = T::new();
    t.complete(7, status::OK, b"late", 0);
    assert!(t.ops.done().is_empty());
    assert_eq!(t.counters.msgs_received.load(Ordering::Relaxed), 1, "the message still counts");
}
