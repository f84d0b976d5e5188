//! Messages to and from the io servers: [`IoRequest`] with the [`Descriptor`] of the bytes
//! a read or write touches, [`IoReply`], and their checks.

use super::bounded::BoundedVec;
use super::envelope::{ErrorReply, Message, Reply};
use super::error::ProtoError;
use super::limits::{MAX_BATCH, MAX_IO_BYTES, MAX_PIECES, MAX_VIEW_BLOCKS};
use super::stats::{ServerStats, ServerStatus};
use crate::capability::{Capability, Rights};
use crate::layout::{Layout, LayoutError, Piece, View};
use serde::{Deserialize, Serialize};

/// Which local bytes a read or write touches, in stream order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Descriptor {
    /// Local pieces, as computed by the client ([`crate::layout::ServerPieces::pieces`]).
    List(BoundedVec<Piece, MAX_PIECES>),
    /// View range `[pos, pos + len)` of a strided view over the file; the server intersects it
    /// with its own stripe units ([`Layout::server_pieces`]), so the descriptor stays O(1) for
    /// any number of blocks (PVFS1's strided `RW` request).
    Strided {
        /// The file's layout.
        layout: Layout,
        /// This server's relative index.
        pnum: u32,
        /// The view.
        view: View,
        /// First view byte.
        pos: u64,
        /// View bytes (all servers together).
        len: u64,
    },
}

impl Descriptor {
    /// A list descriptor, refusing more than [`MAX_PIECES`] pieces.
    pub fn list(pieces: Vec<Piece>) -> Result<Self, ProtoError> {
        Ok(Descriptor::List(BoundedVec::new(pieces)?))
    }

    /// The local pieces in stream order (coalesced for the strided form).
    pub fn pieces(&self) -> Box<dyn Iterator<Item = Piece> + '_> {
        match self {
            Descriptor::List(v) => Box::new(v.iter().copied()),
            Descriptor::Strided { layout, pnum, view, pos, len } => {
                // Validated views never fail here; an invalid one yields nothing.
                let ex = view.extents(*pos, *len).into_iter().flatten();
                Box::new(layout.server_pieces(*pnum, ex))
            }
        }
    }

    /// Total bytes in this server's stream (saturating; validated descriptors never saturate).
    pub fn total(&self) -> u64 {
        self.pieces().fold(0u64, |a, p| a.saturating_add(p.len))
    }

    /// The stream's bytes up to its last one below local offset `size`: the part of a read of
    /// an object `size` bytes long that holds data (with any holes inside it); past it the
    /// stream is all beyond the object's end.
    pub fn stream_below(&self, size: u64) -> u64 {
        let (mut at, mut end) = (0u64, 0u64);
        for p in self.pieces() {
            if p.off < size {
                end = at.saturating_add(p.len.min(size - p.off));
            }
            at = at.saturating_add(p.len);
        }
        end
    }

    fn validate(&self) -> Result<(), ProtoError> {
        match self {
            Descriptor::List(v) => {
                let mut total = 0u64;
                for p in v.iter() {
                    p.end().ok_or(LayoutError::Overflow)?;
                    total = total.checked_add(p.len).ok_or(LayoutError::Overflow)?;
                }
                if total > MAX_IO_BYTES {
                    return Err(ProtoError::Limit { what: "I/O bytes", got: total, max: MAX_IO_BYTES });
                }
            }
            Descriptor::Strided { layout, pnum, view, pos, len } => {
                Layout::new(layout.base, layout.pcount, layout.ssize)?;
                if *pnum >= layout.pcount {
                    return Err(ProtoError::Invalid("pnum"));
                }
                if *len > MAX_IO_BYTES {
                    return Err(ProtoError::Limit { what: "I/O bytes", got: *len, max: MAX_IO_BYTES });
                }
                view.extents(*pos, *len)?;
                let blocks = view.blocks_spanned(*pos, *len);
                if !view.is_contiguous() && blocks > MAX_VIEW_BLOCKS {
                    return Err(ProtoError::Limit { what: "view blocks", got: blocks, max: MAX_VIEW_BLOCKS });
                }
            }
        }
        Ok(())
    }
}

