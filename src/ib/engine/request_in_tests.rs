//! The rules of an arriving request on tables the test owns: no device, no connection, no
//! clock.

use std::cell::Cell;
use std::sync::atomic::Ordering;

use super::*;
use crate::ib::engine::msg::{self, MAX_SEGMENTS};
use crate::wire::{
    FLAG_INLINE_DATA, FLAG_PAYLOAD_IN, FLAG_PAYLOAD_OUT, FLAG_RDV_HEADER, FLAG_SEGMENTS, Kind,
};

const PEER: PeerId = PeerId(3);
const CONN: u32 = 5;
const LIMITS: Limits = Limits { requests: 2, early: 1 << 20, max_header: 16, max_message: 64 };

#[derive(Default)]
struct T {
    budget: Budget,
    counters: Counters,
    sreqs: Requests<IbReq>,
    /// Bodies read out of their buffers.
    reads: Cell<usize>,
}

impl T {
    fn arrived(&mut self, limits: Limits, h: &Header, body: &[u8]) -> Result<RequestStep, Loss> {
        let reads = &self.reads;
        let body = || {
            reads.set(reads.get() + 1);
            Bytes::copy_from_slice(body)
        };
        arrived(&mut self.budget, limits, &self.counters, (PEER, CONN), h, Mechanism::FastRdma, body)
    }

    fn received(&self) -> u64 {
        self.counters.msgs_received.load(Ordering::Relaxed)
    }
}

/// Request `id` with a `aux`-byte header and a `c`-byte payload; `len` its message's body.
fn request(id: u64, flags: u8, aux: u32, c: u64, len: usize) -> Header {
    let mut h = Header::new(Kind::Request, ServiceLevel::Bulk);
    h.a = 11;
    h.b = id;
    h.flags = flags;
    h.aux = aux;
    h.c = c;
    h.len = len as u32;
    h
}

fn list(n: usize) -> Vec<u8> {
    let segs: Vec<Segment> =
        (0..n as u64).map(|i| Segment { addr: 0x1000 + i * 8, len: 1, rkey: 2 }).collect();
    let mut v = Vec::new();
    msg::encode_segments(&mut v, &segs);
    v
}

fn what(r: Result<RequestStep, Loss>) -> String {
    match r {
        Err(Loss::Protocol(e)) => e.to_string(),
        other => panic!("expected a protocol loss, got {other:?}"),
    }
}

/// Inline OUT payload: `hdr` then `data`.
fn inline(id: u64, hdr: &[u8], data: &[u8]) -> (Header, Vec<u8>) {
    let body = [hdr, data].concat();
    let flags = FLAG_PAYLOAD_OUT | FLAG_INLINE_DATA;
    (request(id, flags, hdr.len() as u32, data.len() as u64, body.len()), body)
}

#[test]
fn a_request_with_its_header_here_is_delivered_at_once() {
    let mut t = T::default();
    let (h, body) = inline(7, b"hdr", b"payload");
    let RequestStep::Deliver { pending, header } = t.arrived(LIMITS, &h, &body).unwrap() else { panic!() };
    assert_eq!(header, Bytes::from_static(b"hdr"));
    assert_eq!((pending.peer, pending.cid, pending.id, pending.tag), (PEER, CONN, 7, 11));
    assert_eq!((pending.dir, pending.len, pending.cost), (Direction::Out, 7, body.len()));
    assert_eq!(pending.inline, Some(Bytes::from_static(b"payload")));
    assert_eq!(pending.inline_mech, Mechanism::FastRdma, "how its message came");
    assert_eq!((t.received(), t.counters.host_copy_bytes.load(Ordering::Relaxed)), (1, 7));
    assert_eq!((t.budget.requests, t.budget.buffered), (1, body.len()), "charged until the reply");

    let meta = deliver(&mut t.sreqs, pending, header).unwrap();
    assert_eq!((meta.peer, meta.id, meta.tag, meta.dir, meta.len), (PEER, 7, 11, Direction::Out, 7));
    let r = t.sreqs.get(PEER, 7).unwrap();
    assert_eq!((r.x.conn, r.inline.as_deref()), (CONN, Some(&b"payload"[..])));
}

