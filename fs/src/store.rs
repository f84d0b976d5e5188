//! An io server's object storage: one local file per handle, in hashed subdirectories of a data
//! directory (`<dir>/ab/cd/<handle as 16 hex digits>`), like PVFS1's `ino mod 101` directories
//! but spread by a hash so sequential handles do not pile into one directory.
//!
//! Data moves as *streams*: a descriptor's local pieces, in order, are read into or written from
//! consecutive bytes of a buffer. A [`PieceCursor`] walks the pieces so a request can be served
//! one transfer unit at a time (pipelined with the network) without expanding the descriptor.
//! Reads of holes and of bytes past the local end return zeros: the local file of one server may
//! be shorter than the logical file when the file is sparse; the reply's local size lets the
//! client tell a hole from the end of file.
//!
//! Open files are kept in a bounded LRU cache ([`StoreConfig::max_open`]); OS errors are mapped
//! to protocol codes ([`StoreError::errno`]: `ENOSPC`, `EIO`, …), never panics.
//!
//! # Mapped data path
//! An [`Object`] can also be mapped ([`Object::map_covering`]), so the io server receives into
//! and sends from the file's own pages and the transport's copy is the only one (no staging
//! buffer, no `pread`/`pwrite`). Three rules keep a mapping safe to touch: bytes are written
//! through it only after [`Object::allocate`] has reserved their space (a full disk is then
//! `ENOSPC` from `fallocate`, not a `SIGBUS`); a write extends the file only just ahead of its
//! data ([`Object::begin_write`]), since a store past the end faults; and transfers hold the
//! object's gate shared ([`Object::transfer`]) while truncation and removal take it
//! exclusively, so the file never shrinks under a live region.
//!
//! # Size
//! An object's size is the end of the data that landed, never of space reserved for data still
//! on the wire: `fallocate` keeps the size (`FALLOC_FL_KEEP_SIZE`), a mapped write lengthens the
//! file to its end before its first store past it and reports each unit's end only once its
//! data arrived, and a write that fails part way (the client died, a pull timed out, the disk
//! filled) is cut back to what landed (`ledger`). `pwrite`s set the size as they land.
//!
//! # Write-behind
//! Once [`StoreConfig::write_behind`] bytes have landed in an object, the store starts their
//! writeback (`sync_file_range(SYNC_FILE_RANGE_WRITE)`) and goes on without waiting, so the
//! disk writes while the rest of a stream is still arriving and a client's fsync waits only
//! for the tail. Durability is unchanged: only fsync promises it.

use crate::errno::Errno;
use crate::layout::Piece;
// Every critical section here leaves its data consistent, so a poisoned lock is usable.
use crate::lock;
use crate::proto::{Handle, ObjectSize};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};
use tracing::{debug, warn};

mod ledger;
use ledger::Ledger;

/// Largest local file offset: `off_t` is signed.
pub const MAX_OBJECT_SIZE: u64 = i64::MAX as u64;

/// Store settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreConfig {
    /// Most files held open at once (default 256). Each costs one file descriptor; the least
    /// recently used is closed to make room.
    pub max_open: usize,
    /// Dirty bytes an object gathers before their writeback is started, without waiting for it
    /// (default [`DEFAULT_WRITE_BEHIND`]; 0 leaves writeback to the kernel and the next fsync;
    /// ignored in memory file systems, which write nothing back).
    pub write_behind: u64,
}

/// Default of [`StoreConfig::write_behind`]: 8 MiB.
pub const DEFAULT_WRITE_BEHIND: u64 = 8 << 20;

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig { max_open: 256, write_behind: DEFAULT_WRITE_BEHIND }
    }
}

/// Longest mapping of one object (1 TiB): address space, not memory. Offsets beyond it use the
/// copying path.
pub const MAX_MAPPED: u64 = 1 << 40;
/// Smallest mapping made: later growth remaps, so start with room.
const MIN_MAPPED: u64 = 64 << 20;
/// Allocated extents remembered per object; past it the oldest are forgotten (they are only
/// re-`fallocate`d, which is harmless).
const MAX_EXTENTS: usize = 1024;

/// One open object file; see the [module documentation](self) for its mapped data path.
pub struct Object {
    handle: Handle,
    file: File,
    gate: RwLock<()>,
    map: Mutex<Option<Arc<ionet::FileMap>>>,
    /// Byte ranges known to be allocated (sorted, merged), past the end too.
    allocated: Mutex<Vec<(u64, u64)>>,
    /// The size as data lands, and the file's length.
    ledger: Mutex<Ledger>,
    /// Landed data whose writeback has not been started.
    behind: Mutex<WriteBehind>,
    write_behind: Arc<WriteBehindShared>,
}

