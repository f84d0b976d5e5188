//! Posting: commands from the endpoint turned into messages, registrations and transfers.

use std::time::Instant;

use bytes::Bytes;

use crate::backend::{Cmd, GetCmd, PullCmd, PushCmd, PutCmd, RecvCmd, ReplyCmd, RequestCmd, SendCmd};
use crate::buffers::buf::OpBuf;
use crate::comm::Mechanism;
use crate::core::requests;
use crate::error::{Error, Result};
use crate::expose::MemHandle;
use crate::ib::verbs::*;
use crate::info::Counters;
use crate::op::OpKind;
use crate::regcache::{Origin, RegRef};
use crate::types::{Access, OpId, PeerId, ServiceLevel};
use crate::wire::{FLAG_RDV_HEADER, Header, Kind};

use super::cancel::{self, CancelStep, Cancelled};
use super::msg::{self, Segment};
use super::plan::{self, Acquire, For, Placement, PushPlan, ReplyPlan, SendPlan, Staging, Transfer};
use super::rx::{Matched, Read, Rts};
use super::{Early, FinWait, Local, MsgCaps, OpSt, OutMsg, Payload, State, Then, Via, XferThen};

impl<V: Verbs> State<V> {
    pub(crate) fn post(&mut self, op: OpId, cmd: Cmd, now: Instant) -> Result<()> {
        if self.peers.get(cmd.peer()).is_none() {
            let (kind, peer, tag, buf) = cmd.into_parts();
            self.ops.fail_new(op, kind, peer, tag, buf, Cmd::forgotten(peer));
            return Ok(());
        }
        self.check_if_idle(&cmd, now);
        match cmd {
            Cmd::Send(c) => self.post_send(op, c, now),
            Cmd::Recv(c) => self.post_recv(op, c),
            Cmd::Put(PutCmd { peer, sl, local, remote }) => {
                self.post_one_sided(op, peer, sl, OpBuf::Send(local), remote, now)
            }
            Cmd::Get(GetCmd { peer, sl, local, remote }) => {
                self.post_one_sided(op, peer, sl, OpBuf::Recv(local), remote, now)
            }
            Cmd::Request(c) => self.post_request(op, c, now),
            Cmd::Pull(c) => self.post_pull(op, c),
            Cmd::Push(c) => self.post_push(op, c),
            Cmd::Reply(c) => self.post_reply(op, c),
        }
    }

    /// Before `cmd` goes on a connection this endpoint dialled that had no command for a
    /// while: if the peer closed its side channel meanwhile (it stays open as long as the
    /// connection), gives the connection up now, so that `cmd` dials afresh instead of failing
    /// on a queue pair nobody answers (see [`crate::core::peers::IDLE_BEFORE_CHECK`]).
    fn check_if_idle(&mut self, cmd: &Cmd, now: Instant) {
        let Some(cid) = cmd.sl().and_then(|sl| self.peers.dialled_conn(cmd.peer(), sl)) else { return };
        let Some(c) = self.conn_mut(cid).filter(|c| c.ready) else { return };
        if !c.last_command.idle_until(now) {
            return;
        }
        let side = self.sides.iter_mut().find(|(_, s)| s.conn == Some(cid));
        if let Some((&t, s)) = side
            && !s.framed.still_open()
        {
            self.side_closed(t);
        }
    }

    fn check_len(&self, len: usize) -> Result<()> {
        if len > self.s.max_message {
            return Err(Error::TooLarge { len: len as u64, max: self.s.max_message as u64 });
        }
        Ok(())
    }

    /// What messages on connection `cid` can carry: the minimum of this endpoint's and the
    /// peer's receive-buffer and ring-slot sizes once the peer's are known (our own before:
    /// sends and requests wait for them, see [`Self::hold_until_limits_known`]).
    pub(crate) fn caps(&self, cid: u32) -> MsgCaps {
        let own = MsgCaps { recv: self.s.recv_size as usize, slot: self.s.slot_size as usize };
        let peer = self.conn(cid).and_then(|c| c.remote);
        own.with_peer(peer.map(|r| MsgCaps { recv: r.recv_size as usize, slot: r.slot_size as usize }))
    }

