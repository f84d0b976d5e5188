//! The FUSE mount (cargo feature `fuse`, through `fuser` 0.18).
//!
//! Inode numbers are stripefs handles (the root is handle 1 = `FUSE_ROOT_ID`). By default files
//! are opened with `FOPEN_DIRECT_IO`, so the kernel keeps no page cache of their data and every
//! read and write goes to the io servers — the PVFS semantics of the library, unchanged — but
//! for the pages of a file mapped shared, which the kernel caches and writes back.
//! Attributes and entries are cached by the kernel for one second; the direct mount lists
//! directories with their entries' attributes (see `listing`).
//!
//! The kernel-cached mode ([`MountOptions::kernel_cache`]) trades that for the kernel's page
//! cache and write-back: reads are served from memory, writes are gathered in dirty pages and
//! reach the io servers when the kernel writes them back — at the latest at `close`, `fsync`
//! or `msync`. It keeps close-to-open consistency: the kernel writes a file's dirty pages back
//! before it sends the FLUSH of a `close`, so they are on the io servers when `close` returns
//! (an error of that write-back is `close`'s), and an `open` drops what the kernel cached of a
//! file unless the file is as this mount last saw it (its size and modification time). In this
//! mode the kernel keeps a regular file's size and modification time itself, takes neither
//! from attribute replies, and sends them with its write-back (writes, then SETATTR).
//!
//! Permissions: the mount asks the kernel to check mode bits itself (`default_permissions`)
//! against the attributes it is given, and serves every request as the process that made it:
//! the request's user and group, with the supplementary groups read from `/proc/<pid>/status`
//! (none if that cannot be read: the mount then runs in another PID namespace than its
//! callers), so the meta server applies the same rules and what a process creates is its own.
//! Other users than the one who mounted reach the mount only with `allow_other`
//! ([`MountOptions::allow_other`]; for a user who is not root, `/etc/fuse.conf` must have
//! `user_allow_other`).
//!
//! A file whose last name goes while the mount holds it open keeps its data until the last
//! close, under a hidden name (see `unlinked`).
//!
//! Durability follows the open flags: a write to a file opened with `O_SYNC` or `O_DSYNC` (or
//! one carrying `RWF_SYNC`/`RWF_DSYNC`, which the kernel passes in the write's flags) is
//! acknowledged only after the io servers holding its bytes fsynced them; `fsync` and
//! `fdatasync` sync every io server of the file. In the kernel-cached mode the kernel writes
//! the dirty pages back and then sends an FSYNC, for `fsync`, `fdatasync` and after a
//! synchronous write alike, so the same holds.

use crate::capability::Rights;
use crate::client::{Client, CreateOptions, File, Stat};
use crate::proto::{Attr, Cred, FileKind, Handle, SetAttr, SetTime};
use crate::{FsError, FsResult, lock};
use fuser::{
    FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, IoctlFlags, OpenFlags, PollEvents,
    PollFlags, PollNotifier, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyPoll, ReplyStatfs, ReplyWrite,
    Request, TimeOrNow, WriteFlags,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};
use tracing::{debug, warn};

mod attrs;
mod cached;
mod listing;
mod session;
mod sizes;
mod unlinked;
mod unreachable;
use attrs::{file_attr, file_type, mknod_kind, stamp};
use cached::Seen;
use listing::{DirItem, Listings};

pub use session::{DEFAULT_READ_AHEAD, MountOptions, mount, mount_notify};

const TTL: Duration = Duration::from_secs(1);
/// The block size `statfs` counts space in (and suggests for I/O).
const STATFS_BLOCK: u32 = 4096;

/// stripefs as a FUSE file system.
#[derive(Debug)]
pub struct StripeFuse {
    client: Client,
    files: Mutex<HashMap<u64, Open>>,
    dirs: Listings<DirItem>,
    next_fh: AtomicU64,
    /// Files held open, and hidden names of those unlinked meanwhile (see `unlinked`).
    opened: unlinked::Opened,
    /// The directory of hidden names, once looked up or made.
    hidden_dir: Mutex<Option<Handle>>,
    /// This host's name, for hidden names.
    host: String,
    /// Refuse every change with `EROFS` (a read-only mount; the kernel refuses most of them
    /// itself, this covers whatever reaches the file system anyway).
    read_only: bool,
    /// Told once the kernel has initialised the mount (see [`mount_notify`]).
    on_ready: Ready,
    /// Serve regular files through the kernel's page cache with write-back
    /// ([`MountOptions::kernel_cache`]).
    kernel_cache: bool,
    /// In the kernel-cached mode: each file as this mount last saw it on the servers, to tell
    /// at the next open whether what the kernel cached of it is still right.
    seen: Mutex<HashMap<u64, Seen>>,
    /// Tells the kernel of a file's new size (set once the session exists).
    notifier: Arc<OnceLock<fuser::Notifier>>,
    /// In the direct mode: files' sizes told the kernel lately, for attribute changes.
    sizes: sizes::KnownSizes,
    /// Tells [`mount_notify`] that the session has ended, as the session lets go of the file
    /// system.
    on_end: session::OnEnd,
}

