//! Receiving: SENDs into pre-posted buffers and fast-RDMA writes into ring slots.

use bytes::Bytes;

use crate::buffers::buf::OpBuf;
use crate::comm::Mechanism;
use crate::core::peers::Peers;
use crate::core::requests::{self, PushInto, Req};
use crate::error::{Error, ProtocolError};
use crate::ib::verbs::*;
use crate::info::Counters;
use crate::op::{Direction, OpKind, RequestMeta, Unexpected, status};
use crate::types::{OpId, PeerId, ServiceLevel, Tag};
use crate::wire::{Header, Kind};

use super::inbound::{self, unexpected};
use super::link::{Arrival, LinkError};
use super::msg::{self, MSG_HDR, Segment};
use super::reg::DmaRegion;
use super::rx::{Body, Matched, Released, Rts, Rx};
use super::setup::post_recv;
use super::{Held, IbReq, Local, Loss, OpSt, State, XferThen};

/// A request whose header is being fetched by RDMA before it is delivered.
pub(crate) struct PendingRequest {
    pub peer: PeerId,
    pub tag: Tag,
    pub sl: ServiceLevel,
    pub id: u64,
    pub cid: u32,
    pub dir: Direction,
    pub len: u64,
    pub inline: Option<Bytes>,
    /// How the inline data came (inline or fast RDMA).
    pub inline_mech: Mechanism,
    pub segs: Vec<Segment>,
    pub cost: usize,
}

/// What became of a received message.
enum Outcome {
    /// Consumed: its buffer or slot can be reused.
    Done,
    /// Kept where it is until the application consumes something (back-pressure).
    Hold,
}

/// What a flow-control or framing violation of the peer costs: the peer.
fn link_loss(e: LinkError) -> Loss {
    match e {
        LinkError::Flow(f) => Loss::Protocol(ProtocolError::FlowControl(f.to_string())),
        LinkError::NoImm => unexpected("ring write without immediate data".into()),
        LinkError::BadLength(len) => unexpected(format!("message of {len} bytes")),
        LinkError::NotConnected => unexpected("message before the connection's limits".into()),
    }
}

/// A message's payload in a connection's memory.
struct InMem<'a> {
    mem: &'a DmaRegion,
    off: usize,
    len: usize,
}

impl Body for InMem<'_> {
    fn len(&self) -> usize {
        self.len
    }
    fn read(&self, at: usize, dst: &mut [u8]) {
        self.mem.read_at(self.off + at, dst);
    }
}

impl<V: Verbs> State<V> {
    /// The matching tables, and the peers whose budgets they charge.
    pub(crate) fn rx(&mut self) -> (Rx<'_>, &mut Peers<u32, ()>) {
        let State { matcher, ops, fin_wait, peers, core, s, .. } = self;
        let early_limit = s.cfg.early_bytes_per_peer;
        (Rx { matcher, ops, fin_wait, counters: &core.counters, early_limit }, peers)
    }

    fn loc_off(&self, cid: u32, loc: Held) -> Option<usize> {
        Some(self.conn(cid)?.link.layout().loc_off(loc))
    }

