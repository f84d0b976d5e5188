//! The operation table both backends keep: every posted operation from the moment a backend
//! takes it until its completion leaves for the endpoint.
//!
//! Two rules live here and nowhere else:
//!
//! * **Exactly once.** An operation's outcome is set once (the first one wins) and the
//!   operation is delivered once: when its outcome is known, nothing the transport queued
//!   references its buffer any more (`refs` is zero) and the driver does not hold it (a
//!   cancelled operation whose memory a peer may still write). A lost peer fails each of its
//!   operations once, in the order they were posted.
//! * **Counted on the way out.** Completions leave in one batch per round
//!   ([`OpTable::hand_over`]); mechanisms and bytes are counted there, for every backend alike.

use std::collections::hash_map::Entry;

use bytes::Bytes;
use rustc_hash::FxHashMap;

use crate::buffers::buf::OpBuf;
use crate::comm::Mechanism;
use crate::completions::Completions;
use crate::error::{Error, Result};
use crate::info::Counters;
use crate::op::{Completion, OpKind};
use crate::types::{OpId, PeerId, ServiceLevel, Tag};

/// A driver's state of an operation (where in its protocol it is).
pub(crate) trait OpState: Copy {
    /// The state of an operation whose outcome is known and that waits only for the
    /// references to its buffer to go.
    const FINISHING: Self;

    /// The state of a client's request that waits for its reply (pushes into its IN buffer
    /// and pulls of its OUT payload are served in this state).
    const AWAITING_REPLY: Self;

    /// The driver holds the operation back even without references: its outcome is recorded
    /// but it is not delivered until the driver calls [`OpTable::deliver`].
    fn holds(self) -> bool {
        false
    }
}

/// What a driver keeps per operation beyond the shared record.
pub(crate) trait OpExtra: Default {
    /// A delivered operation's extra must go back to the driver before the completion leaves
    /// (registrations to release before the buffer returns to the application).
    fn must_retire(&self) -> bool {
        false
    }
}

impl OpExtra for () {}

/// One operation.
#[derive(Debug)]
pub(crate) struct Op<S, X> {
    pub kind: OpKind,
    pub peer: PeerId,
    pub tag: Tag,
    pub sl: ServiceLevel,
    pub buf: OpBuf,
    pub st: S,
    /// Queued frames, messages or work requests that still reference `buf`.
    pub refs: u32,
    pub outcome: Option<Result<usize>>,
    pub mech: Option<Mechanism>,
    pub reply: Option<Bytes>,
    /// Bytes moved so far: the end of the furthest byte pushed into a request's IN buffer, or
    /// the bytes of its OUT payload sent or pulled.
    pub moved: usize,
    /// Length this operation expects from the peer (a rendezvous total, a get or pull length).
    pub expect: u64,
    pub x: X,
}

/// The operations a backend holds, and the completions of those finished this round.
#[derive(Debug)]
pub(crate) struct OpTable<S, X> {
    ops: FxHashMap<OpId, Op<S, X>>,
    done: Vec<Completion>,
    /// Extras of delivered operations the driver must see before their completions leave.
    retired: Vec<X>,
}

impl<S, X> Default for OpTable<S, X> {
    fn default() -> Self {
        OpTable { ops: FxHashMap::default(), done: Vec::new(), retired: Vec::new() }
    }
}