/// A client's open requests are bounded in number and bytes: past either, the request stays
/// in its buffer unread and uncounted.
#[test]
fn a_spent_budget_holds_the_request_unread() {
    let mut t = T::default();
    for id in 0..2 {
        assert!(matches!(t.arrived(LIMITS, &request(id, 0, 0, 0, 0), b""), Ok(RequestStep::Deliver { .. })));
    }
    assert!(
        matches!(t.arrived(LIMITS, &request(2, 0, 0, 0, 0), b""), Ok(RequestStep::Hold)),
        "third open request"
    );
    assert_eq!((t.reads.get(), t.received(), t.budget.requests), (2, 2, 2));
    t.budget.request_done(0);
    assert!(matches!(t.arrived(LIMITS, &request(2, 0, 0, 0, 0), b""), Ok(RequestStep::Deliver { .. })));

    let mut t = T::default();
    let tight = Limits { early: 10, ..LIMITS };
    let (h, body) = inline(1, b"h", b"12345678");
    assert!(t.arrived(tight, &h, &body).is_ok(), "the first fits whatever its size");
    assert!(matches!(t.arrived(tight, &h, &body), Ok(RequestStep::Hold)), "over the bytes");
    assert_eq!((t.reads.get(), t.received()), (1, 1));
}

#[test]
fn a_request_header_may_reach_the_limit_and_no_further() {
    let mut t = T::default();
    let hdr = [7u8; 16];
    let (h, body) = inline(1, &hdr, b"");
    assert!(matches!(t.arrived(LIMITS, &h, &body), Ok(RequestStep::Deliver { .. })));
    let (h, body) = inline(2, &[7u8; 17], b"");
    assert!(what(t.arrived(LIMITS, &h, &body)).contains("larger than our limits"));
}

#[test]
fn an_inline_payload_may_reach_the_largest_message_and_no_further() {
    let mut t = T::default();
    let (h, body) = inline(1, b"", &[1u8; 64]);
    let Ok(RequestStep::Deliver { pending, .. }) = t.arrived(LIMITS, &h, &body) else { panic!() };
    assert_eq!(pending.inline.map(|d| d.len()), Some(64));
    let (h, body) = inline(2, b"", &[1u8; 65]);
    assert!(what(t.arrived(LIMITS, &h, &body)).contains("larger than our limits"));
    let (mut h, body) = inline(3, b"", &[1u8; 8]);
    h.c = 9;
    let mut t = T::default();
    assert!(what(t.arrived(LIMITS, &h, &body)).contains("truncated"), "shorter than announced");
}

#[test]
fn a_segment_list_may_hold_max_segments_and_no_more() {
    let mut t = T::default();
    let wide = Limits { max_message: 1 << 20, ..LIMITS };
    let flags = FLAG_PAYLOAD_IN | FLAG_SEGMENTS;
    let body = list(MAX_SEGMENTS);
    let h = request(1, flags, 0, MAX_SEGMENTS as u64, body.len());
    let Ok(RequestStep::Deliver { pending, .. }) = t.arrived(wide, &h, &body) else { panic!() };
    assert_eq!((pending.dir, pending.segs.len()), (Direction::In, MAX_SEGMENTS));
    let body = list(MAX_SEGMENTS + 1);
    let h = request(2, flags, 0, MAX_SEGMENTS as u64 + 1, body.len());
    assert!(what(t.arrived(wide, &h, &body)).contains("count out of range"));
}

#[test]
fn a_header_by_rendezvous_is_fetched_before_delivery() {
    let mut t = T::default();
    let body = list(16);
    let h = request(4, FLAG_RDV_HEADER, 16, 0, body.len());
    let Ok(RequestStep::Fetch { pending, segs, len }) = t.arrived(LIMITS, &h, &body) else { panic!() };
    assert_eq!((segs.len(), len, pending.id, pending.dir), (16, 16, 4, Direction::None));
    assert_eq!(t.sreqs.len(), 0, "not open before its header is here");
    assert!(deliver(&mut t.sreqs, *pending, Bytes::from(vec![1; 16])).is_ok());
    assert_eq!(t.sreqs.len(), 1);
    let body = list(17);
    let h = request(5, FLAG_RDV_HEADER, 17, 0, body.len());
    assert!(what(t.arrived(LIMITS, &h, &body)).contains("larger than our limits"), "too large to fetch");
}

#[test]
fn a_request_id_still_open_costs_the_client() {
    let mut t = T::default();
    for _ in 0..2 {
        let (h, body) = inline(9, b"h", b"");
        let Ok(RequestStep::Deliver { pending, header }) = t.arrived(LIMITS, &h, &body) else { panic!() };
        let r = deliver(&mut t.sreqs, pending, header);
        if t.sreqs.len() == 1 && r.is_err() {
            assert!(matches!(r, Err(Loss::Protocol(e)) if e.to_string().contains("reused while open")));
            return;
        }
        assert!(r.is_ok());
    }
    panic!("the reused id was accepted");
}
