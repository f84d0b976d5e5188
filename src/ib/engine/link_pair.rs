//! Two [`Link`]s joined by an in-memory wire under the test's control: the message path's flow
//! control without a device, threads or clocks.
//!
//! The wire plays the parts of the hardware the rules are about: each end's receive queue (a
//! SEND that finds it empty is an RNR, which the rules must make impossible; a ring write
//! consumes a receive and the driver re-posts it at once), the peer's ring (a write into a
//! slot not returned fails in [`crate::flowctl::RingReceiver`]), and the send queue's
//! completions, delivered in posting order or withheld. Each end's "driver" does what the
//! engine's pump does: messages queue, go out while [`Link::can_send`] allows, and explicit
//! CREDITs follow when due. Messages carry a tag; every delivered and every retired tag is
//! recorded, so tests check counts and exactly-once outcomes.

use std::collections::VecDeque;

use crate::flowctl::{CreditConfig, Credits, FlowError, RingConfig, RingReceiver, RingSender};

use super::link::{Arrival, Bounce, Held, Layout, Link, LinkError, MsgOp, MsgSpec, MsgWr, Via};
use super::msg::{MSG_HDR, Prefix};

/// Receive buffers for SENDs (the credits the peer gets).
const N_RECV: u16 = 8;
/// Ring slots.
const N_RING: u16 = 6;
/// Receive buffer size.
const RS: usize = 256;
/// Ring slot size.
const SLOT: usize = 1024;
/// Send-queue depth.
const MAX_WR: u32 = 16;
/// The tag of a CREDIT message.
const CREDIT: u32 = u32::MAX;

fn layout() -> Layout {
    Layout {
        rs: RS,
        slot: SLOT,
        n_recv: usize::from(N_RECV + N_RING),
        n_small: 2 * usize::from(N_RECV),
        n_large: usize::from(N_RING),
        n_ring: usize::from(N_RING),
    }
}

fn link() -> Link<u32> {
    let ring = RingReceiver::new(&RingConfig::default().slots(N_RING).slot_size(SLOT as u32)).unwrap();
    let mut l = Link::new(layout(), ring, MAX_WR);
    let credits = Credits::new(&CreditConfig::default().recv_buffers(N_RECV), N_RECV).unwrap();
    l.connect(credits, RingSender::new(N_RING, SLOT as u32).unwrap());
    l
}

/// A message in flight.
struct Flight {
    wr: MsgWr,
    tag: u32,
    total: usize,
}

/// One end: its link, receive queue, queued messages and what it saw.
struct End {
    link: Link<u32>,
    /// Posted receive buffers, in posting order.
    rq: VecDeque<u32>,
    /// Messages waiting for the link to let them out: (via, total length, tag).
    out: VecDeque<(Via, usize, u32)>,
    /// The application holds what arrives instead of consuming it (back-pressure).
    holding: bool,
    /// Tags of data messages received, in order.
    received: Vec<u32>,
    /// Tags retired by send completions (and flushes), in order.
    retired: Vec<u32>,
    /// Work requests posted, by kind.
    sends: usize,
    writes: usize,
    credits_sent: usize,
}

impl End {
    fn new() -> End {
        let n = layout().n_recv as u32;
        End {
            link: link(),
            rq: (0..n).collect(),
            out: VecDeque::new(),
            holding: false,
            received: Vec::new(),
            retired: Vec::new(),
            sends: 0,
            writes: 0,
            credits_sent: 0,
        }
    }

    /// The pump: queued messages while the link allows, then explicit CREDITs.
    fn pump(&mut self, wire: &mut VecDeque<Flight>) {
        while let Some(&(via, total, tag)) = self.out.front() {
            if !self.link.can_send(via) {
                break;
            }
            self.out.pop_front();
            let credits = match via {
                Via::Send => Some(self.link.take_credit().expect("can_send promised a credit")),
                Via::Ring => None,
            };
            let spec = MsgSpec {
                via,
                total,
                zero_copy: 0,
                needs_signal: true,
                fence: false,
                inline_max: 64,
                credits,
            };
            let wr = self.link.message(spec, tag).expect("can_send promised room");
            match wr.op {
                MsgOp::Send => self.sends += 1,
                MsgOp::WriteImm { .. } => self.writes += 1,
            }
            wire.push_back(Flight { wr, tag, total });
        }
        while let Some(credits) = self.link.explicit_credit() {
            let spec = MsgSpec {
                via: Via::Send,
                total: MSG_HDR,
                zero_copy: 0,
                needs_signal: false,
                fence: false,
                inline_max: 64,
                credits: Some(credits),
            };
            let wr = self.link.message(spec, CREDIT).expect("explicit_credit promised room");
            self.credits_sent += 1;
            wire.push_back(Flight { wr, tag: CREDIT, total: MSG_HDR });
        }
    }

