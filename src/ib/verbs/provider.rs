//! The provider traits the engine is generic over — [`Provider`], [`Verbs`] and the objects a
//! device context creates — with the provider's counters and the checks and encodings every
//! provider shares.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd};

use super::{
    AccessFlags, DeviceAttr, DeviceInfo, GidEntry, PortAttr, PostError, QpCap, QpInit, QpState, QpTransition,
    RecvWr, SendFlags, SendOp, SendWr, SrqAttr, VerbsError, VerbsResult, WorkCompletion,
};

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
    /// host CPU. Software provider only; wall time, so a thread preempted inside it is counted
    /// too. `None` on hardware: the HCA's time is not host time and is not measured.
    pub device_ns: Option<u64>,
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
    /// RNR retries this context's QPs made. `None` where the provider cannot count them per
    /// context: verbs has no such counter, and an HCA retries without telling the host — see
    /// [`PortCounters::rnr_nak_retries`] for the port's count.
    pub rnr_retries: Option<u64>,
}

/// Error and retry counters of a port, as the device keeps them (the kernel's
/// `/sys/class/infiniband/<dev>/ports/<port>/{hw_counters,counters}` on hardware). They count
/// every queue pair on the port, of every process, since the driver loaded: compare two
/// readings. Each is `None` when the device does not expose it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PortCounters {
    /// RNR NAKs received and retried (`hw_counters/rnr_nak_retry_err`).
    pub rnr_nak_retries: Option<u64>,
    /// Local ACK timeouts: transport retries of a requester (`hw_counters/local_ack_timeout_err`).
    pub ack_timeouts: Option<u64>,
    /// Packets received out of sequence (`hw_counters/out_of_sequence`).
    pub out_of_sequence: Option<u64>,
    /// Packets received with errors (`counters/port_rcv_errors`).
    pub rcv_errors: Option<u64>,
    /// Outbound packets discarded (`counters/port_xmit_discards`).
    pub xmit_discards: Option<u64>,
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
    /// [`VerbsError::NoDevice`],
    /// [`FabricError::NoSuchDevice`](super::FabricError::NoSuchDevice), or the OS error.
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
    /// [`FabricError::NoSuchPort`](super::FabricError::NoSuchPort), or the driver's error.
    fn port_attr(&self, port: u8) -> VerbsResult<PortAttr>;

    /// Entry `index` of the port's GID table, with its type.
    ///
    /// # Errors
    /// [`FabricError::NoSuchGid`](super::FabricError::NoSuchGid) for an index past the table
    /// or an empty entry, [`FabricError::NoSuchPort`](super::FabricError::NoSuchPort), or the
    /// driver's error.
    fn gid_entry(&self, port: u8, index: u32) -> VerbsResult<GidEntry>;

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

    /// The port's error and retry counters.
    ///
    /// # Errors
    /// [`FabricError::NoSuchPort`](super::FabricError::NoSuchPort).
    fn port_counters(&self, port: u8) -> VerbsResult<PortCounters>;
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
