//! Wire messages between clients, the meta server and the io servers.
//!
//! Every message travels in an [`Envelope`]: a fixed 15-byte header — magic `"STFS"`, protocol
//! version (`u16` LE), message kind (`u8`), request id (`u64` LE) — followed by the body encoded
//! with [postcard](https://docs.rs/postcard) (serde; a documented, stable, compact varint format).
//! The header is fixed-size and independent of postcard so a peer can always read the version and
//! the request id, and answer a message it cannot decode with a typed error reply.
//!
//! Decoding is bounded before anything is allocated: the input must be at most [`MAX_MESSAGE`]
//! bytes, every list is a [`BoundedVec`] and every string a [`BoundedString`] whose deserializer
//! refuses an over-long length prefix before reserving memory, trailing bytes are refused, and
//! [`Message::validate`] then checks the semantic limits (I/O sizes, stripe parameters, …).
//! Nothing a peer sends can make [`decode`] panic; every failure is a [`ProtoError`] that maps to
//! an errno-like code via [`ProtoError::errno`] and an error reply via [`Reply::from_error`].
//!
//! Bulk data is never inside these messages: a read reply or a write request is followed by its
//! data stream (the server's pieces concatenated, in logical order, no per-piece headers), moved
//! by the transport as a separate payload.

mod attr;
mod bounded;
mod envelope;
mod error;
mod io;
mod limits;
mod meta;
mod name;
mod samples;
mod stats;

pub use crate::handle::Handle;
pub use attr::{Attr, Cred, DirEntry, FileKind, LayoutSpec, MAX_GROUPS, SetAttr, SetTime, Timestamp};
pub use bounded::{BoundedString, BoundedVec};
pub use envelope::{Envelope, ErrorReply, Message, Reply, decode, encode, error_reply};
pub use error::{DecodeError, ProtoError};
pub use io::{Descriptor, IoReply, IoRequest, ObjectSize};
pub use limits::{
    HEADER_LEN, MAGIC, MAX_BATCH, MAX_ERROR_TEXT, MAX_IO_BYTES, MAX_LINK_TARGET, MAX_MESSAGE, MAX_NAME_WIRE,
    MAX_PIECES, MAX_READDIR, MAX_VERSION_TEXT, MAX_VIEW_BLOCKS, PROTO_VERSION,
};
pub(crate) use meta::DIR_ENTRY_ORDER;
pub use meta::{AttrOf, MetaCall, MetaReply, MetaRequest};
pub use name::{LinkTarget, NAME_MAX, Name, NameError, link_target_ok, validate_name};
pub use samples::{fuzz_one, sample_messages};
pub use stats::{DiskSpace, Fallbacks, FsStats, PathStats, ServerStats, ServerStatus};

#[cfg(test)]
mod tests;
