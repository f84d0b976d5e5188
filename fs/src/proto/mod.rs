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

use crate::capability::{Capability, Rights};
use crate::errno::Errno;
use crate::layout::{Extent, Layout, LayoutError, MAX_PCOUNT, MAX_SSIZE, Piece, View};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Protocol version this build speaks (2: io servers' counters carry their disk space;
/// 3: symbolic links; 4: status requests to every server; 5: callers' credentials, hard
/// links, special files, times set to the server's clock, space allocation; 6: io servers'
/// counters carry the bytes they wrote behind).
pub const PROTO_VERSION: u16 = 6;

/// First four bytes of every message.
pub const MAGIC: [u8; 4] = *b"STFS";

/// Size of the fixed header: magic, version, kind, request id.
pub const HEADER_LEN: usize = 4 + 2 + 1 + 8;

/// Largest encoded message, header included: 128 KiB. Sized for the largest reply, a readdir
/// page of [`MAX_READDIR`] entries with 255-byte names (≈ 80 KiB), and small enough that a server
/// can hold one per connection without a memory budget of its own.
pub const MAX_MESSAGE: usize = 128 * 1024;

/// Most pieces in one list descriptor. A client with more splits the request.
pub const MAX_PIECES: usize = 2048;

/// Most entries in one readdir page.
pub const MAX_READDIR: usize = 256;

/// Longest name on the wire. Longer than `NAME_MAX` (255) on purpose: a 300-byte name still
/// decodes, so the meta server can answer `ENAMETOOLONG` instead of a protocol error.
pub const MAX_NAME_WIRE: usize = 1024;

/// Longest symbolic link target, in bytes (Linux's `PATH_MAX`, terminating NUL included).
pub const MAX_LINK_TARGET: usize = 4095;

/// Longest error text in an error reply.
pub const MAX_ERROR_TEXT: usize = 256;

/// Longest software version in a status reply.
pub const MAX_VERSION_TEXT: usize = 64;

/// Most data bytes one read or write request may move. The server streams it in transfer units,
/// so this bounds work per request, not memory.
pub const MAX_IO_BYTES: u64 = 1 << 30;

/// Most view blocks a strided descriptor may span: bounds the server's work expanding it.
pub const MAX_VIEW_BLOCKS: u64 = 1 << 20;

pub use crate::handle::Handle;

mod bounded;
mod samples;
pub use bounded::{BoundedString, BoundedVec};
pub use samples::{fuzz_one, sample_messages};

/// Why a message was refused. Every variant is caused by the peer's bytes (or, for
/// [`ProtoError::Encode`], by a message we refuse to send).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    /// Over [`MAX_MESSAGE`].
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

/// A name as carried on the wire (bounded at [`MAX_NAME_WIRE`]; the meta server applies the
/// file-name rules).
pub type Name = BoundedString<MAX_NAME_WIRE>;

/// Longest file name, in bytes.
pub const NAME_MAX: usize = 255;

/// Why a name is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The empty string.
    #[error("empty name")]
    Empty,
    /// `.` or `..`.
    #[error("'.' and '..' are not names")]
    Dot,
    /// Contains `/`.
    #[error("name contains '/'")]
    Slash,
    /// Contains NUL.
    #[error("name contains NUL")]
    Nul,
    /// Longer than [`NAME_MAX`] bytes.
    #[error("name longer than {NAME_MAX} bytes")]
    TooLong,
}

/// Checks a single path component: the meta server applies it to every name it stores, and a
/// client's decoder to every name a server lists.
pub fn validate_name(name: &str) -> Result<(), NameError> {
    match name {
        "" => Err(NameError::Empty),
        "." | ".." => Err(NameError::Dot),
        _ if name.len() > NAME_MAX => Err(NameError::TooLong),
        _ if name.contains('/') => Err(NameError::Slash),
        _ if name.contains('\0') => Err(NameError::Nul),
        _ => Ok(()),
    }
}

/// A symbolic link's target as carried on the wire and stored: any path text of 1 to
/// [`MAX_LINK_TARGET`] bytes without NUL; nothing is checked against the namespace.
pub type LinkTarget = BoundedString<MAX_LINK_TARGET>;

