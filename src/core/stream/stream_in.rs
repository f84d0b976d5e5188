//! Streamed request payloads on the server: their bytes arrive in order behind the request
//! and each goes into the posted pull that covers it; the link waits while none does.

use std::mem;

use crate::buffers::buf::{OpBuf, RecvBuf};
use crate::comm::Mechanism;
use crate::error::{Error, Result};
use crate::op::OpKind;
use crate::types::{OpId, PeerId, ServiceLevel};
use crate::wire::{FLAG_ABORT, Header, Kind};

use super::link::{Rx, Sink};
use super::{Action, LinkId, OpSt, Session, unexpected};

/// posted pull that covers it, and the connection waits while none does. Once the request is
/// answered (or the client stops the stream) bytes no pull covers are discarded. Kept until
/// every byte up to `end` has been routed.
pub(super) struct StreamIn {
    /// Where the payload ends: its length, or where the client stopped the stream.
    pub end: u64,
    /// Offset the next STREAM frame must start at.
    pub wire: u64,
    /// Bytes routed so far (into pulls or discarded): the next byte to route is at `routed`.
    pub routed: u64,
    /// Pulls posted and not yet filled, by offset: (op, length).
    pub pulls: std::collections::BTreeMap<u64, (OpId, usize)>,
    /// The connection waiting for a pull at `routed`.
    pub stalled: Option<LinkId>,
    /// Nobody will pull what is not pulled yet (answered, dropped, or the client stopped).
    pub discard: bool,
}

impl Session {
    /// A pull of a streamed payload: it is filled as the stream reaches it, in order, and the
    /// connection that waits for it goes on.
    pub(super) fn post_stream_pull(
        &mut self,
        op: OpId,
        peer: PeerId,
        req: u64,
        sl: ServiceLevel,
        offset: u64,
        buf: RecvBuf,
    ) -> Result<()> {
        let len = buf.capacity();
        let key = (peer, req);
        let Some(s) = self.streams.get(&key) else {
            return Err(Error::misuse("pull of a streamed payload the stream has already passed"));
        };
        let end = offset + len as u64;
        if end > s.end {
            // The client stopped the stream before this range.
            self.fail_new(op, OpKind::Pull, peer, 0, OpBuf::Recv(buf), Error::PeerCancelled);
            return Ok(());
        }
        let before = s.pulls.range(..end).next_back().map(|(&at, &(_, n))| at + n as u64);
        if offset < s.routed || before.is_some_and(|e| e > offset) {
            return Err(Error::misuse("pull overlaps bytes already routed or another pull"));
        }
        if len == 0 {
            self.ops.done_new(op, OpKind::Pull, peer, 0, OpBuf::Recv(buf), Ok(0));
            return Ok(());
        }
        let waiting_here = s.stalled.is_some() && offset <= s.routed && s.routed < end;
        self.insert_op(op, OpKind::Pull, peer, 0, sl, OpBuf::Recv(buf), OpSt::WaitStream);
        if let Some(o) = self.ops.get_mut(&op) {
            o.mech = Some(Mechanism::ServerRdma);
            o.expect = len as u64;
        }
        if let Some(s) = self.streams.get_mut(&key) {
            s.pulls.insert(offset, (op, len));
        }
        if waiting_here {
            self.stream_unstall(key);
        }
        Ok(())
    }

    /// A STREAM frame's header: the next piece of a streamed payload, in order, or the client's
    /// word that the stream stops here.
    pub(super) fn on_stream_header(&mut self, link: LinkId, peer: PeerId, h: Header) {
        let key = (peer, h.b);
        let Some(s) = self.streams.get_mut(&key) else {
            self.protocol_error(link, unexpected(format!("STREAM for unknown request {}", h.b)));
            return;
        };
        if h.c != s.wire {
            let why = format!("STREAM at offset {} of request {}, expected {}", h.c, h.b, s.wire);
            self.protocol_error(link, unexpected(why));
            return;
        }
        if h.flags & FLAG_ABORT != 0 {
            // Everything before `c` has been routed (frames are read in order); nothing more
            // comes, so no posted pull can be filled.
            s.end = h.c;
            s.discard = true;
            let pulls = mem::take(&mut s.pulls);
            for (op, _) in pulls.into_values() {
                self.complete(op, Err(Error::PeerCancelled));
            }
            self.stream_maybe_done(key);
            return self.finish_header_only(link);
        }
        if h.c + u64::from(h.len) > s.end {
            self.protocol_error(link, unexpected(format!("STREAM past the end of request {}", h.b)));
            return;
        }
        s.wire += u64::from(h.len);
        self.set_rx(link, Rx::Stream { req: h.b, left: h.len });
    }