    /// A message lands here: the device's part (receive queue, ring), then the link's.
    fn land(&mut self, f: &Flight) {
        let arrival = match f.wr.op {
            MsgOp::Send => {
                let idx = self.rq.pop_front().expect("RNR: a SEND found no posted receive");
                Arrival::Send { idx, len: f.total }
            }
            MsgOp::WriteImm { ring_off, imm } => {
                // Consumes a receive, which the driver re-posts at once.
                let idx = self.rq.pop_front().expect("RNR: a ring write found no posted receive");
                self.rq.push_back(idx);
                let (slot, len) = crate::flowctl::decode_imm(imm);
                assert_eq!(ring_off, u64::from(slot) * SLOT as u64, "written where the imm says");
                assert_eq!(len as usize, f.total);
                Arrival::Ring { imm: Some(imm) }
            }
        };
        let (loc, len) = self.link.arrived(arrival).expect("a well-formed arrival");
        assert_eq!(len, f.total);
        self.link.framing(loc, f.wr.prefix).expect("the peer kept the rules");
        if f.tag == CREDIT {
            self.consume(loc);
            return;
        }
        self.received.push(f.tag);
        if !self.link.admit(loc) {
            // Queued by the link behind what the application holds.
            return;
        }
        if self.holding {
            self.link.hold(loc);
        } else {
            self.consume(loc);
        }
    }

    fn consume(&mut self, loc: Held) {
        if let Some(i) = self.link.release(loc).expect("release of a held message") {
            self.rq.push_back(i);
        }
    }

    /// The application stops holding: what it held is consumed, then what queued behind it,
    /// in arrival order.
    fn release_all(&mut self) {
        self.holding = false;
        while let Some(loc) = self.link.next_held() {
            assert!(self.link.unhold(loc));
            self.consume(loc);
        }
    }

    fn complete(&mut self, seq: u32) {
        let retired = self.link.send_done(seq).expect("completion of an outstanding work request");
        self.retired.extend(retired.into_iter().filter_map(|e| e.done).filter(|t| *t != CREDIT));
    }
}

/// Two ends and the wire between them. `ab`: in flight from a to b.
struct Pair {
    a: End,
    b: End,
    ab: VecDeque<Flight>,
    ba: VecDeque<Flight>,
    /// Send completions reach their senders (else they are withheld, the send queue filling).
    completions: bool,
    /// Signaled work requests delivered whose completion was withheld: (sender is a, seq).
    withheld: VecDeque<(bool, u32)>,
}

impl Pair {
    fn new() -> Pair {
        Pair {
            a: End::new(),
            b: End::new(),
            ab: VecDeque::new(),
            ba: VecDeque::new(),
            completions: true,
            withheld: VecDeque::new(),
        }
    }

    /// Pumps both ends and delivers everything in flight, in order, until nothing moves.
    fn drive(&mut self) {
        for _ in 0..10_000 {
            self.a.pump(&mut self.ab);
            self.b.pump(&mut self.ba);
            if self.ab.is_empty() && self.ba.is_empty() {
                return;
            }
            while let Some(f) = self.ab.pop_front() {
                self.b.land(&f);
                self.sent(true, &f);
            }
            while let Some(f) = self.ba.pop_front() {
                self.a.land(&f);
                self.sent(false, &f);
            }
        }
        panic!("the pair did not settle");
    }

    fn sent(&mut self, from_a: bool, f: &Flight) {
        if !f.wr.signaled {
            return;
        }
        if self.completions {
            let end = if from_a { &mut self.a } else { &mut self.b };
            end.complete(f.wr.seq);
        } else {
            self.withheld.push_back((from_a, f.wr.seq));
        }
    }

