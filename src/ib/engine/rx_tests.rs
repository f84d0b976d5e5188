//! The matching rules of [`Rx`] on their own tables: no device, no connection, no clock.

use bytes::BytesMut;

use super::*;
use crate::buffers::buf::{RecvBuf, SendBuf};
use crate::ib::engine::{FIN_CANCELLED, FIN_OK, FIN_TRUNCATED};
use crate::op::OpKind;

const PEER: PeerId = PeerId(7);
const SEG: Segment = Segment { addr: 0x1000, len: 100, rkey: 9 };

/// The tables matching borrows, owned by the test.
#[derive(Default)]
struct T {
    matcher: Matcher<(), Early>,
    ops: Ops,
    fin_wait: FxHashMap<u64, FinWait>,
    counters: Counters,
    budget: Budget,
}

impl T {
    fn rx(&mut self, early_limit: usize) -> (Rx<'_>, &mut Budget) {
        let T { matcher, ops, fin_wait, counters, budget } = self;
        (Rx { matcher, ops, fin_wait, counters, early_limit }, budget)
    }

    fn eager(&mut self, tag: Tag, data: &[u8]) -> Matched {
        let (mut rx, budget) = self.rx(1024);
        rx.eager(budget, PEER, tag, ServiceLevel::Bulk, Mechanism::Inline, data)
    }

    fn rts(&mut self, tag: Tag, msg: u64) -> Matched {
        let (mut rx, budget) = self.rx(1024);
        rx.rts(budget, PEER, tag, rts(msg))
    }

    /// The application posts a receive of `cap` bytes: what the engine's post does.
    fn recv(&mut self, op: u64, tag: Tag, cap: usize) -> Matched {
        let buf = OpBuf::Recv(RecvBuf::Mut(BytesMut::zeroed(cap)));
        self.ops.insert(OpId(op), OpKind::Recv, PEER, tag, ServiceLevel::Normal, buf, OpSt::Posted);
        match self.matcher.post(PEER, tag, OpId(op), ()) {
            Ok(()) => Matched::Done,
            Err((op, (), early)) => {
                let (mut rx, budget) = self.rx(1024);
                rx.early(budget, op, early)
            }
        }
    }

    /// Completions of `op` by result alone (what a send's completion has).
    fn results(&self, op: u64) -> Vec<Result<usize, String>> {
        let got = self.ops.done().iter().filter(|c| c.op == OpId(op));
        got.map(|c| c.result.as_ref().map(|n| *n).map_err(|e| format!("{e:?}"))).collect()
    }

    /// Completions of `op`: the bytes received or the error, and the mechanism.
    fn done(&self, op: u64) -> Vec<Outcome> {
        let got = self.ops.done().iter().filter(|c| c.op == OpId(op));
        got.map(|c| {
            let r = match (&c.buf, &c.result) {
                (OpBuf::Recv(RecvBuf::Mut(b)), Ok(n)) => Ok(b[..*n].to_vec()),
                (_, Ok(n)) => panic!("completed with {n} bytes and no receive buffer"),
                (_, Err(e)) => Err(format!("{e:?}")),
            };
            (r, c.mechanism)
        })
        .collect()
    }
}

/// A completion as the tests compare it.
type Outcome = (Result<Vec<u8>, String>, Option<Mechanism>);

fn rts(msg: u64) -> Rts {
    Rts { msg, total: 100, segs: vec![SEG], conn: 3 }
}

#[test]
fn a_posted_receive_takes_an_eager_message_on_arrival() {
    let mut t = T::default();
    assert_eq!(t.recv(1, 5, 8), Matched::Done);
    assert_eq!(t.eager(5, b"hello"), Matched::Done);
    assert_eq!(t.done(1), vec![(Ok(b"hello".to_vec()), Some(Mechanism::Inline))]);
    assert_eq!(t.budget.buffered, 0, "nothing held for the peer");
    assert_eq!(t.matcher.early_len(), 0);
    // Another message for the tag finds no receive: it waits, and is not delivered twice.
    assert_eq!(t.eager(5, b"again"), Matched::Done);
    assert_eq!(t.done(1).len(), 1);
    assert_eq!(t.matcher.early_len(), 1);
}

#[test]
fn early_arrivals_wait_within_the_budget_and_later_receives_take_them_in_order() {
    let mut t = T::default();
    assert_eq!(t.eager(5, b"first"), Matched::Done);
    assert_eq!(t.eager(6, b"other"), Matched::Done);
    assert_eq!(t.eager(5, b"second"), Matched::Done);
    assert_eq!(t.budget.buffered, 16, "copied out and charged to the peer");
    assert_eq!(t.recv(1, 5, 16), Matched::Done);
    assert_eq!(t.recv(2, 5, 16), Matched::Done);
    assert_eq!(t.done(1), vec![(Ok(b"first".to_vec()), Some(Mechanism::Inline))]);
    assert_eq!(t.done(2), vec![(Ok(b"second".to_vec()), Some(Mechanism::Inline))]);
    assert_eq!(t.budget.buffered, 5, "given back as each is taken");
    assert_eq!(t.matcher.early_len(), 1, "the other tag's message still waits");
}

