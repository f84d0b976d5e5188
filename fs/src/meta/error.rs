//! Why a meta operation failed, and the code each failure is sent to the client as.

use crate::errno::Errno;
use crate::layout::LayoutError;
use crate::proto::{MAX_LINK_TARGET, NameError};

/// Why a meta operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    /// No such entry or handle.
    #[error("no such file or directory")]
    NotFound,
    /// The directory a name was looked up in is gone: removed, or another put in its place.
    /// Told apart from a missing name so that a kernel holding the directory's old handle
    /// looks its path up afresh, as NFS has it.
    #[error("stale file handle: the directory is gone")]
    Stale,
    /// The name exists.
    #[error("file exists")]
    Exists,
    /// A directory was required.
    #[error("not a directory")]
    NotDir,
    /// A non-directory was required.
    #[error("is a directory")]
    IsDir,
    /// A symbolic link where a file was required (an open by handle: links are followed by the
    /// client, as `open` with `O_NOFOLLOW` refuses them).
    #[error("is a symbolic link")]
    IsLink,
    /// Directory not empty.
    #[error("directory not empty")]
    NotEmpty,
    /// The name breaks the rules.
    #[error("invalid name: {0}")]
    Name(NameError),
    /// A bad layout request.
    #[error("invalid layout: {0}")]
    Layout(LayoutError),
    /// Another invalid argument (e.g. moving a directory into itself).
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    /// A symbolic link target longer than [`MAX_LINK_TARGET`].
    #[error("symbolic link target longer than {MAX_LINK_TARGET} bytes")]
    TargetTooLong,
    /// The entry is being created by another request.
    #[error("entry is being created")]
    Busy,
    /// A create asked to take a file made ahead
    /// ([`Placement::made_ahead_only`](super::Placement::made_ahead_only)) could not: its
    /// objects would have to be made first. Nothing was written.
    #[error("the create needs its objects made")]
    NeedsObjects,
    /// The caller's credentials lack a permission the mode bits require.
    #[error("permission denied")]
    Access,
    /// Only the owner or root (or only root) may do this, or a sticky directory forbids it.
    #[error("operation not permitted: {0}")]
    NotPermitted(&'static str),
    /// The file has [`LINK_MAX`](super::LINK_MAX) names, or the directory as many
    /// subdirectories.
    #[error("too many links")]
    TooManyLinks,
    /// The database was made for a cluster with a different number of io servers; every
    /// layout would map to different servers, so it is refused.
    #[error("database is for {stored} io servers, configuration has {configured}")]
    ServerCountChanged {
        /// In the database.
        stored: u64,
        /// In the configuration.
        configured: u32,
    },
    /// A stored record does not decode.
    #[error("corrupt record for handle {0}")]
    Corrupt(u64),
    /// The store failed (boxed: redb's error is large and this path is cold).
    #[error("metadata store: {0}")]
    Store(Box<redb::Error>),
}

impl From<NameError> for MetaError {
    fn from(e: NameError) -> Self {
        MetaError::Name(e)
    }
}

impl From<LayoutError> for MetaError {
    fn from(e: LayoutError) -> Self {
        MetaError::Layout(e)
    }
}

impl MetaError {
    /// The code sent to the client.
    pub fn errno(&self) -> Errno {
        match self {
            MetaError::NotFound => Errno::ENOENT,
            MetaError::Stale => Errno::ESTALE,
            MetaError::Exists => Errno::EEXIST,
            MetaError::NotDir => Errno::ENOTDIR,
            MetaError::IsDir => Errno::EISDIR,
            MetaError::IsLink => Errno::ELOOP,
            MetaError::NotEmpty => Errno::ENOTEMPTY,
            MetaError::Name(NameError::TooLong) | MetaError::TargetTooLong => Errno::ENAMETOOLONG,
            MetaError::Name(_) | MetaError::Layout(_) | MetaError::Invalid(_) => Errno::EINVAL,
            MetaError::Busy => Errno::EBUSY,
            MetaError::NeedsObjects => Errno::EAGAIN,
            MetaError::Access => Errno::EACCES,
            MetaError::NotPermitted(_) => Errno::EPERM,
            MetaError::TooManyLinks => Errno::EMLINK,
            MetaError::ServerCountChanged { .. } | MetaError::Corrupt(_) | MetaError::Store(_) => Errno::EIO,
        }
    }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for MetaError {
            fn from(e: $t) -> Self {
                MetaError::Store(Box::new(e.into()))
            }
        }
    )*};
}
from_redb!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);
