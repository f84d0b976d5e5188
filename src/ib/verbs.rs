//! The `Verbs` trait: the one seam between the IB engine and a provider.
//!
//! The engine is generic over a provider (`IbEngine<V: Verbs>`) and speaks InfiniBand verbs
//! through the traits in this module only. Two providers implement them:
//!
//! - [`crate::ib::soft`] (`softib://`): a software provider that runs on any Linux host, within
//!   one process and across processes, with real memory pinning and fault injection;
//! - `crate::ib::hw` (cargo feature `verbs`): real HCAs through `libibverbs` (`ibverbs-sys`).
//!
//! The vocabulary is that of `libibverbs` (`ibv_*`), typed: access and send flags are newtypes,
//! opcodes are enums that carry their operands, QP transitions are one enum with one attribute
//! struct per target state, and every work completion status of `enum ibv_wc_status` exists.
//!
//! # Bring-up
//!
//! ```text
//!  provider.open(dev) ─► ctx ─► ctx.alloc_pd()                     ─► pd
//!                           ├─► ctx.create_comp_channel()          ─► ch   (ch.as_raw_fd() → mio)
//!                           ├─► ctx.create_cq(n, Some(&ch), cookie) ─► cq
//!                           ├─► unsafe ctx.reg_mr(&pd, addr, len, access) ─► mr (lkey,rkey)
//!                           └─► ctx.create_qp(&pd, &QpInit{..})     ─► qp   (state RESET)
//!  local = QpEndpointInfo::local(&qp, &ctx.port_attr(1)?, psn)      // QPN, PSN, LID, GID
//!  ── exchange local.encode() over the TCP side channel; QpEndpointInfo::decode(peer bytes) ──
//!  bring_up(&qp, &local, &remote, &ConnParams::default())           // INIT → RTR → RTS
//!  qp.post_recv(..) first, then the peer may SEND; qp.post_send(..); cq.poll(&mut wcs)
//! ```
//!
//! Exactly the information a real HCA needs crosses the side channel ([`QpEndpointInfo`]:
//! QP number, starting PSN, LID and GID), so an engine cannot tell the software provider from
//! hardware. Post receives *before* telling the peer the QP is ready: a SEND that finds no
//! receive posted is an RNR (receiver-not-ready) condition, retried `rnr_retry` times.
//! Receives can be posted from INIT on; to have them in place before RTR, move the QP to INIT
//! yourself, post, then call [`bring_up`] (which re-applies INIT, an allowed INIT → INIT).
//!
//! # Completions and blocking
//!
//! Every signaled work request, every unsignaled one that fails, and every work request flushed
//! when a QP enters the error state produces exactly one [`WorkCompletion`]. To block:
//! `cq.req_notify(false)`, poll the CQ once more (a completion may have landed before the arm),
//! then wait for the channel's file descriptor to become readable (`poll(2)` or mio
//! `SourceFd`), call [`CompletionChannel::get_event`] until it returns `None`, re-arm and poll.
//! A channel only becomes readable when an *armed* CQ receives a completion; each arm produces
//! at most one event.
//!
//! # Memory
//!
//! Registration ([`Verbs::reg_mr`]) hands raw memory the caller keeps alive to the device; it is
//! the only `unsafe` call of the seam (see its `# Safety`). Posting is safe: every local
//! scatter/gather entry is checked against the registration its `lkey` names (by the provider,
//! or by the HCA), and every remote address against the target's registration for the `rkey`.
//! A failed check completes the work request with an error status; it never touches memory
//! outside a registration.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd};

use crate::error::Error;

/// Result of a verbs call.
pub type VerbsResult<T> = std::result::Result<T, VerbsError>;

/// Largest QP number or PSN: both are 24-bit quantities on the wire.
pub const MAX_24BIT: u32 = (1 << 24) - 1;

