//! The server side of requests: each open request a client sent, until it is answered, and
//! the checks every pull, push and reply passes before a driver moves a byte.
//!
//! A request costs its client budget (see [`Budget::admit_request`](super::peers::Budget))
//! from its arrival until its reply is posted. Pulls and pushes must stay inside the payload
//! the client announced, in the direction it announced; a request the client cancelled fails
//! them with [`Error::PeerCancelled`] without touching the wire.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;

use crate::backend::PullCmd;
use crate::buffers::buf::OpBuf;
use crate::comm::Mechanism;
use crate::core::ops::{Op, OpExtra, OpState, OpTable};
use crate::error::{Error, ProtocolError, Result};
use crate::info::Counters;
use crate::op::{Completion, Direction, OpKind, Payload, RequestMeta, status};
use crate::types::{OpId, PeerId, ServiceLevel, Tag};
use crate::wire::{FLAG_PAYLOAD_IN, FLAG_PAYLOAD_OUT, Header, Kind};

/// An open request, with the driver's extra `X`.
#[derive(Debug)]
pub(crate) struct Req<X> {
    pub sl: ServiceLevel,
    pub dir: Direction,
    /// Length of its payload.
    pub len: u64,
    /// The OUT payload when it came with the request.
    pub inline: Option<Bytes>,
    /// How the inline payload came.
    pub inline_mech: Mechanism,
    /// What it costs its client's budget until answered.
    pub cost: usize,
    /// The client cancelled it: pulls, pushes and the reply fail with `PeerCancelled`.
    pub cancelled: bool,
    pub x: X,
}

impl<X: Default> Req<X> {
    pub(crate) fn new(sl: ServiceLevel, dir: Direction, len: u64, cost: usize) -> Req<X> {
        Req {
            sl,
            dir,
            len,
            inline: None,
            inline_mech: Mechanism::Inline,
            cost,
            cancelled: false,
            x: X::default(),
        }
    }
}

/// The open requests, by (client, request id): ids are the client's choice, so the map keeps
/// the standard library's DoS-resistant hasher.
#[derive(Debug)]
pub(crate) struct Requests<X> {
    open: HashMap<(PeerId, u64), Req<X>>,
}

impl<X> Default for Requests<X> {
    fn default() -> Self {
        Requests { open: HashMap::new() }
    }
}

fn not_open(peer: PeerId, req: u64) -> Error {
    Error::misuse(format!("no open request {req} from {peer}"))
}