    /// A receive completion: a SEND into buffer `idx`, or a ring write (the buffer untouched).
    pub(crate) fn on_recv(&mut self, cid: u32, idx: u32, wc: &WorkCompletion) {
        let Some(c) = self.conn_mut(cid) else { return };
        let peer = c.peer;
        let arrival = if wc.opcode == WcOpcode::RecvRdmaWithImm {
            // The write did not touch the receive buffer: post it again at once.
            if let Err(e) = post_recv(c, idx) {
                self.fail_peer(peer, Loss::Lost(format!("post_recv: {e}")));
                return;
            }
            Arrival::Ring { imm: wc.imm_data }
        } else {
            Arrival::Send { idx, len: wc.byte_len as usize }
        };
        let loc = match c.link.arrived(arrival) {
            Ok((loc, len)) => {
                let mut hb = [0u8; MSG_HDR];
                c.mem.read_at(c.link.layout().loc_off(loc), &mut hb);
                match msg::decode_framing(&hb) {
                    Ok((prefix, h)) if MSG_HDR + h.len as usize == len => match c.link.framing(loc, prefix) {
                        Ok(()) => Ok((loc, h)),
                        Err(e) => Err(link_loss(e)),
                    },
                    Ok((_, h)) => {
                        Err(unexpected(format!("{:?} announces {} bytes, {len} arrived", h.kind, h.len)))
                    }
                    Err(e) => Err(Loss::Protocol(ProtocolError::Unexpected { what: e.to_string() })),
                }
            }
            Err(e) => Err(link_loss(e)),
        };
        let (loc, h) = match loc {
            Ok(x) => x,
            Err(loss) => {
                self.fail_peer(peer, loss);
                return;
            }
        };
        // Decoding the framing took the flow-control returns at once, even if the message
        // itself has to wait: they may be what lets our own sends out.
        let Some(c) = self.conn_mut(cid) else { return };
        if !c.link.admit(loc) {
            return;
        }
        match self.process(cid, loc, h) {
            Ok(Outcome::Done) => self.release_loc(cid, loc),
            Ok(Outcome::Hold) => {
                if let Some(c) = self.conn_mut(cid) {
                    c.link.hold(loc);
                }
                Counters::add(&self.core.counters.backpressure_pauses, 1);
                if let Some(p) = self.peers.get_mut(peer) {
                    p.stall(cid);
                }
            }
            Err(loss) => self.fail_peer(peer, loss),
        }
    }

    /// Gives a buffer back to the device, or a slot back to the ring.
    fn release_loc(&mut self, cid: u32, loc: Held) {
        let Some(c) = self.conn_mut(cid) else { return };
        let peer = c.peer;
        let r = match c.link.release(loc) {
            Ok(Some(i)) => post_recv(c, i),
            Ok(None) => Ok(()),
            Err(LinkError::Flow(f)) => Err(Error::from(f)),
            Err(e) => Err(Error::misuse(e.to_string())),
        };
        if let Err(e) = r {
            self.fail_peer(peer, Loss::Lost(format!("re-posting a receive: {e}")));
        }
    }

    /// Re-tries held messages of a peer after it consumed something.
    pub(crate) fn unstall(&mut self, peer: PeerId) {
        let Some(p) = self.peers.get_mut(peer) else { return };
        if p.stalled.is_empty() {
            return;
        }
        for cid in std::mem::take(&mut p.stalled) {
            while let Some(loc) = self.conn(cid).and_then(|c| c.link.next_held()) {
                let Some(off) = self.loc_off(cid, loc) else { break };
                let mut hb = [0u8; MSG_HDR];
                if let Some(c) = self.conn(cid) {
                    c.mem.read_at(off, &mut hb);
                }
                let Ok((_, h)) = msg::decode_framing(&hb) else { break };
                match self.process(cid, loc, h) {
                    Ok(Outcome::Done) => {
                        if let Some(c) = self.conn_mut(cid) {
                            c.link.unhold(loc);
                        }
                        self.release_loc(cid, loc);
                    }
                    Ok(Outcome::Hold) => {
                        if let Some(p) = self.peers.get_mut(peer) {
                            p.stall(cid);
                        }
                        break;
                    }
                    Err(loss) => {
                        self.fail_peer(peer, loss);
                        return;
                    }
                }
            }
        }
    }

    fn payload(&self, cid: u32, loc: Held, h: &Header) -> Vec<u8> {
        let mut v = vec![0u8; h.len as usize];
        if let (Some(off), Some(c)) = (self.loc_off(cid, loc), self.conn(cid)) {
            c.mem.read_at(off + MSG_HDR, &mut v);
        }
        v
    }