/// What can go wrong with a verbs call (as opposed to a work request, whose failures are
/// reported as a [`WcStatus`] in its completion).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// No RDMA device is usable on this host.
    #[error("no RDMA device available ({provider}): {reason}; use the software provider (softib://) instead")]
    NoDevice {
        /// The provider that looked (`"ib"` for hardware).
        provider: &'static str,
        /// What the system said (e.g. "ibv_get_device_list: Function not implemented").
        reason: String,
    },
    /// No device of that name.
    #[error("no RDMA device named {0:?}")]
    UnknownDevice(String),
    /// An argument is invalid (never caused by peer data).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The QP state machine does not allow this transition.
    #[error("invalid QP transition {from:?} -> {to:?}")]
    InvalidTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// The QP is not in a state that allows posting this kind of work request.
    #[error("cannot post on a QP in state {0:?}")]
    InvalidState(QpState),
    /// A work request has more scatter/gather entries than the QP was created for.
    #[error("{given} scatter/gather entries exceed the QP's limit of {max}")]
    TooManySge {
        /// Entries in the work request.
        given: usize,
        /// The limit (`max_send_sge` / `max_recv_sge`).
        max: u32,
    },
    /// An inline send is larger than `max_inline_data`.
    #[error("inline send of {len} bytes exceeds max_inline_data {max}")]
    InlineTooLarge {
        /// Bytes requested.
        len: u64,
        /// The limit.
        max: u32,
    },
    /// A work queue is full (`max_send_wr` / `max_recv_wr` outstanding).
    #[error("{queue} full ({capacity} entries)")]
    QueueFull {
        /// Which queue.
        queue: &'static str,
        /// Its capacity.
        capacity: u32,
    },
    /// Memory could not be pinned: `mlock`/`ibv_reg_mr` failed for lack of lockable memory
    /// (`RLIMIT_MEMLOCK`, `ENOMEM`, `EPERM`, `EAGAIN`) or a configured pin budget is spent.
    /// A registration cache reacts by releasing unused registrations and retrying.
    #[error("cannot pin {len} bytes: {reason}")]
    PinLimit {
        /// Bytes of the failed registration.
        len: u64,
        /// What refused it (errno text and the limit in force).
        reason: String,
    },
    /// A provider table is full (MRs, QPs, CQs, ...).
    #[error("resource exhausted: {0}")]
    Exhausted(String),
    /// The CQ overflowed; it is unusable (size CQs for every outstanding work request).
    #[error("completion queue overrun")]
    CqOverrun,
    /// The provider does not implement this.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// An operating-system or driver error.
    #[error("verbs I/O error: {0}")]
    Io(io::Error),
}

impl From<io::Error> for VerbsError {
    fn from(e: io::Error) -> Self {
        VerbsError::Io(e)
    }
}

impl From<VerbsError> for Error {
    fn from(e: VerbsError) -> Error {
        match e {
            VerbsError::NoDevice { .. } | VerbsError::Unsupported(_) => Error::Unsupported(e.to_string()),
            VerbsError::PinLimit { .. }
            | VerbsError::Exhausted(_)
            | VerbsError::QueueFull { .. }
            | VerbsError::CqOverrun => Error::Exhausted(e.to_string()),
            VerbsError::Io(io) => Error::Io(io),
            other => Error::Misuse(other.to_string()),
        }
    }
}

/// A failed `post_send` / `post_recv`: work requests before `index` were posted and will
/// complete; the one at `index` and those after it were not posted (`ibv_post_send`'s `bad_wr`).
#[derive(Debug, thiserror::Error)]
#[error("work request {index} not posted: {error}")]
pub struct PostError {
    /// Index of the first work request that was not posted.
    pub index: usize,
    /// Why.
    pub error: VerbsError,
}

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
    /// (RDMA_WRITE_WITH_IMM). RDMA_READ: bytes read. Otherwise 0 on hardware.
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

/// Queue-pair states (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created, or reset: nothing can be posted.
    Reset,
    /// Initialised: receives may be posted (they are not consumed yet).
    Init,
    /// Ready to receive: incoming SENDs consume receives.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained (not used by the engine).
    Sqd,
    /// Send queue error (not used on RC QPs).
    Sqe,
    /// Error: every outstanding and newly posted work request completes with `WrFlushErr`.
    Err,
}

/// IB path MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[allow(missing_docs)]
pub enum Mtu {
    Mtu256,
    Mtu512,
    #[default]
    Mtu1024,
    Mtu2048,
    Mtu4096,
}

impl Mtu {
    /// The MTU in bytes.
    pub fn bytes(self) -> u32 {
        256 << (self as u32)
    }

    /// The `enum ibv_mtu` value (1 = 256 ... 5 = 4096).
    pub fn as_raw(self) -> u32 {
        self as u32 + 1
    }

    /// From an `enum ibv_mtu` value.
    pub fn from_raw(v: u32) -> Option<Mtu> {
        [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096]
            .get((v as usize).checked_sub(1)?)
            .copied()
    }
}

/// Logical port state (`enum ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum PortState {
    Nop,
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
}

/// Link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// Native InfiniBand: LID routing, GRH optional.
    InfiniBand,
    /// RoCE: addressing by GID (a `gid_index` is required in [`RtrAttr`]).
    Ethernet,
    /// Unknown / software.
    Unspecified,
}

/// A 128-bit global identifier.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        std::net::Ipv6Addr::from(self.0).fmt(f)
    }
}

/// A device the provider can open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name (`mlx5_0`, `softib0`).
    pub name: String,
    /// Node GUID (0 when unknown).
    pub guid: u64,
}