impl<X> Requests<X> {
    /// Opens a request; false if the client already has one open under this id (a protocol
    /// error of the client's).
    pub(crate) fn open(&mut self, peer: PeerId, req: u64, r: Req<X>) -> bool {
        match self.open.entry((peer, req)) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(r);
                true
            }
        }
    }

    /// A request `id` with header `header` arrived from `peer`: opened, and what the
    /// application is handed. An id the client still has open is its protocol error; the open
    /// request keeps its state.
    pub(crate) fn arrived(
        &mut self,
        peer: PeerId,
        tag: Tag,
        id: u64,
        header: Bytes,
        r: Req<X>,
    ) -> std::result::Result<RequestMeta, ProtocolError> {
        let (sl, dir, len) = (r.sl, r.dir, r.len);
        if !self.open(peer, id, r) {
            return Err(reused(id));
        }
        Ok(RequestMeta { peer, tag, sl, id, header, dir, len })
    }

    /// The open request, or the misuse error of naming one that is not.
    pub(crate) fn get(&self, peer: PeerId, req: u64) -> Result<&Req<X>> {
        self.open.get(&(peer, req)).ok_or_else(|| not_open(peer, req))
    }

    #[cfg(target_os = "linux")]
    pub(crate) fn get_mut(&mut self, peer: PeerId, req: u64) -> Option<&mut Req<X>> {
        self.open.get_mut(&(peer, req))
    }

    /// Closes a request (answered); the misuse error if it is not open.
    pub(crate) fn close(&mut self, peer: PeerId, req: u64) -> Result<Req<X>> {
        self.open.remove(&(peer, req)).ok_or_else(|| not_open(peer, req))
    }

    /// The client cancelled request `req` (unknown ids are ignored: it may be answered already).
    pub(crate) fn cancelled_by_client(&mut self, peer: PeerId, req: u64) {
        if let Some(r) = self.open.get_mut(&(peer, req)) {
            r.cancelled = true;
        }
    }

    /// Whether the client's notice that it cancelled open request `req` has arrived. False for
    /// a request that is not open (answered, or never received): there is nothing left to stop.
    pub(crate) fn is_cancelled(&self, peer: PeerId, req: u64) -> bool {
        self.open.get(&(peer, req)).is_some_and(|r| r.cancelled)
    }

    /// Forgets every request of a lost client.
    pub(crate) fn drop_peer(&mut self, peer: PeerId) {
        self.open.retain(|(p, _), _| *p != peer);
    }

    #[cfg(any(target_os = "linux", test))]
    pub(crate) fn len(&self) -> usize {
        self.open.len()
    }

    /// The request a push of `len` bytes at `offset` may go into: open, with an IN payload
    /// that covers the range.
    pub(crate) fn check_push(&self, peer: PeerId, req: u64, offset: u64, len: usize) -> Result<&Req<X>> {
        let r = self.get(peer, req)?;
        if r.dir != Direction::In || !within(offset, len, r.len) {
            return Err(Error::misuse("push outside the request's IN payload"));
        }
        Ok(r)
    }

    /// The request a pull of `len` bytes at `offset` may come from: open, with an OUT payload
    /// that covers the range.
    pub(crate) fn check_pull(&self, peer: PeerId, req: u64, offset: u64, len: usize) -> Result<&Req<X>> {
        let r = self.get(peer, req)?;
        if r.dir != Direction::Out || !within(offset, len, r.len) {
            return Err(Error::misuse("pull outside the request's OUT payload"));
        }
        Ok(r)
    }

    /// The first step of every pull: the checks, then a cancelled request fails the pull and
    /// an inline payload serves it at once (a copy). The command back when the driver must
    /// move the bytes.
    pub(crate) fn start_pull<S: OpState, Y: OpExtra>(
        &self,
        ops: &mut OpTable<S, Y>,
        counters: &Counters,
        op: OpId,
        mut c: PullCmd,
    ) -> Result<Option<PullCmd>> {
        let len = c.buf.capacity();
        let r = self.check_pull(c.peer, c.req, c.offset, len)?;
        if r.cancelled {
            ops.fail_new(op, OpKind::Pull, c.peer, 0, OpBuf::Recv(c.buf), Error::PeerCancelled);
            return Ok(None);
        }
        let Some(inline) = &r.inline else { return Ok(Some(c)) };
        let start = c.offset as usize;
        c.buf.copy_in(0, &inline[start..start + len]);
        counters.copied(len);
        let mut done = Completion::new(op, OpKind::Pull, c.peer, 0);
        done.result = Ok(len);
        done.buf = OpBuf::Recv(c.buf);
        done.mechanism = Some(r.inline_mech);
        ops.push_completion(done);
        Ok(None)
    }
}

/// A request's or reply's header must fit within `max_header` bytes (what the peer agreed to
/// buffer).
pub(crate) fn check_header(header: &Bytes, max_header: usize) -> Result<()> {
    if header.len() > max_header {
        return Err(Error::TooLarge { len: header.len() as u64, max: max_header as u64 });
    }
    Ok(())
}

/// The length of a request's payload.
pub(crate) fn payload_len(payload: &Payload) -> usize {
    match payload {
        Payload::None => 0,
        Payload::Out(b) => b.len(),
        Payload::In(b) => b.capacity(),
    }
}

/// The wire header of request `op` with a `header_len`-byte header and a `len`-byte payload
/// going in direction `dir` (the inverse of [`direction`]).
pub(crate) fn request_header(
    sl: ServiceLevel,
    tag: Tag,
    op: OpId,
    len: usize,
    header_len: usize,
    dir: Direction,
) -> Header {
    let mut h = Header::new(Kind::Request, sl);
    h.a = tag;
    h.b = op.0;
    h.c = len as u64;
    h.aux = header_len as u32;
    h.flags = match dir {
        Direction::None => 0,
        Direction::Out => FLAG_PAYLOAD_OUT,
        Direction::In => FLAG_PAYLOAD_IN,
    };
    h
}

