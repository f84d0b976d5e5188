//! The kernel-cached mode's opens: whether the kernel may keep what it cached of a file, and
//! the file's size pushed to it when another client made the file longer.

use super::{StripeFuse, open_rights};
use crate::capability::Rights;
use crate::client::{Client, File};
use crate::proto::{Attr, Handle, Timestamp};
use crate::{FsError, FsResult, lock};
use fuser::{FileHandle, FopenFlags, INodeNo};
use tracing::debug;

/// A file as seen on the servers: its size and change time. Another client's write changes
/// the size or the change time (the meta server's clock at every change of attributes, the
/// modification time that client records at close or fsync included), so an unchanged pair
/// means the kernel's cached pages are still the file's data. Not the modification time: a
/// kernel-cached writer sends its own kernel's coarse clock, which two writes a few
/// milliseconds apart can share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    size: u64,
    ctime: Timestamp,
}

impl Seen {
    pub(super) fn of(a: &Attr) -> Seen {
        Seen { size: a.size, ctime: a.ctime }
    }
}

impl StripeFuse {
    /// Opens `h` for `c` in the kernel-cached mode, and tells whether the kernel may keep what
    /// it cached of the file.
    ///
    /// Close-to-open: this open must see every write another client finished (closed or
    /// fsynced) before it. The kernel keeps its pages only if the file's size and modification
    /// time on the servers are those this mount saw when it last opened or wrote the file;
    /// anything else — another client's write, a truncate, a first open — drops them, so reads
    /// go to the io servers again. `FOPEN_KEEP_CACHE` unconditionally would serve stale pages
    /// after another client's write.
    ///
    /// The kernel also keeps its own size for a cached file and takes none from attribute
    /// replies, so a file another client made longer would read short; the new size is pushed
    /// to it (a one-byte store at the new end, which only ever grows the kernel's size).
    pub(super) fn open_cached(
        &self,
        c: &Client,
        h: Handle,
        flags: i32,
    ) -> FsResult<(FileHandle, FopenFlags)> {
        // The kernel fills partly written pages by reading them, also through a descriptor
        // opened write-only, so such an open asks for reading too. A caller who may only write
        // gets those page reads done as the mounting user: the kernel never hands their bytes
        // to a descriptor that cannot read.
        let (file, reader) = if flags & libc::O_ACCMODE == libc::O_WRONLY {
            match c.open_handle(h, Rights::READ_WRITE) {
                Ok(f) => (f, None),
                Err(e) if matches!(e.errno(), crate::Errno::EACCES | crate::Errno::EPERM) => {
                    (c.open_handle(h, Rights::WRITE)?, self.client.open_handle(h, Rights::READ).ok())
                }
                Err(e) => return Err(e),
            }
        } else {
            (c.open_handle(h, open_rights(flags))?, None)
        };
        let now = Seen::of(&self.client.stat_handle(h)?.attr);
        let keep = lock(&self.seen).insert(h.0, now) == Some(now);
        if !keep && now.size > 0 && flags & libc::O_TRUNC == 0 {
            self.push_size(h, reader.as_ref().unwrap_or(&file), now.size);
        }
        let fopen = if keep { FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::empty() };
        Ok((self.remember(file, flags, reader), fopen))
    }

    /// Makes the kernel's size of `h` at least `size`: stores the file's last byte in its page
    /// cache, which extends the size it has if it is shorter. A file now shorter than the
    /// kernel thinks cannot be corrected from here: the kernel keeps its size, and reads the
    /// bytes past the new end as zeros, until it drops the inode.
    pub(super) fn push_size(&self, h: Handle, f: &File, size: u64) {
        let Some(notifier) = self.notifier.get() else { return };
        let mut last = [0u8; 1];
        let r = f.read_into(size - 1, &mut last).and_then(|n| {
            if n == 0 {
                // Shorter by now: nothing to push.
                return Ok(());
            }
            notifier
                .store(INodeNo(h.0), size - 1, &last)
                .map_err(|e| FsError::code(crate::Errno::EIO, format!("notify store: {e}")))
        });
        if let Err(e) = r {
            // The kernel may not hold the inode (nothing to correct), or the file shrank since.
            debug!(handle = %h, error = %e, "cannot push a file's size to the kernel");
        }
    }

    /// Records `h` as the servers have it now (after this mount's own write-back).
    pub(super) fn saw(&self, h: Handle) {
        match self.client.stat_handle(h) {
            Ok(st) => {
                lock(&self.seen).insert(h.0, Seen::of(&st.attr));
            }
            Err(_) => {
                // Unknown: the next open drops the kernel's pages.
                lock(&self.seen).remove(&h.0);
            }
        }
    }
}
