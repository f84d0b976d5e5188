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
//! * `precreated`: handles whose objects the meta server makes ahead on every io server, so a
//!   create can take one and commit at once (see `pool`).
//!
//! # Names and links
//! A file, symbolic link or special file may have several names (hard links): its record
//! counts them (`nlink`) and goes only with the last one, its objects then through `orphans`
//! like any removed file's. A directory has exactly one name; its `nlink` is 2 plus its
//! subdirectories, as POSIX file systems count them.
//!
//! # Permissions
//! Every namespace operation takes the caller's credentials ([`Cred`]) and applies the POSIX
//! rules to them inside its transaction (see `access`): search permission on the directories
//! a lookup passes, write and search on a directory whose names change, the sticky bit, who
//! may change modes, owners and times.
//!
//! # Operations that fan out to the io servers
//! The meta server (on the network) drives them in two steps, so nothing is lost or leaked if it
//! crashes or an io server fails in between:
//! * **create**: [`MetaStore::create`] allocates the handle and layout and records the entry as
//!   *pending* (invisible to lookup and readdir, but its name is taken); the server creates the
//!   objects on the io servers, then calls [`MetaStore::commit_create`], or on any failure removes
//!   the objects it made and calls [`MetaStore::abort_create`]. After a restart,
//!   [`MetaStore::pending_creates`] lists creates to clean up the same way. A create given a
//!   precreated handle (see [`Placement`]) whose layout spans every io server takes it instead
//!   and is committed in its one transaction: its objects already exist.
//! * **unlink** / **rename over a file**: the entry is removed and the file's layout recorded in
//!   `orphans` in the same transaction; the server removes the objects and then calls
//!   [`MetaStore::forget_orphan`]. [`MetaStore::orphans`] lists what is left after a restart.
//! * **truncate**: [`MetaStore::setattr`] records the size and returns the layout; the server
//!   sends each io server its [`Layout::local_size`]. Truncate is idempotent, so a retry after a
//!   failure is the clean-up.

use crate::capability::Rights;
use crate::layout::Layout;
use crate::proto::{
    Attr, Cred, DirEntry, FileKind, FsStats, Handle, LayoutSpec, MAX_LINK_TARGET, MAX_READDIR, Name, SetAttr,
    SetTime, Timestamp,
};
use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::info;

mod access;
mod error;
mod objects;
mod pool;
use access::{EXEC, READ, WRITE};
pub use error::MetaError;

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

/// The most consecutive servers (`base`, `base + 1`, … modulo `n`) of `n` none of which is in
/// `down`: `n` when none is down, and when all are (then a create is tried over every server,
/// and fails naming one).
fn widest_run_up(n: u32, down: &[u32]) -> u32 {
    let is_down = |s: u32| down.contains(&(s % n.max(1)));
    if (0..n).all(is_down) {
        return n;
    }
    // Twice round the ring, so a run across server n - 1 and server 0 is counted whole.
    let (mut widest, mut run) = (0, 0);
    for s in 0..2 * n {
        run = if is_down(s) { 0 } else { run + 1 };
        widest = widest.max(run);
    }
    widest.min(n)
}

/// Deepest directory chain followed when checking a rename for cycles.
const MAX_DEPTH: u32 = 1 << 16;

/// Most names one file may have (`EMLINK` past it), and most subdirectories of a directory;
/// ext4's limit, which tools expect of a Linux file system.
pub const LINK_MAX: u32 = 65_000;

const SUPER: TableDefinition<&str, u64> = TableDefinition::new("super");
const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
const DIRENTS: TableDefinition<(u64, &str), u64> = TableDefinition::new("dirents");
const ORPHANS: TableDefinition<u64, &[u8]> = TableDefinition::new("orphans");
const SYMLINKS: TableDefinition<u64, &str> = TableDefinition::new("symlinks");
const PRECREATED: TableDefinition<u64, ()> = TableDefinition::new("precreated");

const K_FORMAT: &str = "format";
const K_NEXT_HANDLE: &str = "next_handle";
const K_NEXT_BASE: &str = "next_base";
const K_FILES: &str = "files";
const K_DIRS: &str = "dirs";
const K_SERVERS: &str = "io_servers";