/// Device limits (`struct ibv_device_attr`, plus the provider's inline limit).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceAttr {
    /// Largest registration.
    pub max_mr_size: u64,
    /// Maximum number of QPs.
    pub max_qp: u32,
    /// Maximum outstanding work requests per queue.
    pub max_qp_wr: u32,
    /// Maximum scatter/gather entries per work request.
    pub max_sge: u32,
    /// Maximum number of CQs.
    pub max_cq: u32,
    /// Maximum entries per CQ.
    pub max_cqe: u32,
    /// Maximum number of registrations.
    pub max_mr: u32,
    /// Maximum number of protection domains.
    pub max_pd: u32,
    /// Maximum outstanding RDMA_READs a QP can be the target of.
    pub max_qp_rd_atom: u32,
    /// Maximum number of SRQs (0: none).
    pub max_srq: u32,
    /// Maximum outstanding receives per SRQ.
    pub max_srq_wr: u32,
    /// Maximum scatter/gather entries per SRQ receive.
    pub max_srq_sge: u32,
    /// Largest inline send the provider accepts. Hardware reports no device-wide value; the
    /// hardware provider reports what a probe QP was granted, and each QP's
    /// [`QueuePair::cap`] has the authoritative figure.
    pub max_inline_data: u32,
    /// Number of physical ports (ports are numbered from 1).
    pub phys_port_cnt: u8,
}

/// Port attributes (`struct ibv_port_attr`) and the GID at index 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Logical state; only `Active` ports carry traffic.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU currently in force.
    pub active_mtu: Mtu,
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// GID at index 0.
    pub gid: Gid,
    /// Largest message.
    pub max_msg_sz: u32,
    /// InfiniBand or Ethernet (RoCE).
    pub link_layer: LinkLayer,
}

/// Queue sizes of a QP (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    /// Outstanding send work requests.
    pub max_send_wr: u32,
    /// Outstanding receive work requests (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive.
    pub max_recv_sge: u32,
    /// Largest inline send.
    pub max_inline_data: u32,
}

impl Default for QpCap {
    /// BMI-IB-like sizes: 128 work requests each way, 16 SGEs, 64 B inline.
    fn default() -> Self {
        QpCap { max_send_wr: 128, max_recv_wr: 128, max_send_sge: 16, max_recv_sge: 16, max_inline_data: 64 }
    }
}

/// Creation parameters of an RC queue pair.
pub struct QpInit<'a, V: Verbs> {
    /// CQ for send-queue completions.
    pub send_cq: &'a V::Cq,
    /// CQ for receive completions (may be the same CQ).
    pub recv_cq: &'a V::Cq,
    /// Take receives from this shared receive queue instead of a private one.
    pub srq: Option<&'a V::Srq>,
    /// Queue sizes (the provider may round up; see [`QueuePair::cap`]).
    pub cap: QpCap,
    /// Signal every send regardless of `SendFlags::SIGNALED`.
    pub sq_sig_all: bool,
}

impl<V: Verbs> fmt::Debug for QpInit<'_, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QpInit")
            .field("cap", &self.cap)
            .field("srq", &self.srq.is_some())
            .field("sq_sig_all", &self.sq_sig_all)
            .finish()
    }
}

/// Shared receive queue sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// Outstanding receives.
    pub max_wr: u32,
    /// Scatter/gather entries per receive.
    pub max_sge: u32,
}

/// RESET → INIT attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitAttr {
    /// Physical port (from 1).
    pub port_num: u8,
    /// P_Key table index.
    pub pkey_index: u16,
    /// Remote operations this QP accepts as a responder (`REMOTE_WRITE`, `REMOTE_READ`);
    /// combined with each registration's own rights.
    pub access: AccessFlags,
}

/// INIT → RTR attributes: who the peer is and how to receive from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtrAttr {
    /// The peer QP (its QPN, its starting PSN = our expected receive PSN, its LID and GID).
    pub remote: QpEndpointInfo,
    /// Path MTU (at most both ports' active MTU).
    pub path_mtu: Mtu,
    /// RDMA_READs the peer may have outstanding against us.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer we advertise (IB encoding 0..=31; 1 = 0.01 ms, 14 = 1.28 ms,
    /// 31 = 491.52 ms, 0 = 655.36 ms).
    pub min_rnr_timer: u8,
    /// Service level (0..=15): the priority class of this connection.
    pub sl: u8,
    /// Our port.
    pub port_num: u8,
    /// Route with a GRH using our GID at this index (required on RoCE); `None`: LID routing.
    pub gid_index: Option<u8>,
}

