//! The meta server's persistent state: namespace, attributes, layouts, per-directory default
//! layouts and handle allocation, in a [`redb`] database (pure Rust, ACID, copy-on-write B-trees,
//! crash-safe commits). Every operation is one write transaction, so a crash leaves either the
//! whole operation or none of it.
//!
//! # Tables
//! * `super`: counters — next handle (monotonic, never reused, unlike PVFS1's inode numbers),
//!   next round-robin base, file and directory counts, the cluster's io server count.
//! * `inodes`: handle → record (attributes, parent, layout or directory default, state).
//! * `dirents`: (directory handle, name) → handle; the key order is the readdir order.
//! * `orphans`: handle → layout of files removed from the namespace whose objects may still exist
//!   on the io servers.
//! * `symlinks`: handle → target of a symbolic link (kept apart from `inodes` so the inode record
//!   keeps its format; a link has no layout and no objects).
//!
//! # Operations that fan out to the io servers
//! The meta server (on the network) drives them in two steps, so nothing is lost or leaked if it
//! crashes or an io server fails in between:
//! * **create**: [`MetaStore::create`] allocates the handle and layout and records the entry as
//!   *pending* (invisible to lookup and readdir, but its name is taken); the server creates the
//!   objects on the io servers, then calls [`MetaStore::commit_create`], or on any failure removes
//!   the objects it made and calls [`MetaStore::abort_create`]. After a restart,
//!   [`MetaStore::pending_creates`] lists creates to clean up the same way.
//! * **unlink** / **rename over a file**: the entry is removed and the file's layout recorded in
//!   `orphans` in the same transaction; the server removes the objects and then calls
//!   [`MetaStore::forget_orphan`]. [`MetaStore::orphans`] lists what is left after a restart.
//! * **truncate**: [`MetaStore::setattr`] records the size and returns the layout; the server
//!   sends each io server its [`Layout::local_size`]. Truncate is idempotent, so a retry after a
//!   failure is the clean-up.

use crate::errno::Errno;
use crate::layout::{Layout, LayoutError};
use crate::proto::{
    Attr, DirEntry, FileKind, FsStats, Handle, LayoutSpec, MAX_LINK_TARGET, MAX_READDIR, Name, SetAttr,
    Timestamp,
};
use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};
use std::ops::Bound;
use std::path::Path;
use tracing::{debug, info, warn};

// The name rule lives with the protocol: clients apply it to every name a server sends.
pub use crate::proto::{NAME_MAX, NameError, validate_name};

/// The base of a new layout of `pcount` of `n` servers, for the round-robin rotation at `next`:
/// the first base from `next`'s on whose servers (`base`, `base + 1`, … modulo `n`) are none of
/// `avoid`, and how many bases were skipped to reach it. When no base avoids them (the stripe
/// count is over the servers left), `next`'s own base: the create is tried there and fails
/// naming a server it needs.
fn pick_base(next: u64, n: u32, pcount: u32, avoid: &[u32]) -> (u32, u64) {
    let n64 = u64::from(n.max(1));
    let at = |skip: u64| ((next % n64 + skip) % n64) as u32;
    let clear = |base: u32| (0..pcount.min(n)).all(|p| !avoid.contains(&((base + p) % n.max(1))));
    (0..n64).find(|&skip| clear(at(skip))).map_or((at(0), 0), |skip| (at(skip), skip))
}

/// Deepest directory chain followed when checking a rename for cycles.
const MAX_DEPTH: u32 = 1 << 16;

const SUPER: TableDefinition<&str, u64> = TableDefinition::new("super");
const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
const DIRENTS: TableDefinition<(u64, &str), u64> = TableDefinition::new("dirents");
const ORPHANS: TableDefinition<u64, &[u8]> = TableDefinition::new("orphans");
const SYMLINKS: TableDefinition<u64, &str> = TableDefinition::new("symlinks");

const K_FORMAT: &str = "format";
const K_NEXT_HANDLE: &str = "next_handle";
const K_NEXT_BASE: &str = "next_base";
const K_FILES: &str = "files";
const K_DIRS: &str = "dirs";
const K_SERVERS: &str = "io_servers";

/// On-disk format version; bumped on incompatible record changes.
const FORMAT: u64 = 1;

/// Why a meta operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    /// No such entry or handle.
    #[error("no such file or directory")]
    NotFound,
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
            MetaError::Exists => Errno::EEXIST,
            MetaError::NotDir => Errno::ENOTDIR,
            MetaError::IsDir => Errno::EISDIR,
            MetaError::IsLink => Errno::ELOOP,
            MetaError::NotEmpty => Errno::ENOTEMPTY,
            MetaError::Name(NameError::TooLong) | MetaError::TargetTooLong => Errno::ENAMETOOLONG,
            MetaError::Name(_) | MetaError::Layout(_) | MetaError::Invalid(_) => Errno::EINVAL,
            MetaError::Busy => Errno::EBUSY,
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

/// Cluster facts and defaults the store needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaConfig {
    /// Number of io servers (fixed for the life of the file system).
    pub n_servers: u32,
    /// Default stripe size.
    pub default_ssize: u64,
    /// Default stripe count; `None` = all io servers.
    pub default_pcount: Option<u32>,
}

impl MetaConfig {
    /// Defaults for `n_servers` io servers: 64 KiB stripes over all of them.
    pub fn new(n_servers: u32) -> Self {
        MetaConfig { n_servers, default_ssize: crate::config::DEFAULT_SSIZE, default_pcount: None }
    }

    /// From a cluster file.
    pub fn from_cluster(c: &crate::config::ClusterConfig) -> Self {
        MetaConfig {
            n_servers: c.n_io_servers(),
            default_ssize: c.layout.ssize,
            default_pcount: c.layout.pcount,
        }
    }
}

/// Permission bits and owner of a new entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Perm {
    /// Permission bits (masked to `0o7777`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum State {
    Pending,
    Committed,
}

/// The stored record of a file or directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Inode {
    attr: Attr,
    /// Containing directory (no hard links, so exactly one); the root is its own parent.
    parent: u64,
    /// Files: the layout.
    layout: Option<Layout>,
    /// Directories: the default layout new entries inherit.
    default: Option<LayoutSpec>,
    state: State,
}

impl Inode {
    fn is_dir(&self) -> bool {
        self.attr.kind == FileKind::Dir
    }
}

/// A file whose objects must be removed (or were just created) on the io servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Objects {
    /// The file.
    pub handle: Handle,
    /// Where its objects are.
    pub layout: Layout,
}

/// A newly created (pending) file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    /// Its handle.
    pub handle: Handle,
    /// Its attributes.
    pub attr: Attr,
    /// Its layout: create one object on each of its servers.
    pub layout: Layout,
}

/// An open file's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenFile {
    /// Attributes.
    pub attr: Attr,
    /// Layout.
    pub layout: Layout,
}

/// Result of [`MetaStore::setattr`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetattrOutcome {
    /// The new attributes.
    pub attr: Attr,
    /// For a size change: the layout and new logical size, to fan out per-server truncates.
    pub truncate: Option<(Layout, u64)>,
}

/// Striping information of a file or directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stripe {
    /// A file's layout.
    pub layout: Option<Layout>,
    /// A directory's default layout.
    pub default: Option<LayoutSpec>,
}

/// The meta server's database.
#[derive(Debug)]
pub struct MetaStore {
    db: Database,
    cfg: MetaConfig,
}

type Tbl<'t, K, V> = redb::Table<'t, K, V>;

