//! The envelope codec: the [`Message`] and [`Reply`] traits, [`Envelope`], [`encode`],
//! [`decode`], and the [`ErrorReply`] a failure is answered with.

use super::bounded::BoundedString;
use super::error::{DecodeError, ProtoError};
use super::limits::{HEADER_LEN, MAGIC, MAX_ERROR_TEXT, MAX_MESSAGE, PROTO_VERSION};
use crate::errno::Errno;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A message body type: its kind byte and its semantic checks.
pub trait Message: Serialize + DeserializeOwned + fmt::Debug {
    /// The kind byte in the header.
    const KIND: u8;
    /// Checks limits and values beyond what the bounded types enforce.
    fn validate(&self) -> Result<(), ProtoError>;
}

/// A reply type, which can carry an error.
pub trait Reply: Message {
    /// The error variant.
    fn from_error(e: ErrorReply) -> Self;
}

/// An error reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    /// What kind of failure.
    pub code: Errno,
    /// Human-readable detail (for logs, not for matching).
    pub message: BoundedString<MAX_ERROR_TEXT>,
}

impl ErrorReply {
    /// An error reply, its text cut to [`MAX_ERROR_TEXT`] bytes.
    pub fn new(code: Errno, message: impl fmt::Display) -> Self {
        ErrorReply { code, message: BoundedString::truncating(&message.to_string()) }
    }
}

impl From<&ProtoError> for ErrorReply {
    fn from(e: &ProtoError) -> Self {
        ErrorReply::new(e.errno(), e)
    }
}

/// A message with its protocol version and request id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope<T> {
    /// Protocol version ([`PROTO_VERSION`] for everything this build sends).
    pub version: u16,
    /// Request id: a reply carries its request's id.
    pub id: u64,
    /// The message.
    pub body: T,
}

impl<T> Envelope<T> {
    /// A message of the current protocol version.
    pub fn new(id: u64, body: T) -> Self {
        Envelope { version: PROTO_VERSION, id, body }
    }
}

/// Encodes a message: header then postcard body. Refuses bodies that would not pass the peer's
/// [`Message::validate`] and messages over [`MAX_MESSAGE`].
pub fn encode<T: Message>(env: &Envelope<T>) -> Result<Vec<u8>, ProtoError> {
    env.body.validate()?;
    // Room for an I/O request with its capability and a short descriptor: no regrowth.
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&env.version.to_le_bytes());
    out.push(T::KIND);
    out.extend_from_slice(&env.id.to_le_bytes());
    let out = postcard::to_extend(&env.body, out).map_err(|e| ProtoError::Encode(e.to_string()))?;
    if out.len() > MAX_MESSAGE {
        return Err(ProtoError::TooLarge { len: out.len(), max: MAX_MESSAGE });
    }
    Ok(out)
}

/// Decodes and validates a message of type `T`.
pub fn decode<T: Message>(bytes: &[u8]) -> Result<Envelope<T>, DecodeError> {
    let fail = |id, error| DecodeError { id, error };
    if bytes.len() > MAX_MESSAGE {
        // Read the id anyway, so the error reply can name the request.
        let id = bytes.get(7..HEADER_LEN).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
        return Err(fail(id, ProtoError::TooLarge { len: bytes.len(), max: MAX_MESSAGE }));
    }
    let (header, body) =
        bytes.split_at_checked(HEADER_LEN).ok_or(fail(None, ProtoError::Truncated(bytes.len())))?;
    let mut magic = [0u8; 4];
    magic.copy_from_slice(&header[0..4]);
    let version = u16::from_le_bytes([header[4], header[5]]);
    let kind = header[6];
    let mut idb = [0u8; 8];
    idb.copy_from_slice(&header[7..15]);
    let id = u64::from_le_bytes(idb);
    if magic != MAGIC {
        return Err(fail(None, ProtoError::BadMagic(magic)));
    }
    if version != PROTO_VERSION {
        return Err(fail(Some(id), ProtoError::UnknownVersion { got: version }));
    }
    if kind != T::KIND {
        return Err(fail(Some(id), ProtoError::WrongKind { got: kind, want: T::KIND }));
    }
    let (msg, rest) = postcard::take_from_bytes::<T>(body)
        .map_err(|e| fail(Some(id), ProtoError::Malformed(e.to_string())))?;
    if !rest.is_empty() {
        return Err(fail(Some(id), ProtoError::TrailingBytes(rest.len())));
    }
    msg.validate().map_err(|e| fail(Some(id), e))?;
    Ok(Envelope { version, id, body: msg })
}

/// The reply a server sends for a message it could not decode.
pub fn error_reply<R: Reply>(err: &DecodeError) -> Envelope<R> {
    Envelope::new(err.id.unwrap_or(0), R::from_error(ErrorReply::from(&err.error)))
}
