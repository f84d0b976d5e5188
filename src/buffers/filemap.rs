//! Files mapped into memory, so a storage server's transfers move bytes straight between the
//! network and the file's page-cache pages.
//!
//! A server that pulls a client's data into a buffer and then `pwrite`s it copies every byte
//! twice; one that `pread`s and then pushes does the same on reads. A [`FileMap`] maps the
//! object file once and hands out regions of it as transfer buffers: [`FileRegionMut`] is a
//! receive target ([`crate::RecvBuf::Mapped`]) and [`FileRegion`] a send source (as `Bytes`,
//! through [`FileRegion::into_bytes`]), so the transport's own copy (the socket's, or the
//! InfiniBand provider's) is the only one.
//!
//! Regions are leased: a writable lease excludes every other lease over the same bytes, and
//! readable leases exclude writable ones, so no two live Rust references alias mapped bytes.
//! One lease covers the span of a whole scatter or gather list, so a transfer unit of many
//! pieces costs one check.
//! A conflicting request fails with [`FileMapError::Busy`] instead of waiting, because the
//! caller may itself hold the lease it would wait for (two units of one transfer).
//! A caller that keeps being refused takes a [`Turn`] ([`FileMap::take_turn`]): while it waits,
//! no newer lease that conflicts with its span is granted, so a writer is not starved by a
//! stream of overlapping readers (nor a reader by writers). Turns are served oldest first.
//!
//! A mapping of a shared-memory file (tmpfs) is memory the crate owns: the InfiniBand engine
//! keeps registrations of it cached across operations, as it does its pool, instead of pinning
//! file pages for every transfer (which costs more than copying them). Every such mapping is
//! listed process-wide, and a dropped [`FileMap`] has every registration cache that asked to be
//! told invalidate its range before the range is unmapped, so no stale registration can outlive
//! the pages. Mappings of disk files are not offered for registration: their pages are
//! write-protected for dirty tracking, so writes through a registered (pre-populated, pinned)
//! mapping take extra faults and the file system's `page_mkwrite` — `stripefs demo`, whose data
//! lives on a disk-backed temporary directory, wrote at half the bandwidth over `softib://` when
//! they were registered — and kernels refuse devices long-term pins of them anyway; the engine
//! stages those through its zone buffers (one copy).

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Weak};

use bytes::Bytes;
use memmap2::{MmapOptions, MmapRaw};

use crate::sync::Mutex;

/// Why a region could not be handed out.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileMapError {
    /// The range is not inside the mapping.
    #[error("range {offset}+{len} is outside the {mapped}-byte mapping")]
    OutOfRange {
        /// Start of the range.
        offset: u64,
        /// Its length.
        len: u64,
        /// Bytes mapped.
        mapped: u64,
    },
    /// The pieces of a writable list are not in increasing, disjoint order.
    #[error("piece at {offset} overlaps or precedes the one before it")]
    Unordered {
        /// Start of the offending piece.
        offset: u64,
    },
    /// Another live region overlaps the range in a conflicting way.
    #[error("range {offset}+{len} overlaps a region in use")]
    Busy {
        /// Start of the range.
        offset: u64,
        /// Its length.
        len: u64,
    },
}

#[derive(Debug, Clone, Copy)]
struct Lease {
    id: u64,
    start: u64,
    end: u64,
    write: bool,
}

impl Lease {
    /// Whether `self` and a lease of `[start, end)` (`write`) may not coexist.
    fn conflicts(&self, start: u64, end: u64, write: bool) -> bool {
        self.start < self.end && start < end && self.start < end && start < self.end && (write || self.write)
    }
}

#[derive(Debug, Default)]
struct Leases {
    /// Ids of leases and turns, from one counter: a smaller id is an older request.
    next: u64,
    live: Vec<Lease>,
    /// Turns waiting (see [`Turn`]).
    waiting: Vec<Lease>,
}

/// Told `(addr, len)` of every mapping about to be unmapped.
pub(crate) type UnmapHook = Arc<dyn Fn(usize, usize) + Send + Sync>;

/// Live mappings, start → end. Plain `std` locks: process-wide, never held across a call out.
static LIVE: std::sync::RwLock<BTreeMap<usize, usize>> = std::sync::RwLock::new(BTreeMap::new());
/// Registration caches to tell about unmaps (weak: a dropped engine stops listening).
#[allow(clippy::type_complexity)]
static HOOKS: std::sync::Mutex<Vec<Weak<dyn Fn(usize, usize) + Send + Sync>>> =
    std::sync::Mutex::new(Vec::new());