/// On-disk format version; bumped on incompatible record changes.
const FORMAT: u64 = 1;

/// Cluster facts and defaults the store needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaConfig {
    /// Number of io servers (fixed for the life of the file system).
    pub n_servers: u32,
    /// Default stripe size.
    pub default_ssize: u64,
    /// Default stripe count; `None` = all io servers (those up, when some are known down).
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
    /// A directory's parent (the root is its own); for anything else the directory of its
    /// first name (a pending create's only one), which later links and renames leave alone.
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

/// One object's outcome in [`MetaStore::getattr_many`]: its attributes, and a regular file's
/// layout.
pub type AttrsOf = Result<(Attr, Option<Layout>), MetaError>;

/// A newly created file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    /// Its handle.
    pub handle: Handle,
    /// Its attributes.
    pub attr: Attr,
    /// Its layout: create one object on each of its servers, unless `committed`.
    pub layout: Layout,
    /// It took a precreated handle, whose objects exist, and is committed; otherwise it is
    /// pending.
    pub committed: bool,
}

/// Where a create may go, besides its layout.
#[derive(Debug, Clone, Copy, Default)]
pub struct Placement<'a> {
    /// io servers known to be down: a layout whose base is not given avoids them while the
    /// stripe count leaves a choice.
    pub avoid: &'a [u32],
    /// A handle from [`MetaStore::reserve_precreated`] whose objects exist on every io server:
    /// taken if the layout spans every server (and the handle is still reserved).
    pub precreated: Option<Handle>,
    /// Only a create that takes `precreated`, which needs no io server: any other fails with
    /// [`MetaError::NeedsObjects`] and writes nothing.
    pub made_ahead_only: bool,
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
    /// Commits made without a flush, counted inside their transactions (so in commit order).
    lazy_commits: AtomicU64,
    /// `lazy_commits` as the latest durable commit saw it: every commit up to it is on disk.
    flushed_upto: AtomicU64,
    /// One meta server per database, said as such (redb's own lock only says it is open).
    _lock: crate::private::DirLock,
}

type Tbl<'t, K, V> = redb::Table<'t, K, V>;

