//! The per-connection transmit pump: queued messages out to the send queue, within the
//! peer's credits and ring slots as the connection's [`Link`](super::link::Link) decides, and
//! the mapping of each message work request it builds onto the queue pair.

use crate::buffers::buf::{OpBuf, SendBuf};
use crate::ib::verbs::*;
use crate::info::Counters;
use crate::types::{Access, OpId};
use crate::wire::{Header, Kind};

use super::link::{MsgOp, MsgSpec};
use super::msg::{self, MSG_HDR};
use super::{OutMsg, Payload, SqDone, State, Then, Via, WR_SEND, wr_id};

impl<V: Verbs> State<V> {
    // ----------------------------------------------------------------------------------------
    // The transmit pump
    // ----------------------------------------------------------------------------------------

    pub(crate) fn pump_all(&mut self) {
        let n = self.conns.len();
        for cid in 0..n as u32 {
            // Something to send: queued messages, or credits and ring slots to return.
            let go = self.conn(cid).is_some_and(|c| c.ready && (!c.out.is_empty() || c.link.returns_due()));
            if go {
                self.pump(cid);
            }
        }
        self.pump_units();
    }

    /// Transmits queued messages in order while credits, ring slots, bounce buffers and
    /// send-queue room allow; then an explicit CREDIT if one is due.
    pub(crate) fn pump(&mut self, cid: u32) {
        loop {
            let Some(c) = self.conn(cid) else { return };
            if !c.ready {
                return;
            }
            let Some(m) = c.out.front() else { break };
            if !c.link.can_send(m.via) {
                break;
            }
            let Some(m) = self.conn_mut(cid).and_then(|c| c.out.pop_front()) else { break };
            self.transmit(cid, m);
        }
        // Explicit credit returns (also carrying ring-slot returns).
        loop {
            let Some(c) = self.conn_mut(cid) else { return };
            let sl = c.sl;
            let Some(credits) = c.link.explicit_credit() else { return };
            Counters::add(&self.core.counters.credit_msgs, 1);
            self.transmit_raw(
                cid,
                Via::Send,
                Header::new(Kind::Credit, sl),
                Payload::None,
                Then::Nothing,
                false,
                Some(credits),
            );
        }
    }

    fn transmit(&mut self, cid: u32, m: OutMsg) {
        let credits = if m.via == Via::Send {
            let Some(c) = self.conn_mut(cid) else { return };
            match c.link.take_credit() {
                Some(piggyback) => Some(piggyback),
                None => {
                    debug_assert!(false, "credit vanished");
                    return;
                }
            }
        } else {
            None
        };
        self.transmit_raw(cid, m.via, m.header, m.payload, m.then, m.fence, credits);
    }