/// The rule for a link target beyond its length (which [`LinkTarget`] bounds): not empty, no NUL.
/// The meta server applies it to what it stores, decoding to what a peer sends.
pub fn link_target_ok(t: &str) -> bool {
    !t.is_empty() && !t.contains('\0')
}

fn target_ok(t: &LinkTarget) -> Result<(), ProtoError> {
    if !link_target_ok(t) {
        return Err(ProtoError::Invalid("link target"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Shared types
// ---------------------------------------------------------------------------------------------

/// File, directory, symbolic link or special file.
///
/// New kinds are only ever appended: the meta server stores records with this type, and a
/// record written before a kind existed must decode the same afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileKind {
    /// A regular, striped file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link: its target is kept by the meta server ([`MetaRequest::Readlink`]),
    /// it has no objects on the io servers.
    Symlink,
    /// A named pipe (FIFO). Special files are records only: no objects, no data; the kernel of
    /// the machine that opens one provides its behaviour.
    Fifo,
    /// A UNIX domain socket's name.
    Socket,
    /// A character device node, with its device number (`rdev`).
    CharDev(u32),
    /// A block device node, with its device number (`rdev`).
    BlockDev(u32),
}

impl FileKind {
    /// A FIFO, socket or device node: made by [`MetaRequest::Mknod`], a record without objects.
    pub fn is_special(self) -> bool {
        matches!(self, FileKind::Fifo | FileKind::Socket | FileKind::CharDev(_) | FileKind::BlockDev(_))
    }

    /// The device number of a device node (0 for anything else).
    pub fn rdev(self) -> u32 {
        match self {
            FileKind::CharDev(d) | FileKind::BlockDev(d) => d,
            _ => 0,
        }
    }
}

/// A point in time: seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
pub struct Timestamp {
    /// Whole seconds (negative before 1970).
    pub secs: i64,
    /// Nanoseconds, `< 1_000_000_000`.
    pub nsecs: u32,
}

impl Timestamp {
    /// The current time.
    pub fn now() -> Self {
        let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Timestamp { secs: d.as_secs() as i64, nsecs: d.subsec_nanos() }
    }

    fn validate(&self) -> Result<(), ProtoError> {
        if self.nsecs >= 1_000_000_000 {
            return Err(ProtoError::Invalid("timestamp nanoseconds"));
        }
        Ok(())
    }
}

/// Attributes of a file or directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    /// File or directory.
    pub kind: FileKind,
    /// Permission bits (`0o7777` at most; the type bits come from `kind`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// For files: the size the meta server last recorded (set on truncate). The authoritative
    /// logical size is the max over io servers ([`Layout::logical_size`]).
    pub size: u64,
    /// Link count: a file's names; a directory's 2 plus its subdirectories.
    pub nlink: u32,
    /// Last access.
    pub atime: Timestamp,
    /// Last data modification.
    pub mtime: Timestamp,
    /// Last status change.
    pub ctime: Timestamp,
}

impl Attr {
    /// Times a client can turn into dates: a meta server's nanoseconds past a second would
    /// overflow `SystemTime` arithmetic (the FUSE layer's) instead of meaning anything.
    fn validate(&self) -> Result<(), ProtoError> {
        if self.mode > 0o7777 {
            return Err(ProtoError::Invalid("mode"));
        }
        [self.atime, self.mtime, self.ctime].iter().try_for_each(Timestamp::validate)
    }
}

/// A time to set: the meta server's clock, or a given time.
///
/// The two are told apart because POSIX lets whoever may write a file set its times to now
/// (`utimensat` with `UTIME_NOW` or a null `times`), but only its owner set other times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetTime {
    /// The meta server's current time.
    Now,
    /// This time.
    At(Timestamp),
}

/// Attribute changes; `None` leaves a field alone. The change time becomes the server's
/// current time whatever changes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SetAttr {
    /// New permission bits.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New access time.
    pub atime: Option<SetTime>,
    /// New modification time.
    pub mtime: Option<SetTime>,
    /// New logical size (truncate): the meta server records it and fans out per-server
    /// truncates ([`Layout::local_sizes`]).
    pub size: Option<u64>,
    /// The caller changes the file through a descriptor it opened for writing (`ftruncate`,
    /// `open` with `O_TRUNC`, a write's modification time): that open already passed the write
    /// permission check, which the file's mode may no longer allow (a file created read-only
    /// and written at once).
    pub opened_for_write: bool,
    /// The caller wrote the file's data: as on a local file system, the set-user-ID bit and a
    /// set-group-ID bit with group execute are cleared unless the caller is root.
    pub wrote: bool,
}

