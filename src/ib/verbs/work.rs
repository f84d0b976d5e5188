//! Work requests and their completions: access and send flags, scatter/gather entries, send
//! operations, and the status and opcode of every work completion.

use std::fmt;

#[cfg(doc)]
use super::QueuePair;

/// Memory access rights of a registration or a QP (bits of `enum ibv_access_flags`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AccessFlags(u32);

impl AccessFlags {
    /// No rights beyond local read (always granted).
    pub const NONE: AccessFlags = AccessFlags(0);
    /// The device may write the memory locally (receive buffers, RDMA_READ targets).
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(1);
    /// Peers may RDMA_WRITE into it (requires `LOCAL_WRITE`).
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(2);
    /// Peers may RDMA_READ from it.
    pub const REMOTE_READ: AccessFlags = AccessFlags(4);
    /// All three.
    pub const ALL: AccessFlags = AccessFlags(7);

    /// Raw bits (same values as `IBV_ACCESS_*`).
    pub fn bits(self) -> u32 {
        self.0
    }

    /// From raw bits; `None` if unknown bits are set.
    pub fn from_bits(b: u32) -> Option<Self> {
        (b & !7 == 0).then_some(AccessFlags(b))
    }

    /// True when every right in `other` is present.
    pub fn contains(self, other: AccessFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for AccessFlags {
    type Output = AccessFlags;
    fn bitor(self, rhs: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | rhs.0)
    }
}

impl fmt::Debug for AccessFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [(1, "LOCAL_WRITE"), (2, "REMOTE_WRITE"), (4, "REMOTE_READ")];
        let set: Vec<&str> = names.iter().filter(|(b, _)| self.0 & b != 0).map(|(_, n)| *n).collect();
        write!(f, "AccessFlags({})", if set.is_empty() { "NONE".to_string() } else { set.join("|") })
    }
}

/// Flags of a send work request (bits of `enum ibv_send_flags`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SendFlags(u32);

impl SendFlags {
    /// No flags: unsignaled, not fenced, not inline.
    pub const NONE: SendFlags = SendFlags(0);
    /// Wait for every earlier RDMA_READ on this QP to complete before starting.
    pub const FENCE: SendFlags = SendFlags(1);
    /// Produce a completion on success (errors always produce one).
    pub const SIGNALED: SendFlags = SendFlags(2);
    /// Solicited event at the receiver (accepted; providers may treat it as a plain event).
    pub const SOLICITED: SendFlags = SendFlags(4);
    /// Copy the payload at post time; the buffers may be reused as soon as `post_send`
    /// returns. Total length must not exceed the QP's `max_inline_data`.
    pub const INLINE: SendFlags = SendFlags(8);

    /// Raw bits (same values as `IBV_SEND_*`).
    pub fn bits(self) -> u32 {
        self.0
    }

    /// True when every flag in `other` is set.
    pub fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

impl fmt::Debug for SendFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [(1, "FENCE"), (2, "SIGNALED"), (4, "SOLICITED"), (8, "INLINE")];
        let set: Vec<&str> = names.iter().filter(|(b, _)| self.0 & b != 0).map(|(_, n)| *n).collect();
        write!(f, "SendFlags({})", if set.is_empty() { "NONE".to_string() } else { set.join("|") })
    }
}

/// One scatter/gather entry: `len` bytes at `addr`, inside the registration named by `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Sge {
    /// Start address in the caller's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the registration that covers `[addr, addr + len)`.
    pub lkey: u32,
}

impl Sge {
    /// An entry covering `len` bytes at `addr`.
    pub fn new(addr: u64, len: u32, lkey: u32) -> Self {
        Sge { addr, len, lkey }
    }
}

/// The operation of a send work request, with its operands.
///
/// Immediate data is given in host byte order; providers convert it to the wire's big-endian
/// `__be32` and back, so the receiver's [`WorkCompletion::imm_data`] equals what was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// Two-sided send; consumes one receive at the target.
    Send,
    /// Send carrying 32 bits of immediate data.
    SendWithImm {
        /// The immediate value.
        imm: u32,
    },
    /// One-sided write into `[remote_addr, remote_addr + len)` of the target's registration
    /// `rkey` (needs `REMOTE_WRITE`); no completion at the target.
    RdmaWrite {
        /// Target address.
        remote_addr: u64,
        /// Target's remote key.
        rkey: u32,
    },
    /// Write followed by a receive completion at the target carrying `imm` (consumes one
    /// receive there, whose buffers are not touched).
    RdmaWriteWithImm {
        /// Target address.
        remote_addr: u64,
        /// Target's remote key.
        rkey: u32,
        /// The immediate value.
        imm: u32,
    },
    /// One-sided read from the target's registration `rkey` (needs `REMOTE_READ`) into the
    /// local scatter list (needs `LOCAL_WRITE`).
    RdmaRead {
        /// Source address at the target.
        remote_addr: u64,
        /// Target's remote key.
        rkey: u32,
    },
}