/// RTR → RTS attributes: how to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsAttr {
    /// Our starting send PSN (what we told the peer in our [`QpEndpointInfo`]).
    pub sq_psn: u32,
    /// Local ACK timeout, 4.096 µs · 2^timeout (0: infinite on hardware).
    pub timeout: u8,
    /// Transport retries before `RetryExcErr` (0..=7).
    pub retry_cnt: u8,
    /// RNR retries before `RnrRetryExcErr` (0..=6; 7 = retry forever).
    pub rnr_retry: u8,
    /// RDMA_READs we may have outstanding.
    pub max_rd_atomic: u8,
}

/// A QP state transition with its attributes (typed `ibv_modify_qp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpTransition {
    /// RESET → INIT.
    Init(InitAttr),
    /// INIT → RTR.
    Rtr(RtrAttr),
    /// RTR → RTS.
    Rts(RtsAttr),
    /// Any state → ERR: outstanding work requests are flushed with `WrFlushErr`.
    Err,
    /// Any state → RESET: queues are emptied without completions.
    Reset,
}

impl QpTransition {
    /// The state this transition leads to.
    pub fn target(&self) -> QpState {
        match self {
            QpTransition::Init(_) => QpState::Init,
            QpTransition::Rtr(_) => QpState::Rtr,
            QpTransition::Rts(_) => QpState::Rts,
            QpTransition::Err => QpState::Err,
            QpTransition::Reset => QpState::Reset,
        }
    }

    /// Whether the RC state machine allows `from → self.target()`.
    pub fn allowed_from(&self, from: QpState) -> bool {
        matches!(
            (from, self),
            (QpState::Reset, QpTransition::Init(_))
                | (QpState::Init, QpTransition::Init(_))
                | (QpState::Init, QpTransition::Rtr(_))
                | (QpState::Rtr, QpTransition::Rts(_))
                | (_, QpTransition::Err)
                | (_, QpTransition::Reset)
        )
    }
}

/// Exactly what a peer needs to connect an RC QP to ours — what a real HCA needs, no more:
/// QP number, starting PSN, LID and GID. The engine sends it over its TCP side channel.
///
/// Wire form: 32 bytes, big-endian:
///
/// ```text
///  0 u16 magic 0x5150 ("QP")   4 u32 qpn (< 2^24)    12 u16 lid
///  2 u8  version (1)           8 u32 psn (< 2^24)    14 u16 reserved, 0
///  3 u8  reserved, 0                                 16 [u8; 16] gid
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpEndpointInfo {
    /// QP number (24 bits).
    pub qpn: u32,
    /// Starting packet sequence number of the QP's send queue (24 bits).
    pub psn: u32,
    /// Port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Port GID (required on RoCE; identifies the peer context on `softib`).
    pub gid: Gid,
}

/// Why a [`QpEndpointInfo`] failed to decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointDecodeError {
    /// Not exactly [`QpEndpointInfo::WIRE_LEN`] bytes.
    #[error("endpoint info is {0} bytes, expected 32")]
    Length(usize),
    /// Wrong magic or version.
    #[error("endpoint info has bad magic or version")]
    Version,
    /// A reserved field is not zero.
    #[error("endpoint info has non-zero reserved bits")]
    Reserved,
    /// QPN or PSN does not fit in 24 bits.
    #[error("endpoint info QPN or PSN out of range")]
    Range,
}

impl QpEndpointInfo {
    /// Length of the wire form.
    pub const WIRE_LEN: usize = 32;
    const MAGIC: u16 = 0x5150;
    const VERSION: u8 = 1;

    /// Our side of a connection: `qp`'s number, the port's LID and GID, and `psn` (any
    /// 24-bit value; pick it at random, it is masked to 24 bits).
    pub fn local<Q: QueuePair + ?Sized>(qp: &Q, port: &PortAttr, psn: u32) -> Self {
        QpEndpointInfo { qpn: qp.qp_num(), psn: psn & MAX_24BIT, lid: port.lid, gid: port.gid }
    }

    /// The 32-byte wire form.
    pub fn encode(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[0..2].copy_from_slice(&Self::MAGIC.to_be_bytes());
        b[2] = Self::VERSION;
        b[4..8].copy_from_slice(&(self.qpn & MAX_24BIT).to_be_bytes());
        b[8..12].copy_from_slice(&(self.psn & MAX_24BIT).to_be_bytes());
        b[12..14].copy_from_slice(&self.lid.to_be_bytes());
        b[16..32].copy_from_slice(&self.gid.0);
        b
    }

