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

/// Open directories' listings, a page at a time. The kernel reads a directory in many calls,
/// each from the offset after the last entry it took; listing the whole directory again for
/// each made reading a large one quadratic, and keeping the whole listing of every open
/// directory let whoever opens a large one many times grow the mount without bound. Each open
/// directory keeps the page it is being read from (at most a meta server's page of entries,
/// and `.` and `..`), and the next page continues after the last name of the one before, as
/// the meta server lists names in order: an entry that stays in the directory is listed once,
/// one made or removed meanwhile may or may not be, as POSIX lets `readdir` do.
#[derive(Debug)]
pub(super) struct Listings<T>(Mutex<HashMap<u64, Page<T>>>);

/// The page an open directory is being read from: its entries from offset `start`, and the name
/// the next page starts after (`None`: this page ends the directory).
#[derive(Debug)]
struct Page<T> {
    start: u64,
    items: Arc<Vec<T>>,
    next: Option<String>,
    /// Listed as the directory was opened and not read from yet: the first read, from offset
    /// 0, takes it rather than listing again.
    fresh: bool,
}

impl<T> Page<T> {
    /// The first page, with `.` and `..`, as `fetch` lists it.
    fn first(fetch: impl FnOnce(Option<&str>) -> FsResult<Fetched<T>>, fresh: bool) -> FsResult<Page<T>> {
        let (items, next) = fetch(None)?;
        Ok(Page { start: 0, items: Arc::new(items), next, fresh })
    }
}

/// A page fetched: its entries and the name the next starts after, if there is a next.
type Fetched<T> = (Vec<T>, Option<String>);

impl<T> Listings<T> {
    pub(super) fn new() -> Self {
        Listings(Mutex::new(HashMap::new()))
    }

    /// Lists the first page of directory `fh` as it is opened, for its first read: a directory
    /// that is gone fails its open, where the kernel can still look its path up again.
    fn open(&self, fh: u64, fetch: impl FnOnce(Option<&str>) -> FsResult<Fetched<T>>) -> FsResult<()> {
        let page = Page::first(fetch, true)?;
        lock(&self.0).insert(fh, page);
        Ok(())
    }

    /// The page of open directory `fh` holding `offset` (or the last page, when `offset` is at
    /// or past the end) and the offset of its first entry. `fetch` lists the page after a name,
    /// or the first (with `.` and `..`). Reading on from the page held fetches the next; a
    /// rewind, or a seek back before the page held, lists again from the start.
    fn get(
        &self,
        fh: u64,
        offset: u64,
        mut fetch: impl FnMut(Option<&str>) -> FsResult<Fetched<T>>,
    ) -> FsResult<(u64, Arc<Vec<T>>)> {
        // The kernel reads one open directory a call at a time, so taking the page out while
        // fetching races with nothing but its close.
        let mut held = lock(&self.0).remove(&fh);
        loop {
            let mut page = match held.take() {
                Some(p) if (offset != 0 || p.fresh) && p.start <= offset => p,
                _ => Page::first(&mut fetch, false)?,
            };
            page.fresh = false;
            let end = page.start + page.items.len() as u64;
            let next = match &page.next {
                Some(after) if offset >= end => after.clone(),
                _ => {
                    let found = (page.start, page.items.clone());
                    lock(&self.0).insert(fh, page);
                    return Ok(found);
                }
            };
            let (items, mut after) = fetch(Some(&next))?;
            if items.is_empty() {
                // A page that says more follows but holds nothing ends the listing here.
                after = None;
            }
            held = Some(Page { start: end, items: Arc::new(items), next: after, fresh: false });
        }
    }

    /// Drops a closed directory's page.
    pub(super) fn forget(&self, fh: u64) {
        lock(&self.0).remove(&fh);
    }
}

impl StripeFuse {
    /// A page of the directory's entries, read from the meta server by `c`: the first (with `.`
    /// and `..`), or the one after name `after`.
    fn listing(&self, c: &Client, ino: INodeNo, after: Option<&str>) -> FsResult<Fetched<DirItem>> {
        let (entries, more) = c.readdir_page(Handle(ino.0), after, crate::proto::MAX_READDIR as u32)?;
        let next = if more { entries.last().map(|e| e.name.to_string()) } else { None };
        let dots = match after {
            None => Vec::from([".", ".."].map(|n| DirItem::new(ino.0, FileType::Directory, n.to_string()))),
            Some(_) => Vec::new(),
        };
        let items =
            entries.into_iter().map(|e| DirItem::new(e.handle.0, file_type(e.kind), e.name.to_string()));
        Ok((dots.into_iter().chain(items).collect(), next))
    }

    /// Lists the first page of directory `ino`, opened as `fh` by `req`'s caller.
    pub(super) fn open_listing(&self, req: &Request, ino: INodeNo, fh: FileHandle) -> FsResult<()> {
        self.dirs.open(fh.0, self.lister(req, ino))
    }

    /// What lists directory `ino`'s pages for `req`'s caller.
    fn lister(&self, req: &Request, ino: INodeNo) -> impl FnMut(Option<&str>) -> FsResult<Fetched<DirItem>> {
        let c = self.as_caller(req);
        move |after| self.listing(&c, ino, after)
    }