impl SendOp {
    /// The opcode reported in this operation's completion.
    pub fn wc_opcode(self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm { .. } => WcOpcode::Send,
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        }
    }

    /// True for operations that consume a receive at the target.
    pub fn consumes_recv(self) -> bool {
        matches!(self, SendOp::Send | SendOp::SendWithImm { .. } | SendOp::RdmaWriteWithImm { .. })
    }
}

/// A send-queue work request.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// Caller cookie, returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Local gather list (for RDMA_READ: the local scatter list). At most the QP's
    /// `max_send_sge` entries; an empty list moves zero bytes.
    pub sges: &'a [Sge],
    /// Signaling, fencing, inline.
    pub flags: SendFlags,
}

/// A receive-queue work request.
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// Caller cookie, returned in the completion.
    pub wr_id: u64,
    /// Scatter list the incoming SEND is written to, in order. At most `max_recv_sge` entries.
    pub sges: &'a [Sge],
}

/// Completion status (`enum ibv_wc_status`, same numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
#[allow(missing_docs)] // The variants are verbs' own names; see the IB specification.
pub enum WcStatus {
    #[default]
    Success = 0,
    /// A receive buffer (or local gather) was too small for the message.
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocEecOpErr = 3,
    /// A local scatter/gather entry is not covered by a valid registration with the rights
    /// the operation needs.
    LocProtErr = 4,
    /// The QP was in (or went to) the error state before this work request completed.
    WrFlushErr = 5,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    /// The responder rejected the request (e.g. its receive buffer was too small).
    RemInvReqErr = 9,
    /// The responder refused the rkey, range or access right of a one-sided operation.
    RemAccessErr = 10,
    /// The responder failed to complete the operation (e.g. its receive buffer is not
    /// registered).
    RemOpErr = 11,
    /// The responder did not answer within `retry_cnt` transport retries (peer gone).
    RetryExcErr = 12,
    /// The responder had no receive posted for `rnr_retry` retries.
    RnrRetryExcErr = 13,
    LocRddViolErr = 14,
    RemInvRdReqErr = 15,
    RemAbortErr = 16,
    InvEecnErr = 17,
    InvEecStateErr = 18,
    FatalErr = 19,
    RespTimeoutErr = 20,
    GeneralErr = 21,
}

impl WcStatus {
    /// The `ibv_wc_status` value.
    pub fn as_raw(self) -> u32 {
        self as u32
    }

    /// From an `ibv_wc_status` value; unknown values map to `GeneralErr`.
    pub fn from_raw(v: u32) -> WcStatus {
        use WcStatus::*;
        const ALL: [WcStatus; 22] = [
            Success,
            LocLenErr,
            LocQpOpErr,
            LocEecOpErr,
            LocProtErr,
            WrFlushErr,
            MwBindErr,
            BadRespErr,
            LocAccessErr,
            RemInvReqErr,
            RemAccessErr,
            RemOpErr,
            RetryExcErr,
            RnrRetryExcErr,
            LocRddViolErr,
            RemInvRdReqErr,
            RemAbortErr,
            InvEecnErr,
            InvEecStateErr,
            FatalErr,
            RespTimeoutErr,
            GeneralErr,
        ];
        ALL.get(v as usize).copied().unwrap_or(GeneralErr)
    }

    /// True for `Success`.
    pub fn is_success(self) -> bool {
        self == WcStatus::Success
    }
}

/// Completion opcode (`enum ibv_wc_opcode`). Only meaningful when the status is `Success`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum WcOpcode {
    /// A SEND / SEND_WITH_IMM completed at the requester.
    #[default]
    Send,
    /// An RDMA_WRITE(_WITH_IMM) completed at the requester.
    RdmaWrite,
    /// An RDMA_READ completed at the requester (its data has landed).
    RdmaRead,
    /// A receive consumed by a SEND.
    Recv,
    /// A receive consumed by an RDMA_WRITE_WITH_IMM.
    RecvRdmaWithImm,
    /// Any other opcode a device reports (atomics, memory-window binds, ...), raw value.
    Other(u32),
}

impl WcOpcode {
    /// True for receive-queue completions.
    pub fn is_recv(self) -> bool {
        matches!(self, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
    }
}

/// One work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkCompletion {
    /// The `wr_id` of the work request.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed (valid when `status` is `Success`).
    pub opcode: WcOpcode,
    /// Receive completions: bytes written into the receive buffers (SEND) or by the write
    /// (RDMA_WRITE_WITH_IMM). RDMA_READ: bytes read. Otherwise, and for a failed work
    /// request, 0 on hardware.
    pub byte_len: u32,
    /// Immediate data (host byte order) for SEND_WITH_IMM / RDMA_WRITE_WITH_IMM receives.
    pub imm_data: Option<u32>,
    /// The local QP the work request was posted on (for SRQ receives: the QP that consumed it).
    pub qp_num: u32,
    /// Receive completions: the sender's QP number.
    pub src_qp: u32,
    /// Provider-specific error detail (0 when none).
    pub vendor_err: u32,
}