/// Calls `hook` before any [`FileMap`] is unmapped, for as long as `hook` is alive.
#[cfg(target_os = "linux")]
pub(crate) fn watch_unmaps(hook: &UnmapHook) {
    let mut h = HOOKS.lock().unwrap_or_else(|p| p.into_inner());
    h.retain(|w| w.strong_count() > 0);
    h.push(Arc::downgrade(hook));
}

/// Whether `file` lives on tmpfs (shared memory): no writeback, so no dirty-tracking faults on
/// pinned pages, and devices may pin it long-term.
fn on_shared_memory(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `statfs` is plain data, fully written by a successful call; the descriptor is
        // open for the duration of the call (borrowed from `file`).
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `st` is a valid, writable statfs.
        let ok = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } == 0;
        ok && st.f_type == libc::TMPFS_MAGIC
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file.as_raw_fd();
        false
    }
}

/// Whether `[addr, addr + len)` lies inside one live mapping of a shared-memory file.
#[cfg(any(target_os = "linux", test))]
pub(crate) fn is_mapped(addr: usize, len: usize) -> bool {
    let Some(end) = addr.checked_add(len) else { return false };
    let live = LIVE.read().unwrap_or_else(|p| p.into_inner());
    live.range(..=addr).next_back().is_some_and(|(_, &e)| end <= e)
}

/// A file mapped shared and read-write; see the [module documentation](self).
pub struct FileMap {
    raw: MmapRaw,
    len: u64,
    /// A shared-memory file: registrations of it may be cached (see the module docs).
    registrable: bool,
    leases: Mutex<Leases>,
}

impl fmt::Debug for FileMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileMap").field("addr", &self.addr()).field("len", &self.len).finish()
    }
}

