//! Frames arriving on a link: the receive state machine over the staging buffer and direct
//! reads, and what each frame does — matched, buffered within the peer's budget, or routed
//! straight into the buffer it is for.

use std::mem;

use bytes::Bytes;

use crate::buffers::buf::OpBuf;
use crate::comm::Mechanism;
use crate::core::loss::Loss;
use crate::core::requests::{self, PushInto, Req};
use crate::error::{AccessError, Error, ProtocolError};
use crate::info::Counters;
use crate::matching::Arrival;
use crate::op::{OpKind, Unexpected};
use crate::types::{Access, OpId, PeerId};
use crate::wire::{self, FLAG_ABORT, FLAG_INLINE_DATA, FLAG_STREAMED, HEADER_LEN, Header, Kind, Limits};

use super::link::{Frame, Lent, OnDone, RecvInto, RecvIov, Rx, Sink, sink_slices, sink_write};
use super::stream_in::StreamIn;
use super::{
    Action, CTS_TRUNCATED, DIRECT_READ_MIN, Delivery, Early, LinkId, OpSt, RTS_COST, RX_BUF, RndvIn, Session,
    StreamReq, unexpected,
};

/// What a link needs next, once what is staged is consumed.
enum Need {
    /// Bytes into the staging buffer, at most this many.
    Staging(usize),
    /// Bytes straight into the payload's destination, this many.
    Sink(usize),
    /// Nothing now.
    Paused,
}

/// Where a payload stands after taking what was staged.
enum Fed {
    Complete,
    Wants { remaining: usize, direct: bool },
}

