//! Cancellation decisions: what giving up an op means in each state it can be in, from the
//! op's state and the time alone. An op the peer may still read or write must not give its
//! memory back before the peer lets go (its FIN or reply) or a grace period ends (then the
//! connection goes); everything else completes at once. The engine carries the step out.

use std::time::{Duration, Instant};

use crate::core::requests;
use crate::op::OpKind;
use crate::types::{OpId, ServiceLevel};
use crate::wire::{Header, Kind};

use super::{OpSt, RDV_WITHDRAW};

/// What cancellation looks at of an op.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cancelled {
    pub op: OpId,
    pub kind: OpKind,
    pub st: OpSt,
    pub sl: ServiceLevel,
    /// The connection its messages went on.
    pub conn: Option<u32>,
    /// It holds registrations the peer may use (a request's payload or header).
    pub registered: bool,
}

/// What cancelling an op does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelStep {
    /// A receive still in the matcher: it leaves it and completes now.
    Unpost,
    /// A rendezvous send: the receiver may be reading its buffer, so the op keeps buffer and
    /// registration until the receiver's FIN (the receiver answers a withdrawal of a message
    /// it has not matched at once) or `until`; `notice` (connection, header) withdraws it.
    Withdraw { notice: Option<(u32, Header)>, until: Instant },
    /// A request waiting for its reply: `notice` tells the server, and its id is remembered so
    /// that late answers are dropped. It completes now, unless the server may be reading or
    /// writing its registered memory: then it waits for the reply until `hold_until`.
    CancelRequest { notice: Option<(u32, Header)>, hold_until: Option<Instant> },
    /// Our own RDMA into or out of its buffer may be in flight: the transfers stop, and the
    /// op completes once its posted work requests are done.
    Abort,
    /// Nothing now: its bytes are on their way (it completes when they are sent), it is
    /// cancelling already, or it is not the client's to cancel.
    Nothing,
}

/// The step that cancels `o` at `now`; a peer holding its memory gets `grace` to let go.
pub(crate) fn cancel_step(o: &Cancelled, now: Instant, grace: Duration) -> CancelStep {
    match o.st {
        OpSt::Posted => CancelStep::Unpost,
        OpSt::WaitFin { msg } => {
            let mut h = Header::new(Kind::Cts, o.sl);
            h.b = msg;
            h.aux = RDV_WITHDRAW;
            CancelStep::Withdraw { notice: o.conn.map(|c| (c, h)), until: now + grace }
        }
        OpSt::WaitReply if o.kind == OpKind::Request => CancelStep::CancelRequest {
            notice: o.conn.map(|c| (c, requests::cancel_notice(o.sl, o.op))),
            hold_until: o.registered.then(|| now + grace),
        },
        OpSt::Moving => CancelStep::Abort,
        OpSt::WaitReply | OpSt::Sending | OpSt::Finishing | OpSt::Cancelling { .. } => CancelStep::Nothing,
    }
}

/// Whether a cancelled op's grace is over at `now`: the peer did not let go of its memory in
/// time, and only tearing the connection down stops it from using it.
pub(crate) fn grace_over(st: OpSt, now: Instant) -> bool {
    matches!(st, OpSt::Cancelling { until } if until <= now)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(3);
    const CONN: u32 = 4;

    fn op(kind: OpKind, st: OpSt) -> Cancelled {
        Cancelled { op: OpId(21), kind, st, sl: ServiceLevel::Bulk, conn: Some(CONN), registered: false }
    }

    #[test]
    fn a_posted_receive_leaves_the_matcher() {
        let now = Instant::now();
        assert_eq!(cancel_step(&op(OpKind::Recv, OpSt::Posted), now, GRACE), CancelStep::Unpost);
    }

    #[test]
    fn a_rendezvous_send_is_withdrawn_and_held_for_the_grace() {
        let now = Instant::now();
        let st = OpSt::WaitFin { msg: 99 };
        let CancelStep::Withdraw { notice: Some((conn, h)), until } =
            cancel_step(&op(OpKind::Send, st), now, GRACE)
        else {
            panic!("a send waiting for its FIN is withdrawn")
        };
        assert_eq!(conn, CONN);
        assert_eq!((h.kind, h.sl, h.b, h.aux, h.len), (Kind::Cts, ServiceLevel::Bulk, 99, RDV_WITHDRAW, 0));
        assert_eq!(until, now + GRACE);
        // Without a connection there is nobody to tell; the buffer is still held.
        let o = Cancelled { conn: None, ..op(OpKind::Send, st) };
        assert_eq!(cancel_step(&o, now, GRACE), CancelStep::Withdraw { notice: None, until: now + GRACE });
    }

    #[test]
    fn a_request_tells_the_server_and_waits_only_if_registered() {
        let now = Instant::now();
        let o = op(OpKind::Request, OpSt::WaitReply);
        let CancelStep::CancelRequest { notice: Some((conn, h)), hold_until: None } =
            cancel_step(&o, now, GRACE)
        else {
            panic!("an unregistered request completes now")
        };
        assert_eq!(conn, CONN);
        assert_eq!((h.kind, h.sl, h.b, h.len), (Kind::CancelRequest, ServiceLevel::Bulk, 21, 0));
        let o = Cancelled { registered: true, ..o };
        let CancelStep::CancelRequest { notice: Some(_), hold_until } = cancel_step(&o, now, GRACE) else {
            panic!("a registered request is cancelled")
        };
        assert_eq!(hold_until, Some(now + GRACE), "the server may use its memory: held for the grace");
        let o = Cancelled { conn: None, ..o };
        assert!(matches!(cancel_step(&o, now, GRACE), CancelStep::CancelRequest { notice: None, .. }));
    }

    #[test]
    fn moving_data_is_aborted() {
        let now = Instant::now();
        for kind in [OpKind::Recv, OpKind::Get, OpKind::Put, OpKind::Pull, OpKind::Push] {
            assert_eq!(cancel_step(&op(kind, OpSt::Moving), now, GRACE), CancelStep::Abort, "{kind:?}");
        }
    }

    #[test]
    fn ops_on_their_way_or_cancelling_already_are_left_alone() {
        let now = Instant::now();
        let states = [
            (OpKind::Send, OpSt::Sending),
            (OpKind::Reply, OpSt::Sending),
            (OpKind::Send, OpSt::Finishing),
            (OpKind::Request, OpSt::Cancelling { until: now }),
            (OpKind::Send, OpSt::Cancelling { until: now + GRACE }),
            // Only a client's request waits for a reply it can cancel.
            (OpKind::Recv, OpSt::WaitReply),
        ];
        for (kind, st) in states {
            assert_eq!(cancel_step(&op(kind, st), now, GRACE), CancelStep::Nothing, "{kind:?} {st:?}");
        }
    }

    #[test]
    fn the_grace_ends_at_its_instant() {
        let now = Instant::now();
        let until = now + GRACE;
        let st = OpSt::Cancelling { until };
        assert!(!grace_over(st, now));
        assert!(!grace_over(st, until - Duration::from_nanos(1)));
        assert!(grace_over(st, until));
        assert!(grace_over(st, until + GRACE));
        for other in [OpSt::Posted, OpSt::Sending, OpSt::WaitReply, OpSt::Moving, OpSt::Finishing] {
            assert!(!grace_over(other, until + GRACE), "{other:?}");
        }
    }
}
