//! Cancellation: an op the application gives up completes once, at once unless its bytes are
//! on the wire; what of it the peer still sends is discarded.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::buffers::buf::OpBuf;
use crate::comm::Mechanism;
use crate::core::requests;
use crate::error::Error;
use crate::op::OpKind;
use crate::types::{OpId, PeerId, ServiceLevel};
use crate::wire::{FLAG_ABORT, Header, Kind};

use super::link::{Frame, OnDone, Rx, Sink};
use super::{OpSt, RndvIn, Session};

impl Session {
    /// Cancels an op of the application: it completes with `why` unless its bytes are on the
    /// wire already (then it completes when they are written).
    pub(crate) fn cancel(&mut self, op: OpId, why: Error) {
        let Some(o) = self.ops.get(&op) else { return };
        let (peer, st, kind, sl, tag) = (o.peer, o.st, o.kind, o.sl, o.tag);
        match st {
            OpSt::Posted => {
                self.matcher.cancel_posted(peer, tag, op);
                self.complete(op, Err(why));
            }
            OpSt::WaitData { msg } => {
                // Matched: whatever of the body still comes is discarded.
                self.rndv_in.insert((peer, msg), RndvIn::Discard);
                self.redirect_sinks_to_discard(op);
                self.complete(op, Err(why));
            }
            OpSt::WaitCts { msg } => {
                // The receiver will ask for the body; it gets an abort instead.
                self.rndv_out.insert(msg, OpId(0));
                self.complete(op, Err(why));
            }
            OpSt::WaitReply => {
                if kind == OpKind::Request {
                    if let Some(p) = self.peers.get_mut(peer) {
                        p.cancelled_reqs.insert(op.0);
                    }
                    self.redirect_sinks_to_discard(op);
                    // What of a streamed payload is not on its way yet stays here.
                    self.truncate_stream(op, peer, sl);
                    self.send_cancel_notice(op, peer, sl);
                }
                self.complete(op, Err(why));
            }
            OpSt::WaitStream => {
                // Its bytes, should they come, are discarded if no other pull takes them.
                for s in self.streams.values_mut() {
                    s.pulls.retain(|_, (p, _)| *p != op);
                }
                self.redirect_sinks_to_discard(op);
                self.complete(op, Err(why));
            }
            OpSt::Receiving | OpSt::WaitAck | OpSt::WaitResp | OpSt::WaitPullData => {
                // Late answers find no op and are discarded.
                self.redirect_sinks_to_discard(op);
                self.complete(op, Err(why));
            }
            // Bytes already on the wire finish; the op completes when they are written.
            OpSt::Writing | OpSt::Finishing => {}
        }
    }

    /// Tells the server that request `op` is cancelled. The notice goes behind the request on
    /// its connection, which keeps it after the request. But a server reads no further into a
    /// streamed payload than its pulls reach, so a notice behind payload bytes already in the
    /// socket would wait for pulls the server has no reason to post: for a streamed request it
    /// goes on another class's connection too (dialled if need be), where nothing holds it up.
    fn send_cancel_notice(&mut self, op: OpId, peer: PeerId, sl: ServiceLevel) {
        let notice = |sl| Frame::new(requests::cancel_notice(sl, op), Bytes::new(), None, OnDone::Nothing);
        if let Some(link) = self.peers.get(peer).and_then(|p| p.conns[sl.index()]) {
            self.queue(link, notice(sl));
        }
        let streamed = self
            .ops
            .get(&op)
            .is_some_and(|o| matches!(o.buf, OpBuf::Send(_)) && o.mech == Some(Mechanism::ServerRdma))
            && self.peers.get(peer).is_some_and(|p| self.stream_chunk(p).is_some());
        if streamed {
            let other =
                if sl == ServiceLevel::Control { ServiceLevel::Normal } else { ServiceLevel::Control };
            if let Ok(link) = self.link_for(peer, other) {
                self.queue(link, notice(other));
            }
        }
    }

    /// Server side: whether the client's CANCEL_REQUEST for open request `req` has arrived.
    pub(crate) fn request_cancelled(&self, peer: PeerId, req: u64) -> bool {
        self.sreqs.is_cancelled(peer, req)
    }

    /// A receive in progress into `op`'s buffer keeps reading, but into the void.
    pub(super) fn redirect_sinks_to_discard(&mut self, op: OpId) {
        for c in self.links.values_mut() {
            if let Rx::Payload { sink, .. } = &mut c.rx
                && matches!(sink, Sink::Op { op: o, .. } if *o == op)
            {
                *sink = Sink::Discard;
            }
        }
    }

    /// Stops a streamed request's payload where it stands (the request was cancelled or
    /// answered): frames not yet begun are dropped, the one being written keeps its bytes
    /// (copied, so the op need not hold its buffer for it), and an abort at the cut tells the
    /// server that nothing more comes.
    pub(super) fn truncate_stream(&mut self, op: OpId, peer: PeerId, sl: ServiceLevel) {
        let Some(link) = self.peers.get(peer).and_then(|p| p.conns[sl.index()]) else { return };
        let Session { links, ops, .. } = self;
        let (Some(c), Some(o)) = (links.get_mut(link), ops.get_mut(&op)) else { return };
        let ours = |f: &Frame| f.hdr[3] == Kind::Stream as u8 && f.op_part.is_some_and(|p| p.0 == op);
        if !c.tx.iter().any(ours) {
            return;
        }
        let mut kept = VecDeque::with_capacity(c.tx.len());
        let mut cut = None;
        for mut f in c.tx.drain(..) {
            let Some((_, off, n)) = f.op_part.filter(|_| ours(&f)) else {
                kept.push_back(f);
                continue;
            };
            o.refs = o.refs.saturating_sub(1);
            if f.sent > 0 {
                // Partly written: the rest must follow (the stream is framed).
                let mut copy = Vec::with_capacity(n);
                if let OpBuf::Send(b) = &o.buf {
                    b.for_each_slice(off, n, |x| copy.extend_from_slice(x));
                }
                f.prefix = Bytes::from(copy);
                f.op_part = None;
                f.done = OnDone::Nothing;
                kept.push_back(f);
            } else if cut.is_none() {
                cut = Some(off as u64);
                let mut h = Header::new(Kind::Stream, sl);
                h.flags = FLAG_ABORT;
                h.b = op.0;
                h.c = off as u64;
                kept.push_back(Frame::new(h, Bytes::new(), None, OnDone::Nothing));
            }
        }
        c.tx = kept;
        if o.refs == 0 && o.outcome.is_some() {
            self.ops.deliver(op);
        }
    }
}