    /// Pumps both ends, then delivers at most `n` messages each way.
    fn step(&mut self, n: usize) {
        self.a.pump(&mut self.ab);
        self.b.pump(&mut self.ba);
        for _ in 0..n {
            if let Some(f) = self.ab.pop_front() {
                self.b.land(&f);
                self.sent(true, &f);
            }
            if let Some(f) = self.ba.pop_front() {
                self.a.land(&f);
                self.sent(false, &f);
            }
        }
    }

    fn release_completions(&mut self) {
        self.completions = true;
        while let Some((from_a, seq)) = self.withheld.pop_front() {
            let end = if from_a { &mut self.a } else { &mut self.b };
            end.complete(seq);
        }
    }
}

fn data(tags: std::ops::Range<u32>) -> Vec<u32> {
    tags.collect()
}

#[test]
fn sends_stop_at_the_reserved_credit_and_resume_when_buffers_return() {
    let mut p = Pair::new();
    p.b.holding = true;
    let n = 3 * u32::from(N_RECV);
    p.a.out.extend((0..n).map(|t| (Via::Send, MSG_HDR + 10, t)));
    p.drive();
    // One credit stays back for a CREDIT message: the receiver holding everything gets N-1.
    assert_eq!(p.b.received, data(0..u32::from(N_RECV) - 1));
    assert_eq!(p.a.link.credits(), 1);
    assert_eq!(p.a.out.len(), (n - u32::from(N_RECV) + 1) as usize, "the rest waits, none is dropped");
    p.b.release_all();
    p.drive();
    assert_eq!(p.b.received, data(0..n), "every message once, in order");
    assert!(p.b.credits_sent > 0, "owed credits went back explicitly at the watermark");
    assert_eq!(p.a.retired, data(0..n), "every send retired once");
    assert_eq!(p.a.link.outstanding().count(), 0);
}

#[test]
fn ring_writes_stop_at_the_last_free_slot_and_resume_when_slots_return() {
    let mut p = Pair::new();
    p.b.holding = true;
    let n = 3 * u32::from(N_RING);
    p.a.out.extend((0..n).map(|t| (Via::Ring, SLOT, t)));
    p.drive();
    assert_eq!(p.b.received, data(0..u32::from(N_RING)), "one write per slot");
    assert_eq!(p.a.link.free_slots(), 0);
    assert_eq!(p.a.writes, usize::from(N_RING));
    assert_eq!(p.a.link.credits(), N_RECV, "ring writes cost no credit");
    p.b.release_all();
    p.drive();
    // A receiver of nothing but ring writes owes no credit: the slots go back in CREDITs.
    assert_eq!(p.b.received, data(0..n));
    assert!(p.b.credits_sent > 0);
    assert_eq!(p.a.retired, data(0..n));
    assert!(p.a.link.free_slots() > 0);
}