    /// Holds a send or request posted before the peer's limits are known (the connection is
    /// still being set up), so its mechanism is chosen from the limits both sides can carry.
    /// Returns the command when the limits are known and it can be placed now.
    fn hold_until_limits_known(&mut self, cid: u32, op: OpId, cmd: Cmd) -> Option<Cmd> {
        match self.conn_mut(cid) {
            Some(c) if c.remote.is_none() => {
                c.waiting_posts.hold(op, cmd);
                None
            }
            _ => Some(cmd),
        }
    }

    /// Places, in posting order, the sends and requests that waited for the peer's limits.
    pub(crate) fn place_waiting_posts(&mut self, cid: u32, now: Instant) {
        let caps = self.caps(cid);
        let Some(waiting) = self.conn_mut(cid).map(|c| c.waiting_posts.place(caps)) else {
            return;
        };
        for placed in waiting {
            let (op, cmd) = match placed {
                Placement::Post(op, cmd) => (op, cmd),
                Placement::Fail { op, kind, peer, tag, buf, err } => {
                    self.ops.fail_new(op, kind, peer, tag, buf, err);
                    continue;
                }
            };
            let (peer, tag, kind) = match &cmd {
                Cmd::Send(SendCmd { peer, tag, unexpected, .. }) => {
                    (*peer, *tag, if *unexpected { OpKind::SendUnexpected } else { OpKind::Send })
                }
                Cmd::Request(RequestCmd { peer, tag, .. }) => (*peer, *tag, OpKind::Request),
                _ => continue,
            };
            if let Err(e) = self.post(op, cmd, now) {
                // Not expected (checked when posted), but the op exists: it completes.
                self.ops.fail_new(op, kind, peer, tag, OpBuf::None, e);
            }
        }
    }

    /// A waiting send or request (see [`Self::hold_until_limits_known`]) cancelled or failed
    /// before it was placed: it completes with `why` and gets its buffer back. False when `op`
    /// is not waiting.
    pub(crate) fn fail_waiting_post(&mut self, op: OpId, why: Error) -> bool {
        let found = self.conns.iter_mut().flatten().find_map(|c| c.waiting_posts.withdraw(op));
        let Some((kind, peer, tag, buf)) = found else { return false };
        self.ops.fail_new(op, kind, peer, tag, buf, why);
        true
    }

    /// Queues a message on a connection and counts a reference to the op its payload or
    /// completion names.
    pub(crate) fn enqueue(&mut self, cid: u32, m: OutMsg) {
        if let Then::CompleteAtPost(op) | Then::CompleteAtWc(op) | Then::Release(op) = m.then
            && let Some(o) = self.ops.get_mut(&op)
        {
            o.refs += 1;
        }
        if let Some(c) = self.conn_mut(cid) {
            c.out.push_back(m);
        }
    }

    fn post_send(&mut self, op: OpId, c: SendCmd, now: Instant) -> Result<()> {
        let SendCmd { peer, tag, sl, buf, unexpected } = c;
        let len = buf.len();
        self.check_len(len)?;
        if unexpected && len > self.s.eager_limit {
            return Err(Error::TooLarge { len: len as u64, max: self.s.eager_limit as u64 });
        }
        let kind = if unexpected { OpKind::SendUnexpected } else { OpKind::Send };
        let cid = match self.conn_for(peer, sl, now) {
            Ok(c) => c,
            Err(e) => {
                self.ops.fail_new(op, kind, peer, tag, OpBuf::Send(buf), e);
                return Ok(());
            }
        };
        let Some(cmd) =
            self.hold_until_limits_known(cid, op, Cmd::Send(SendCmd { peer, tag, sl, buf, unexpected }))
        else {
            return Ok(());
        };
        let Cmd::Send(SendCmd { buf, .. }) = cmd else { unreachable!("held and returned as it was") };
        // Only an unexpected send too large for the peer's slots fails here, on a connection
        // whose limits were known (the waiting ones are checked when placed, and get their
        // buffers back).
        let plan = plan::plan_send(&self.s.policy, self.caps(cid), tag, sl, len, unexpected)?;
        self.ops.insert(op, kind, peer, tag, sl, OpBuf::Send(buf), OpSt::Sending);
        Counters::add(&self.core.counters.msgs_sent, 1);
        match plan {
            SendPlan::Message { mech, via, header } => {
                if let Some(o) = self.ops.get_mut(&op) {
                    o.mech = Some(mech);
                    o.x.conn = Some(cid);
                }
                let m = OutMsg {
                    via,
                    header,
                    payload: Payload::Op { op, off: 0, len },
                    then: Then::CompleteAtPost(op),
                    fence: false,
                };
                self.enqueue(cid, m);
            }
            SendPlan::Rendezvous { mut header } => {
                if let Some(o) = self.ops.get_mut(&op) {
                    o.mech = Some(Mechanism::ServerRdma);
                    o.x.conn = Some(cid);
                }
                let segs = match self.register_op_buf(op, For::PeerRead) {
                    Ok(s) => s,
                    Err(e) => {
                        self.ops.complete(op, Err(e));
                        return Ok(());
                    }
                };
                let msg_id = self.next_msg;
                self.next_msg += 1;
                let mut payload = Vec::new();
                msg::encode_segments(&mut payload, &segs);
                header.b = msg_id;
                header.len = payload.len() as u32;
                self.fin_wait.insert(msg_id, FinWait::Send(op));
                if let Some(o) = self.ops.get_mut(&op) {
                    o.st = OpSt::WaitFin { msg: msg_id };
                }
                let via = self.caps(cid).via(payload.len());
                self.enqueue(
                    cid,
                    OutMsg {
                        via,
                        header,
                        payload: Payload::Bytes(Bytes::from(payload)),
                        then: Then::Nothing,
                        fence: false,
                    },
                );
            }
        }
        Ok(())
    }

