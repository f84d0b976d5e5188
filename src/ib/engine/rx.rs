//! Matching arrived messages to receives, without the device (sans-IO): an eager message or a
//! rendezvous announcement (RTS) meets the receive posted for its tag, or waits as an early
//! arrival within its peer's budget, or — the budget spent — stays where it lies; a receive
//! posted later takes the oldest early arrival. Truncation is decided here, for eager bodies
//! and for rendezvous bodies, in one place each; so are the admission of unexpected messages,
//! a sender's withdrawal of a rendezvous, where a request's pushed bytes go, what a FIN does
//! to the rendezvous send (or the reply header sent by rendezvous) it belongs to, and what of
//! a lost peer goes.
//!
//! [`Rx`] borrows the tables the rules touch (matcher, operations, the peer's budget,
//! counters) and reads an eager body through [`Body`], which the engine implements over the
//! connection's memory and a test over a byte vector. What needs the device comes back as a
//! decision the engine carries out: [`Matched::Read`] (start the RDMA READ of a rendezvous
//! body), [`Read::Truncated`] (send FIN with the receiver's capacity) and the registrations a
//! FIN hands back ([`Rx::fin`]).

use std::collections::HashSet;

use bytes::Bytes;
use rustc_hash::FxHashMap;

use crate::buffers::buf::{OpBuf, RegisteredBuf};
use crate::comm::Mechanism;
use crate::core::loss::Loss;
use crate::core::peers::Budget;
use crate::core::requests::{self, PushInto};
use crate::error::Error;
use crate::info::Counters;
use crate::matching::Matcher;
use crate::regcache::RegRef;
use crate::types::{OpId, PeerId, ServiceLevel, Tag};

use super::inbound::{self, unexpected};
use super::msg::Segment;
use super::{Early, FinWait, OpSt, Ops, RDV_COST};

/// An arrived message's payload, where it lies until consumed.
pub(crate) trait Body {
    fn len(&self) -> usize;
    /// Copies `dst.len()` bytes starting `at` bytes into the payload.
    fn read(&self, at: usize, dst: &mut [u8]);
}

impl Body for [u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn read(&self, at: usize, dst: &mut [u8]) {
        dst.copy_from_slice(&self[at..at + dst.len()]);
    }
}

/// A rendezvous message announced by its sender: `msg` of `total` bytes in `segs`, on `conn`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rts {
    pub msg: u64,
    pub total: u64,
    pub segs: Vec<Segment>,
    pub conn: u32,
}

/// What an arrival (or a receive meeting an early arrival) leads to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Matched {
    /// Handled here: delivered into a receive, kept as an early arrival, or a receive completed.
    Done,
    /// The peer's budget is spent: the message stays in its buffer until the application
    /// consumes something.
    Hold,
    /// Receive `op` matched a rendezvous: the engine reads its body (see [`Rx::start_read`]).
    Read { op: OpId, rts: Rts },
}

/// Whether a matched rendezvous body fits its receive.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Read {
    /// It fits: the engine reads `total` bytes into the receive.
    Go,
    /// It does not: the receive failed here; the engine tells the sender with a FIN carrying
    /// `capacity`, so it can let go of its buffer.
    Truncated { capacity: u64 },
    /// The receive is gone (nothing to do).
    Gone,
}

/// The tables matching touches, borrowed from the engine for one decision.
pub(crate) struct Rx<'a> {
    pub matcher: &'a mut Matcher<(), Early>,
    pub ops: &'a mut Ops,
    /// Our rendezvous sends and headers waiting for the peer's FIN, by message id.
    pub fin_wait: &'a mut FxHashMap<u64, FinWait>,
    pub counters: &'a Counters,
    /// Bytes of early arrivals a peer may make us hold.
    pub early_limit: usize,
}

fn capacity(ops: &Ops, op: OpId) -> usize {
    match ops.get(&op).map(|o| &o.buf) {
        Some(OpBuf::Recv(b)) => b.capacity(),
        _ => 0,
    }
}

