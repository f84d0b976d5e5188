//! The application's operations, turned into frames on the right link; and the frames'
//! accounting against the transmit bound.

use std::net::SocketAddr;

use bytes::Bytes;

use crate::backend::{Cmd, GetCmd, PullCmd, PushCmd, PutCmd, RecvCmd, ReplyCmd, RequestCmd, SendCmd};
use crate::buffers::buf::{OpBuf, SendBuf};
use crate::comm::{Conditions, Mechanism};
use crate::core::requests;
use crate::error::{Error, Result};
use crate::info::Counters;
use crate::op::{Completion, Direction, OpKind};
use crate::types::{OpId, PeerId, ServiceLevel};
use crate::wire::{FLAG_INLINE_DATA, FLAG_STREAMED, HEADER_LEN, Header, Kind};

use super::link::{Frame, IoVec, Link, OnDone, Phase};
use super::{Action, CTS_TRUNCATED, Early, FRAME_COST, LinkId, MAX_IOV, OpSt, RTS_COST, RndvIn, Session};

/// An eager send that an idle link may take whole at once (BMI's "completed immediately"): the
/// link and the frame's header. The driver writes the header and the send buffer itself, with
/// the session out of the way, and reports what went with [`Session::eager_written`]: a send
/// taken whole completes without entering the op table or the link's queue.
pub(crate) struct EagerNow {
    pub link: LinkId,
    hdr: [u8; HEADER_LEN],
}

impl EagerNow {
    /// The frame's header.
    pub(crate) fn header(&self) -> &[u8] {
        &self.hdr
    }

    /// `cmd`'s send buffer, when it is one contiguous piece (most are).
    pub(crate) fn contiguous<'a>(&self, cmd: &'a Cmd) -> Option<&'a [u8]> {
        match cmd {
            Cmd::Send(SendCmd { buf: SendBuf::Bytes(b), .. }) => Some(b),
            _ => None,
        }
    }

    /// The frame's bytes: the header, then `cmd`'s send buffer.
    pub(crate) fn slices<'a>(&'a self, cmd: &'a Cmd, iov: &mut IoVec<'a>) {
        iov.push(&self.hdr);
        if let Cmd::Send(SendCmd { buf, .. }) = cmd {
            buf.for_each_slice(0, buf.len(), |s| iov.push(s));
        }
    }
}

impl Session {
    /// Takes an operation of the application. Errors are the caller's (the op was not taken);
    /// an op taken always completes, through [`Session::hand_over`].
    pub(crate) fn post(&mut self, op: OpId, cmd: Cmd) -> Result<()> {
        if self.peers.get(cmd.peer()).is_none() {
            let (kind, peer, tag, buf) = cmd.into_parts();
            self.fail_new(op, kind, peer, tag, buf, Cmd::forgotten(peer));
            return Ok(());
        }
        match cmd {
            Cmd::Send(c) => self.post_send(op, c),
            Cmd::Recv(c) => self.post_recv(op, c),
            Cmd::Put(c) => self.post_put(op, c),
            Cmd::Get(c) => self.post_get(op, c),
            Cmd::Request(c) => self.post_request(op, c),
            Cmd::Pull(c) => self.post_pull(op, c),
            Cmd::Push(c) => self.post_push(op, c),
            Cmd::Reply(c) => self.post_reply(op, c),
        }
    }

    fn check_len(&self, peer: PeerId, len: usize) -> Result<()> {
        let max = self.peer(peer)?.d.max_message.min(self.s.limits.message);
        if len as u64 > max {
            return Err(Error::TooLarge { len: len as u64, max });
        }
        Ok(())
    }

    /// The connection up that a command to `peer` in class `sl` would go on, if this endpoint
    /// dialled it (and so could dial it again).
    pub(crate) fn dialled_link(&self, peer: PeerId, sl: ServiceLevel) -> Option<LinkId> {
        let link = self.peers.dialled_conn(peer, sl)?;
        self.links.get(link).is_some_and(|c| c.is_ready()).then_some(link)
    }