impl SetAttr {
    fn validate(&self) -> Result<(), ProtoError> {
        if self.mode.is_some_and(|m| m > 0o7777) {
            return Err(ProtoError::Invalid("mode"));
        }
        [self.atime, self.mtime].iter().flatten().try_for_each(|t| match t {
            SetTime::Now => Ok(()),
            SetTime::At(t) => t.validate(),
        })
    }
}

/// Most supplementary groups a request carries ([`Cred::groups`]); a caller in more groups is
/// checked with the first ones (it may be refused what another of its groups would allow).
pub const MAX_GROUPS: usize = 256;

/// Who asks: the caller's effective user and group ids and its supplementary groups.
///
/// The meta server applies the POSIX permission rules with them (owner, group, other, root
/// may do anything). They are the client's word, as `AUTH_SYS` credentials are to an NFS
/// server: every peer holds the cluster key, so the rules keep users from each other's
/// mistakes and make the library and the CLI behave as a local file system, but they are
/// no boundary against a peer that lies.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Cred {
    /// Effective (file system) user id; 0 is root.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: BoundedVec<u32, MAX_GROUPS>,
}

impl Cred {
    /// Root: every check passes.
    pub fn root() -> Cred {
        Cred::default()
    }

    /// `uid` and `gid` with the supplementary `groups` (beyond [`MAX_GROUPS`] dropped).
    pub fn new(uid: u32, gid: u32, mut groups: Vec<u32>) -> Cred {
        groups.truncate(MAX_GROUPS);
        Cred { uid, gid, groups: BoundedVec(groups) }
    }

    /// Whether the caller is root.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether the caller is in group `gid` (its effective group or a supplementary one).
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// A partially specified layout: what `setstripe` stores on a directory and what `create` may
/// request. Unset fields come from the parent directory's default, then the filesystem's
/// defaults (pcount = all servers, ssize = 64 KiB, base round-robin).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct LayoutSpec {
    /// First server; `None` = round-robin.
    pub base: Option<u32>,
    /// Server count; `None` = all.
    pub pcount: Option<u32>,
    /// Stripe size; `None` = default.
    pub ssize: Option<u64>,
}

impl LayoutSpec {
    /// Every field set from `l`.
    pub fn from_layout(l: Layout) -> Self {
        LayoutSpec { base: Some(l.base), pcount: Some(l.pcount), ssize: Some(l.ssize) }
    }

    /// Fields set here win; the rest come from `fallback`.
    pub fn or(self, fallback: LayoutSpec) -> LayoutSpec {
        LayoutSpec {
            base: self.base.or(fallback.base),
            pcount: self.pcount.or(fallback.pcount),
            ssize: self.ssize.or(fallback.ssize),
        }
    }

    /// Checks the fields that are set (the cluster size is checked by the meta server).
    pub fn validate(&self) -> Result<(), ProtoError> {
        if self.ssize.is_some_and(|s| s == 0 || s > MAX_SSIZE) {
            return Err(LayoutError::BadStripeSize(self.ssize.unwrap_or(0)).into());
        }
        match self.pcount {
            Some(p) if p == 0 || p > MAX_PCOUNT => {
                Err(LayoutError::BadStripeCount { pcount: p, max: MAX_PCOUNT }.into())
            }
            _ => Ok(()),
        }
    }
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// Its name.
    pub name: Name,
    /// Its handle.
    pub handle: Handle,
    /// File or directory.
    pub kind: FileKind,
}

/// Namespace-wide counters from the meta server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FsStats {
    /// Regular files and symbolic links.
    pub files: u64,
    /// Directories (the root included).
    pub dirs: u64,
    /// io servers in the cluster.
    pub io_servers: u32,
    /// Longest name accepted.
    pub name_max: u32,
}