impl Session {
    /// Consumes what is staged on `link`, then says where its next bytes go. Answer with
    /// [`Session::received`].
    pub(crate) fn recv_buffers(&mut self, link: LinkId) -> RecvInto<'_> {
        match self.consume_staged(link) {
            Need::Paused => RecvInto::Paused,
            Need::Staging(max) => {
                let Some(c) = self.links.get_mut(link) else { return RecvInto::Paused };
                let (from, to) = c.staging_room(max);
                c.lent = Lent::Staging;
                RecvInto::Staging(&mut c.rxbuf[from..to])
            }
            Need::Sink(remaining) => {
                let Session { links, ops, .. } = self;
                let Some(c) = links.get_mut(link) else { return RecvInto::Paused };
                c.lent = Lent::Sink;
                let Rx::Payload { sink, got, .. } = &mut c.rx else { return RecvInto::Paused };
                let mut dst = RecvIov::new();
                sink_slices(sink, *got, remaining, ops, &mut dst);
                RecvInto::Direct(dst)
            }
        }
    }

    /// `n` bytes landed where [`Session::recv_buffers`] said (0 is not an end of stream: the
    /// driver reports that with [`Session::link_failed`]).
    #[inline]
    pub(crate) fn received(&mut self, link: LinkId, n: usize) {
        let Some(c) = self.links.get_mut(link) else { return };
        match mem::replace(&mut c.lent, Lent::Nothing) {
            Lent::Staging => {
                c.rx_end += n;
                if !c.is_ready() && n > 0 {
                    self.admission.heard(link);
                }
            }
            Lent::Sink => {
                c.bulk = true;
                if let Rx::Payload { hdr, got, .. } = &mut c.rx {
                    *got += n;
                    if *got == hdr.len as usize {
                        self.finish_payload(link);
                    }
                }
            }
            Lent::Nothing => {}
        }
    }

    /// If a driver may block reading `link` alone, straight into its staging buffer, lends it
    /// that (empty) buffer and says how many bytes to read at most: the link is established
    /// with nothing staged or to send, and what it reads next is small (a large remainder is
    /// read straight into its destination instead; after one, a header is read alone). Give the
    /// buffer back with [`Session::return_staging`].
    pub(crate) fn lend_for_direct_read(&mut self, link: LinkId) -> Option<(Box<[u8]>, usize)> {
        let c = self.links.get_mut(link)?;
        let rx_small = match &c.rx {
            Rx::Header => true,
            Rx::Payload { hdr, got, .. } => {
                (hdr.len as usize).saturating_sub(*got) < DIRECT_READ_MIN && !c.bulk
            }
            Rx::Stalled(_) | Rx::Stream { .. } => false,
        };
        if !(c.is_ready() && c.staged() == 0 && rx_small && !c.has_frames()) {
            return None;
        }
        let want = if c.bulk { HEADER_LEN } else { RX_BUF };
        c.rx_start = 0;
        c.rx_end = 0;
        Some((mem::take(&mut c.rxbuf), want))
    }

    /// The staging buffer comes back with `n` bytes read into it; false if the link is gone.
    pub(crate) fn return_staging(&mut self, link: LinkId, buf: Box<[u8]>, n: usize) -> bool {
        let Some(c) = self.links.get_mut(link) else { return false };
        c.rxbuf = buf;
        c.rx_end = n;
        true
    }

    fn consume_staged(&mut self, link: LinkId) -> Need {
        loop {
            let Some(c) = self.links.get_mut(link) else { return Need::Paused };
            match &mut c.rx {
                Rx::Stalled(_) => return Need::Paused,
                // At the peer's transmit bound: read nothing more until its answers drain.
                Rx::Header
                    if !self.tx_paused.is_empty()
                        && c.peer.and_then(|p| self.peers.get(p)).is_some_and(|p| p.d.tx_paused) =>
                {
                    return Need::Paused;
                }
                Rx::Header => {
                    if c.staged() < HEADER_LEN {
                        let max = if c.bulk { HEADER_LEN - c.staged() } else { usize::MAX };
                        return Need::Staging(max);
                    }
                    let raw = &c.rxbuf[c.rx_start..c.rx_start + HEADER_LEN];
                    let hdr = Header::decode(raw).and_then(|h| {
                        let lim = if c.is_ready() {
                            self.s.limits
                        } else {
                            Limits { eager: 0, chunk: 0, header: 0, message: 0 }
                        };
                        h.check_limits(&lim).map(|_| h)
                    });
                    c.rx_start += HEADER_LEN;
                    if let Ok(h) = &hdr
                        && (h.len as usize) < DIRECT_READ_MIN
                    {
                        // Small frames: back to reading as much as there is.
                        c.bulk = false;
                    }
                    match hdr {
                        Ok(h) => self.on_header(link, h),
                        Err(e) => {
                            self.protocol_error(link, ProtocolError::Wire(e));
                            return Need::Paused;
                        }
                    }
                }
                &mut Rx::Stream { req, left } => {
                    if !self.stream_route(link, req, left) {
                        return Need::Paused;
                    }
                }
                Rx::Payload { .. } => match self.feed_staged(link) {
                    Fed::Complete => self.finish_payload(link),
                    Fed::Wants { remaining, direct: true } => return Need::Sink(remaining),
                    Fed::Wants { .. } => return Need::Staging(usize::MAX),
                },
            }
        }
    }

    /// Moves staged payload bytes into the frame's sink.
    fn feed_staged(&mut self, link: LinkId) -> Fed {
        let Session { links, ops, exposures, .. } = self;
        let Some(c) = links.get_mut(link) else { return Fed::Complete };
        let Rx::Payload { hdr, sink, got } = &mut c.rx else { return Fed::Complete };
        let total = hdr.len as usize;
        let avail = c.rx_end - c.rx_start;
        if avail > 0 && *got < total {
            let n = avail.min(total - *got);
            sink_write(sink, *got, &c.rxbuf[c.rx_start..c.rx_start + n], ops, exposures);
            *got += n;
            c.rx_start += n;
        }
        if *got >= total {
            return Fed::Complete;
        }
        let remaining = total - *got;
        // Once a body is read directly, its tail is too: staging the tail would also stage the
        // start of whatever follows.
        let memory = match sink {
            Sink::Vec(_) => true,
            Sink::Op { op, .. } => matches!(ops.get(op), Some(o) if matches!(o.buf, OpBuf::Recv(_))),
            Sink::Discard | Sink::Exposure { .. } => false,
        };
        Fed::Wants { remaining, direct: memory && (remaining >= DIRECT_READ_MIN || c.bulk) }
    }

    fn finish_payload(&mut self, link: LinkId) {
        if let Some(c) = self.links.get_mut(link)
            && let Rx::Payload { hdr, sink, .. } = mem::replace(&mut c.rx, Rx::Header)
        {
            self.on_payload(link, hdr, sink);
        }
    }

    pub(super) fn set_rx(&mut self, link: LinkId, rx: Rx) {
        if let Some(c) = self.links.get_mut(link) {
            c.rx = rx;
        }
    }

    /// Decides where a frame's payload goes (or handles a payload-less frame).
    fn on_header(&mut self, link: LinkId, h: Header) {
        let Some(c) = self.links.get(link) else { return };
        if !c.is_ready() {
            if !h.kind.is_handshake() {
                self.protocol_error(
                    link,
                    ProtocolError::Handshake(format!("{:?} frame before the handshake completed", h.kind)),
                );
                return;
            }
            self.set_rx(link, Rx::Payload { hdr: h, sink: Sink::Vec(vec![0; h.len as usize]), got: 0 });
            if h.len == 0 {
                self.finish_empty(link);
            }
            return;
        }
        if h.kind.is_handshake() {
            self.protocol_error(
                link,
                ProtocolError::Handshake("handshake frame on an established connection".into()),
            );
            return;
        }
        let Some(peer) = c.peer else { return };
        let len = h.len as usize;
        let sink = match h.kind {
            Kind::Eager => match self.matcher.take_posted(peer, h.a) {
                Some((op, ())) => {
                    if self.eager_from_staging(link, op, &h) {
                        return;
                    }
                    let cap = self.recv_capacity(op);
                    if len > cap {
                        self.complete(op, Err(Error::Truncated { len: len as u64, capacity: cap as u64 }));
                        Sink::Discard
                    } else {
                        if let Some(o) = self.ops.get_mut(&op) {
                            o.st = OpSt::Receiving;
                            o.sl = h.sl;
                            o.mech = Some(Mechanism::Inline);
                        }
                        Sink::Op { op, base: 0 }
                    }
                }
                None => {
                    if !self.reserve(peer, link, h, len) {
                        return;
                    }
                    Sink::Vec(vec![0; len])
                }
            },
            Kind::Unexpected => {
                let (max, limit) = (self.s.cfg.unexpected_per_peer, self.s.cfg.early_bytes_per_peer);
                if !self.peers[peer].budget.admit_unexpected(len, max, limit) {
                    self.stall(peer, link, h);
                    return;
                }
                Sink::Vec(vec![0; len])
            }
            Kind::Rts => {
                match self.matcher.arrive_or_return(peer, h.a, Early::Rts { msg: h.b, total: h.c, link }) {
                    Arrival::Matched(op, ()) => self.accept_rts(op, peer, h.b, h.c, link),
                    Arrival::Unmatched(early) => {
                        if !self.reserve(peer, link, h, RTS_COST) {
                            return;
                        }
                        self.matcher.queue_early(peer, h.a, early);
                    }
                    Arrival::Queued => {}
                }
                return self.finish_header_only(link);
            }
            Kind::Cts => {
                self.on_cts(link, peer, h);
                return self.finish_header_only(link);
            }
            Kind::Data => match self.rndv_in.remove(&(peer, h.b)) {
                Some(RndvIn::Op(op)) => {
                    let expect = self.ops.get(&op).map_or(0, |o| o.expect);
                    if h.flags & FLAG_ABORT != 0 {
                        self.complete(op, Err(Error::PeerCancelled));
                        Sink::Discard
                    } else if h.len as u64 != expect {
                        self.protocol_error(
                            link,
                            unexpected(format!("rendezvous body of {} bytes, announced {expect}", h.len)),
                        );
                        return;
                    } else {
                        Sink::Op { op, base: 0 }
                    }
                }
                Some(RndvIn::Discard) => Sink::Discard,
                None => {
                    self.protocol_error(link, unexpected(format!("DATA for unknown transfer {}", h.b)));
                    return;
                }
            },
            Kind::Request => {
                let (max, limit) = (self.s.cfg.requests_per_peer, self.s.cfg.early_bytes_per_peer);
                if !self.peers[peer].budget.admit_request(len, max, limit) {
                    self.stall(peer, link, h);
                    return;
                }
                Sink::Vec(vec![0; len])
            }
            Kind::Pull => {
                self.on_pull(link, peer, h);
                return self.finish_header_only(link);
            }
            Kind::Stream => {
                self.on_stream_header(link, peer, h);
                return;
            }
            Kind::PullData => {
                let op = OpId(h.a);
                match self.ops.get(&op) {
                    Some(o) if o.peer == peer && o.kind == OpKind::Pull && o.st == OpSt::WaitPullData => {
                        if h.flags & FLAG_ABORT != 0 {
                            self.complete(op, Err(Error::PeerCancelled));
                            Sink::Discard
                        } else if u64::from(h.len) != o.expect {
                            self.protocol_error(
                                link,
                                unexpected("PULL_DATA length differs from the pull".into()),
                            );
                            return;
                        } else {
                            Sink::Op { op, base: 0 }
                        }
                    }
                    // A pull we gave up (deadline, cancel): discard.
                    _ => Sink::Discard,
                }
            }
            Kind::Push => {
                let cancelled = &self.peers[peer].cancelled_reqs;
                match requests::incoming_push(&mut self.ops, cancelled, peer, h.b, h.c, len) {
                    Ok(PushInto::Op(op)) => Sink::Op { op, base: h.c as usize },
                    Ok(PushInto::Discard) => Sink::Discard,
                    Err(e) => {
                        self.protocol_error(link, e);
                        return;
                    }
                }
            }
            Kind::Reply => Sink::Vec(vec![0; len]),
            Kind::Put => {
                let denied = self.exposures.validate(h.b, h.c, u64::from(h.len), Access::WRITE).err();
                if let Some(d) = denied {
                    tracing::debug!(%peer, error = %d, "put refused");
                    Counters::add(&self.core.counters.access_denied, 1);
                }
                Sink::Exposure { key: h.b, addr: h.c, denied }
            }
            Kind::PutAck => {
                let op = OpId(h.a);
                if let Some(o) = self.ops.get(&op)
                    && o.peer == peer
                    && o.kind == OpKind::Put
                    && o.st == OpSt::WaitAck
                {
                    let r = match AccessError::from_code(h.aux as u8) {
                        None if h.aux == 0 => Ok(o.buf.send_len()),
                        Some(a) => Err(Error::RemoteAccess(a)),
                        None => Err(Error::Remote(format!("put failed with status {}", h.aux))),
                    };
                    self.complete(op, r);
                }
                return self.finish_header_only(link);
            }
            Kind::Get => {
                self.on_get(link, peer, h);
                return self.finish_header_only(link);
            }
            Kind::GetResp => {
                let op = OpId(h.a);
                match self.ops.get(&op) {
                    Some(o) if o.peer == peer && o.kind == OpKind::Get && o.st == OpSt::WaitResp => {
                        if h.aux != 0 {
                            let e = match AccessError::from_code(h.aux as u8) {
                                Some(a) => Error::RemoteAccess(a),
                                None => Error::Remote(format!("get failed with status {}", h.aux)),
                            };
                            self.complete(op, Err(e));
                            Sink::Discard
                        } else if u64::from(h.len) != o.expect {
                            self.protocol_error(
                                link,
                                unexpected("GET_RESP length differs from the get".into()),
                            );
                            return;
                        } else {
                            Sink::Op { op, base: 0 }
                        }
                    }
                    _ => Sink::Discard,
                }
            }
            Kind::CancelRequest => {
                self.sreqs.cancelled_by_client(peer, h.b);
                self.stream_cancelled((peer, h.b));
                return self.finish_header_only(link);
            }
            Kind::Bye => {
                self.fail_link(link, Loss::Lost("peer closed the connection".into()));
                return;
            }
            Kind::Credit | Kind::Fin | Kind::Rdv => {
                self.protocol_error(link, unexpected(format!("{:?} frame on a TCP connection", h.kind)));
                return;
            }
            Kind::Hello | Kind::HelloAck | Kind::Auth | Kind::Ready | Kind::IbInfo | Kind::IbReady => {
                unreachable!("handled above")
            }
        };
        self.set_rx(link, Rx::Payload { hdr: h, sink, got: 0 });
        if len == 0 {
            self.finish_empty(link);
        }
    }

    /// A matched eager message whose payload is already wholly staged (the usual case for small
    /// messages) is copied and completed at once, without going through the payload state. The
    /// op is found, filled and completed in one lookup instead of one each for its capacity, its
    /// buffer and its completion. A message that is not all staged, or does not fit
    /// (truncation), is left to the general path.
    fn eager_from_staging(&mut self, link: LinkId, op: OpId, h: &Header) -> bool {
        let len = h.len as usize;
        let Session { links, ops, .. } = self;
        let Some(c) = links.get_mut(link) else { return false };
        if c.rx_end - c.rx_start < len {
            return false;
        }
        let done = ops.complete_with(op, |o| {
            let OpBuf::Recv(b) = &mut o.buf else { return None };
            if b.capacity() < len {
                return None;
            }
            b.copy_in(0, &c.rxbuf[c.rx_start..c.rx_start + len]);
            o.sl = h.sl;
            o.mech = Some(Mechanism::Inline);
            Some(Ok(len))
        });
        if done {
            c.rx_start += len;
            Counters::add(&self.core.counters.msgs_received, 1);
        }
        done
    }

    pub(super) fn finish_header_only(&mut self, link: LinkId) {
        self.set_rx(link, Rx::Header);
    }

    fn finish_empty(&mut self, link: LinkId) {
        if let Some(c) = self.links.get_mut(link)
            && let Rx::Payload { hdr, sink, .. } = mem::replace(&mut c.rx, Rx::Header)
        {
            self.on_payload(link, hdr, sink);
        }
    }

    fn recv_capacity(&self, op: OpId) -> usize {
        match self.ops.get(&op).map(|o| &o.buf) {
            Some(OpBuf::Recv(b)) => b.capacity(),
            _ => 0,
        }
    }

    /// Reserves `cost` bytes of the peer's budget for buffering, or stalls the connection.
    fn reserve(&mut self, peer: PeerId, link: LinkId, h: Header, cost: usize) -> bool {
        if !self.peers[peer].budget.reserve(cost, self.s.cfg.early_bytes_per_peer) {
            self.stall(peer, link, h);
            return false;
        }
        true
    }

    fn stall(&mut self, peer: PeerId, link: LinkId, h: Header) {
        tracing::trace!(%peer, kind = ?h.kind, "back-pressure: pausing reads");
        Counters::add(&self.core.counters.backpressure_pauses, 1);
        self.set_rx(link, Rx::Stalled(h));
        self.peers[peer].stall(link);
    }

    /// Re-evaluates stalled frames of a peer after it consumed something.
    pub(super) fn unstall(&mut self, peer: PeerId) {
        let Some(p) = self.peers.get_mut(peer) else { return };
        if p.stalled.is_empty() {
            return;
        }
        for link in mem::take(&mut p.stalled) {
            if let Some(c) = self.links.get_mut(link)
                && let Rx::Stalled(h) = c.rx
            {
                c.rx = Rx::Header;
                // Put the header back in front of the staged bytes and parse it again.
                c.unparse(&h);
                self.actions.push_back(Action::Resume { link });
            }
        }
    }

    fn on_cts(&mut self, link: LinkId, peer: PeerId, h: Header) {
        let Some(op) = self.rndv_out.remove(&h.b) else {
            self.protocol_error(link, unexpected(format!("CTS for unknown transfer {}", h.b)));
            return;
        };
        let mut data = Header::new(Kind::Data, h.sl);
        data.b = h.b;
        data.flags = wire::FLAG_LAST;
        if op == OpId(0) {
            // We cancelled this send: tell the receiver.
            data.flags |= FLAG_ABORT;
            self.queue(link, Frame::new(data, Bytes::new(), None, OnDone::Nothing));
            return;
        }
        let Some(o) = self.ops.get_mut(&op) else { return };
        if o.peer != peer {
            self.protocol_error(link, unexpected("CTS from the wrong peer".into()));
            return;
        }
        if h.aux == CTS_TRUNCATED {
            let len = o.expect;
            self.complete(op, Err(Error::Truncated { len, capacity: h.c }));
            return;
        }
        let len = o.expect as usize;
        o.st = OpSt::Writing;
        data.len = len as u32;
        self.queue(link, Frame::new(data, Bytes::new(), Some((op, 0, len)), OnDone::Complete(op)));
    }

    fn on_pull(&mut self, link: LinkId, peer: PeerId, h: Header) {
        let op = OpId(h.b);
        let mut resp = Header::new(Kind::PullData, h.sl);
        resp.a = h.a;
        resp.b = h.b;
        let ok = match self.ops.awaiting_reply(op, peer) {
            Some(o) => {
                let total = o.buf.send_len() as u64;
                matches!(o.buf, OpBuf::Send(_))
                    && h.c.checked_add(u64::from(h.aux)).is_some_and(|e| e <= total)
            }
            _ if self.peers[peer].cancelled_reqs.contains(&h.b) => false,
            _ => {
                self.protocol_error(link, unexpected(format!("PULL for unknown request {}", h.b)));
                return;
            }
        };
        if !ok {
            resp.flags = FLAG_ABORT;
            resp.aux = 1;
            self.queue_answer(link, peer, Frame::new(resp, Bytes::new(), None, OnDone::Nothing));
            return;
        }
        resp.len = h.aux;
        if let Some(o) = self.ops.get_mut(&op) {
            o.moved += h.aux as usize;
        }
        self.queue_answer(
            link,
            peer,
            Frame::new(resp, Bytes::new(), Some((op, h.c as usize, h.aux as usize)), OnDone::Release(op)),
        );
    }

    fn on_get(&mut self, link: LinkId, peer: PeerId, h: Header) {
        let mut resp = Header::new(Kind::GetResp, h.sl);
        resp.a = h.a;
        match self.exposures.validate(h.b, h.c, u64::from(h.aux), Access::READ) {
            Ok(bytes) => {
                // The exposure may be revoked before this is written: send a snapshot.
                let data = Bytes::copy_from_slice(bytes);
                resp.len = data.len() as u32;
                self.queue_answer(link, peer, Frame::new(resp, data, None, OnDone::Nothing));
            }
            Err(e) => {
                tracing::debug!(%peer, error = %e, "get refused");
                Counters::add(&self.core.counters.access_denied, 1);
                resp.aux = u32::from(e.code());
                self.queue_answer(link, peer, Frame::new(resp, Bytes::new(), None, OnDone::Nothing));
            }
        }
    }

    /// A frame's payload is complete.
    pub(super) fn on_payload(&mut self, link: LinkId, h: Header, sink: Sink) {
        let Some(c) = self.links.get(link) else { return };
        if !c.is_ready() {
            let Sink::Vec(body) = sink else { return };
            self.on_handshake(link, h, body);
            return;
        }
        let Some(peer) = c.peer else { return };
        match (h.kind, sink) {
            (Kind::Eager, Sink::Op { op, .. }) | (Kind::Data, Sink::Op { op, .. }) => {
                Counters::add(&self.core.counters.msgs_received, 1);
                self.complete(op, Ok(h.len as usize));
            }
            (Kind::Eager, Sink::Vec(v)) => {
                // A receive may have been posted while the payload was arriving.
                let early = Early::Eager { data: Bytes::from(v), sl: h.sl };
                match self.matcher.take_posted(peer, h.a) {
                    Some((op, ())) => self.match_early(op, peer, early),
                    None => self.matcher.queue_early(peer, h.a, early),
                }
            }
            (Kind::Unexpected, Sink::Vec(v)) => {
                Counters::add(&self.core.counters.msgs_received, 1);
                self.events += 1;
                self.peers[peer].budget.queued(v.len());
                self.delivered.push(Delivery::Unexpected(Unexpected {
                    peer,
                    tag: h.a,
                    sl: h.sl,
                    data: Bytes::from(v),
                }));
            }
            (Kind::Request, Sink::Vec(v)) => {
                Counters::add(&self.core.counters.msgs_received, 1);
                let cost = v.len();
                let mut all = Bytes::from(v);
                let header = all.split_to(h.aux as usize);
                let dir = match requests::direction(h.flags, h.c) {
                    Ok(dir) => dir,
                    Err(e) => return self.protocol_error(link, e),
                };
                let streamed = h.flags & FLAG_STREAMED != 0;
                let mut r: Req<StreamReq> = Req::new(h.sl, dir, h.c, cost);
                r.inline = (h.flags & FLAG_INLINE_DATA != 0).then_some(all);
                r.x.streamed = streamed;
                // A streamed payload of an answered request may still be arriving: its id
                // stays taken until it has.
                if self.streams.contains_key(&(peer, h.b)) {
                    return self.protocol_error(link, requests::reused(h.b));
                }
                let meta = match self.sreqs.arrived(peer, h.a, h.b, header, r) {
                    Ok(meta) => meta,
                    Err(e) => return self.protocol_error(link, e),
                };
                if streamed {
                    self.streams.insert((peer, h.b), StreamIn::new(h.c));
                }
                self.events += 1;
                self.delivered.push(Delivery::Request(meta));
            }
            (Kind::Reply, Sink::Vec(v)) => {
                let op = OpId(h.b);
                let cancelled = &mut self.peers[peer].cancelled_reqs;
                match requests::incoming_reply(&mut self.ops, cancelled, peer, h.b) {
                    Ok(Some(o)) => {
                        Counters::add(&self.core.counters.msgs_received, 1);
                        // No RDMA here: the pushes the read saw say how far it goes.
                        let moved = requests::reply_moved(o, 0);
                        if matches!(o.buf, OpBuf::Recv(_)) {
                            // A read: the server's pushes were eager or rendezvous by size.
                            let eager = self.s.eager_limit;
                            o.mech =
                                Some(if moved <= eager { Mechanism::Inline } else { Mechanism::ServerRdma });
                        }
                        let r = requests::reply_result(o, h.aux, Bytes::from(v), moved);
                        // Answered before all of a streamed payload went out: the rest stays.
                        if o.refs > 0 {
                            let sl = o.sl;
                            self.truncate_stream(op, peer, sl);
                        }
                        self.complete(op, r);
                    }
                    Ok(None) => {}
                    Err(e) => self.protocol_error(link, e),
                }
            }
            (Kind::PullData, Sink::Op { op, .. }) | (Kind::GetResp, Sink::Op { op, .. }) => {
                self.complete(op, Ok(h.len as usize));
            }
            (Kind::Push, _) => {}
            (Kind::Stream, sink) => self.on_stream_run(link, peer, h, sink),
            (Kind::Put, Sink::Exposure { denied, .. }) => {
                let mut ack = Header::new(Kind::PutAck, h.sl);
                ack.a = h.a;
                ack.aux = denied.map_or(0, |d| u32::from(d.code()));
                self.queue_answer(link, peer, Frame::new(ack, Bytes::new(), None, OnDone::Nothing));
            }
            _ => {}
        }
    }
}