    /// The link for (peer, sl): existing, newly dialled, or (for a peer we cannot dial) any of
    /// its links.
    pub(super) fn link_for(&mut self, peer: PeerId, sl: ServiceLevel) -> Result<LinkId> {
        let p = self.peer(peer)?;
        if let Some(reason) = &p.lost {
            return Err(Error::PeerLost { peer, reason: reason.clone() });
        }
        if let Some(link) = p.conns[sl.index()] {
            return Ok(link);
        }
        match p.dial {
            Some(sa) => Ok(self.dial(peer, sa, sl)),
            None => p.conns.iter().flatten().next().copied().ok_or_else(|| Error::PeerLost {
                peer,
                reason: "no connection to this peer and it cannot be dialled".into(),
            }),
        }
    }

    /// A new link to `peer` for class `sl`, which the driver dials; frames queue on it until
    /// its handshake is done.
    fn dial(&mut self, peer: PeerId, sa: SocketAddr, sl: ServiceLevel) -> LinkId {
        let link = self.new_link_id();
        let mut c = Link::new(sa, sl, Phase::Connecting, None);
        c.peer = Some(peer);
        self.links.insert(link, c);
        self.peers[peer].conns[sl.index()] = Some(link);
        self.act(Action::Dial { link, addr: sa, sl });
        tracing::debug!(%peer, %sa, %sl, "dialling");
        link
    }

    pub(super) fn queue(&mut self, link: LinkId, f: Frame) {
        if let Some((op, _, _)) = f.op_part
            && let Some(o) = self.ops.get_mut(&op)
        {
            o.refs += 1;
        }
        if let Some(c) = self.links.get_mut(link) {
            c.tx.push_back(f);
            if c.writable && c.is_ready() {
                self.write_ready.insert(link);
            }
        }
    }

    /// Queues a frame sent in answer to `peer` (a get response, an acknowledgement, pull
    /// data): what it costs counts against the peer's transmit bound, and at the bound the
    /// peer's links are no longer read, so a peer that asks without reading the answers cannot
    /// make us queue more.
    pub(super) fn queue_answer(&mut self, link: LinkId, peer: PeerId, mut f: Frame) {
        f.charge = FRAME_COST + f.prefix.len();
        let Some(p) = self.peers.get_mut(peer) else { return };
        p.d.tx_bytes += f.charge;
        if p.d.tx_bytes >= self.s.cfg.transmit_bytes_per_peer && !p.d.tx_paused {
            tracing::debug!(%peer, bytes = p.d.tx_bytes, "transmit bound reached: pausing reads");
            Counters::add(&self.core.counters.backpressure_pauses, 1);
            p.d.tx_paused = true;
            p.d.tx_moved_at = None;
            self.tx_paused.push(peer);
        }
        self.queue(link, f);
    }

    /// Answers to `peer` of `bytes` left the queue (written, or dropped with the link). Below
    /// half the bound its links are read again; any progress restarts the stall clock.
    pub(super) fn uncharge(&mut self, peer: PeerId, bytes: usize) {
        let Some(p) = self.peers.get_mut(peer) else { return };
        p.d.tx_bytes = p.d.tx_bytes.saturating_sub(bytes);
        if !p.d.tx_paused {
            return;
        }
        if p.d.tx_bytes >= self.s.cfg.transmit_bytes_per_peer / 2 {
            p.d.tx_moved_at = None;
            return;
        }
        p.d.tx_paused = false;
        p.d.tx_moved_at = None;
        self.tx_paused.retain(|q| *q != peer);
        for link in p.conns.iter().flatten() {
            if self.links.contains_key(*link) {
                self.actions.push_back(Action::Resume { link: *link });
            }
        }
    }