/// Counters from one io server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ServerStats {
    /// Read requests served.
    pub reads: u64,
    /// Write requests served.
    pub writes: u64,
    /// Data bytes read.
    pub bytes_read: u64,
    /// Data bytes written.
    pub bytes_written: u64,
    /// Syncs served.
    pub syncs: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Files open in the descriptor cache.
    pub open_files: u64,
    /// Requests whose data moved between the network and mapped object files.
    pub mapped: PathStats,
    /// Requests whose data was staged in buffers and moved with `pread`/`pwrite`: every request of a
    /// `--copy-io` server, and a mapping server's [`fallbacks`](Self::fallbacks).
    pub copied: PathStats,
    /// Requests a mapping io server sent down the copying path, by reason.
    pub fallbacks: Fallbacks,
    /// The file system holding the server's objects.
    pub disk: DiskSpace,
    /// Bytes whose writeback the server started as they landed, ahead of any fsync.
    pub written_behind: u64,
}

/// Size and free space of the file system holding an io server's objects, in bytes
/// (`statvfs` of its data directory; all zero where that failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DiskSpace {
    /// Its size.
    pub total: u64,
    /// Free.
    pub free: u64,
    /// Free for an unprivileged writer (the server's writes), at most `free`.
    pub avail: u64,
}

impl DiskSpace {
    /// Two file systems' space together (a mount's `statfs` adds up its servers). A server's
    /// figures are taken as consistent (`avail <= free <= total`) and sums saturate, whatever
    /// a server sent.
    pub fn plus(self, d: DiskSpace) -> DiskSpace {
        let free = d.free.min(d.total);
        DiskSpace {
            total: self.total.saturating_add(d.total),
            free: self.free.saturating_add(free),
            avail: self.avail.saturating_add(d.avail.min(free)),
        }
    }
}

/// What a server says about itself ([`MetaRequest::Status`], [`IoRequest::Status`]): cheap to
/// gather, for an operator's `stripefs status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatus {
    /// The server's software version (its package version, `0.1.0`).
    pub version: BoundedString<MAX_VERSION_TEXT>,
    /// Time since the server started, in nanoseconds.
    pub uptime_ns: u64,
    /// Requests received since it started, this one included.
    pub requests: u64,
    /// Other requests being served while this one was answered.
    pub in_flight: u64,
    /// Requests answered with an error since it started.
    pub errors: u64,
    /// The file system holding its data directory (objects, or the meta server's database).
    pub disk: DiskSpace,
}

/// What one data path of an io server moved. A request is counted by the path that took it,
/// whatever its outcome; its bytes only if it succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PathStats {
    /// Read requests (with data) that took this path.
    pub reads: u64,
    /// Write requests (with data) that took this path.
    pub writes: u64,
    /// Data bytes of the requests that succeeded on it.
    pub bytes: u64,
}

/// Why a mapping io server moved a request's data through the copying path instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Fallbacks {
    /// Write pieces out of offset order (the mapped write reserves and fills in order).
    pub unordered: u64,
    /// Offsets past the mapping limit ([`crate::store::MAX_MAPPED`]).
    pub beyond_map: u64,
    /// An object whose file system (or file type) has no `fallocate`.
    pub no_fallocate: u64,
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

// ---------------------------------------------------------------------------------------------
// Meta server messages
// ---------------------------------------------------------------------------------------------

