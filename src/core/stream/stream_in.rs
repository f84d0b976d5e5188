//! Streamed request payloads on the server: their bytes arrive in order behind the request
//! and each goes into the posted pull that covers it; the link waits while none does, and
//! once it has waited a while, parks them within the peer's early-data budget and reads on.

use std::collections::BTreeMap;
use std::mem;

use bytes::Bytes;

use crate::buffers::buf::{OpBuf, RecvBuf};
use crate::comm::Mechanism;
use crate::error::{Error, Result};
use crate::info::Counters;
use crate::op::OpKind;
use crate::types::{OpId, PeerId, ServiceLevel};
use crate::wire::{FLAG_ABORT, Header, Kind};

use super::link::{Rx, Sink};
use super::{Action, LinkId, OpSt, Session, unexpected};

/// Most bytes parked as one piece: a STREAM frame is read into the parked bytes in pieces of
/// this size, each reserved against the peer's budget before it is read.
const PARK_PIECE: u32 = 256 << 10;

/// A streamed request payload being received: each byte goes, in order, into the posted pull
/// that covers it, and the connection waits while none does. A connection that has waited at
/// the same byte through two looks of the timer (its request waits for something else: bytes
/// another client's request holds, a disk, a free worker) would hold up every request behind
/// it on the connection for as long, so from then on the bytes no pull covers are *parked* (copied
/// aside, within the peer's early-data budget) and the connection reads on; pulls posted later
/// take them from there. Once the request is answered (or the client stops the stream) bytes
/// no pull covers are discarded. Kept until every byte up to `end` has been routed and none is
/// parked.
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
    /// Bytes parked, by offset: routed, and waiting for the pulls that will take them.
    pub parked: BTreeMap<u64, Bytes>,
    /// Bytes no pull covers are parked rather than waited for.
    pub park: bool,
    /// The timer found the connection waiting in this stream at its last look, with this many
    /// bytes routed.
    pub seen_waiting: Option<u64>,
}

impl StreamIn {
    pub(super) fn new(end: u64) -> StreamIn {
        StreamIn {
            end,
            wire: 0,
            routed: 0,
            pulls: BTreeMap::new(),
            stalled: None,
            discard: false,
            parked: BTreeMap::new(),
            park: false,
            seen_waiting: None,
        }
    }

    /// Whether the parked bytes hold all of `[from, to)`.
    fn parked_holds(&self, from: u64, to: u64) -> bool {
        let start = self.parked.range(..=from).next_back().map_or(from, |(&at, _)| at);
        let mut reached = from;
        for (&at, b) in self.parked.range(start..) {
            if reached >= to || at > reached {
                break;
            }
            reached = reached.max(at + b.len() as u64);
        }
        reached >= to
    }

    /// Takes `[from, to)` out of the parked bytes, which hold it: its pieces by offset. What
    /// is parked on either side stays.
    fn take_parked(&mut self, from: u64, to: u64) -> Vec<(u64, Bytes)> {
        let overlapping: Vec<u64> = self
            .parked
            .range(..to)
            .filter(|(at, b)| **at + b.len() as u64 > from)
            .map(|(at, _)| *at)
            .collect();
        let mut taken = Vec::with_capacity(overlapping.len());
        for at in overlapping {
            let Some(mut b) = self.parked.remove(&at) else { continue };
            if at + b.len() as u64 > to {
                let after = b.split_off((to - at) as usize);
                self.parked.insert(to, after);
            }
            let mut start = at;
            if at < from {
                let before = b.split_to((from - at) as usize);
                self.parked.insert(at, before);
                start = from;
            }
            taken.push((start, b));
        }
        taken
    }

    /// How much of the next `left` bytes, none of which a pull covers, go into the void or
    /// aside: up to the next pull posted ahead, if any, whose bytes go into it.
    fn unpulled_run(&self, left: u32) -> u32 {
        let ahead = self.pulls.range(self.routed + 1..).next().map_or(u64::MAX, |(&at, _)| at - self.routed);
        u64::from(left).min(ahead) as u32
    }