    /// Builds and posts one message. `credits`: the piggyback for a SEND (already taken from
    /// the credit state); ring writes take theirs here.
    #[allow(clippy::too_many_arguments)]
    fn transmit_raw(
        &mut self,
        cid: u32,
        via: Via,
        h: Header,
        payload: Payload,
        then: Then,
        fence: bool,
        credits: Option<u16>,
    ) {
        // Fast RDMA straight from a registered buffer: the op's bytes at the end of the message
        // go as their own scatter/gather entry, only what precedes them is copied.
        let tail = match via {
            Via::Ring => trailing_op(&payload),
            Via::Send => None,
        };
        let zero_copy = tail.and_then(|(op, off, len)| {
            self.ops.get(&op).and_then(|o| match &o.buf {
                OpBuf::Send(SendBuf::Registered(b)) if len > 0 => {
                    Some((b.addr() + off, len, b.keys().lkey, op))
                }
                _ => None,
            })
        });
        // A zero-copy write needs a cache reference held until it completes.
        let zero_copy = zero_copy.and_then(|(addr, len, lkey, op)| {
            let r = self.cache.lock().unwrap_or_else(|p| p.into_inner()).acquire_if_registered(
                addr,
                len,
                Access::READ_WRITE,
            );
            r.map(|r| {
                if let Some(o) = self.ops.get_mut(&op) {
                    o.x.regs.push(r);
                }
                (addr, len, lkey)
            })
        });
        let Some(c) = self.conns.get_mut(cid as usize).and_then(Option::as_mut) else { return };
        let total = MSG_HDR + payload.len();
        let then_final = match (then, zero_copy) {
            (Then::CompleteAtPost(op), Some(_)) => Then::CompleteAtWc(op),
            (t, _) => t,
        };
        let spec = MsgSpec {
            via,
            total,
            zero_copy: zero_copy.map_or(0, |z| z.1),
            needs_signal: matches!(then_final, Then::CompleteAtWc(_) | Then::Release(_)),
            fence,
            inline_max: self.s.max_inline_device.min(c.qp.cap().max_inline_data),
            credits,
        };
        let w = match c.link.message(spec, SqDone::Then(then_final)) {
            Ok(w) => w,
            Err(e) => {
                // Not reachable (the pump checked); never post into a slot or buffer the peer
                // has not given us.
                tracing::error!(error = %e, "message without room");
                let peer = c.peer;
                self.fail_peer(peer, super::Loss::Lost(format!("flow control: {e}")));
                return;
            }
        };
        // The mapping onto the queue pair: header and copied payload into the bounce buffer,
        // then one work request.
        let mut hb = [0u8; MSG_HDR];
        msg::encode_into(&mut hb, w.prefix, &h);
        c.mem.write_at(w.bounce_off, &hb);
        let copied = match (zero_copy, &payload) {
            (None, p) => write_payload(&c.mem, w.bounce_off + MSG_HDR, p, &self.ops),
            (Some(_), Payload::Parts(parts)) => {
                let head = Payload::Parts(parts[..parts.len() - 1].to_vec());
                write_payload(&c.mem, w.bounce_off + MSG_HDR, &head, &self.ops)
            }
            (Some(_), _) => 0,
        };
        let mut sges = smallvec::SmallVec::<[Sge; 2]>::new();
        sges.push(Sge::new(c.mem.addr() + w.bounce_off as u64, w.bounced as u32, c.mr.lkey()));
        if let Some((addr, len, lkey)) = zero_copy {
            sges.push(Sge::new(addr as u64, len as u32, lkey));
        }
        let op_code = match w.op {
            MsgOp::Send => SendOp::Send,
            MsgOp::WriteImm { ring_off, imm } => {
                let remote = c.remote.expect("ready connections know their peer");
                SendOp::RdmaWriteWithImm {
                    remote_addr: remote.ring_addr + ring_off,
                    rkey: remote.ring_rkey,
                    imm,
                }
            }
        };
        let mut flags = SendFlags::NONE;
        if w.signaled {
            flags = flags | SendFlags::SIGNALED;
        }
        if w.inline {
            flags = flags | SendFlags::INLINE;
        }
        if w.fence {
            flags = flags | SendFlags::FENCE;
        }
        let wr = SendWr { wr_id: wr_id(WR_SEND, c.id, c.gen_, w.seq), op: op_code, sges: &sges, flags };
        let posted = c.qp.post_send(&[wr]);
        let peer = c.peer;
        self.core.counters.copied(copied);
        if let Err(e) = posted {
            tracing::debug!(error = %e.error, "post_send failed");
            self.fail_peer(peer, super::Loss::Lost(format!("post_send: {}", e.error)));
            return;
        }
        // The data is in the bounce buffer (or the op completes at the work completion).
        if let Then::CompleteAtPost(op) = then_final {
            let n = match self.ops.get(&op).map(|o| &o.buf) {
                Some(OpBuf::Send(s)) => s.len(),
                _ => 0,
            };
            self.ops.release_ref(op);
            self.ops.complete(op, Ok(n));
        }
    }
}

/// The op bytes a payload ends with, as (op, offset, length).
fn trailing_op(p: &Payload) -> Option<(OpId, usize, usize)> {
    match p {
        Payload::Op { op, off, len } => Some((*op, *off, *len)),
        Payload::Parts(parts) => parts.last().and_then(trailing_op),
        Payload::None | Payload::Bytes(_) => None,
    }
}

/// Copies a payload into registered memory at `off`; returns the bytes copied from op
/// buffers (what counts as a host copy of user data).
fn write_payload(mem: &super::DmaRegion, off: usize, p: &Payload, ops: &super::Ops) -> usize {
    match p {
        Payload::None => 0,
        Payload::Bytes(b) => {
            mem.write_at(off, b);
            0
        }
        Payload::Op { op, off: o, len } => {
            if let Some(OpBuf::Send(s)) = ops.get(op).map(|x| &x.buf) {
                let mut at = off;
                s.for_each_slice(*o, *len, |piece| {
                    mem.write_at(at, piece);
                    at += piece.len();
                });
            }
            *len
        }
        Payload::Parts(parts) => {
            let mut at = off;
            let mut n = 0;
            for part in parts {
                n += write_payload(mem, at, part, ops);
                at += part.len();
            }
            n
        }
    }
}
