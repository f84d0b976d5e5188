//! Fast-RDMA ring slot accounting (PVFS over InfiniBand's fast RDMA; MVAPICH2's RDMA fast path).
//!
//! The receiver of a connection owns a ring of S slots of Z bytes, registered once at connect,
//! whose address and rkey the peer learns in the handshake. The sender RDMA_WRITE_WITH_IMMs a
//! header plus data into the next slot, in ring order; the immediate data names the slot and
//! the length so the receiver needs no second message. The receiver's application frees slots
//! in any order, but slots go back to the sender in ring order, as counts, piggybacked on
//! headers like credits (or in an explicit CREDIT message).
//!
//! A WRITE_WITH_IMM consumes a receive WQE at the target. The ring does not take eager credits
//! for that: the receiver posts N + S receives (N for [`super::Credits`], S for the ring) and
//! re-posts the one a ring write consumed as soon as it handles the completion — before the
//! slot can come back to the sender — so at most S ring writes ever wait for a WQE.

use super::FlowError;
use crate::error::{Error, Result};

/// Default slots per ring: MVAPICH2's `MV2_NUM_RDMA_BUFFER` (32 persistent buffers per
/// connection), enough for many outstanding small requests where the paper used one.
pub const DEFAULT_RING_SLOTS: u16 = 32;
/// Default slot size: 64 KiB, the upper bound for fast RDMA that PVFS over InfiniBand measured (above it server-based RDMA
/// wins). 32 × 64 KiB = 2 MiB registered per connection.
pub const DEFAULT_RING_SLOT_SIZE: u32 = 64 << 10;
/// Bits of the immediate data that carry the length.
const LEN_BITS: u32 = 20;
const LEN_MASK: u32 = (1 << LEN_BITS) - 1;
/// Most slots per ring: the slot index has the 12 bits of the immediate data the length leaves.
pub const MAX_RING_SLOTS: u16 = 1 << (32 - LEN_BITS);
/// Largest slot: lengths up to the slot size must fit the 20-bit length field.
pub const MAX_RING_SLOT_SIZE: u32 = 1 << (LEN_BITS - 1);

/// Encodes a slot index and a length as immediate data: `slot << 20 | len`.
///
/// Callers pass `slot < MAX_RING_SLOTS` and `len <= MAX_RING_SLOT_SIZE` (the sender's own
/// values, checked by [`RingSender::reserve`]); larger inputs are truncated to their fields.
pub fn encode_imm(slot: u16, len: u32) -> u32 {
    (u32::from(slot) << LEN_BITS) | (len & LEN_MASK)
}

/// Splits immediate data into (slot, length). Total: every `u32` decodes; the receiver then
/// validates both against its ring.
pub fn decode_imm(imm: u32) -> (u16, u32) {
    // The shift leaves 12 bits, so the cast is lossless.
    ((imm >> LEN_BITS) as u16, imm & LEN_MASK)
}

/// Geometry of the ring a side offers its peer, and when it returns slots explicitly.
///
/// ```
/// use ionet::internals::flowctl::RingConfig;
/// assert!(RingConfig::default().slots(64).slot_size(16 << 10).validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingConfig {
    pub(crate) slots: u16,
    pub(crate) slot_size: u32,
    pub(crate) return_watermark: Option<u16>,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig { slots: DEFAULT_RING_SLOTS, slot_size: DEFAULT_RING_SLOT_SIZE, return_watermark: None }
    }
}

impl RingConfig {
    /// Slots in the ring (default [`DEFAULT_RING_SLOTS`]).
    pub fn slots(mut self, n: u16) -> Self {
        self.slots = n;
        self
    }

    /// Bytes per slot, header included (default [`DEFAULT_RING_SLOT_SIZE`]).
    pub fn slot_size(mut self, bytes: u32) -> Self {
        self.slot_size = bytes;
        self
    }

    /// Freed slots that make [`RingReceiver::should_return`] ask for an explicit return
    /// (default half the ring, so the sender never waits for more than half of it).
    pub fn return_watermark(mut self, n: u16) -> Self {
        self.return_watermark = Some(n);
        self
    }

    /// The watermark in force.
    pub fn effective_return_watermark(&self) -> u16 {
        self.return_watermark.unwrap_or((self.slots / 2).max(1))
    }

