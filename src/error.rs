//! Error types.
//!
//! Errors are classified by *who is at fault*, because callers react differently to each:
//! local misuse (a bug in the caller, never caused by peer data), a peer that violated the
//! protocol, a timeout, a cancellation, a lost peer, and local resource or OS failures.

use std::io;

use crate::addr::AddrError;
pub use crate::ib::verbs::{FabricError, PortState};
use crate::types::PeerId;
pub use crate::wire::WireError;

/// The result type used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong with an operation or a call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller used the API wrongly (unknown op id, zero-length exposure, ...).
    /// Never caused by data a peer sent.
    #[error("API misuse: {0}")]
    Misuse(String),
    /// A message or transfer is larger than the negotiated limit.
    #[error("{len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Requested size.
        len: u64,
        /// The limit in force.
        max: u64,
    },
    /// A receive buffer was too small for the message that matched it.
    #[error("message of {len} bytes does not fit the {capacity}-byte receive buffer")]
    Truncated {
        /// Size of the incoming message.
        len: u64,
        /// Capacity of the posted buffer.
        capacity: u64,
    },
    /// An address could not be parsed or resolved.
    #[error(transparent)]
    Addr(#[from] AddrError),
    /// The peer sent something the protocol does not allow; the connection was closed.
    #[error("peer {peer:?} violated the protocol: {reason}")]
    Protocol {
        /// The offending peer, when known.
        peer: Option<PeerId>,
        /// What was wrong.
        reason: ProtocolError,
    },
    /// The operation's deadline passed before it completed.
    #[error("operation timed out")]
    Timeout,
    /// The operation was cancelled locally.
    #[error("operation cancelled")]
    Cancelled,
    /// The peer cancelled its side of a transfer this operation was matched with.
    #[error("the peer cancelled the transfer")]
    PeerCancelled,
    /// The connection to the peer failed; every operation addressed to it fails once with this.
    #[error("peer {peer:?} lost: {reason}")]
    PeerLost {
        /// The peer.
        peer: PeerId,
        /// Why the connection was dropped.
        reason: String,
    },
    /// The handshake failed authentication (missing or wrong cluster key).
    #[error("authentication failed: {0}")]
    Auth(String),
    /// The target refused a one-sided access (bad key, out of bounds, missing access right,
    /// revoked exposure).
    #[error("remote access denied: {0}")]
    RemoteAccess(AccessError),
    /// The peer processed the request and reported a failure.
    #[error("peer reported failure: {0}")]
    Remote(String),
    /// The peer processed the request and reported a failure with an application status
    /// (see [`Request::reply_status`](crate::Request::reply_status)).
    #[error("peer reported failure {status}: {reason}")]
    RemoteStatus {
        /// The application's status code.
        status: u16,
        /// The message it gave.
        reason: String,
    },
    /// A configured resource limit was reached (connections, buffers, queue depth).
    #[error("resource limit reached: {0}")]
    Exhausted(String),
    /// The feature or transport is not available in this build or on this machine.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The RDMA device, port or GID selected (by [`crate::IbConfig`], `IONET_IB_DEVICE` or the
    /// address) does not exist or cannot carry traffic.
    #[error(transparent)]
    Fabric(FabricError),
    /// The endpoint was shut down.
    #[error("endpoint closed")]
    Closed,
    /// An operating-system error.
    #[error("I/O error: {0}")]
    Io(io::Error),
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

impl Error {
    /// Shorthand for [`Error::Misuse`].
    pub fn misuse(msg: impl Into<String>) -> Self {
        Error::Misuse(msg.into())
    }

    /// True for errors caused by the peer or the network rather than by the caller.
    pub fn is_peer_fault(&self) -> bool {
        matches!(
            self,
            Error::Protocol { .. }
                | Error::PeerLost { .. }
                | Error::PeerCancelled
                | Error::Auth(_)
                | Error::Remote(_)
                | Error::RemoteStatus { .. }
        )
    }

    /// A copy of this error for fanning out to several operations. `Io` errors keep their kind
    /// and message.
    pub fn duplicate(&self) -> Error {
        match self {
            Error::Misuse(s) => Error::Misuse(s.clone()),
            Error::TooLarge { len, max } => Error::TooLarge { len: *len, max: *max },
            Error::Truncated { len, capacity } => Error::Truncated { len: *len, capacity: *capacity },
            Error::Addr(e) => Error::Addr(e.clone()),
            Error::Protocol { peer, reason } => Error::Protocol { peer: *peer, reason: reason.clone() },
            Error::Timeout => Error::Timeout,
            Error::Cancelled => Error::Cancelled,
            Error::PeerCancelled => Error::PeerCancelled,
            Error::PeerLost { peer, reason } => Error::PeerLost { peer: *peer, reason: reason.clone() },
            Error::Auth(s) => Error::Auth(s.clone()),
            Error::RemoteAccess(a) => Error::RemoteAccess(*a),
            Error::Remote(s) => Error::Remote(s.clone()),
            Error::RemoteStatus { status, reason } => {
                Error::RemoteStatus { status: *status, reason: reason.clone() }
            }
            Error::Exhausted(s) => Error::Exhausted(s.clone()),
            Error::Unsupported(s) => Error::Unsupported(s.clone()),
            Error::Fabric(f) => Error::Fabric(f.clone()),
            Error::Closed => Error::Closed,
            Error::Io(e) => Error::Io(io::Error::new(e.kind(), e.to_string())),
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match &e {
            Error::Io(e) => e.kind(),
            Error::Timeout => io::ErrorKind::TimedOut,
            Error::PeerLost { .. } | Error::Closed => io::ErrorKind::ConnectionAborted,
            Error::Auth(_) | Error::RemoteAccess(_) => io::ErrorKind::PermissionDenied,
            Error::Misuse(_) | Error::TooLarge { .. } => io::ErrorKind::InvalidInput,
            Error::Protocol { .. } | Error::Truncated { .. } => io::ErrorKind::InvalidData,
            Error::Unsupported(_) => io::ErrorKind::Unsupported,
            Error::Fabric(_) => io::ErrorKind::NotFound,
            Error::Exhausted(_) => io::ErrorKind::OutOfMemory,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// A protocol violation by a peer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// A frame failed to decode.
    #[error("malformed frame: {0}")]
    Wire(WireError),
    /// A frame arrived that is not valid in the current state (e.g. data for an unknown
    /// transfer, a second handshake).
    #[error("unexpected {what}")]
    Unexpected {
        /// Description of the frame and the state.
        what: String,
    },
    /// The peer exceeded a limit it agreed to (credits, unexpected bytes, message size).
    #[error("flow-control violation: {0}")]
    FlowControl(String),
    /// The handshake was malformed or carried an incompatible version.
    #[error("bad handshake: {0}")]
    Handshake(String),
}

impl From<WireError> for ProtocolError {
    fn from(e: WireError) -> Self {
        ProtocolError::Wire(e)
    }
}

/// Why a one-sided access was refused by its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AccessError {
    /// No exposure with that key (never existed, or revoked).
    #[error("unknown or revoked memory key")]
    BadKey,
    /// The range is not inside the exposed region.
    #[error("range outside the exposed region")]
    OutOfBounds,
    /// The exposure does not grant the access (read or write) requested.
    #[error("exposure lacks the requested access right")]
    NoPermission,
}

impl AccessError {
    /// Wire code (stable).
    pub fn code(self) -> u8 {
        match self {
            AccessError::BadKey => 1,
            AccessError::OutOfBounds => 2,
            AccessError::NoPermission => 3,
        }
    }

    /// Decodes a wire code.
    pub fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => AccessError::BadKey,
            2 => AccessError::OutOfBounds,
            3 => AccessError::NoPermission,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn an_error_says_its_cause_once() {
        // The cause is in the message and not handed on as `source()` as well, so a chain
        // reporter (anyhow's `{:#}`) does not print it twice.
        let e = Error::from(io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(e.to_string(), "I/O error: No such file or directory (os error 2)");
        assert!(e.source().is_none());
        let w = WireError::UnknownKind(200);
        let p = ProtocolError::from(w.clone());
        assert_eq!(p.to_string(), format!("malformed frame: {w}"));
        assert!(p.source().is_none());
    }
}
