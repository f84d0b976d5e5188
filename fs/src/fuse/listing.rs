//! Reading directories: the kernel's READDIR and, on the direct mount, READDIRPLUS, which
//! carries each entry's attributes so that `ls -l` needs no look-up per entry.
//!
//! The attributes of a file include its size, which its io servers tell; a READDIRPLUS asks
//! for a window of entries' attributes at once ([`Client::stat_many`]: one meta request and
//! one request to each io server for the window) as its reply reaches entries not yet asked
//! for, and the listing keeps what a reply had no room for, for the next.

use super::{StripeFuse, TTL, file_type, stale};
use crate::client::Client;
use crate::proto::Handle;
use crate::{FsResult, lock};
use fuser::{
    FileAttr, FileHandle, FileType, Generation, INodeNo, ReplyDirectory, ReplyDirectoryPlus, Request,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, UNIX_EPOCH};

/// Entries whose attributes are asked for at once: a batch's worth. (A reply holds about 25
/// entries of short names per 4 KiB of the reader's buffer; `ls` reads with 32 KiB.)
const PLUS_WINDOW: usize = crate::proto::MAX_BATCH;

/// One entry of a listing, `.` and `..` included.
#[derive(Debug)]
pub(super) struct DirItem {
    ino: u64,
    kind: FileType,
    name: String,
    /// The attributes READDIRPLUS gives (once asked for): `None` when they could not be had
    /// (the entry went away, or an io server did not tell a file's size).
    attr: OnceLock<Option<FileAttr>>,
}

impl DirItem {
    fn new(ino: u64, kind: FileType, name: String) -> Self {
        DirItem { ino, kind, name, attr: OnceLock::new() }
    }

    fn is_dot(&self) -> bool {
        self.name == "." || self.name == ".."
    }

    /// What READDIRPLUS says of an entry whose attributes it does not have: enough for the
    /// kernel to make the entry, valid for no time, so that its first use asks again. (The
    /// kernel makes nothing of `.` and `..`.)
    fn unknown(&self) -> FileAttr {
        FileAttr {
            ino: INodeNo(self.ino),
            size: 0,
            blocks: 0,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind: self.kind,
            perm: 0,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

/// Open directories' listings. The kernel reads a directory in many calls, each from an
/// offset; listing the whole directory again for each made reading a large one quadratic.
#[derive(Debug)]
pub(super) struct Listings<T>(Mutex<HashMap<u64, Arc<Vec<T>>>>);

impl<T> Listings<T> {
    pub(super) fn new() -> Self {
        Listings(Mutex::new(HashMap::new()))
    }

    /// The listing of open directory `fh`: made by `list` at offset 0 (the first call, or a
    /// rewind), kept for later offsets, so it is a snapshot of the directory as reading began.
    fn get(&self, fh: u64, offset: u64, list: impl FnOnce() -> FsResult<Vec<T>>) -> FsResult<Arc<Vec<T>>> {
        if offset != 0
            && let Some(items) = lock(&self.0).get(&fh).cloned()
        {
            return Ok(items);
        }
        let items = Arc::new(list()?);
        lock(&self.0).insert(fh, items.clone());
        Ok(items)
    }

    /// Drops a closed directory's listing.
    pub(super) fn forget(&self, fh: u64) {
        lock(&self.0).remove(&fh);
    }
}

impl StripeFuse {
    /// The directory's entries, read from the meta server by `c`.
    fn listing(&self, c: &Client, ino: INodeNo) -> FsResult<Vec<DirItem>> {
        let entries = c.readdir_handle(Handle(ino.0))?;
        let dots = [".", ".."].map(|n| DirItem::new(ino.0, FileType::Directory, n.to_string()));
        Ok(dots
            .into_iter()
            .chain(
                entries.into_iter().map(|e| DirItem::new(e.handle.0, file_type(e.kind), e.name.to_string())),
            )
            .collect())
    }

    fn items(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64) -> FsResult<Arc<Vec<DirItem>>> {
        self.dirs.get(fh.0, offset, || self.listing(&self.as_caller(req), ino))
    }

    /// READDIR from `offset`.
    pub(super) fn list(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let items = match self.items(req, ino, fh, offset) {
            Ok(items) => items,
            Err(e) => return reply.error(stale(&e)),
        };
        for (i, item) in items.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(item.ino), i as u64 + 1, item.kind, &item.name) {
                break;
            }
        }
        reply.ok();
    }

    /// READDIRPLUS from `offset`: as many entries as the reply holds, with their attributes.
    pub(super) fn list_plus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let items = match self.items(req, ino, fh, offset) {
            Ok(items) => items,
            Err(e) => return reply.error(stale(&e)),
        };
        for (i, item) in items.iter().enumerate().skip(offset as usize) {
            if item.attr.get().is_none() && !item.is_dot() {
                self.ask_attrs(&items[i..items.len().min(i + PLUS_WINDOW)]);
            }
            let (attr, ttl) = match item.attr.get() {
                Some(Some(a)) => (*a, TTL),
                _ => (item.unknown(), Duration::ZERO),
            };
            if reply.add(INodeNo(item.ino), i as u64 + 1, &item.name, &ttl, &attr, Generation(0)) {
                break;
            }
        }
        reply.ok();
    }

    /// Asks for the attributes of those of `items` not yet asked for, all at once.
    fn ask_attrs(&self, items: &[DirItem]) {
        let unasked: Vec<&DirItem> = items.iter().filter(|i| !i.is_dot() && i.attr.get().is_none()).collect();
        let handles: Vec<Handle> = unasked.iter().map(|i| Handle(i.ino)).collect();
        for (item, st) in unasked.into_iter().zip(self.client.stat_many(&handles)) {
            let attr = match st {
                Ok(Ok(st)) => Some(self.attr_of(st.handle, &st.attr, Some(st.allocated))),
                _ => None,
            };
            let _ = item.attr.set(attr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FsError;
    use std::cell::Cell;

    #[test]
    fn a_directory_is_listed_once_per_pass() {
        let l = Listings::new();
        let calls = Cell::new(0);
        let list = |v: u32| {
            let calls = &calls;
            move || {
                calls.set(calls.get() + 1);
                Ok(vec![v, v + 1])
            }
        };
        assert_eq!(*l.get(7, 0, list(10)).unwrap(), [10, 11]);
        assert_eq!(*l.get(7, 1, list(20)).unwrap(), [10, 11], "later offsets continue the snapshot");
        assert_eq!(*l.get(7, 2, list(20)).unwrap(), [10, 11]);
        assert_eq!(calls.get(), 1);
        assert_eq!(*l.get(8, 1, list(30)).unwrap(), [30, 31], "another open directory has its own");
        assert_eq!(*l.get(7, 0, list(40)).unwrap(), [40, 41], "a rewind lists again");
        l.forget(7);
        assert_eq!(*l.get(7, 1, list(50)).unwrap(), [50, 51], "a closed directory's listing is gone");
        let failed: FsResult<Vec<u32>> = Err(FsError::code(crate::Errno::EIO, "down"));
        assert!(l.get(9, 0, || failed).is_err());
        assert_eq!(*l.get(7, 1, list(60)).unwrap(), [50, 51], "a failed listing leaves the others");
    }
}
