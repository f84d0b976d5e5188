//! Receiving: SENDs into pre-posted buffers and fast-RDMA writes into ring slots.

use bytes::Bytes;

use crate::buffers::buf::OpBuf;
use crate::core::peers::Peers;
use crate::error::Error;
use crate::ib::verbs::*;
use crate::info::Counters;
use crate::op::Unexpected;
use crate::types::{OpId, PeerId};
use crate::wire::{Header, Kind};

use super::inbound::{self, link_loss, unexpected};
use super::link::{Arrival, LinkError};
use super::msg::{self, MSG_HDR};
use super::reg::DmaRegion;
use super::reply::{self, ReplyStep};
use super::request_in::{self, PendingRequest, RequestStep};
use super::rx::{Body, Matched, Released, Rts, Rx};
use super::setup::post_recv;
use super::{Conn, Held, Local, Loss, State, XferThen};

/// What became of a received message.
enum Outcome {
    /// Consumed: its buffer or slot can be reused.
    Done,
    /// Kept where it is until the application consumes something (back-pressure).
    Hold,
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

/// A message's payload of `len` bytes, copied out of its buffer or slot on connection `c`.
fn read_payload<V: Verbs>(c: Option<&Conn<V>>, loc: Held, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    if let Some(c) = c {
        c.mem.read_at(c.link.layout().loc_off(loc) + MSG_HDR, &mut v);
    }
    v
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
                inbound::framing(&hb, len).and_then(|(prefix, h)| match c.link.framing(loc, prefix) {
                    Ok(()) => Ok((loc, h)),
                    Err(e) => Err(link_loss(e)),
                })
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
        read_payload(self.conn(cid), loc, h.len as usize)
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
        let arrived_by = loc.mechanism();
        let len = h.len as usize;
        match h.kind {
            Kind::Credit => Ok(Outcome::Done),
            Kind::Eager => {
                let Some(off) = self.loc_off(cid, loc) else { return Ok(Outcome::Done) };
                let State { conns, matcher, ops, fin_wait, peers, core, s, .. } = self;
                let Some(Some(c)) = conns.get(cid as usize) else { return Ok(Outcome::Done) };
                let body = InMem { mem: &c.mem, off: off + MSG_HDR, len };
                let early_limit = s.cfg.early_bytes_per_peer;
                let mut rx = Rx { matcher, ops, fin_wait, counters: &core.counters, early_limit };
                Ok(match rx.eager(&mut peers[peer].budget, peer, h.a, h.sl, arrived_by, &body) {
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
                let limits = request_in::Limits {
                    requests: self.s.cfg.requests_per_peer,
                    early: self.s.cfg.early_bytes_per_peer,
                    max_header: self.s.cfg.max_header as u64,
                    max_message: self.s.max_message as u64,
                };
                let State { conns, peers, core, .. } = self;
                let c = conns.get(cid as usize).and_then(Option::as_ref);
                let body = || Bytes::from(read_payload(c, loc, len));
                let budget = &mut peers[peer].budget;
                let step =
                    request_in::arrived(budget, limits, &core.counters, (peer, cid), &h, arrived_by, body)?;
                match step {
                    RequestStep::Hold => return Ok(Outcome::Hold),
                    RequestStep::Deliver { pending, header } => self.deliver_request(pending, header),
                    RequestStep::Fetch { pending, segs, len } => {
                        // The request is delivered when its header is here.
                        let then = XferThen::RequestHeader { pending };
                        self.start_xfer(peer, cid, true, segs, 0, Local::Vec(vec![0; len]), len, then);
                    }
                }
                Ok(Outcome::Done)
            }
            Kind::Reply => {
                let body = self.payload(cid, loc, &h);
                self.on_reply(cid, peer, &h, body)?;
                Ok(Outcome::Done)
            }
            Kind::Push => {
                let (mut rx, peers) = self.rx();
                if let Some(op) = rx.push(&peers[peer].cancelled_reqs, peer, (h.b, h.c, len), arrived_by)? {
                    self.copy_payload_into(cid, loc, len, op, h.c as usize);
                }
                Ok(Outcome::Done)
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

    /// Opens and hands over a request whose header is in hand ([`request_in::deliver`]).
    pub(crate) fn deliver_request(&mut self, p: PendingRequest, header: Bytes) {
        let peer = p.peer;
        match request_in::deliver(&mut self.sreqs, p, header) {
            Ok(meta) => {
                self.events += 1;
                self.core.push_request(meta);
            }
            Err(loss) => self.fail_peer(peer, loss),
        }
    }

    /// A REPLY to one of our requests ([`reply::arrived`]): the request completes now, or
    /// once its header is fetched from the server's memory.
    pub(crate) fn on_reply(&mut self, cid: u32, peer: PeerId, h: &Header, body: Vec<u8>) -> Result<(), Loss> {
        let cancelled = &mut self.peers[peer].cancelled_reqs;
        match reply::arrived(&mut self.ops, cancelled, peer, h, body, self.s.cfg.max_header as u64)? {
            ReplyStep::Forget => {}
            ReplyStep::Complete { op, header } => self.complete_request(op, h.aux, header, h.a),
            ReplyStep::Fetch { op, segs, len } => {
                let then = XferThen::ReplyHeader { op, status: h.aux, msg: h.c, pushed: h.a };
                self.start_xfer(peer, cid, true, segs, 0, Local::Vec(vec![0; len]), len, then);
            }
        }
        Ok(())
    }

    /// A reply with its header in hand: the request op completes ([`reply::complete`]).
    pub(crate) fn complete_request(&mut self, op: OpId, st: u32, header: Bytes, pushed: u64) {
        let State { ops, peers, core, .. } = self;
        reply::complete(ops, peers, &core.counters, op, st, header, pushed);
    }
}
