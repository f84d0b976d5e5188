//! The per-connection transmit pump: queued messages out to the send queue, within the
//! peer's credits and ring slots.

use crate::buffers::buf::{OpBuf, SendBuf};
use crate::flowctl::Transmit;
use crate::ib::verbs::*;
use crate::info::Counters;
use crate::types::{Access, OpId};
use crate::wire::{Header, Kind};

use super::msg::{self, MSG_HDR, Prefix};
use super::{OutMsg, Payload, SqDone, SqEntry, State, Then, Via, WR_SEND, wr_id};

impl<V: Verbs> State<V> {
    // ----------------------------------------------------------------------------------------
    // The transmit pump
    // ----------------------------------------------------------------------------------------

    pub(crate) fn pump_all(&mut self) {
        let n = self.conns.len();
        for cid in 0..n as u32 {
            // Something to send: queued messages, owed credits, or ring slots to return (ring
            // writes consume no credit, so a receiver of nothing but fast-RDMA messages owes no
            // credit and would otherwise never give the sender its slots back).
            let go = self.conn(cid).is_some_and(|c| {
                c.ready
                    && (!c.out.is_empty()
                        || c.credits.as_ref().is_some_and(|k| k.owed() > 0)
                        || c.ring_rx.should_return())
            });
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
            let max_wr = self.s.cfg.ib.max_send_wr;
            if c.sq_depth + 2 > max_wr {
                return;
            }
            let Some(m) = c.out.front() else { break };
            let ok = match m.via {
                Via::Send => c.credits.as_ref().is_some_and(|k| k.credits() >= 2) && !c.free_small.is_empty(),
                Via::Ring => {
                    c.ring_tx.as_ref().is_some_and(|r| r.free_slots() > 0)
                        && !c.free_small.is_empty()
                        && !c.free_large.is_empty()
                }
            };
            if !ok {
                break;
            }
            let Some(m) = self.conn_mut(cid).and_then(|c| c.out.pop_front()) else { break };
            self.transmit(cid, m);
        }
        // Explicit credit returns (also carrying ring-slot returns).
        let max_wr = self.s.cfg.ib.max_send_wr;
        loop {
            let Some(c) = self.conns.get_mut(cid as usize).and_then(Option::as_mut) else { return };
            if c.free_small.is_empty() || c.sq_depth + 2 > max_wr {
                return;
            }
            let sl = c.sl;
            let Some(k) = c.credits.as_mut() else { return };
            match k.poll_transmit() {
                Some(Transmit::Credit { credits }) => {
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
                Some(Transmit::Data { .. }) => {
                    // Not reachable: data is pushed only when it goes out at once.
                    debug_assert!(false, "queued data in the credit queue");
                }
                None => return,
            }
        }
    }

    fn transmit(&mut self, cid: u32, m: OutMsg) {
        let credits = if m.via == Via::Send {
            let Some(k) = self.conn_mut(cid).and_then(|c| c.credits.as_mut()) else { return };
            let _ = k.push(());
            match k.poll_transmit() {
                Some(Transmit::Data { piggyback, .. }) => Some(piggyback),
                _ => {
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
        let prefix = Prefix {
            credits: match credits {
                Some(n) => n,
                None => c.credits.as_mut().map_or(0, |k| k.take_piggyback()),
            },
            ring_returns: c.ring_rx.take_returns(),
        };
        let total = MSG_HDR + payload.len();
        // Bytes that go through the bounce buffer.
        let bounced = total - zero_copy.map_or(0, |z| z.1);
        let small = c.free_small.pop().expect("checked by the pump");
        let (bounce_off, bounce) = if bounced > c.layout.rs {
            let i = c.free_large.pop().expect("checked by the pump");
            c.free_small.push(small);
            (c.layout.large_off(i), super::Bounce::Large(i))
        } else {
            (c.layout.small_off(small), super::Bounce::Small(small))
        };
        let mut hb = [0u8; MSG_HDR];
        msg::encode_into(&mut hb, prefix, &h);
        c.mem.write_at(bounce_off, &hb);
        let copied = match (zero_copy, &payload) {
            (None, p) => write_payload(&c.mem, bounce_off + MSG_HDR, p, &self.ops),
            (Some(_), Payload::Parts(parts)) => {
                let head = Payload::Parts(parts[..parts.len() - 1].to_vec());
                write_payload(&c.mem, bounce_off + MSG_HDR, &head, &self.ops)
            }
            (Some(_), _) => 0,
        };
        let lkey_user = zero_copy.map(|z| z.2);
        let mut sges = smallvec::SmallVec::<[Sge; 2]>::new();
        let base = c.mem.addr();
        match zero_copy {
            Some((addr, len, _)) => {
                sges.push(Sge::new(base + bounce_off as u64, bounced as u32, c.mr.lkey()));
                sges.push(Sge::new(addr as u64, len as u32, lkey_user.unwrap_or(0)));
            }
            None => sges.push(Sge::new(base + bounce_off as u64, total as u32, c.mr.lkey())),
        }
        let op_code = match via {
            Via::Send => SendOp::Send,
            Via::Ring => {
                let Some(slot) = c.ring_tx.as_mut().and_then(|r| r.reserve(total as u32).ok().flatten())
                else {
                    // Cannot happen (checked by the pump); drop the message loudly rather
                    // than post into a slot the peer has not returned.
                    tracing::error!("ring slot vanished");
                    return;
                };
                let remote = c.remote.expect("ready connections know their peer");
                SendOp::RdmaWriteWithImm {
                    remote_addr: remote.ring_addr + slot.offset,
                    rkey: remote.ring_rkey,
                    imm: slot.imm,
                }
            }
        };
        let then_final = match (then, zero_copy) {
            (Then::CompleteAtPost(op), Some(_)) => Then::CompleteAtWc(op),
            (t, _) => t,
        };
        let mut flags = SendFlags::NONE;
        let needs_signal = matches!(then_final, Then::CompleteAtWc(_) | Then::Release(_));
        c.since_signal += 1;
        let low =
            c.free_small.len() < c.layout.n_small / 2 || c.free_large.len() < c.layout.n_large.div_ceil(2);
        if needs_signal || low || c.since_signal >= self.s.cfg.ib.max_send_wr / 4 {
            flags = flags | SendFlags::SIGNALED;
            c.since_signal = 0;
        }
        if zero_copy.is_none() && total as u32 <= self.s.max_inline_device.min(c.qp.cap().max_inline_data) {
            flags = flags | SendFlags::INLINE;
        }
        if fence && c.reads_out > 0 {
            flags = flags | SendFlags::FENCE;
        }
        let seq = c.seq;
        c.seq = c.seq.wrapping_add(1);
        let wr = SendWr { wr_id: wr_id(WR_SEND, c.id, c.gen_, seq), op: op_code, sges: &sges, flags };
        let posted = c.qp.post_send(&[wr]);
        c.sq_depth += 1;
        c.sq.push_back(SqEntry {
            seq,
            signaled: flags.contains(SendFlags::SIGNALED),
            completed: false,
            bounce: Some(bounce),
            done: SqDone::Then(then_final),
        });
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