    /// Checks the rules.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] naming the first rule broken.
    pub fn validate(&self) -> Result<()> {
        if self.slots == 0 || self.slots > MAX_RING_SLOTS {
            return Err(Error::misuse(format!("ring slots must be in 1..={MAX_RING_SLOTS}")));
        }
        if self.slot_size == 0 || self.slot_size > MAX_RING_SLOT_SIZE {
            return Err(Error::misuse(format!("ring slot size must be in 1..={MAX_RING_SLOT_SIZE}")));
        }
        let w = self.effective_return_watermark();
        if w == 0 || w > self.slots {
            return Err(Error::misuse("ring return watermark must be in 1..=slots"));
        }
        Ok(())
    }
}

/// Where to write: the slot, its byte offset in the peer's ring, and the immediate data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotWrite {
    /// Slot index.
    pub slot: u16,
    /// Byte offset of the slot from the ring's base address.
    pub offset: u64,
    /// Immediate data for the RDMA_WRITE_WITH_IMM.
    pub imm: u32,
}

/// The sender's view of the peer's ring: which slot is next and how many are free.
///
/// Engine: [`RingSender::new`] from the peer's handshake; [`RingSender::reserve`] before each
/// fast-RDMA write (if it returns `None` the ring is full: queue the transfer or use another
/// mechanism); [`RingSender::on_returned`] with the slot count in every header from the peer.
#[derive(Debug, Clone)]
pub struct RingSender {
    slots: u16,
    slot_size: u32,
    next: u16,
    free: u16,
}

impl RingSender {
    /// The ring the peer advertised: `slots` slots of `slot_size` bytes.
    ///
    /// # Errors
    ///
    /// [`FlowError::Negotiation`] when either value is out of range.
    pub fn new(slots: u16, slot_size: u32) -> Result<Self, FlowError> {
        if slots == 0 || slots > MAX_RING_SLOTS {
            tracing::debug!(slots, "peer advertised an unusable ring slot count");
            return Err(FlowError::Negotiation("ring slot count out of range"));
        }
        if slot_size == 0 || slot_size > MAX_RING_SLOT_SIZE {
            tracing::debug!(slot_size, "peer advertised an unusable ring slot size");
            return Err(FlowError::Negotiation("ring slot size out of range"));
        }
        Ok(RingSender { slots, slot_size, next: 0, free: slots })
    }

    /// Takes the next slot for a write of `len` bytes, or `None` when every slot is in use
    /// at the peer.
    ///
    /// # Errors
    ///
    /// [`FlowError::Misuse`] when `len` exceeds the slot size.
    pub fn reserve(&mut self, len: u32) -> Result<Option<SlotWrite>, FlowError> {
        if len > self.slot_size {
            return Err(FlowError::Misuse("fast-RDMA write larger than a ring slot"));
        }
        if self.free == 0 {
            return Ok(None);
        }
        let slot = self.next;
        self.next = (self.next + 1) % self.slots;
        self.free -= 1;
        Ok(Some(SlotWrite {
            slot,
            offset: u64::from(slot) * u64::from(self.slot_size),
            imm: encode_imm(slot, len),
        }))
    }

    /// The peer returned `n` slots (in ring order).
    ///
    /// # Errors
    ///
    /// [`FlowError::ExcessSlots`] when more than were in use.
    pub fn on_returned(&mut self, n: u16) -> Result<(), FlowError> {
        let outstanding = self.slots - self.free;
        if n > outstanding {
            tracing::debug!(returned = n, outstanding, "peer returned more ring slots than in use");
            return Err(FlowError::ExcessSlots { returned: n, outstanding });
        }
        self.free += n;
        Ok(())
    }

    /// Slots the sender may still write.
    pub fn free_slots(&self) -> u16 {
        self.free
    }

    /// Size of each slot.
    pub fn slot_size(&self) -> u32 {
        self.slot_size
    }
}

/// A validated ring write: which slot holds how many bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotData {
    /// Slot index (give it to [`RingReceiver::release`] when done).
    pub slot: u16,
    /// Byte offset of the slot in the ring.
    pub offset: u64,
    /// Bytes written.
    pub len: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// Granted to the sender (or returned-but-unreported: see `returns`).
    Free,
    /// Written, the application still has it.
    Busy,
    /// Released by the application, waiting for the slots before it.
    Done,
}