impl FileMap {
    /// Maps the first `len` bytes of `file` (opened read-write), shared, so stores through the
    /// mapping are stores to the file. `len` may exceed the file's current size; the mapping
    /// reserves address space only.
    ///
    /// # Safety
    /// While any region of the map is alive, the caller guarantees that
    /// * the file is not shrunk below the region's end (a touched page past the end of the file
    ///   raises `SIGBUS`), and every written region lies in space the file system has already
    ///   allocated (`fallocate`), so a full disk is an error at allocation, not a `SIGBUS`;
    /// * the region's bytes are not written by any other means (`write(2)`, another mapping,
    ///   another process), since Rust references to them are live.
    pub unsafe fn new(file: &File, len: u64) -> std::io::Result<Arc<FileMap>> {
        let n = usize::try_from(len).map_err(|_| std::io::Error::from_raw_os_error(libc::EFBIG))?;
        if n == 0 {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        // `map_raw` hands back raw pointers only; the references the regions create later are
        // covered by this function's contract.
        let raw = MmapOptions::new().len(n).map_raw(file)?;
        let registrable = on_shared_memory(file);
        let map = FileMap { raw, len, registrable, leases: Mutex::new(Leases::default()) };
        if registrable {
            LIVE.write().unwrap_or_else(|p| p.into_inner()).insert(map.addr(), map.addr() + n);
        }
        Ok(Arc::new(map))
    }

    /// Bytes mapped.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never true: a map has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address of the mapping's first byte (for registration-cache invalidation).
    pub fn addr(&self) -> usize {
        self.raw.as_ptr() as usize
    }

    /// Leases alive now (a set of regions from one call counts once).
    pub fn leases_out(&self) -> usize {
        self.leases.lock().unwrap_or_else(|p| p.into_inner()).live.len()
    }

    /// Turns waiting now.
    pub fn turns_waiting(&self) -> usize {
        self.leases.lock().unwrap_or_else(|p| p.into_inner()).waiting.len()
    }

    /// Queues for the span of `pieces` (writable or readable): until the turn is dropped, a
    /// lease that conflicts with that span is refused to anyone who asks without a turn or with
    /// a newer one. Take it after a [`FileMapError::Busy`] and ask again with it
    /// ([`FileMap::regions_mut_in`], [`FileMap::regions_in`]) until the regions are granted.
    ///
    /// Take a turn only while holding no region of this map that conflicts with the span: the
    /// turn would hold back the lease you wait for in order to release yours.
    pub fn take_turn(self: &Arc<Self>, pieces: &[(u64, usize)], write: bool) -> Turn {
        let (start, end) = span(pieces);
        let mut l = self.leases.lock().unwrap_or_else(|p| p.into_inner());
        l.next += 1;
        let id = l.next;
        l.waiting.push(Lease { id, start, end, write });
        Turn { map: self.clone(), id }
    }

    /// `[offset, offset + len)` for writing: fails if any other region overlaps it.
    pub fn region_mut(self: &Arc<Self>, offset: u64, len: usize) -> Result<FileRegionMut, FileMapError> {
        let mut v = self.regions_mut([(offset, len)])?;
        Ok(v.pop().expect("one piece, one region"))
    }

    /// `[offset, offset + len)` for reading: fails if a writable region overlaps it.
    pub fn region(self: &Arc<Self>, offset: u64, len: usize) -> Result<FileRegion, FileMapError> {
        let mut v = self.regions([(offset, len)])?;
        Ok(v.pop().expect("one piece, one region"))
    }

    /// Writable regions for a scatter list of `(offset, len)` pieces in increasing, disjoint
    /// order, under one lease over their span (one check, however many pieces).
    pub fn regions_mut(
        self: &Arc<Self>,
        pieces: impl IntoIterator<Item = (u64, usize)>,
    ) -> Result<Vec<FileRegionMut>, FileMapError> {
        self.regions_mut_in(pieces, None)
    }

    /// [`FileMap::regions_mut`] for the holder of `turn` (see [`FileMap::take_turn`]), served
    /// before every lease asked for without a turn or with a newer one. A turn taken on another
    /// map counts as none.
    pub fn regions_mut_in(
        self: &Arc<Self>,
        pieces: impl IntoIterator<Item = (u64, usize)>,
        turn: Option<&Turn>,
    ) -> Result<Vec<FileRegionMut>, FileMapError> {
        let pieces: Vec<(u64, usize)> = pieces.into_iter().collect();
        let mut prev_end = 0u64;
        for (i, &(off, len)) in pieces.iter().enumerate() {
            self.check(off, len)?;
            if i > 0 && off < prev_end {
                return Err(FileMapError::Unordered { offset: off });
            }
            prev_end = off + len as u64;
        }
        let lease = self.lease(&pieces, true, turn)?;
        Ok(pieces.into_iter().map(|(off, len)| FileRegionMut { lease: lease.clone(), off, len }).collect())
    }

    /// Readable regions for a gather list of `(offset, len)` pieces (any order, overlaps
    /// allowed), under one lease over their span.
    pub fn regions(
        self: &Arc<Self>,
        pieces: impl IntoIterator<Item = (u64, usize)>,
    ) -> Result<Vec<FileRegion>, FileMapError> {
        self.regions_in(pieces, None)
    }

    /// [`FileMap::regions`] for the holder of `turn`, as [`FileMap::regions_mut_in`].
    pub fn regions_in(
        self: &Arc<Self>,
        pieces: impl IntoIterator<Item = (u64, usize)>,
        turn: Option<&Turn>,
    ) -> Result<Vec<FileRegion>, FileMapError> {
        let pieces: Vec<(u64, usize)> = pieces.into_iter().collect();
        for &(off, len) in &pieces {
            self.check(off, len)?;
        }
        let lease = self.lease(&pieces, false, turn)?;
        Ok(pieces.into_iter().map(|(off, len)| FileRegion { lease: lease.clone(), off, len }).collect())
    }

    fn check(&self, offset: u64, len: usize) -> Result<(), FileMapError> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(FileMapError::OutOfRange { offset, len: len as u64, mapped: self.len }),
        }
    }

    /// One lease over the span of `pieces` (all inside the map), for the holder of turn `turn`
    /// (or of none): refused if it conflicts with a live lease or with an older waiting turn.
    fn lease(
        self: &Arc<Self>,
        pieces: &[(u64, usize)],
        write: bool,
        turn: Option<&Turn>,
    ) -> Result<Arc<LeaseGuard>, FileMapError> {
        let turn = turn.filter(|t| Arc::ptr_eq(&t.map, self)).map(|t| t.id);
        let (start, end) = span(pieces);
        let mut l = self.leases.lock().unwrap_or_else(|p| p.into_inner());
        let older = |w: &Lease| turn.is_none_or(|t| w.id < t);
        let clash = l.live.iter().any(|o| o.conflicts(start, end, write))
            || l.waiting.iter().any(|w| older(w) && w.conflicts(start, end, write));
        if clash {
            return Err(FileMapError::Busy { offset: start, len: end - start });
        }
        l.next += 1;
        let id = l.next;
        l.live.push(Lease { id, start, end, write });
        Ok(Arc::new(LeaseGuard { map: self.clone(), id }))
    }

    fn end_turn(&self, id: u64) {
        let mut l = self.leases.lock().unwrap_or_else(|p| p.into_inner());
        l.waiting.retain(|w| w.id != id);
    }

    fn release(&self, id: u64) {
        let mut l = self.leases.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = l.live.iter().position(|o| o.id == id) {
            l.live.swap_remove(i);
        }
    }

    fn ptr(&self, off: u64) -> *mut u8 {
        // SAFETY: callers pass offsets of regions, which `check` kept inside the mapping.
        unsafe { self.raw.as_mut_ptr().add(off as usize) }
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        if !self.registrable {
            return;
        }
        // No region is alive (each holds the map), so no operation is using a registration of
        // these pages: every cache can drop its entries before `raw` unmaps them.
        let (addr, len) = (self.addr(), self.len as usize);
        LIVE.write().unwrap_or_else(|p| p.into_inner()).remove(&addr);
        let hooks: Vec<UnmapHook> =
            HOOKS.lock().unwrap_or_else(|p| p.into_inner()).iter().filter_map(Weak::upgrade).collect();
        for h in hooks {
            h(addr, len);
        }
    }
}