    fn post_send(&mut self, op: OpId, c: SendCmd) -> Result<()> {
        let SendCmd { peer, tag, sl, buf, unexpected } = c;
        let len = buf.len();
        self.check_len(peer, len)?;
        let eager_max = self.peer(peer)?.d.eager_limit.min(self.s.eager_limit);
        if unexpected && len > eager_max {
            return Err(Error::TooLarge { len: len as u64, max: eager_max as u64 });
        }
        let kind = if unexpected { OpKind::SendUnexpected } else { OpKind::Send };
        let link = match self.link_for(peer, sl) {
            Ok(link) => link,
            Err(e) => {
                self.fail_new(op, kind, peer, tag, OpBuf::Send(buf), e);
                return Ok(());
            }
        };
        let mech = if unexpected {
            Mechanism::Inline
        } else {
            match self.s.policy.choose(len, sl, Conditions::idle(false)) {
                Mechanism::Inline | Mechanism::FastRdma if len <= eager_max => Mechanism::Inline,
                _ => Mechanism::ServerRdma,
            }
        };
        Counters::add(&self.core.counters.msgs_sent, 1);
        if mech == Mechanism::Inline {
            let mut h = Header::new(if unexpected { Kind::Unexpected } else { Kind::Eager }, sl);
            h.a = tag;
            h.len = len as u32;
            self.insert_op(op, kind, peer, tag, sl, OpBuf::Send(buf), OpSt::Writing);
            if let Some(o) = self.ops.get_mut(&op) {
                o.mech = Some(mech);
                o.expect = len as u64;
            }
            self.queue(link, Frame::new(h, Bytes::new(), Some((op, 0, len)), OnDone::Complete(op)));
        } else {
            self.insert_op(op, kind, peer, tag, sl, OpBuf::Send(buf), OpSt::Writing);
            if let Some(o) = self.ops.get_mut(&op) {
                o.mech = Some(mech);
                o.expect = len as u64;
            }
            let msg = self.next_msg;
            self.next_msg += 1;
            let mut h = Header::new(Kind::Rts, sl);
            h.a = tag;
            h.b = msg;
            h.c = len as u64;
            if let Some(o) = self.ops.get_mut(&op) {
                o.st = OpSt::WaitCts { msg };
            }
            self.rndv_out.insert(msg, op);
            self.queue(link, Frame::new(h, Bytes::new(), None, OnDone::Nothing));
        }
        Ok(())
    }

    /// Whether `cmd` may take the fast path (see [`EagerNow`]): an eager send on an established
    /// link that takes bytes and has nothing queued, sends not batched, the frame fitting one
    /// write. Anything else, and every error, is left to [`Session::post`].
    #[inline]
    pub(crate) fn eager_now(&self, cmd: &Cmd) -> Option<EagerNow> {
        let Cmd::Send(SendCmd { peer, tag, sl, buf, unexpected }) = cmd else { return None };
        if self.s.cfg.batch_sends {
            return None;
        }
        let p = self.peers.get(*peer)?;
        let len = buf.len();
        let eager_max = p.d.eager_limit.min(self.s.eager_limit);
        if p.lost.is_some() || len as u64 > p.d.max_message.min(self.s.limits.message) || len > eager_max {
            return None;
        }
        if !*unexpected
            && !matches!(
                self.s.policy.choose(len, *sl, Conditions::idle(false)),
                Mechanism::Inline | Mechanism::FastRdma
            )
        {
            return None;
        }
        let link = p.conns[sl.index()]?;
        let c = self.links.get(link)?;
        if !(c.is_ready() && c.writable && c.tx.is_empty() && c.hs_tx.is_empty()) {
            return None;
        }
        if !matches!(buf, SendBuf::Bytes(_)) {
            let mut segs = 0;
            buf.for_each_slice(0, len, |_| segs += 1);
            if segs >= MAX_IOV {
                return None;
            }
        }
        let mut h = Header::new(if *unexpected { Kind::Unexpected } else { Kind::Eager }, *sl);
        h.a = *tag;
        h.len = len as u32;
        Some(EagerNow { link, hdr: h.encode() })
    }

    /// The driver wrote `n` bytes of the fast-path send `e` of `cmd` (0 when the link refused
    /// or failed). All of it completes the op at once; less files it as an ordinary queued
    /// frame with the rest to go, which the ordinary write path sends (or fails).
    pub(crate) fn eager_written(&mut self, op: OpId, cmd: Cmd, e: EagerNow, n: usize) {
        let Cmd::Send(SendCmd { peer, tag, sl, buf, unexpected }) = cmd else { return };
        let kind = if unexpected { OpKind::SendUnexpected } else { OpKind::Send };
        let len = buf.len();
        Counters::add(&self.core.counters.msgs_sent, 1);
        if n >= HEADER_LEN + len {
            self.ops.push_completion(Completion {
                op,
                kind,
                peer,
                tag,
                result: Ok(len),
                buf: OpBuf::Send(buf),
                reply: None,
                mechanism: Some(Mechanism::Inline),
            });
            return;
        }
        let o = self.insert_op(op, kind, peer, tag, sl, OpBuf::Send(buf), OpSt::Writing);
        o.mech = Some(Mechanism::Inline);
        o.expect = len as u64;
        let f = Frame {
            hdr: e.hdr,
            sent: n,
            prefix: Bytes::new(),
            op_part: Some((op, 0, len)),
            done: OnDone::Complete(op),
            charge: 0,
        };
        self.queue(e.link, f);
    }