impl<S: OpState, X: OpExtra> OpTable<S, X> {
    /// Takes a new operation; `st` is where the driver's protocol starts it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn insert(
        &mut self,
        op: OpId,
        kind: OpKind,
        peer: PeerId,
        tag: Tag,
        sl: ServiceLevel,
        buf: OpBuf,
        st: S,
    ) -> &mut Op<S, X> {
        let o = Op {
            kind,
            peer,
            tag,
            sl,
            buf,
            st,
            refs: 0,
            outcome: None,
            mech: None,
            reply: None,
            moved: 0,
            expect: 0,
            x: X::default(),
        };
        match self.ops.entry(op) {
            Entry::Occupied(mut e) => {
                debug_assert!(false, "operation {op} posted twice");
                e.insert(o);
                e.into_mut()
            }
            Entry::Vacant(e) => e.insert(o),
        }
    }

    pub(crate) fn get(&self, op: &OpId) -> Option<&Op<S, X>> {
        self.ops.get(op)
    }

    pub(crate) fn get_mut(&mut self, op: &OpId) -> Option<&mut Op<S, X>> {
        self.ops.get_mut(op)
    }

    #[cfg(target_os = "linux")]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&OpId, &Op<S, X>)> {
        self.ops.iter()
    }

    /// Request `op` of ours to `peer`, if it is one waiting for its reply.
    pub(crate) fn awaiting_reply(&mut self, op: OpId, peer: PeerId) -> Option<&mut Op<S, X>>
    where
        S: PartialEq,
    {
        self.ops
            .get_mut(&op)
            .filter(|o| o.peer == peer && o.kind == OpKind::Request && o.st == S::AWAITING_REPLY)
    }

    /// The operations on `peer`, in the order they were posted.
    pub(crate) fn of_peer(&self, peer: PeerId) -> Vec<OpId> {
        let mut ops: Vec<OpId> = self.ops.iter().filter(|(_, o)| o.peer == peer).map(|(id, _)| *id).collect();
        ops.sort();
        ops
    }

    /// Records an operation's outcome (the first one stands); delivers it now unless
    /// something still references its buffer or the driver holds it.
    pub(crate) fn complete(&mut self, op: OpId, result: Result<usize>) {
        self.complete_with(op, |_| Some(result));
    }

    /// [`OpTable::complete`] for an operation whose outcome depends on the operation itself,
    /// in one lookup: `f` may change it and returns its outcome, or `None` to leave it as it
    /// is. Returns whether it had an outcome.
    #[inline]
    pub(crate) fn complete_with(
        &mut self,
        op: OpId,
        f: impl FnOnce(&mut Op<S, X>) -> Option<Result<usize>>,
    ) -> bool {
        let Entry::Occupied(mut e) = self.ops.entry(op) else { return false };
        let o = e.get_mut();
        let Some(result) = f(o) else { return false };
        if o.outcome.is_none() {
            o.outcome = Some(result);
        }
        if o.st.holds() {
            return true;
        }
        o.st = S::FINISHING;
        if o.refs == 0 {
            let o = e.remove();
            self.push_done(op, o);
        }
        true
    }

    /// One reference to an operation's buffer went; a finished operation with none left is
    /// delivered.
    pub(crate) fn release_ref(&mut self, op: OpId) {
        let Entry::Occupied(mut e) = self.ops.entry(op) else { return };
        let o = e.get_mut();
        o.refs = o.refs.saturating_sub(1);
        if o.refs == 0 && o.outcome.is_some() && !o.st.holds() {
            let o = e.remove();
            self.push_done(op, o);
        }
    }

    /// Delivers an operation now, whatever references it (the driver knows none will touch
    /// its buffer again).
    pub(crate) fn deliver(&mut self, op: OpId) {
        if let Some(o) = self.ops.remove(&op) {
            self.push_done(op, o);
        }
    }

    /// Fails every operation on a lost peer, once each, in the order they were posted. An
    /// operation that already failed keeps its own error. The driver has already made sure
    /// nothing of the peer's connections touches their buffers any more.
    pub(crate) fn fail_peer(&mut self, peer: PeerId, err: &Error) {
        for op in self.of_peer(peer) {
            if let Some(o) = self.ops.get_mut(&op) {
                o.refs = 0;
                o.st = S::FINISHING;
                if !matches!(o.outcome, Some(Err(_))) {
                    o.outcome = Some(Err(err.duplicate()));
                }
                self.deliver(op);
            }
        }
    }

    /// An operation that completes as it is posted, never entering the table.
    pub(crate) fn done_new(
        &mut self,
        op: OpId,
        kind: OpKind,
        peer: PeerId,
        tag: Tag,
        buf: OpBuf,
        result: Result<usize>,
    ) {
        let mut c = Completion::new(op, kind, peer, tag);
        c.result = result;
        c.buf = buf;
        self.done.push(c);
    }

    /// A new operation that fails as it is posted (it was taken, so it must complete).
    pub(crate) fn fail_new(&mut self, op: OpId, kind: OpKind, peer: PeerId, tag: Tag, buf: OpBuf, e: Error) {
        self.done_new(op, kind, peer, tag, buf, Err(e));
    }

    /// A completion built whole by the driver (an operation served at once).
    pub(crate) fn push_completion(&mut self, c: Completion) {
        self.done.push(c);
    }

    /// Completions waiting to leave.
    pub(crate) fn done_len(&self) -> usize {
        self.done.len()
    }

    /// The completions waiting to leave, in order (for the InfiniBand engine's tests).
    #[cfg(all(test, target_os = "linux"))]
    pub(crate) fn done(&self) -> &[Completion] {
        &self.done
    }

    /// Gives every retired extra back to the driver (see [`OpExtra::must_retire`]); for a
    /// driver that drops its completions instead of handing them over.
    pub(crate) fn retire(&mut self, mut retire: impl FnMut(X)) {
        for x in self.retired.drain(..) {
            retire(x);
        }
    }

    /// Hands this round's completions to the endpoint: first every retired extra to the
    /// driver (so registrations end before buffers return), then the completions, counted.
    #[inline]
    pub(crate) fn hand_over(&mut self, core: &Completions, retire: impl FnMut(X)) {
        // Inline up to here: most rounds have nothing to hand over.
        if !self.retired.is_empty() {
            self.retire(retire);
        }
        if !self.done.is_empty() {
            self.hand_over_done(core);
        }
    }

    fn hand_over_done(&mut self, core: &Completions) {
        for c in &self.done {
            count(&core.counters, c);
        }
        core.complete_all(&mut self.done);
    }

    /// Takes the completions waiting to leave, without an endpoint to hand them to.
    #[cfg(test)]
    pub(crate) fn take_done(&mut self) -> Vec<Completion> {
        self.done.drain(..).collect()
    }

    fn push_done(&mut self, op: OpId, o: Op<S, X>) {
        if o.x.must_retire() {
            self.retired.push(o.x);
        }
        self.done.push(Completion {
            op,
            kind: o.kind,
            peer: o.peer,
            tag: o.tag,
            result: o.outcome.unwrap_or(Ok(0)),
            buf: o.buf,
            reply: o.reply,
            mechanism: o.mech,
        });
    }
}