#[test]
fn message_sizes_at_the_buffer_and_slot_boundaries() {
    let mut l = link();
    let spec = |via, total| MsgSpec {
        via,
        total,
        zero_copy: 0,
        needs_signal: true,
        fence: false,
        inline_max: 64,
        credits: None,
    };
    // A message up to a receive buffer's size bounces through a small buffer, beyond it a
    // large one (slot-sized).
    for (total, large) in [(RS - 1, false), (RS, false), (RS + 1, true)] {
        let w = l.message(spec(Via::Ring, total), 0).unwrap();
        let e = l.outstanding().last().unwrap();
        assert_eq!(matches!(e.bounce, Some(Bounce::Large(_))), large, "{total} bytes");
        assert_eq!(w.bounced, total);
        l.send_done(w.seq).unwrap();
    }
    // A ring write fills at most one slot: at the limit it goes, one byte over it is refused
    // without taking a slot, a bounce buffer or a send-queue entry.
    let before = (l.free_slots(), l.outstanding().count());
    let w = l.message(spec(Via::Ring, SLOT), 0).unwrap();
    assert!(matches!(w.op, MsgOp::WriteImm { .. }));
    l.send_done(w.seq).unwrap();
    let before2 = (l.free_slots(), l.outstanding().count());
    assert_eq!(before2, (before.0 - 1, before.1));
    assert!(matches!(l.message(spec(Via::Ring, SLOT + 1), 0), Err(LinkError::Flow(_))));
    assert_eq!((l.free_slots(), l.outstanding().count()), before2);
    assert!(l.can_send(Via::Ring));
    // Device inline: only what fits the device's inline limit, never a zero-copy write.
    let w = l.message(spec(Via::Send, 64), 0).unwrap();
    assert!(w.inline);
    let w2 = l.message(spec(Via::Send, 65), 0).unwrap();
    assert!(!w2.inline);
    let w3 = l.message(MsgSpec { zero_copy: 8, ..spec(Via::Ring, 64) }, 0).unwrap();
    assert!(!w3.inline);
    assert_eq!(w3.bounced, 56);
    // A receive longer than any buffer or slot, or shorter than the framing, is refused.
    let mut r = link();
    let big = SLOT.max(RS) + 1;
    assert!(matches!(r.arrived(Arrival::Send { idx: 0, len: big }), Err(LinkError::BadLength(_))));
    assert!(matches!(r.arrived(Arrival::Send { idx: 0, len: MSG_HDR - 1 }), Err(LinkError::BadLength(_))));
    assert!(r.arrived(Arrival::Send { idx: 0, len: SLOT.max(RS) }).is_ok());
    assert!(matches!(r.arrived(Arrival::Ring { imm: None }), Err(LinkError::NoImm)));
}

#[test]
fn the_send_queue_bounds_work_requests_until_completions_come() {
    let mut p = Pair::new();
    p.completions = false;
    let n = 3 * MAX_WR;
    // Small SENDs the receiver consumes at once, so only the send queue holds them back.
    p.a.out.extend((0..n).map(|t| (Via::Send, MSG_HDR, t)));
    p.drive();
    let posted = p.a.link.outstanding().count() as u32;
    assert!(posted < MAX_WR, "one entry always spare: {posted}");
    assert!(p.a.retired.is_empty());
    p.release_completions();
    p.drive();
    assert_eq!(p.b.received, data(0..n));
    assert_eq!(p.a.retired, data(0..n), "each retired once, in posting order");
}

#[test]
fn completions_retire_in_posting_order_and_fences_follow_reads() {
    let mut l = link();
    let spec = |fence| MsgSpec {
        via: Via::Send,
        total: MSG_HDR,
        zero_copy: 0,
        needs_signal: true,
        fence,
        inline_max: 0,
        credits: None,
    };
    assert!(!l.message(spec(true), 1).unwrap().fence, "no read outstanding: no fence");
    // A transfer unit of three RDMA_READs (only the last signaled), then a fenced reply.
    let first = l.unit(3, true, 2);
    let reply = l.message(spec(true), 3).unwrap();
    assert!(reply.fence, "a reply behind reads waits for them");
    // The reply's completion first (a provider may report it early): nothing after the
    // unfinished unit retires, the first message does once its own completion comes.
    assert_eq!(l.send_done(reply.seq).unwrap().len(), 0);
    let retired: Vec<u32> = l.send_done(first - 1).unwrap().into_iter().filter_map(|e| e.done).collect();
    assert_eq!(retired, vec![1]);
    // The unit's last read completes: it, its unsignaled reads and the reply retire at once.
    let retired = l.send_done(first + 2).unwrap();
    assert_eq!(retired.len(), 4);
    assert_eq!(retired.iter().filter_map(|e| e.done).collect::<Vec<_>>(), vec![2, 3]);
    assert!(!l.message(spec(true), 4).unwrap().fence, "reads done: no fence");
    assert!(l.send_done(9999).is_none(), "a stray completion is reported, not applied");
}

