//! Why a message is refused: [`ProtoError`], and [`DecodeError`] with the request id it
//! belongs to.

use super::limits::PROTO_VERSION;
use crate::errno::Errno;
use crate::layout::LayoutError;

/// Why a message was refused. Every variant is caused by the peer's bytes (or, for
/// [`ProtoError::Encode`], by a message we refuse to send).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    /// Over [`MAX_MESSAGE`](super::limits::MAX_MESSAGE).
    #[error("message of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// Its size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Shorter than the fixed header.
    #[error("message of {0} bytes is shorter than the header")]
    Truncated(usize),
    /// Not a stripefs message.
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    /// A protocol version this build does not speak.
    #[error("unsupported protocol version {got} (this build speaks {PROTO_VERSION})")]
    UnknownVersion {
        /// The peer's version.
        got: u16,
    },
    /// A message of another kind (e.g. a reply sent to a server).
    #[error("message kind {got} where kind {want} was expected")]
    WrongKind {
        /// The kind in the header.
        got: u8,
        /// The kind expected.
        want: u8,
    },
    /// The body does not decode.
    #[error("malformed body: {0}")]
    Malformed(String),
    /// Bytes left after the body.
    #[error("{0} trailing bytes after the body")]
    TrailingBytes(usize),
    /// A list, string or size over its limit.
    #[error("{what}: {got} exceeds the limit of {max}")]
    Limit {
        /// What was over.
        what: &'static str,
        /// Its value.
        got: u64,
        /// The limit.
        max: u64,
    },
    /// A field with an impossible value.
    #[error("invalid {0}")]
    Invalid(&'static str),
    /// A layout or view that does not make sense.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// Our own message could not be encoded (never caused by peer data).
    #[error("encode failed: {0}")]
    Encode(String),
}

impl ProtoError {
    /// The code sent back to the peer.
    pub fn errno(&self) -> Errno {
        match self {
            ProtoError::TooLarge { .. } => Errno::EMSGSIZE,
            ProtoError::UnknownVersion { .. } => Errno::EPROTONOSUPPORT,
            ProtoError::Limit { .. } | ProtoError::Invalid(_) | ProtoError::Layout(_) => Errno::EINVAL,
            _ => Errno::EPROTO,
        }
    }
}

/// A decode failure, with the request id when the header was readable, so the error reply can
/// be matched to the request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{error}")]
pub struct DecodeError {
    /// The request id from the header, if it could be read.
    pub id: Option<u64>,
    /// What went wrong.
    pub error: ProtoError,
}