    /// Decodes the wire form. Total: any input gives a value or an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self, EndpointDecodeError> {
        let b: &[u8; Self::WIRE_LEN] =
            bytes.try_into().map_err(|_| EndpointDecodeError::Length(bytes.len()))?;
        let be16 = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let be32 = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if be16(0) != Self::MAGIC || b[2] != Self::VERSION {
            return Err(EndpointDecodeError::Version);
        }
        if b[3] != 0 || be16(14) != 0 {
            return Err(EndpointDecodeError::Reserved);
        }
        let (qpn, psn) = (be32(4), be32(8));
        if qpn > MAX_24BIT || psn > MAX_24BIT {
            return Err(EndpointDecodeError::Range);
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        Ok(QpEndpointInfo { qpn, psn, lid: be16(12), gid: Gid(gid) })
    }
}

/// Connection parameters for [`bring_up`]. Defaults follow BMI-IB (`timeout` 14 ≈ 67 ms,
/// `retry_cnt` 7, `rnr_retry` 7 = forever, `min_rnr_timer` 12 = 0.64 ms, MTU 1024).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnParams {
    /// Port (from 1).
    pub port_num: u8,
    /// Remote rights this QP accepts.
    pub access: AccessFlags,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Service level (0..=15).
    pub sl: u8,
    /// See [`RtsAttr::timeout`].
    pub timeout: u8,
    /// See [`RtsAttr::retry_cnt`].
    pub retry_cnt: u8,
    /// See [`RtsAttr::rnr_retry`].
    pub rnr_retry: u8,
    /// See [`RtrAttr::min_rnr_timer`].
    pub min_rnr_timer: u8,
    /// Outstanding RDMA_READs each way.
    pub max_rd_atomic: u8,
    /// GID index for GRH routing (required on RoCE).
    pub gid_index: Option<u8>,
}

impl Default for ConnParams {
    fn default() -> Self {
        ConnParams {
            port_num: 1,
            access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE,
            path_mtu: Mtu::Mtu1024,
            sl: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 4,
            gid_index: None,
        }
    }
}

/// Drives a fresh QP through RESET → INIT → RTR → RTS towards `remote`, sending from
/// `local.psn`. Receives should be posted before the peer learns we are ready.
///
/// # Errors
/// Whatever [`QueuePair::modify`] reports; the QP is left in the state reached.
pub fn bring_up<Q: QueuePair + ?Sized>(
    qp: &Q,
    local: &QpEndpointInfo,
    remote: &QpEndpointInfo,
    p: &ConnParams,
) -> VerbsResult<()> {
    qp.modify(&QpTransition::Init(InitAttr { port_num: p.port_num, pkey_index: 0, access: p.access }))?;
    qp.modify(&QpTransition::Rtr(RtrAttr {
        remote: *remote,
        path_mtu: p.path_mtu,
        max_dest_rd_atomic: p.max_rd_atomic,
        min_rnr_timer: p.min_rnr_timer,
        sl: p.sl,
        port_num: p.port_num,
        gid_index: p.gid_index,
    }))?;
    qp.modify(&QpTransition::Rts(RtsAttr {
        sq_psn: local.psn,
        timeout: p.timeout,
        retry_cnt: p.retry_cnt,
        rnr_retry: p.rnr_retry,
        max_rd_atomic: p.max_rd_atomic,
    }))
}

/// Counters a provider keeps (monotonic unless noted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VerbsCounters {
    /// Successful registrations.
    pub registrations: u64,
    /// Deregistrations.
    pub deregistrations: u64,
    /// Bytes registered, summed over registrations.
    pub registered_bytes: u64,
    /// Bytes currently registered (gauge).
    pub pinned_bytes: u64,
    /// Nanoseconds spent registering.
    pub reg_ns: u64,
    /// Nanoseconds spent deregistering.
    pub dereg_ns: u64,
    /// Nanoseconds this process's threads spent doing the device's work: executing work
    /// requests (copies, the peer's receive ring and CQ, its wake-up) that an HCA does without
    /// host CPU. Software provider only (hardware: 0); wall time, so a thread preempted inside
    /// it is counted too.
    pub device_ns: u64,
    /// Send work requests posted.
    pub send_wrs_posted: u64,
    /// Receive work requests posted.
    pub recv_wrs_posted: u64,
    /// Work completions polled from this context's CQs.
    pub completions: u64,
    /// Bytes moved by RDMA_WRITE(_WITH_IMM) this context initiated.
    pub rdma_write_bytes: u64,
    /// Bytes moved by RDMA_READ this context initiated.
    pub rdma_read_bytes: u64,
    /// Bytes moved by SEND(_WITH_IMM) this context initiated.
    pub send_bytes: u64,
    /// RNR retries this context's QPs made (software provider only).
    pub rnr_retries: u64,
}