/// The tables of one write transaction.
struct Tx<'t> {
    sup: Tbl<'t, &'static str, u64>,
    inodes: Tbl<'t, u64, &'static [u8]>,
    dirents: Tbl<'t, (u64, &'static str), u64>,
    orphans: Tbl<'t, u64, &'static [u8]>,
    links: Tbl<'t, u64, &'static str>,
}

fn encode_rec<T: Serialize>(v: &T) -> Vec<u8> {
    // Encoding plain structs into a Vec cannot fail.
    postcard::to_allocvec(v).unwrap_or_default()
}

fn get_inode(t: &impl ReadableTable<u64, &'static [u8]>, h: u64) -> Result<Option<Inode>, MetaError> {
    match t.get(h)? {
        None => Ok(None),
        Some(v) => postcard::from_bytes(v.value()).map(Some).map_err(|_| MetaError::Corrupt(h)),
    }
}

/// A committed inode, or `NotFound`.
fn live_inode(t: &impl ReadableTable<u64, &'static [u8]>, h: u64) -> Result<Inode, MetaError> {
    match get_inode(t, h)? {
        Some(i) if i.state == State::Committed => Ok(i),
        _ => Err(MetaError::NotFound),
    }
}

fn dir_inode(t: &impl ReadableTable<u64, &'static [u8]>, h: u64) -> Result<Inode, MetaError> {
    let i = live_inode(t, h)?;
    if !i.is_dir() {
        return Err(MetaError::NotDir);
    }
    Ok(i)
}