/// Write-behind: the page cache would hold a whole stream until the client's fsync and only
/// then write it (the kernel's own writeback waits for far more dirty memory), so a large write
/// would take its network time plus its disk time. Started once a few megabytes have gathered,
/// the disk works while the rest is still on the wire and the fsync finds little left to do.
#[derive(Debug)]
struct WriteBehindShared {
    /// [`StoreConfig::write_behind`].
    threshold: u64,
    /// Bytes whose writeback was started early, over all objects.
    started: AtomicU64,
}

/// The span of one object's landed data since its writeback was last started.
#[derive(Debug, Default)]
struct WriteBehind {
    lo: u64,
    hi: u64,
    bytes: u64,
}

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Object").field("handle", &self.handle).finish()
    }
}

impl Object {
    fn new(handle: Handle, file: File, write_behind: Arc<WriteBehindShared>) -> Result<Self, StoreError> {
        let len = file.metadata().map_err(|error| StoreError::Io { op: "stat", handle, error })?.len();
        Ok(Object {
            handle,
            file,
            gate: RwLock::new(()),
            map: Mutex::new(None),
            allocated: Mutex::new(Vec::new()),
            ledger: Mutex::new(Ledger::new(len)),
            behind: Mutex::new(WriteBehind::default()),
            write_behind,
        })
    }

    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Held for a whole data transfer: truncation and removal wait for it.
    pub fn transfer(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Held while the file shrinks or goes away, or while it is written without the map.
    pub fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.gate.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The local size: the end of the data that landed (the file can be longer while a mapped
    /// write is running).
    pub fn size(&self) -> Result<u64, StoreError> {
        Ok(lock(&self.ledger).landed())
    }

    /// The first local byte at or after `off` holding data (`None`: none), or with `hole` the
    /// first in a hole, as `lseek`'s `SEEK_DATA` and `SEEK_HOLE` find them, and the local size
    /// they are bounded by. Bytes past the size are a hole (they read as zeros), though the
    /// file may be longer while a mapped write is running; space reserved but never written
    /// is a hole too, as the file system reports it.
    pub fn seek(&self, off: u64, hole: bool) -> Result<(Option<u64>, u64), StoreError> {
        use nix::unistd::{Whence, lseek};
        let size = self.size()?;
        if off >= size {
            return Ok((hole.then_some(off), size));
        }
        let at = i64::try_from(off).map_err(|_| StoreError::TooLarge)?;
        let whence = if hole { Whence::SeekHole } else { Whence::SeekData };
        let found = match lseek(self.file.as_fd(), at, whence) {
            Ok(found) => u64::try_from(found).ok(),
            // Nothing but a hole from `off` to the file's end.
            Err(nix::errno::Errno::ENXIO) => None,
            Err(e) => {
                return Err(StoreError::Io { op: "lseek", handle: self.handle, error: io::Error::from(e) });
            }
        };
        let found = match hole {
            true => Some(found.unwrap_or(size).min(size)),
            false => found.filter(|&d| d < size),
        };
        Ok((found, size))
    }

    /// The local size, and the disk space the file holds (`st_blocks`: a file system that
    /// allocates lazily counts what it has promised to the data already written).
    pub fn space(&self) -> Result<ObjectSize, StoreError> {
        use std::os::unix::fs::MetadataExt;
        let size = self.size()?;
        let m = self.file.metadata().map_err(|error| StoreError::Io {
            op: "fstat",
            handle: self.handle,
            error,
        })?;
        Ok(ObjectSize { size, allocated: m.blocks().saturating_mul(512) })
    }

    fn set_file_len(&self, op: &'static str, len: u64) -> io::Result<()> {
        self.file.set_len(len).inspect_err(|e| {
            warn!(handle = %self.handle, len, error = %e, "{op}: setting the length failed");
        })
    }

    /// Starts a mapped write whose pieces end at `end` (allocate them after this, inside
    /// [`Object::transfer`]). Dropping the returned [`Writing`] without
    /// [`finishing`](Writing::finish) it counts as a failed write.
    pub fn begin_write(&self, end: u64) -> Writing<'_> {
        let id = lock(&self.ledger).begin(end);
        Writing { obj: self, id, failed: true }
    }

    /// A mapping of at least `[0, end)`, or `None` when `end` is past [`MAX_MAPPED`].
    /// Mappings grow by doubling; an old one lives on while its regions do.
    pub fn map_covering(&self, end: u64) -> Result<Option<Arc<ionet::FileMap>>, StoreError> {
        if end > MAX_MAPPED {
            return Ok(None);
        }
        let mut slot = lock(&self.map);
        if let Some(m) = slot.as_ref().filter(|m| m.len() >= end) {
            return Ok(Some(m.clone()));
        }
        let len = end.max(MIN_MAPPED).next_power_of_two().min(MAX_MAPPED);
        // SAFETY: the object file is private to this io server and the store keeps one
        // `Object` per handle alive while anyone uses it. Regions are only taken inside
        // `transfer()`, and the file only shrinks (`truncate`) or goes away (`remove`) inside
        // `exclusive()`, so it never shrinks under a live region. Bytes are written through a
        // region only after `allocate` reserved them, and the copying path (`write_stream`)
        // runs under `exclusive()`, when no region is alive.
        #[allow(unsafe_code)] // Zero-copy storage needs a mapping.
        let m = unsafe { ionet::FileMap::new(&self.file, len) }.map_err(|source| StoreError::Io {
            op: "mmap",
            handle: self.handle,
            error: source,
        })?;
        *slot = Some(m.clone());
        Ok(Some(m))
    }

    /// Reserves disk space for `[off, off + len)` without changing the size (the space past the
    /// end waits for [`Writing::extend`]), so stores through the mapping cannot fault on a full
    /// disk. Remembers what it reserved.
    pub fn allocate(&self, off: u64, len: u64) -> Result<(), StoreError> {
        let end = off.checked_add(len).filter(|&e| e <= MAX_OBJECT_SIZE).ok_or(StoreError::TooLarge)?;
        if len == 0 || covered(&lock(&self.allocated), off, end) {
            return Ok(());
        }
        let r = nix::fcntl::fallocate(
            self.file.as_fd(),
            nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
            off as i64,
            len as i64,
        );
        r.map_err(|e| StoreError::Io { op: "fallocate", handle: self.handle, error: io::Error::from(e) })?;
        insert_extent(&mut lock(&self.allocated), off, end);
        Ok(())
    }

    /// Frees the disk space of `[off, off + len)`, which then reads as zeros, keeping the size
    /// (`fallocate` with `FALLOC_FL_PUNCH_HOLE`). Taken exclusively, as truncation is, and the
    /// mapping dropped with it: the freed pages must not stay behind a live region or a
    /// device's pins of them. What was reserved there is forgotten, so a later mapped write
    /// reserves it again before it stores.
    pub fn punch(&self, off: u64, len: u64) -> Result<(), StoreError> {
        let end = off.checked_add(len).filter(|&e| e <= MAX_OBJECT_SIZE).ok_or(StoreError::TooLarge)?;
        let _x = self.exclusive();
        let flags = nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
            | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
        let r = nix::fcntl::fallocate(self.file.as_fd(), flags, off as i64, len as i64);
        r.map_err(|e| StoreError::Io { op: "fallocate", handle: self.handle, error: io::Error::from(e) })?;
        *lock(&self.map) = None;
        remove_extent(&mut lock(&self.allocated), off, end);
        Ok(())
    }

    /// `[lo, hi)` landed in the file: once [`StoreConfig::write_behind`] bytes have gathered,
    /// starts writing back their span without waiting (a failure is the next fsync's to report).
    fn wrote(&self, lo: u64, hi: u64) {
        let threshold = self.write_behind.threshold;
        if threshold == 0 || hi <= lo {
            return;
        }
        let (lo, hi, bytes) = {
            let mut b = lock(&self.behind);
            if b.bytes == 0 {
                (b.lo, b.hi) = (lo, hi);
            } else {
                (b.lo, b.hi) = (b.lo.min(lo), b.hi.max(hi));
            }
            b.bytes += hi - lo;
            if b.bytes < threshold {
                return;
            }
            let b = std::mem::take(&mut *b);
            (b.lo, b.hi, b.bytes)
        };
        if start_writeback(&self.file, lo, hi - lo) {
            self.write_behind.started.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Sets the local size with no transfer running (down drops data, up adds a hole).
    fn set_len(&self, size: u64) -> Result<(), StoreError> {
        let _x = self.exclusive();
        self.set_len_exclusive(size)
    }

    /// Makes the local size at least `size` (up adds a hole), never less: a concurrent write
    /// that went further keeps its data.
    fn grow(&self, size: u64) -> Result<(), StoreError> {
        let _x = self.exclusive();
        if lock(&self.ledger).landed() >= size {
            return Ok(());
        }
        self.set_len_exclusive(size)
    }

    /// [`Object::set_len`] under the exclusive gate the caller holds.
    fn set_len_exclusive(&self, size: u64) -> Result<(), StoreError> {
        self.file.set_len(size).map_err(|source| StoreError::Io {
            op: "truncate",
            handle: self.handle,
            error: source,
        })?;
        lock(&self.ledger).reset(size);
        // Drop the mapping too (no region is alive under the exclusive gate): an InfiniBand
        // endpoint keeps registrations of mapped pages cached across requests, and a device's
        // pins must not outlive the pages a shrink frees. The next transfer maps afresh.
        *lock(&self.map) = None;
        self.forget_allocated_from(size);
        Ok(())
    }

    /// The file was cut to `size`: nothing past it is allocated any more.
    fn forget_allocated_from(&self, size: u64) {
        let mut a = lock(&self.allocated);
        a.retain(|e| e.0 < size);
        if let Some(last) = a.last_mut() {
            last.1 = last.1.min(size);
        }
    }
}

/// A mapped write in progress on an [`Object`] (from [`Object::begin_write`]): lengthens the
/// file ahead of the data and records what landed; when it ends, the file is cut back to the
/// landed data (and what other writes still need).
#[derive(Debug)]
pub struct Writing<'a> {
    obj: &'a Object,
    id: u64,
    failed: bool,
}

impl Writing<'_> {
    /// Makes the file at least `end` long, before data is stored up to `end` through a mapping.
    pub fn extend(&self, end: u64) -> Result<(), StoreError> {
        let o = self.obj;
        lock(&o.ledger).extend(end, |n| o.set_file_len("extend", n)).map_err(|error| StoreError::Io {
            op: "extend",
            handle: o.handle,
            error,
        })
    }

    /// Every byte of this write before `end` is in the file; the last unit covered
    /// `[start, end)`.
    pub fn landed(&self, start: u64, end: u64) {
        lock(&self.obj.ledger).land(end);
        self.obj.wrote(start, end);
    }

    /// Ends the write: `complete` if all its data landed (or it reserved nothing).
    pub fn finish(mut self, complete: bool) {
        self.failed = !complete;
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let o = self.obj;
        let mut ledger = lock(&o.ledger);
        match ledger.end(self.id, self.failed, |n| o.set_file_len("cut back", n)) {
            Ok(Some(len)) => {
                debug!(handle = %o.handle, len, failed = self.failed, "object cut back to its landed data");
                o.forget_allocated_from(len);
            }
            Ok(None) => {}
            // Logged by set_file_len; the size reported stays the landed data's.
            Err(_) => {}
        }
    }
}

/// True if the sorted, merged `extents` cover `[off, end)`.
fn covered(extents: &[(u64, u64)], off: u64, end: u64) -> bool {
    let i = extents.partition_point(|e| e.1 < end);
    extents.get(i).is_some_and(|e| e.0 <= off && end <= e.1)
}

/// Takes `[off, end)` out of sorted, merged `extents`.
fn remove_extent(extents: &mut Vec<(u64, u64)>, off: u64, end: u64) {
    let mut kept = Vec::with_capacity(extents.len() + 1);
    for &(lo, hi) in extents.iter() {
        if hi <= off || end <= lo {
            kept.push((lo, hi));
            continue;
        }
        if lo < off {
            kept.push((lo, off));
        }
        if end < hi {
            kept.push((end, hi));
        }
    }
    *extents = kept;
}

/// Adds `[off, end)` to sorted, merged `extents`, keeping at most [`MAX_EXTENTS`].
fn insert_extent(extents: &mut Vec<(u64, u64)>, off: u64, end: u64) {
    let (mut lo, mut hi) = (off, end);
    // Everything touching [lo, hi) merges into it.
    let first = extents.partition_point(|e| e.1 < lo);
    let mut last = first;
    while last < extents.len() && extents[last].0 <= hi {
        lo = lo.min(extents[last].0);
        hi = hi.max(extents[last].1);
        last += 1;
    }
    extents.splice(first..last, [(lo, hi)]);
    if extents.len() > MAX_EXTENTS {
        extents.remove(0);
    }
}

/// The file system holding an object directory, as `statfs` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSystem {
    /// Its usual name (`"unknown"` for a type this list does not name).
    pub name: &'static str,
    /// Its `f_type` (the superblock magic).
    pub magic: u64,
}