#[test]
fn a_receive_too_small_fails_truncated_once_whichever_came_first() {
    let mut t = T::default();
    t.recv(1, 5, 3);
    assert_eq!(t.eager(5, b"hello"), Matched::Done);
    let truncated = "Truncated { len: 5, capacity: 3 }".to_string();
    assert_eq!(t.done(1), vec![(Err(truncated.clone()), Some(Mechanism::Inline))]);
    assert_eq!(t.eager(6, b"hello"), Matched::Done);
    t.recv(2, 6, 3);
    assert_eq!(t.done(2), vec![(Err(truncated), Some(Mechanism::Inline))]);
    assert_eq!(t.budget.buffered, 0);
    assert_eq!(t.matcher.early_len() + t.matcher.posted_len(), 0, "both consumed");
}

#[test]
fn a_spent_budget_holds_the_message_in_place() {
    let mut t = T::default();
    let (mut rx, budget) = t.rx(8);
    // The first always fits, however large; the next waits in its buffer.
    assert_eq!(
        rx.eager(budget, PEER, 5, ServiceLevel::Bulk, Mechanism::Inline, &[1u8; 20][..]),
        Matched::Done
    );
    assert_eq!(
        rx.eager(budget, PEER, 5, ServiceLevel::Bulk, Mechanism::Inline, &[2u8; 1][..]),
        Matched::Hold
    );
    assert_eq!(rx.rts(budget, PEER, 5, rts(1)), Matched::Hold);
    assert_eq!(t.matcher.early_len(), 1, "held messages are not queued");
    assert_eq!(t.budget.buffered, 20);
    // The application takes the first: budget back, the held one now fits.
    t.recv(1, 5, 32);
    assert_eq!(t.budget.buffered, 0);
    assert_eq!(t.eager(5, &[2u8; 1]), Matched::Done);
    assert_eq!(t.results(1), vec![Ok(20)]);
}

#[test]
fn a_rendezvous_is_read_by_its_receive_posted_before_or_after_the_rts() {
    let mut t = T::default();
    // Receive first: the RTS asks for the read at once, charging nothing.
    t.recv(1, 5, 100);
    assert_eq!(t.rts(5, 10), Matched::Read { op: OpId(1), rts: rts(10) });
    assert_eq!(t.budget.buffered, 0);
    // RTS first: kept, charged, and read when the receive comes.
    assert_eq!(t.rts(6, 11), Matched::Done);
    assert_eq!(t.budget.buffered, RDV_COST);
    assert_eq!(t.recv(2, 6, 100), Matched::Read { op: OpId(2), rts: rts(11) });
    assert_eq!(t.budget.buffered, 0);
    for op in [1, 2] {
        let (mut rx, _) = t.rx(1024);
        assert_eq!(rx.start_read(OpId(op), 100, 3, ServiceLevel::Bulk), Read::Go);
        let o = t.ops.get(&OpId(op)).unwrap();
        assert_eq!((o.st, o.mech, o.x.conn), (OpSt::Moving, Some(Mechanism::ServerRdma), Some(3)));
        assert!(t.done(op).is_empty(), "completes when the read is done");
    }
}

#[test]
fn a_rendezvous_larger_than_its_receive_fails_it_and_asks_for_a_fin() {
    let mut t = T::default();
    t.recv(1, 5, 99);
    let Matched::Read { op, rts } = t.rts(5, 10) else { panic!("a read") };
    let (mut rx, _) = t.rx(1024);
    assert_eq!(rx.start_read(op, rts.total, rts.conn, ServiceLevel::Bulk), Read::Truncated { capacity: 99 });
    assert_eq!(
        t.done(1),
        vec![(Err("Truncated { len: 100, capacity: 99 }".into()), Some(Mechanism::ServerRdma))]
    );
    let (mut rx, _) = t.rx(1024);
    assert_eq!(rx.start_read(op, rts.total, rts.conn, ServiceLevel::Bulk), Read::Gone, "once");
}