/// What to run once the mount is live (in a mutex only because the file system is shared
/// between threads; it runs once).
#[derive(Default)]
struct Ready(Mutex<Option<Box<dyn FnOnce() + Send>>>);

impl std::fmt::Debug for Ready {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ready")
    }
}

/// An open file and the flags it was opened with.
#[derive(Debug, Clone)]
struct Open {
    file: Arc<File>,
    flags: i32,
    /// In the kernel-cached mode, for a file its caller may only write: the same file opened
    /// for reading by the mounting user, for the page reads the kernel makes on its own (see
    /// [`StripeFuse::open_cached`]).
    reader: Option<Arc<File>>,
}

/// What a write with open (or write) `flags` must make durable before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteSync {
    /// Nothing: the data reached the io servers.
    None,
    /// `O_DSYNC`: the data, and what is needed to read it back (the size, kept by the io
    /// servers with the data).
    Data,
    /// `O_SYNC`: that, and the file's other metadata (its modification time).
    File,
}

impl WriteSync {
    fn of(flags: i32) -> WriteSync {
        // O_SYNC is O_DSYNC plus a bit of its own.
        if flags & libc::O_SYNC == libc::O_SYNC {
            WriteSync::File
        } else if flags & libc::O_DSYNC != 0 {
            WriteSync::Data
        } else {
            WriteSync::None
        }
    }
}

fn errno(e: &FsError) -> fuser::Errno {
    debug!(error = %e, "fuse operation failed");
    fuser::Errno::from_i32(unreachable::answer(e))
}

/// The errno for an operation on a file by its handle, not by a name: a file no longer there
/// (another client removed it, or renamed another over it) is `ESTALE`, as NFS has it. On that
/// the kernel looks the name up afresh and finds what is there now, where it would pass
/// `ENOENT` on for as long as it keeps the name.
fn stale(e: &FsError) -> fuser::Errno {
    match e.errno() {
        crate::Errno::ENOENT => fuser::Errno::from_i32(libc::ESTALE),
        _ => errno(e),
    }
}

/// The credentials of the process that made `req` (see the module documentation).
fn caller(req: &Request) -> Cred {
    Cred::new(req.uid(), req.gid(), supplementary_groups(req.pid()).unwrap_or_default())
}

/// The supplementary groups of process (thread) `pid`, from its `/proc` status.
fn supplementary_groups(pid: u32) -> Option<Vec<u32>> {
    if pid == 0 {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_groups(&status)
}

fn parse_groups(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("Groups:"))?;
    Some(line.split_whitespace().filter_map(|g| g.parse().ok()).collect())
}

/// The rights an open with `flags` needs from the meta server.
fn open_rights(flags: i32) -> Rights {
    match flags & libc::O_ACCMODE {
        libc::O_RDONLY => Rights::READ,
        libc::O_WRONLY => Rights::WRITE,
        _ => Rights::READ_WRITE,
    }
}

/// Most bytes one `copy_file_range` request copies.
const COPY_PER_REQUEST: u64 = 64 << 20;

fn name(n: &OsStr) -> FsResult<&str> {
    n.to_str().ok_or_else(|| FsError::code(crate::Errno::EINVAL, "names are UTF-8"))
}

impl StripeFuse {
    /// A file system serving `client`'s cluster.
    pub fn new(client: Client) -> Self {
        StripeFuse {
            client,
            files: Mutex::new(HashMap::new()),
            dirs: Listings::new(),
            next_fh: AtomicU64::new(1),
            opened: unlinked::Opened::default(),
            hidden_dir: Mutex::new(None),
            host: unlinked::host(),
            read_only: false,
            on_ready: Ready::default(),
            kernel_cache: false,
            seen: Mutex::new(HashMap::new()),
            notifier: Arc::new(OnceLock::new()),
            sizes: sizes::KnownSizes::new(TTL),
            on_end: session::OnEnd::default(),
        }
    }

    /// Serves regular files through the kernel's page cache with write-back (see
    /// [`MountOptions::kernel_cache`]).
    pub fn kernel_cache(mut self, on: bool) -> Self {
        self.kernel_cache = on;
        self
    }