    fn post_recv(&mut self, op: OpId, c: RecvCmd) -> Result<()> {
        let RecvCmd { peer, tag, buf } = c;
        let p = self.peer(peer)?;
        if let Some(reason) = p.lost.clone() {
            self.fail_new(op, OpKind::Recv, peer, tag, OpBuf::Recv(buf), Error::PeerLost { peer, reason });
            return Ok(());
        }
        let sl = ServiceLevel::Normal;
        self.insert_op(op, OpKind::Recv, peer, tag, sl, OpBuf::Recv(buf), OpSt::Posted);
        match self.matcher.post(peer, tag, op, ()) {
            Ok(()) => {}
            Err((op, (), early)) => self.match_early(op, peer, early),
        }
        self.unstall(peer);
        Ok(())
    }

    /// A receive posted after its message (or announcement) arrived.
    pub(super) fn match_early(&mut self, op: OpId, peer: PeerId, early: Early) {
        match early {
            Early::Eager { data, sl } => {
                self.peers[peer].budget.release(data.len());
                self.core.counters.copied(data.len());
                let Some(o) = self.ops.get_mut(&op) else { return };
                o.sl = sl;
                o.mech = Some(Mechanism::Inline);
                let r = match &mut o.buf {
                    OpBuf::Recv(b) if b.capacity() >= data.len() => {
                        b.copy_in(0, &data);
                        Ok(data.len())
                    }
                    OpBuf::Recv(b) => {
                        Err(Error::Truncated { len: data.len() as u64, capacity: b.capacity() as u64 })
                    }
                    _ => Ok(0),
                };
                Counters::add(&self.core.counters.msgs_received, 1);
                self.complete(op, r);
            }
            Early::Rts { msg, total, link } => {
                self.peers[peer].budget.release(RTS_COST);
                self.accept_rts(op, peer, msg, total, link);
            }
        }
    }

    /// Answers a rendezvous announcement matched to receive `op`.
    pub(super) fn accept_rts(&mut self, op: OpId, peer: PeerId, msg: u64, total: u64, link: LinkId) {
        let Some(o) = self.ops.get_mut(&op) else { return };
        let cap = match &o.buf {
            OpBuf::Recv(b) => b.capacity() as u64,
            _ => 0,
        };
        let sl = self.links.get(link).map_or(ServiceLevel::Normal, |c| c.sl);
        o.sl = sl;
        o.mech = Some(Mechanism::ServerRdma);
        let mut h = Header::new(Kind::Cts, sl);
        h.b = msg;
        if total > cap {
            h.aux = CTS_TRUNCATED;
            h.c = cap;
            self.queue(link, Frame::new(h, Bytes::new(), None, OnDone::Nothing));
            self.complete(op, Err(Error::Truncated { len: total, capacity: cap }));
            return;
        }
        o.st = OpSt::WaitData { msg };
        o.expect = total;
        self.rndv_in.insert((peer, msg), RndvIn::Op(op));
        self.queue(link, Frame::new(h, Bytes::new(), None, OnDone::Nothing));
    }

    fn post_put(&mut self, op: OpId, c: PutCmd) -> Result<()> {
        let PutCmd { peer, sl, local, remote } = c;
        let len = local.len();
        if len as u64 > remote.len {
            return Err(Error::misuse(format!("put of {len} bytes into a {}-byte handle", remote.len)));
        }
        self.check_len(peer, len)?;
        let link = match self.link_for(peer, sl) {
            Ok(link) => link,
            Err(e) => {
                self.fail_new(op, OpKind::Put, peer, 0, OpBuf::Send(local), e);
                return Ok(());
            }
        };
        self.insert_op(op, OpKind::Put, peer, 0, sl, OpBuf::Send(local), OpSt::WaitAck);
        if let Some(o) = self.ops.get_mut(&op) {
            o.mech = Some(Mechanism::ServerRdma);
        }
        let mut h = Header::new(Kind::Put, sl);
        h.a = op.0;
        h.b = remote.key;
        h.c = remote.addr;
        h.len = len as u32;
        self.queue(link, Frame::new(h, Bytes::new(), Some((op, 0, len)), OnDone::Release(op)));
        Ok(())
    }

