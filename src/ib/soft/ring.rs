//! Receive rings and completion rings in a context image.
//!
//! Both are bounded rings of atomic words with a free-running `head` (consumer) and `tail`
//! (producer). Receive rings have one producer (the owner's `post_recv`) and consumers that take
//! the ring's lock word (initiators delivering SENDs, flushes); completion rings have producers
//! that take the lock (the owner's send queue, initiators delivering receives) and one consumer
//! (the owner's `poll`). An entry is published by bumping the index *after* writing it, so a
//! process that dies between the two leaves the ring consistent.

use std::sync::atomic::{AtomicU64, Ordering::*, fence};

use super::shm::{CQE_WORDS, CqEntry, RingHeader, Shm, lock_word};
use crate::ib::verbs::{Sge, WcOpcode, WcStatus, WorkCompletion};

/// Largest ring we accept from an image (bounds what a corrupt header can make us scan).
pub(crate) const MAX_RING: u64 = 1 << 20;
/// Largest SGE count per receive entry we accept from an image.
pub(crate) const MAX_RING_SGE: u64 = 64;
const RING_HDR: u64 = std::mem::size_of::<RingHeader>() as u64;

/// Words per receive entry.
pub(crate) fn wqe_words(max_sge: u64) -> u64 {
    2 + 2 * max_sge
}

/// Bytes of a receive ring with `cap` entries of `max_sge` SGEs.
pub(crate) fn recv_ring_bytes(cap: u64, max_sge: u64) -> u64 {
    RING_HDR + cap * wqe_words(max_sge) * 8
}

/// A receive descriptor taken from a ring.
#[derive(Debug, Clone)]
pub(crate) struct Wqe {
    pub(crate) wr_id: u64,
    pub(crate) sges: Vec<Sge>,
}

/// A receive ring inside an image.
#[derive(Debug)]
pub(crate) struct RecvRing<'a> {
    hdr: &'a RingHeader,
    words: &'a [AtomicU64],
    cap: u64,
    max_sge: u64,
}

impl<'a> RecvRing<'a> {
    /// Initialises a fresh ring at arena offset `off` (owner only).
    pub(crate) fn init(shm: &'a Shm, off: u64, cap: u64, max_sge: u64) -> Option<RecvRing<'a>> {
        let base = shm.arena(off, recv_ring_bytes(cap, max_sge))?;
        let hdr: &RingHeader = shm.at(base)?;
        for w in [&hdr.lock, &hdr.head, &hdr.tail] {
            w.store(0, Relaxed);
        }
        hdr.cap.store(cap, Relaxed);
        hdr.max_sge.store(max_sge, Release);
        Self::open(shm, off)
    }

    /// Opens the ring at arena offset `off`, validating its header.
    pub(crate) fn open(shm: &'a Shm, off: u64) -> Option<RecvRing<'a>> {
        let hdr: &RingHeader = shm.at(shm.arena(off, RING_HDR)?)?;
        let cap = hdr.cap.load(Acquire);
        let max_sge = hdr.max_sge.load(Acquire);
        if cap == 0 || cap > MAX_RING || !cap.is_power_of_two() || max_sge > MAX_RING_SGE {
            return None;
        }
        let base = shm.arena(off, recv_ring_bytes(cap, max_sge))?;
        let words = shm.words(base + RING_HDR, cap * wqe_words(max_sge))?;
        Some(RecvRing { hdr, words, cap, max_sge })
    }

    /// Capacity in entries.
    pub(crate) fn cap(&self) -> u64 {
        self.cap
    }

    fn entry(&self, pos: u64) -> &'a [AtomicU64] {
        let n = wqe_words(self.max_sge) as usize;
        let i = (pos & (self.cap - 1)) as usize * n;
        &self.words[i..i + n]
    }

    /// Appends a receive (single producer). `false` when full or too many SGEs.
    pub(crate) fn push(&self, wr_id: u64, sges: &[Sge]) -> bool {
        let (head, tail) = (self.hdr.head.load(Acquire), self.hdr.tail.load(Relaxed));
        if tail.wrapping_sub(head) >= self.cap || sges.len() as u64 > self.max_sge {
            return false;
        }
        let e = self.entry(tail);
        e[0].store(wr_id, Relaxed);
        e[1].store(sges.len() as u64, Relaxed);
        for (i, s) in sges.iter().enumerate() {
            e[2 + 2 * i].store(s.addr, Relaxed);
            e[3 + 2 * i].store(u64::from(s.len) | u64::from(s.lkey) << 32, Relaxed);
        }
        self.hdr.tail.store(tail.wrapping_add(1), Release);
        true
    }

    /// Takes the oldest receive, if any.
    pub(crate) fn pop(&self) -> Option<Wqe> {
        let _g = lock_word(&self.hdr.lock);
        self.pop_locked()
    }

    fn pop_locked(&self) -> Option<Wqe> {
        let (head, tail) = (self.hdr.head.load(Relaxed), self.hdr.tail.load(Acquire));
        if head == tail {
            return None;
        }
        let e = self.entry(head);
        let wr_id = e[0].load(Relaxed);
        let n = e[1].load(Relaxed).min(self.max_sge) as usize;
        let sges = (0..n)
            .map(|i| {
                let w = e[3 + 2 * i].load(Relaxed);
                Sge { addr: e[2 + 2 * i].load(Relaxed), len: w as u32, lkey: (w >> 32) as u32 }
            })
            .collect();
        self.hdr.head.store(head.wrapping_add(1), Release);
        Some(Wqe { wr_id, sges })
    }

    /// Removes every posted receive, in order, handing each `wr_id` to `f` (flush).
    pub(crate) fn drain(&self, mut f: impl FnMut(u64)) {
        let _g = lock_word(&self.hdr.lock);
        // Bounded: a corrupt tail can't make us loop forever.
        for _ in 0..self.cap {
            match self.pop_locked() {
                Some(w) => f(w.wr_id),
                None => break,
            }
        }
    }
}

fn opcode_code(op: WcOpcode) -> u64 {
    match op {
        WcOpcode::Send => 0,
        WcOpcode::RdmaWrite => 1,
        WcOpcode::RdmaRead => 2,
        WcOpcode::Recv => 3,
        WcOpcode::RecvRdmaWithImm => 4,
        WcOpcode::Other(v) => 0x100 | u64::from(v & 0xff),
    }
}

fn opcode_from(code: u64) -> WcOpcode {
    match code {
        0 => WcOpcode::Send,
        1 => WcOpcode::RdmaWrite,
        2 => WcOpcode::RdmaRead,
        3 => WcOpcode::Recv,
        4 => WcOpcode::RecvRdmaWithImm,
        v => WcOpcode::Other((v & 0xff) as u32),
    }
}

/// What a push asks the caller to do.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Stored; nobody to wake.
    Stored,
    /// Stored, and the CQ was armed: signal this eventfd number of the CQ's owner.
    Wake(u64),
    /// The CQ is full: it is now in the overrun state and the completion is lost.
    Overrun,
    /// The CQ does not exist (any more).
    Gone,
}