    /// Copies a message's payload into a receive buffer.
    fn copy_payload_into(&mut self, cid: u32, loc: Held, len: usize, op: OpId, at: usize) {
        let Some(off) = self.loc_off(cid, loc) else { return };
        let State { conns, ops, .. } = self;
        let (Some(Some(c)), Some(o)) = (conns.get(cid as usize), ops.get_mut(&op)) else { return };
        if let OpBuf::Recv(b) = &mut o.buf {
            let mut done = 0;
            while done < len {
                let Some(dst) = b.slice_at_mut(at + done) else { break };
                let n = dst.len().min(len - done);
                c.mem.read_at(off + MSG_HDR + done, &mut dst[..n]);
                done += n;
            }
        }
        self.core.counters.copied(len);
    }

    fn process(&mut self, cid: u32, loc: Held, h: Header) -> Result<Outcome, Loss> {
        let Some(c) = self.conn(cid) else { return Ok(Outcome::Done) };
        let peer = c.peer;
        let via_ring = matches!(loc, Held::Slot { .. });
        let len = h.len as usize;
        match h.kind {
            Kind::Credit => Ok(Outcome::Done),
            Kind::Eager => {
                let mech = if via_ring { Mechanism::FastRdma } else { Mechanism::Inline };
                let Some(off) = self.loc_off(cid, loc) else { return Ok(Outcome::Done) };
                let State { conns, matcher, ops, fin_wait, peers, core, s, .. } = self;
                let Some(Some(c)) = conns.get(cid as usize) else { return Ok(Outcome::Done) };
                let body = InMem { mem: &c.mem, off: off + MSG_HDR, len };
                let early_limit = s.cfg.early_bytes_per_peer;
                let mut rx = Rx { matcher, ops, fin_wait, counters: &core.counters, early_limit };
                Ok(match rx.eager(&mut peers[peer].budget, peer, h.a, h.sl, mech, &body) {
                    Matched::Hold => Outcome::Hold,
                    Matched::Done | Matched::Read { .. } => Outcome::Done,
                })
            }
            Kind::Unexpected => {
                let Some(off) = self.loc_off(cid, loc) else { return Ok(Outcome::Done) };
                let max = self.s.cfg.unexpected_per_peer;
                let State { conns, matcher, ops, fin_wait, peers, core, s, .. } = self;
                let Some(Some(c)) = conns.get(cid as usize) else { return Ok(Outcome::Done) };
                let body = InMem { mem: &c.mem, off: off + MSG_HDR, len };
                let early_limit = s.cfg.early_bytes_per_peer;
                let mut rx = Rx { matcher, ops, fin_wait, counters: &core.counters, early_limit };
                let Some(data) = rx.unexpected(&mut peers[peer].budget, max, &body) else {
                    return Ok(Outcome::Hold);
                };
                self.events += 1;
                self.core.push_unexpected(Unexpected { peer, tag: h.a, sl: h.sl, data });
                Ok(Outcome::Done)
            }
            Kind::Rdv => {
                let segs = inbound::rts(&h, &self.payload(cid, loc, &h), self.s.max_message as u64)?;
                let rts = Rts { msg: h.b, total: h.c, segs, conn: cid };
                let (mut rx, peers) = self.rx();
                Ok(match rx.rts(&mut peers[peer].budget, peer, h.a, rts) {
                    Matched::Hold => Outcome::Hold,
                    Matched::Read { op, rts } => {
                        self.start_rdv_recv(op, rts);
                        Outcome::Done
                    }
                    Matched::Done => Outcome::Done,
                })
            }
            Kind::Request => {
                let (max, limit) = (self.s.cfg.requests_per_peer, self.s.cfg.early_bytes_per_peer);
                if !self.peers[peer].budget.admit_request(len, max, limit) {
                    return Ok(Outcome::Hold);
                }
                Counters::add(&self.core.counters.msgs_received, 1);
                let body = Bytes::from(self.payload(cid, loc, &h));
                let via = if via_ring { Mechanism::FastRdma } else { Mechanism::Inline };
                match self.parse_request(cid, peer, &h, body, via) {
                    Ok(()) => Ok(Outcome::Done),
                    Err(l) => Err(l),
                }
            }
            Kind::Reply => {
                let body = self.payload(cid, loc, &h);
                self.on_reply(cid, peer, &h, body)?;
                Ok(Outcome::Done)
            }
            Kind::Push => {
                let first = self.ops.get(&OpId(h.b)).is_some_and(|o| o.moved == 0);
                let cancelled = &self.peers[peer].cancelled_reqs;
                match requests::incoming_push(&mut self.ops, cancelled, peer, h.b, h.c, len) {
                    Ok(PushInto::Op(op)) => {
                        self.copy_payload_into(cid, loc, len, op, h.c as usize);
                        if let Some(o) = self.ops.get_mut(&op) {
                            // The read's mechanism is how its data came: any fast-RDMA push
                            // makes it fast RDMA.
                            if via_ring {
                                o.mech = Some(Mechanism::FastRdma);
                            } else if first && len > 0 {
                                o.mech = Some(Mechanism::Inline);
                            }
                        }
                        Ok(Outcome::Done)
                    }
                    Ok(PushInto::Discard) => Ok(Outcome::Done),
                    Err(e) => Err(Loss::Protocol(e)),
                }
            }
            Kind::Fin => {
                self.on_fin(peer, &h)?;
                Ok(Outcome::Done)
            }
            Kind::Cts if h.aux == super::RDV_WITHDRAW => {
                // The sender cancelled rendezvous message `b` ([`Rx::withdraw`]).
                let (mut rx, _) = self.rx();
                if rx.withdraw(peer, h.b, cid) {
                    self.send_fin(cid, h.b, super::FIN_CANCELLED, 0);
                }
                Ok(Outcome::Done)
            }
            Kind::CancelRequest => {
                self.sreqs.cancelled_by_client(peer, h.b);
                Ok(Outcome::Done)
            }
            other => Err(unexpected(format!("{other:?} message over InfiniBand"))),
        }
    }