    fn post_get(&mut self, op: OpId, c: GetCmd) -> Result<()> {
        let GetCmd { peer, sl, local, remote } = c;
        let len = local.capacity();
        if len as u64 > remote.len {
            return Err(Error::misuse(format!("get of {len} bytes from a {}-byte handle", remote.len)));
        }
        self.check_len(peer, len)?;
        let link = match self.link_for(peer, sl) {
            Ok(link) => link,
            Err(e) => {
                self.fail_new(op, OpKind::Get, peer, 0, OpBuf::Recv(local), e);
                return Ok(());
            }
        };
        self.insert_op(op, OpKind::Get, peer, 0, sl, OpBuf::Recv(local), OpSt::WaitResp);
        if let Some(o) = self.ops.get_mut(&op) {
            o.mech = Some(Mechanism::ServerRdma);
            o.expect = len as u64;
        }
        let mut h = Header::new(Kind::Get, sl);
        h.a = op.0;
        h.b = remote.key;
        h.c = remote.addr;
        h.aux = len as u32;
        self.queue(link, Frame::new(h, Bytes::new(), None, OnDone::Nothing));
        Ok(())
    }

    fn post_request(&mut self, op: OpId, c: RequestCmd) -> Result<()> {
        let RequestCmd { peer, tag, sl, header, payload } = c;
        requests::check_header(&header, self.s.cfg.max_header)?;
        let len = requests::payload_len(&payload);
        let (buf, dir) = payload.split();
        self.check_len(peer, len)?;
        let link = match self.link_for(peer, sl) {
            Ok(link) => link,
            Err(e) => {
                self.fail_new(op, OpKind::Request, peer, tag, buf, e);
                return Ok(());
            }
        };
        let eager_max = self.peer(peer)?.d.eager_limit.min(self.s.eager_limit);
        let inline = dir == Direction::Out
            && len <= eager_max
            && self.s.policy.choose(len, sl, Conditions::idle(false)) == Mechanism::Inline;
        let chunk =
            self.stream_chunk(self.peer(peer)?).filter(|_| dir == Direction::Out && !inline && len > 0);
        let streamed = chunk.is_some();
        self.insert_op(op, OpKind::Request, peer, tag, sl, buf, OpSt::WaitReply);
        if let Some(o) = self.ops.get_mut(&op) {
            o.mech = match dir {
                Direction::None => None,
                _ if inline => Some(Mechanism::Inline),
                _ => Some(Mechanism::ServerRdma),
            };
            if inline || streamed {
                o.moved = len;
            }
        }
        Counters::add(&self.core.counters.msgs_sent, 1);
        let mut h = requests::request_header(sl, tag, op, len, header.len(), dir);
        let op_part = if inline && len > 0 {
            h.flags |= FLAG_INLINE_DATA;
            Some((op, 0, len))
        } else {
            if inline {
                h.flags |= FLAG_INLINE_DATA;
            }
            None
        };
        h.len = (header.len() + if inline { len } else { 0 }) as u32;
        if streamed {
            h.flags |= FLAG_STREAMED;
        }
        let done = if op_part.is_some() { OnDone::Release(op) } else { OnDone::Nothing };
        self.queue(link, Frame::new(h, header, op_part, done));
        // The payload follows at once; it waits in the server's socket for its pulls.
        if let Some(chunk) = chunk {
            for f in stream_frames(op, sl, len, chunk) {
                self.queue(link, f);
            }
        }
        Ok(())
    }

