//! What a file is and the values describing it: its kind, times, attributes and their
//! changes, the caller's credentials, a layout request, a directory entry.

use super::bounded::BoundedVec;
use super::error::ProtoError;
use super::name::Name;
use crate::handle::Handle;
use crate::layout::{Layout, LayoutError, MAX_PCOUNT, MAX_SSIZE, MIN_SSIZE};
use serde::{Deserialize, Serialize};

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
    ///
    /// [`MetaRequest::Readlink`]: super::meta::MetaRequest::Readlink
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
    ///
    /// [`MetaRequest::Mknod`]: super::meta::MetaRequest::Mknod
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

    pub(super) fn validate(&self) -> Result<(), ProtoError> {
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
    pub(super) fn validate(&self) -> Result<(), ProtoError> {
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
    /// Durable before the answer, with every change the meta server acknowledged before it
    /// (a sync's record of the write's time). Without it, a change of times, or one that only
    /// adds mode bits (which a lost change leaves as closed as before), is durable only with
    /// the meta server's next flush, within about a second, as a local file system's waits for
    /// its journal; a change that takes mode bits away (a set-id bit cleared included), or
    /// changes the owner, group or size, is durable before the answer all the same.
    pub sync: bool,
}

impl SetAttr {
    pub(super) fn validate(&self) -> Result<(), ProtoError> {
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
        match self.ssize {
            Some(s) if s == 0 || s > MAX_SSIZE => return Err(LayoutError::BadStripeSize(s).into()),
            Some(s) if s < MIN_SSIZE => return Err(LayoutError::SmallStripeSize(s).into()),
            _ => {}
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
