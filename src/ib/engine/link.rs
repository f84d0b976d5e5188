//! One connection's message path without the device (sans-IO): the flow control of
//! [`crate::flowctl`] (credits over the peer's receive buffers, the peer's fast-RDMA ring, our
//! own ring's returns), the send bounce buffers and the send queue's accounting.
//!
//! A [`Link`] decides; the engine carries out. To transmit, the engine asks
//! [`Link::can_send`], then [`Link::message`] turns a message into a [`MsgWr`] — the work
//! request to post (SEND or RDMA_WRITE_WITH_IMM), where its bytes go in the bounce memory, the
//! prefix of flow-control returns it carries and its flags — and records it as outstanding.
//! Completions come back as events: [`Link::send_done`] for a signaled send completion (which
//! retires, in posting order, what it covers and frees their bounce buffers),
//! [`Link::arrived`] for a receive completion, [`Link::framing`] for the flow-control prefix of
//! an arrived message, [`Link::release`] when its buffer or slot is consumed. A message the
//! application cannot take yet (back-pressure) stays where it lies, queued in the link
//! ([`Link::admit`], [`Link::hold`], [`Link::unhold`]), and later arrivals wait behind it so
//! that each connection's messages are processed in arrival order. How long queued messages
//! have waited with the peer giving nothing back is counted here too ([`Link::waiting_for`]),
//! on the caller's clock. Nothing here
//! touches memory, queue pairs or clocks, so the rules — no SEND without a credit, no ring
//! write without a free slot, no more work requests than the send queue holds — are written
//! once and can be exercised by a test that plays the wire (`link_pair.rs`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::comm::Mechanism;
use crate::flowctl::{Credits, FlowError, RingReceiver, RingSender, Transmit};

use super::msg::{MSG_HDR, Prefix};

/// Offsets in a connection's memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub rs: usize,
    pub slot: usize,
    pub n_recv: usize,
    pub n_small: usize,
    pub n_large: usize,
    pub n_ring: usize,
}

impl Layout {
    pub fn total(&self) -> usize {
        self.ring_off(self.n_ring as u16)
    }
    pub fn recv_off(&self, i: u32) -> usize {
        i as usize * self.rs
    }
    pub fn small_off(&self, i: u16) -> usize {
        self.n_recv * self.rs + usize::from(i) * self.rs
    }
    pub fn large_off(&self, i: u16) -> usize {
        (self.n_recv + self.n_small) * self.rs + usize::from(i) * self.slot
    }
    pub fn ring_off(&self, i: u16) -> usize {
        (self.n_recv + self.n_small) * self.rs + self.n_large * self.slot + usize::from(i) * self.slot
    }
    /// Where a received message lies.
    pub fn loc_off(&self, loc: Held) -> usize {
        match loc {
            Held::Recv(i) => self.recv_off(i),
            Held::Slot { slot } => self.ring_off(slot),
        }
    }
}

/// How a message travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// SEND into one of the peer's pre-posted receive buffers: costs a credit.
    Send,
    /// RDMA_WRITE_WITH_IMM into the peer's ring: costs a slot.
    Ring,
}

/// A send bounce buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bounce {
    Small(u16),
    Large(u16),
}

/// A received message, where it lies until consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    Recv(u32),
    Slot { slot: u16 },
}

impl Held {
    /// The mechanism that brought a message here: a ring slot is written by fast RDMA, a
    /// receive buffer filled by a SEND (inline).
    pub(crate) fn mechanism(self) -> Mechanism {
        match self {
            Held::Slot { .. } => Mechanism::FastRdma,
            Held::Recv(_) => Mechanism::Inline,
        }
    }
}

/// A posted send-queue work request. `D`: what its retirement leads to.
#[derive(Debug)]
pub(crate) struct SqEntry<D> {
    pub seq: u32,
    /// Posted with SIGNALED: its own completion will come.
    pub signaled: bool,
    /// Its completion came (it waits for older signaled entries before it retires).
    pub completed: bool,
    /// An RDMA_READ: later SENDs that must not overtake it carry FENCE while it is out.
    pub read: bool,
    /// The bounce buffer it reads, freed when it retires.
    pub bounce: Option<Bounce>,
    pub done: Option<D>,
}

