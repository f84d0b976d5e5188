//! The connection handshake on each link: a link we dial says hello once connected, a link
//! we accept waits for the hello, under admission's limits, until its handshake is done.

use std::collections::VecDeque;
use std::mem;
use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;

use crate::comm::Mechanism;
use crate::core::loss::Loss;
use crate::error::{Error, ProtocolError};
use crate::handshake::{self, ClientHandshake, HelloInfo, Hs, HsStep, ServerHandshake};
use crate::info::Counters;
use crate::types::{OpId, PeerId, ServiceLevel};
use crate::wire::{FLAG_INLINE_DATA, FLAG_PAYLOAD_OUT, FLAG_STREAMED, Header, Kind};

use super::link::{Frame, Link, OnDone, Phase};
use super::post::stream_frames;
use super::{Action, LinkId, OpSt, Session};

impl Session {
    /// The driver accepted a link from `remote`; it may read the first bytes into it
    /// ([`Session::recv_buffers`], [`Session::received`]) before [`Session::admit`] counts it.
    pub(crate) fn accepted(&mut self, link: LinkId, remote: SocketAddr) {
        let key = self.s.cfg.cluster_key.clone();
        let hs = ServerHandshake::new(
            self.s.endpoint_id,
            self.s.listen_port,
            self.s.eager_limit as u32,
            self.s.limits.message,
            key,
        );
        let mut c = Link::new(
            remote,
            ServiceLevel::Normal,
            Phase::Handshake(Hs::ServerWaitHello(Box::new(hs))),
            None,
        );
        c.writable = true;
        self.links.insert(link, c);
    }

    /// Admits an accepted link to its handshake at `now` (`heard`: its first bytes are in),
    /// shedding older ones to make room if the limits say so.
    pub(crate) fn admit(&mut self, now: Instant, link: LinkId) {
        let Some(c) = self.links.get_mut(link) else { return };
        c.since = Some(now);
        let (remote, heard) = (c.remote, c.staged() > 0);
        for v in self.admission.admit(now, link, remote.ip()) {
            self.shed(v);
        }
        if heard {
            self.admission.heard(link);
        }
    }

    /// Drops an accepted link to make room for newer ones, telling the client why when no other
    /// frame of ours is half written on it.
    fn shed(&mut self, link: LinkId) {
        let Some(c) = self.links.get(link) else { return };
        tracing::debug!(remote = %c.remote, "shedding a connection in its handshake: handshake limits reached");
        let farewell =
            c.hs_tx.front().is_none_or(|f| f.sent == 0).then(|| handshake::busy_frame(c.sl).encode());
        self.close_link(link, farewell);
    }

    /// The driver started dialling `link` at `now`: the connect deadline runs from here.
    pub(crate) fn dial_started(&mut self, now: Instant, link: LinkId) {
        if let Some(c) = self.links.get_mut(link) {
            c.since = Some(now);
        }
    }

    /// A dialled link is connected at `now`: it says hello.
    pub(crate) fn link_up(&mut self, now: Instant, link: LinkId) {
        let Some(c) = self.links.get_mut(link) else { return };
        if !matches!(c.phase, Phase::Connecting) {
            return;
        }
        // From here the handshake deadline applies.
        c.since = Some(now);
        let key = self.s.cfg.cluster_key.clone();
        let mine = HelloInfo::new(
            self.s.endpoint_id,
            self.s.listen_port,
            self.s.eager_limit as u32,
            self.s.limits.message,
            key.is_some(),
        );
        let (hs, (h, body)) = ClientHandshake::start(c.sl, mine, key);
        c.hs_tx.push_back(Frame::new(h, Bytes::from(body), None, OnDone::Nothing));
        c.phase = Phase::Handshake(Hs::ClientWaitAck(Box::new(hs)));
        if c.writable {
            self.write_ready.insert(link);
        }
        self.act(Action::Resume { link });
        Counters::add(&self.core.counters.connections, 1);
    }

    /// Requests posted while their link was still being set up were queued before we knew
    /// whether the server reads streams: now that it says it does, their payloads stream too.
    pub(super) fn stream_queued_requests(&mut self, link: LinkId, peer: PeerId) {
        let Some(chunk) = self.peers.get(peer).and_then(|p| self.stream_chunk(p)) else { return };
        let Session { links, ops, .. } = self;
        let Some(c) = links.get_mut(link) else { return };
        if !c.tx.iter().any(|f| f.hdr[3] == Kind::Request as u8) {
            return;
        }
        let mut out = VecDeque::with_capacity(c.tx.len());
        for mut f in c.tx.drain(..) {
            let h = Header::decode(&f.hdr).ok().filter(|h| {
                h.kind == Kind::Request
                    && f.sent == 0
                    && h.flags & (FLAG_PAYLOAD_OUT | FLAG_INLINE_DATA | FLAG_STREAMED) == FLAG_PAYLOAD_OUT
                    && h.c > 0
            });
            let o =
                h.and_then(|h| ops.get_mut(&OpId(h.b)).filter(|o| o.st == OpSt::WaitReply).map(|o| (h, o)));
            let Some((mut h, o)) = o else {
                out.push_back(f);
                continue;
            };
            h.flags |= FLAG_STREAMED;
            f.hdr = h.encode();
            out.push_back(f);
            let (op, len) = (OpId(h.b), h.c as usize);
            o.moved = len;
            for f in stream_frames(op, h.sl, len, chunk) {
                out.push_back(f);
                o.refs += 1;
            }
        }
        c.tx = out;
    }