/// The receiver's ring: validates every write against ring order and grants, and turns
/// out-of-order releases into in-order returns.
///
/// Engine: [`RingReceiver::new`] at connect (advertise its geometry); on each
/// RDMA_WRITE_WITH_IMM completion [`RingReceiver::on_write`] with the immediate data (an error
/// is a protocol violation: close the connection); [`RingReceiver::release`] when the
/// application is done with a slot, then if [`RingReceiver::should_return`] call
/// [`super::Credits::request_explicit`]; put [`RingReceiver::take_returns`] into the slot field
/// of every outgoing header (and of CREDIT messages).
#[derive(Debug, Clone)]
pub struct RingReceiver {
    state: Vec<SlotState>,
    slot_size: u32,
    watermark: u16,
    /// The slot the next write must use.
    expected: u16,
    /// Oldest slot not yet returned.
    tail: u16,
    /// Writes the sender may still make: our record of its free slots.
    granted: u16,
    /// Slots freed in ring order, not yet reported.
    returns: u16,
}

impl RingReceiver {
    /// A ring with the geometry of `cfg`.
    ///
    /// # Errors
    ///
    /// [`FlowError::Misuse`] when `cfg` is invalid.
    pub fn new(cfg: &RingConfig) -> Result<Self, FlowError> {
        cfg.validate().map_err(|_| FlowError::Misuse("invalid RingConfig"))?;
        Ok(RingReceiver {
            state: vec![SlotState::Free; usize::from(cfg.slots)],
            slot_size: cfg.slot_size,
            watermark: cfg.effective_return_watermark(),
            expected: 0,
            tail: 0,
            granted: cfg.slots,
            returns: 0,
        })
    }

    fn slots(&self) -> u16 {
        // `RingConfig::validate` bounds the length by MAX_RING_SLOTS.
        self.state.len() as u16
    }

    /// A ring write completed with immediate data `imm`.
    ///
    /// # Errors
    ///
    /// A peer fault when the slot is out of range, out of ring order, not granted, or the
    /// length exceeds the slot.
    pub fn on_write(&mut self, imm: u32) -> Result<SlotData, FlowError> {
        let (slot, len) = decode_imm(imm);
        let slots = self.slots();
        let err = if slot >= slots {
            Some(FlowError::SlotOutOfRange { slot, slots })
        } else if self.granted == 0 {
            Some(FlowError::SlotNotGranted { slot })
        } else if slot != self.expected {
            Some(FlowError::SlotOutOfOrder { got: slot, expected: self.expected })
        } else if len > self.slot_size {
            Some(FlowError::SlotLength { len, max: self.slot_size })
        } else {
            None
        };
        if let Some(e) = err {
            tracing::debug!(imm, slot, len, error = %e, "bad fast-RDMA write");
            return Err(e);
        }
        debug_assert_eq!(self.state[usize::from(slot)], SlotState::Free);
        self.state[usize::from(slot)] = SlotState::Busy;
        self.expected = (self.expected + 1) % slots;
        self.granted -= 1;
        Ok(SlotData { slot, offset: u64::from(slot) * u64::from(self.slot_size), len })
    }

    /// The application is done with `slot`. Slots return to the sender in ring order, so a
    /// slot released before an older one waits for it.
    ///
    /// # Errors
    ///
    /// [`FlowError::Misuse`] when the slot is not holding data.
    pub fn release(&mut self, slot: u16) -> Result<(), FlowError> {
        match self.state.get(usize::from(slot)) {
            Some(SlotState::Busy) => self.state[usize::from(slot)] = SlotState::Done,
            _ => return Err(FlowError::Misuse("release of a ring slot that holds no data")),
        }
        while self.state[usize::from(self.tail)] == SlotState::Done {
            self.state[usize::from(self.tail)] = SlotState::Free;
            self.tail = (self.tail + 1) % self.slots();
            self.returns += 1;
        }
        Ok(())
    }

    /// Slots to report to the sender in the next header; zeroes the count.
    pub fn take_returns(&mut self) -> u16 {
        let n = std::mem::take(&mut self.returns);
        self.granted += n;
        n
    }

    /// True when enough slots wait to be returned that an explicit message is worth it.
    pub fn should_return(&self) -> bool {
        self.returns >= self.watermark
    }