    /// Registers an op's buffer for the peer's RDMA and returns its segments. Pool buffers hit
    /// the cache; other memory is registered for the op's lifetime, or staged through a pool
    /// buffer when it cannot be registered (see [`plan::Registration::acquire`]).
    fn register_op_buf(&mut self, op: OpId, purpose: For) -> Result<Vec<Segment>> {
        let Some(o) = self.ops.get(&op) else { return Err(Error::misuse("no such op")) };
        let (pieces, owned) = plan::buffer_pieces(&o.buf);
        if let Some(ask) = plan::registration(owned, &pieces, self.s.cfg.ib.list_alloc_hint).acquire() {
            match self.acquire_all(&pieces, ask) {
                Ok((regs, segs)) => {
                    if let Some(o) = self.ops.get_mut(&op) {
                        o.x.regs.extend(regs);
                    }
                    return Ok(segs);
                }
                Err(e) if plan::note_refusal(ask) => {
                    tracing::debug!(error = %e, "registering a user buffer failed; staging it");
                }
                Err(_) => {}
            }
        }
        let Staging { alloc, len, fill } = plan::staging(purpose, &pieces);
        let mut staged = self.pool.alloc(alloc)?;
        staged.set_len(len)?;
        let filled = match self.ops.get(&op).map(|o| &o.buf) {
            Some(OpBuf::Send(s)) if fill => s.copy_out(0, &mut staged),
            _ => 0,
        };
        self.core.counters.copied(filled);
        let (regs, segs) = self.acquire_all(&[(staged.addr(), len)], Acquire::Find)?;
        if let Some(o) = self.ops.get_mut(&op) {
            o.x.regs.extend(regs);
            match purpose {
                For::PeerRead => o.x.keep.push(staged),
                For::PeerWrite => o.x.stage_in = Some(staged),
            }
        }
        Ok(segs)
    }

    /// Registrations for the pieces, asked of the cache as `ask` says; all or none.
    fn acquire_all(
        &mut self,
        pieces: &[(usize, usize)],
        ask: Acquire,
    ) -> Result<(Vec<RegRef>, Vec<Segment>)> {
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let mut regs = Vec::with_capacity(pieces.len());
        let mut segs = Vec::with_capacity(pieces.len());
        for &(addr, len) in pieces {
            if len == 0 {
                continue;
            }
            let r = match ask {
                Acquire::Find => c
                    .acquire_if_registered(addr, len, Access::READ_WRITE)
                    .ok_or_else(|| Error::misuse("pool buffer not registered")),
                Acquire::RegisterParent(parent) => c
                    .acquire_hinted(addr, len, parent, Access::READ_WRITE, Origin::Foreign)
                    .map_err(Error::from),
                Acquire::Register => {
                    c.acquire(addr, len, Access::READ_WRITE, Origin::Foreign).map_err(Error::from)
                }
            };
            match r {
                Ok(r) => {
                    segs.push(Segment { addr: addr as u64, len: len as u32, rkey: r.keys().rkey });
                    regs.push(r);
                }
                Err(e) => {
                    for r in regs {
                        let _ = c.release(r);
                    }
                    return Err(e);
                }
            }
        }
        Ok((regs, segs))
    }