impl Rx<'_> {
    /// An eager message for `tag` from `peer`: into the receive posted for it (or that receive
    /// fails, truncated), else kept as an early arrival (copied out, so its buffer and credit go
    /// back at once), else held.
    pub fn eager(
        &mut self,
        budget: &mut Budget,
        peer: PeerId,
        tag: Tag,
        sl: ServiceLevel,
        mech: Mechanism,
        body: &(impl Body + ?Sized),
    ) -> Matched {
        let len = body.len();
        if let Some((op, ())) = self.matcher.take_posted(peer, tag) {
            let cap = capacity(self.ops, op);
            Counters::add(&self.counters.msgs_received, 1);
            let Some(o) = self.ops.get_mut(&op) else { return Matched::Done };
            o.sl = sl;
            o.mech = Some(mech);
            if len > cap {
                self.ops.complete(op, Err(Error::Truncated { len: len as u64, capacity: cap as u64 }));
                return Matched::Done;
            }
            if let OpBuf::Recv(b) = &mut o.buf {
                let mut done = 0;
                while done < len {
                    let Some(dst) = b.slice_at_mut(done) else { break };
                    let n = dst.len().min(len - done);
                    body.read(done, &mut dst[..n]);
                    done += n;
                }
            }
            self.counters.copied(len);
            self.ops.complete(op, Ok(len));
            return Matched::Done;
        }
        if !budget.reserve(len, self.early_limit) {
            return Matched::Hold;
        }
        let mut data = vec![0u8; len];
        body.read(0, &mut data);
        self.counters.copied(len);
        self.matcher.queue_early(peer, tag, Early::Eager { data: Bytes::from(data), sl, mech });
        Matched::Done
    }

    /// A rendezvous announcement for `tag` from `peer`: read into the receive posted for it,
    /// else kept as an early arrival, else held.
    pub fn rts(&mut self, budget: &mut Budget, peer: PeerId, tag: Tag, rts: Rts) -> Matched {
        if let Some((op, ())) = self.matcher.take_posted(peer, tag) {
            return Matched::Read { op, rts };
        }
        if !budget.reserve(RDV_COST, self.early_limit) {
            return Matched::Hold;
        }
        let Rts { msg, total, segs, conn } = rts;
        self.matcher.queue_early(peer, tag, Early::Rdv { msg, total, segs, conn, withdrawn: false });
        Matched::Done
    }

    /// An unexpected message from `peer` (one no receive asks for): copied out for the
    /// application's queue if the peer may have another one held (at most `max`, within its
    /// budget), else `None` and it stays in its buffer.
    pub fn unexpected(
        &mut self,
        budget: &mut Budget,
        max: usize,
        body: &(impl Body + ?Sized),
    ) -> Option<Bytes> {
        let len = body.len();
        if !budget.admit_unexpected(len, max, self.early_limit) {
            return None;
        }
        Counters::add(&self.counters.msgs_received, 1);
        let mut data = vec![0u8; len];
        body.read(0, &mut data);
        self.counters.copied(len);
        budget.queued(len);
        Some(Bytes::from(data))
    }

    /// A PUSH from `peer` of `len` bytes at `offset` into request `req`'s IN buffer (checked by
    /// [`requests::incoming_push`], with `cancelled` the peer's forgotten requests): the op to
    /// copy them into, or `None` to drop them. The read's mechanism is how its data came: any
    /// push through the ring makes it fast RDMA, else its first non-empty push says inline.
    pub fn push(
        &mut self,
        cancelled: &HashSet<u64>,
        peer: PeerId,
        (req, offset, len): (u64, u64, usize),
        arrived_by: Mechanism,
    ) -> Result<Option<OpId>, Loss> {
        let first = self.ops.get(&OpId(req)).is_some_and(|o| o.moved == 0);
        match requests::incoming_push(self.ops, cancelled, peer, req, offset, len) {
            Ok(PushInto::Op(op)) => {
                // A read reports fast RDMA if any of its pushes came that way, else inline if
                // its first push carried bytes.
                if let Some(o) = self.ops.get_mut(&op)
                    && (arrived_by == Mechanism::FastRdma || (first && len > 0))
                {
                    o.mech = Some(arrived_by);
                }
                Ok(Some(op))
            }
            Ok(PushInto::Discard) => Ok(None),
            Err(e) => Err(Loss::Protocol(e)),
        }
    }

    /// The sender withdraws rendezvous message `msg` it announced on `conn` (it was
    /// cancelled). Unmatched, it stays queued, marked, so the receive that later matches it
    /// learns of the cancel, and `true` says the engine releases the sender now with a FIN.
    /// Already being read (or unknown), `false`: a read's FIN comes when the read is done.
    pub fn withdraw(&mut self, peer: PeerId, msg: u64, conn: u32) -> bool {
        let (msg_id, cid) = (msg, conn);
        self.matcher.find_early_mut(peer, |e| match e {
            Early::Rdv { msg, withdrawn, conn, .. } if *msg == msg_id && *conn == cid => {
                *withdrawn = true;
                true
            }
            _ => false,
        })
    }

    /// Receive `op` was posted after `early` arrived for it: its budget goes back and the
    /// receive completes from the copy, or fails (truncated, or the sender withdrew), or reads
    /// the rendezvous body.
    pub fn early(&mut self, budget: &mut Budget, op: OpId, early: Early) -> Matched {
        match early {
            Early::Eager { data, sl, mech } => {
                budget.release(data.len());
                Counters::add(&self.counters.msgs_received, 1);
                let Some(o) = self.ops.get_mut(&op) else { return Matched::Done };
                o.sl = sl;
                o.mech = Some(mech);
                let mut copied = 0;
                let r = match &mut o.buf {
                    OpBuf::Recv(b) if b.capacity() >= data.len() => {
                        b.copy_in(0, &data);
                        copied = data.len();
                        Ok(data.len())
                    }
                    OpBuf::Recv(b) => {
                        Err(Error::Truncated { len: data.len() as u64, capacity: b.capacity() as u64 })
                    }
                    _ => Ok(0),
                };
                self.counters.copied(copied);
                self.ops.complete(op, r);
                Matched::Done
            }
            Early::Rdv { msg, total, segs, conn, withdrawn } => {
                budget.release(RDV_COST);
                if withdrawn {
                    // The sender cancelled this message; the receive it matches says so.
                    self.ops.complete(op, Err(Error::PeerCancelled));
                    return Matched::Done;
                }
                Matched::Read { op, rts: Rts { msg, total, segs, conn } }
            }
        }
    }

    /// Receive `op` is about to read a rendezvous body of `total` bytes on connection `conn`
    /// (of service level `sl`): it moves by server-side RDMA if it fits, else fails truncated.
    pub fn start_read(&mut self, op: OpId, total: u64, conn: u32, sl: ServiceLevel) -> Read {
        let cap = capacity(self.ops, op) as u64;
        let Some(o) = self.ops.get_mut(&op) else { return Read::Gone };
        o.sl = sl;
        o.mech = Some(Mechanism::ServerRdma);
        o.x.conn = Some(conn);
        if total > cap {
            self.ops.complete(op, Err(Error::Truncated { len: total, capacity: cap }));
            return Read::Truncated { capacity: cap };
        }
        o.st = OpSt::Moving;
        Counters::add(&self.counters.msgs_received, 1);
        Read::Go
    }

    /// A FIN from `peer`: it is done with the buffer of our rendezvous message `msg` (a send,
    /// or a reply header). The send completes with what `status` says (once: the wait ends
    /// here); a header's registrations and memory come back for the engine to release. Only the
    /// peer the message went to may say so — any other peer could otherwise hand a buffer back
    /// to its user while the real receiver still reads it.
    pub fn fin(
        &mut self,
        peer: PeerId,
        msg: u64,
        status: u32,
        capacity: u64,
    ) -> Result<Option<Released>, Loss> {
        let owner = match self.fin_wait.get(&msg) {
            Some(FinWait::Send(op)) => self.ops.get(op).map(|o| o.peer),
            Some(FinWait::Header { peer, .. }) => Some(*peer),
            None => None,
        };
        if owner != Some(peer) {
            return Err(unexpected(format!("FIN for unknown transfer {msg}")));
        }
        match self.fin_wait.remove(&msg) {
            Some(FinWait::Send(op)) => {
                let n = match self.ops.get(&op).map(|o| &o.buf) {
                    Some(OpBuf::Send(s)) => s.len(),
                    _ => 0,
                };
                if let Some(o) = self.ops.get_mut(&op)
                    && matches!(o.st, OpSt::Cancelling { .. })
                {
                    o.st = OpSt::Finishing;
                }
                self.ops.complete(op, inbound::fin_result(status, n, capacity));
                Ok(None)
            }
            Some(FinWait::Header { regs, keep, .. }) => Ok(Some(Released { regs, keep })),
            None => Ok(None),
        }
    }

    /// `peer` is lost (its queue pairs already destroyed, so nothing more lands in our
    /// memory): its posted receives and early arrivals go, nothing of it waits for a FIN any
    /// more, and every one of its operations fails once with `err` (an error it already had
    /// stands). Returns the registrations and memory of the headers it was to fetch, for the
    /// engine to give back.
    pub fn lose_peer(&mut self, peer: PeerId, err: &Error) -> Vec<Released> {
        let (_posted, _early) = self.matcher.drop_peer(peer);
        let ops = self.ops.of_peer(peer);
        let mut released = Vec::new();
        let mut msgs: Vec<u64> = self
            .fin_wait
            .iter()
            .filter(|(_, f)| match f {
                FinWait::Header { peer: p, .. } => *p == peer,
                FinWait::Send(op) => ops.contains(op),
            })
            .map(|(m, _)| *m)
            .collect();
        // In message order, so registrations go back in the order they were taken.
        msgs.sort_unstable();
        for m in msgs {
            if let Some(FinWait::Header { regs, keep, .. }) = self.fin_wait.remove(&m) {
                released.push(Released { regs, keep });
            }
        }
        self.ops.fail_peer(peer, err);
        released
    }
}

/// What a FIN for a reply header sent by rendezvous hands back: the engine gives the
/// registrations to its cache, then drops the memory.
pub(crate) struct Released {
    pub regs: Vec<RegRef>,
    pub keep: Vec<RegisteredBuf>,
}

#[cfg(test)]
#[path = "rx_tests.rs"]
mod tests;