/// The client's notice that request `op` is cancelled.
pub(crate) fn cancel_notice(sl: ServiceLevel, op: OpId) -> Header {
    let mut h = Header::new(Kind::CancelRequest, sl);
    h.b = op.0;
    h
}

/// What a reply carries: the server's header and status, or for a request the client
/// cancelled, nothing and [`status::DROPPED`]. A cancelled request still gets that bare reply:
/// it is what lets the client forget the request (it remembers it to discard late answers).
/// The server's reply op reports the cancel.
pub(crate) fn reply_content(cancelled: bool, header: Bytes, status: u32) -> (Bytes, u32) {
    if cancelled { (Bytes::new(), status::DROPPED) } else { (header, status) }
}

/// Where the bytes of a PUSH go on the client.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PushInto {
    /// Into this request's IN buffer, at the PUSH's offset.
    Op(OpId),
    /// Nowhere: the request was cancelled here and the server had not heard yet.
    Discard,
}

/// Client side: checks a PUSH of `len` bytes at `offset` from `peer` into request `req`. The
/// request must wait for its reply and the range lie within its IN buffer; a request this side
/// cancelled takes nothing. Records how far the request's bytes reach (pushes may leave holes;
/// a read counts up to its furthest byte).
pub(crate) fn incoming_push<S: OpState + PartialEq, X: OpExtra>(
    ops: &mut OpTable<S, X>,
    cancelled: &HashSet<u64>,
    peer: PeerId,
    req: u64,
    offset: u64,
    len: usize,
) -> std::result::Result<PushInto, ProtocolError> {
    let op = OpId(req);
    if let Some(o) = ops.awaiting_reply(op, peer) {
        let cap = match &o.buf {
            OpBuf::Recv(b) => b.capacity(),
            _ => 0,
        };
        if !within(offset, len, cap as u64) {
            return Err(ProtocolError::Unexpected { what: "PUSH outside the request's buffer".into() });
        }
        if len > 0 {
            o.moved = o.moved.max(offset as usize + len);
        }
        return Ok(PushInto::Op(op));
    }
    if ops.get(&op).is_some_and(|o| o.peer == peer && o.st.holds()) || cancelled.contains(&req) {
        return Ok(PushInto::Discard);
    }
    Err(ProtocolError::Unexpected { what: format!("PUSH for unknown request {req}") })
}

/// The client sent request `id` while it still had one open under that id.
pub(crate) fn reused(id: u64) -> ProtocolError {
    ProtocolError::Unexpected { what: format!("request id {id} reused while open") }
}

/// Client side: the request a REPLY for `req` from `peer` answers — one waiting for its reply,
/// or one cancelled here whose memory the server may still touch (the reply says it let go).
/// `None` for a request cancelled and forgotten here: the reply only lets the id go. Any other
/// reply is the server's protocol error.
pub(crate) fn incoming_reply<'a, S: OpState + PartialEq, X: OpExtra>(
    ops: &'a mut OpTable<S, X>,
    cancelled: &mut HashSet<u64>,
    peer: PeerId,
    req: u64,
) -> std::result::Result<Option<&'a mut Op<S, X>>, ProtocolError> {
    let op = OpId(req);
    let answers = |o: &Op<S, X>| {
        o.peer == peer && o.kind == OpKind::Request && (o.st == S::AWAITING_REPLY || o.st.holds())
    };
    if ops.get(&op).is_some_and(answers) {
        return Ok(ops.get_mut(&op));
    }
    if cancelled.remove(&req) {
        return Ok(None);
    }
    Err(ProtocolError::Unexpected { what: format!("REPLY for unknown request {req}") })
}

/// The bytes a replied request moved: a write its whole payload (however much the server
/// pulled, as it must when the payload went inline or streamed), a read up to its furthest
/// byte — what its pushes showed, or `pushed` where the server reports what RDMA wrote.
pub(crate) fn reply_moved<S, X>(o: &Op<S, X>, pushed: u64) -> usize {
    match &o.buf {
        OpBuf::Send(s) => s.len(),
        _ => o.moved.max(pushed as usize),
    }
}