fn get_entry(
    t: &impl ReadableTable<(u64, &'static str), u64>,
    dir: u64,
    name: &str,
) -> Result<Option<u64>, MetaError> {
    Ok(t.get((dir, name))?.map(|v| v.value()))
}

fn dir_is_empty(t: &impl ReadableTable<(u64, &'static str), u64>, dir: u64) -> Result<bool, MetaError> {
    let mut r = t.range((dir, "")..(dir + 1, ""))?;
    Ok(r.next().is_none())
}

fn counter(t: &impl ReadableTable<&'static str, u64>, k: &str) -> Result<u64, MetaError> {
    Ok(t.get(k)?.map_or(0, |v| v.value()))
}

impl Tx<'_> {
    fn put_inode(&mut self, h: u64, i: &Inode) -> Result<(), MetaError> {
        self.inodes.insert(h, encode_rec(i).as_slice())?;
        Ok(())
    }

    /// Allocates the next handle (never reused), stores `ino` under it and enters it as `name`
    /// in its parent, whose name the caller has found free.
    fn add_entry(&mut self, name: &str, ino: &Inode) -> Result<u64, MetaError> {
        let h = counter(&self.sup, K_NEXT_HANDLE)?;
        self.sup.insert(K_NEXT_HANDLE, h + 1)?;
        self.put_inode(h, ino)?;
        self.dirents.insert((ino.parent, name), h)?;
        Ok(h)
    }

    fn bump(&mut self, k: &str, delta: i64) -> Result<u64, MetaError> {
        let v = counter(&self.sup, k)?.saturating_add_signed(delta);
        self.sup.insert(k, v)?;
        Ok(v)
    }

    fn touch_dir(&mut self, h: u64, now: Timestamp) -> Result<(), MetaError> {
        let mut d = live_inode(&self.inodes, h)?;
        d.attr.mtime = now;
        d.attr.ctime = now;
        self.put_inode(h, &d)
    }

    /// Removes a file, symbolic link or empty directory record; files go to `orphans`.
    fn drop_inode(&mut self, h: u64, i: &Inode) -> Result<Option<Objects>, MetaError> {
        self.inodes.remove(h)?;
        if i.is_dir() {
            self.bump(K_DIRS, -1)?;
            return Ok(None);
        }
        if i.attr.kind == FileKind::Symlink {
            self.links.remove(h)?;
        }
        if i.state == State::Committed {
            self.bump(K_FILES, -1)?;
        }
        match i.layout {
            Some(layout) => {
                self.orphans.insert(h, encode_rec(&layout).as_slice())?;
                Ok(Some(Objects { handle: Handle(h), layout }))
            }
            None => Ok(None),
        }
    }
}

fn new_attr(kind: FileKind, perm: Perm, now: Timestamp) -> Attr {
    Attr {
        kind,
        mode: perm.mode & 0o7777,
        uid: perm.uid,
        gid: perm.gid,
        size: 0,
        nlink: if kind == FileKind::Dir { 2 } else { 1 },
        atime: now,
        mtime: now,
        ctime: now,
    }
}

impl MetaStore {
    /// Opens (creating if needed) the database at `path`. A new database gets the root
    /// directory (mode 0755, owner 0) and the cluster's io server count, which later opens must
    /// match.
    pub fn open(path: &Path, cfg: MetaConfig) -> Result<Self, MetaError> {
        if cfg.n_servers == 0 {
            return Err(MetaError::Invalid("no io servers"));
        }
        Layout { base: 0, pcount: cfg.default_pcount.unwrap_or(cfg.n_servers), ssize: cfg.default_ssize }
            .validate(cfg.n_servers)?;
        // Created private before redb opens it (redb initializes an empty file), or tightened:
        // the database is the whole namespace.
        let io = |e| MetaError::Store(Box::new(redb::Error::Io(e)));
        crate::private::options().write(true).create(true).truncate(false).open(path).map_err(io)?;
        crate::private::tighten(path, "meta database").map_err(io)?;
        let db = Database::create(path)?;
        let store = MetaStore { db, cfg };
        store.write(|tx| {
            let format = counter(&tx.sup, K_FORMAT)?;
            if format == 0 {
                let now = Timestamp::now();
                let perm = Perm { mode: 0o755, uid: 0, gid: 0 };
                let root = Inode {
                    attr: new_attr(FileKind::Dir, perm, now),
                    parent: Handle::ROOT.0,
                    layout: None,
                    default: None,
                    state: State::Committed,
                };
                tx.put_inode(Handle::ROOT.0, &root)?;
                tx.sup.insert(K_FORMAT, FORMAT)?;
                tx.sup.insert(K_NEXT_HANDLE, Handle::ROOT.0 + 1)?;
                tx.sup.insert(K_DIRS, 1)?;
                tx.sup.insert(K_SERVERS, u64::from(cfg.n_servers))?;
                info!(path = %path.display(), n_servers = cfg.n_servers, "created metadata store");
            } else if format != FORMAT {
                return Err(MetaError::Invalid("unknown metadata format version"));
            }
            let stored = counter(&tx.sup, K_SERVERS)?;
            if stored != u64::from(cfg.n_servers) {
                return Err(MetaError::ServerCountChanged { stored, configured: cfg.n_servers });
            }
            Ok(())
        })?;
        Ok(store)
    }

    /// The configuration in force.
    pub fn config(&self) -> &MetaConfig {
        &self.cfg
    }

    fn write<T>(&self, f: impl FnOnce(&mut Tx<'_>) -> Result<T, MetaError>) -> Result<T, MetaError> {
        let txn = self.db.begin_write()?;
        let out = {
            let mut tx = Tx {
                sup: txn.open_table(SUPER)?,
                inodes: txn.open_table(INODES)?,
                dirents: txn.open_table(DIRENTS)?,
                orphans: txn.open_table(ORPHANS)?,
                links: txn.open_table(SYMLINKS)?,
            };
            f(&mut tx)?
        };
        // An early return above drops `txn`, which aborts it.
        txn.commit()?;
        Ok(out)
    }

    /// `name` in directory `parent`.
    pub fn lookup(&self, parent: Handle, name: &str) -> Result<(Handle, Attr), MetaError> {
        validate_name(name)?;
        let r = self.db.begin_read()?;
        let inodes = r.open_table(INODES)?;
        let dirents = r.open_table(DIRENTS)?;
        dir_inode(&inodes, parent.0)?;
        let h = get_entry(&dirents, parent.0, name)?.ok_or(MetaError::NotFound)?;
        Ok((Handle(h), live_inode(&inodes, h)?.attr))
    }

    /// Resolves an absolute or root-relative path (`/a/b`, `a/b`; `.` and `..` allowed).
    pub fn resolve(&self, path: &str) -> Result<Handle, MetaError> {
        let mut h = Handle::ROOT;
        for comp in path.split('/') {
            match comp {
                "" | "." => {}
                ".." => h = Handle(self.read_inode(h)?.parent),
                name => h = self.lookup(h, name)?.0,
            }
        }
        Ok(h)
    }

    fn read_inode(&self, h: Handle) -> Result<Inode, MetaError> {
        let r = self.db.begin_read()?;
        live_inode(&r.open_table(INODES)?, h.0)
    }

    /// Attributes of `h`.
    pub fn getattr(&self, h: Handle) -> Result<Attr, MetaError> {
        Ok(self.read_inode(h)?.attr)
    }

    /// Attributes and layout for an open; directories and symbolic links are refused.
    pub fn open_file(&self, h: Handle) -> Result<OpenFile, MetaError> {
        let i = self.read_inode(h)?;
        match (i.attr.kind, i.layout) {
            (FileKind::File, Some(layout)) => Ok(OpenFile { attr: i.attr, layout }),
            (FileKind::Symlink, _) => Err(MetaError::IsLink),
            _ => Err(MetaError::IsDir),
        }
    }

    /// Creates a symbolic link to `target` (any non-empty path text without NUL, stored as
    /// given). Its mode is `0o777` and its size the target's length, as on Linux.
    pub fn symlink(
        &self,
        parent: Handle,
        name: &str,
        target: &str,
        owner: Perm,
    ) -> Result<(Handle, Attr), MetaError> {
        validate_name(name)?;
        if !crate::proto::link_target_ok(target) {
            return Err(MetaError::Invalid("symbolic link target empty or with NUL"));
        }
        if target.len() > MAX_LINK_TARGET {
            return Err(MetaError::TargetTooLong);
        }
        self.write(|tx| {
            dir_inode(&tx.inodes, parent.0)?;
            if get_entry(&tx.dirents, parent.0, name)?.is_some() {
                return Err(MetaError::Exists);
            }
            let now = Timestamp::now();
            let mut attr = new_attr(FileKind::Symlink, Perm { mode: 0o777, ..owner }, now);
            attr.size = target.len() as u64;
            let ino = Inode {
                attr: attr.clone(),
                parent: parent.0,
                layout: None,
                default: None,
                state: State::Committed,
            };
            let h = tx.add_entry(name, &ino)?;
            tx.links.insert(h, target)?;
            tx.bump(K_FILES, 1)?;
            tx.touch_dir(parent.0, now)?;
            Ok((Handle(h), attr))
        })
    }

    /// A symbolic link's target; anything else is `EINVAL`, as `readlink(2)` answers.
    pub fn readlink(&self, h: Handle) -> Result<String, MetaError> {
        let i = self.read_inode(h)?;
        if i.attr.kind != FileKind::Symlink {
            return Err(MetaError::Invalid("not a symbolic link"));
        }
        let r = self.db.begin_read()?;
        let t = r.open_table(SYMLINKS)?;
        let target = t.get(h.0)?.ok_or(MetaError::Corrupt(h.0))?;
        Ok(target.value().to_owned())
    }

    /// Fills unset fields of `spec` from the filesystem defaults, picking a round-robin base
    /// whose servers avoid `avoid` if one does (see [`pick_base`]).
    fn resolve_layout(&self, tx: &mut Tx<'_>, spec: LayoutSpec, avoid: &[u32]) -> Result<Layout, MetaError> {
        let n = self.cfg.n_servers;
        let pcount = spec.pcount.or(self.cfg.default_pcount).unwrap_or(n);
        let base = match spec.base {
            Some(b) => b,
            None => {
                let next = counter(&tx.sup, K_NEXT_BASE)?;
                let (base, skipped) = pick_base(next, n, pcount, avoid);
                tx.sup.insert(K_NEXT_BASE, next.wrapping_add(skipped).wrapping_add(1))?;
                base
            }
        };
        let layout = Layout { base, pcount, ssize: spec.ssize.unwrap_or(self.cfg.default_ssize) };
        layout.validate(n)?;
        Ok(layout)
    }

    /// Creates a regular file as a *pending* entry: see the module docs for the
    /// commit/abort protocol. The layout is `spec`, then the parent's default, then the
    /// filesystem defaults, field by field.
    pub fn create(
        &self,
        parent: Handle,
        name: &str,
        perm: Perm,
        spec: Option<LayoutSpec>,
    ) -> Result<Created, MetaError> {
        self.create_avoiding(parent, name, perm, spec, &[])
    }

    /// As [`MetaStore::create`], placing a layout whose base is not given on servers other
    /// than `avoid` (io servers known to be down) when the stripe count leaves a choice.
    pub fn create_avoiding(
        &self,
        parent: Handle,
        name: &str,
        perm: Perm,
        spec: Option<LayoutSpec>,
        avoid: &[u32],
    ) -> Result<Created, MetaError> {
        validate_name(name)?;
        let out = self.write(|tx| {
            let dir = dir_inode(&tx.inodes, parent.0)?;
            if get_entry(&tx.dirents, parent.0, name)?.is_some() {
                return Err(MetaError::Exists);
            }
            let merged = spec.unwrap_or_default().or(dir.default.unwrap_or_default());
            let layout = self.resolve_layout(tx, merged, avoid)?;
            let now = Timestamp::now();
            let attr = new_attr(FileKind::File, perm, now);
            let ino = Inode {
                attr: attr.clone(),
                parent: parent.0,
                layout: Some(layout),
                default: None,
                state: State::Pending,
            };
            let h = tx.add_entry(name, &ino)?;
            Ok(Created { handle: Handle(h), attr, layout })
        })?;
        debug!(handle = %out.handle, ?out.layout, "create pending");
        Ok(out)
    }

    /// Makes a pending create visible (its objects exist on every io server).
    pub fn commit_create(&self, h: Handle) -> Result<(), MetaError> {
        self.write(|tx| {
            let mut i = get_inode(&tx.inodes, h.0)?.ok_or(MetaError::NotFound)?;
            if i.state == State::Committed {
                return Ok(());
            }
            i.state = State::Committed;
            tx.put_inode(h.0, &i)?;
            tx.bump(K_FILES, 1)?;
            tx.touch_dir(i.parent, i.attr.ctime)
        })
    }

    /// Undoes a pending create: removes the entry and the record. Returns its layout (the
    /// caller removes whatever objects it created). Refuses committed files.
    pub fn abort_create(&self, h: Handle) -> Result<Layout, MetaError> {
        self.write(|tx| {
            let i = get_inode(&tx.inodes, h.0)?.ok_or(MetaError::NotFound)?;
            if i.state != State::Pending {
                return Err(MetaError::Invalid("not a pending create"));
            }
            remove_entry_of(tx, h.0, i.parent)?;
            tx.inodes.remove(h.0)?;
            i.layout.ok_or(MetaError::Corrupt(h.0))
        })
        .inspect(|_| warn!(handle = %h, "create aborted"))
    }

    /// Creates left pending by a crash: clean each up (remove objects, [`abort_create`]).
    ///
    /// [`abort_create`]: MetaStore::abort_create
    pub fn pending_creates(&self) -> Result<Vec<Objects>, MetaError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(INODES)?;
        let mut out = Vec::new();
        for row in t.iter()? {
            let (k, v) = row?;
            let i: Inode = postcard::from_bytes(v.value()).map_err(|_| MetaError::Corrupt(k.value()))?;
            if let (State::Pending, Some(layout)) = (i.state, i.layout) {
                out.push(Objects { handle: Handle(k.value()), layout });
            }
        }
        Ok(out)
    }

    /// Creates a directory; it inherits the parent's default layout.
    pub fn mkdir(&self, parent: Handle, name: &str, perm: Perm) -> Result<(Handle, Attr), MetaError> {
        validate_name(name)?;
        self.write(|tx| {
            let dir = dir_inode(&tx.inodes, parent.0)?;
            if get_entry(&tx.dirents, parent.0, name)?.is_some() {
                return Err(MetaError::Exists);
            }
            let now = Timestamp::now();
            let attr = new_attr(FileKind::Dir, perm, now);
            let ino = Inode {
                attr: attr.clone(),
                parent: parent.0,
                layout: None,
                default: dir.default,
                state: State::Committed,
            };
            let h = tx.add_entry(name, &ino)?;
            tx.bump(K_DIRS, 1)?;
            tx.touch_dir(parent.0, now)?;
            Ok((Handle(h), attr))
        })
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, parent: Handle, name: &str) -> Result<(), MetaError> {
        validate_name(name)?;
        self.write(|tx| {
            dir_inode(&tx.inodes, parent.0)?;
            let h = get_entry(&tx.dirents, parent.0, name)?.ok_or(MetaError::NotFound)?;
            let i = live_inode(&tx.inodes, h)?;
            if !i.is_dir() {
                return Err(MetaError::NotDir);
            }
            if !dir_is_empty(&tx.dirents, h)? {
                return Err(MetaError::NotEmpty);
            }
            tx.dirents.remove((parent.0, name))?;
            tx.drop_inode(h, &i)?;
            tx.touch_dir(parent.0, Timestamp::now())
        })
    }

    /// Removes a file or symbolic link from the namespace. A file's objects are recorded as an
    /// orphan and returned: remove them on the io servers, then [`MetaStore::forget_orphan`].
    pub fn unlink(&self, parent: Handle, name: &str) -> Result<Option<Objects>, MetaError> {
        validate_name(name)?;
        self.write(|tx| {
            dir_inode(&tx.inodes, parent.0)?;
            let h = get_entry(&tx.dirents, parent.0, name)?.ok_or(MetaError::NotFound)?;
            let i = live_inode(&tx.inodes, h)?;
            if i.is_dir() {
                return Err(MetaError::IsDir);
            }
            tx.dirents.remove((parent.0, name))?;
            let objs = tx.drop_inode(h, &i)?;
            if objs.is_none() && i.attr.kind == FileKind::File {
                return Err(MetaError::Corrupt(h));
            }
            tx.touch_dir(parent.0, Timestamp::now())?;
            Ok(objs)
        })
    }

    /// POSIX rename. A file target is replaced (its objects returned as an orphan, as for
    /// unlink); an empty directory target is replaced by a directory. Refused: a directory over
    /// a non-directory (`ENOTDIR`), a non-directory over a directory (`EISDIR`), over a non-empty
    /// directory (`ENOTEMPTY`), a directory into its own subtree (`EINVAL`).
    pub fn rename(
        &self,
        src_parent: Handle,
        src_name: &str,
        dst_parent: Handle,
        dst_name: &str,
    ) -> Result<Option<Objects>, MetaError> {
        validate_name(src_name)?;
        validate_name(dst_name)?;
        self.write(|tx| {
            dir_inode(&tx.inodes, src_parent.0)?;
            dir_inode(&tx.inodes, dst_parent.0)?;
            let h = get_entry(&tx.dirents, src_parent.0, src_name)?.ok_or(MetaError::NotFound)?;
            let mut src = live_inode(&tx.inodes, h)?;
            if src.is_dir() {
                // Walk up from the destination: meeting the source means a cycle.
                // The depth bound only guards against a corrupt parent chain looping forever.
                let mut d = dst_parent.0;
                for depth in 0.. {
                    if d == h {
                        return Err(MetaError::Invalid("cannot move a directory into itself"));
                    }
                    if d == Handle::ROOT.0 {
                        break;
                    }
                    if depth > MAX_DEPTH {
                        return Err(MetaError::Corrupt(d));
                    }
                    d = live_inode(&tx.inodes, d)?.parent;
                }
            }
            let mut replaced = None;
            if let Some(t) = get_entry(&tx.dirents, dst_parent.0, dst_name)? {
                if t == h {
                    return Ok(None); // same entry: POSIX says do nothing
                }
                let target = get_inode(&tx.inodes, t)?.ok_or(MetaError::Corrupt(t))?;
                if target.state == State::Pending {
                    return Err(MetaError::Busy);
                }
                match (src.is_dir(), target.is_dir()) {
                    (true, false) => return Err(MetaError::NotDir),
                    (false, true) => return Err(MetaError::IsDir),
                    (true, true) if !dir_is_empty(&tx.dirents, t)? => return Err(MetaError::NotEmpty),
                    _ => {}
                }
                replaced = tx.drop_inode(t, &target)?;
            }
            tx.dirents.remove((src_parent.0, src_name))?;
            tx.dirents.insert((dst_parent.0, dst_name), h)?;
            let now = Timestamp::now();
            src.parent = dst_parent.0;
            src.attr.ctime = now;
            tx.put_inode(h, &src)?;
            tx.touch_dir(src_parent.0, now)?;
            if dst_parent != src_parent {
                tx.touch_dir(dst_parent.0, now)?;
            }
            Ok(replaced)
        })
    }

    /// Up to `max` (at most [`MAX_READDIR`]) entries of `dir` in name order, starting after
    /// `after`, and whether more follow. Resuming after a name is stable under concurrent
    /// inserts and removals.
    pub fn readdir(
        &self,
        dir: Handle,
        after: Option<&str>,
        max: usize,
    ) -> Result<(Vec<DirEntry>, bool), MetaError> {
        // A peer's page size never sizes an allocation beyond one wire page.
        let max = max.min(MAX_READDIR);
        let r = self.db.begin_read()?;
        let inodes = r.open_table(INODES)?;
        let dirents = r.open_table(DIRENTS)?;
        dir_inode(&inodes, dir.0)?;
        let start = match after {
            Some(a) => Bound::Excluded((dir.0, a)),
            None => Bound::Included((dir.0, "")),
        };
        let mut out = Vec::new();
        for row in dirents.range((start, Bound::Excluded((dir.0 + 1, ""))))? {
            let (k, v) = row?;
            let h = v.value();
            let Some(i) = get_inode(&inodes, h)? else { return Err(MetaError::Corrupt(h)) };
            if i.state != State::Committed {
                continue;
            }
            if out.len() == max {
                return Ok((out, true));
            }
            let (_, name) = k.value();
            // Stored names passed validate_name, so they fit the wire bound.
            let name = Name::new(name).map_err(|_| MetaError::Corrupt(h))?;
            out.push(DirEntry { name, handle: Handle(h), kind: i.attr.kind });
        }
        Ok((out, false))
    }

    /// Changes attributes. A size change on a file is recorded and returned with the layout so
    /// the caller truncates each object to [`Layout::local_size`]; on a directory it is refused.
    pub fn setattr(&self, h: Handle, set: &SetAttr) -> Result<SetattrOutcome, MetaError> {
        self.write(|tx| {
            let mut i = live_inode(&tx.inodes, h.0)?;
            let now = Timestamp::now();
            let mut truncate = None;
            if let Some(size) = set.size {
                match i.attr.kind {
                    FileKind::Dir => return Err(MetaError::IsDir),
                    FileKind::Symlink => return Err(MetaError::Invalid("cannot truncate a symbolic link")),
                    FileKind::File => {}
                }
                i.attr.size = size;
                i.attr.mtime = now;
                truncate = i.layout.map(|l| (l, size));
            }
            if let Some(m) = set.mode {
                if i.attr.kind == FileKind::Symlink {
                    // A link's mode means nothing (Linux's are all 0777 and lchmod fails).
                    return Err(MetaError::Invalid("a symbolic link has no mode to change"));
                }
                i.attr.mode = m & 0o7777;
            }
            if let Some(u) = set.uid {
                i.attr.uid = u;
            }
            if let Some(g) = set.gid {
                i.attr.gid = g;
            }
            if let Some(t) = set.atime {
                i.attr.atime = t;
            }
            if let Some(t) = set.mtime {
                i.attr.mtime = t;
            }
            i.attr.ctime = now;
            tx.put_inode(h.0, &i)?;
            Ok(SetattrOutcome { attr: i.attr, truncate })
        })
    }

    /// A file's layout or a directory's default layout.
    pub fn getstripe(&self, h: Handle) -> Result<Stripe, MetaError> {
        let i = self.read_inode(h)?;
        Ok(Stripe { layout: i.layout, default: i.default })
    }

    /// Sets (or clears) a directory's default layout. Fields that are set are checked against
    /// the cluster now, so a bad default cannot break later creates.
    pub fn setstripe(&self, dir: Handle, spec: Option<LayoutSpec>) -> Result<(), MetaError> {
        if let Some(s) = spec {
            let n = self.cfg.n_servers;
            let probe = Layout {
                base: s.base.unwrap_or(0),
                pcount: s.pcount.or(self.cfg.default_pcount).unwrap_or(n),
                ssize: s.ssize.unwrap_or(self.cfg.default_ssize),
            };
            probe.validate(n)?;
        }
        self.write(|tx| {
            let mut d = dir_inode(&tx.inodes, dir.0)?;
            d.default = spec;
            d.attr.ctime = Timestamp::now();
            tx.put_inode(dir.0, &d)
        })
    }

    /// Files removed from the namespace whose objects may still exist on the io servers.
    pub fn orphans(&self) -> Result<Vec<Objects>, MetaError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(ORPHANS)?;
        let mut out = Vec::new();
        for row in t.iter()? {
            let (k, v) = row?;
            let layout = postcard::from_bytes(v.value()).map_err(|_| MetaError::Corrupt(k.value()))?;
            out.push(Objects { handle: Handle(k.value()), layout });
        }
        Ok(out)
    }

    /// Forgets an orphan once its objects are gone from every io server.
    pub fn forget_orphan(&self, h: Handle) -> Result<(), MetaError> {
        self.write(|tx| {
            tx.orphans.remove(h.0)?;
            Ok(())
        })
    }

    /// Namespace counters.
    pub fn statfs(&self) -> Result<FsStats, MetaError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(SUPER)?;
        Ok(FsStats {
            files: counter(&t, K_FILES)?,
            dirs: counter(&t, K_DIRS)?,
            io_servers: self.cfg.n_servers,
            name_max: NAME_MAX as u32,
        })
    }

    /// Number of records (files, directories, pending creates): a cheap consistency check.
    pub fn inode_count(&self) -> Result<u64, MetaError> {
        let r = self.db.begin_read()?;
        Ok(r.open_table(INODES)?.len()?)
    }
}