    fn parked_bytes(&self) -> usize {
        self.parked.values().map(Bytes::len).sum()
    }
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
        // Bytes routed already can only come from those parked.
        let parked_up_to = end.min(s.routed);
        if (offset < s.routed && !s.parked_holds(offset, parked_up_to)) || before.is_some_and(|e| e > offset)
        {
            return Err(Error::misuse("pull overlaps bytes already routed or another pull"));
        }
        let waiting_here = s.stalled.is_some() && offset <= s.routed && s.routed < end;
        if len == 0 {
            self.ops.done_new(op, OpKind::Pull, peer, 0, OpBuf::Recv(buf), Ok(0));
            return Ok(());
        }
        self.insert_op(op, OpKind::Pull, peer, 0, sl, OpBuf::Recv(buf), OpSt::WaitStream);
        if let Some(o) = self.ops.get_mut(&op) {
            o.mech = Some(Mechanism::ServerRdma);
            o.expect = len as u64;
        }
        if let Some(s) = self.streams.get_mut(&key) {
            s.pulls.insert(offset, (op, len));
        }
        if offset < parked_up_to {
            self.fill_pulls_from_parked(key);
            self.stream_maybe_done(key);
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
            self.stream_drop_parked(key);
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
    /// byte, into the void once nobody will pull it, or, once the stream parks, aside within
    /// the peer's budget. If none, the connection waits (its bytes stay in the socket) until a
    /// pull, the answer or the timer's next look comes: returns false.
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
            _ if s.discard => (Sink::Discard, s.unpulled_run(left)),
            _ if s.park => {
                let n = s.unpulled_run(left.min(PARK_PIECE));
                let limit = self.s.cfg.early_bytes_per_peer;
                if !self.peers.get_mut(peer).is_some_and(|p| p.budget.reserve(n as usize, limit)) {
                    // At the budget: wait for pulls (or the timer's next look) after all.
                    s.stalled = Some(link);
                    return false;
                }
                (Sink::Vec(vec![0; n as usize]), n)
            }
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
        if let Sink::Vec(v) = sink {
            Counters::add(&self.core.counters.stream_bytes_parked, v.len() as u64);
            if s.discard {
                // Answered or cancelled while this piece came in: nobody will pull it.
                self.parked_taken(key, v.len());
            } else {
                s.parked.insert(run.c, Bytes::from(v));
                // A pull posted while the piece was on its way covers some of it.
                self.fill_pulls_from_parked(key);
            }
        } else if let Sink::Op { op, .. } = sink
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
        self.stream_drop_parked(key);
        self.stream_unstall(key);
        self.stream_maybe_done(key);
    }

    /// Forgets a stream once all of it has been routed, no pull waits on it and nothing of it
    /// is parked.
    pub(super) fn stream_maybe_done(&mut self, key: (PeerId, u64)) {
        if self
            .streams
            .get(&key)
            .is_some_and(|s| s.routed >= s.end && s.pulls.is_empty() && s.parked.is_empty())
        {
            self.streams.remove(&key);
        }
    }

    /// Nobody will pull what is parked of `key` (its request is answered or cancelled): it
    /// goes, and its budget comes back.
    pub(super) fn stream_drop_parked(&mut self, key: (PeerId, u64)) {
        let Some(s) = self.streams.get_mut(&key) else { return };
        let n = s.parked_bytes();
        s.parked.clear();
        if n > 0 {
            self.parked_taken(key, n);
        }
    }

    /// Moves parked bytes of `key` that posted pulls cover into them, completing those filled:
    /// for a pull posted late, and for a piece that lands after a pull covering it was posted.
    fn fill_pulls_from_parked(&mut self, key: (PeerId, u64)) {
        let Some(s) = self.streams.get_mut(&key) else { return };
        let pulls: Vec<(u64, OpId, usize)> = s.pulls.iter().map(|(&at, &(op, len))| (at, op, len)).collect();
        let mut moved = 0;
        let mut filled = Vec::new();
        for (at, op, len) in pulls {
            let pieces = s.take_parked(at, at + len as u64);
            if pieces.is_empty() {
                continue;
            }
            let Some(o) = self.ops.get_mut(&op) else { continue };
            for (pos, piece) in pieces {
                if let OpBuf::Recv(b) = &mut o.buf {
                    b.copy_in((pos - at) as usize, &piece);
                }
                o.moved += piece.len();
                moved += piece.len();
            }
            if o.moved as u64 >= o.expect {
                s.pulls.remove(&at);
                filled.push((op, o.moved));
            }
        }
        for (op, n) in filled {
            self.complete(op, Ok(n));
        }
        if moved > 0 {
            self.parked_taken(key, moved);
        }
    }

    /// `n` parked bytes of `key` left (into a pull, or dropped): their budget comes back, and
    /// what waited for it goes on.
    fn parked_taken(&mut self, key: (PeerId, u64), n: usize) {
        if let Some(p) = self.peers.get_mut(key.0) {
            p.budget.release(n);
        }
        self.unstall(key.0);
        if self.streams.get(&key).is_some_and(|s| s.park) {
            self.stream_unstall(key);
        }
    }

    /// The timer's look at the streams connections wait in: one found waiting at two looks in
    /// a row with no byte routed in between has waited a whole timer period for its pull and
    /// parks from now on (a long stream whose pulls come in a pipeline waits a moment before
    /// each, and must not park for that); one that parks and waits (its peer's budget was
    /// full) tries again.
    pub(super) fn stream_timers(&mut self) {
        let mut resume = Vec::new();
        for (&key, s) in &mut self.streams {
            if s.stalled.is_none() {
                s.seen_waiting = None;
                continue;
            }
            if !s.park && s.seen_waiting == Some(s.routed) {
                tracing::debug!(peer = %key.0, req = key.1, "a streamed payload waits for its pulls: parking it");
                s.park = true;
            }
            s.seen_waiting = Some(s.routed);
            if s.park {
                resume.push(key);
            }
        }
        for key in resume {
            self.stream_unstall(key);
        }
    }

    /// Whether a connection waits in a stream (the timer must look at it).
    pub(super) fn streams_wait(&self) -> bool {
        self.streams.values().any(|s| s.stalled.is_some())
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