    fn post_recv(&mut self, op: OpId, c: RecvCmd) -> Result<()> {
        let RecvCmd { peer, tag, buf } = c;
        let p = self.peers.require(peer)?;
        if let Some(reason) = p.lost.clone() {
            self.ops.fail_new(
                op,
                OpKind::Recv,
                peer,
                tag,
                OpBuf::Recv(buf),
                Error::PeerLost { peer, reason },
            );
            return Ok(());
        }
        self.ops.insert(op, OpKind::Recv, peer, tag, ServiceLevel::Normal, OpBuf::Recv(buf), OpSt::Posted);
        if let Err((op, (), early)) = self.matcher.post(peer, tag, op, ()) {
            self.match_early(op, peer, early);
        }
        self.unstall(peer);
        Ok(())
    }

    /// A receive posted after its message (or its rendezvous announcement) arrived.
    pub(crate) fn match_early(&mut self, op: OpId, peer: PeerId, early: Early) {
        let (mut rx, peers) = self.rx();
        if let Matched::Read { op, rts } = rx.early(&mut peers[peer].budget, op, early) {
            self.start_rdv_recv(op, rts);
        }
    }

    /// Starts reading a rendezvous body into receive `op`, or tells the sender it did not fit.
    pub(crate) fn start_rdv_recv(&mut self, op: OpId, rts: Rts) {
        let Rts { msg, total, segs, conn: cid } = rts;
        let sl = self.conn(cid).map_or(ServiceLevel::Normal, |c| c.sl);
        let (mut rx, _) = self.rx();
        match rx.start_read(op, total, cid, sl) {
            Read::Go => {}
            // Tell the sender it can let go; the receive failed.
            Read::Truncated { capacity } => return self.send_fin(cid, msg, super::FIN_TRUNCATED, capacity),
            Read::Gone => return,
        }
        let Some(peer) = self.ops.get(&op).map(|o| o.peer) else { return };
        self.start_xfer(
            peer,
            cid,
            true,
            segs,
            0,
            Local::Op { op, base: 0 },
            total as usize,
            XferThen::RecvDone { op, msg },
        );
    }

    /// Tells a rendezvous sender we are done with its buffer, and how it went (`FIN_*`;
    /// `capacity` for [`super::FIN_TRUNCATED`]).
    pub(crate) fn send_fin(&mut self, cid: u32, msg_id: u64, status: u32, capacity: u64) {
        let sl = self.conn(cid).map_or(ServiceLevel::Normal, |c| c.sl);
        let mut h = Header::new(Kind::Fin, sl);
        h.b = msg_id;
        h.aux = status;
        h.c = capacity;
        self.enqueue(
            cid,
            OutMsg { via: Via::Send, header: h, payload: Payload::None, then: Then::Nothing, fence: false },
        );
    }

    fn post_request(&mut self, op: OpId, c: RequestCmd, now: Instant) -> Result<()> {
        let RequestCmd { peer, tag, sl, header, payload } = c;
        requests::check_header(&header, self.s.cfg.max_header)?;
        let len = requests::payload_len(&payload);
        self.check_len(len)?;
        let cid = match self.conn_for(peer, sl, now) {
            Ok(c) => c,
            Err(e) => {
                self.ops.fail_new(op, OpKind::Request, peer, tag, payload.split().0, e);
                return Ok(());
            }
        };
        let Some(cmd) = self.hold_until_limits_known(
            cid,
            op,
            Cmd::Request(RequestCmd { peer, tag, sl, header, payload }),
        ) else {
            return Ok(());
        };
        let Cmd::Request(RequestCmd { header, payload, .. }) = cmd else {
            unreachable!("held and returned as it was")
        };
        let (buf, dir) = payload.split();
        let caps = self.caps(cid);
        let plan = plan::plan_request(&self.s.policy, caps, op, tag, sl, header.len(), len, dir);
        self.ops.insert(op, OpKind::Request, peer, tag, sl, buf, OpSt::WaitReply);
        Counters::add(&self.core.counters.msgs_sent, 1);
        let mut h = plan.header;
        let mut parts = Vec::new();
        let mut segs_part = None;
        if let Some(purpose) = plan.register {
            let segs = match self.register_op_buf(op, purpose) {
                Ok(s) => s,
                Err(e) => {
                    self.ops.complete(op, Err(e));
                    return Ok(());
                }
            };
            let mut v = Vec::new();
            msg::encode_segments(&mut v, &segs);
            segs_part = Some(Bytes::from(v));
        }
        let segs_len = segs_part.as_ref().map_or(0, Bytes::len);
        if plan.header_by_rdv(caps, header.len(), segs_len) {
            let hdr_segs = match self.register_header(op, &header) {
                Ok(s) => s,
                Err(e) => {
                    // The op exists (and may hold its payload's registrations): it completes.
                    self.ops.complete(op, Err(e));
                    return Ok(());
                }
            };
            let mut v = Vec::new();
            msg::encode_segments(&mut v, &hdr_segs);
            parts.push(Payload::Bytes(Bytes::from(v)));
            h.flags |= FLAG_RDV_HEADER;
        } else {
            parts.push(Payload::Bytes(header));
        }
        if plan.inline_len > 0 {
            parts.push(Payload::Op { op, off: 0, len });
        }
        if let Some(s) = segs_part {
            parts.push(Payload::Bytes(s));
        }
        let payload = Payload::Parts(parts);
        h.len = payload.len() as u32;
        let via = plan.via(caps, payload.len());
        if let Some(o) = self.ops.get_mut(&op) {
            o.mech = plan.mech;
            o.x.conn = Some(cid);
            if plan.inline_len > 0 {
                o.moved = len;
            }
        }
        let then = if plan.inline_len > 0 { Then::Release(op) } else { Then::Nothing };
        self.enqueue(cid, OutMsg { via, header: h, payload, then, fence: false });
        Ok(())
    }