/// Client → meta server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaRequest {
    /// Namespace counters → [`MetaReply::Statfs`].
    Statfs,
    /// `name` in directory `parent` → [`MetaReply::Entry`].
    Lookup {
        /// Directory.
        parent: Handle,
        /// Entry name.
        name: Name,
    },
    /// Attributes → [`MetaReply::Attr`].
    Getattr {
        /// The object.
        handle: Handle,
    },
    /// Change attributes, truncate when `set.size` is set → [`MetaReply::Attr`].
    Setattr {
        /// The object.
        handle: Handle,
        /// What to change.
        set: SetAttr,
    },
    /// Create and open a regular file → [`MetaReply::Opened`]. The meta server allocates the
    /// handle, creates the objects on the io servers, and cleans up if any of them fails.
    Create {
        /// Directory.
        parent: Handle,
        /// New name.
        name: Name,
        /// Permission bits.
        mode: u32,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
        /// Requested layout; unset fields are inherited.
        layout: Option<LayoutSpec>,
        /// Rights for the returned capability.
        rights: Rights,
    },
    /// Open an existing file → [`MetaReply::Opened`] with layout and capability.
    Open {
        /// The file.
        handle: Handle,
        /// Rights wanted.
        rights: Rights,
    },
    /// Create a directory → [`MetaReply::Entry`].
    Mkdir {
        /// Parent directory.
        parent: Handle,
        /// New name.
        name: Name,
        /// Permission bits.
        mode: u32,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
    },
    /// Remove an empty directory → [`MetaReply::Done`].
    Rmdir {
        /// Parent directory.
        parent: Handle,
        /// Name.
        name: Name,
    },
    /// Remove a file (and its objects) → [`MetaReply::Done`].
    Unlink {
        /// Parent directory.
        parent: Handle,
        /// Name.
        name: Name,
    },
    /// POSIX rename, replacing a file or empty directory target → [`MetaReply::Done`].
    Rename {
        /// Source directory.
        src_parent: Handle,
        /// Source name.
        src_name: Name,
        /// Destination directory.
        dst_parent: Handle,
        /// Destination name.
        dst_name: Name,
    },
    /// One page of a directory, in name order, starting after `after` → [`MetaReply::Dir`].
    Readdir {
        /// Directory.
        dir: Handle,
        /// Resume after this name (`None`: from the start).
        after: Option<Name>,
        /// Most entries wanted (the server caps it at [`MAX_READDIR`]).
        max: u32,
    },
    /// A file's layout or a directory's default layout → [`MetaReply::Stripe`].
    GetStripe {
        /// File or directory.
        handle: Handle,
    },
    /// Set (or with `None`, clear) a directory's default layout → [`MetaReply::Done`].
    SetStripe {
        /// Directory.
        dir: Handle,
        /// The default new files and subdirectories inherit.
        spec: Option<LayoutSpec>,
    },
    /// Create a symbolic link → [`MetaReply::Entry`].
    Symlink {
        /// Directory.
        parent: Handle,
        /// New name.
        name: Name,
        /// What the link points at (stored as given).
        target: LinkTarget,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
    },
    /// A symbolic link's target → [`MetaReply::Link`].
    Readlink {
        /// The link.
        handle: Handle,
    },
    /// The server's version, uptime, load and space → [`MetaReply::Status`].
    Status,
    /// A new name for an existing file, symbolic link or special file (a hard link; not a
    /// directory) → [`MetaReply::Entry`] with its link count raised.
    Link {
        /// The file.
        handle: Handle,
        /// Directory of the new name.
        parent: Handle,
        /// New name.
        name: Name,
    },
    /// Create a FIFO, socket or device node → [`MetaReply::Entry`].
    Mknod {
        /// Directory.
        parent: Handle,
        /// New name.
        name: Name,
        /// What to make: a special kind only ([`FileKind::is_special`]).
        kind: FileKind,
        /// Permission bits.
        mode: u32,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
    },
}

/// A meta request with the credentials of the caller it is made for: what travels to the meta
/// server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaCall {
    /// Who asks.
    pub cred: Cred,
    /// What it asks.
    pub req: MetaRequest,
}

/// Meta server → client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaReply {
    /// Namespace counters.
    Statfs(FsStats),
    /// A found or created entry.
    Entry {
        /// Its handle.
        handle: Handle,
        /// Its attributes.
        attr: Attr,
    },
    /// Attributes.
    Attr(Attr),
    /// An open file.
    Opened {
        /// The file.
        handle: Handle,
        /// Its attributes.
        attr: Attr,
        /// Its layout over the cluster's io servers (in the cluster file's order).
        layout: Layout,
        /// The capability to present to the io servers.
        cap: Capability,
    },
    /// Success with nothing to return.
    Done,
    /// A readdir page.
    Dir {
        /// Entries in name order.
        entries: BoundedVec<DirEntry, MAX_READDIR>,
        /// More entries follow the last one.
        more: bool,
    },
    /// Striping information.
    Stripe {
        /// A file's layout.
        layout: Option<Layout>,
        /// A directory's default layout.
        default: Option<LayoutSpec>,
    },
    /// A symbolic link's target.
    Link(LinkTarget),
    /// Failure.
    Error(ErrorReply),
    /// The meta server's status.
    Status(ServerStatus),
}