impl FileSystem {
    /// The file system holding `dir`.
    pub fn of(dir: &Path) -> io::Result<FileSystem> {
        use nix::sys::statfs as fs;
        let t = fs::statfs(dir).map_err(io::Error::from)?.filesystem_type();
        let name = match t {
            fs::EXT4_SUPER_MAGIC => "ext2/ext3/ext4",
            fs::TMPFS_MAGIC => "tmpfs",
            fs::XFS_SUPER_MAGIC => "xfs",
            fs::BTRFS_SUPER_MAGIC => "btrfs",
            fs::F2FS_SUPER_MAGIC => "f2fs",
            fs::NFS_SUPER_MAGIC => "nfs",
            fs::OVERLAYFS_SUPER_MAGIC => "overlayfs",
            fs::FUSE_SUPER_MAGIC => "fuse",
            _ if t.0 as u64 == 0x2fc1_2fc1 => "zfs",
            _ if t.0 as u64 == 0xca45_1a4e => "bcachefs",
            _ if t.0 as u64 == 0x8584_58f6 => "ramfs",
            _ => "unknown",
        };
        Ok(FileSystem { name, magic: t.0 as u64 })
    }

    /// True for a file system in memory (tmpfs): nothing is written back, so a page stored
    /// through a mapping costs one fault and nothing more.
    pub fn in_memory(&self) -> bool {
        self.magic == nix::sys::statfs::TMPFS_MAGIC.0 as u64
    }