#[test]
fn a_withdrawn_rendezvous_releases_its_sender_and_fails_the_receive_that_matches_it() {
    let mut t = T::default();
    t.rts(5, 10);
    let (mut rx, _) = t.rx(1024);
    assert!(!rx.withdraw(PEER, 10, 4), "announced on another connection");
    assert!(!rx.withdraw(PEER, 11, 3), "not announced");
    assert!(!rx.withdraw(PeerId(8), 10, 3), "announced by another peer");
    assert!(rx.withdraw(PEER, 10, 3), "unmatched: the sender is released now");
    assert_eq!(t.recv(1, 5, 100), Matched::Done, "nothing to read");
    assert_eq!(t.done(1), vec![(Err("PeerCancelled".into()), None)]);
    assert_eq!(t.budget.buffered, 0);
    // Matched already (being read): its FIN comes when the read is done, not now.
    t.recv(2, 6, 100);
    assert!(matches!(t.rts(6, 12), Matched::Read { .. }));
    let (mut rx, _) = t.rx(1024);
    assert!(!rx.withdraw(PEER, 12, 3));
}

#[test]
fn unexpected_messages_queue_up_to_the_count_and_the_budget() {
    let mut t = T::default();
    let (mut rx, budget) = t.rx(8);
    assert_eq!(rx.unexpected(budget, 3, &b"abcd"[..]), Some(Bytes::from_static(b"abcd")));
    assert_eq!(rx.unexpected(budget, 3, &b"efgh"[..]), Some(Bytes::from_static(b"efgh")));
    assert_eq!(rx.unexpected(budget, 3, &b"i"[..]), None, "beyond the bytes: held");
    assert_eq!((budget.unexpected, budget.buffered, budget.queued_unexpected), (2, 8, 2));
    assert_eq!(rx.unexpected(budget, 2, &b""[..]), None, "beyond the count: held");
    budget.unexpected_taken(4);
    assert_eq!(rx.unexpected(budget, 2, &b"i"[..]), Some(Bytes::from_static(b"i")), "taken: room again");
}

/// A rendezvous send of `n` bytes to `peer`, waiting for the FIN of message `msg`.
fn waiting_send(t: &mut T, op: u64, msg: u64, peer: PeerId, n: usize) {
    let buf = OpBuf::Send(SendBuf::Bytes(Bytes::from(vec![0u8; n])));
    t.ops.insert(OpId(op), OpKind::Send, peer, 1, ServiceLevel::Normal, buf, OpSt::WaitFin { msg });
    t.fin_wait.insert(msg, FinWait::Send(OpId(op)));
}

#[test]
fn a_fin_completes_its_send_exactly_once_with_what_the_receiver_says() {
    let mut t = T::default();
    waiting_send(&mut t, 1, 10, PEER, 40);
    waiting_send(&mut t, 2, 11, PEER, 40);
    waiting_send(&mut t, 3, 12, PEER, 40);
    let (mut rx, _) = t.rx(0);
    assert!(rx.fin(PEER, 10, FIN_OK, 0).unwrap().is_none());
    assert!(rx.fin(PEER, 11, FIN_TRUNCATED, 16).unwrap().is_none());
    assert!(rx.fin(PEER, 12, FIN_CANCELLED, 0).unwrap().is_none());
    // A repeated FIN names no transfer any more: a protocol error, and no second completion.
    assert!(matches!(rx.fin(PEER, 10, FIN_OK, 0), Err(Loss::Protocol(_))));
    assert_eq!(t.results(1), vec![Ok(40)]);
    assert_eq!(t.results(2), vec![Err("Truncated { len: 40, capacity: 16 }".into())]);
    assert_eq!(t.results(3), vec![Err("PeerCancelled".into())]);
    assert!(t.fin_wait.is_empty());
}

#[test]
fn only_the_receiver_may_fin_and_a_header_fin_hands_back_its_memory() {
    let mut t = T::default();
    let other = PeerId(8);
    waiting_send(&mut t, 1, 10, PEER, 4);
    t.fin_wait.insert(11, FinWait::Header { peer: PEER, regs: Vec::new(), keep: Vec::new() });
    let (mut rx, _) = t.rx(0);
    for msg in [10, 11] {
        assert!(
            matches!(rx.fin(other, msg, FIN_OK, 0), Err(Loss::Protocol(_))),
            "FIN {msg} from another peer"
        );
    }
    assert!(matches!(rx.fin(PEER, 99, FIN_OK, 0), Err(Loss::Protocol(_))), "unknown message");
    assert_eq!(t.fin_wait.len(), 2, "still awaited");
    assert!(t.ops.done().is_empty());
    let (mut rx, _) = t.rx(0);
    assert!(rx.fin(PEER, 11, FIN_OK, 0).unwrap().is_some(), "the header's registrations come back");
    assert!(rx.fin(PEER, 10, FIN_OK, 0).unwrap().is_none());
    assert_eq!(t.results(1), vec![Ok(4)]);
}