/// A request's result from its reply's `status`: the `moved` bytes, the header kept for the
/// application; or the error the status names, with the header as its detail.
pub(crate) fn reply_result<S, X>(
    o: &mut Op<S, X>,
    status: u32,
    header: Bytes,
    moved: usize,
) -> Result<usize> {
    match status {
        status::OK => {
            o.reply = Some(header);
            Ok(moved)
        }
        st => Err(status::error(st, &header)),
    }
}

/// `[offset, offset + len)` lies within `[0, total)`.
fn within(offset: u64, len: usize, total: u64) -> bool {
    offset.checked_add(len as u64).is_some_and(|end| end <= total)
}

/// The direction of a request's payload from its header's flags: one direction at most, and
/// none only for a request without payload.
pub(crate) fn direction(flags: u8, len: u64) -> std::result::Result<Direction, ProtocolError> {
    let out = flags & FLAG_PAYLOAD_OUT != 0;
    let inn = flags & FLAG_PAYLOAD_IN != 0;
    match (out, inn) {
        (true, false) => Ok(Direction::Out),
        (false, true) => Ok(Direction::In),
        (false, false) if len == 0 => Ok(Direction::None),
        _ => Err(ProtocolError::Unexpected {
            what: format!(
                "request of {len} payload bytes with direction flags {:#x}",
                flags & (FLAG_PAYLOAD_OUT | FLAG_PAYLOAD_IN)
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffers::buf::RecvBuf;
    use crate::core::ops::tests::St;

    fn reqs() -> Requests<()> {
        let mut r = Requests::default();
        assert!(r.open(PeerId(1), 9, Req::new(ServiceLevel::Normal, Direction::Out, 100, 64)));
        assert!(r.open(PeerId(1), 10, Req::new(ServiceLevel::Normal, Direction::In, 100, 64)));
        r
    }

    #[test]
    fn pulls_and_pushes_stay_inside_the_announced_payload_and_direction() {
        let r = reqs();
        assert!(r.check_pull(PeerId(1), 9, 0, 100).is_ok());
        assert!(r.check_pull(PeerId(1), 9, 99, 1).is_ok());
        assert!(matches!(r.check_pull(PeerId(1), 9, 1, 100), Err(Error::Misuse(_))));
        assert!(matches!(r.check_pull(PeerId(1), 9, u64::MAX, 2), Err(Error::Misuse(_))));
        assert!(matches!(r.check_pull(PeerId(1), 10, 0, 1), Err(Error::Misuse(_))));
        assert!(matches!(r.check_push(PeerId(1), 9, 0, 1), Err(Error::Misuse(_))));
        assert!(r.check_push(PeerId(1), 10, 100, 0).is_ok());
        assert!(matches!(r.check_push(PeerId(2), 10, 0, 1), Err(Error::Misuse(_))));
    }

    #[test]
    fn a_request_id_is_open_once_per_client() {
        let mut r = reqs();
        assert!(!r.open(PeerId(1), 9, Req::new(ServiceLevel::Normal, Direction::None, 0, 0)));
        assert!(r.open(PeerId(2), 9, Req::new(ServiceLevel::Normal, Direction::None, 0, 0)));
        assert_eq!(r.close(PeerId(1), 9).map(|q| q.len).ok(), Some(100));
        assert!(r.close(PeerId(1), 9).is_err());
        r.drop_peer(PeerId(1));
        assert_eq!(r.len(), 1);
    }

    /// Both transports record a client's cancel notice here: one for a request that is not
    /// open (answered, never sent, or another client's) changes nothing and keeps nothing.
    #[test]
    fn a_cancel_notice_marks_only_an_open_request_of_its_client() {
        let mut r = reqs();
        for id in [0, 8, 11, u64::MAX] {
            r.cancelled_by_client(PeerId(1), id);
        }
        r.cancelled_by_client(PeerId(2), 9);
        assert_eq!(r.len(), 2, "no request opened by a notice");
        assert!(!r.is_cancelled(PeerId(1), 9) && !r.is_cancelled(PeerId(1), 10));
        r.cancelled_by_client(PeerId(1), 9);
        assert!(r.is_cancelled(PeerId(1), 9) && !r.is_cancelled(PeerId(1), 10));
        assert!(r.close(PeerId(1), 9).is_ok_and(|q| q.cancelled));
        r.cancelled_by_client(PeerId(1), 9);
        assert!(!r.is_cancelled(PeerId(1), 9), "an answered request stays closed");
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn a_request_header_says_the_direction_its_server_reads_back() {
        for dir in [Direction::None, Direction::Out, Direction::In] {
            let len = if dir == Direction::None { 0 } else { 9 };
            let h = request_header(ServiceLevel::Bulk, 5, OpId(7), len, 3, dir);
            assert_eq!((h.a, h.b, h.c, h.aux), (5, 7, len as u64, 3));
            assert_eq!(direction(h.flags, h.c).ok(), Some(dir));
        }
    }

    /// Requests to server 1: op 4 waits with a 100-byte buffer, op 5 is being cancelled.
    fn requests_of_server_1() -> OpTable<St, ()> {
        let mut ops: OpTable<St, ()> = OpTable::default();
        let buf = OpBuf::Recv(RecvBuf::from(bytes::BytesMut::zeroed(100)));
        ops.insert(OpId(4), OpKind::Request, PeerId(1), 0, ServiceLevel::Normal, buf, St::Moving);
        ops.insert(OpId(5), OpKind::Request, PeerId(1), 0, ServiceLevel::Normal, OpBuf::None, St::Cancelling);
        ops
    }

    #[test]
    fn a_push_lands_only_inside_a_waiting_requests_buffer_from_its_server() {
        let mut ops = requests_of_server_1();
        let none = HashSet::new();
        assert_eq!(incoming_push(&mut ops, &none, PeerId(1), 4, 60, 40), Ok(PushInto::Op(OpId(4))));
        assert_eq!(incoming_push(&mut ops, &none, PeerId(1), 4, 0, 10), Ok(PushInto::Op(OpId(4))));
        assert_eq!(ops.get(&OpId(4)).map(|o| o.moved), Some(100), "the furthest byte counts");
        assert!(incoming_push(&mut ops, &none, PeerId(1), 4, 61, 40).is_err(), "past the buffer");
        assert!(incoming_push(&mut ops, &none, PeerId(1), 4, u64::MAX, 2).is_err(), "overflow");
        assert!(incoming_push(&mut ops, &none, PeerId(2), 4, 0, 1).is_err(), "another peer");
        assert_eq!(incoming_push(&mut ops, &none, PeerId(1), 5, 0, 1), Ok(PushInto::Discard));
        assert!(incoming_push(&mut ops, &none, PeerId(1), 6, 0, 1).is_err(), "unknown request");
        let cancelled: HashSet<u64> = [6].into();
        assert_eq!(incoming_push(&mut ops, &cancelled, PeerId(1), 6, 0, 1), Ok(PushInto::Discard));
    }

    /// Both transports open an arrived request here: an id still open is refused and the open
    /// request keeps its state; the same id from another client, or after the reply, is new.
    #[test]
    fn an_arrived_request_opens_once_and_says_what_the_application_gets() {
        let mut r = reqs();
        let req = |dir, len| Req::new(ServiceLevel::Bulk, dir, len, 8);
        let m = r.arrived(PeerId(1), 3, 11, Bytes::from_static(b"hdr"), req(Direction::In, 40)).unwrap();
        assert_eq!(
            (m.peer, m.tag, m.id, m.sl, m.dir, m.len),
            (PeerId(1), 3, 11, ServiceLevel::Bulk, Direction::In, 40)
        );
        assert_eq!(m.header, Bytes::from_static(b"hdr"));
        let e = r.arrived(PeerId(1), 3, 9, Bytes::new(), req(Direction::None, 0)).unwrap_err();
        assert!(e.to_string().contains("request id 9 reused while open"), "{e}");
        assert_eq!(r.get(PeerId(1), 9).map(|q| q.len).ok(), Some(100), "the open request stands");
        assert!(r.arrived(PeerId(2), 3, 9, Bytes::new(), req(Direction::None, 0)).is_ok());
        assert!(r.close(PeerId(1), 11).is_ok());
        assert!(r.arrived(PeerId(1), 3, 11, Bytes::new(), req(Direction::None, 0)).is_ok(), "answered: free");
        assert_eq!(r.len(), 4);
    }

    /// A reply answers a request of its server that waits for it, or one cancelled here whose
    /// memory the server may still touch; a forgotten cancelled id goes quietly, once.
    #[test]
    fn a_reply_answers_only_a_waiting_request_of_its_server() {
        let mut ops = requests_of_server_1();
        ops.insert(OpId(6), OpKind::Request, PeerId(1), 0, ServiceLevel::Normal, OpBuf::None, St::Finishing);
        ops.insert(OpId(7), OpKind::Recv, PeerId(1), 0, ServiceLevel::Normal, OpBuf::None, St::Moving);
        let mut cancelled: HashSet<u64> = [8].into();
        let mut to =
            |peer, req| incoming_reply(&mut ops, &mut cancelled, PeerId(peer), req).map(|o| o.is_some());
        assert_eq!(to(1, 4), Ok(true), "waiting for its reply");
        assert_eq!(to(1, 5), Ok(true), "cancelled, its memory held");
        assert!(to(2, 4).is_err(), "another server's reply");
        assert!(to(1, 6).is_err(), "already answered");
        assert!(to(1, 7).is_err(), "not a request");
        assert_eq!(to(1, 8), Ok(false), "cancelled and forgotten");
        let e = to(1, 8).unwrap_err();
        assert!(e.to_string().contains("REPLY for unknown request 8"), "forgotten once: {e}");
    }

    #[test]
    fn a_reply_counts_a_write_whole_and_a_read_to_its_furthest_byte() {
        let mut ops: OpTable<St, ()> = OpTable::default();
        let send = OpBuf::Send(crate::buffers::buf::SendBuf::Bytes(Bytes::from_static(b"payload")));
        let recv = OpBuf::Recv(RecvBuf::from(bytes::BytesMut::zeroed(100)));
        ops.insert(OpId(1), OpKind::Request, PeerId(1), 0, ServiceLevel::Normal, send, St::Moving);
        ops.insert(OpId(2), OpKind::Request, PeerId(1), 0, ServiceLevel::Normal, recv, St::Moving);
        let o = ops.get_mut(&OpId(1)).unwrap();
        assert_eq!(reply_moved(o, 0), 7, "a write counts its payload");
        let o = ops.get_mut(&OpId(2)).unwrap();
        o.moved = 30;
        assert_eq!((reply_moved(o, 0), reply_moved(o, 60), reply_moved(o, 10)), (30, 60, 30));
        let h = Bytes::from_static(b"answer");
        assert_eq!(reply_result(o, status::OK, h.clone(), 30).ok(), Some(30));
        assert_eq!(o.reply.as_ref(), Some(&h), "the header is the application's");
        o.reply = None;
        assert!(reply_result(o, status::DROPPED, h, 30).is_err());
        assert!(o.reply.is_none(), "a failed request keeps no reply");
    }

    #[test]
    fn a_request_announces_one_direction_at_most() {
        assert_eq!(direction(FLAG_PAYLOAD_OUT, 5).ok(), Some(Direction::Out));
        assert_eq!(direction(FLAG_PAYLOAD_IN, 5).ok(), Some(Direction::In));
        assert_eq!(direction(0, 0).ok(), Some(Direction::None));
        assert!(direction(0, 5).is_err());
        assert!(direction(FLAG_PAYLOAD_OUT | FLAG_PAYLOAD_IN, 5).is_err());
    }

    #[test]
    fn a_cancelled_requests_reply_is_bare() {
        let h = Bytes::from_static(b"answer");
        assert_eq!(reply_content(false, h.clone(), 7), (h.clone(), 7));
        assert_eq!(reply_content(true, h, 7), (Bytes::new(), status::DROPPED));
        let n = cancel_notice(ServiceLevel::Control, OpId(12));
        assert_eq!((n.kind, n.sl, n.b, n.len), (Kind::CancelRequest, ServiceLevel::Control, 12, 0));
    }
}