/// The operation of a message work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MsgOp {
    Send,
    /// Into the peer's ring at `ring_off` from its base, with `imm` naming slot and length.
    WriteImm {
        ring_off: u64,
        imm: u32,
    },
}

/// A message work request to post: header and the first `bounced` bytes from the bounce
/// buffer at `bounce_off` (then, for a zero-copy write, the caller's registered bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MsgWr {
    pub seq: u32,
    pub op: MsgOp,
    pub prefix: Prefix,
    pub bounce_off: usize,
    pub bounced: usize,
    pub signaled: bool,
    /// Small enough to go in the work request itself.
    pub inline: bool,
    /// Behind an outstanding RDMA_READ it must wait for.
    pub fence: bool,
}

/// A message to transmit, as [`Link::message`] needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MsgSpec {
    pub via: Via,
    /// Header and payload.
    pub total: usize,
    /// Trailing payload bytes sent from the caller's registered memory, not the bounce buffer.
    pub zero_copy: usize,
    /// Its completion must be reported (an op completes or releases its buffer at it).
    pub needs_signal: bool,
    /// Must wait for earlier RDMA_READs of the queue pair.
    pub fence: bool,
    /// Largest message the device sends inline.
    pub inline_max: u32,
    /// The credit piggyback already taken for a SEND ([`Link::take_credit`]).
    pub credits: Option<u16>,
}

/// What went wrong with a message or a completion: the connection cannot go on.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
    #[error(transparent)]
    Flow(#[from] FlowError),
    #[error("message of {0} bytes")]
    BadLength(usize),
    #[error("ring write without immediate data")]
    NoImm,
    #[error("the peer's limits are not known yet")]
    NotConnected,
}

/// A receive completion.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arrival {
    /// A SEND into receive buffer `idx`, `len` bytes.
    Send { idx: u32, len: usize },
    /// A ring write with its immediate data (its receive buffer untouched, already re-posted).
    Ring { imm: Option<u32> },
}

/// One connection's flow control and send-queue accounting.
#[derive(Debug)]
pub(crate) struct Link<D> {
    layout: Layout,
    max_send_wr: u32,
    credits: Option<Credits<()>>,
    ring_tx: Option<RingSender>,
    ring_rx: RingReceiver,
    sq: VecDeque<SqEntry<D>>,
    seq: u32,
    since_signal: u32,
    reads_out: u32,
    free_small: Vec<u16>,
    free_large: Vec<u16>,
    /// Arrived messages waiting for the application (back-pressure), in arrival order.
    held: VecDeque<Held>,
    /// What the peer has given back that lets queued messages on: returns of credits or ring
    /// slots, and send completions (which free bounce buffers and send-queue room). Counted,
    /// so that [`Link::waiting_for`] sees whether anything came since it last looked.
    moved: u64,
    /// Since when messages have waited, and `moved` then.
    waiting: Option<(u64, Instant)>,
}

impl<D> Link<D> {
    pub fn new(layout: Layout, ring_rx: RingReceiver, max_send_wr: u32) -> Self {
        Link {
            layout,
            max_send_wr,
            credits: None,
            ring_tx: None,
            ring_rx,
            sq: VecDeque::new(),
            seq: 0,
            since_signal: 0,
            reads_out: 0,
            free_small: (0..layout.n_small as u16).rev().collect(),
            free_large: (0..layout.n_large as u16).rev().collect(),
            held: VecDeque::new(),
            moved: 0,
            waiting: None,
        }
    }