// ---------------------------------------------------------------------------------------------
// I/O server messages
// ---------------------------------------------------------------------------------------------

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
    /// fsync the local object (`WRITE`) → [`IoReply::Done`].
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
        }
    }

    /// The data a read or write moves, for logs: the first piece's object offset and the
    /// stream's length.
    pub fn extent(&self) -> Option<(u64, u64)> {
        match self {
            IoRequest::Read { desc, .. } | IoRequest::Write { desc, .. } => {
                Some((desc.pieces().next().map_or(0, |p| p.off), desc.total()))
            }
            IoRequest::Allocate { off, len, .. } => Some((*off, *len)),
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
            | IoRequest::Allocate { cap, .. } => Some(cap),
            IoRequest::Ping | IoRequest::Stats | IoRequest::Status => None,
        }
    }

    /// The rights the request needs from its capability.
    pub fn needed_rights(&self) -> Rights {
        match self {
            IoRequest::CreateObject { .. }
            | IoRequest::RemoveObject { .. }
            | IoRequest::TruncateObject { .. } => Rights::ADMIN,
            IoRequest::Read { .. } => Rights::READ,
            IoRequest::Write { .. } | IoRequest::Sync { .. } | IoRequest::Allocate { .. } => Rights::WRITE,
            // A size is an attribute: whoever may stat a file may learn it, and a capability
            // for the file (even one granting nothing else) shows the meta server let them.
            IoRequest::GetSize { .. } | IoRequest::Ping | IoRequest::Stats | IoRequest::Status => {
                Rights::NONE
            }
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
    /// Local size of the object.
    Size(u64),
    /// A read: `bytes` of data follow (holes and bytes past the local end read as zeros).
    Read {
        /// Stream bytes that follow.
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
}

// ---------------------------------------------------------------------------------------------
// Envelope, encode, decode
// ---------------------------------------------------------------------------------------------

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

fn name_ok(n: &Name) -> Result<(), ProtoError> {
    // Bounded by the type; an empty name is caught by the meta server's name rules.
    let _ = n;
    Ok(())
}

impl Message for MetaCall {
    const KIND: u8 = 1;
    fn validate(&self) -> Result<(), ProtoError> {
        self.req.validate()
    }
}

impl MetaRequest {
    /// The request's kind, for logs: `lookup`, `create`, `readdir`, ….
    pub fn kind(&self) -> &'static str {
        match self {
            MetaRequest::Statfs => "statfs",
            MetaRequest::Lookup { .. } => "lookup",
            MetaRequest::Getattr { .. } => "getattr",
            MetaRequest::Setattr { .. } => "setattr",
            MetaRequest::Create { .. } => "create",
            MetaRequest::Open { .. } => "open",
            MetaRequest::Mkdir { .. } => "mkdir",
            MetaRequest::Rmdir { .. } => "rmdir",
            MetaRequest::Unlink { .. } => "unlink",
            MetaRequest::Rename { .. } => "rename",
            MetaRequest::Readdir { .. } => "readdir",
            MetaRequest::GetStripe { .. } => "getstripe",
            MetaRequest::SetStripe { .. } => "setstripe",
            MetaRequest::Symlink { .. } => "symlink",
            MetaRequest::Readlink { .. } => "readlink",
            MetaRequest::Status => "status",
            MetaRequest::Link { .. } => "link",
            MetaRequest::Mknod { .. } => "mknod",
        }
    }

    /// The handle the request is about (a directory for requests on a name in it), for logs.
    pub fn subject(&self) -> Option<Handle> {
        match self {
            MetaRequest::Statfs | MetaRequest::Status => None,
            MetaRequest::Getattr { handle }
            | MetaRequest::Setattr { handle, .. }
            | MetaRequest::Open { handle, .. }
            | MetaRequest::GetStripe { handle }
            | MetaRequest::Readlink { handle }
            | MetaRequest::Link { handle, .. } => Some(*handle),
            MetaRequest::Lookup { parent, .. }
            | MetaRequest::Create { parent, .. }
            | MetaRequest::Mkdir { parent, .. }
            | MetaRequest::Rmdir { parent, .. }
            | MetaRequest::Unlink { parent, .. }
            | MetaRequest::Symlink { parent, .. }
            | MetaRequest::Mknod { parent, .. } => Some(*parent),
            MetaRequest::Rename { src_parent, .. } => Some(*src_parent),
            MetaRequest::Readdir { dir, .. } | MetaRequest::SetStripe { dir, .. } => Some(*dir),
        }
    }

    fn validate(&self) -> Result<(), ProtoError> {
        match self {
            MetaRequest::Lookup { name, .. }
            | MetaRequest::Rmdir { name, .. }
            | MetaRequest::Unlink { name, .. }
            | MetaRequest::Link { name, .. }
            | MetaRequest::Mkdir { name, .. } => name_ok(name)?,
            MetaRequest::Mknod { name, kind, .. } => {
                name_ok(name)?;
                if !kind.is_special() {
                    return Err(ProtoError::Invalid("mknod of a kind that is not special"));
                }
            }
            MetaRequest::Symlink { name, target, .. } => {
                name_ok(name)?;
                target_ok(target)?;
            }
            MetaRequest::Create { name, layout, .. } => {
                name_ok(name)?;
                layout.iter().try_for_each(LayoutSpec::validate)?;
            }
            MetaRequest::Rename { src_name, dst_name, .. } => {
                name_ok(src_name)?;
                name_ok(dst_name)?;
            }
            MetaRequest::Setattr { set, .. } => set.validate()?,
            MetaRequest::Readdir { max, .. } if *max == 0 => return Err(ProtoError::Invalid("readdir max")),
            MetaRequest::SetStripe { spec, .. } => spec.iter().try_for_each(LayoutSpec::validate)?,
            _ => {}
        }
        match self {
            MetaRequest::Create { mode, .. }
            | MetaRequest::Mkdir { mode, .. }
            | MetaRequest::Mknod { mode, .. }
                if *mode > 0o7777 =>
            {
                Err(ProtoError::Invalid("mode"))
            }
            _ => Ok(()),
        }
    }
}

impl Message for MetaReply {
    const KIND: u8 = 2;
    fn validate(&self) -> Result<(), ProtoError> {
        match self {
            MetaReply::Opened { layout, attr, .. } => {
                attr.validate()?;
                Layout::new(layout.base, layout.pcount, layout.ssize)?;
            }
            MetaReply::Entry { attr, .. } | MetaReply::Attr(attr) => attr.validate()?,
            MetaReply::Stripe { layout, default } => {
                if let Some(l) = layout {
                    Layout::new(l.base, l.pcount, l.ssize)?;
                }
                default.iter().try_for_each(LayoutSpec::validate)?;
            }
            MetaReply::Link(target) => target_ok(target)?,
            MetaReply::Dir { entries, .. } => dir_entries_ok(entries)?,
            _ => {}
        }
        Ok(())
    }
}

/// A readdir page names each entry by one path component, once, in name order. Clients join
/// these names to remote and local paths (`cp -r`, FUSE, `ls`): a `..`, a `/` or a repeated
/// name would let whoever answers steer where a client reads and writes.
fn dir_entries_ok(entries: &[DirEntry]) -> Result<(), ProtoError> {
    if entries.iter().any(|e| validate_name(&e.name).is_err()) {
        return Err(ProtoError::Invalid("directory entry name"));
    }
    if entries.windows(2).any(|w| w[0].name.as_str() >= w[1].name.as_str()) {
        return Err(ProtoError::Invalid(DIR_ENTRY_ORDER));
    }
    Ok(())
}

/// What a readdir answer that repeats a name or is out of order is refused as.
pub(crate) const DIR_ENTRY_ORDER: &str = "directory entry order (a name repeated or out of order)";

impl Reply for MetaReply {
    fn from_error(e: ErrorReply) -> Self {
        MetaReply::Error(e)
    }
}

impl Message for IoRequest {
    const KIND: u8 = 3;
    fn validate(&self) -> Result<(), ProtoError> {
        match self {
            IoRequest::Read { desc, .. } | IoRequest::Write { desc, .. } => desc.validate(),
            IoRequest::Allocate { off, len, .. } if *len == 0 || off.checked_add(*len).is_none() => {
                Err(ProtoError::Invalid("allocation range"))
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

#[cfg(test)]
mod tests;