    /// Registers a header too large for a message: the peer reads it and answers FIN. The
    /// registration is held by `op` (requests) until it completes.
    fn register_header(&mut self, op: OpId, header: &Bytes) -> Result<Vec<Segment>> {
        let mut staged = self.pool.alloc(header.len())?;
        staged.copy_from_slice(header);
        let (regs, segs) = self.acquire_all(&[(staged.addr(), header.len())], Acquire::Find)?;
        if let Some(o) = self.ops.get_mut(&op) {
            o.x.regs.extend(regs);
            o.x.keep.push(staged);
        }
        Ok(segs)
    }

    fn post_pull(&mut self, op: OpId, c: PullCmd) -> Result<()> {
        let Some(PullCmd { peer, req, sl, offset, buf }) =
            self.sreqs.start_pull(&mut self.ops, &self.core.counters, op, c)?
        else {
            return Ok(());
        };
        let len = buf.capacity();
        let Some(r) = self.sreqs.get_mut(peer, req) else { unreachable!("checked by start_pull") };
        r.x.xfer_started();
        let (cid, segs) = (r.x.conn, r.x.segs.clone());
        self.ops.insert(op, OpKind::Pull, peer, 0, sl, OpBuf::Recv(buf), OpSt::Moving);
        if let Some(o) = self.ops.get_mut(&op) {
            o.mech = Some(Mechanism::ServerRdma);
            o.x.conn = Some(cid);
        }
        self.start_req_xfer(op, peer, req, cid, true, segs, offset, plan::plan_pull(len));
        Ok(())
    }

    /// Carries out a request's pull or push as `plan` says: a transfer, or (nothing to move)
    /// the op and the request's transfer done at once.
    #[allow(clippy::too_many_arguments)]
    fn start_req_xfer(
        &mut self,
        op: OpId,
        peer: PeerId,
        req: u64,
        cid: u32,
        read: bool,
        segs: Vec<Segment>,
        offset: u64,
        plan: Transfer,
    ) {
        match plan {
            Transfer::Nothing => {
                self.xfer_finished_for_req(peer, req);
                self.ops.complete(op, Ok(0));
            }
            Transfer::Move { len, end } => {
                let then = XferThen::ReqOp { op, peer, req, end };
                self.start_xfer(peer, cid, read, segs, offset, Local::Op { op, base: 0 }, len, then);
            }
        }
    }