/// A completion ring inside an image.
#[derive(Debug)]
pub(crate) struct CqRing<'a> {
    pub(crate) e: &'a CqEntry,
    words: &'a [AtomicU64],
    cap: u64,
}

impl<'a> CqRing<'a> {
    /// Opens CQ `idx` of an image, validating it is alive and its ring is in bounds.
    pub(crate) fn open(shm: &'a Shm, idx: u64) -> Option<CqRing<'a>> {
        let e = shm.cq(idx)?;
        if e.life.load(Acquire) & 1 == 0 {
            return None;
        }
        let cap = e.cap.load(Acquire);
        if cap == 0 || cap > MAX_RING || !cap.is_power_of_two() {
            return None;
        }
        let off = shm.arena(e.ring_off.load(Acquire), cap * CQE_WORDS * 8)?;
        Some(CqRing { e, words: shm.words(off, cap * CQE_WORDS)?, cap })
    }

    /// Prefaults CQ `idx`'s ring in this process's mapping of `shm` (see [`Shm::prefault`]).
    pub(crate) fn prefault(shm: &Shm, idx: u64) {
        if let Some(ring) = CqRing::open(shm, idx) {
            let len = ring.cap * CQE_WORDS * 8;
            if let Some(off) = shm.arena(ring.e.ring_off.load(Acquire), len) {
                shm.prefault(off, len);
            }
        }
    }

    /// The owner's view of its own CQ, from the parameters it created it with: no loads of
    /// shared header fields on the (spin-)polling path.
    pub(crate) fn owned(shm: &'a Shm, idx: u64, ring_off: u64, cap: u64) -> Option<CqRing<'a>> {
        let e = shm.cq(idx)?;
        let off = shm.arena(ring_off, cap * CQE_WORDS * 8)?;
        Some(CqRing { e, words: shm.words(off, cap * CQE_WORDS)?, cap })
    }

    /// Adds a completion. `notify` says whether it satisfies a solicited-only arm.
    pub(crate) fn push(&self, wc: &WorkCompletion, notify_solicited: bool) -> Pushed {
        {
            let _g = lock_word(&self.e.lock);
            let (head, tail) = (self.e.head.load(Acquire), self.e.tail.load(Relaxed));
            if tail.wrapping_sub(head) >= self.cap {
                self.e.overrun.store(1, SeqCst);
                return Pushed::Overrun;
            }
            let i = ((tail & (self.cap - 1)) * CQE_WORDS) as usize;
            let w = &self.words[i..i + CQE_WORDS as usize];
            w[0].store(wc.wr_id, Relaxed);
            let imm = wc.imm_data.is_some() as u64;
            w[1].store(
                u64::from(wc.status.as_raw())
                    | opcode_code(wc.opcode) << 8
                    | imm << 20
                    | u64::from(wc.vendor_err) << 32,
                Relaxed,
            );
            w[2].store(u64::from(wc.byte_len) | u64::from(wc.imm_data.unwrap_or(0)) << 32, Relaxed);
            w[3].store(u64::from(wc.qp_num) | u64::from(wc.src_qp) << 32, Relaxed);
            self.e.tail.store(tail.wrapping_add(1), Release);
        }
        // Pairs with the fence in `arm`: either the owner's re-poll after arming sees this
        // entry, or we see the arm.
        fence(SeqCst);
        let armed = self.e.armed.load(SeqCst);
        let wants = armed == 1 || (armed == 2 && (notify_solicited || !wc.status.is_success()));
        if wants && self.e.armed.compare_exchange(armed, 0, SeqCst, Relaxed).is_ok() {
            self.e.fired.store(1, SeqCst);
            let fd = self.e.channel_fd.load(Acquire);
            if fd != u64::MAX {
                return Pushed::Wake(fd);
            }
        }
        Pushed::Stored
    }

    /// Arms the CQ (owner).
    pub(crate) fn arm(&self, solicited_only: bool) {
        self.e.armed.store(if solicited_only { 2 } else { 1 }, SeqCst);
        fence(SeqCst);
    }

    /// Moves completions into `out` (single consumer). `None` after an overrun.
    pub(crate) fn poll(&self, out: &mut [WorkCompletion]) -> Option<usize> {
        if self.e.overrun.load(Acquire) != 0 {
            return None;
        }
        let (head, tail) = (self.e.head.load(Relaxed), self.e.tail.load(Acquire));
        let n = tail.wrapping_sub(head).min(self.cap).min(out.len() as u64);
        for (k, slot) in out.iter_mut().take(n as usize).enumerate() {
            let i = (((head + k as u64) & (self.cap - 1)) * CQE_WORDS) as usize;
            let w = &self.words[i..i + CQE_WORDS as usize];
            let (w1, w2, w3) = (w[1].load(Relaxed), w[2].load(Relaxed), w[3].load(Relaxed));
            *slot = WorkCompletion {
                wr_id: w[0].load(Relaxed),
                status: WcStatus::from_raw((w1 & 0xff) as u32),
                opcode: opcode_from((w1 >> 8) & 0xfff),
                byte_len: w2 as u32,
                imm_data: (w1 >> 20 & 1 == 1).then_some((w2 >> 32) as u32),
                qp_num: w3 as u32,
                src_qp: (w3 >> 32) as u32,
                vendor_err: (w1 >> 32) as u32,
            };
        }
        self.e.head.store(head.wrapping_add(n), Release);
        Some(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ib::soft::shm::Caps;

    fn shm() -> Shm {
        Shm::create(Caps { mr: 4, attach: 4, qp: 4, cq: 4, srq: 1, arena: 1 << 16 }, "ionet-ring-test")
            .unwrap()
            .0
    }

    #[test]
    fn recv_ring_fifo_and_bounds() {
        let shm = shm();
        let r = RecvRing::init(&shm, 0, 4, 2).unwrap();
        for i in 0..4 {
            assert!(r.push(i, &[Sge::new(i, 1, 2)]));
        }
        assert!(!r.push(9, &[]), "full");
        assert!(!RecvRing::open(&shm, 0).unwrap().push(9, &[Sge::default(); 3]), "too many SGEs");
        assert_eq!(r.pop().unwrap().wr_id, 0);
        let mut rest = Vec::new();
        r.drain(|id| rest.push(id));
        assert_eq!(rest, [1, 2, 3]);
        assert!(r.pop().is_none());
        // A header claiming a huge ring is refused.
        shm.at::<RingHeader>(shm.arena(0, 64).unwrap()).unwrap().cap.store(1 << 40, Relaxed);
        assert!(RecvRing::open(&shm, 0).is_none());
    }

    #[test]
    fn cq_ring_round_trip_overrun_and_arm() {
        let shm = shm();
        let e = shm.cq(0).unwrap();
        e.cap.store(2, Relaxed);
        e.ring_off.store(0, Relaxed);
        e.channel_fd.store(5, Relaxed);
        e.life.store(3, Relaxed);
        let cq = CqRing::open(&shm, 0).unwrap();
        let wc = WorkCompletion {
            wr_id: 7,
            status: WcStatus::Success,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: 64,
            imm_data: Some(0xfeed),
            qp_num: 1025,
            src_qp: 2049,
            vendor_err: 0,
        };
        assert_eq!(cq.push(&wc, false), Pushed::Stored, "not armed: no wake");
        cq.arm(false);
        assert_eq!(cq.push(&wc, false), Pushed::Wake(5));
        let mut out = [WorkCompletion::default(); 4];
        assert_eq!(cq.poll(&mut out), Some(2));
        assert_eq!(out[0], wc);
        cq.push(&wc, false);
        cq.push(&wc, false);
        assert_eq!(cq.push(&wc, false), Pushed::Overrun);
        assert_eq!(cq.poll(&mut out), None);
    }
}
