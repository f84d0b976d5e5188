//! What servers report about themselves: namespace counters, an io server's counters and
//! disk space, a server's status.

use super::bounded::BoundedString;
use super::limits::MAX_VERSION_TEXT;
use serde::{Deserialize, Serialize};

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
    /// Which file system it is: two servers that report the same nonzero value keep their
    /// data on one file system (of one running kernel), so a sum counts it once. 0: unknown,
    /// counted every time.
    pub fs_id: u64,
}

impl DiskSpace {
    /// The space of every file system in `spaces` together, one shared by several servers
    /// (the same nonzero [`fs_id`](Self::fs_id)) counted once, as the cluster's `statfs`
    /// reports it.
    pub fn sum(spaces: impl IntoIterator<Item = DiskSpace>) -> DiskSpace {
        let mut seen = std::collections::HashSet::new();
        spaces
            .into_iter()
            .filter(|d| d.fs_id == 0 || seen.insert(d.fs_id))
            .fold(DiskSpace::default(), DiskSpace::plus)
    }

    /// Two file systems' space together (a mount's `statfs` adds up its servers). A server's
    /// figures are taken as consistent (`avail <= free <= total`) and sums saturate, whatever
    /// a server sent.
    pub fn plus(self, d: DiskSpace) -> DiskSpace {
        let free = d.free.min(d.total);
        DiskSpace {
            total: self.total.saturating_add(d.total),
            free: self.free.saturating_add(free),
            avail: self.avail.saturating_add(d.avail.min(free)),
            // Several file systems together are none of them.
            fs_id: 0,
        }
    }
}

/// What a server says about itself ([`MetaRequest::Status`], [`IoRequest::Status`]): cheap to
/// gather, for an operator's `stripefs status`.
///
/// [`MetaRequest::Status`]: super::meta::MetaRequest::Status
/// [`IoRequest::Status`]: super::io::IoRequest::Status
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