    /// Frames queued on `link` before its handshake were shaped with this end's own eager
    /// limit, the peer's being unknown; now that the peer has said what it accepts unasked,
    /// those above it change shape rather than break the connection: an eager send becomes a
    /// rendezvous, a request's inline payload becomes one the server pulls, and an unexpected
    /// message, which has no other way to travel, fails with `TooLarge`.
    pub(super) fn fit_queued_to_peer_limit(&mut self, link: LinkId, limit: usize) {
        let Session { links, ops, rndv_out, next_msg, .. } = self;
        let Some(c) = links.get_mut(link) else { return };
        let mut out = VecDeque::with_capacity(c.tx.len());
        for mut f in c.tx.drain(..) {
            let Some((op, 0, len)) = f.op_part.filter(|&(_, _, len)| f.sent == 0 && len > limit) else {
                out.push_back(f);
                continue;
            };
            let Ok(mut h) = Header::decode(&f.hdr) else {
                out.push_back(f);
                continue;
            };
            let Some(o) = ops.get_mut(&op) else {
                out.push_back(f);
                continue;
            };
            match h.kind {
                Kind::Eager => {
                    let msg = *next_msg;
                    *next_msg += 1;
                    let mut rts = Header::new(Kind::Rts, h.sl);
                    rts.a = h.a;
                    rts.b = msg;
                    rts.c = len as u64;
                    o.refs -= 1;
                    o.mech = Some(Mechanism::ServerRdma);
                    o.st = OpSt::WaitCts { msg };
                    rndv_out.insert(msg, op);
                    out.push_back(Frame::new(rts, Bytes::new(), None, OnDone::Nothing));
                }
                Kind::Request if h.flags & FLAG_INLINE_DATA != 0 => {
                    h.flags &= !FLAG_INLINE_DATA;
                    h.len -= len as u32;
                    o.refs -= 1;
                    o.mech = Some(Mechanism::ServerRdma);
                    o.moved = 0;
                    f.hdr = h.encode();
                    f.op_part = None;
                    f.done = OnDone::Nothing;
                    out.push_back(f);
                }
                Kind::Unexpected => {
                    o.refs -= 1;
                    ops.complete(op, Err(Error::TooLarge { len: len as u64, max: limit as u64 }));
                }
                _ => out.push_back(f),
            }
        }
        c.tx = out;
    }

    pub(super) fn on_handshake(&mut self, link: LinkId, h: Header, body: Vec<u8>) {
        let Some(c) = self.links.get_mut(link) else { return };
        let Phase::Handshake(hs) = mem::replace(&mut c.phase, Phase::Closing) else {
            return self.protocol_error(link, ProtocolError::Handshake("unexpected handshake frame".into()));
        };
        let (peers, max) = (&self.peers, self.s.cfg.max_peers);
        let step = hs.on_frame(&h, &body, |eid| peers.admits(eid, max), c.remote, &self.core.counters);
        match step {
            HsStep::Send { frame: (fh, fb), next, class } => {
                if let Some(sl) = class {
                    c.sl = sl;
                    self.actions.push_back(Action::Classify { link, sl });
                }
                c.hs_tx.push_back(Frame::new(fh, Bytes::from(fb), None, OnDone::Nothing));
                c.phase = Phase::Handshake(next);
                self.write_ready.insert(link);
            }
            HsStep::Refused { frame: (rh, rb) } => {
                c.hs_tx.push_back(Frame::new(rh, Bytes::from(rb), None, OnDone::Close));
                self.write_ready.insert(link);
            }
            HsStep::Accepted { frame: (rh, rb), client } => {
                let remote = c.remote;
                let sl = c.sl;
                c.hs_tx.push_back(Frame::new(rh, Bytes::from(rb), None, OnDone::Nothing));
                // A newer connection for the same class replaces a stale one (and may take the
                // stale peer's record with it: it is then made anew below).
                if let Some(old_peer) = self.peers.superseded(client.endpoint_id, sl, link) {
                    self.fail_peer(old_peer, Loss::Lost("superseded by a new connection".into()));
                }
                let d = self.new_peer_ext();
                let peer = self.peers.accepted(client.endpoint_id, remote, client.listen_port, || d);
                let p = &mut self.peers[peer];
                p.d.eager_limit = (client.eager_limit as usize).min(self.s.eager_limit);
                p.d.max_message = client.max_message;
                p.d.streams = client.streams;
                p.conns[sl.index()] = Some(link);
                let Some(c) = self.links.get_mut(link) else { return };
                c.peer = Some(peer);
                c.phase = Phase::Ready;
                self.admission.finished(link);
                self.write_ready.insert(link);
                Counters::add(&self.core.counters.connections, 1);
                tracing::debug!(%peer, %remote, %sl, "connection accepted");
            }
            HsStep::Ready { server } => {
                let Some(peer) = c.peer else { return };
                c.phase = Phase::Ready;
                let p = &mut self.peers[peer];
                p.d.eager_limit = (server.eager_limit as usize).min(self.s.eager_limit);
                p.d.max_message = server.max_message;
                p.d.streams = server.streams;
                p.lost = None;
                let limit = p.d.eager_limit;
                self.fit_queued_to_peer_limit(link, limit);
                self.stream_queued_requests(link, peer);
                self.write_ready.insert(link);
            }
            HsStep::Failed(Loss::Protocol(e)) => self.protocol_error(link, e),
            HsStep::Failed(why) => self.fail_link(link, why),
        }
    }
}