#[test]
fn a_lost_queue_pair_gives_back_every_outstanding_work_request_once() {
    let mut p = Pair::new();
    p.completions = false;
    p.a.out.extend((0..5).map(|t| (Via::Send, MSG_HDR + 1, t)));
    p.a.out.extend((5..8).map(|t| (Via::Ring, SLOT, t)));
    p.drive();
    p.a.link.unit(2, true, 8);
    // Some completions came before the loss.
    let (_, seq) = p.withheld.iter().copied().find(|(from_a, _)| *from_a).unwrap();
    p.a.complete(seq);
    p.withheld.clear();
    let flushed: Vec<u32> = p.a.link.flush().into_iter().filter_map(|e| e.done).collect();
    let mut all = p.a.retired.clone();
    all.extend(&flushed);
    assert_eq!(all, data(0..9), "every op's work request accounted exactly once");
    assert_eq!(p.a.link.outstanding().count(), 0);
    assert!(p.a.link.flush().is_empty());
    assert!(p.a.link.can_send(Via::Send), "bounce buffers came back");
}

#[test]
fn a_peer_breaking_the_rules_is_caught() {
    // More messages than the credits granted.
    let mut l = link();
    for i in 0..u32::from(N_RECV) {
        let (loc, _) = l.arrived(Arrival::Send { idx: i, len: MSG_HDR }).unwrap();
        l.framing(loc, Prefix::default()).unwrap();
    }
    let (loc, _) = l.arrived(Arrival::Send { idx: 99, len: MSG_HDR }).unwrap();
    assert!(matches!(l.framing(loc, Prefix::default()), Err(LinkError::Flow(FlowError::NoCredit))));
    // Credits or slots returned that were never spent.
    let mut l = link();
    let (loc, _) = l.arrived(Arrival::Send { idx: 0, len: MSG_HDR }).unwrap();
    let p = Prefix { credits: 1, ring_returns: 0 };
    assert!(matches!(l.framing(loc, p), Err(LinkError::Flow(FlowError::ExcessCredits { .. }))));
    let mut l = link();
    let (loc, _) = l.arrived(Arrival::Send { idx: 0, len: MSG_HDR }).unwrap();
    let p = Prefix { credits: 0, ring_returns: 1 };
    assert!(matches!(l.framing(loc, p), Err(LinkError::Flow(FlowError::ExcessSlots { .. }))));
    // A ring write out of ring order.
    let mut l = link();
    let imm = crate::flowctl::encode_imm(1, MSG_HDR as u32);
    assert!(matches!(l.arrived(Arrival::Ring { imm: Some(imm) }), Err(LinkError::Flow(_))));
    // Releasing what is not held.
    assert!(l.release(Held::Slot { slot: 0 }).is_err());
}

#[test]
fn held_messages_keep_arrival_order_and_their_buffers() {
    let mut l = link();
    let locs: Vec<Held> = (0..4)
        .map(|i| {
            let (loc, _) = l.arrived(Arrival::Send { idx: i, len: MSG_HDR }).unwrap();
            l.framing(loc, Prefix::default()).unwrap();
            loc
        })
        .collect();
    assert!(l.admit(locs[0]), "nothing held: processed at once");
    // The application's budget is spent: it stays, and later arrivals queue behind it.
    l.hold(locs[0]);
    assert!(!l.admit(locs[1]));
    assert!(!l.admit(locs[2]));
    assert_eq!(l.held(), 3);
    // A held message's buffer is not reused under it, and only the oldest can leave.
    assert!(l.release(locs[1]).is_err());
    assert!(!l.unhold(locs[1]));
    assert_eq!(l.held(), 3, "a refused unhold changes nothing");
    // Tried again and still held: it stays first in line.
    assert_eq!(l.next_held(), Some(locs[0]));
    for (i, &loc) in locs[..3].iter().enumerate() {
        assert_eq!(l.next_held(), Some(loc), "in arrival order");
        assert!(l.unhold(loc));
        assert_eq!(l.release(loc).unwrap(), Some(i as u32), "its buffer is re-posted once out");
    }
    assert_eq!(l.next_held(), None);
    assert!(l.admit(locs[3]), "the queue drained: processed at once");
    // A lost connection's held messages are never processed.
    l.hold(locs[3]);
    l.flush();
    assert_eq!(l.next_held(), None);
}

/// What the test does next in a random interleaving.
#[derive(Debug, Clone)]
enum Step {
    /// `a` queues a message of `len` payload bytes, by SEND or by ring write.
    Queue { ring: bool, len: usize },
    /// Up to `n` messages delivered each way.
    Deliver(usize),
    /// `b` starts or stops holding what arrives; stopping consumes what it held.
    Hold(bool),
    /// Send completions withheld, or released.
    Completions(bool),
}