#[test]
fn a_lost_peer_fails_each_of_its_operations_once_and_keeps_nothing_waiting() {
    let mut t = T::default();
    let other = PeerId(8);
    t.recv(1, 5, 8); // posted, unmatched
    t.recv(2, 6, 100);
    let Matched::Read { op, rts } = t.rts(6, 20) else { panic!("a read") };
    let (mut rx, _) = t.rx(1024);
    assert_eq!(rx.start_read(op, rts.total, rts.conn, ServiceLevel::Bulk), Read::Go); // moving
    waiting_send(&mut t, 3, 10, PEER, 4); // waiting for its FIN
    t.fin_wait.insert(11, FinWait::Header { peer: PEER, regs: Vec::new(), keep: Vec::new() });
    t.eager(7, b"early"); // an early arrival
    waiting_send(&mut t, 4, 12, other, 4); // another peer's
    let lost = Error::PeerLost { peer: PEER, reason: "gone".into() };
    let (mut rx, _) = t.rx(1024);
    assert_eq!(rx.lose_peer(PEER, &lost).len(), 1, "the header it was to fetch comes back");
    for op in [1, 2, 3] {
        let r = t.results(op);
        assert_eq!(r.len(), 1, "op {op} completes once");
        assert!(r[0].as_ref().unwrap_err().starts_with("PeerLost"), "op {op}: {r:?}");
    }
    assert!(t.results(4).is_empty(), "the other peer's send still waits");
    assert_eq!(t.fin_wait.keys().copied().collect::<Vec<_>>(), vec![12]);
    assert_eq!(t.matcher.posted_len() + t.matcher.early_len(), 0);
    // Losing it again (a late completion of its flushed work) completes nothing twice.
    let (mut rx, _) = t.rx(1024);
    assert!(rx.lose_peer(PEER, &lost).is_empty());
    assert_eq!(t.ops.done().len(), 3);
    // A FIN it sent before it went is refused: nothing of it waits.
    let (mut rx, _) = t.rx(1024);
    assert!(rx.fin(PEER, 10, FIN_OK, 0).is_err());
}

/// A read's mechanism is how its pushed bytes came: any push through the ring makes it fast
/// RDMA; otherwise its first non-empty push, sent inline, says inline.
#[test]
fn pushes_land_in_their_request_and_name_its_mechanism() {
    let mut t = T::default();
    let request = |t: &mut T, op| {
        let buf = OpBuf::Recv(RecvBuf::Mut(BytesMut::zeroed(100)));
        t.ops.insert(OpId(op), OpKind::Request, PEER, 1, ServiceLevel::Normal, buf, OpSt::WaitReply);
    };
    let none = HashSet::new();
    request(&mut t, 1);
    request(&mut t, 2);
    let (mut rx, _) = t.rx(1024);
    assert_eq!(rx.push(&none, PEER, (1, 0, 0), Mechanism::Inline).ok(), Some(Some(OpId(1))), "an empty push");
    assert_eq!(t.ops.get(&OpId(1)).unwrap().mech, None, "says nothing of how data came");
    let (mut rx, _) = t.rx(1024);
    assert_eq!(rx.push(&none, PEER, (1, 0, 10), Mechanism::Inline).ok(), Some(Some(OpId(1))));
    let (mut rx, _) = t.rx(1024);
    assert_eq!(rx.push(&none, PEER, (1, 10, 10), Mechanism::FastRdma).ok(), Some(Some(OpId(1))));
    let (mut rx, _) = t.rx(1024);
    assert_eq!(rx.push(&none, PEER, (1, 20, 10), Mechanism::Inline).ok(), Some(Some(OpId(1))));
    assert_eq!(t.ops.get(&OpId(1)).unwrap().mech, Some(Mechanism::FastRdma), "a ring push decides");
    let (mut rx, _) = t.rx(1024);
    assert_eq!(rx.push(&none, PEER, (2, 0, 10), Mechanism::Inline).ok(), Some(Some(OpId(2))));
    assert_eq!(t.ops.get(&OpId(2)).map(|o| (o.mech, o.moved)), Some((Some(Mechanism::Inline), 10)));
    let (mut rx, _) = t.rx(1024);
    assert!(
        matches!(rx.push(&none, PEER, (2, 95, 10), Mechanism::Inline), Err(Loss::Protocol(_))),
        "past the buffer"
    );
    let cancelled: HashSet<u64> = [3].into();
    let (mut rx, _) = t.rx(1024);
    assert_eq!(
        rx.push(&cancelled, PEER, (3, 0, 10), Mechanism::FastRdma).ok(),
        Some(None),
        "cancelled here: dropped"
    );
    let (mut rx, _) = t.rx(1024);
    assert!(
        matches!(rx.push(&none, PEER, (3, 0, 10), Mechanism::FastRdma), Err(Loss::Protocol(_))),
        "unknown request"
    );
    assert!(t.ops.done().is_empty());
}