/// A provider: lists and opens devices.
pub trait Provider: Send + Sync + fmt::Debug {
    /// The opened-device type.
    type Context: Verbs;

    /// The address scheme this provider serves (`"softib"`, `"ib"`).
    fn scheme(&self) -> &'static str;

    /// Devices present.
    ///
    /// # Errors
    /// [`VerbsError::NoDevice`] when the host has no RDMA support at all.
    fn devices(&self) -> VerbsResult<Vec<DeviceInfo>>;

    /// Opens a device by name, or the first one.
    ///
    /// # Errors
    /// [`VerbsError::NoDevice`], [`VerbsError::UnknownDevice`], or the OS error.
    fn open(&self, device: Option<&str>) -> VerbsResult<Self::Context>;
}

/// An opened device (`ibv_context`): creates every other object.
///
/// Objects keep what they depend on alive (a QP its CQs and PD, a CQ its channel, an MR its
/// PD), so they may be dropped in any order; dropping destroys them (errors are logged).
pub trait Verbs: Send + Sync + fmt::Debug + Sized + 'static {
    /// Protection domain.
    type Pd: Send + Sync + fmt::Debug;
    /// Memory registration.
    type Mr: MemoryRegion;
    /// Completion channel.
    type Channel: CompletionChannel;
    /// Completion queue.
    type Cq: CompletionQueue;
    /// RC queue pair.
    type Qp: QueuePair;
    /// Shared receive queue.
    type Srq: SharedReceiveQueue;

    /// The device this context was opened on.
    fn device(&self) -> &DeviceInfo;

    /// Device limits.
    fn attr(&self) -> &DeviceAttr;

    /// Port attributes (ports are numbered from 1).
    ///
    /// # Errors
    /// An invalid port, or the driver's error.
    fn port_attr(&self, port: u8) -> VerbsResult<PortAttr>;

    /// Allocates a protection domain.
    ///
    /// # Errors
    /// Table full or driver error.
    fn alloc_pd(&self) -> VerbsResult<Self::Pd>;

    /// Registers (and pins) `len` bytes at `addr` for the rights in `access`. The registration
    /// lives until the returned MR is dropped or [`MemoryRegion::deregister`]ed.
    /// `REMOTE_WRITE` requires `LOCAL_WRITE`.
    ///
    /// # Safety
    /// The caller guarantees, from this call until deregistration *returns*:
    /// - `[addr, addr + len)` is mapped memory of this process that is not freed, unmapped or
    ///   remapped (the device keeps using its physical pages);
    /// - the memory may be read, and if `access` allows writing, written, by the device at any
    ///   moment a posted work request (local or a peer's, with the `rkey`) says so: the caller
    ///   holds no Rust reference to it that assumes exclusive or unchanging access while such
    ///   work requests may run (treat it like memory shared with another process).
    ///
    /// After deregistration returns, neither the device nor any peer touches the memory again.
    ///
    /// # Errors
    /// [`VerbsError::PinLimit`] when the memory cannot be pinned (`RLIMIT_MEMLOCK`, pin budget)
    /// — release unused registrations and retry; [`VerbsError::InvalidArgument`] for a zero
    /// length or bad flags; [`VerbsError::Exhausted`] when the MR table is full.
    unsafe fn reg_mr(
        &self,
        pd: &Self::Pd,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> VerbsResult<Self::Mr>;

    /// Creates a completion channel (its fd is non-blocking and pollable).
    ///
    /// # Errors
    /// OS or driver error.
    fn create_comp_channel(&self) -> VerbsResult<Self::Channel>;

    /// Creates a CQ with room for at least `min_cqe` completions, optionally bound to a
    /// channel. `cookie` identifies it in [`CompletionChannel::get_event`].
    ///
    /// # Errors
    /// `min_cqe` above `max_cqe`, table full, or driver error.
    fn create_cq(&self, min_cqe: u32, channel: Option<&Self::Channel>, cookie: u64) -> VerbsResult<Self::Cq>;

    /// Creates a shared receive queue.
    ///
    /// # Errors
    /// Sizes above the device limits, [`VerbsError::Unsupported`] without SRQ support.
    fn create_srq(&self, pd: &Self::Pd, attr: &SrqAttr) -> VerbsResult<Self::Srq>;

    /// Creates an RC QP in the RESET state.
    ///
    /// # Errors
    /// Capacities above the device limits, table full, or driver error.
    fn create_qp(&self, pd: &Self::Pd, init: &QpInit<'_, Self>) -> VerbsResult<Self::Qp>;

    /// A snapshot of the provider's counters for this context.
    fn counters(&self) -> VerbsCounters;
}

/// A registration.
pub trait MemoryRegion: Send + Sync + fmt::Debug {
    /// Key for local scatter/gather entries.
    fn lkey(&self) -> u32;
    /// Key peers use for one-sided access.
    fn rkey(&self) -> u32;
    /// Registered start address.
    fn addr(&self) -> u64;
    /// Registered length.
    fn len(&self) -> usize;
    /// True for a zero-length registration (never produced by `reg_mr`).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Rights granted.
    fn access(&self) -> AccessFlags;
    /// Deregisters (unpins). Returns only when neither the device nor any peer can touch the
    /// memory any more. Dropping the MR does the same and logs errors.
    ///
    /// # Errors
    /// The driver's error; the registration is gone either way.
    fn deregister(self) -> VerbsResult<()>
    where
        Self: Sized;
}

/// A completion queue.
pub trait CompletionQueue: Send + Sync + fmt::Debug {
    /// Entries the CQ can hold (at least what was asked for).
    fn capacity(&self) -> u32;

    /// The cookie given at creation.
    fn cookie(&self) -> u64;

    /// Moves up to `out.len()` completions into `out`, oldest first; returns how many.
    /// Never blocks.
    ///
    /// # Errors
    /// [`VerbsError::CqOverrun`] once the CQ overflowed.
    fn poll(&self, out: &mut [WorkCompletion]) -> VerbsResult<usize>;

    /// Arms the CQ: the next completion added to it makes its channel readable (once).
    /// With `solicited_only`, only solicited receives and errors do.
    ///
    /// # Errors
    /// No channel bound, or driver error.
    fn req_notify(&self, solicited_only: bool) -> VerbsResult<()>;
}

/// A completion channel: a pollable file descriptor that becomes readable when an armed CQ
/// bound to it receives a completion.
///
/// Register `as_raw_fd()` with mio (`SourceFd`) or `poll(2)` for readability. After it fires,
/// call [`get_event`](Self::get_event) until `None` (this also acknowledges the events), then
/// re-arm and poll the CQs it named. Draining until `None` matters with edge-triggered
/// readiness (mio): the descriptor stays readable until every pending event is taken.
pub trait CompletionChannel: Send + Sync + fmt::Debug + AsRawFd + AsFd {
    /// Takes one pending event without blocking: the cookie of the CQ that fired, or `None`.
    ///
    /// # Errors
    /// OS or driver error.
    fn get_event(&self) -> VerbsResult<Option<u64>>;
}

/// An RC queue pair.
pub trait QueuePair: Send + Sync + fmt::Debug {
    /// The QP number (24 bits).
    fn qp_num(&self) -> u32;

    /// The current state (it may change under the caller: a failed work request moves the
    /// QP to `Err`).
    fn state(&self) -> QpState;

    /// Actual queue sizes.
    fn cap(&self) -> QpCap;

    /// Moves the QP to another state.
    ///
    /// # Errors
    /// [`VerbsError::InvalidTransition`], invalid attributes, or driver error.
    fn modify(&self, t: &QpTransition) -> VerbsResult<()>;

    /// Posts send work requests, in order. Allowed in RTS; in ERR the work requests are
    /// accepted and complete with `WrFlushErr`.
    ///
    /// Immediate errors (nothing posted from `index` on): more SGEs than `max_send_sge`,
    /// an inline payload above `max_inline_data` (or an inline SGE whose `lkey` does not
    /// cover it), the send queue full, or a state other than RTS/ERR.
    ///
    /// # Errors
    /// [`PostError`] naming the first work request not posted.
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError>;

    /// Posts receives, in order. Allowed from INIT on (in ERR they are flushed). Not allowed
    /// on a QP that uses an SRQ.
    ///
    /// # Errors
    /// [`PostError`] naming the first work request not posted.
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError>;
}

/// A shared receive queue: receives consumed by any QP created with it.
pub trait SharedReceiveQueue: Send + Sync + fmt::Debug {
    /// Posts receives, in order.
    ///
    /// # Errors
    /// [`PostError`] naming the first work request not posted.
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError>;
}

/// Checks the parts of a send work request every provider checks before posting it.
///
/// # Errors
/// [`VerbsError::TooManySge`] or [`VerbsError::InlineTooLarge`].
pub fn check_send_wr(wr: &SendWr<'_>, cap: &QpCap) -> VerbsResult<()> {
    if wr.sges.len() > cap.max_send_sge as usize {
        return Err(VerbsError::TooManySge { given: wr.sges.len(), max: cap.max_send_sge });
    }
    if wr.flags.contains(SendFlags::INLINE) {
        if matches!(wr.op, SendOp::RdmaRead { .. }) {
            return Err(VerbsError::InvalidArgument("RDMA_READ cannot be inline".into()));
        }
        let len: u64 = wr.sges.iter().map(|s| u64::from(s.len)).sum();
        if len > u64::from(cap.max_inline_data) {
            return Err(VerbsError::InlineTooLarge { len, max: cap.max_inline_data });
        }
    }
    Ok(())
}

/// Decodes the IB `min_rnr_timer` encoding into a delay.
pub fn rnr_timer_delay(code: u8) -> std::time::Duration {
    // IB spec table 45 ("RNR NAK timer field encoding"), in units of 10 µs.
    const UNITS_10US: [u32; 32] = [
        65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
        3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    std::time::Duration::from_micros(u64::from(UNITS_10US[(code & 31) as usize]) * 10)
}

/// Decodes the IB local ACK `timeout` (4.096 µs · 2^timeout).
pub fn ack_timeout(code: u8) -> std::time::Duration {
    std::time::Duration::from_nanos(4096u64 << u32::from(code.min(31)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_info_round_trips() {
        let info = QpEndpointInfo { qpn: 0xabcdef, psn: 0x123456, lid: 7, gid: Gid([9; 16]) };
        assert_eq!(QpEndpointInfo::decode(&info.encode()), Ok(info));
    }

    #[test]
    fn endpoint_info_rejects_bad_input() {
        let good = QpEndpointInfo { qpn: 1, psn: 2, lid: 3, gid: Gid::default() }.encode();
        assert_eq!(QpEndpointInfo::decode(&good[..31]), Err(EndpointDecodeError::Length(31)));
        let mut b = good;
        b[2] = 2;
        assert_eq!(QpEndpointInfo::decode(&b), Err(EndpointDecodeError::Version));
        let mut b = good;
        b[15] = 1;
        assert_eq!(QpEndpointInfo::decode(&b), Err(EndpointDecodeError::Reserved));
        let mut b = good;
        b[4] = 1;
        assert_eq!(QpEndpointInfo::decode(&b), Err(EndpointDecodeError::Range));
    }

    proptest::proptest! {
        #[test]
        fn endpoint_decode_is_total(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            if let Ok(info) = QpEndpointInfo::decode(&bytes) {
                proptest::prop_assert_eq!(&info.encode()[..], &bytes[..]);
            }
        }
    }

    #[test]
    fn transitions_follow_the_rc_state_machine() {
        let init = QpTransition::Init(InitAttr { port_num: 1, pkey_index: 0, access: AccessFlags::NONE });
        let rts = QpTransition::Rts(RtsAttr {
            sq_psn: 0,
            timeout: 1,
            retry_cnt: 1,
            rnr_retry: 1,
            max_rd_atomic: 1,
        });
        assert!(init.allowed_from(QpState::Reset));
        assert!(!rts.allowed_from(QpState::Reset));
        assert!(!rts.allowed_from(QpState::Init));
        assert!(QpTransition::Err.allowed_from(QpState::Rts));
        assert!(!init.allowed_from(QpState::Err));
    }

    #[test]
    fn status_numbering_matches_verbs() {
        assert_eq!(WcStatus::RnrRetryExcErr.as_raw(), 13);
        assert_eq!(WcStatus::from_raw(5), WcStatus::WrFlushErr);
        assert_eq!(WcStatus::from_raw(99), WcStatus::GeneralErr);
        for v in 0..22 {
            assert_eq!(WcStatus::from_raw(v).as_raw(), v);
        }
    }

    #[test]
    fn sge_and_inline_limits_are_checked() {
        let cap = QpCap { max_send_sge: 2, max_inline_data: 8, ..QpCap::default() };
        let sges = [Sge::new(0, 4, 1); 3];
        let wr = SendWr { wr_id: 0, op: SendOp::Send, sges: &sges[..2], flags: SendFlags::INLINE };
        assert!(check_send_wr(&wr, &cap).is_ok());
        let wr = SendWr { sges: &sges, ..wr };
        assert!(matches!(check_send_wr(&wr, &cap), Err(VerbsError::TooManySge { given: 3, max: 2 })));
        let big = [Sge::new(0, 9, 1)];
        let wr = SendWr { sges: &big, ..wr };
        assert!(matches!(check_send_wr(&wr, &cap), Err(VerbsError::InlineTooLarge { len: 9, max: 8 })));
    }

    #[test]
    fn timer_encodings() {
        assert_eq!(rnr_timer_delay(1), std::time::Duration::from_micros(10));
        assert_eq!(rnr_timer_delay(31), std::time::Duration::from_micros(491_520));
        assert_eq!(rnr_timer_delay(0), std::time::Duration::from_micros(655_360));
        assert_eq!(ack_timeout(0), std::time::Duration::from_nanos(4096));
    }
}