/// Removes the directory entry naming `h` in `parent` (used to abort a create).
fn remove_entry_of(tx: &mut Tx<'_>, h: u64, parent: u64) -> Result<(), MetaError> {
    let mut name = None;
    for row in tx.dirents.range((parent, "")..(parent + 1, ""))? {
        let (k, v) = row?;
        if v.value() == h {
            name = Some(k.value().1.to_owned());
            break;
        }
    }
    match name {
        Some(n) => {
            tx.dirents.remove((parent, n.as_str()))?;
            Ok(())
        }
        None => Err(MetaError::Corrupt(h)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Perm = Perm { mode: 0o644, uid: 10, gid: 20 };
    const R: Handle = Handle::ROOT;

    fn store(dir: &tempfile::TempDir) -> MetaStore {
        MetaStore::open(&dir.path().join("meta.redb"), MetaConfig::new(4)).unwrap()
    }

    fn mkfile(m: &MetaStore, parent: Handle, name: &str) -> Created {
        let c = m.create(parent, name, P, None).unwrap();
        m.commit_create(c.handle).unwrap();
        c
    }

    fn names(m: &MetaStore, dir: Handle) -> Vec<String> {
        m.readdir(dir, None, 1000).unwrap().0.into_iter().map(|e| e.name.into_string()).collect()
    }

    #[test]
    fn root_exists_on_first_open() {
        let d = tempfile::tempdir().unwrap();
        let m = store(&d);
        let a = m.getattr(R).unwrap();
        assert_eq!((a.kind, a.mode, a.nlink), (FileKind::Dir, 0o755, 2));
        assert_eq!(m.statfs().unwrap(), FsStats { files: 0, dirs: 1, io_servers: 4, name_max: 255 });
        assert_eq!(m.resolve("/").unwrap(), R);
    }

    #[test]
    fn create_lookup_getattr_open() {
        let d = tempfile::tempdir().unwrap();
        let m = store(&d);
        let c = mkfile(&m, R, "a.txt");
        assert!(c.handle.0 > R.0);
        let (h, a) = m.lookup(R, "a.txt").unwrap();
        assert_eq!(h, c.handle);
        assert_eq!((a.kind, a.mode, a.uid, a.gid, a.size), (FileKind::File, 0o644, 10, 20, 0));
        assert_eq!(m.getattr(h).unwrap(), a);
        assert_eq!(m.open_file(h).unwrap().layout, c.layout);
        assert!(matches!(m.open_file(R), Err(MetaError::IsDir)));
        assert!(matches!(m.create(R, "a.txt", P, None), Err(MetaError::Exists)));
        assert_eq!(m.create(R, "a.txt", P, None).unwrap_err().errno(), Errno::EEXIST);
        assert!(matches!(m.lookup(R, "nope"), Err(MetaError::NotFound)));
        assert!(matches!(m.create(h, "x", P, None), Err(MetaError::NotDir)));
        assert!(matches!(m.create(Handle(999), "x", P, None), Err(MetaError::NotFound)));
        assert_eq!(m.statfs().unwrap().files, 1);
    }

    #[test]
    fn bad_names_are_refused_with_typed_errors() {
        let d = tempfile::tempdir().unwrap();
        let m = store(&d);
        let long = "x".repeat(NAME_MAX + 1);
        let cases: [(&str, NameError); 6] = [
            ("", NameError::Empty),
            (".", NameError::Dot),
            ("..", NameError::Dot),
            ("a/b", NameError::Slash),
            ("a\0b", NameError::Nul),
            (&long, NameError::TooLong),
        ];
        for (name, want) in cases {
            assert!(matches!(m.create(R, name, P, None), Err(MetaError::Name(e)) if e == want), "{name:?}");
            assert!(matches!(m.mkdir(R, name, P), Err(MetaError::Name(_))));
            assert!(matches!(m.lookup(R, name), Err(MetaError::Name(_))));
            assert!(matches!(m.rename(R, "a", R, name), Err(MetaError::Name(_))));
        }
        assert_eq!(MetaError::Name(NameError::TooLong).errno(), Errno::ENAMETOOLONG);
        assert_eq!(MetaError::Name(NameError::Slash).errno(), Errno::EINVAL);
        mkfile(&m, R, &"x".repeat(NAME_MAX));
        assert_eq!(m.inode_count().unwrap(), 2);
    }

    #[test]
    fn pending_create_is_invisible_until_committed() {
        let d = tempfile::tempdir().unwrap();
        let m = store(&d);
        let c = m.create(R, "p", P, None).unwrap();
        assert!(matches!(m.lookup(R, "p"), Err(MetaError::NotFound)));
        assert!(matches!(m.getattr(c.handle), Err(MetaError::NotFound)));
        assert!(names(&m, R).is_empty());
        assert!(matches!(m.create(R, "p", P, None), Err(MetaError::Exists)), "name is taken");
        assert!(matches!(m.unlink(R, "p"), Err(MetaError::NotFound)));
        assert_eq!(m.statfs().unwrap().files, 0);
        m.commit_create(c.handle).unwrap();
        assert_eq!(m.lookup(R, "p").unwrap().0, c.handle);
        assert_eq!(names(&m, R), ["p"]);
        assert!(matches!(m.abort_create(c.handle), Err(MetaError::Invalid(_))), "committed files stay");
    }

    #[test]
    fn aborted_create_leaves_nothing() {
        let d = tempfile::tempdir().unwrap();
        let m = store(&d);
        let c = m.create(R, "p", P, None).unwrap();
        assert_eq!(m.abort_create(c.handle).unwrap(), c.layout);
        assert_eq!(m.inode_count().unwrap(), 1);
        assert!(m.orphans().unwrap().is_empty());
        // The name is free again, and the handle is never reused.
        let c2 = m.create(R, "p", P, None).unwrap();
        assert!(c2.handle.0 > c.handle.0);
    }

    #[test]
    fn pending_creates_survive_a_crash() {
        let d = tempfile::tempdir().unwrap();
        let c = {
            let m = store(&d);
            mkfile(&m, R, "done");
            m.create(R, "half", P, None).unwrap()
        };
        let m = store(&d);
        assert_eq!(m.pending_creates().unwrap(), vec![Objects { handle: c.handle, layout: c.layout }]);
        m.abort_create(c.handle).unwrap();
        assert!(m.pending_creates().unwrap().is_empty());
        assert_eq!(names(&m, R), ["done"]);
    }

    #[test]
    fn default_layout_and_round_robin_base() {
        let d = tempfile::tempdir().unwrap();
        let bases: Vec<u32> = {
            let m = store(&d);
            (0..5)
                .map(|i| {
                    let c = mkfile(&m, R, &format!("f{i}"));
                    assert_eq!((c.layout.pcount, c.layout.ssize), (4, 64 * 1024));
                    c.layout.base
                })
                .collect()
        };
        assert_eq!(bases, [0, 1, 2, 3, 0]);
        // The counter is persisted: the next create after reopening continues the rotation.
        let m = store(&d);
        assert_eq!(mkfile(&m, R, "g").layout.base, 1);
        // An explicit base does not advance the rotation.
        let spec = LayoutSpec { base: Some(3), pcount: Some(2), ssize: Some(4096) };
        assert_eq!(mkfile_spec(&m, R, "h", spec).layout, Layout { base: 3, pcount: 2, ssize: 4096 });
        assert_eq!(mkfile(&m, R, "i").layout.base, 2);
    }

    #[test]
    fn new_layouts_avoid_servers_known_down_while_the_stripe_count_allows() {
        // No server down: the plain rotation.
        assert_eq!(pick_base(5, 4, 2, &[]), (1, 0));
        // Server 2 down, 4 servers: single-server files skip it…
        assert_eq!(pick_base(2, 4, 1, &[2]), (3, 1));
        assert_eq!(pick_base(6, 4, 1, &[2]), (3, 1));
        // …two-server files need a window without it: 3,0 or 0,1.
        assert_eq!(pick_base(1, 4, 2, &[2]), (3, 2));
        assert_eq!(pick_base(0, 4, 2, &[2]), (0, 0));
        assert_eq!(pick_base(0, 4, 3, &[2]), (3, 3));
        // Every server, or more than are up: the rotation's base, to be tried.
        assert_eq!(pick_base(1, 4, 4, &[2]), (1, 0));
        assert_eq!(pick_base(1, 4, 2, &[0, 2]), (1, 0));
        // Nonsense counts are for `validate` to refuse, not a panic here.
        assert_eq!(pick_base(1, 4, 9, &[2]), (1, 0));
        assert_eq!(pick_base(1, 0, 1, &[0]), (0, 0));

        // In the store: the rotation goes on after the base chosen.
        let d = tempfile::tempdir().unwrap();
        let m = store(&d);
        let one = LayoutSpec { pcount: Some(1), ..Default::default() };
        let bases: Vec<u32> = (0..6)
            .map(|i| {
                let c = m.create_avoiding(R, &format!("f{i}"), P, Some(one), &[1]).unwrap();
                c.layout.base
            })
            .collect();
        assert_eq!(bases, [0, 2, 3, 0, 2, 3]);
        // An explicit base is kept even on a server to avoid (the create then fails there).
        let forced = LayoutSpec { base: Some(1), ..one };
        assert_eq!(m.create_avoiding(R, "g", P, Some(forced), &[1]).unwrap().layout.base, 1);
    }

    fn mkfile_spec(m: &MetaStore, parent: Handle, name: &str, spec: LayoutSpec) -> Created {
        let c = m.create(parent, name, P, Some(spec)).unwrap();
        m.commit_create(c.handle).unwrap();
        c
    }

    #[test]
    fn configured_defaults_apply() {
        let d = tempfile::tempdir().unwrap();
        let cfg = MetaConfig { n_servers: 4, default_ssize: 1 << 20, default_pcount: Some(2) };
        let m = MetaStore::open(&d.path().join("m.redb"), cfg).unwrap();
        let c = mkfile(&m, R, "f");
        assert_eq!((c.layout.pcount, c.layout.ssize), (2, 1 << 20));
    }

    #[test]
    fn invalid_explicit_layout_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let m = store(&d);
        let too_many = LayoutSpec { pcount: Some(5), ..Default::default() };
        let e = m.create(R, "f", P, Some(too_many)).unwrap_err();
        assert!(matches!(e, MetaError::Layout(LayoutError::BadStripeCount { .. })));
        assert_eq!(e.errno(), Errno::EINVAL);
        let bad_base = LayoutSpec { base: Some(4), ..Default::default() };
        assert!(matches!(m.create(R, "f", P, Some(bad_base)), Err(MetaError::Layout(_))));
        assert!(matches!(m.lookup(R, "f"), Err(MetaError::NotFound)), "failed create leaves no entry");
    }

    #[test]
    fn directory_default_layouts_are_inherited() {
        let d = tempfile::tempdir().unwrap();
        let m = store(&d);
        let (dir, _) = m.mkdir(R, "d", P).unwrap();
        let spec = LayoutSpec { base: None, pcount: Some(2), ssize: Some(1 << 20) };
        m.setstripe(dir, Some(spec)).unwrap();
        assert_eq!(m.getstripe(dir).unwrap(), Stripe { layout: None, default: Some(spec) });
        let c = mkfile(&m, dir, "f");
        assert_eq!((c.layout.pcount, c.layout.ssize), (2, 1 << 20));
        assert_eq!(m.getstripe(c.handle).unwrap(), Stripe { layout: Some(c.layout), default: None });
        // Per-create fields override the directory's, field by field.
        let c = mkfile_spec(&m, dir, "g", LayoutSpec { ssize: Some(4096), ..Default::default() });
        assert_eq!((c.layout.pcount, c.layout.ssize), (2, 4096));
        // Subdirectories inherit the default; the root is untouched.
        let (sub, _) = m.mkdir(dir, "sub", P).unwrap();
        assert_eq!(m.getstripe(sub).unwrap().default, Some(spec));
        assert_eq!(mkfile(&m, R, "top").layout.pcount, 4);
        // Clearing it restores the filesystem defaults.
        m.setstripe(dir, None).unwrap();
        assert_eq!(mkfile(&m, dir, "h").layout.pcount, 4);
        assert!(matches!(m.setstripe(c.handle, Some(spec)), Err(MetaError::NotDir)));
        let bad = LayoutSpec { pcount: Some(9), ..Default::default() };
        assert!(matches!(m.setstripe(dir, Some(bad)), Err(MetaError::Layout(_))));
    }

    #[test]
    fn mkdir_rmdir_and_unlink() {
        let d = tempfile::tempdir().unwrap();
        let m = store(&d);
        let (dir, a) = m.mkdir(R, "d", Perm { mode: 0o40755, ..P }).unwrap();
        assert_eq!((a.kind, a.mode), (FileKind::Dir, 0o755));
        assert!(matches!(m.mkdir(R, "d", P), Err(MetaError::Exists)));
        let f = mkfile(&m, dir, "f");
        assert_eq!(m.rmdir(R, "d").unwrap_err().errno(), Errno::ENOTEMPTY);
        assert!(matches!(m.rmdir(dir, "f"), Err(MetaError::NotDir)));
        assert_eq!(m.unlink(R, "d").unwrap_err().errno(), Errno::EISDIR);
        let objs = m.unlink(dir, "f").unwrap();
        assert_eq!(objs, Some(Objects { handle: f.handle, layout: f.layout }));
        assert!(matches!(m.unlink(dir, "f"), Err(MetaError::NotFound)));
        assert!(matches!(m.getattr(f.handle), Err(MetaError::NotFound)));
        m.rmdir(R, "d").unwrap();
        assert!(matches!(m.rmdir(R, "d"), Err(MetaError::NotFound)));
        assert_eq!(m.statfs().unwrap(), FsStats { files: 0, dirs: 1, io_servers: 4, name_max: 255 });
    }

    #[test]
    fn unlinked_objects_stay_orphans_until_forgotten() {
        let d = tempfile::tempdir().unwrap();
        let f = {
            let m = store(&d);
            let f = mkfile(&m, R, "f");
            m.unlink(R, "f").unwrap();
            f
        };
        let m = store(&d);
        assert_eq!(m.orphans().unwrap(), vec![Objects { handle: f.handle, layout: f.layout }]);
        m.forget_orphan(f.handle).unwrap();
        assert!(m.orphans().unwrap().is_empty());
    }

    #[test]
    fn readdir_pages_in_stable_name_order() {
        let d = tempfile::tempdir().unwrap();
        let m = store(&d);
        for n in ["e", "b", "a", "d", "c", "g", "f"] {
            mkfile(&m, R, n);
        }
        m.mkdir(R, "dir", P).unwrap();
        let (p1, more) = m.readdir(R, None, 3).unwrap();
        assert!(more);
        let n1: Vec<_> = p1.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(n1, ["a", "b", "c"]);
        // Removing the resume point and adding an earlier name does not disturb the next page.
        m.unlink(R, "c").unwrap();
        mkfile(&m, R, "a0");
        let (p2, more) = m.readdir(R, Some("c"), 3).unwrap();
        assert!(more);
        let n2: Vec<_> = p2.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(n2, ["d", "dir", "e"]);
        assert_eq!(p2[1].kind, FileKind::Dir);
        let (p3, more) = m.readdir(R, Some("e"), 3).unwrap();
        assert!(!more);
        assert_eq!(p3.len(), 2);
        let (p4, more) = m.readdir(R, Some("g"), 3).unwrap();
        assert!(p4.is_empty() && !more);
        // Exactly a full page at the end says no more.
        assert!(!m.readdir(R, Some("e"), 2).unwrap().1);
        assert!(matches!(m.readdir(p1[0].handle, None, 3), Err(MetaError::NotDir)));
    }

    #[test]
    fn readdir_pages_are_capped_at_the_wire_limit() {
        let d = tempfile::tempdir().unwrap();
        let m = store(&d);
        for i in 0..MAX_READDIR + 1 {
            m.mkdir(R, &format!("{i:04}"), P).unwrap();
        }
        let (page, more) = m.readdir(R, None, usize::MAX).unwrap();
        assert_eq!((page.len(), more), (MAX_READDIR, true));
    }

    #[test]
    fn rename_within_and_across_directories() {
        let d = tempfile::tempdir().unwrap();
        let m = store(&d);
        let f = mkfile(&m, R, "a");
        assert_eq!(m.rename(R, "a", R, "b").unwrap(), None);
        assert_eq!(names(&m, R), ["b"]);
        let (dir, _) = m.mkdir(R, "d", P).unwrap();
        m.rename(R, "b", dir, "c").unwrap();
        assert_eq!(m.resolve("/d/c").unwrap(), f.handle);
        assert_eq!(names(&m, R), ["d"]);
        // Directories move with their contents.
        let (e, _) = m.mkdir(R, "e", P).unwrap();
        m.rename(R, "d", e, "d2").unwrap();
        assert_eq!(m.resolve("e/d2/c").unwrap(), f.handle);
        assert_eq!(m.resolve("/e/d2/..").unwrap(), e);
        // Same entry: nothing happens.
        assert_eq!(m.rename(dir, "c", dir, "c").unwrap(), None);
        assert!(matches!(m.rename(R, "missing", R, "x"), Err(MetaError::NotFound)));
    }

    #[test]
    fn rename_replaces_a_file_target() {
        let d = tempfile::tempdir().unwrap();
        let m = store(&d);
        let a = mkfile(&m, R, "a");
        let b = mkfile(&m, R, "b");
        let replaced = m.rename(R, "a", R, "b").unwrap();
        assert_eq!(replaced, Some(Objects { handle: b.handle, layout: b.layout }));
        assert_eq!(m.lookup(R, "b").unwrap().0, a.handle);
        assert_eq!(names(&m, R), ["b"]);
        assert_eq!(m.orphans().unwrap().len(), 1);
        assert_eq!(m.statfs().unwrap().files, 1);
    }

    #[test]
    fn rename_refusals() {
        let d = tempfile::tempdir().unwrap();
        let m = store(&d);
        mkfile(&m, R, "f");
        let (dir, _) = m.mkdir(R, "d", P).unwrap();
        let (full, _) = m.mkdir(R, "full", P).unwrap();
        mkfile(&m, full, "x");
        m.mkdir(R, "empty", P).unwrap();
        assert_eq!(m.rename(R, "d", R, "f").unwrap_err().errno(), Errno::ENOTDIR);
        assert_eq!(m.rename(R, "f", R, "d").unwrap_err().errno(), Errno::EISDIR);
        assert_eq!(m.rename(R, "d", R, "full").unwrap_err().errno(), Errno::ENOTEMPTY);
        let (sub, _) = m.mkdir(dir, "sub", P).unwrap();
        assert_eq!(m.rename(R, "d", sub, "loop").unwrap_err().errno(), Errno::EINVAL);
        assert_eq!(m.rename(R, "d", dir, "self").unwrap_err().errno(), Errno::EINVAL);
        assert!(matches!(m.rename(R, "f", Handle(12345), "x"), Err(MetaError::NotFound)));
        // Nothing changed, then a directory replaces an empty one.
        assert_eq!(names(&m, R), ["d", "empty", "f", "full"]);
        assert_eq!(m.rename(R, "d", R, "empty").unwrap(), None);
        assert_eq!(names(&m, R), ["empty", "f", "full"]);
        assert_eq!(m.resolve("/empty/sub").unwrap(), sub);
        assert_eq!(m.statfs().unwrap().dirs, 4);
    }

    #[test]
    fn symbolic_links_are_records_without_objects() {
        let d = tempfile::tempdir().unwrap();
        let m = store(&d);
        let (dir, _) = m.mkdir(R, "dir", P).unwrap();
        let f = mkfile(&m, dir, "f");
        let (l, a) = m.symlink(R, "l", "dir/f", P).unwrap();
        assert_eq!((a.kind, a.mode, a.size, a.nlink, a.uid, a.gid), (FileKind::Symlink, 0o777, 5, 1, 10, 20));
        assert_eq!(m.lookup(R, "l").unwrap(), (l, a.clone()));
        assert_eq!(m.readlink(l).unwrap(), "dir/f");
        let kinds: Vec<_> =
            m.readdir(R, None, 10).unwrap().0.into_iter().map(|e| (e.name.into_string(), e.kind)).collect();
        assert_eq!(kinds, [("dir".to_string(), FileKind::Dir), ("l".to_string(), FileKind::Symlink)]);
        assert_eq!((m.statfs().unwrap().files, m.statfs().unwrap().dirs), (2, 2));
        // What a link is not.
        assert_eq!(m.open_file(l).unwrap_err().errno(), Errno::ELOOP);
        assert_eq!(m.readlink(f.handle).unwrap_err().errno(), Errno::EINVAL);
        assert_eq!(m.readlink(dir).unwrap_err().errno(), Errno::EINVAL);
        assert_eq!(
            m.setattr(l, &SetAttr { size: Some(0), ..Default::default() }).unwrap_err().errno(),
            Errno::EINVAL
        );
        assert_eq!(
            m.setattr(l, &SetAttr { mode: Some(0o600), ..Default::default() }).unwrap_err().errno(),
            Errno::EINVAL
        );
        assert_eq!(m.getattr(l).unwrap(), a);
        let t = Timestamp { secs: 5, nsecs: 6 };
        assert_eq!(m.setattr(l, &SetAttr { mtime: Some(t), ..Default::default() }).unwrap().attr.mtime, t);
        assert_eq!(m.rmdir(R, "l").unwrap_err().errno(), Errno::ENOTDIR);
        // Bad links are refused and leave nothing.
        assert_eq!(m.symlink(R, "l", "x", P).unwrap_err().errno(), Errno::EEXIST);
        assert_eq!(m.symlink(R, "e", "", P).unwrap_err().errno(), Errno::EINVAL);
        assert_eq!(m.symlink(R, "n", "a\0b", P).unwrap_err().errno(), Errno::EINVAL);
        assert_eq!(m.symlink(R, "..", "x", P).unwrap_err().errno(), Errno::EINVAL);
        assert_eq!(m.symlink(f.handle, "x", "x", P).unwrap_err().errno(), Errno::ENOTDIR);
        let long = "t".repeat(MAX_LINK_TARGET + 1);
        assert_eq!(m.symlink(R, "long", &long, P).unwrap_err().errno(), Errno::ENAMETOOLONG);
        let (longest, _) = m.symlink(R, "longest", &long[1..], P).unwrap();
        assert_eq!(m.readlink(longest).unwrap(), long[1..]);
        assert_eq!(names(&m, R), ["dir", "l", "longest"]);
        // Renamed, it keeps its target; replaced or unlinked, it leaves no orphan and no target.
        assert_eq!(m.rename(R, "l", dir, "l2").unwrap(), None);
        assert_eq!(m.readlink(l).unwrap(), "dir/f");
        let g = mkfile(&m, R, "g");
        assert_eq!(m.rename(R, "g", dir, "l2").unwrap(), None);
        assert_eq!(m.lookup(dir, "l2").unwrap().0, g.handle);
        assert!(matches!(m.readlink(l), Err(MetaError::NotFound)));
        assert_eq!(m.unlink(R, "longest").unwrap(), None);
        assert!(matches!(m.readlink(longest), Err(MetaError::NotFound)));
        assert!(m.orphans().unwrap().is_empty());
        let r = m.db.begin_read().unwrap();
        assert!(r.open_table(SYMLINKS).unwrap().is_empty().unwrap(), "no target outlives its link");
        assert_eq!(m.statfs().unwrap().files, 2);
    }

    #[test]
    fn symbolic_links_survive_reopen() {
        let d = tempfile::tempdir().unwrap();
        let l = store(&d).symlink(R, "l", "/some/where", P).unwrap().0;
        let m = store(&d);
        assert_eq!(m.readlink(l).unwrap(), "/some/where");
        assert_eq!(m.lookup(R, "l").unwrap().1.kind, FileKind::Symlink);
    }

    #[test]
    fn setattr_and_truncate() {
        let d = tempfile::tempdir().unwrap();
        let m = store(&d);
        let f = mkfile(&m, R, "f");
        let set = SetAttr { mode: Some(0o600), uid: Some(7), size: Some(1_000_000), ..Default::default() };
        let out = m.setattr(f.handle, &set).unwrap();
        assert_eq!((out.attr.mode, out.attr.uid, out.attr.gid, out.attr.size), (0o600, 7, 20, 1_000_000));
        assert_eq!(out.truncate, Some((f.layout, 1_000_000)));
        assert_eq!(m.getattr(f.handle).unwrap(), out.attr);
        let t = Timestamp { secs: 5, nsecs: 6 };
        let out = m.setattr(f.handle, &SetAttr { mtime: Some(t), ..Default::default() }).unwrap();
        assert_eq!((out.attr.mtime, out.truncate), (t, None));
        let e = m.setattr(R, &SetAttr { size: Some(0), ..Default::default() }).unwrap_err();
        assert_eq!(e.errno(), Errno::EISDIR);
        assert!(matches!(m.setattr(Handle(999), &SetAttr::default()), Err(MetaError::NotFound)));
    }

    #[test]
    fn namespace_survives_reopen() {
        let d = tempfile::tempdir().unwrap();
        let (f, dir, last) = {
            let m = store(&d);
            let (dir, _) = m.mkdir(R, "dir", P).unwrap();
            m.setstripe(dir, Some(LayoutSpec { pcount: Some(1), ..Default::default() })).unwrap();
            let f = mkfile(&m, dir, "file");
            m.setattr(f.handle, &SetAttr { size: Some(42), ..Default::default() }).unwrap();
            let (last, _) = m.mkdir(dir, "sub", P).unwrap();
            (f, dir, last)
        };
        let m = store(&d);
        assert_eq!(m.resolve("/dir/file").unwrap(), f.handle);
        assert_eq!(m.getattr(f.handle).unwrap().size, 42);
        assert_eq!(m.open_file(f.handle).unwrap().layout, f.layout);
        assert_eq!(names(&m, dir), ["file", "sub"]);
        assert_eq!(m.getstripe(dir).unwrap().default.unwrap().pcount, Some(1));
        assert_eq!(m.statfs().unwrap(), FsStats { files: 1, dirs: 3, io_servers: 4, name_max: 255 });
        let (next, _) = m.mkdir(R, "new", P).unwrap();
        assert!(next.0 > last.0, "handles are never reused");
    }

    #[test]
    fn server_count_change_is_refused() {
        let d = tempfile::tempdir().unwrap();
        drop(store(&d));
        let e = MetaStore::open(&d.path().join("meta.redb"), MetaConfig::new(5)).unwrap_err();
        assert!(matches!(e, MetaError::ServerCountChanged { stored: 4, configured: 5 }));
        assert!(matches!(
            MetaStore::open(&d.path().join("x.redb"), MetaConfig::new(0)),
            Err(MetaError::Invalid(_))
        ));
    }
}