    /// The page of the open directory holding `offset`, and the offset of its first entry.
    fn items(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
    ) -> FsResult<(u64, Arc<Vec<DirItem>>)> {
        self.dirs.get(fh.0, offset, self.lister(req, ino))
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
        let (start, items) = match self.items(req, ino, fh, offset) {
            Ok(page) => page,
            Err(e) => return reply.error(stale(&e)),
        };
        for (i, item) in items.iter().enumerate().skip(offset.saturating_sub(start) as usize) {
            if reply.add(INodeNo(item.ino), start + i as u64 + 1, item.kind, &item.name) {
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
        let (start, items) = match self.items(req, ino, fh, offset) {
            Ok(page) => page,
            Err(e) => return reply.error(stale(&e)),
        };
        for (i, item) in items.iter().enumerate().skip(offset.saturating_sub(start) as usize) {
            if item.attr.get().is_none() && !item.is_dot() {
                self.ask_attrs(&items[i..items.len().min(i + PLUS_WINDOW)]);
            }
            let (attr, ttl) = match item.attr.get() {
                Some(Some(a)) => (*a, TTL),
                _ => (item.unknown(), Duration::ZERO),
            };
            if reply.add(INodeNo(item.ino), start + i as u64 + 1, &item.name, &ttl, &attr, Generation(0)) {
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

    /// A directory of `len` entries numbered from `base`, listed `page` at a time: its fetch
    /// counts its calls and takes a page after the name (the number) of the last entry.
    fn dir(
        base: u32,
        len: u32,
        page: u32,
        calls: &Cell<u32>,
    ) -> impl FnMut(Option<&str>) -> FsResult<Fetched<u32>> {
        move |after| {
            calls.set(calls.get() + 1);
            let from = after.map_or(base, |a| a.parse::<u32>().unwrap() + 1);
            let items: Vec<u32> = (from..(from + page).min(base + len)).collect();
            let next = (items.last() < Some(&(base + len - 1))).then(|| items.last().unwrap().to_string());
            Ok((items, next))
        }
    }

    /// Reads open directory `fh` as the kernel does, each call from the offset after the last
    /// entry it took, `per_call` entries a call; what it read and the most entries held.
    fn read_all(
        l: &Listings<u32>,
        fh: u64,
        per_call: u64,
        mut fetch: impl FnMut(Option<&str>) -> FsResult<Fetched<u32>>,
    ) -> (Vec<u32>, usize) {
        let (mut out, mut held, mut offset) = (Vec::new(), 0, 0);
        loop {
            let (start, items) = l.get(fh, offset, &mut fetch).unwrap();
            held = held.max(items.len());
            let taken: Vec<u32> =
                items.iter().skip((offset - start) as usize).take(per_call as usize).copied().collect();
            if taken.is_empty() {
                return (out, held);
            }
            offset += taken.len() as u64;
            out.extend(taken);
        }
    }

    #[test]
    fn a_directory_is_read_a_page_at_a_time() {
        let l = Listings::new();
        let calls = Cell::new(0);
        let (read, held) = read_all(&l, 7, 25, dir(1000, 1000, 256, &calls));
        assert_eq!(read, (1000..2000).collect::<Vec<_>>(), "every entry once, in order");
        assert_eq!(held, 256, "one page held at a time");
        assert_eq!(calls.get(), 4, "each page listed once");

        // Another open directory has its own page; a rewind lists again from the start.
        let other = Cell::new(0);
        assert_eq!(
            l.get(8, 3, dir(5000, 10, 4, &other)).unwrap(),
            (0, Arc::new(vec![5000, 5001, 5002, 5003]))
        );
        assert_eq!(
            l.get(8, 4, dir(5000, 10, 4, &other)).unwrap(),
            (4, Arc::new(vec![5004, 5005, 5006, 5007]))
        );
        assert_eq!(other.get(), 2);
        // A seek back before the page held lists from the start again; one forward skips on.
        assert_eq!(l.get(8, 1, dir(5000, 10, 4, &other)).unwrap().0, 0);
        assert_eq!(l.get(8, 9, dir(5000, 10, 4, &other)).unwrap(), (8, Arc::new(vec![5008, 5009])));
        // At or past the end: the last page, which holds nothing from there.
        assert_eq!(l.get(8, 10, dir(5000, 10, 4, &other)).unwrap().0, 8);
        assert_eq!(
            l.get(8, 0, dir(6000, 2, 4, &other)).unwrap(),
            (0, Arc::new(vec![6000, 6001])),
            "a rewind lists again"
        );

        l.forget(7);
        let again = Cell::new(0);
        assert_eq!(
            l.get(7, 30, dir(3000, 1000, 256, &again)).unwrap().0,
            0,
            "a closed directory's page is gone"
        );
        let failed =
            |_: Option<&str>| -> FsResult<Fetched<u32>> { Err(FsError::code(crate::Errno::EIO, "down")) };
        assert!(l.get(9, 0, failed).is_err());
        assert!(l.get(8, 0, failed).is_err(), "a failed fetch fails the read");
        assert_eq!(l.get(8, 3, dir(7000, 10, 4, &other)).unwrap().1[0], 7000, "and the next lists again");
        // A page listed at the open serves the first read, from offset 0, once.
        let opened = Cell::new(0);
        l.open(11, dir(8000, 10, 4, &opened)).unwrap();
        assert_eq!(l.get(11, 0, dir(9000, 10, 4, &opened)).unwrap().1[0], 8000);
        assert_eq!(l.get(11, 0, dir(9000, 10, 4, &opened)).unwrap().1[0], 9000, "a rewind lists again");
        assert_eq!(opened.get(), 2);
        assert!(l.open(12, failed).is_err(), "a directory that cannot be listed fails its open");
        // A page that says more follows but holds nothing ends the directory.
        let mut stuck = |after: Option<&str>| -> FsResult<Fetched<u32>> {
            Ok(if after.is_none() { (vec![1], Some("1".into())) } else { (vec![], Some("1".into())) })
        };
        assert_eq!(read_all(&l, 10, 5, &mut stuck).0, vec![1]);
    }
}