/// Counts a completion's mechanism and the bytes it moved.
fn count(counters: &Counters, c: &Completion) {
    let (Ok(n), Some(m)) = (&c.result, c.mechanism) else { return };
    counters.mechanism(m);
    match c.kind {
        OpKind::Recv | OpKind::Get | OpKind::Pull => Counters::add(&counters.bytes_received, *n as u64),
        OpKind::Send | OpKind::SendUnexpected | OpKind::Put | OpKind::Push => {
            Counters::add(&counters.bytes_sent, *n as u64)
        }
        OpKind::Request | OpKind::Reply => {}
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A driver's op states as the core sees them, for the core's own tests.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum St {
        Moving,
        Cancelling,
        Finishing,
    }

    impl OpState for St {
        const FINISHING: Self = St::Finishing;
        const AWAITING_REPLY: Self = St::Moving;
        fn holds(self) -> bool {
            self == St::Cancelling
        }
    }

    #[derive(Debug, Default)]
    struct Regs(u32);

    impl OpExtra for Regs {
        fn must_retire(&self) -> bool {
            self.0 > 0
        }
    }

    fn table() -> OpTable<St, Regs> {
        OpTable::default()
    }

    fn add(t: &mut OpTable<St, Regs>, op: u64, peer: u64, st: St) -> &mut Op<St, Regs> {
        t.insert(OpId(op), OpKind::Recv, PeerId(peer), 0, ServiceLevel::Normal, OpBuf::None, st)
    }

    fn done_ids(t: &OpTable<St, Regs>) -> Vec<u64> {
        t.done.iter().map(|c| c.op.0).collect()
    }

    #[test]
    fn the_first_outcome_stands_and_delivery_waits_for_references() {
        let mut t = table();
        add(&mut t, 1, 0, St::Moving).refs = 2;
        t.complete(OpId(1), Ok(10));
        t.complete(OpId(1), Err(Error::Cancelled));
        assert!(t.done.is_empty(), "delivered while its buffer was referenced");
        t.release_ref(OpId(1));
        assert!(t.done.is_empty());
        t.release_ref(OpId(1));
        t.release_ref(OpId(1));
        assert_eq!(done_ids(&t), [1]);
        assert!(matches!(t.done[0].result, Ok(10)));
        assert!(t.get(&OpId(1)).is_none());
    }

    #[test]
    fn a_held_operation_is_delivered_only_by_the_driver() {
        let mut t = table();
        add(&mut t, 1, 0, St::Cancelling);
        t.complete(OpId(1), Err(Error::Cancelled));
        t.release_ref(OpId(1));
        assert!(t.done.is_empty());
        t.deliver(OpId(1));
        t.deliver(OpId(1));
        assert_eq!(done_ids(&t), [1]);
    }

    #[test]
    fn a_lost_peer_fails_its_operations_once_in_posting_order_keeping_earlier_errors() {
        let mut t = table();
        add(&mut t, 7, 1, St::Moving).refs = 3;
        add(&mut t, 3, 1, St::Moving);
        add(&mut t, 5, 2, St::Moving);
        add(&mut t, 4, 1, St::Moving).refs = 1;
        t.complete(OpId(4), Err(Error::Timeout));
        let lost = Error::PeerLost { peer: PeerId(1), reason: "reset".into() };
        t.fail_peer(PeerId(1), &lost);
        t.fail_peer(PeerId(1), &lost);
        assert_eq!(done_ids(&t), [3, 4, 7]);
        assert!(matches!(t.done[1].result, Err(Error::Timeout)));
        assert!(matches!(t.done[0].result, Err(Error::PeerLost { .. })));
        assert!(t.get(&OpId(5)).is_some());
    }

    #[test]
    fn extras_that_hold_resources_are_retired_before_completions_leave() {
        let mut t = table();
        add(&mut t, 1, 0, St::Moving).x = Regs(2);
        add(&mut t, 2, 0, St::Moving);
        t.complete(OpId(1), Ok(0));
        t.complete(OpId(2), Ok(0));
        assert_eq!(t.retired.len(), 1, "only extras holding something are retired");
        assert_eq!(t.retired[0].0, 2);
    }
}