/// Client or meta server → io server. Every request carries a capability for its handle; the
/// server checks it (signature, handle, rights, expiry) before touching anything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum IoRequest {
    /// Liveness → [`IoReply::Pong`].
    Ping,
    /// Create the local object (meta server, `ADMIN`) → [`IoReply::Done`].
    CreateObject {
        /// Capability for the handle.
        cap: Capability,
    },
    /// Remove the local object (meta server, `ADMIN`) → [`IoReply::Done`].
    RemoveObject {
        /// Capability for the handle.
        cap: Capability,
    },
    /// Set the local size (meta server, `ADMIN`) → [`IoReply::Done`].
    TruncateObject {
        /// Capability for the handle.
        cap: Capability,
        /// New local size ([`Layout::local_size`]).
        size: u64,
    },
    /// Local size (`READ`) → [`IoReply::Size`].
    GetSize {
        /// Capability for the handle.
        cap: Capability,
    },
    /// Read (`READ`) → [`IoReply::Read`], then the data stream.
    Read {
        /// Capability for the handle.
        cap: Capability,
        /// What to read.
        desc: Descriptor,
    },
    /// Write (`WRITE`); the data stream follows → [`IoReply::Written`]. On a disk error the
    /// server still consumes the whole stream, then replies with the error, so the connection
    /// stays in sync (PVFS1's ENOSPC drain).
    Write {
        /// Capability for the handle.
        cap: Capability,
        /// Where the data goes.
        desc: Descriptor,
    },
    /// fsync the local object (any capability for the handle) → [`IoReply::Done`].
    Sync {
        /// Capability for the handle.
        cap: Capability,
    },
    /// Server counters → [`IoReply::Stats`].
    Stats,
    /// The server's version, uptime, load and space → [`IoReply::Status`].
    Status,
    /// Reserve disk space for the local bytes `[off, off + len)` and make the object at least
    /// `off + len` long, never shorter (`WRITE`; a client's `posix_fallocate`) →
    /// [`IoReply::Done`].
    Allocate {
        /// Capability for the handle.
        cap: Capability,
        /// First local byte.
        off: u64,
        /// Bytes from it.
        len: u64,
    },
    /// Local sizes of several objects, each with its own capability (`NONE` suffices; a
    /// listing's) → [`IoReply::Sizes`].
    GetSizes {
        /// A capability for each object, at most [`MAX_BATCH`].
        caps: BoundedVec<Capability, MAX_BATCH>,
    },
    /// Create several local objects, durable together (meta server, each capability `ADMIN`)
    /// → [`IoReply::Done`] once all are; any capability refused refuses the batch.
    CreateObjects {
        /// A capability for each object, at most [`MAX_BATCH`].
        caps: BoundedVec<Capability, MAX_BATCH>,
    },
    /// Free the disk space of the local bytes `[off, off + len)`, which then read as zeros,
    /// keeping the size (`WRITE`; a client's `fallocate` with `FALLOC_FL_PUNCH_HOLE`) →
    /// [`IoReply::Done`].
    Punch {
        /// Capability for the handle.
        cap: Capability,
        /// First local byte.
        off: u64,
        /// Bytes from it.
        len: u64,
    },
    /// The first local byte at or after `off` that holds data, or with `hole` the first in a
    /// hole (`lseek`'s `SEEK_DATA` and `SEEK_HOLE` on the object; `READ`) → [`IoReply::Seek`].
    Seek {
        /// Capability for the handle.
        cap: Capability,
        /// Local offset to look from.
        off: u64,
        /// Look for a hole instead of data.
        hole: bool,
    },
}