    /// True if stores through a mapping into space reserved with `fallocate` cannot fail for
    /// lack of space: the file system rewrites allocated blocks in place. ext4 and tmpfs do. A
    /// copy-on-write file system (btrfs, XFS with reflink, ZFS, bcachefs) allocates anew on
    /// every rewrite, so a store into a full one faults (`SIGBUS`) whatever was reserved; XFS is
    /// left out as it cannot be told apart from XFS with reflink (the default of `mkfs.xfs`)
    /// without an XFS-specific ioctl. Everything not known to be safe counts as unsafe.
    pub fn rewrites_in_place(&self) -> bool {
        [nix::sys::statfs::EXT4_SUPER_MAGIC, nix::sys::statfs::TMPFS_MAGIC]
            .iter()
            .any(|m| m.0 as u64 == self.magic)
    }
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No object for this handle.
    #[error("no object for handle {0}")]
    NotFound(Handle),
    /// A piece ends past [`MAX_OBJECT_SIZE`].
    #[error("offset beyond the largest object size")]
    TooLarge,
    /// The OS refused.
    #[error("{op} {handle}: {error}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which object.
        handle: Handle,
        /// The OS error.
        error: io::Error,
    },
}

impl StoreError {
    /// The code sent to the peer.
    pub fn errno(&self) -> Errno {
        match self {
            StoreError::NotFound(_) => Errno::ENOENT,
            StoreError::TooLarge => Errno::EFBIG,
            StoreError::Io { error, .. } => Errno::from_io(error),
        }
    }
}