/// The span of the non-empty pieces (`(0, 0)`, which overlaps nothing, when there are none).
fn span(pieces: &[(u64, usize)]) -> (u64, u64) {
    let (start, end) = pieces
        .iter()
        .filter(|p| p.1 > 0)
        .fold((u64::MAX, 0), |(lo, hi), &(o, n)| (lo.min(o), hi.max(o + n as u64)));
    if start < end { (start, end) } else { (0, 0) }
}

/// A place in the queue for a span of a [`FileMap`] ([`FileMap::take_turn`]); dropping it
/// leaves the queue.
pub struct Turn {
    map: Arc<FileMap>,
    id: u64,
}

impl fmt::Debug for Turn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Turn").field("id", &self.id).finish()
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.map.end_turn(self.id);
    }
}

/// A live lease; the last region holding it ends it.
struct LeaseGuard {
    map: Arc<FileMap>,
    id: u64,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.map.release(self.id);
    }
}

/// A writable region of a [`FileMap`], usable as a receive buffer. The lease it shares with the
/// other regions of its call ends when the last of them is dropped.
pub struct FileRegionMut {
    lease: Arc<LeaseGuard>,
    off: u64,
    len: usize,
}

impl FileRegionMut {
    /// Offset of the region in the file.
    pub fn offset(&self) -> u64 {
        self.off
    }

    /// The map the region belongs to.
    pub fn map(&self) -> &Arc<FileMap> {
        &self.lease.map
    }
}

impl Deref for FileRegionMut {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the range is inside the mapping (checked when the lease was granted), which
        // lives as long as the lease's `Arc<FileMap>`. The region's writable lease excludes every
        // other lease over its span, and the pieces of one lease are disjoint, so the only
        // references to these bytes come from this region, borrowed through `&self`/`&mut self`.
        // Writers outside the map are excluded by `FileMap::new`'s contract.
        unsafe { std::slice::from_raw_parts(self.lease.map.ptr(self.off), self.len) }
    }
}

impl DerefMut for FileRegionMut {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes the reference unique.
        unsafe { std::slice::from_raw_parts_mut(self.lease.map.ptr(self.off), self.len) }
    }
}

impl fmt::Debug for FileRegionMut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileRegionMut").field("offset", &self.off).field("len", &self.len).finish()
    }
}

/// A readable region of a [`FileMap`]; its lease ends when the last region of its call drops.
pub struct FileRegion {
    lease: Arc<LeaseGuard>,
    off: u64,
    len: usize,
}

impl FileRegion {
    /// Offset of the region in the file.
    pub fn offset(&self) -> u64 {
        self.off
    }

    /// The region as `Bytes` without copying (a send buffer); the lease ends when the last
    /// clone is dropped.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl Deref for FileRegion {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: inside the mapping, which the lease keeps alive; a readable lease excludes
        // writable ones over its span, so no `&mut` aliases these bytes.
        unsafe { std::slice::from_raw_parts(self.lease.map.ptr(self.off), self.len) }
    }
}