    fn post_push(&mut self, op: OpId, c: PushCmd) -> Result<()> {
        let PushCmd { peer, req, sl, offset, buf } = c;
        let len = buf.len();
        let r = self.sreqs.check_push(peer, req, offset, len)?;
        if r.cancelled {
            self.ops.fail_new(op, OpKind::Push, peer, 0, OpBuf::Send(buf), Error::PeerCancelled);
            return Ok(());
        }
        let (cid, segs, rsl) = (r.x.conn, r.x.segs.clone(), r.sl);
        self.ops.insert(op, OpKind::Push, peer, 0, sl, OpBuf::Send(buf), OpSt::Sending);
        if segs.is_empty() {
            // The client did not register its buffer (small read): a PUSH message.
            let caps = self.caps(cid);
            let PushPlan { mech, via, header, pushed_to } =
                match plan::plan_push_message(&self.s.policy, caps, rsl, req, offset, len) {
                    Ok(p) => p,
                    Err(e) => {
                        self.ops.complete(op, Err(e));
                        return Ok(());
                    }
                };
            if let Some(o) = self.ops.get_mut(&op) {
                o.mech = Some(mech);
            }
            if let Some(end) = pushed_to
                && let Some(r) = self.sreqs.get_mut(peer, req)
            {
                r.x.pushed_to(end);
            }
            self.enqueue(
                cid,
                OutMsg {
                    via,
                    header,
                    payload: Payload::Op { op, off: 0, len },
                    then: Then::CompleteAtPost(op),
                    fence: false,
                },
            );
            return Ok(());
        }
        if let Some(r) = self.sreqs.get_mut(peer, req) {
            r.x.xfer_started();
        }
        if let Some(o) = self.ops.get_mut(&op) {
            o.mech = Some(Mechanism::ServerRdma);
            o.x.conn = Some(cid);
        }
        self.start_req_xfer(op, peer, req, cid, false, segs, offset, plan::plan_push_rdma(offset, len));
        Ok(())
    }

    fn post_reply(&mut self, op: OpId, c: ReplyCmd) -> Result<()> {
        let ReplyCmd { peer, req, sl, header, status } = c;
        requests::check_header(&header, self.s.cfg.max_header)?;
        let r = self.sreqs.get(peer, req)?;
        let _ = sl;
        let (cancelled, rsl) = (r.cancelled, r.sl);
        // A cancelled request's bare reply also waits for its transfers under way (see
        // `IbReq::reply`).
        let (header, status) = requests::reply_content(cancelled, header, status);
        self.ops.insert(op, OpKind::Reply, peer, 0, rsl, OpBuf::None, OpSt::Sending);
        if cancelled && let Some(o) = self.ops.get_mut(&op) {
            o.outcome = Some(Err(Error::PeerCancelled));
        }
        if let Some((op, header, status)) =
            self.sreqs.get_mut(peer, req).and_then(|r| r.x.reply((op, header, status)))
        {
            self.send_reply(op, peer, req, header, status);
        }
        Ok(())
    }

    /// Sends a reply now (its request's transfers are done).
    pub(crate) fn send_reply(&mut self, op: OpId, peer: PeerId, req: u64, header: Bytes, status: u32) {
        let Ok(r) = self.sreqs.close(peer, req) else {
            self.ops.complete(op, Err(Error::misuse("request vanished")));
            return;
        };
        self.release_request_budget(peer, r.cost);
        Counters::add(&self.core.counters.msgs_sent, 1);
        let caps = self.caps(r.x.conn);
        let ReplyPlan { header: mut h, header_by_rdv } =
            plan::plan_reply(caps, r.sl, req, status, r.x.pushed(), header.len());
        let payload = if header_by_rdv {
            match self.register_header(op, &header) {
                Ok(segs) => {
                    let msg_id = self.next_msg;
                    self.next_msg += 1;
                    let mut v = Vec::new();
                    msg::encode_segments(&mut v, &segs);
                    // The header's length is its segments' total.
                    h.flags |= FLAG_RDV_HEADER;
                    h.c = msg_id;
                    // The registration and the bytes stay until the client's FIN.
                    let (regs, keep) = self
                        .ops
                        .get_mut(&op)
                        .map(|o| (std::mem::take(&mut o.x.regs), std::mem::take(&mut o.x.keep)))
                        .unwrap_or_default();
                    self.fin_wait.insert(msg_id, FinWait::Header { peer, regs, keep });
                    Bytes::from(v)
                }
                Err(e) => {
                    self.ops.complete(op, Err(e));
                    return;
                }
            }
        } else {
            header
        };
        h.len = payload.len() as u32;
        let via = caps.via(payload.len());
        self.enqueue(
            r.x.conn,
            OutMsg {
                via,
                header: h,
                payload: Payload::Bytes(payload),
                then: Then::CompleteAtPost(op),
                fence: true,
            },
        );
    }