/// Walks a descriptor's pieces a few bytes at a time.
#[derive(Debug)]
pub struct PieceCursor<I> {
    pieces: I,
    cur: Option<Piece>,
}

impl<I: Iterator<Item = Piece>> PieceCursor<I> {
    /// A cursor at the start of `pieces`.
    pub fn new(pieces: impl IntoIterator<Item = Piece, IntoIter = I>) -> Self {
        PieceCursor { pieces: pieces.into_iter(), cur: None }
    }

    /// The next piece of at most `max` bytes (`None` when the stream is done).
    pub fn next_piece(&mut self, max: u64) -> Option<Piece> {
        if max == 0 {
            return None;
        }
        let p = loop {
            match self.cur.take() {
                Some(p) if p.len > 0 => break p,
                Some(_) => {}
                None => self.cur = Some(self.pieces.next()?),
            }
        };
        let n = p.len.min(max);
        if n < p.len {
            self.cur = Some(Piece::new(p.off.saturating_add(n), p.len - n));
        }
        Some(Piece::new(p.off, n))
    }
}

struct FdCache {
    files: HashMap<Handle, (Arc<Object>, u64)>,
    /// Every object someone still holds, cached or not, so two users of one handle share one
    /// `Object` (and its gate).
    live: HashMap<Handle, Weak<Object>>,
    tick: u64,
    cap: usize,
}

impl FdCache {
    fn get(&mut self, h: Handle) -> Option<Arc<Object>> {
        if let Some(o) = self.get_cached(h) {
            return Some(o);
        }
        let o = self.live.get(&h)?.upgrade()?;
        self.insert(h, o.clone());
        Some(o)
    }

    fn get_cached(&mut self, h: Handle) -> Option<Arc<Object>> {
        self.tick += 1;
        let tick = self.tick;
        self.files.get_mut(&h).map(|(f, t)| {
            *t = tick;
            f.clone()
        })
    }

    fn insert(&mut self, h: Handle, f: Arc<Object>) {
        if self.live.len() >= 2 * self.cap.max(64) {
            self.live.retain(|_, w| w.strong_count() > 0);
        }
        self.live.insert(h, Arc::downgrade(&f));
        if self.cap == 0 {
            return;
        }
        if !self.files.contains_key(&h) && self.files.len() >= self.cap {
            // O(cap) scan; cap is a few hundred and misses already cost an open(2).
            if let Some(old) = self.files.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| *k) {
                self.files.remove(&old);
            }
        }
        self.tick += 1;
        self.files.insert(h, (f, self.tick));
    }
}

/// Where an object's bytes are: one file per handle under a data directory.
pub struct ObjectStore {
    root: PathBuf,
    cache: Mutex<FdCache>,
    write_behind: Arc<WriteBehindShared>,
    /// One store per directory: two would write the same objects.
    _lock: crate::private::DirLock,
}

impl std::fmt::Debug for ObjectStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStore")
            .field("root", &self.root)
            .field("open_files", &self.open_files())
            .finish()
    }
}