fn steps() -> impl proptest::strategy::Strategy<Value = Vec<Step>> {
    use proptest::prelude::*;
    let step = prop_oneof![
        4 => (any::<bool>(), 0..SLOT).prop_map(|(ring, len)| Step::Queue { ring, len }),
        3 => (1usize..4).prop_map(Step::Deliver),
        1 => any::<bool>().prop_map(Step::Hold),
        1 => any::<bool>().prop_map(Step::Completions),
    ];
    proptest::collection::vec(step, 0..200)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 128, ..Default::default() })]

    /// Under any interleaving of sends, deliveries, held messages and withheld completions, no
    /// SEND meets an empty receive queue and no ring write a busy slot (`land` checks both),
    /// the send queue never overflows, and once everything is let go every message arrives
    /// once, in order, and every work request retires once.
    #[test]
    fn no_interleaving_breaks_the_flow_control(steps in steps()) {
        let mut p = Pair::new();
        let mut n = 0u32;
        for s in steps {
            match s {
                Step::Queue { ring, len } => {
                    let (via, max) = if ring { (Via::Ring, SLOT) } else { (Via::Send, RS) };
                    p.a.out.push_back((via, (MSG_HDR + len).min(max), n));
                    n += 1;
                }
                Step::Deliver(k) => p.step(k),
                Step::Hold(true) => p.b.holding = true,
                Step::Hold(false) => p.b.release_all(),
                Step::Completions(true) => p.completions = false,
                Step::Completions(false) => p.release_completions(),
            }
            proptest::prop_assert!(p.a.link.outstanding().count() < MAX_WR as usize);
            proptest::prop_assert!(p.b.link.outstanding().count() < MAX_WR as usize);
        }
        p.b.release_all();
        p.release_completions();
        p.drive();
        proptest::prop_assert_eq!(&p.b.received, &data(0..n));
        proptest::prop_assert_eq!(&p.a.retired, &data(0..n));
        proptest::prop_assert!(p.a.out.is_empty());
    }
}

#[test]
fn the_wait_counts_only_while_the_peer_gives_nothing_back() {
    let (t0, s) = (std::time::Instant::now(), std::time::Duration::from_secs(1));
    let mut p = Pair::new();
    p.b.holding = true;
    p.a.out.extend((0..3 * u32::from(N_RECV)).map(|t| (Via::Send, MSG_HDR + 10, t)));
    p.drive();
    assert!(!p.a.out.is_empty(), "messages wait for credits");
    assert_eq!(p.a.link.waiting_for(true, t0), std::time::Duration::ZERO, "counted from when first seen");
    assert_eq!(p.a.link.waiting_for(true, t0 + 5 * s), 5 * s, "nothing came back meanwhile");
    // The peer takes what it held: credits come back and everything goes.
    p.b.release_all();
    p.drive();
    assert!(p.a.out.is_empty());
    assert_eq!(p.a.link.waiting_for(false, t0 + 6 * s), std::time::Duration::ZERO);
    // Held again: a new count, from when the new wait is first seen.
    p.b.holding = true;
    p.a.out.extend((100..100 + 3 * u32::from(N_RECV)).map(|t| (Via::Send, MSG_HDR + 10, t)));
    p.drive();
    assert!(!p.a.out.is_empty());
    assert_eq!(p.a.link.waiting_for(true, t0 + 10 * s), std::time::Duration::ZERO);
    assert_eq!(p.a.link.waiting_for(true, t0 + 12 * s), 2 * s);
    // A single credit's return (one message taken, its credit riding on a message of the
    // peer's own) starts it again, though messages still wait.
    let loc = p.b.link.next_held().expect("b holds messages");
    assert!(p.b.link.unhold(loc));
    p.b.consume(loc);
    p.b.out.push_back((Via::Send, MSG_HDR + 10, 1000));
    p.step(1);
    assert_eq!(p.a.received.last(), Some(&1000));
    assert!(!p.a.out.is_empty());
    assert_eq!(p.a.link.waiting_for(true, t0 + 13 * s), std::time::Duration::ZERO, "a credit came back");
    assert_eq!(p.a.link.waiting_for(true, t0 + 14 * s), s);
}