    /// Routes the rest of a STREAM frame: the next run goes into the pull that covers the next
    /// byte, or into the void once nobody will pull it. If neither, the connection waits (its
    /// bytes stay in the socket) until a pull or the answer comes: returns false.
    pub(super) fn stream_route(&mut self, link: LinkId, req: u64, left: u32) -> bool {
        let Some(c) = self.links.get(link) else { return false };
        let (Some(peer), sl) = (c.peer, c.sl) else { return false };
        let Some(s) = self.streams.get_mut(&(peer, req)) else {
            self.protocol_error(link, unexpected(format!("STREAM for unknown request {req}")));
            return false;
        };
        let off = s.routed;
        let covering = s.pulls.range(..=off).next_back().map(|(&at, &(op, len))| (at, op, len));
        let (sink, n) = match covering {
            Some((at, op, len)) if off < at + len as u64 => {
                let n = (at + len as u64 - off).min(u64::from(left)) as u32;
                (Sink::Op { op, base: (off - at) as usize }, n)
            }
            _ if s.discard => (Sink::Discard, left),
            _ => {
                s.stalled = Some(link);
                return false;
            }
        };
        let mut run = Header::new(Kind::Stream, sl);
        run.b = req;
        run.c = off;
        run.len = n;
        run.aux = left - n;
        self.set_rx(link, Rx::Payload { hdr: run, sink, got: 0 });
        true
    }

    /// A run of a STREAM frame is in: it fills (part of) a pull; the frame goes on, if it has
    /// more.
    pub(super) fn on_stream_run(&mut self, link: LinkId, peer: PeerId, run: Header, sink: Sink) {
        let key = (peer, run.b);
        let Some(s) = self.streams.get_mut(&key) else { return };
        s.routed += u64::from(run.len);
        if let Sink::Op { op, .. } = sink
            && let Some(o) = self.ops.get_mut(&op)
        {
            o.moved += run.len as usize;
            if o.moved as u64 >= o.expect {
                let n = o.moved;
                s.pulls.retain(|_, (p, _)| *p != op);
                self.complete(op, Ok(n));
            }
        }
        if run.aux > 0 {
            self.set_rx(link, Rx::Stream { req: run.b, left: run.aux });
        }
        self.stream_maybe_done(key);
    }

    /// The client cancelled the request: nobody wants the rest of its streamed payload. Pulls
    /// waiting for it fail, and a connection stalled in it reads on, into the void, up to the
    /// client's abort.
    pub(super) fn stream_cancelled(&mut self, key: (PeerId, u64)) {
        let Some(s) = self.streams.get_mut(&key) else { return };
        s.discard = true;
        let pulls: Vec<OpId> = s.pulls.values().map(|&(op, _)| op).collect();
        for op in pulls {
            self.cancel(op, Error::PeerCancelled);
        }
        self.stream_unstall(key);
        self.stream_maybe_done(key);
    }

    /// Forgets a stream once all of it has been routed and no pull waits on it.
    pub(super) fn stream_maybe_done(&mut self, key: (PeerId, u64)) {
        if self.streams.get(&key).is_some_and(|s| s.routed >= s.end && s.pulls.is_empty()) {
            self.streams.remove(&key);
        }
    }

    /// A connection that waited inside a stream may go on: read it again.
    pub(super) fn stream_unstall(&mut self, key: (PeerId, u64)) {
        let Some(link) = self.streams.get_mut(&key).and_then(|s| s.stalled.take()) else { return };
        if self.links.contains_key(link) {
            // Bytes may have been waiting on the link all along, with no new event to come.
            self.act(Action::Resume { link });
        }
    }
}
