//! Credit-based flow control, fast-RDMA ring slot accounting and server buffer zones
//! (sans-IO).
//!
//! Everything here is plain bookkeeping: structs that take events ("a message arrived", "a
//! buffer was re-posted", "a zone buffer was freed") and return what to do next. No sockets,
//! verbs objects, threads or clocks, so every rule is tested deterministically, including
//! two-party models that step both ends of a connection.
//!
//! - [`Credits`]: BMI-IB's scheme. Each side pre-posts N receive buffers and tells the peer N
//!   at connect; a sender holds one credit per free peer buffer, keeps one back for an explicit
//!   credit message, piggybacks the credits it owes on every header, and sends an explicit
//!   CREDIT message when the owed count reaches a watermark and nothing else would carry it.
//! - [`RingSender`] / [`RingReceiver`]: the per-connection fast-RDMA ring the sender
//!   RDMA_WRITE_WITH_IMMs into; slots are written in ring order and returned like credits.
//! - [`BufferZones`]: the server's pre-registered 64 KiB … 2 MiB buffers, handed out exact,
//!   else bigger, else chopped, with a per-client fair share and round-robin service.
//!
//! Values a peer controls (credit counts, slot indices, lengths in immediate data) are checked
//! and rejected with a [`FlowError`]; none can overflow or panic.

mod credits;
mod ring;
mod zones;

pub use credits::{
    CreditConfig, CreditStats, Credits, DEFAULT_MAX_QUEUED, DEFAULT_RECV_BUFFER_SIZE, DEFAULT_RECV_BUFFERS,
    MAX_RECV_BUFFERS, MIN_RECV_BUFFERS, MIN_WATERMARK, Transmit, WATERMARK_MARGIN,
};
pub use ring::{
    DEFAULT_RING_SLOT_SIZE, DEFAULT_RING_SLOTS, MAX_RING_SLOT_SIZE, MAX_RING_SLOTS, RingConfig, RingReceiver,
    RingSender, SlotData, SlotWrite, decode_imm, encode_imm,
};
pub use zones::{
    Alloc, BufferZones, DEFAULT_MAX_WAITING, DEFAULT_ZONE_CLASSES, Grant, MAX_ZONE_BYTES, ZoneBuf,
    ZoneConfig, ZoneStats,
};

use crate::error::{Error, ProtocolError};

/// A flow-control failure: a peer that broke the rules, a bad negotiated value, or local
/// misuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FlowError {
    /// The peer sent a message while it held no credit (more messages than buffers granted).
    #[error("peer sent a message without a credit")]
    NoCredit,
    /// The peer returned more credits than we had messages outstanding.
    #[error("peer returned {returned} credits but only {outstanding} were outstanding")]
    ExcessCredits {
        /// Credits in the header.
        returned: u16,
        /// Credits we had spent and not yet got back.
        outstanding: u16,
    },
    /// A fast-RDMA write named a slot outside the ring.
    #[error("fast-RDMA write into slot {slot} of a {slots}-slot ring")]
    SlotOutOfRange {
        /// Slot in the immediate data.
        slot: u16,
        /// Ring size.
        slots: u16,
    },
    /// A fast-RDMA write skipped ahead or went back in the ring.
    #[error("fast-RDMA write into slot {got}, expected slot {expected}")]
    SlotOutOfOrder {
        /// Slot written.
        got: u16,
        /// The next slot in ring order.
        expected: u16,
    },
    /// A fast-RDMA write into a slot that had not been returned to the sender yet.
    #[error("fast-RDMA write into slot {slot}, which was not granted")]
    SlotNotGranted {
        /// Slot written.
        slot: u16,
    },
    /// A fast-RDMA write longer than a slot.
    #[error("fast-RDMA write of {len} bytes into a {max}-byte slot")]
    SlotLength {
        /// Length in the immediate data.
        len: u32,
        /// Slot size.
        max: u32,
    },
    /// The peer returned more ring slots than we had written.
    #[error("peer returned {returned} ring slots but only {outstanding} were in use")]
    ExcessSlots {
        /// Slots returned.
        returned: u16,
        /// Slots written and not yet returned.
        outstanding: u16,
    },
    /// The peer advertised an unusable value at connect (buffer count, ring geometry).
    #[error("bad negotiated value: {0}")]
    Negotiation(&'static str),
    /// Local misuse (releasing a slot twice, re-posting more buffers than were filled, a
    /// full queue). Never caused by peer data.
    #[error("flow-control misuse: {0}")]
    Misuse(&'static str),
}

impl FlowError {
    /// True when the peer is at fault (the connection should be closed).
    pub fn is_peer_fault(&self) -> bool {
        !matches!(self, FlowError::Misuse(_))
    }
}

impl From<FlowError> for Error {
    fn from(e: FlowError) -> Error {
        match e {
            FlowError::Misuse(m) => Error::Misuse(m.to_string()),
            FlowError::Negotiation(m) => {
                Error::Protocol { peer: None, reason: ProtocolError::Handshake(m.to_string()) }
            }
            other => Error::Protocol { peer: None, reason: ProtocolError::FlowControl(other.to_string()) },
        }
    }
}