    /// Slots holding data or waiting for older slots.
    pub fn in_use(&self) -> u16 {
        self.slots() - self.granted - self.returns
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn imm_round_trips_and_decodes_any_value() {
        for (slot, len) in [(0u16, 0u32), (1, 65536), (4095, MAX_RING_SLOT_SIZE), (31, 1)] {
            assert_eq!(decode_imm(encode_imm(slot, len)), (slot, len));
        }
        assert_eq!(decode_imm(u32::MAX), (4095, (1 << 20) - 1));
    }

    #[test]
    fn sender_never_writes_into_a_slot_not_yet_returned() {
        let mut s = RingSender::new(4, 1024).unwrap();
        let slots: Vec<u16> = (0..4).map(|_| s.reserve(10).unwrap().unwrap().slot).collect();
        assert_eq!(slots, [0, 1, 2, 3]);
        assert_eq!(s.reserve(10).unwrap(), None, "ring full until the receiver returns slots");
        s.on_returned(1).unwrap();
        let w = s.reserve(1024).unwrap().unwrap();
        assert_eq!((w.slot, w.offset), (0, 0));
        assert_eq!(s.reserve(1), Ok(None));
        assert_eq!(s.reserve(1025), Err(FlowError::Misuse("fast-RDMA write larger than a ring slot")));
    }

    #[test]
    fn receiver_rejects_writes_beyond_its_grants() {
        let mut r = RingReceiver::new(&RingConfig::default().slots(2).slot_size(100)).unwrap();
        r.on_write(encode_imm(0, 1)).unwrap();
        r.on_write(encode_imm(1, 1)).unwrap();
        assert_eq!(r.on_write(encode_imm(0, 1)), Err(FlowError::SlotNotGranted { slot: 0 }));
        r.release(0).unwrap();
        // Released but not reported: still not granted to the sender.
        assert_eq!(r.on_write(encode_imm(0, 1)), Err(FlowError::SlotNotGranted { slot: 0 }));
        assert_eq!(r.take_returns(), 1);
        r.on_write(encode_imm(0, 1)).unwrap();
    }

    #[test]
    fn receiver_validates_peer_slot_and_length() {
        let mut r = RingReceiver::new(&RingConfig::default().slots(8).slot_size(4096)).unwrap();
        assert_eq!(r.on_write(encode_imm(8, 1)), Err(FlowError::SlotOutOfRange { slot: 8, slots: 8 }));
        assert_eq!(r.on_write(u32::MAX), Err(FlowError::SlotOutOfRange { slot: 4095, slots: 8 }));
        assert_eq!(r.on_write(encode_imm(3, 1)), Err(FlowError::SlotOutOfOrder { got: 3, expected: 0 }));
        assert_eq!(r.on_write(encode_imm(0, 4097)), Err(FlowError::SlotLength { len: 4097, max: 4096 }));
        let d = r.on_write(encode_imm(0, 4096)).unwrap();
        assert_eq!(d, SlotData { slot: 0, offset: 0, len: 4096 });
        assert!(FlowError::SlotLength { len: 1, max: 0 }.is_peer_fault());
        assert_eq!(r.release(5), Err(FlowError::Misuse("release of a ring slot that holds no data")));
        assert_eq!(r.release(9), Err(FlowError::Misuse("release of a ring slot that holds no data")));
        r.release(0).unwrap();
        assert!(r.release(0).is_err(), "double release");
    }

    #[test]
    fn sender_rejects_excess_returns_and_bad_geometry() {
        let mut s = RingSender::new(4, 1024).unwrap();
        assert_eq!(s.on_returned(1), Err(FlowError::ExcessSlots { returned: 1, outstanding: 0 }));
        let _ = s.reserve(1).unwrap();
        assert_eq!(
            s.on_returned(u16::MAX),
            Err(FlowError::ExcessSlots { returned: u16::MAX, outstanding: 1 })
        );
        assert!(matches!(RingSender::new(0, 1024), Err(FlowError::Negotiation(_))));
        assert!(matches!(RingSender::new(MAX_RING_SLOTS + 1, 1024), Err(FlowError::Negotiation(_))));
        assert!(matches!(RingSender::new(4, MAX_RING_SLOT_SIZE + 1), Err(FlowError::Negotiation(_))));
        assert!(matches!(RingSender::new(4, 0), Err(FlowError::Negotiation(_))));
        assert!(RingConfig::default().slots(0).validate().is_err());
        assert!(RingConfig::default().return_watermark(33).validate().is_err());
    }

    #[test]
    fn wraparound_reuses_slots_in_ring_order() {
        let mut s = RingSender::new(3, 64).unwrap();
        let mut r = RingReceiver::new(&RingConfig::default().slots(3).slot_size(64)).unwrap();
        let mut seen = Vec::new();
        for i in 0..10u32 {
            let w = s.reserve(i).unwrap().unwrap();
            assert_eq!(w.offset, u64::from(w.slot) * 64);
            let d = r.on_write(w.imm).unwrap();
            assert_eq!((d.slot, d.len), (w.slot, i));
            seen.push(d.slot);
            r.release(d.slot).unwrap();
            s.on_returned(r.take_returns()).unwrap();
        }
        assert_eq!(seen, [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn out_of_order_release_returns_slots_in_ring_order() {
        let mut r =
            RingReceiver::new(&RingConfig::default().slots(4).slot_size(64).return_watermark(2)).unwrap();
        for slot in 0..3 {
            r.on_write(encode_imm(slot, 8)).unwrap();
        }
        r.release(2).unwrap();
        r.release(1).unwrap();
        assert_eq!(r.take_returns(), 0, "slot 0 is still busy, so nothing goes back");
        assert!(!r.should_return());
        assert_eq!(r.in_use(), 3);
        r.release(0).unwrap();
        assert!(r.should_return());
        assert_eq!(r.take_returns(), 3);
        assert_eq!(r.in_use(), 0);
        // The next write must be slot 3, then 0 again.
        assert!(r.on_write(encode_imm(0, 8)).is_err());
        r.on_write(encode_imm(3, 8)).unwrap();
        r.on_write(encode_imm(0, 8)).unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// A sender and a receiver joined by an in-order wire, driven by random interleavings
        /// of writes, deliveries, out-of-order releases and returns: the receiver never sees an
        /// invalid write, and the sender's free count always equals what the receiver granted.
        #[test]
        fn sender_and_receiver_agree_under_random_interleavings(
            slots in 1..9u16,
            choices in proptest::collection::vec((0..4u8, any::<u16>()), 1..300),
        ) {
            let mut s = RingSender::new(slots, 256).unwrap();
            let mut r = RingReceiver::new(&RingConfig::default().slots(slots).slot_size(256)).unwrap();
            let mut wire: VecDeque<u32> = VecDeque::new();
            let mut returns_in_flight: VecDeque<u16> = VecDeque::new();
            let mut busy: Vec<u16> = Vec::new();
            let mut written = 0u32;
            for (what, x) in choices {
                match what {
                    0 => {
                        if let Some(w) = s.reserve(u32::from(x % 257)).unwrap() {
                            wire.push_back(w.imm);
                            written += 1;
                        }
                    }
                    1 => {
                        if let Some(imm) = wire.pop_front() {
                            let d = r.on_write(imm).map_err(|e| TestCaseError::fail(e.to_string()))?;
                            busy.push(d.slot);
                        }
                    }
                    2 => {
                        if !busy.is_empty() {
                            let slot = busy.swap_remove(usize::from(x) % busy.len());
                            r.release(slot).unwrap();
                        }
                    }
                    _ => {
                        returns_in_flight.push_back(r.take_returns());
                        if let Some(n) = returns_in_flight.pop_front() {
                            s.on_returned(n).unwrap();
                        }
                    }
                }
                let in_flight_returns: u16 = returns_in_flight.iter().sum();
                prop_assert_eq!(
                    s.free_slots() + in_flight_returns + wire.len() as u16 + r.in_use() + r.returns,
                    slots,
                    "every slot is free at the sender, being returned, on the wire, or in use"
                );
            }
            // Drain: deliver and release everything; all slots come back to the sender.
            while let Some(imm) = wire.pop_front() {
                busy.push(r.on_write(imm).map_err(|e| TestCaseError::fail(e.to_string()))?.slot);
            }
            for slot in busy {
                r.release(slot).unwrap();
            }
            for n in returns_in_flight {
                s.on_returned(n).unwrap();
            }
            s.on_returned(r.take_returns()).unwrap();
            prop_assert_eq!(s.free_slots(), slots);
            prop_assert!(written > 0 || s.free_slots() == slots);
        }
    }
}