impl AsRef<[u8]> for FileRegion {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for FileRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileRegion").field("offset", &self.off).field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom, Write};

    /// An unlinked temporary file of `len` bytes.
    fn file(len: u64) -> File {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("ionet-filemap-{}-{n}", std::process::id()));
        let mut f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        f.set_len(len).unwrap();
        f.seek(SeekFrom::Start(0)).unwrap();
        f.flush().unwrap();
        f
    }

    /// An unlinked scratch file of `len` bytes in `dir`.
    fn file_in(dir: &std::path::Path, len: u64) -> File {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!(".ionet-filemap-kind-{}-{n}", std::process::id()));
        let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        f.set_len(len).unwrap();
        f
    }

    #[test]
    fn only_shared_memory_mappings_are_offered_for_registration() {
        let shm = std::path::Path::new("/dev/shm");
        if shm.is_dir() && on_shared_memory(&file_in(shm, 4096)) {
            // SAFETY: a private scratch file, never shrunk or written while mapped.
            let m = unsafe { FileMap::new(&file_in(shm, 8192), 8192) }.unwrap();
            assert!(is_mapped(m.addr(), 8192), "a tmpfs mapping is listed");
            assert!(!is_mapped(m.addr(), 8193), "only its own bytes");
        } else {
            println!("skipped the tmpfs half: /dev/shm is not tmpfs here");
        }
        let disk = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        if on_shared_memory(&file_in(disk, 4096)) {
            println!("skipped the disk half: the source tree is on tmpfs here");
            return;
        }
        // SAFETY: as above.
        let m = unsafe { FileMap::new(&file_in(disk, 8192), 8192) }.unwrap();
        assert!(!is_mapped(m.addr(), 1), "a disk-file mapping is staged, never registered");
    }

    #[test]
    fn writes_through_a_region_land_in_the_file() {
        let mut f = file(8192);
        // SAFETY: a private temporary file, sized before mapping and never written otherwise.
        let m = unsafe { FileMap::new(&f, 1 << 20) }.unwrap();
        let mut r = m.region_mut(4096, 100).unwrap();
        r.copy_from_slice(&[7u8; 100]);
        drop(r);
        let mut back = vec![0u8; 8192];
        f.seek(SeekFrom::Start(0)).unwrap();
        f.read_exact(&mut back).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 0));
        assert!(back[4096..4196].iter().all(|&b| b == 7));
        assert_eq!(m.leases_out(), 0);
    }

    #[test]
    fn regions_never_alias_a_writable_one() {
        let f = file(1 << 16);
        // SAFETY: as above.
        let m = unsafe { FileMap::new(&f, 1 << 16) }.unwrap();
        let w = m.region_mut(1000, 1000).unwrap();
        assert_eq!(m.region_mut(1999, 10).unwrap_err(), FileMapError::Busy { offset: 1999, len: 10 });
        assert!(matches!(m.region(0, 1001), Err(FileMapError::Busy { .. })));
        // Adjacent ranges are free, and so are empty ones.
        let a = m.region_mut(2000, 10).unwrap();
        let b = m.region(0, 1000).unwrap();
        let _e = m.region_mut(1500, 0).unwrap();
        drop(w);
        // Readers share; a writer is refused while any reader overlaps.
        let c = m.region(500, 1000).unwrap();
        assert!(matches!(m.region_mut(900, 1), Err(FileMapError::Busy { .. })));
        drop((a, b, c));
        assert_eq!(m.leases_out(), 1);
        assert!(m.region_mut(0, 1 << 16).is_ok(), "an empty lease blocks nothing");
    }

    #[test]
    fn ranges_outside_the_mapping_are_refused() {
        let f = file(4096);
        // SAFETY: as above.
        let m = unsafe { FileMap::new(&f, 4096) }.unwrap();
        assert!(matches!(m.region(4000, 97), Err(FileMapError::OutOfRange { .. })));
        assert!(matches!(m.region_mut(u64::MAX, 2), Err(FileMapError::OutOfRange { .. })));
        assert_eq!(m.region(4000, 96).unwrap().len(), 96);
    }

    /// A map of 4 KiB over a scratch file.
    fn small_map() -> Arc<FileMap> {
        let f = file(4096);
        // SAFETY: the file is private to this test, is not shrunk, and is only touched through
        // the map.
        unsafe { FileMap::new(&f, 4096) }.unwrap()
    }

    /// A writer refused by a reader's lease takes a turn; a newer reader overlapping its span
    /// is then refused even though no live lease conflicts with that reader, so a stream of
    /// readers cannot starve the writer. The writer gets in once the old reader is gone.
    #[test]
    fn a_waiting_turn_is_not_overtaken_by_newer_conflicting_leases() {
        let m = small_map();
        let old_reader = m.region(0, 100).unwrap();
        assert!(matches!(m.region_mut(0, 100), Err(FileMapError::Busy { .. })));
        let turn = m.take_turn(&[(0, 100)], true);
        assert!(
            matches!(m.region(50, 10), Err(FileMapError::Busy { .. })),
            "a new reader must wait behind the writer's turn"
        );
        assert!(m.region(200, 10).is_ok(), "a turn holds back only its own span");
        assert!(
            matches!(m.regions_mut_in([(0, 100)], Some(&turn)), Err(FileMapError::Busy { .. })),
            "the old reader is live"
        );
        drop(old_reader);
        let w = m.regions_mut_in([(0, 100)], Some(&turn)).unwrap();
        drop(turn);
        assert_eq!(m.turns_waiting(), 0);
        assert!(matches!(m.region(50, 10), Err(FileMapError::Busy { .. })), "the writer's lease is live");
        drop(w);
        assert!(m.region(50, 10).is_ok());
    }

    /// Turns are served oldest first, and a turn that leaves frees its span at once.
    #[test]
    fn turns_are_served_oldest_first() {
        let m = small_map();
        let first = m.take_turn(&[(0, 100)], true);
        let second = m.take_turn(&[(50, 100)], false);
        assert!(
            matches!(m.regions_in([(50, 100)], Some(&second)), Err(FileMapError::Busy { .. })),
            "behind the first"
        );
        let w = m.regions_mut_in([(0, 100)], Some(&first)).unwrap();
        drop((w, first));
        assert!(m.regions_in([(50, 100)], Some(&second)).is_ok());
        // Readers queue behind a reader's turn without waiting: reads do not conflict.
        let reader_turn = m.take_turn(&[(0, 4096)], false);
        assert!(m.region(0, 4096).is_ok());
        assert!(matches!(m.region_mut(0, 1), Err(FileMapError::Busy { .. })), "a writer does wait");
        drop(reader_turn);
        drop(second);
        assert!(m.region_mut(0, 1).is_ok());
        assert_eq!((m.turns_waiting(), m.leases_out()), (0, 0));
    }

    #[test]
    fn a_read_region_as_bytes_holds_its_lease_until_the_last_clone_drops() {
        let mut f = file(0);
        f.write_all(b"hello mapped world").unwrap();
        // SAFETY: as above; the file is written before it is mapped.
        let m = unsafe { FileMap::new(&f, 4096) }.unwrap();
        let b = m.region(6, 6).unwrap().into_bytes();
        let b2 = b.clone();
        assert_eq!(&b[..], b"mapped");
        drop(b);
        assert!(m.region_mut(6, 1).is_err());
        drop(b2);
        assert!(m.region_mut(6, 1).is_ok());
    }

    #[test]
    fn a_list_shares_one_lease_over_its_span() {
        let f = file(1 << 16);
        // SAFETY: as above.
        let m = unsafe { FileMap::new(&f, 1 << 16) }.unwrap();
        assert_eq!(
            m.regions_mut([(100, 10), (105, 10)]).unwrap_err(),
            FileMapError::Unordered { offset: 105 }
        );
        let mut v = m.regions_mut([(0, 10), (4096, 10), (8192, 10)]).unwrap();
        assert_eq!(m.leases_out(), 1);
        v[1].fill(9);
        // The gap between pieces is inside the span, so it is leased too.
        assert!(m.region(5000, 1).is_err());
        assert!(m.region(8202, 1).is_ok());
        let last = v.pop().unwrap();
        drop(v);
        assert!(m.region(5000, 1).is_err(), "one region still holds the lease");
        drop(last);
        assert_eq!(m.leases_out(), 0);
        // Readers may overlap each other, even within one list.
        let r = m.regions([(4096, 10), (4090, 20)]).unwrap();
        assert!(r[0].iter().all(|&b| b == 9));
    }
}