    pub(crate) fn release_request_budget(&mut self, peer: PeerId, cost: usize) {
        if let Some(p) = self.peers.get_mut(peer) {
            p.budget.request_done(cost);
        }
        self.unstall(peer);
    }

    /// A pull or push of a request finished: a deferred reply may go now.
    pub(crate) fn xfer_finished_for_req(&mut self, peer: PeerId, req: u64) {
        if let Some((op, header, status)) = self.sreqs.get_mut(peer, req).and_then(|r| r.x.xfer_finished()) {
            self.send_reply(op, peer, req, header, status);
        }
    }

    /// put (RDMA_WRITE, from a send buffer) or get (RDMA_READ, into a receive buffer) against a
    /// peer's exposure.
    fn post_one_sided(
        &mut self,
        op: OpId,
        peer: PeerId,
        sl: ServiceLevel,
        buf: OpBuf,
        remote: MemHandle,
        now: Instant,
    ) -> Result<()> {
        let read = matches!(buf, OpBuf::Recv(_));
        let len = match &buf {
            OpBuf::Send(s) => s.len(),
            OpBuf::Recv(r) => r.capacity(),
            OpBuf::None => 0,
        };
        let plan = plan::plan_one_sided(len, &remote, self.s.max_message)?;
        let kind = if read { OpKind::Get } else { OpKind::Put };
        let cid = match self.conn_for(peer, sl, now) {
            Ok(c) => c,
            Err(e) => {
                self.ops.fail_new(op, kind, peer, 0, buf, e);
                return Ok(());
            }
        };
        self.ops.insert(op, kind, peer, 0, sl, buf, OpSt::Moving);
        if let Some(o) = self.ops.get_mut(&op) {
            o.mech = Some(Mechanism::ServerRdma);
            o.x.conn = Some(cid);
        }
        match plan {
            Transfer::Nothing => self.ops.complete(op, Ok(0)),
            Transfer::Move { len, .. } => {
                let remote = vec![plan::exposure_segment(&remote)];
                let then = XferThen::CompleteOp(op);
                self.start_xfer(peer, cid, read, remote, 0, Local::Op { op, base: 0 }, len, then);
            }
        }
        Ok(())
    }

    // ----------------------------------------------------------------------------------------
    // Cancellation
    // ----------------------------------------------------------------------------------------

    /// Cancels an op of the application as [`cancel::cancel_step`] decides; a send or request
    /// still waiting for its connection's limits completes at once.
    pub(crate) fn cancel(&mut self, op: OpId, why: Error, now: Instant) {
        let Some(o) = self.ops.get(&op) else {
            self.fail_waiting_post(op, why);
            return;
        };
        let c = Cancelled {
            op,
            kind: o.kind,
            st: o.st,
            sl: o.sl,
            conn: o.x.conn,
            registered: !o.x.regs.is_empty(),
        };
        let (peer, tag) = (o.peer, o.tag);
        let notice = |header| OutMsg {
            via: Via::Send,
            header,
            payload: Payload::None,
            then: Then::Nothing,
            fence: false,
        };
        match cancel::cancel_step(&c, now, self.s.cfg.ib.cancel_grace) {
            CancelStep::Unpost => {
                self.matcher.cancel_posted(peer, tag, op);
                self.ops.complete(op, Err(why));
            }
            CancelStep::Withdraw { notice: n, until } => {
                if let Some(o) = self.ops.get_mut(&op) {
                    o.outcome = Some(Err(why));
                    o.st = OpSt::Cancelling { until };
                }
                if let Some((cid, h)) = n {
                    self.enqueue(cid, notice(h));
                }
            }
            CancelStep::CancelRequest { notice: n, hold_until } => {
                if let Some(p) = self.peers.get_mut(peer) {
                    p.cancelled_reqs.insert(op.0);
                }
                if let Some((cid, h)) = n {
                    self.enqueue(cid, notice(h));
                }
                match hold_until {
                    Some(until) => {
                        if let Some(o) = self.ops.get_mut(&op) {
                            o.outcome = Some(Err(why));
                            o.st = OpSt::Cancelling { until };
                        }
                    }
                    None => self.ops.complete(op, Err(why)),
                }
            }
            CancelStep::Abort => {
                if let Some(o) = self.ops.get_mut(&op) {
                    o.outcome = Some(Err(why));
                }
                self.abort_xfers_of(op);
                self.ops.complete(op, Err(Error::Cancelled));
            }
            CancelStep::Nothing => {}
        }
    }
}