    /// Refuses every change with `EROFS`.
    pub fn read_only(mut self, ro: bool) -> Self {
        self.read_only = ro;
        self
    }

    /// `EROFS` if this mount is read-only.
    fn writable(&self) -> Result<(), fuser::Errno> {
        if self.read_only { Err(fuser::Errno::from_i32(libc::EROFS)) } else { Ok(()) }
    }

    /// The directory of hidden names, made (0700, the mounting user's) if `create`.
    fn hidden_dir(&self, create: bool) -> FsResult<Handle> {
        let mut dir = lock(&self.hidden_dir);
        if let Some(h) = *dir {
            return Ok(h);
        }
        let h = match self.client.lookup(Handle::ROOT, unlinked::DIR) {
            Ok((h, _)) => h,
            Err(e) if e.errno() == crate::Errno::ENOENT && create => {
                match self.client.mkdir_in(Handle::ROOT, unlinked::DIR, 0o700) {
                    Ok((h, _)) => h,
                    // Another mount made it meanwhile.
                    Err(e) if e.errno() == crate::Errno::EEXIST => {
                        self.client.lookup(Handle::ROOT, unlinked::DIR)?.0
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        *dir = Some(h);
        Ok(h)
    }

    /// Before `c` removes or replaces `name` in `parent`: if that is the last name of a file
    /// this mount holds open, gives the file a hidden name so its data outlives the removal
    /// until the last close. Returns the file so a failed removal can undo it.
    fn keep_if_open(&self, c: &Client, parent: Handle, name: &str) -> Option<Handle> {
        if !self.opened.any() {
            return None;
        }
        let (h, a) = c.lookup(parent, name).ok()?;
        if a.kind != FileKind::File || a.nlink > 1 || !self.opened.needs_hiding(h) {
            return None;
        }
        let hidden = unlinked::hidden_name(&self.host, std::process::id(), h);
        let link = || self.hidden_dir(true).and_then(|dir| self.client.link_in(h, dir, &hidden));
        let linked = link().or_else(|e| {
            // The directory may have been removed since it was looked up: once more, afresh.
            if e.errno() != crate::Errno::ENOENT {
                return Err(e);
            }
            *lock(&self.hidden_dir) = None;
            link()
        });
        match linked {
            Ok(_) if self.opened.hide(h, hidden.clone()) => Some(h),
            Ok(_) => {
                // Closed meanwhile: the removal may take the file, and the name must go.
                self.drop_hidden(h, &hidden);
                None
            }
            Err(e) => {
                warn!(handle = %h, error = %e, "cannot keep an open file's data past its unlink");
                None
            }
        }
    }

    /// Undoes [`StripeFuse::keep_if_open`] after the removal it was made for failed.
    fn undo_keep(&self, kept: Option<Handle>) {
        if let Some(h) = kept
            && let Some(hidden) = self.opened.unhide(h)
        {
            self.drop_hidden(h, &hidden);
        }
    }

    /// Removes `h`'s hidden name (its last close, before or while the name was made, or the
    /// removal it was made for failed).
    fn drop_hidden(&self, h: Handle, hidden: &str) {
        let r = self.hidden_dir(false).and_then(|dir| self.client.unlink_in(dir, hidden));
        if let Err(e) = r {
            warn!(handle = %h, name = hidden, error = %e, "cannot remove a hidden name");
        }
    }

    /// Removes the hidden names that mounts on this host which are no longer running left.
    fn drop_stale_hidden(&self) {
        let Ok(dir) = self.hidden_dir(false) else { return };
        let Ok(entries) = self.client.readdir_handle(dir) else { return };
        let names: Vec<String> = entries.into_iter().map(|e| e.name.into_string()).collect();
        for n in unlinked::stale(&names, &self.host, |pid| Path::new(&format!("/proc/{pid}")).exists()) {
            debug!(name = n, "removing a hidden name left by a mount that is gone");
            if let Err(e) = self.client.unlink_in(dir, n) {
                warn!(name = n, error = %e, "cannot remove a stale hidden name");
            }
        }
    }

    /// The client acting for the process that made `req`.
    fn as_caller(&self, req: &Request) -> Client {
        self.client.as_caller(caller(req))
    }

    fn attr(&self, h: Handle) -> FsResult<FileAttr> {
        Ok(self.stat_attr(self.client.stat_handle(h)?))
    }

    /// The kernel's attributes from `st`, just given by the servers: a file's size and space
    /// are kept for attribute changes.
    fn stat_attr(&self, st: Stat) -> FileAttr {
        self.told(st.handle, &st.attr, st.allocated);
        self.attr_of(st.handle, &st.attr, Some(st.allocated))
    }

    /// `attr` and `allocated`, just given by the servers: a file's size and space are kept for
    /// attribute changes.
    fn told(&self, h: Handle, attr: &Attr, allocated: u64) {
        if attr.kind == FileKind::File && !self.kernel_cache {
            self.sizes.learnt(h, attr.size, allocated);
        }
    }

    /// The kernel's attributes of `h`, whose stat gave `attr` (and `allocated`, if known).
    fn attr_of(&self, h: Handle, attr: &Attr, allocated: Option<u64>) -> FileAttr {
        let mut a = file_attr(h, attr, allocated);
        if self.opened.is_hidden(h) {
            // Unlinked while open: its hidden name is not one the caller gave it.
            a.nlink = a.nlink.saturating_sub(1);
        }
        a
    }

    fn remember(&self, f: File, flags: i32, reader: Option<File>) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.opened.opened(f.handle());
        lock(&self.files).insert(fh, Open { file: Arc::new(f), flags, reader: reader.map(Arc::new) });
        FileHandle(fh)
    }

    fn open_file(&self, fh: FileHandle) -> Option<Open> {
        lock(&self.files).get(&fh.0).cloned()
    }

    /// This mount's opens of `h` by user `uid` that wrote since they last recorded the time,
    /// which they now will not.
    fn forget_write_times(&self, h: Handle, uid: u32) -> Vec<Arc<File>> {
        let files = lock(&self.files);
        files
            .values()
            .filter(|o| {
                o.file.handle() == h && o.file.client().cred().uid == uid && o.file.forget_write_time()
            })
            .map(|o| o.file.clone())
            .collect()
    }

    fn file(&self, fh: FileHandle) -> Option<Arc<File>> {
        self.open_file(fh).map(|o| o.file)
    }

    /// Writes `data` at `offset`, then makes it as durable as `sync` asks before returning.
    fn write_synced(f: &File, offset: u64, data: &[u8], sync: WriteSync) -> FsResult<usize> {
        let n = f.write_all_at(offset, data)?;
        if sync != WriteSync::None {
            f.sync_range(offset, n as u64)?;
        }
        if sync == WriteSync::File {
            f.record_mtime()?;
        }
        Ok(n)
    }

    fn entry(&self, r: FsResult<(Handle, Attr)>, reply: ReplyEntry) {
        // Only a regular file's size needs the io servers; the rest came with the entry.
        match r.and_then(|(h, a)| self.client.stat_with(h, a)) {
            Ok(Ok(st)) => reply.entry(&TTL, &self.stat_attr(st), Generation(0)),
            Ok(Err(unknown)) if !self.kernel_cache => {
                // An io server of the file's layout is down (or failed): its name can still be
                // renamed, linked and removed, which need no size. The entry carries what the
                // meta server knows, valid for no time, so that whatever needs the size (a
                // `stat`, a read) asks again and fails as that server does. (The kernel-cached
                // mode keeps the first size it is given for as long as it keeps the file, so
                // it is given none it would have to take back.)
                unreachable::note(&unknown.error);
                let attr = Attr { size: 0, ..unknown.stat.attr };
                reply.entry(
                    &Duration::ZERO,
                    &self.attr_of(unknown.stat.handle, &attr, Some(0)),
                    Generation(0),
                );
            }
            Ok(Err(unknown)) => reply.error(errno(&unknown.error)),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

impl Filesystem for StripeFuse {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        // The request sizes stay fuser's and the kernel's (max_write, max pages): write-back
        // sends dirty pages in requests as large as the direct mode's writes.
        if self.kernel_cache
            && let Err(missing) = config.add_capabilities(fuser::InitFlags::FUSE_WRITEBACK_CACHE)
        {
            return Err(std::io::Error::other(format!(
                "the kernel-cached mount needs write-back caching, which this kernel does not offer \
                 ({missing:?})"
            )));
        }
        // Direct I/O files may then be mapped shared (databases map files so: SQLite's
        // write-ahead log), through the page cache, which the kernel writes back and keeps in
        // step with this host's direct reads and writes of the file. Kernels before 6.6 do
        // not offer it, and refuse such mappings (ENODEV) as before.
        if !self.kernel_cache
            && let Err(missing) = config.add_capabilities(fuser::InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
        {
            tracing::info!(?missing, "this kernel does not map direct I/O files shared");
        }
        // Look-ups and listings of one directory reach the file system together, as libfuse
        // lets them by default, instead of one at a time as the kernel otherwise holds them:
        // parallel builds and tools look up many names in one directory at once.
        if let Err(missing) = config.add_capabilities(fuser::InitFlags::FUSE_PARALLEL_DIROPS) {
            tracing::info!(?missing, "this kernel looks up one name of a directory at a time");
        }
        // An asynchronous direct read or write (io_submit, io_uring; a database's O_DIRECT
        // I/O) goes to the file system as it is submitted, several at once, instead of one
        // after another as the submitter's own blocking calls would. The kernel cuts such a
        // read at the file's size as it knows it (its attributes are a second old at most),
        // as `O_APPEND` goes to that size; synchronous reads go whole to the io servers.
        if let Err(missing) = config.add_capabilities(fuser::InitFlags::FUSE_ASYNC_DIO) {
            tracing::info!(?missing, "this kernel serves asynchronous direct I/O one request at a time");
        }
        // Listings with each entry's attributes (`ls -l` without a look-up per entry), when the
        // kernel sees them used. The direct mode only: the kernel-cached mode keeps its own
        // sizes and times, and its record of what it saw of each file.
        if !self.kernel_cache
            && let Err(missing) = config.add_capabilities(
                fuser::InitFlags::FUSE_DO_READDIRPLUS | fuser::InitFlags::FUSE_READDIRPLUS_AUTO,
            )
        {
            tracing::info!(?missing, "this kernel does not list directories with attributes");
        }
        let ready = lock(&self.on_ready.0).take();
        if let Some(ready) = ready {
            ready();
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        self.entry(name(n).and_then(|n| self.as_caller(req).lookup(Handle(parent.0), n)), reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        // The kernel sends FORGET as it drops the inode, and its cached pages with it: the
        // next open starts from nothing, so what this mount saw of the file no longer matters
        // (and a mount that opens many files does not keep a record of each).
        if self.kernel_cache {
            lock(&self.seen).remove(&ino.0);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let h = Handle(ino.0);
        // A size told the kernel lately stands (the kernel asks again after this mount's
        // writes, and before a `chown`, to see the mode).
        let r = match self.sizes.fresh(h) {
            Some(f) => self
                .client
                .getattr(h)
                .map(|a| (self.attr_of(h, &Attr { size: f.size, ..a }, Some(f.allocated)), f.left)),
            None => self.attr(h).map(|a| (a, TTL)),
        };
        match r {
            Ok((a, ttl)) => reply.attr(&ttl, &a),
            Err(e) => reply.error(stale(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let h = Handle(ino.0);
        let c = self.as_caller(req);
        // A time set now supersedes the times of the caller's writes before it, which their
        // opens would otherwise record at their close or sync, over it: `tar -x` and `cp -p`
        // set each file's time through the descriptor that wrote it, before closing it. What
        // else those records do (clear set-id bits after a write by a user other than root)
        // this change does in their place, as the same user.
        let superseded = match mtime {
            Some(_) => self.forget_write_times(h, c.cred().uid),
            None => Vec::new(),
        };
        let set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            atime: atime.map(stamp),
            mtime: mtime.map(stamp),
            size,
            // Through a descriptor: the kernel checked the open, and refuses ftruncate on
            // one not opened for writing.
            opened_for_write: fh.is_some(),
            wrote: !superseded.is_empty(),
            sync: false,
        };
        // Without a new size, the kernel-cached mode takes none from the reply, and the direct
        // mode's kernel would show one told it within its time-to-live anyway.
        let known = match set.size {
            Some(_) => None,
            None if self.kernel_cache => Some((None, TTL)),
            None => self.sizes.fresh(h).map(|f| (Some((f.size, f.allocated)), f.left)),
        };
        let change = |set: SetAttr| match known {
            Some((Some((size, allocated)), left)) => {
                c.setattr(h, set).map(|a| (self.attr_of(h, &Attr { size, ..a }, Some(allocated)), left))
            }
            Some((None, left)) => c.setattr(h, set).map(|a| (self.attr_of(h, &a, None), left)),
            None => c.setattr_stat(h, set).map(|st| (self.stat_attr(st), TTL)),
        };
        let r = match change(set.clone()) {
            // With write-back caching the kernel keeps a file's times itself and sends them as
            // explicit times: for a write (its own time) and for `utimensat` to "now" alike.
            // The meta server lets only the owner set explicit times, but the kernel has already
            // refused an explicit time from anyone else, so what reaches here from another user
            // stands for "now", which a writer may set.
            Err(e)
                if self.kernel_cache
                    && e.errno() == crate::Errno::EPERM
                    && (set.atime.is_some() || set.mtime.is_some()) =>
            {
                let now = |t: Option<SetTime>| t.map(|_| SetTime::Now);
                change(SetAttr { atime: now(set.atime), mtime: now(set.mtime), ..set })
            }
            r => r,
        };
        if r.is_err() {
            superseded.iter().for_each(|f| f.keep_write_time());
        }
        match r {
            // The attribute time-to-live is the direct mode's (less what a known size has used
            // of it). The kernel-cached mode needs no longer one: the kernel takes no size or
            // modification time from these replies for a regular file (it keeps its own), and
            // the rest (mode, owner, links) should follow other clients' changes as soon as in
            // the direct mode.
            Ok((a, ttl)) => reply.attr(&ttl, &a),
            Err(e) => reply.error(stale(&e)),
        }
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, n: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let c = self.as_caller(req);
        self.entry(name(n).and_then(|n| c.mkdir_in(Handle(parent.0), n, mode & !umask)), reply);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let c = self.as_caller(req);
        let perm = mode & !umask & 0o7777;
        let r = name(n).and_then(|n| match mknod_kind(mode, rdev)? {
            Some(kind) => c.mknod_in(Handle(parent.0), n, kind, perm),
            None => {
                let f = c.create_in(Handle(parent.0), n, CreateOptions { mode: perm, layout: None })?;
                Ok((f.handle(), f.attr().clone()))
            }
        });
        self.entry(r, reply);
    }

    fn symlink(&self, req: &Request, parent: INodeNo, n: &OsStr, target: &Path, reply: ReplyEntry) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let target =
            target.to_str().ok_or_else(|| FsError::code(crate::Errno::EINVAL, "link targets are UTF-8"));
        let c = self.as_caller(req);
        let r = name(n).and_then(|n| target.and_then(|t| c.symlink_in(Handle(parent.0), n, t)));
        self.entry(r, reply);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.client.readlink_handle(Handle(ino.0)) {
            Ok(t) => reply.data(t.as_bytes()),
            Err(e) => reply.error(stale(&e)),
        }
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let h = Handle(ino.0);
        let r = name(newname).and_then(|n| self.as_caller(req).link_in(h, Handle(newparent.0), n));
        self.entry(r.map(|a| (h, a)), reply);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let c = self.as_caller(req);
        let r = name(n).and_then(|n| {
            let kept = self.keep_if_open(&c, Handle(parent.0), n);
            c.unlink_in(Handle(parent.0), n).inspect_err(|_| self.undo_keep(kept))
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        match name(n).and_then(|n| self.as_caller(req).rmdir_in(Handle(parent.0), n)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        if !flags.is_empty() {
            // RENAME_NOREPLACE / EXCHANGE are not supported; callers fall back to plain rename.
            reply.error(fuser::Errno::EINVAL);
            return;
        }
        let c = self.as_caller(req);
        let r = name(n).and_then(|a| {
            name(newname).and_then(|b| {
                let kept = self.keep_if_open(&c, Handle(newparent.0), b);
                c.rename_in(Handle(parent.0), a, Handle(newparent.0), b).inspect_err(|_| self.undo_keep(kept))
            })
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let changes = flags.0 & libc::O_ACCMODE != libc::O_RDONLY || flags.0 & libc::O_TRUNC != 0;
        if changes && let Err(e) = self.writable() {
            return reply.error(e);
        }
        let c = self.as_caller(req);
        let h = Handle(ino.0);
        let r = if self.kernel_cache {
            self.open_cached(&c, h, flags.0)
        } else {
            c.open_handle(h, open_rights(flags.0))
                .map(|f| (self.remember(f, flags.0, None), FopenFlags::FOPEN_DIRECT_IO))
        };
        match r {
            Ok((fh, fopen)) => reply.opened(fh, fopen),
            Err(e) => reply.error(stale(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let Some(o) = self.open_file(fh) else { return reply.error(fuser::Errno::EBADF) };
        let f = o.reader.unwrap_or(o.file);
        match f.read_kept(offset, size as usize) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(stale(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let Some(o) = self.open_file(fh) else { return reply.error(fuser::Errno::EBADF) };
        // The write's flags are the file's, plus RWF_SYNC / RWF_DSYNC of this write on kernels
        // that pass them; the open's flags are kept too, in case a kernel passes none.
        let sync = if self.kernel_cache {
            // Write-back: the kernel follows an O_SYNC / O_DSYNC write(2) with an FSYNC of
            // what it wrote (and its times), which `fsync` below makes durable.
            WriteSync::None
        } else {
            WriteSync::of(o.flags | flags.0)
        };
        match Self::write_synced(&o.file, offset, data, sync) {
            Ok(n) => {
                self.sizes.wrote(o.file.handle(), offset + n as u64, n as u64);
                reply.written(n as u32)
            }
            Err(e) => reply.error(stale(&e)),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // Without this the kernel copies through a pipe in 64 KiB pieces, each a round trip
        // to the io servers. The kernel checked the descriptors' modes, the flags and that the
        // ranges of one file do not overlap; in the kernel-cached mode it wrote both ranges'
        // dirty pages back first and drops the copy's range from its cache after.
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let (Some(src), Some(dst)) = (self.open_file(fh_in), self.open_file(fh_out)) else {
            return reply.error(fuser::Errno::EBADF);
        };
        let sync = if self.kernel_cache { WriteSync::None } else { WriteSync::of(dst.flags) };
        let from = src.reader.unwrap_or(src.file);
        // The answer counts in 32 bits, and a request is not interrupted: a caller asks again
        // for the rest, piece by piece.
        let r = from.copy_range(offset_in, &dst.file, offset_out, len.min(COPY_PER_REQUEST)).and_then(|n| {
            if sync != WriteSync::None && n > 0 {
                dst.file.sync_range(offset_out, n)?;
            }
            if sync == WriteSync::File {
                dst.file.record_mtime()?;
            }
            Ok(n)
        });
        // Known or not, the destination's size is the servers' again (a concurrent look-up may
        // have learnt it before the copy).
        self.sizes.forget(dst.file.handle());
        match r {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(stale(&e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _lo: fuser::LockOwner, reply: ReplyEmpty) {
        if self.kernel_cache {
            // The kernel wrote the dirty pages back and sent its modification time before this
            // FLUSH (an error of that write-back fails the `close` itself), so the data is on
            // the io servers; recording "now" as the time here would overwrite a time set since
            // (`cp -p` sets it before closing). The file as the servers have it now is what
            // the kernel caches: recorded, so that the next open here keeps the pages.
            let Some(o) = self.open_file(fh) else { return reply.error(fuser::Errno::EBADF) };
            if o.flags & libc::O_ACCMODE != libc::O_RDONLY {
                self.saw(o.file.handle());
            }
            return reply.ok();
        }
        // No client-side data to flush (every write already reached the io servers), but the
        // writes' modification time goes to the meta server now: `close` waits for a flush, so
        // a `utimes` after it (rsync -t) comes later and wins, and one before it (tar, cp -p)
        // made this open forget its writes' time. Durable with the meta server's next flush,
        // or the file's next fsync, as a local file system's times are.
        let Some(f) = self.file(fh) else { return reply.error(fuser::Errno::EBADF) };
        match f.record_mtime() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(stale(&e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let closed = lock(&self.files).remove(&fh.0);
        if let Some(o) = closed {
            let h = o.file.handle();
            if let Some(hidden) = self.opened.closed(h) {
                self.drop_hidden(h, &hidden);
            }
        }
        reply.ok();
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let Some(f) = self.file(fh) else { return reply.error(fuser::Errno::EBADF) };
        let r = match mode {
            0 => f.allocate(offset, length),
            // The kernel has written back and dropped its pages of the range first.
            m if m == libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE => f.punch_hole(offset, length),
            // Zeroing, collapsing and inserting ranges are not offered.
            _ => return reply.error(fuser::Errno::from_i32(libc::EOPNOTSUPP)),
        };
        self.sizes.forget(f.handle());
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(stale(&e)),
        }
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let Some(f) = self.file(fh) else { return reply.error(fuser::Errno::EBADF) };
        // Kernel-cached: the kernel wrote the dirty pages back and sent its times before this
        // FSYNC; the mount keeps them (see `flush`) and makes the data durable.
        let r = if self.kernel_cache { f.sync_data() } else { f.sync() };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(stale(&e)),
        }
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // Every change of names is durable on the meta server when it returns; a change of
        // the directory's times (or mode bits added) waits for the meta server's flush.
        match self.client.sync_metadata() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        // The kernel asks again at every call, whatever the answer: `isatty` (Python's `open`
        // makes one on every file) is told it has no terminal, with no warning logged apiece.
        reply.error(fuser::Errno::from_i32(libc::ENOTTY));
    }

    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        _events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
    ) {
        // A stripefs file is always ready, which the kernel takes this answer to mean, and
        // then stops asking.
        reply.error(fuser::Errno::ENOSYS);
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // The first page is listed now, not at the first read: the kernel looks the path of a
        // directory whose open fails ESTALE (another client replaced it) up again, which it
        // does not for a read.
        let fh = FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed));
        match self.open_listing(req, ino, fh) {
            Ok(()) => reply.opened(fh, FopenFlags::empty()),
            Err(e) => reply.error(stale(&e)),
        }
    }

    fn readdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectory) {
        self.list(req, ino, fh, offset, reply);
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.list_plus(req, ino, fh, offset, reply);
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs.forget(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Space from the io servers (their file systems added up), counts from the meta server.
        // An io server down is left out of the space (and logged), so `df` goes on working.
        match self.client.statfs().and_then(|s| Ok((s, self.client.disk_space()?))) {
            Ok((s, space)) => {
                for e in &space.missing {
                    unreachable::note(e);
                }
                let d = space.space;
                let blocks = |bytes: u64| bytes / STATFS_BLOCK as u64;
                // Handles are never reused and never run out: the free count is "unlimited",
                // and the total is what is in use beside it (`df -i` shows their difference).
                let free = u64::MAX / 2;
                reply.statfs(
                    blocks(d.total),
                    blocks(d.free),
                    blocks(d.avail),
                    (s.files + s.dirs).saturating_add(free),
                    free,
                    STATFS_BLOCK,
                    s.name_max,
                    STATFS_BLOCK,
                )
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getxattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, _size: u32, reply: fuser::ReplyXattr) {
        // No extended attributes: the kernel then answers every later ask itself (EOPNOTSUPP,
        // as for `setxattr`). "No such attribute" instead would bring a request to each
        // `chown`, which asks for the file's `security.capability`.
        reply.error(fuser::Errno::from_i32(libc::ENOSYS));
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        // Files keep no extended attributes; `cp -a` and the like go on without them.
        reply.error(fuser::Errno::from_i32(libc::EOPNOTSUPP));
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(fuser::Errno::from_i32(libc::ENOSYS));
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: fuser::ReplyLseek,
    ) {
        // Only SEEK_DATA and SEEK_HOLE come here (the kernel does the rest). In the
        // kernel-cached mode the kernel's pages may hold data the io servers have not got yet,
        // which their answer would call a hole, and the kernel does not write them back
        // first: not answering makes it take the whole file for data, up to the size it
        // knows (for every file, as it then asks no more).
        if self.kernel_cache {
            return reply.error(fuser::Errno::ENOSYS);
        }
        let Some(f) = self.file(fh) else { return reply.error(fuser::Errno::EBADF) };
        let Ok(off) = u64::try_from(offset) else { return reply.error(fuser::Errno::from_i32(libc::ENXIO)) };
        let hole = match whence {
            libc::SEEK_DATA => false,
            libc::SEEK_HOLE => true,
            _ => return reply.error(fuser::Errno::EINVAL),
        };
        let found = match if hole { f.next_hole(off) } else { f.next_data(off) } {
            // Opened only for writing: where the data lies is not this open's to learn, but
            // the whole file may be taken for data, as a file system without holes would.
            Err(e) if e.errno() == crate::Errno::EACCES => {
                f.size().map(|size| (off < size).then_some(if hole { size } else { off }))
            }
            r => r,
        };
        match found {
            Ok(Some(at)) => reply.offset(i64::try_from(at).unwrap_or(i64::MAX)),
            Ok(None) => reply.error(fuser::Errno::from_i32(libc::ENXIO)),
            Err(e) => reply.error(stale(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        if size == 0 { reply.size(0) } else { reply.data(&[]) }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let opts = CreateOptions { mode: mode & !umask & 0o7777, layout: None };
        match name(n).and_then(|n| self.as_caller(req).create_in(Handle(parent.0), n, opts)) {
            Ok(f) => {
                self.told(f.handle(), f.attr(), 0);
                let a = file_attr(f.handle(), f.attr(), Some(0));
                let fopen = if self.kernel_cache {
                    // New and empty: nothing cached to drop or keep.
                    lock(&self.seen).insert(f.handle().0, Seen::of(f.attr()));
                    FopenFlags::empty()
                } else {
                    FopenFlags::FOPEN_DIRECT_IO
                };
                reply.created(&TTL, &a, Generation(0), self.remember(f, flags, None), fopen);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_and_dsync_flags_ask_for_durable_writes() {
        assert_eq!(WriteSync::of(libc::O_WRONLY), WriteSync::None);
        assert_eq!(WriteSync::of(libc::O_RDWR | libc::O_DIRECT | libc::O_APPEND), WriteSync::None);
        assert_eq!(WriteSync::of(libc::O_WRONLY | libc::O_DSYNC), WriteSync::Data);
        assert_eq!(WriteSync::of(libc::O_WRONLY | libc::O_SYNC), WriteSync::File);
        assert_eq!(WriteSync::of(libc::O_DSYNC | libc::O_SYNC), WriteSync::File);
    }
}