    /// A FIN: the peer is done with the buffer of our rendezvous message `h.b` ([`Rx::fin`]).
    pub(crate) fn on_fin(&mut self, peer: PeerId, h: &Header) -> Result<(), Loss> {
        let (mut rx, _) = self.rx();
        if let Some(Released { regs, keep }) = rx.fin(peer, h.b, h.aux, h.c)? {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            for r in regs {
                let _ = cache.release(r);
            }
            drop(cache);
            drop(keep);
        }
        Ok(())
    }

    /// A request (`via`: how its message came), its body decoded by [`inbound::request`]:
    /// delivered at once, or once its header is fetched from the client's memory.
    fn parse_request(
        &mut self,
        cid: u32,
        peer: PeerId,
        h: &Header,
        body: Bytes,
        via: Mechanism,
    ) -> Result<(), Loss> {
        let (max_header, max_message) = (self.s.cfg.max_header as u64, self.s.max_message as u64);
        let inbound::RequestBody { dir, header, inline, segs } =
            inbound::request(h, body, max_header, max_message)?;
        if let Some(d) = &inline {
            self.core.counters.copied(d.len());
        }
        let pending = PendingRequest {
            peer,
            tag: h.a,
            sl: h.sl,
            id: h.b,
            cid,
            dir,
            len: h.c,
            inline,
            inline_mech: via,
            segs,
            cost: h.len as usize,
        };
        match header {
            inbound::HeaderIn::Remote { segs: s, len: n } => {
                // Fetch the header first; the request is delivered when it is here.
                self.start_xfer(
                    peer,
                    cid,
                    true,
                    s,
                    0,
                    Local::Vec(vec![0; n]),
                    n,
                    XferThen::RequestHeader { pending: Box::new(pending) },
                );
            }
            inbound::HeaderIn::Here(header) => self.deliver_request(pending, header),
        }
        Ok(())
    }