/// The tables of one write transaction.
struct Tx<'t> {
    sup: Tbl<'t, &'static str, u64>,
    inodes: Tbl<'t, u64, &'static [u8]>,
    dirents: Tbl<'t, (u64, &'static str), u64>,
    orphans: Tbl<'t, u64, &'static [u8]>,
    links: Tbl<'t, u64, &'static str>,
    precreated: Tbl<'t, u64, ()>,
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
        let h = self.next_handle()?;
        self.add_entry_as(h, name, ino)?;
        Ok(h)
    }

    /// Allocates the next handle (never reused).
    fn next_handle(&mut self) -> Result<u64, MetaError> {
        let h = counter(&self.sup, K_NEXT_HANDLE)?;
        self.sup.insert(K_NEXT_HANDLE, h + 1)?;
        Ok(h)
    }

    /// As `add_entry`, under handle `h`, allocated before.
    fn add_entry_as(&mut self, h: u64, name: &str, ino: &Inode) -> Result<(), MetaError> {
        self.put_inode(h, ino)?;
        self.dirents.insert((ino.parent, name), h)?;
        Ok(())
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

    /// Adds `delta` to directory `h`'s link count (a subdirectory made, moved or removed),
    /// refusing past [`LINK_MAX`]; never below 2 (databases made before directories counted
    /// their subdirectories start from 2).
    fn dir_links(&mut self, h: u64, delta: i32) -> Result<(), MetaError> {
        let mut d = live_inode(&self.inodes, h)?;
        if delta > 0 && d.attr.nlink >= LINK_MAX {
            return Err(MetaError::TooManyLinks);
        }
        d.attr.nlink = d.attr.nlink.saturating_add_signed(delta).max(2);
        self.put_inode(h, &d)
    }

    /// Takes one name from `h` (whose entry the caller removed): a record with other names
    /// stays with one fewer and its change time set; the last name drops it.
    fn drop_name(&mut self, h: u64, i: &Inode, now: Timestamp) -> Result<Option<Objects>, MetaError> {
        if !i.is_dir() && i.attr.nlink > 1 {
            let mut i = i.clone();
            i.attr.nlink -= 1;
            i.attr.ctime = now;
            self.put_inode(h, &i)?;
            return Ok(None);
        }
        self.drop_inode(h, i)
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

/// The directory `parent` in which `cred` may make a new entry `name` (write and search
/// permission; the name free).
fn new_entry_dir(tx: &Tx<'_>, cred: &Cred, parent: u64, name: &str) -> Result<Inode, MetaError> {
    let dir = dir_inode(&tx.inodes, parent)?;
    access::check(&dir.attr, cred, EXEC)?;
    if get_entry(&tx.dirents, parent, name)?.is_some() {
        return Err(MetaError::Exists);
    }
    access::check(&dir.attr, cred, WRITE)?;
    Ok(dir)
}

/// `perm` as a new entry of `kind` in `dir` gets it from `cred` (see [`access::new_owner`]).
fn owned_perm(dir: &Inode, kind: FileKind, perm: Perm, cred: &Cred) -> Perm {
    let (mode, uid, gid) = access::new_owner(&dir.attr, kind, perm.mode, perm.uid, perm.gid, cred);
    Perm { mode, uid, gid }
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
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let name = format!("{}.lock", path.file_name().unwrap_or_default().to_string_lossy());
        let lock = crate::private::lock_dir(dir, &name, "another meta server").map_err(io)?;
        crate::private::options().write(true).create(true).truncate(false).open(path).map_err(io)?;
        crate::private::tighten(path, "meta database").map_err(io)?;
        let db = Database::create(path)?;
        let store = MetaStore {
            db,
            cfg,
            lazy_commits: AtomicU64::new(0),
            flushed_upto: AtomicU64::new(0),
            _lock: lock,
        };
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
        self.write_with(redb::Durability::Immediate, f)
    }

    /// As `write`, committed with `durability`: `None` for a change that may be lost in a crash
    /// because it is made again after one (it is then persisted by the next durable commit).
    fn write_with<T>(
        &self,
        durability: redb::Durability,
        f: impl FnOnce(&mut Tx<'_>) -> Result<T, MetaError>,
    ) -> Result<T, MetaError> {
        self.write_deciding(durability, |tx| Ok((f(tx)?, false)))
    }

    /// Commits acknowledged but not yet flushed to disk: those a crash of the meta server's
    /// machine (or of the meta server: redb keeps them in its own memory) would lose now.
    pub fn unflushed(&self) -> u64 {
        self.lazy_commits.load(Ordering::Acquire).saturating_sub(self.flushed_upto.load(Ordering::Acquire))
    }

    /// Makes every commit so far durable, if any was made without a flush (an empty durable
    /// commit persists the ones before it).
    pub fn flush(&self) -> Result<(), MetaError> {
        if self.unflushed() == 0 {
            return Ok(());
        }
        self.write(|_| Ok(()))
    }

    /// As `write_with`, where `f` may ask for a durable commit after all (its `true`).
    fn write_deciding<T>(
        &self,
        durability: redb::Durability,
        f: impl FnOnce(&mut Tx<'_>) -> Result<(T, bool), MetaError>,
    ) -> Result<T, MetaError> {
        let mut txn = self.db.begin_write()?;
        let (out, durable) = {
            let mut tx = Tx {
                sup: txn.open_table(SUPER)?,
                inodes: txn.open_table(INODES)?,
                dirents: txn.open_table(DIRENTS)?,
                orphans: txn.open_table(ORPHANS)?,
                links: txn.open_table(SYMLINKS)?,
                precreated: txn.open_table(PRECREATED)?,
            };
            f(&mut tx)?
        };
        let durability = if durable { redb::Durability::Immediate } else { durability };
        // Counted while this transaction holds redb's one writer's place: a durable commit
        // persists exactly the lazy ones counted before it. A lazy commit that then fails is
        // counted all the same, which costs the next flush an empty commit, no more.
        let lazy = matches!(durability, redb::Durability::None);
        let upto = if lazy {
            self.lazy_commits.fetch_add(1, Ordering::AcqRel);
            None
        } else {
            Some(self.lazy_commits.load(Ordering::Acquire))
        };
        txn.set_durability(durability);
        // An early return above drops `txn`, which aborts it.
        txn.commit()?;
        if let Some(upto) = upto {
            self.flushed_upto.fetch_max(upto, Ordering::AcqRel);
        }
        Ok(out)
    }

    /// `name` in directory `parent` (which `cred` must be allowed to search).
    pub fn lookup(&self, cred: &Cred, parent: Handle, name: &str) -> Result<(Handle, Attr), MetaError> {
        validate_name(name)?;
        let r = self.db.begin_read()?;
        let inodes = r.open_table(INODES)?;
        let dirents = r.open_table(DIRENTS)?;
        let dir = dir_inode(&inodes, parent.0).map_err(|e| match e {
            MetaError::NotFound => MetaError::Stale,
            e => e,
        })?;
        access::check(&dir.attr, cred, EXEC)?;
        let h = get_entry(&dirents, parent.0, name)?.ok_or(MetaError::NotFound)?;
        Ok((Handle(h), live_inode(&inodes, h)?.attr))
    }

    /// Resolves an absolute or root-relative path (`/a/b`, `a/b`; `.` and `..` allowed), as
    /// root.
    pub fn resolve(&self, path: &str) -> Result<Handle, MetaError> {
        let mut h = Handle::ROOT;
        for comp in path.split('/') {
            match comp {
                "" | "." => {}
                ".." => h = Handle(self.read_inode(h)?.parent),
                name => h = self.lookup(&Cred::root(), h, name)?.0,
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

    /// Attributes of each of `handles` (and a regular file's layout), read at one moment; at
    /// most [`MAX_BATCH`](crate::proto::MAX_BATCH) are read.
    pub fn getattr_many(&self, handles: &[Handle]) -> Result<Vec<AttrsOf>, MetaError> {
        let r = self.db.begin_read()?;
        let inodes = r.open_table(INODES)?;
        Ok(handles
            .iter()
            .take(crate::proto::MAX_BATCH)
            .map(|h| {
                let i = live_inode(&inodes, h.0)?;
                let layout = match (i.attr.kind, i.layout) {
                    (FileKind::File, None) => return Err(MetaError::Corrupt(h.0)),
                    (FileKind::File, layout) => layout,
                    _ => None,
                };
                Ok((i.attr, layout))
            })
            .collect())
    }

    /// Attributes and layout for an open by `cred` for `rights` (read and write permission
    /// as they ask; none for [`Rights::NONE`], which only learns the size); directories,
    /// symbolic links and special files are refused.
    pub fn open_file(&self, cred: &Cred, h: Handle, rights: Rights) -> Result<OpenFile, MetaError> {
        let i = self.read_inode(h)?;
        let layout = match (i.attr.kind, i.layout) {
            (FileKind::File, Some(layout)) => layout,
            (FileKind::Symlink, _) => return Err(MetaError::IsLink),
            (FileKind::Dir, _) => return Err(MetaError::IsDir),
            _ => return Err(MetaError::Invalid("not a regular file")),
        };
        let want = if rights.contains(Rights::READ) { READ } else { 0 }
            | if rights.contains(Rights::WRITE) { WRITE } else { 0 };
        access::check(&i.attr, cred, want)?;
        Ok(OpenFile { attr: i.attr, layout })
    }

    /// Creates a symbolic link to `target` (any non-empty path text without NUL, stored as
    /// given). Its mode is `0o777` and its size the target's length, as on Linux.
    pub fn symlink(
        &self,
        cred: &Cred,
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
            let dir = new_entry_dir(tx, cred, parent.0, name)?;
            let now = Timestamp::now();
            let perm = owned_perm(&dir, FileKind::Symlink, Perm { mode: 0o777, ..owner }, cred);
            let mut attr = new_attr(FileKind::Symlink, perm, now);
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
        // A file striped over every server unless told otherwise goes over those up, as
        // Lustre's stripe count -1 means every OST available: one dead io server must not
        // stop every new file. A count asked for is kept, and fails naming a server down.
        let pcount = match spec.pcount.or(self.cfg.default_pcount) {
            Some(p) => p,
            None if spec.base.is_none() => widest_run_up(n, avoid),
            None => n,
        };
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

    /// Creates a directory; it inherits the parent's default layout.
    pub fn mkdir(
        &self,
        cred: &Cred,
        parent: Handle,
        name: &str,
        perm: Perm,
    ) -> Result<(Handle, Attr), MetaError> {
        validate_name(name)?;
        self.write(|tx| {
            let dir = new_entry_dir(tx, cred, parent.0, name)?;
            let now = Timestamp::now();
            let attr = new_attr(FileKind::Dir, owned_perm(&dir, FileKind::Dir, perm, cred), now);
            let ino = Inode {
                attr: attr.clone(),
                parent: parent.0,
                layout: None,
                default: dir.default,
                state: State::Committed,
            };
            tx.dir_links(parent.0, 1)?;
            let h = tx.add_entry(name, &ino)?;
            tx.bump(K_DIRS, 1)?;
            tx.touch_dir(parent.0, now)?;
            Ok((Handle(h), attr))
        })
    }

    /// Creates a FIFO, socket or device node (`kind`, with its device number): a record
    /// without objects.
    pub fn mknod(
        &self,
        cred: &Cred,
        parent: Handle,
        name: &str,
        kind: FileKind,
        perm: Perm,
    ) -> Result<(Handle, Attr), MetaError> {
        validate_name(name)?;
        if !kind.is_special() {
            return Err(MetaError::Invalid("mknod makes FIFOs, sockets and device nodes"));
        }
        self.write(|tx| {
            let dir = new_entry_dir(tx, cred, parent.0, name)?;
            let now = Timestamp::now();
            let attr = new_attr(kind, owned_perm(&dir, kind, perm, cred), now);
            let ino = Inode {
                attr: attr.clone(),
                parent: parent.0,
                layout: None,
                default: None,
                state: State::Committed,
            };
            let h = tx.add_entry(name, &ino)?;
            tx.bump(K_FILES, 1)?;
            tx.touch_dir(parent.0, now)?;
            Ok((Handle(h), attr))
        })
    }

    /// Gives `h` (anything but a directory: `EPERM`) the further name `name` in `parent`:
    /// a hard link. Its link count goes up and its change time is set.
    pub fn link(&self, cred: &Cred, h: Handle, parent: Handle, name: &str) -> Result<Attr, MetaError> {
        validate_name(name)?;
        self.write(|tx| {
            let mut i = live_inode(&tx.inodes, h.0)?;
            new_entry_dir(tx, cred, parent.0, name)?;
            if i.is_dir() {
                return Err(MetaError::NotPermitted("directories have one name"));
            }
            if i.attr.nlink >= LINK_MAX {
                return Err(MetaError::TooManyLinks);
            }
            let now = Timestamp::now();
            i.attr.nlink += 1;
            i.attr.ctime = now;
            tx.put_inode(h.0, &i)?;
            tx.dirents.insert((parent.0, name), h.0)?;
            tx.touch_dir(parent.0, now)?;
            Ok(i.attr)
        })
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, cred: &Cred, parent: Handle, name: &str) -> Result<(), MetaError> {
        validate_name(name)?;
        self.write(|tx| {
            let (h, i) = entry_to_remove(tx, cred, parent.0, name)?;
            if !i.is_dir() {
                return Err(MetaError::NotDir);
            }
            if !dir_is_empty(&tx.dirents, h)? {
                return Err(MetaError::NotEmpty);
            }
            tx.dirents.remove((parent.0, name))?;
            tx.drop_inode(h, &i)?;
            tx.dir_links(parent.0, -1)?;
            tx.touch_dir(parent.0, Timestamp::now())
        })
    }

    /// Removes a name of a file, symbolic link or special file. With its last name, a file's
    /// objects are recorded as an orphan and returned: remove them on the io servers, then
    /// [`MetaStore::forget_orphan`]. Other names keep the file and its data.
    pub fn unlink(&self, cred: &Cred, parent: Handle, name: &str) -> Result<Option<Objects>, MetaError> {
        validate_name(name)?;
        self.write(|tx| {
            let (h, i) = entry_to_remove(tx, cred, parent.0, name)?;
            if i.is_dir() {
                return Err(MetaError::IsDir);
            }
            tx.dirents.remove((parent.0, name))?;
            let now = Timestamp::now();
            let objs = tx.drop_name(h, &i, now)?;
            if objs.is_none() && i.attr.kind == FileKind::File && i.attr.nlink <= 1 {
                return Err(MetaError::Corrupt(h));
            }
            tx.touch_dir(parent.0, now)?;
            Ok(objs)
        })
    }

    /// POSIX rename. A non-directory target loses this name (its objects returned as an
    /// orphan if it was the last, as for unlink); an empty directory target is replaced by a
    /// directory. Refused: a directory over a non-directory (`ENOTDIR`), a non-directory over a
    /// directory (`EISDIR`), over a non-empty directory (`ENOTEMPTY`), a directory into its own
    /// subtree (`EINVAL`). Two names of one file: nothing happens, as POSIX says.
    ///
    /// `cred` needs write and search permission on both directories (the sticky bit applies
    /// to the source and to a replaced target), and write permission on a directory it moves
    /// to another parent (its `..` changes).
    pub fn rename(
        &self,
        cred: &Cred,
        src_parent: Handle,
        src_name: &str,
        dst_parent: Handle,
        dst_name: &str,
    ) -> Result<Option<Objects>, MetaError> {
        validate_name(src_name)?;
        validate_name(dst_name)?;
        self.write(|tx| {
            let (h, mut src) = entry_to_remove(tx, cred, src_parent.0, src_name)?;
            let dst_dir = dir_inode(&tx.inodes, dst_parent.0)?;
            access::check(&dst_dir.attr, cred, EXEC)?;
            let moves_dir = src.is_dir() && dst_parent != src_parent;
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
            let now = Timestamp::now();
            let mut replaced = None;
            let mut replaced_dir = false;
            if let Some(t) = get_entry(&tx.dirents, dst_parent.0, dst_name)? {
                if t == h {
                    return Ok(None); // one file: POSIX says do nothing
                }
                let target = get_inode(&tx.inodes, t)?.ok_or(MetaError::Corrupt(t))?;
                if target.state == State::Pending {
                    return Err(MetaError::Busy);
                }
                match (src.is_dir(), target.is_dir()) {
                    (true, false) => return Err(MetaError::NotDir),
                    (false, true) => return Err(MetaError::IsDir),
                    _ => {}
                }
                access::may_remove(&dst_dir.attr, &target.attr, cred)?;
                if moves_dir {
                    access::check(&src.attr, cred, WRITE)?;
                }
                if target.is_dir() && !dir_is_empty(&tx.dirents, t)? {
                    return Err(MetaError::NotEmpty);
                }
                replaced_dir = target.is_dir();
                replaced = tx.drop_name(t, &target, now)?;
            } else {
                access::check(&dst_dir.attr, cred, WRITE)?;
                if moves_dir {
                    access::check(&src.attr, cred, WRITE)?;
                }
            }
            tx.dirents.remove((src_parent.0, src_name))?;
            tx.dirents.insert((dst_parent.0, dst_name), h)?;
            if src.is_dir() {
                src.parent = dst_parent.0;
            }
            src.attr.ctime = now;
            tx.put_inode(h, &src)?;
            if replaced_dir {
                tx.dir_links(dst_parent.0, -1)?;
            }
            if moves_dir {
                tx.dir_links(src_parent.0, -1)?;
                tx.dir_links(dst_parent.0, 1)?;
            }
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
        cred: &Cred,
        dir: Handle,
        after: Option<&str>,
        max: usize,
    ) -> Result<(Vec<DirEntry>, bool), MetaError> {
        // A peer's page size never sizes an allocation beyond one wire page.
        let max = max.min(MAX_READDIR);
        let r = self.db.begin_read()?;
        let inodes = r.open_table(INODES)?;
        let dirents = r.open_table(DIRENTS)?;
        access::check(&dir_inode(&inodes, dir.0)?.attr, cred, READ)?;
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

    /// Changes attributes, as `cred` may (the rules are in the store's `access` module). A
    /// size change on a file is recorded and returned with the layout so the caller truncates
    /// each object to [`Layout::local_size`]; on a directory it is refused. A size change sets
    /// the modification time, and any change the change time.
    ///
    /// A change that takes mode bits away, or changes the owner, group or size, is durable
    /// when this returns. A change of times, or one that only adds mode bits (a mode or owner
    /// set to what it already is among them), is committed without a flush, as a local file
    /// system's waits for its journal: durable with the next durable commit,
    /// [`MetaStore::flush`], or at once if [`SetAttr::sync`] asks.
    pub fn setattr(&self, cred: &Cred, h: Handle, set: &SetAttr) -> Result<SetattrOutcome, MetaError> {
        let durability =
            if set.sync || set.size.is_some() { redb::Durability::Immediate } else { redb::Durability::None };
        self.write_deciding(durability, |tx| {
            let mut i = live_inode(&tx.inodes, h.0)?;
            let now = Timestamp::now();
            let mut truncate = None;
            if set.size.is_some() {
                match i.attr.kind {
                    FileKind::Dir => return Err(MetaError::IsDir),
                    FileKind::Symlink => return Err(MetaError::Invalid("cannot truncate a symbolic link")),
                    FileKind::File => {}
                    _ => return Err(MetaError::Invalid("cannot truncate a special file")),
                }
            }
            if set.mode.is_some() && i.attr.kind == FileKind::Symlink {
                // A link's mode means nothing (Linux's are all 0777 and lchmod fails).
                return Err(MetaError::Invalid("a symbolic link has no mode to change"));
            }
            let mode = access::setattr(&i.attr, cred, set)?;
            // Lost in a crash, a change that only adds mode bits leaves the file as closed as
            // it was (tar makes each file 0600 and then opens it up); one that takes a bit away
            // (a set-id bit a write clears too), or changes the owner or group, must not be.
            let durable = i.attr.mode & !mode & 0o7777 != 0
                || set.uid.is_some_and(|u| u != i.attr.uid)
                || set.gid.is_some_and(|g| g != i.attr.gid);
            i.attr.mode = mode;
            if let Some(size) = set.size {
                i.attr.size = size;
                i.attr.mtime = now;
                truncate = i.layout.map(|l| (l, size));
            }
            if let Some(u) = set.uid {
                i.attr.uid = u;
            }
            if let Some(g) = set.gid {
                i.attr.gid = g;
            }
            let at = |t: SetTime| match t {
                SetTime::Now => now,
                SetTime::At(t) => t,
            };
            if let Some(t) = set.atime {
                i.attr.atime = at(t);
            }
            if let Some(t) = set.mtime {
                i.attr.mtime = at(t);
            }
            i.attr.ctime = now;
            tx.put_inode(h.0, &i)?;
            Ok((SetattrOutcome { attr: i.attr, truncate }, durable))
        })
    }

    /// A file's layout or a directory's default layout.
    pub fn getstripe(&self, h: Handle) -> Result<Stripe, MetaError> {
        let i = self.read_inode(h)?;
        Ok(Stripe { layout: i.layout, default: i.default })
    }

    /// Sets (or clears) a directory's default layout. Fields that are set are checked against
    /// the cluster now, so a bad default cannot break later creates.
    /// Only the directory's owner or root may.
    pub fn setstripe(&self, cred: &Cred, dir: Handle, spec: Option<LayoutSpec>) -> Result<(), MetaError> {
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
            if !access::owns(&d.attr, cred) {
                return Err(MetaError::NotPermitted(
                    "only the owner or root sets a directory's default layout",
                ));
            }
            d.default = spec;
            d.attr.ctime = Timestamp::now();
            tx.put_inode(dir.0, &d)
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

/// The entry `name` of directory `parent` that `cred` may remove (or rename away): search
/// permission to find it, then write permission and the sticky rule (see
/// [`access::may_remove`]).
fn entry_to_remove(tx: &Tx<'_>, cred: &Cred, parent: u64, name: &str) -> Result<(u64, Inode), MetaError> {
    let dir = dir_inode(&tx.inodes, parent)?;
    access::check(&dir.attr, cred, EXEC)?;
    let h = get_entry(&tx.dirents, parent, name)?.ok_or(MetaError::NotFound)?;
    let i = live_inode(&tx.inodes, h)?;
    access::may_remove(&dir.attr, &i.attr, cred)?;
    Ok((h, i))
}

#[cfg(test)]
mod tests;
