//! Failures of verbs calls, as opposed to those of work requests (a [`WcStatus`] in the
//! completion), and how they become the crate's [`Error`].

use std::io;

#[cfg(doc)]
use super::WcStatus;
use super::{LinkLayer, PortState, QpState};
use crate::error::Error;

/// Result of a verbs call.
pub type VerbsResult<T> = std::result::Result<T, VerbsError>;

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
    /// The device, port, GID or route asked for does not exist or cannot be used.
    #[error(transparent)]
    Fabric(#[from] FabricError),
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

/// Why a device, port, GID or route cannot be used: selecting what to open, checking it, and
/// the attributes of a route that the port refuses. Each names the device and port.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// No device of that name.
    #[error("no RDMA device named {name:?} (devices present: {})", list(available))]
    NoSuchDevice {
        /// The name asked for.
        name: String,
        /// The devices the provider lists.
        available: Vec<String>,
    },
    /// The device has no such port.
    #[error("{device} has no port {port} (its ports are 1..={ports})")]
    NoSuchPort {
        /// Device name.
        device: String,
        /// The port asked for.
        port: u8,
        /// Number of physical ports.
        ports: u8,
    },
    /// The port exists but does not carry traffic.
    #[error("port {port} of {device} is {state:?}, not Active (link down or no subnet manager?)")]
    PortNotActive {
        /// Device name.
        device: String,
        /// Port.
        port: u8,
        /// Its logical state.
        state: PortState,
    },
    /// The GID index is past the table or names an empty entry.
    #[error("GID index {index} of port {port} of {device} does not exist: {reason}")]
    NoSuchGid {
        /// Device name.
        device: String,
        /// Port.
        port: u8,
        /// The index asked for.
        index: u32,
        /// Past the table (and its size), or an empty entry.
        reason: String,
    },
    /// An Ethernet (RoCE) port whose GID table has no RoCE entry to route with.
    #[error(
        "port {port} of {device} has an Ethernet link layer but no usable RoCE GID (no IP address on its netdev?)"
    )]
    NoRoceGid {
        /// Device name.
        device: String,
        /// Port.
        port: u8,
    },
    /// A route on an Ethernet (RoCE) port without a global route header: RoCE has no LIDs,
    /// every packet is addressed by GID.
    #[error("port {port} of {device} has an Ethernet link layer: the route needs a GRH (a source GID index)")]
    GrhRequired {
        /// Device name.
        device: String,
        /// Port.
        port: u8,
    },
    /// A path MTU above the port's active MTU.
    #[error("path MTU {requested} B exceeds the active MTU {active} B of port {port} of {device}")]
    MtuAbovePort {
        /// Device name.
        device: String,
        /// Port.
        port: u8,
        /// Bytes asked for.
        requested: u32,
        /// The port's active MTU in bytes.
        active: u32,
    },
    /// The two ends of a connection sit on different link layers (InfiniBand and Ethernet).
    #[error("link layers differ: this end's port is {local:?}, the peer's is {remote:?}")]
    LinkLayerMismatch {
        /// Our port's.
        local: LinkLayer,
        /// The peer's.
        remote: LinkLayer,
    },
}

fn list(names: &[String]) -> String {
    if names.is_empty() { "none".into() } else { names.join(", ") }
}

impl From<VerbsError> for Error {
    fn from(e: VerbsError) -> Error {
        match e {
            VerbsError::Fabric(f) => Error::Fabric(f),
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