/// splitmix64's finalizer: spreads sequential handles over the 65536 subdirectories.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Objects made at once from which [`ObjectStore::create_many`] syncs the whole file system
/// rather than each new file and directory.
const SYNC_FS_FROM: usize = 8;

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl ObjectStore {
    /// Opens (creating) the data directory `root`, which no other store may have open (in
    /// this process or another): that fails, naming the directory.
    pub fn open(root: impl Into<PathBuf>, cfg: StoreConfig) -> io::Result<Self> {
        let root = root.into();
        crate::private::own_dir(&root)?;
        let lock = crate::private::lock_dir(&root, "lock", "another io server")?;
        // Memory has nothing to write back.
        let in_memory = FileSystem::of(&root).is_ok_and(|fs| fs.in_memory());
        let threshold = if in_memory { 0 } else { cfg.write_behind };
        Ok(ObjectStore {
            root,
            cache: Mutex::new(FdCache {
                files: HashMap::new(),
                live: HashMap::new(),
                tick: 0,
                cap: cfg.max_open,
            }),
            write_behind: Arc::new(WriteBehindShared { threshold, started: AtomicU64::new(0) }),
            _lock: lock,
        })
    }

    /// Bytes whose writeback the store started before any fsync asked for it
    /// ([`StoreConfig::write_behind`]).
    pub fn written_behind(&self) -> u64 {
        self.write_behind.started.load(Ordering::Relaxed)
    }

    /// The data directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Local path of `h`'s object.
    pub fn path_of(&self, h: Handle) -> PathBuf {
        Self::object_path(&self.root, h)
    }

    /// Where a store whose data directory is `root` keeps `h`'s object: for a tool that looks
    /// into a data directory without opening it (which a running server holds).
    pub fn object_path(root: &Path, h: Handle) -> PathBuf {
        let m = mix(h.0);
        root.join(format!("{:02x}", m >> 56))
            .join(format!("{:02x}", (m >> 48) & 0xff))
            .join(format!("{:016x}", h.0))
    }

    fn cache(&self) -> MutexGuard<'_, FdCache> {
        // A panic while holding the lock cannot leave the map inconsistent (single inserts and
        // removes), so a poisoned lock is still usable.
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Files currently held open.
    pub fn open_files(&self) -> usize {
        self.cache().files.len()
    }

    /// `h`'s open object.
    pub fn object(&self, h: Handle) -> Result<Arc<Object>, StoreError> {
        if let Some(f) = self.cache().get(h) {
            return Ok(f);
        }
        let f = match OpenOptions::new().read(true).write(true).open(self.path_of(h)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(StoreError::NotFound(h)),
            Err(source) => return Err(StoreError::Io { op: "open", handle: h, error: source }),
        };
        let mut c = self.cache();
        // Another thread may have opened it meanwhile: share theirs.
        if let Some(o) = c.get(h) {
            return Ok(o);
        }
        // Opened just before a removal unlinked it: cached, the removed file would be read and
        // keep its space until the cache let it go. A removal clears the cache after it unlinks,
        // so one found unlinked by now is gone for good.
        let linked =
            f.metadata().map_err(|source| StoreError::Io { op: "stat", handle: h, error: source })?;
        if std::os::unix::fs::MetadataExt::nlink(&linked) == 0 {
            return Err(StoreError::NotFound(h));
        }
        let o = Arc::new(Object::new(h, f, self.write_behind.clone())?);
        c.insert(h, o.clone());
        Ok(o)
    }

    /// Creates `h`'s object (empty) and makes it durable: the file, its directory entry and any
    /// new subdirectories are fsynced. Idempotent, so the meta server can retry; returns whether
    /// the object is new. It is then open, for the writes that follow a create.
    pub fn create(&self, h: Handle) -> Result<bool, StoreError> {
        let created = self.create_many(&[h])? == 1;
        self.object(h)?;
        Ok(created)
    }

    /// Creates the objects of `hs` (empty; those that exist are left as they are) and makes
    /// them durable together: a batch by one sync of the file system, a few by syncing the new
    /// files, then the directories whose entries changed, each once. Returns how many were new.
    /// Not kept open: they are for files not yet created, which would only push open objects
    /// out of the cache.
    pub fn create_many(&self, hs: &[Handle]) -> Result<usize, StoreError> {
        let mut new_files = Vec::new();
        let mut dirs = std::collections::BTreeSet::new();
        for &h in hs {
            let io = |op| move |source| StoreError::Io { op, handle: h, error: source };
            let path = self.path_of(h);
            let leaf = path.parent().unwrap_or(&self.root).to_path_buf();
            let mid = leaf.parent().unwrap_or(&self.root).to_path_buf();
            let new_mid = !mid.exists();
            let new_leaf = !leaf.exists();
            crate::private::create_dir_all(&leaf).map_err(io("mkdir"))?;
            match crate::private::options().write(true).create_new(true).open(&path) {
                Ok(f) => new_files.push((h, f)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io("create")(e)),
            }
            if new_mid {
                dirs.insert(self.root.clone());
            }
            if new_leaf {
                dirs.insert(mid);
            }
            dirs.insert(leaf);
        }
        let first = hs.first().copied().unwrap_or(Handle(0));
        if new_files.len() >= SYNC_FS_FROM {
            // One `syncfs` commits the file system's journal and flushes the disk's cache once
            // for the whole batch, where an fsync of each new file and directory flushes it
            // each time (ext4 does even when the journal has nothing left to commit): about
            // three flushes an object, what a burst of creates waited for on a disk. It also
            // writes back whatever else is dirty there, so a few objects, which a create may
            // be waiting for, are synced one by one.
            let root = File::open(&self.root).map_err(|source| StoreError::Io {
                op: "open data directory",
                handle: first,
                error: source,
            })?;
            nix::unistd::syncfs(&root).map_err(|e| StoreError::Io {
                op: "syncfs",
                handle: first,
                error: e.into(),
            })?;
        } else {
            for (h, f) in &new_files {
                f.sync_all().map_err(|source| StoreError::Io { op: "fsync", handle: *h, error: source })?;
            }
            for d in &dirs {
                fsync_dir(d).map_err(|source| StoreError::Io {
                    op: "fsync dir",
                    handle: first,
                    error: source,
                })?;
            }
        }
        debug!(objects = new_files.len(), "objects created");
        Ok(new_files.len())
    }

    /// True if `h` has an object.
    pub fn exists(&self, h: Handle) -> bool {
        self.path_of(h).exists()
    }

    /// Removes `h`'s object (durably). `NotFound` if there is none, which a retrying meta
    /// server treats as done.
    pub fn remove(&self, h: Handle) -> Result<(), StoreError> {
        let held = self.cache().get(h);
        // Wait out running transfers; later ones find no file.
        let _x = held.as_ref().map(|o| o.exclusive());
        let path = self.path_of(h);
        let removed = std::fs::remove_file(&path);
        // Forgotten only once unlinked: a request that opened the file before may have cached
        // it meanwhile, and one caching it from now on finds it unlinked (see `object`).
        {
            let mut c = self.cache();
            c.files.remove(&h);
            c.live.remove(&h);
        }
        match removed {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(StoreError::NotFound(h)),
            Err(source) => return Err(StoreError::Io { op: "remove", handle: h, error: source }),
        }
        if let Some(dir) = path.parent() {
            fsync_dir(dir).map_err(|source| StoreError::Io { op: "fsync dir", handle: h, error: source })?;
        }
        debug!(handle = %h, "object removed");
        Ok(())
    }

    /// Sets the local size (down drops data, up adds a hole).
    pub fn truncate(&self, h: Handle, size: u64) -> Result<(), StoreError> {
        if size > MAX_OBJECT_SIZE {
            return Err(StoreError::TooLarge);
        }
        self.object(h)?.set_len(size)
    }

    /// `posix_fallocate` of the local bytes `[off, off + len)`: reserves their disk space and
    /// makes the object at least `off + len` long (never shorter).
    pub fn allocate(&self, h: Handle, off: u64, len: u64) -> Result<(), StoreError> {
        let end = off.checked_add(len).filter(|&e| e <= MAX_OBJECT_SIZE).ok_or(StoreError::TooLarge)?;
        let o = self.object(h)?;
        o.allocate(off, len)?;
        o.grow(end)
    }

    /// The local size.
    pub fn size(&self, h: Handle) -> Result<u64, StoreError> {
        self.object(h)?.size()
    }

    /// The local size and the disk space the object holds.
    pub fn space(&self, h: Handle) -> Result<ObjectSize, StoreError> {
        self.object(h)?.space()
    }

    /// Frees the disk space of the local bytes `[off, off + len)` (see [`Object::punch`]).
    pub fn punch(&self, h: Handle, off: u64, len: u64) -> Result<(), StoreError> {
        self.object(h)?.punch(off, len)
    }

    /// The first local byte at or after `off` holding data (`None`: none), or with `hole` the
    /// first in a hole, and the local size (see [`Object::seek`]).
    pub fn seek(&self, h: Handle, off: u64, hole: bool) -> Result<(Option<u64>, u64), StoreError> {
        self.object(h)?.seek(off, hole)
    }

    /// The local size and space, as [`ObjectStore::space`] gives them, without opening an
    /// object that is not open: a listing's many sizes would otherwise push the open files out
    /// of the cache (and each open costs more than looking at the file).
    pub fn peek_space(&self, h: Handle) -> Result<ObjectSize, StoreError> {
        use std::os::unix::fs::MetadataExt;
        // Held while looking: an object opened meanwhile is not written to before it is in
        // the cache, so the file's length is all its landed bytes.
        let mut c = self.cache();
        if let Some(o) = c.get(h) {
            drop(c);
            return o.space();
        }
        match std::fs::metadata(self.path_of(h)) {
            Ok(m) => Ok(ObjectSize { size: m.len(), allocated: m.blocks().saturating_mul(512) }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(StoreError::NotFound(h)),
            Err(error) => Err(StoreError::Io { op: "stat", handle: h, error }),
        }
    }

    /// fsync: data and metadata of `h` reach the disk.
    pub fn sync(&self, h: Handle) -> Result<(), StoreError> {
        self.object(h)?.file.sync_all().map_err(|source| StoreError::Io {
            op: "fsync",
            handle: h,
            error: source,
        })
    }

    /// Fills `buf` with the next `buf.len()` bytes of the stream (fewer only if the cursor runs
    /// out). Holes and bytes past the local end read as zeros. Returns the bytes filled.
    pub fn read_stream<I: Iterator<Item = Piece>>(
        &self,
        h: Handle,
        cursor: &mut PieceCursor<I>,
        buf: &mut [u8],
    ) -> Result<usize, StoreError> {
        let o = self.object(h)?;
        let f = &o.file;
        let mut at = 0usize;
        while let Some(p) = cursor.next_piece((buf.len() - at) as u64) {
            // p.len <= buf.len() - at, so it fits in usize.
            let dst = &mut buf[at..at + p.len as usize];
            read_full_at(f, dst, p.off).map_err(|source| StoreError::Io {
                op: "read",
                handle: h,
                error: source,
            })?;
            at += dst.len();
        }
        Ok(at)
    }

    /// Writes `data` to the next `data.len()` bytes of the stream (fewer only if the cursor runs
    /// out). Returns the bytes written. On a disk error (e.g. `ENOSPC`) the caller must still
    /// consume the rest of the client's stream before replying, to stay in sync. Runs with the
    /// object's gate held exclusively, since it writes the file behind any mapping's back.
    pub fn write_stream<I: Iterator<Item = Piece>>(
        &self,
        h: Handle,
        cursor: &mut PieceCursor<I>,
        data: &[u8],
    ) -> Result<usize, StoreError> {
        let o = self.object(h)?;
        let _x = o.exclusive();
        let f = &o.file;
        let mut at = 0usize;
        while let Some(p) = cursor.next_piece((data.len() - at) as u64) {
            if p.end().is_none_or(|e| e > MAX_OBJECT_SIZE) {
                return Err(StoreError::TooLarge);
            }
            let src = &data[at..at + p.len as usize];
            let end = p.off + p.len;
            if let Err(source) = f.write_all_at(src, p.off) {
                warn!(handle = %h, off = p.off, len = p.len, error = %source, "write failed");
                // Part of the piece may have landed (and lengthened the file).
                if let Ok(m) = f.metadata() {
                    lock(&o.ledger).written(m.len().min(end));
                }
                return Err(StoreError::Io { op: "write", handle: h, error: source });
            }
            lock(&o.ledger).written(end);
            o.wrote(p.off, end);
            at += src.len();
        }
        Ok(at)
    }

    /// Reads all of `pieces` into `buf` (which must be exactly their total size).
    pub fn read(&self, h: Handle, pieces: &[Piece], buf: &mut [u8]) -> Result<usize, StoreError> {
        self.read_stream(h, &mut PieceCursor::new(pieces.iter().copied()), buf)
    }

    /// Writes `data` to `pieces` (whose total must be `data.len()`).
    pub fn write(&self, h: Handle, pieces: &[Piece], data: &[u8]) -> Result<usize, StoreError> {
        self.write_stream(h, &mut PieceCursor::new(pieces.iter().copied()), data)
    }
}

/// Starts writing back the dirty pages of `[off, off + len)` of `file` without waiting for
/// them; false if the kernel refused.
fn start_writeback(file: &File, off: u64, len: u64) -> bool {
    let (Ok(off), Ok(len)) = (i64::try_from(off), i64::try_from(len)) else { return false };
    // SAFETY: sync_file_range takes a descriptor and integers only and touches no memory of
    // ours; the descriptor is open for the call (borrowed from `file`).
    #[allow(unsafe_code)] // No safe binding of sync_file_range in nix or rustix.
    let r = unsafe { libc::sync_file_range(file.as_raw_fd(), off, len, libc::SYNC_FILE_RANGE_WRITE) };
    if r != 0 {
        // Only a head start: the client's fsync writes the data anyway and reports real errors.
        debug!(error = %io::Error::last_os_error(), "starting writeback failed");
    }
    r == 0
}

/// `pread` until `dst` is full; past EOF the rest is zeros.
fn read_full_at(f: &File, dst: &mut [u8], off: u64) -> io::Result<()> {
    let mut done = 0usize;
    while done < dst.len() {
        let Some(pos) = off.checked_add(done as u64).filter(|&p| p <= MAX_OBJECT_SIZE) else { break };
        match f.read_at(&mut dst[done..], pos) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    dst[done..].fill(0);
    Ok(())
}

#[cfg(test)]
mod tests;