impl IoRequest {
    /// The request's kind, for logs: `read`, `write`, `create_object`, ….
    pub fn kind(&self) -> &'static str {
        match self {
            IoRequest::Ping => "ping",
            IoRequest::CreateObject { .. } => "create_object",
            IoRequest::RemoveObject { .. } => "remove_object",
            IoRequest::TruncateObject { .. } => "truncate_object",
            IoRequest::GetSize { .. } => "get_size",
            IoRequest::Read { .. } => "read",
            IoRequest::Write { .. } => "write",
            IoRequest::Sync { .. } => "sync",
            IoRequest::Stats => "stats",
            IoRequest::Status => "status",
            IoRequest::Allocate { .. } => "allocate",
            IoRequest::GetSizes { .. } => "get_sizes",
            IoRequest::CreateObjects { .. } => "create_objects",
            IoRequest::Seek { .. } => "seek",
            IoRequest::Punch { .. } => "punch",
        }
    }

    /// The data a read or write moves, for logs: the first piece's object offset and the
    /// stream's length.
    pub fn extent(&self) -> Option<(u64, u64)> {
        match self {
            IoRequest::Read { desc, .. } | IoRequest::Write { desc, .. } => {
                Some((desc.pieces().next().map_or(0, |p| p.off), desc.total()))
            }
            IoRequest::Allocate { off, len, .. } | IoRequest::Punch { off, len, .. } => Some((*off, *len)),
            _ => None,
        }
    }

    /// The capability, for requests on an object.
    pub fn cap(&self) -> Option<&Capability> {
        match self {
            IoRequest::CreateObject { cap }
            | IoRequest::RemoveObject { cap }
            | IoRequest::TruncateObject { cap, .. }
            | IoRequest::GetSize { cap }
            | IoRequest::Read { cap, .. }
            | IoRequest::Write { cap, .. }
            | IoRequest::Sync { cap }
            | IoRequest::Allocate { cap, .. }
            | IoRequest::Seek { cap, .. }
            | IoRequest::Punch { cap, .. } => Some(cap),
            // Each of a batch's capabilities is checked on its own.
            IoRequest::Ping
            | IoRequest::Stats
            | IoRequest::Status
            | IoRequest::GetSizes { .. }
            | IoRequest::CreateObjects { .. } => None,
        }
    }

    /// The rights the request needs from its capability.
    pub fn needed_rights(&self) -> Rights {
        match self {
            IoRequest::CreateObject { .. }
            | IoRequest::CreateObjects { .. }
            | IoRequest::RemoveObject { .. }
            | IoRequest::TruncateObject { .. } => Rights::ADMIN,
            // Where a file's data lies tells of its contents (which parts are zeros).
            IoRequest::Read { .. } | IoRequest::Seek { .. } => Rights::READ,
            IoRequest::Write { .. } | IoRequest::Allocate { .. } | IoRequest::Punch { .. } => Rights::WRITE,
            // A size is an attribute: whoever may stat a file may learn it, and a capability
            // for the file (even one granting nothing else) shows the meta server let them.
            // Making written bytes durable changes nothing a reader sees, and Linux syncs a
            // descriptor opened for reading alike.
            IoRequest::Sync { .. }
            | IoRequest::GetSize { .. }
            | IoRequest::GetSizes { .. }
            | IoRequest::Ping
            | IoRequest::Stats
            | IoRequest::Status => Rights::NONE,
        }
    }
}

/// io server → client or meta server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum IoReply {
    /// Answer to [`IoRequest::Ping`].
    Pong,
    /// Success with nothing to return.
    Done,
    /// The object's local size and space.
    Size(ObjectSize),
    /// A read: the first `bytes` of the request's stream were pushed (holes inside them read
    /// as zeros); the rest of it lies past the object's end, and the client zeroes it.
    Read {
        /// Stream bytes pushed, from the start of the stream.
        bytes: u64,
        /// The object's local size when read, so the client can tell a hole from EOF.
        local_size: u64,
    },
    /// A write finished.
    Written {
        /// Bytes written.
        bytes: u64,
    },
    /// Server counters.
    Stats(ServerStats),
    /// Failure.
    Error(ErrorReply),
    /// The io server's status.
    Status(ServerStatus),
    /// Answer to [`IoRequest::GetSizes`], in its order: each object's local size and space, or
    /// `None` where its capability was refused or this server has no object for it.
    Sizes(BoundedVec<Option<ObjectSize>, MAX_BATCH>),
    /// Answer to [`IoRequest::Seek`].
    Seek {
        /// The local offset found: data (`None` if there is none at or after the offset asked
        /// from), or a hole (the local size where the data goes on to the end; the offset
        /// asked from if that is past the end).
        at: Option<u64>,
        /// The object's local size when asked.
        local_size: u64,
    },
}

/// An object's local size, and the disk space it holds: less than the size where it has holes
/// (a sparse file), more by the file system's block rounding or space reserved ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ObjectSize {
    /// The local size ([`Layout::local_size`]).
    pub size: u64,
    /// Bytes of disk space allocated to the object (its `st_blocks` × 512).
    pub allocated: u64,
}

impl Message for IoRequest {
    const KIND: u8 = 3;
    fn validate(&self) -> Result<(), ProtoError> {
        match self {
            IoRequest::Read { desc, .. } | IoRequest::Write { desc, .. } => desc.validate(),
            IoRequest::Allocate { off, len, .. } | IoRequest::Punch { off, len, .. }
                if *len == 0 || off.checked_add(*len).is_none() =>
            {
                Err(ProtoError::Invalid("allocation range"))
            }
            IoRequest::Seek { off, .. } if i64::try_from(*off).is_err() => {
                Err(ProtoError::Invalid("seek offset"))
            }
            _ => Ok(()),
        }
    }
}

impl Message for IoReply {
    const KIND: u8 = 4;
    fn validate(&self) -> Result<(), ProtoError> {
        match self {
            IoReply::Read { bytes, .. } | IoReply::Written { bytes } if *bytes > MAX_IO_BYTES => {
                Err(ProtoError::Limit { what: "I/O bytes", got: *bytes, max: MAX_IO_BYTES })
            }
            _ => Ok(()),
        }
    }
}

impl Reply for IoReply {
    fn from_error(e: ErrorReply) -> Self {
        IoReply::Error(e)
    }
}