    /// The peer's receive buffers and ring are known: messages may go.
    pub fn connect(&mut self, credits: Credits<()>, ring_tx: RingSender) {
        self.credits = Some(credits);
        self.ring_tx = Some(ring_tx);
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Work requests posted and not retired.
    pub fn outstanding(&self) -> impl Iterator<Item = &SqEntry<D>> {
        self.sq.iter()
    }

    /// Room in the send queue for `n` more work requests, one always kept spare for a CREDIT.
    pub fn has_room(&self, n: u32) -> bool {
        self.sq.len() as u32 + n < self.max_send_wr
    }

    /// Something other than queued messages is due: credits the peer is owed, or ring slots
    /// to give back (ring writes consume no credit, so a receiver of nothing but fast-RDMA
    /// messages owes no credit and would otherwise never give the sender its slots back).
    pub fn returns_due(&self) -> bool {
        self.credits.as_ref().is_some_and(|k| k.owed() > 0) || self.ring_rx.should_return()
    }

    /// A message by `via` may be built now: a credit beyond the reserved one (or a ring slot),
    /// bounce buffers and send-queue room.
    pub fn can_send(&self, via: Via) -> bool {
        self.has_room(1)
            && !self.free_small.is_empty()
            && match via {
                Via::Send => self.credits.as_ref().is_some_and(|k| k.credits() >= 2),
                Via::Ring => {
                    self.ring_tx.as_ref().is_some_and(|r| r.free_slots() > 0) && !self.free_large.is_empty()
                }
            }
    }

    /// Takes the credit for a data SEND; returns the piggyback it carries. `None` when
    /// [`Link::can_send`] did not allow it.
    pub fn take_credit(&mut self) -> Option<u16> {
        let k = self.credits.as_mut()?;
        k.push(()).ok()?;
        match k.poll_transmit() {
            Some(Transmit::Data { piggyback, .. }) => Some(piggyback),
            Some(Transmit::Credit { .. }) | None => {
                // Not reachable after can_send; the queued unit must not linger.
                k.drain().for_each(drop);
                None
            }
        }
    }

    /// An explicit CREDIT (carrying owed credits and ring returns) that is due now and has
    /// room: its credit field, taken from the reserved credit.
    pub fn explicit_credit(&mut self) -> Option<u16> {
        if self.free_small.is_empty() || !self.has_room(1) {
            return None;
        }
        match self.credits.as_mut()?.poll_transmit()? {
            Transmit::Credit { credits } => Some(credits),
            Transmit::Data { .. } => {
                debug_assert!(false, "data queued in the credit state");
                None
            }
        }
    }

    /// Builds the work request of one message and records it as outstanding with `done`.
    pub fn message(&mut self, m: MsgSpec, done: D) -> Result<MsgWr, LinkError> {
        if m.total < MSG_HDR {
            return Err(LinkError::BadLength(m.total));
        }
        let op = match m.via {
            Via::Send => MsgOp::Send,
            Via::Ring => {
                let r = self.ring_tx.as_mut().ok_or(LinkError::NotConnected)?;
                let s = r.reserve(m.total as u32)?.ok_or(FlowError::Misuse("no free ring slot"))?;
                MsgOp::WriteImm { ring_off: s.offset, imm: s.imm }
            }
        };
        let prefix = Prefix {
            credits: match m.credits {
                Some(n) => n,
                None => self.credits.as_mut().map_or(0, |k| k.take_piggyback()),
            },
            ring_returns: self.ring_rx.take_returns(),
        };
        let bounced = m.total - m.zero_copy;
        let small = self.free_small.pop().ok_or(FlowError::Misuse("no bounce buffer"))?;
        let (bounce_off, bounce) = if bounced > self.layout.rs {
            self.free_small.push(small);
            let i = self.free_large.pop().ok_or(FlowError::Misuse("no large bounce buffer"))?;
            (self.layout.large_off(i), Bounce::Large(i))
        } else {
            (self.layout.small_off(small), Bounce::Small(small))
        };
        self.since_signal += 1;
        let low = self.free_small.len() < self.layout.n_small / 2
            || self.free_large.len() < self.layout.n_large.div_ceil(2);
        let signaled = m.needs_signal || low || self.since_signal >= self.max_send_wr / 4;
        if signaled {
            self.since_signal = 0;
        }
        let seq = self.next_seq();
        self.sq.push_back(SqEntry {
            seq,
            signaled,
            completed: false,
            read: false,
            bounce: Some(bounce),
            done: Some(done),
        });
        Ok(MsgWr {
            seq,
            op,
            prefix,
            bounce_off,
            bounced,
            signaled,
            inline: m.zero_copy == 0 && m.total as u32 <= m.inline_max,
            fence: m.fence && self.reads_out > 0,
        })
    }

    /// Records the `n` RDMA work requests of a transfer unit (only the last signaled, carrying
    /// `done`); returns the first one's sequence number (the rest follow in order).
    pub fn unit(&mut self, n: usize, read: bool, done: D) -> u32 {
        let first = self.seq;
        let mut done = Some(done);
        for i in 0..n {
            let last = i + 1 == n;
            let seq = self.next_seq();
            self.sq.push_back(SqEntry {
                seq,
                signaled: last,
                completed: false,
                read,
                bounce: None,
                done: if last { done.take() } else { None },
            });
        }
        if read {
            self.reads_out += n as u32;
        }
        self.since_signal = 0;
        first
    }

    fn next_seq(&mut self) -> u32 {
        let s = self.seq;
        self.seq = self.seq.wrapping_add(1);
        s
    }

    /// A signaled send completion. Work requests retire in posting order: this one and the
    /// unsignaled ones before it once every older signaled work request has completed too.
    /// (In order is what RC send queues guarantee; a provider that lets later completions
    /// overtake a delayed RDMA_READ's must not make us retire that READ — free its zone buffer,
    /// copy its data, complete its op — before its data has landed.) Returns what retired, or
    /// `None` for a sequence number not outstanding.
    pub fn send_done(&mut self, seq: u32) -> Option<Vec<SqEntry<D>>> {
        let e = self.sq.iter_mut().find(|e| e.seq == seq)?;
        e.completed = true;
        let mut n = 0;
        for (i, e) in self.sq.iter().enumerate() {
            if e.signaled {
                if !e.completed {
                    break;
                }
                n = i + 1;
            }
        }
        let retired: Vec<SqEntry<D>> = self.sq.drain(..n).collect();
        if !retired.is_empty() {
            self.moved += 1;
        }
        for e in &retired {
            match e.bounce {
                Some(Bounce::Small(i)) => self.free_small.push(i),
                Some(Bounce::Large(i)) => self.free_large.push(i),
                None => {}
            }
            if e.read {
                self.reads_out -= 1;
            }
        }
        Some(retired)
    }

    /// The queue pair is gone (its peer lost): every outstanding work request, once, in posting
    /// order. Nothing more completes for them, and held messages are never processed.
    pub fn flush(&mut self) -> Vec<SqEntry<D>> {
        self.reads_out = 0;
        self.held.clear();
        let gone: Vec<SqEntry<D>> = self.sq.drain(..).collect();
        for e in &gone {
            match e.bounce {
                Some(Bounce::Small(i)) => self.free_small.push(i),
                Some(Bounce::Large(i)) => self.free_large.push(i),
                None => {}
            }
        }
        gone
    }

    /// A receive completion: where the message lies and its length. For a ring write the
    /// caller has re-posted the untouched receive buffer already.
    pub fn arrived(&mut self, a: Arrival) -> Result<(Held, usize), LinkError> {
        let (loc, len) = match a {
            Arrival::Ring { imm } => {
                let d = self.ring_rx.on_write(imm.ok_or(LinkError::NoImm)?)?;
                (Held::Slot { slot: d.slot }, d.len as usize)
            }
            Arrival::Send { idx, len } => (Held::Recv(idx), len),
        };
        if len < MSG_HDR || len > self.layout.slot.max(self.layout.rs) {
            return Err(LinkError::BadLength(len));
        }
        Ok((loc, len))
    }

    /// Takes the flow-control returns of an arrived message at once, even if the message itself
    /// has to wait: they may be what lets our own sends out.
    pub fn framing(&mut self, loc: Held, prefix: Prefix) -> Result<(), LinkError> {
        if prefix.credits > 0 || prefix.ring_returns > 0 {
            self.moved += 1;
        }
        match (loc, self.credits.as_mut()) {
            (Held::Recv(_), Some(k)) => k.on_message(prefix.credits)?,
            (Held::Slot { .. }, Some(k)) => k.on_credits(prefix.credits)?,
            (_, None) => {}
        }
        if let Some(r) = self.ring_tx.as_mut() {
            r.on_returned(prefix.ring_returns)?;
        }
        Ok(())
    }

    /// An arrived message, its flow-control returns taken: `true` if it may be processed now;
    /// `false` if older messages are held, and it was queued behind them (processing it first
    /// would let it overtake them).
    pub fn admit(&mut self, loc: Held) -> bool {
        if self.held.is_empty() {
            return true;
        }
        self.held.push_back(loc);
        false
    }

    /// A message just admitted could not be processed (the application's budget for its peer
    /// is spent): it stays where it lies, first in line, until [`Link::next_held`] offers it.
    pub fn hold(&mut self, loc: Held) {
        debug_assert!(!self.held.contains(&loc), "held twice");
        self.held.push_front(loc);
    }

    /// The oldest held message, to be tried again once the application consumed something.
    pub fn next_held(&self) -> Option<Held> {
        self.held.front().copied()
    }

    /// The oldest held message was processed: it leaves the queue (the caller then releases
    /// it). `false` when `loc` is not the oldest held message, which is left alone.
    pub fn unhold(&mut self, loc: Held) -> bool {
        if self.held.front() != Some(&loc) {
            return false;
        }
        self.held.pop_front();
        true
    }

    /// Messages held, for tests.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// A received message is consumed: its slot goes back to the ring, or its receive buffer is
    /// to be re-posted (returned as `Some(index)`; the credit is owed from now). A message still
    /// held cannot be: its buffer would be reused under it.
    pub fn release(&mut self, loc: Held) -> Result<Option<u32>, LinkError> {
        if self.held.contains(&loc) {
            return Err(FlowError::Misuse("release of a message still held").into());
        }
        match loc {
            Held::Recv(i) => {
                if let Some(k) = self.credits.as_mut() {
                    k.on_repost()?;
                }
                Ok(Some(i))
            }
            Held::Slot { slot } => {
                self.ring_rx.release(slot)?;
                if self.ring_rx.should_return()
                    && let Some(k) = self.credits.as_mut()
                {
                    k.request_explicit();
                }
                Ok(None)
            }
        }
    }

    /// How long messages have waited to go out while the peer gave back nothing that lets them
    /// on (no credit, ring slot or send completion): `queued` says whether any wait at `now`.
    /// The count starts again whenever something comes back or nothing waits. A peer whose
    /// endpoint stopped running (its process stopped, or hostile) gives nothing back, and
    /// without a deadline on this what waits for it would wait for as long as it stays
    /// stopped.
    pub fn waiting_for(&mut self, queued: bool, now: Instant) -> Duration {
        if !queued {
            self.waiting = None;
            return Duration::ZERO;
        }
        match self.waiting {
            Some((moved, since)) if moved == self.moved => now.saturating_duration_since(since),
            _ => {
                self.waiting = Some((self.moved, now));
                Duration::ZERO
            }
        }
    }

    /// Peer buffers we may still fill (the reserved one included), for tests and gauges.
    #[cfg(test)]
    pub fn credits(&self) -> u16 {
        self.credits.as_ref().map_or(0, |k| k.credits())
    }

    /// Peer ring slots we may still write, for tests.
    #[cfg(test)]
    pub fn free_slots(&self) -> u16 {
        self.ring_tx.as_ref().map_or(0, |r| r.free_slots())
    }
}