    pub(crate) fn deliver_request(&mut self, p: PendingRequest, header: Bytes) {
        let mut r = Req::new(p.sl, p.dir, p.len, p.cost);
        r.inline = p.inline;
        r.inline_mech = p.inline_mech;
        r.x = IbReq::new(p.cid, p.segs);
        if !self.sreqs.open(p.peer, p.id, r) {
            self.fail_peer(p.peer, unexpected(format!("request id {} reused while open", p.id)));
            return;
        }
        self.events += 1;
        self.core.push_request(RequestMeta {
            peer: p.peer,
            tag: p.tag,
            sl: p.sl,
            id: p.id,
            header,
            dir: p.dir,
            len: p.len,
        });
    }

    /// A REPLY: b = request id, aux = status, a = end of the furthest byte the server pushed
    /// into the request's IN buffer; with `FLAG_RDV_HEADER`, c = message id and the payload is
    /// the header's segment list.
    pub(crate) fn on_reply(&mut self, cid: u32, peer: PeerId, h: &Header, body: Vec<u8>) -> Result<(), Loss> {
        let op = OpId(h.b);
        let room = match self.ops.get(&op) {
            Some(o)
                if o.peer == peer
                    && o.kind == OpKind::Request
                    && matches!(o.st, OpSt::WaitReply | OpSt::Cancelling { .. }) =>
            {
                match &o.buf {
                    OpBuf::Recv(b) => b.capacity() as u64,
                    _ => 0,
                }
            }
            _ => {
                if self.peers[peer].cancelled_reqs.remove(&h.b) {
                    return Ok(());
                }
                return Err(unexpected(format!("REPLY for unknown request {}", h.b)));
            }
        };
        if h.a > room {
            return Err(unexpected("REPLY claims pushes beyond the request's buffer".into()));
        }
        match inbound::reply_header(h, body, self.s.cfg.max_header as u64)? {
            inbound::HeaderIn::Remote { segs, len: n } => self.start_xfer(
                peer,
                cid,
                true,
                segs,
                0,
                Local::Vec(vec![0; n]),
                n,
                XferThen::ReplyHeader { op, status: h.aux, msg: h.c, pushed: h.a },
            ),
            inbound::HeaderIn::Here(header) => self.complete_request(op, h.aux, header, h.a),
        }
        Ok(())
    }

    /// A reply arrived (header in hand): the request op completes. A read counts the bytes
    /// up to the end of the furthest one pushed (`pushed`, as the server reports it, or as its
    /// PUSH messages showed), so `Completion::data` is exactly what the server wrote.
    pub(crate) fn complete_request(&mut self, op: OpId, st: u32, header: Bytes, pushed: u64) {
        Counters::add(&self.core.counters.msgs_received, 1);
        let Some(o) = self.ops.get_mut(&op) else { return };
        if matches!(o.st, OpSt::Cancelling { .. }) {
            // The server is done with our memory: the cancelled op can go.
            o.st = OpSt::Finishing;
            self.peers[o.peer].cancelled_reqs.remove(&op.0);
            self.ops.complete(op, Err(Error::Cancelled));
            return;
        }
        let moved = match &o.buf {
            OpBuf::Recv(_) => o.moved.max(pushed as usize),
            OpBuf::Send(s) => s.len(),
            OpBuf::None => 0,
        };
        // A read staged through a pool buffer: copy what was pushed into the caller's buffer.
        let mut copied = 0;
        if st == status::OK
            && let (OpBuf::Recv(user), Some(staged)) = (&mut o.buf, o.x.stage_in.as_ref())
        {
            copied = moved.min(staged.len());
            user.copy_in(0, &staged[..copied]);
        }
        let r = match st {
            status::OK => {
                o.reply = Some(header);
                Ok(moved)
            }
            st => Err(status::error(st, &header)),
        };
        self.core.counters.copied(copied);
        self.ops.complete(op, r);
    }
}
