//! Messages between clients and the meta server: [`MetaRequest`] (carried in a [`MetaCall`]
//! with the caller's credentials) and [`MetaReply`], and their checks.

use super::attr::{Attr, Cred, DirEntry, FileKind, LayoutSpec, SetAttr};
use super::bounded::BoundedVec;
use super::envelope::{ErrorReply, Message, Reply};
use super::error::ProtoError;
use super::limits::{MAX_BATCH, MAX_READDIR};
use super::name::{LinkTarget, Name, target_ok, validate_name};
use super::stats::{FsStats, ServerStatus};
use crate::capability::{Capability, Rights};
use crate::errno::Errno;
use crate::handle::Handle;
use crate::layout::Layout;
use serde::{Deserialize, Serialize};

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
    /// Attributes of several objects at once (a listing's) → [`MetaReply::Attrs`], with a
    /// regular file's layout and a capability to ask its io servers for its size.
    GetattrMany {
        /// The objects, at most [`MAX_BATCH`].
        handles: BoundedVec<Handle, MAX_BATCH>,
    },
    /// Make every change the meta server has acknowledged durable (an `fsync`'s part at the
    /// meta server: changes of times and mode bits added are otherwise flushed within about a
    /// second) → [`MetaReply::Done`].
    Sync,
}

/// One object's answer in [`MetaReply::Attrs`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttrOf {
    /// Found.
    Found {
        /// Its attributes (a regular file's size is the last truncate).
        attr: Attr,
        /// A regular file's layout, and a capability that grants nothing but asking its io
        /// servers for its size; `None` for anything else.
        file: Option<(Layout, Capability)>,
    },
    /// Not found (removed since it was listed), or another error.
    Failed(Errno),
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
    /// Answer to [`MetaRequest::GetattrMany`], in its order.
    Attrs(BoundedVec<AttrOf, MAX_BATCH>),
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
            MetaRequest::GetattrMany { .. } => "getattr_many",
            MetaRequest::Sync => "sync",
        }
    }

    /// The handle the request is about (a directory for requests on a name in it), for logs.
    pub fn subject(&self) -> Option<Handle> {
        match self {
            MetaRequest::Statfs
            | MetaRequest::Status
            | MetaRequest::Sync
            | MetaRequest::GetattrMany { .. } => None,
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
            MetaReply::Attrs(attrs) => attrs.iter().try_for_each(attr_of_ok)?,
            _ => {}
        }
        Ok(())
    }
}

/// A batch's attributes are valid, and a file (and only a file) comes with a valid layout.
fn attr_of_ok(a: &AttrOf) -> Result<(), ProtoError> {
    let AttrOf::Found { attr, file } = a else { return Ok(()) };
    attr.validate()?;
    match (attr.kind, file) {
        (FileKind::File, Some((l, _))) => {
            Layout::new(l.base, l.pcount, l.ssize).map(|_| ()).map_err(Into::into)
        }
        (FileKind::File, None) => Err(ProtoError::Invalid("a file's attributes without its layout")),
        (_, Some(_)) => Err(ProtoError::Invalid("a layout for what is not a file")),
        (_, None) => Ok(()),
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