    fn post_pull(&mut self, op: OpId, c: PullCmd) -> Result<()> {
        let Some(PullCmd { peer, req, sl, offset, buf }) =
            self.sreqs.start_pull(&mut self.ops, &self.core.counters, op, c)?
        else {
            return Ok(());
        };
        if self.sreqs.get(peer, req)?.x.streamed {
            return self.post_stream_pull(op, peer, req, sl, offset, buf);
        }
        let len = buf.capacity();
        let link = match self.link_for(peer, sl) {
            Ok(link) => link,
            Err(e) => {
                self.fail_new(op, OpKind::Pull, peer, 0, OpBuf::Recv(buf), e);
                return Ok(());
            }
        };
        let o = self.insert_op(op, OpKind::Pull, peer, 0, sl, OpBuf::Recv(buf), OpSt::WaitPullData);
        o.mech = Some(Mechanism::ServerRdma);
        o.expect = len as u64;
        let mut h = Header::new(Kind::Pull, sl);
        h.a = op.0;
        h.b = req;
        h.c = offset;
        h.aux = len as u32;
        self.queue(link, Frame::new(h, Bytes::new(), None, OnDone::Nothing));
        Ok(())
    }

    fn post_push(&mut self, op: OpId, c: PushCmd) -> Result<()> {
        let PushCmd { peer, req, sl, offset, buf } = c;
        let len = buf.len();
        if self.sreqs.check_push(peer, req, offset, len)?.cancelled {
            self.fail_new(op, OpKind::Push, peer, 0, OpBuf::Send(buf), Error::PeerCancelled);
            return Ok(());
        }
        let link = match self.link_for(peer, sl) {
            Ok(link) => link,
            Err(e) => {
                self.fail_new(op, OpKind::Push, peer, 0, OpBuf::Send(buf), e);
                return Ok(());
            }
        };
        let mech = if len <= self.s.policy.thresholds(sl).inline_max {
            Mechanism::Inline
        } else {
            Mechanism::ServerRdma
        };
        self.insert_op(op, OpKind::Push, peer, 0, sl, OpBuf::Send(buf), OpSt::Writing);
        if let Some(o) = self.ops.get_mut(&op) {
            o.mech = Some(mech);
        }
        let mut h = Header::new(Kind::Push, sl);
        h.b = req;
        h.c = offset;
        h.len = len as u32;
        self.queue(link, Frame::new(h, Bytes::new(), Some((op, 0, len)), OnDone::Complete(op)));
        Ok(())
    }

    fn post_reply(&mut self, op: OpId, c: ReplyCmd) -> Result<()> {
        let ReplyCmd { peer, req, sl, header, status } = c;
        requests::check_header(&header, self.s.cfg.max_header)?;
        let r = self.sreqs.close(peer, req)?;
        self.release_request_budget(peer, r.cost);
        if let Some(s) = self.streams.get_mut(&(peer, req)) {
            // Answered: what no pull takes now goes into the void, and the connection goes on.
            s.discard = true;
            self.stream_drop_parked((peer, req));
            self.stream_unstall((peer, req));
            self.stream_maybe_done((peer, req));
        }
        let (header, status) = requests::reply_content(r.cancelled, header, status);
        let link = match self.link_for(peer, sl) {
            Ok(link) => link,
            Err(e) => {
                self.fail_new(op, OpKind::Reply, peer, 0, OpBuf::None, e);
                return Ok(());
            }
        };
        self.insert_op(op, OpKind::Reply, peer, 0, r.sl, OpBuf::None, OpSt::Writing);
        if r.cancelled
            && let Some(o) = self.ops.get_mut(&op)
        {
            o.outcome = Some(Err(Error::PeerCancelled));
        }
        Counters::add(&self.core.counters.msgs_sent, 1);
        let mut h = Header::new(Kind::Reply, r.sl);
        h.b = req;
        h.aux = status;
        h.len = header.len() as u32;
        self.queue(link, Frame::new(h, header, None, OnDone::Complete(op)));
        Ok(())
    }

    fn release_request_budget(&mut self, peer: PeerId, cost: usize) {
        if let Some(p) = self.peers.get_mut(peer) {
            p.budget.request_done(cost);
        }
        self.unstall(peer);
    }
}

/// The STREAM frames that carry request `op`'s `len`-byte payload, `chunk` bytes each, each
/// referencing the op's buffer.
pub(super) fn stream_frames(
    op: OpId,
    sl: ServiceLevel,
    len: usize,
    chunk: usize,
) -> impl Iterator<Item = Frame> {
    (0..len).step_by(chunk).map(move |off| {
        let n = chunk.min(len - off);
        let mut h = Header::new(Kind::Stream, sl);
        h.b = op.0;
        h.c = off as u64;
        h.len = n as u32;
        Frame::new(h, Bytes::new(), Some((op, off, n)), OnDone::Release(op))
    })
}
