//! Owned buffers that operations carry, and the pre-registered buffer pool.
//!
//! Every operation takes ownership of its buffer and gives it back in its completion, so no
//! transfer can outlive the memory it reads or writes (the classic use-after-free of C
//! transports). [`RegisteredBuf`] is memory from the endpoint's pool (BMI's `BMI_memalloc`):
//! on InfiniBand it is registered with the device once, when the pool first creates it, and the
//! registration is reused for the buffer's whole life; the crate owns the memory, so that cached
//! registration can never go stale.
//!
//! Buffers of 64 KiB and more are carved from 2 MiB-aligned chunks the kernel may back with
//! transparent huge pages: copies into and out of them take fewer TLB misses, and a device (or
//! the software provider's `process_vm_*`) pins a huge page in one step instead of 512. On a
//! registering transport each chunk is pinned whole once, so registering one buffer inside it
//! pins nothing new and cannot split the huge page.

use std::collections::HashMap;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::buffers::filemap::FileRegionMut;
use crate::error::{Error, Result};
use crate::sync::Mutex;

/// Smallest pool size class.
pub const POOL_MIN_CLASS: usize = 4096;
const PAGE: usize = 4096;

/// Device keys of a registered region (zero on transports without registration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemKeys {
    /// Local key (used in our own scatter/gather entries).
    pub lkey: u32,
    /// Remote key (handed to peers for one-sided access).
    pub rkey: u32,
}

/// Registers pool memory with a device. Installed by backends that need it (InfiniBand).
pub(crate) trait PoolRegistrar: Send + Sync {
    /// Registers `mem` for local and remote access.
    fn register(&self, mem: &mut [u8]) -> Result<MemKeys>;
    /// Drops a registration made by `register`.
    fn deregister(&self, mem: &[u8], keys: MemKeys);
    /// Pins a whole slab chunk (local access only) before its buffers are registered one by
    /// one, so that registering a buffer pins nothing new: a provider that pins with `mlock`
    /// (softib) would otherwise split the chunk's huge page at the buffer's edges. Default:
    /// nothing to do.
    fn pin_chunk(&self, _mem: &mut [u8]) -> Result<()> {
        Ok(())
    }
    /// Releases a [`PoolRegistrar::pin_chunk`] pin; called before the chunk's memory is freed.
    fn unpin_chunk(&self, _addr: usize, _len: usize) {}
}

/// A buffer from an endpoint's registered pool. Dereferences to its first `len()` bytes;
/// returns to the pool when dropped.
pub struct RegisteredBuf {
    mem: Option<PoolMem>,
    len: usize,
    keys: MemKeys,
    home: Option<Arc<PoolInner>>,
}

impl RegisteredBuf {
    /// A buffer that belongs to no pool and is registered nowhere (plain heap memory, pre-faulted).
    /// Useful for tests and for transports without registration.
    pub fn unpooled(len: usize) -> Self {
        RegisteredBuf {
            mem: Some(PoolMem::Heap(prefaulted(len.max(1)))),
            len,
            keys: MemKeys::default(),
            home: None,
        }
    }

    /// Usable length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when `len() == 0`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes available without reallocating.
    pub fn capacity(&self) -> usize {
        self.mem.as_ref().map_or(0, |m| m.len())
    }

    /// Changes the usable length.
    ///
    /// # Errors
    /// [`Error::Misuse`] if `len > capacity()`.
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        if len > self.capacity() {
            return Err(Error::misuse(format!("set_len({len}) beyond capacity {}", self.capacity())));
        }
        self.len = len;
        Ok(())
    }

    /// Address of the first byte (what registrations and memory handles refer to).
    pub fn addr(&self) -> usize {
        self.mem.as_ref().map_or(0, |m| m.as_ptr() as usize)
    }

    /// Device keys of the registration (zero when not registered).
    pub fn keys(&self) -> MemKeys {
        self.keys
    }

    /// True when this buffer carries a device registration.
    pub fn is_registered(&self) -> bool {
        self.home.as_ref().is_some_and(|h| h.registrar.is_some())
    }
}

impl Deref for RegisteredBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.mem {
            Some(m) => &m[..self.len],
            None => &[],
        }
    }
}

impl DerefMut for RegisteredBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.mem {
            Some(m) => &mut m[..self.len],
            None => &mut [],
        }
    }
}

impl fmt::Debug for RegisteredBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredBuf")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl Drop for RegisteredBuf {
    fn drop(&mut self) {
        if let (Some(mem), Some(home)) = (self.mem.take(), self.home.take()) {
            home.give_back(mem, self.keys);
        }
    }
}

/// Alignment of every buffer's first byte. The kernel's copies (`pread`, `recvmsg`,
/// `process_vm_readv`) run several times slower into a destination that is not 32-byte aligned
/// on AMD Zen (measured on the reference VM: 1 MiB `pread` from tmpfs at 2.2 GB/s into a
/// 16-byte aligned buffer, 11–12 GB/s into a 32- or 64-byte aligned one), and malloc returns
/// 16-byte aligned memory. A cache line covers it everywhere.
pub const BUF_ALIGN: usize = 64;

/// Heap memory whose first byte is [`BUF_ALIGN`]-aligned: an allocation with `BUF_ALIGN - 1`
/// bytes of slack and the offset of the first aligned byte (no `unsafe`, no custom allocator).
struct AlignedMem {
    raw: Box<[u8]>,
    start: usize,
    len: usize,
}

impl Deref for AlignedMem {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

impl DerefMut for AlignedMem {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

/// [`BUF_ALIGN`]-aligned heap memory with every page touched, so first-touch faults are paid at
/// allocation, not in the middle of a transfer (they cost ~2.5 s/GiB on the reference VM).
fn prefaulted(len: usize) -> AlignedMem {
    let mut raw = vec![0u8; len + BUF_ALIGN - 1].into_boxed_slice();
    touch_pages(&mut raw);
    let start = (BUF_ALIGN - raw.as_ptr() as usize % BUF_ALIGN) % BUF_ALIGN;
    AlignedMem { raw, start, len }
}

/// Writes one byte per page: calloc'd memory is mapped lazily.
fn touch_pages(mem: &mut [u8]) {
    let mut i = 0;
    while i < mem.len() {
        mem[i] = 0;
        i += PAGE;
    }
    std::hint::black_box(mem);
}

/// `len` zeroed bytes for an application's bulk transfers, every page already faulted in.
///
/// - Under 4 KiB the buffer starts on a [`BUF_ALIGN`] boundary, from 4 KiB on a page boundary:
///   `rep movsb` copies (`recvmsg`, `process_vm_readv`/`writev`) slow down several-fold when
///   the two sides' page offsets differ by a few bytes, and a page-aligned buffer matches the
///   peer's page-aligned buffers and mapped file pages.
/// - From 2 MiB the buffer starts on a 2 MiB boundary and is faulted in as transparent huge
///   pages where the kernel allows them (`madvise` or `always` mode; best effort). A copy
///   through 4 KiB pages misses the TLB every 4 KiB, and under virtualisation each miss walks
///   two page tables: sending an 8 MiB buffer over loopback TCP took a fifth more CPU per byte
///   than the same buffer in huge pages, and on InfiniBand a registration pins a handful of
///   pages instead of thousands.
///
/// Memory that malloc hands out again (as it does once its mmap threshold has grown) was
/// faulted in by its last owner as 4 KiB pages; it is collapsed onto huge pages
/// (`MADV_COLLAPSE`). The huge-page advice is taken back once the pages are in (they stay
/// huge), so it does not outlive the buffer into memory the allocator hands out later, as
/// [`BufPool`]'s chunks do.
/// The allocation is up to 2 MiB larger than `len`; the unused head and tail are never touched.
pub fn bulk_zeroed(len: usize) -> BytesMut {
    let align = match len {
        l if l >= CHUNK => CHUNK,
        l if l >= PAGE => PAGE,
        _ => BUF_ALIGN,
    };
    // calloc: fresh mmap'd memory is not written, so the pads cost address space only.
    let mut b = BytesMut::zeroed(len + align - 1);
    drop(b.split_to((align - b.as_ptr() as usize % align) % align));
    b.truncate(len);
    if align == CHUNK {
        // Advise before the first touch: the touches then fault in huge pages.
        crate::util::advise_huge_pages(b.as_ptr() as usize, len);
        touch_pages(&mut b);
        // Memory malloc reuses is already faulted in, as 4 KiB pages: collapse it.
        crate::util::collapse_huge_pages(b.as_ptr() as usize, len);
        crate::util::unadvise_huge_pages(b.as_ptr() as usize, len);
    } else {
        touch_pages(&mut b);
    }
    b
}

/// Size and alignment of a slab chunk: one transparent huge page (x86-64, arm64 with 4 KiB
/// pages).
pub(crate) const CHUNK: usize = 2 << 20;

/// Smallest size class carved from chunks. Smaller buffers are plain heap memory: a chunk
/// would pin 2 MiB for a few pages, and huge pages pay off on large copies.
pub(crate) const SLAB_MIN: usize = 64 << 10;

/// A buffer's memory: its own heap allocation, or a slot of a huge-page chunk.
enum PoolMem {
    Heap(AlignedMem),
    Slot(Slot),
}

impl PoolMem {
    /// The chunk this memory belongs to (its address), if any.
    fn chunk(&self) -> Option<usize> {
        match self {
            PoolMem::Heap(_) => None,
            PoolMem::Slot(s) => Some(s.chunk.addr),
        }
    }
}

impl Deref for PoolMem {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            PoolMem::Heap(m) => m,
            PoolMem::Slot(s) => &s.mem,
        }
    }
}

impl DerefMut for PoolMem {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            PoolMem::Heap(m) => m,
            PoolMem::Slot(s) => &mut s.mem,
        }
    }
}

/// One buffer's share of a chunk. `mem` is a disjoint piece of the chunk's allocation (a split
/// `BytesMut`), so no two buffers can alias.
struct Slot {
    // Dropped before `chunk`, which unpins the chunk before its memory can be freed.
    mem: BytesMut,
    chunk: Arc<Chunk>,
}

/// A 2 MiB-aligned allocation advised for transparent huge pages, shared by the slots carved
/// from it, and pinned whole while any of them lives (on registering transports).
struct Chunk {
    addr: usize,
    len: usize,
    pinned: Option<Arc<dyn PoolRegistrar>>,
    /// The allocation's unaligned head and tail: held so the memory outlives the unpin in
    /// `drop` (fields drop after it), whichever slot goes last.
    _pads: [BytesMut; 2],
}

impl Drop for Chunk {
    fn drop(&mut self) {
        if let Some(r) = &self.pinned {
            r.unpin_chunk(self.addr, self.len);
        }
        // The memory is still allocated (the pads hold it); its huge-page advice must not
        // outlive it into the application's heap.
        crate::util::unadvise_huge_pages(self.addr, self.len);
    }
}

/// A new chunk of `len` bytes (a multiple of [`CHUNK`]) cut into slots of `slot` bytes,
/// pre-faulted and, with a registrar, pinned. `None` when the registrar refuses the pin
/// (pin limits): the caller falls back to plain buffers.
fn new_chunk(len: usize, slot: usize, registrar: Option<&Arc<dyn PoolRegistrar>>) -> Option<Vec<Slot>> {
    let mut raw = BytesMut::zeroed(len + CHUNK);
    let pad = (CHUNK - raw.as_ptr() as usize % CHUNK) % CHUNK;
    let head = raw.split_to(pad);
    let mut body = raw.split_to(len);
    // Advise before the first touch: the touches then fault in huge pages.
    crate::util::advise_huge_pages(body.as_ptr() as usize, body.len());
    touch_pages(&mut body);
    if let Some(r) = registrar
        && let Err(e) = r.pin_chunk(&mut body)
    {
        tracing::debug!(error = %e, len, "cannot pin a pool chunk; using plain buffers");
        return None;
    }
    let chunk =
        Arc::new(Chunk { addr: body.as_ptr() as usize, len, pinned: registrar.cloned(), _pads: [head, raw] });
    let mut slots = Vec::with_capacity(len / slot);
    while !body.is_empty() {
        slots.push(Slot { mem: body.split_to(slot), chunk: chunk.clone() });
    }
    Some(slots)
}

/// Statistics of a [`BufPool`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Bytes currently handed out.
    pub in_use_bytes: u64,
    /// Bytes held but not handed out: free buffers, and the unused slots of chunks.
    pub cached_bytes: u64,
    /// Allocations served from a free list.
    pub reused: u64,
    /// Allocations that created (and registered) new memory.
    pub created: u64,
    /// Huge-page chunks currently held (counted when read).
    pub chunks: u64,
}

/// Use of one chunk.
struct ChunkUse {
    class: usize,
    len: usize,
    /// Slots handed out.
    out: usize,
}

struct PoolState {
    /// Registered buffers ready to hand out, per class.
    free: Vec<Vec<(PoolMem, MemKeys)>>,
    /// Slots of live chunks never registered yet, per class.
    fresh: Vec<Vec<Slot>>,
    /// Live chunks by address.
    chunks: HashMap<usize, ChunkUse>,
    stats: PoolStats,
}

struct PoolInner {
    state: Mutex<PoolState>,
    max_bytes: u64,
    max_cached_bytes: u64,
    registrar: Option<Arc<dyn PoolRegistrar>>,
}

impl PoolInner {
    fn give_back(&self, mem: PoolMem, keys: MemKeys) {
        let size = mem.len() as u64;
        let class = class_index(mem.len());
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.stats.in_use_bytes = st.stats.in_use_bytes.saturating_sub(size);
        st.stats.cached_bytes += size;
        match mem.chunk() {
            Some(addr) => {
                // A slot stays registered in its free list while its chunk lives; the chunk
                // goes as a whole once none of its slots is out and the cache is over budget.
                st.free[class].push((mem, keys));
                let idle = st.chunks.get_mut(&addr).is_some_and(|c| {
                    c.out = c.out.saturating_sub(1);
                    c.out == 0
                });
                if idle && st.stats.cached_bytes > self.max_cached_bytes {
                    let gone = release_chunk(&mut st, addr);
                    drop(st);
                    self.deregister_all(gone);
                }
            }
            None if st.stats.cached_bytes <= self.max_cached_bytes => st.free[class].push((mem, keys)),
            None => {
                st.stats.cached_bytes -= size;
                drop(st);
                self.deregister_all(vec![(mem, keys)]);
            }
        }
    }

    fn deregister_all(&self, bufs: Vec<(PoolMem, MemKeys)>) {
        if let Some(r) = &self.registrar {
            for (mem, keys) in &bufs {
                r.deregister(mem, *keys);
            }
        }
        // The memory goes here (a chunk's once its last slot is dropped).
        drop(bufs);
    }

    /// Frees cached memory until `need` more bytes fit the limit; false when what is held
    /// cannot be freed (buffers in use, chunks with a slot out).
    fn make_room(&self, st: &mut PoolState, need: u64) -> bool {
        while st.stats.in_use_bytes + st.stats.cached_bytes + need > self.max_bytes {
            // Plain buffers first (largest class first), then idle chunks.
            let heap = st.free.iter_mut().rev().find_map(|l| {
                let i = l.iter().position(|(m, _)| m.chunk().is_none())?;
                Some(l.swap_remove(i))
            });
            let gone = match heap {
                Some(b) => {
                    st.stats.cached_bytes -= b.0.len() as u64;
                    vec![b]
                }
                None => match st.chunks.iter().find(|(_, c)| c.out == 0).map(|(&a, _)| a) {
                    Some(addr) => release_chunk(st, addr),
                    None => return false,
                },
            };
            self.deregister_all(gone);
        }
        true
    }
}

/// Takes an idle chunk's slots out of the lists; returns its registered ones for the caller
/// to deregister (outside the lock when it can). Its memory goes with the last slot.
fn release_chunk(st: &mut PoolState, addr: usize) -> Vec<(PoolMem, MemKeys)> {
    let Some(c) = st.chunks.remove(&addr) else { return Vec::new() };
    st.stats.cached_bytes = st.stats.cached_bytes.saturating_sub(c.len as u64);
    st.fresh[c.class].retain(|s| s.chunk.addr != addr);
    let (gone, keep) =
        std::mem::take(&mut st.free[c.class]).into_iter().partition(|(m, _)| m.chunk() == Some(addr));
    st.free[c.class] = keep;
    gone
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let bufs: Vec<_> = st.free.drain(..).flatten().collect();
        st.fresh.clear();
        self.deregister_all(bufs);
    }
}

fn class_size(len: usize) -> usize {
    len.max(POOL_MIN_CLASS).next_power_of_two()
}

fn class_index(size: usize) -> usize {
    (class_size(size).trailing_zeros() - POOL_MIN_CLASS.trailing_zeros()) as usize
}

/// A pool of pre-faulted (and, on InfiniBand, pre-registered) buffers in power-of-two size
/// classes, bounded in total bytes.
#[derive(Clone)]
pub struct BufPool {
    inner: Arc<PoolInner>,
}

impl fmt::Debug for BufPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufPool").field("stats", &self.stats()).finish()
    }
}

impl BufPool {
    /// A pool that hands out at most `max_bytes` at once and keeps at most `max_cached_bytes`
    /// in its free lists (chunk memory is given back a whole chunk at a time, when none of its
    /// buffers is out). `max_bytes` bounds everything the pool holds.
    pub fn new(max_bytes: u64, max_cached_bytes: u64) -> Self {
        Self::build(max_bytes, max_cached_bytes, None)
    }

    #[allow(dead_code)] // used by the InfiniBand engine
    pub(crate) fn with_registrar(
        max_bytes: u64,
        max_cached_bytes: u64,
        registrar: Arc<dyn PoolRegistrar>,
    ) -> Self {
        Self::build(max_bytes, max_cached_bytes, Some(registrar))
    }

    fn build(max_bytes: u64, max_cached_bytes: u64, registrar: Option<Arc<dyn PoolRegistrar>>) -> Self {
        BufPool {
            inner: Arc::new(PoolInner {
                state: Mutex::new(PoolState {
                    free: (0..48).map(|_| Vec::new()).collect(),
                    fresh: (0..48).map(|_| Vec::new()).collect(),
                    chunks: HashMap::new(),
                    stats: PoolStats::default(),
                }),
                max_bytes,
                max_cached_bytes,
                registrar,
            }),
        }
    }

    /// A buffer of `len` usable bytes (capacity rounded up to a power of two ≥ 4 KiB).
    ///
    /// # Errors
    /// [`Error::Exhausted`] when the pool's byte limit would be exceeded; [`Error::TooLarge`]
    /// for a single request above the limit.
    pub fn alloc(&self, len: usize) -> Result<RegisteredBuf> {
        let size = class_size(len);
        if size as u64 > self.inner.max_bytes {
            return Err(Error::TooLarge { len: len as u64, max: self.inner.max_bytes });
        }
        let class = class_index(size);
        let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((mem, keys)) = st.free[class].pop() {
            st.stats.cached_bytes -= size as u64;
            st.stats.in_use_bytes += size as u64;
            st.stats.reused += 1;
            if let Some(c) = mem.chunk().and_then(|a| st.chunks.get_mut(&a)) {
                c.out += 1;
            }
            return Ok(RegisteredBuf { mem: Some(mem), len, keys, home: Some(self.inner.clone()) });
        }
        let slot = match st.fresh[class].pop() {
            Some(s) => {
                st.stats.cached_bytes -= size as u64;
                Some(s)
            }
            None if size >= SLAB_MIN => {
                // A new chunk if it fits the limit; else a plain buffer.
                let chunk_len = size.max(CHUNK);
                if self.inner.make_room(&mut st, chunk_len as u64) {
                    st.stats.cached_bytes += chunk_len as u64;
                    drop(st);
                    let slots = new_chunk(chunk_len, size, self.inner.registrar.as_ref());
                    st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
                    match slots {
                        Some(mut slots) => {
                            let addr = slots[0].chunk.addr;
                            st.chunks.insert(addr, ChunkUse { class, len: chunk_len, out: 0 });
                            let first = slots.pop();
                            st.fresh[class].extend(slots);
                            st.stats.cached_bytes -= size as u64;
                            first
                        }
                        None => {
                            st.stats.cached_bytes -= chunk_len as u64;
                            None
                        }
                    }
                } else {
                    None
                }
            }
            None => None,
        };
        if slot.is_none() && !self.inner.make_room(&mut st, size as u64) {
            return Err(Error::Exhausted(format!(
                "buffer pool limit of {} bytes reached ({} in use)",
                self.inner.max_bytes, st.stats.in_use_bytes
            )));
        }
        st.stats.in_use_bytes += size as u64;
        st.stats.created += 1;
        if let Some(c) = slot.as_ref().and_then(|s| st.chunks.get_mut(&s.chunk.addr)) {
            c.out += 1;
        }
        drop(st);
        let mut mem = match slot {
            Some(s) => PoolMem::Slot(s),
            None => PoolMem::Heap(prefaulted(size)),
        };
        let keys = match &self.inner.registrar {
            Some(r) => match r.register(&mut mem) {
                Ok(k) => k,
                Err(e) => {
                    // Give the memory back unregistered: a slot to its chunk's fresh list.
                    let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
                    st.stats.in_use_bytes -= size as u64;
                    if let PoolMem::Slot(s) = mem {
                        st.stats.cached_bytes += size as u64;
                        if let Some(c) = st.chunks.get_mut(&s.chunk.addr) {
                            c.out -= 1;
                        }
                        st.fresh[class].push(s);
                    }
                    return Err(e);
                }
            },
            None => MemKeys::default(),
        };
        Ok(RegisteredBuf { mem: Some(mem), len, keys, home: Some(self.inner.clone()) })
    }

    /// Current statistics.
    pub fn stats(&self) -> PoolStats {
        let st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        PoolStats { chunks: st.chunks.len() as u64, ..st.stats }
    }
}

/// Data to send: one `Bytes`, a gather list, or a pool buffer.
#[derive(Debug)]
pub enum SendBuf {
    /// A single contiguous buffer.
    Bytes(Bytes),
    /// A gather list, sent as one message in order.
    List(Vec<Bytes>),
    /// A registered pool buffer (zero-copy on InfiniBand).
    Registered(RegisteredBuf),
}

impl SendBuf {
    /// Total bytes.
    pub fn len(&self) -> usize {
        match self {
            SendBuf::Bytes(b) => b.len(),
            SendBuf::List(l) => l.iter().map(|b| b.len()).sum(),
            SendBuf::Registered(r) => r.len(),
        }
    }

    /// True when there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The segments, in order.
    pub fn segments(&self) -> Segments<'_> {
        match self {
            SendBuf::Bytes(b) => Segments::One(Some(b)),
            SendBuf::List(l) => Segments::Many(l.iter()),
            SendBuf::Registered(r) => Segments::One(Some(r)),
        }
    }

    /// Copies bytes starting at logical `offset` into `dst`; returns how many were copied.
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> usize {
        copy_out_segments(self.segments(), offset, dst)
    }

    /// Calls `f` on each contiguous piece of `[offset, offset + len)`, in order.
    pub fn for_each_slice<'a>(&'a self, offset: usize, len: usize, f: impl FnMut(&'a [u8])) {
        for_each_piece(self.segments(), offset, len, f);
    }

    /// A cheap view of `[offset, offset+len)` as `Bytes` when this buffer is a single `Bytes`
    /// (no copy); `None` otherwise.
    pub fn slice_bytes(&self, offset: usize, len: usize) -> Option<Bytes> {
        match self {
            SendBuf::Bytes(b) if offset.checked_add(len)? <= b.len() => Some(b.slice(offset..offset + len)),
            _ => None,
        }
    }
}

/// Iterator over the segments of a [`SendBuf`].
#[derive(Debug)]
pub enum Segments<'a> {
    #[doc(hidden)]
    One(Option<&'a [u8]>),
    #[doc(hidden)]
    Many(std::slice::Iter<'a, Bytes>),
}

impl<'a> Iterator for Segments<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        match self {
            Segments::One(s) => s.take(),
            Segments::Many(it) => it.next().map(|b| &b[..]),
        }
    }
}

/// The writable rest of the segment holding logical `offset`, or `None` past the end.
fn segment_at<'a>(segs: impl Iterator<Item = &'a mut [u8]>, mut offset: usize) -> Option<&'a mut [u8]> {
    for seg in segs {
        if offset < seg.len() {
            return Some(&mut seg[offset..]);
        }
        offset -= seg.len();
    }
    None
}

/// Logical `[offset, offset + len)` of concatenated segments, walked segment by segment.
struct Window {
    offset: usize,
    len: usize,
}

impl Window {
    /// The range of a segment of `seg_len` bytes that the window covers (empty while the window
    /// has not begun), or `None` once all of it has been handed out.
    fn next(&mut self, seg_len: usize) -> Option<std::ops::Range<usize>> {
        if self.len == 0 {
            return None;
        }
        if self.offset >= seg_len {
            self.offset -= seg_len;
            return Some(0..0);
        }
        let start = self.offset;
        let n = (seg_len - start).min(self.len);
        self.len -= n;
        self.offset = 0;
        Some(start..start + n)
    }
}

/// Calls `f` on each writable piece of logical `[offset, offset + len)` of the concatenated
/// segments, in order, while `f` returns true.
fn for_each_piece_mut<'a>(
    segs: impl Iterator<Item = &'a mut [u8]>,
    offset: usize,
    len: usize,
    mut f: impl FnMut(&'a mut [u8]) -> bool,
) {
    let mut w = Window { offset, len };
    for seg in segs {
        let Some(r) = w.next(seg.len()) else { break };
        if !r.is_empty() && !f(&mut seg[r]) {
            break;
        }
    }
}

/// Calls `f` on each contiguous piece of bytes `[offset, offset + len)` of the concatenated
/// segments, in order.
fn for_each_piece<'a>(
    segs: impl Iterator<Item = &'a [u8]>,
    offset: usize,
    len: usize,
    mut f: impl FnMut(&'a [u8]),
) {
    let mut w = Window { offset, len };
    for seg in segs {
        let Some(r) = w.next(seg.len()) else { break };
        if !r.is_empty() {
            f(&seg[r]);
        }
    }
}

fn copy_out_segments<'a>(segs: impl Iterator<Item = &'a [u8]>, offset: usize, dst: &mut [u8]) -> usize {
    let mut done = 0;
    for_each_piece(segs, offset, dst.len(), |piece| {
        crate::buffers::copy::copy_bytes(&mut dst[done..done + piece.len()], piece);
        done += piece.len();
    });
    done
}

impl From<Bytes> for SendBuf {
    fn from(b: Bytes) -> Self {
        SendBuf::Bytes(b)
    }
}
impl From<Vec<u8>> for SendBuf {
    fn from(v: Vec<u8>) -> Self {
        SendBuf::Bytes(Bytes::from(v))
    }
}
impl From<&'static [u8]> for SendBuf {
    fn from(v: &'static [u8]) -> Self {
        SendBuf::Bytes(Bytes::from_static(v))
    }
}
impl From<Vec<Bytes>> for SendBuf {
    fn from(v: Vec<Bytes>) -> Self {
        SendBuf::List(v)
    }
}
impl From<RegisteredBuf> for SendBuf {
    fn from(r: RegisteredBuf) -> Self {
        SendBuf::Registered(r)
    }
}

/// Memory to receive into: one `BytesMut`, a scatter list, or a pool buffer. The receive's
/// capacity is the sum of the segments' current lengths (`BytesMut::len`, not `capacity`), so
/// allocate with `BytesMut::zeroed(n)`.
#[derive(Debug)]
pub enum RecvBuf {
    /// A single buffer.
    Mut(BytesMut),
    /// A scatter list, filled in order.
    List(Vec<BytesMut>),
    /// A registered pool buffer (zero-copy on InfiniBand).
    Registered(RegisteredBuf),
    /// Regions of mapped files, filled in order: a storage server receiving straight into
    /// its files' pages ([`crate::buffers::filemap`]).
    Mapped(Vec<FileRegionMut>),
}

impl RecvBuf {
    /// Total bytes that can be received.
    pub fn capacity(&self) -> usize {
        match self {
            RecvBuf::Mut(b) => b.len(),
            RecvBuf::List(l) => l.iter().map(|b| b.len()).sum(),
            RecvBuf::Registered(r) => r.len(),
            RecvBuf::Mapped(l) => l.iter().map(|r| r.len()).sum(),
        }
    }

    /// Mutable segments, in order.
    pub fn segments_mut(&mut self) -> Vec<&mut [u8]> {
        match self {
            RecvBuf::Mut(b) => vec![&mut b[..]],
            RecvBuf::List(l) => l.iter_mut().map(|b| &mut b[..]).collect(),
            RecvBuf::Registered(r) => vec![&mut r[..]],
            RecvBuf::Mapped(l) => l.iter_mut().map(|r| &mut r[..]).collect(),
        }
    }

    /// The contiguous writable rest of the segment holding logical `offset`, or `None` past
    /// the end.
    pub fn slice_at_mut(&mut self, offset: usize) -> Option<&mut [u8]> {
        match self {
            RecvBuf::Mut(b) => b.get_mut(offset..).filter(|s| !s.is_empty()),
            RecvBuf::Registered(r) => r.get_mut(offset..).filter(|s| !s.is_empty()),
            RecvBuf::List(l) => segment_at(l.iter_mut().map(|b| &mut b[..]), offset),
            RecvBuf::Mapped(l) => segment_at(l.iter_mut().map(|r| &mut r[..]), offset),
        }
    }

    /// Calls `f` on each writable piece of logical `[offset, offset + len)`, in order, while
    /// it returns true: the destinations of one vectored socket read across a scatter list's
    /// segments.
    pub(crate) fn for_each_slice_mut<'a>(
        &'a mut self,
        offset: usize,
        len: usize,
        f: impl FnMut(&'a mut [u8]) -> bool,
    ) {
        match self {
            RecvBuf::Mut(b) => for_each_piece_mut(std::iter::once(&mut b[..]), offset, len, f),
            RecvBuf::List(l) => for_each_piece_mut(l.iter_mut().map(|b| &mut b[..]), offset, len, f),
            RecvBuf::Registered(r) => for_each_piece_mut(std::iter::once(&mut r[..]), offset, len, f),
            RecvBuf::Mapped(l) => for_each_piece_mut(l.iter_mut().map(|r| &mut r[..]), offset, len, f),
        }
    }

    /// Copies `src` to logical `offset`; returns how many bytes fit.
    pub fn copy_in(&mut self, mut offset: usize, src: &[u8]) -> usize {
        let mut done = 0;
        let mut apply = |seg: &mut [u8]| {
            if done == src.len() {
                return;
            }
            if offset >= seg.len() {
                offset -= seg.len();
                return;
            }
            let n = (seg.len() - offset).min(src.len() - done);
            crate::buffers::copy::copy_bytes(&mut seg[offset..offset + n], &src[done..done + n]);
            done += n;
            offset = 0;
        };
        match self {
            RecvBuf::Mut(b) => apply(b),
            RecvBuf::List(l) => l.iter_mut().for_each(|b| apply(b)),
            RecvBuf::Registered(r) => apply(r),
            RecvBuf::Mapped(l) => l.iter_mut().for_each(|r| apply(r)),
        }
        done
    }

    /// Calls `f` on each contiguous piece of `[offset, offset + len)` of the received bytes'
    /// space, in order.
    #[cfg(any(target_os = "linux", test))]
    pub(crate) fn for_each_slice<'a>(&'a self, offset: usize, len: usize, f: impl FnMut(&'a [u8])) {
        match self {
            RecvBuf::Mut(b) => for_each_piece(std::iter::once(&b[..]), offset, len, f),
            RecvBuf::List(l) => for_each_piece(l.iter().map(|b| &b[..]), offset, len, f),
            RecvBuf::Registered(r) => for_each_piece(std::iter::once(&r[..]), offset, len, f),
            RecvBuf::Mapped(l) => for_each_piece(l.iter().map(|r| &r[..]), offset, len, f),
        }
    }

    /// Copies bytes starting at logical `offset` into `dst`; returns how many were copied.
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> usize {
        match self {
            RecvBuf::Mut(b) => copy_out_segments(std::iter::once(&b[..]), offset, dst),
            RecvBuf::List(l) => copy_out_segments(l.iter().map(|b| &b[..]), offset, dst),
            RecvBuf::Registered(r) => copy_out_segments(std::iter::once(&r[..]), offset, dst),
            RecvBuf::Mapped(l) => copy_out_segments(l.iter().map(|r| &r[..]), offset, dst),
        }
    }

    /// The first `len` bytes gathered into one `Bytes` (copies unless single `BytesMut`).
    pub fn to_bytes(&self, len: usize) -> Bytes {
        let mut v = vec![0u8; len.min(self.capacity())];
        let n = self.copy_out(0, &mut v);
        v.truncate(n);
        Bytes::from(v)
    }
}

impl From<BytesMut> for RecvBuf {
    fn from(b: BytesMut) -> Self {
        RecvBuf::Mut(b)
    }
}
impl From<Vec<BytesMut>> for RecvBuf {
    fn from(v: Vec<BytesMut>) -> Self {
        RecvBuf::List(v)
    }
}
impl From<Vec<FileRegionMut>> for RecvBuf {
    fn from(v: Vec<FileRegionMut>) -> Self {
        RecvBuf::Mapped(v)
    }
}
impl From<RegisteredBuf> for RecvBuf {
    fn from(r: RegisteredBuf) -> Self {
        RecvBuf::Registered(r)
    }
}

/// The buffer an operation carried, handed back in its completion.
#[derive(Debug, Default)]
pub enum OpBuf {
    /// The operation carried no buffer.
    #[default]
    None,
    /// A send-side buffer.
    Send(SendBuf),
    /// A receive-side buffer.
    Recv(RecvBuf),
}

impl OpBuf {
    /// The receive buffer, if this was one.
    pub fn into_recv(self) -> Option<RecvBuf> {
        match self {
            OpBuf::Recv(r) => Some(r),
            _ => None,
        }
    }

    /// The send buffer, if this was one.
    pub fn into_send(self) -> Option<SendBuf> {
        match self {
            OpBuf::Send(s) => Some(s),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_reuses_and_bounds_memory() {
        let pool = BufPool::new(64 * 1024, 32 * 1024);
        let a = pool.alloc(5000).unwrap();
        assert_eq!(a.len(), 5000);
        assert_eq!(a.capacity(), 8192);
        let addr = a.addr();
        drop(a);
        assert_eq!(pool.stats().cached_bytes, 8192);
        let b = pool.alloc(8000).unwrap();
        assert_eq!(b.addr(), addr, "same class must be reused");
        assert_eq!(pool.stats().reused, 1);
        let c = pool.alloc(32 * 1024).unwrap();
        let d = pool.alloc(16 * 1024).unwrap();
        assert!(matches!(pool.alloc(16 * 1024), Err(Error::Exhausted(_))));
        assert!(matches!(pool.alloc(1 << 20), Err(Error::TooLarge { .. })));
        drop((b, c, d));
        assert_eq!(pool.stats().in_use_bytes, 0);
        assert!(pool.stats().cached_bytes <= 32 * 1024);
    }

    #[test]
    fn buffers_start_cache_line_aligned() {
        // malloc alone gives 16-byte alignment, which makes the kernel's copies into the
        // buffer several times slower; every size class and unpooled buffers must be aligned.
        let pool = BufPool::new(64 << 20, 0);
        let mut held = Vec::new();
        for len in [1, 100, 4096, 5000, 65_536, 1 << 20, (1 << 20) + 1] {
            for _ in 0..4 {
                let mut b = pool.alloc(len).unwrap();
                assert_eq!(b.addr() % BUF_ALIGN, 0, "pool buffer of {len} bytes at {:#x}", b.addr());
                assert_eq!((b.len(), b.capacity()), (len, class_size(len)));
                b.fill(7);
                held.push(b);
            }
            let u = RegisteredBuf::unpooled(len);
            assert_eq!(u.addr() % BUF_ALIGN, 0, "unpooled buffer of {len} bytes");
            assert_eq!((u.len(), u.capacity()), (len, len));
        }
        assert!(held.iter().all(|b| b.iter().all(|&x| x == 7)));
    }

    /// Counts registrations and chunk pins; refuses pins when told to.
    #[derive(Default)]
    struct Counting {
        regs: std::sync::Mutex<HashMap<usize, usize>>,
        pins: std::sync::Mutex<HashMap<usize, usize>>,
        refuse_pins: bool,
    }

    impl PoolRegistrar for Counting {
        fn register(&self, mem: &mut [u8]) -> Result<MemKeys> {
            self.regs.lock().unwrap().insert(mem.as_ptr() as usize, mem.len());
            Ok(MemKeys { lkey: 1, rkey: 2 })
        }
        fn deregister(&self, mem: &[u8], _keys: MemKeys) {
            assert!(self.regs.lock().unwrap().remove(&(mem.as_ptr() as usize)).is_some(), "unknown buffer");
        }
        fn pin_chunk(&self, mem: &mut [u8]) -> Result<()> {
            if self.refuse_pins {
                return Err(Error::Exhausted("pin limit".into()));
            }
            self.pins.lock().unwrap().insert(mem.as_ptr() as usize, mem.len());
            Ok(())
        }
        fn unpin_chunk(&self, addr: usize, len: usize) {
            assert_eq!(self.pins.lock().unwrap().remove(&addr), Some(len), "unpinned what was pinned");
        }
    }

    #[test]
    fn large_buffers_share_a_pinned_huge_page_chunk() {
        let reg = Arc::new(Counting::default());
        let pool = BufPool::with_registrar(64 << 20, 0, reg.clone());
        let a = pool.alloc(1 << 20).unwrap();
        let b = pool.alloc(1 << 20).unwrap();
        let (lo, hi) = (a.addr().min(b.addr()), a.addr().max(b.addr()));
        assert_eq!(lo % CHUNK, 0, "chunks are huge-page aligned");
        assert_eq!(hi, lo + (1 << 20), "both halves of one chunk, disjoint");
        assert_eq!(pool.stats().chunks, 1);
        assert_eq!(
            *reg.pins.lock().unwrap(),
            HashMap::from([(lo, CHUNK)]),
            "the chunk is pinned whole, once"
        );
        assert_eq!(reg.regs.lock().unwrap().len(), 2, "each buffer has its own registration");
        let c = pool.alloc(1 << 20).unwrap();
        assert_eq!(pool.stats().chunks, 2);
        assert_eq!(pool.stats().in_use_bytes + pool.stats().cached_bytes, 2 * CHUNK as u64);
        // Writing one buffer never shows through another.
        let (mut a, b) = (a, b);
        a.fill(1);
        assert!(b.iter().all(|&x| x == 0));
        // With no cache allowed, a chunk goes (unpinned, deregistered) once both halves are back.
        drop(a);
        assert_eq!(pool.stats().chunks, 2, "half of the first chunk is still out");
        drop(b);
        assert_eq!(pool.stats().chunks, 1);
        drop(c);
        let s = pool.stats();
        assert_eq!((s.chunks, s.in_use_bytes, s.cached_bytes), (0, 0, 0));
        assert!(reg.pins.lock().unwrap().is_empty() && reg.regs.lock().unwrap().is_empty());
    }

    #[test]
    fn chunks_count_against_the_limit_and_fall_back_to_plain_buffers() {
        // 3 MiB: one chunk (two 1 MiB buffers), then no room for a second chunk, so the third
        // buffer is a plain one, and a fourth does not fit at all.
        let pool = BufPool::new(3 << 20, 3 << 20);
        let held: Vec<_> = (0..3).map(|_| pool.alloc(1 << 20).unwrap()).collect();
        assert_eq!(pool.stats().chunks, 1);
        assert!(matches!(pool.alloc(1 << 20), Err(Error::Exhausted(_))));
        assert!(matches!(pool.alloc(4096), Err(Error::Exhausted(_))));
        drop(held);
        let s = pool.stats();
        assert_eq!((s.in_use_bytes, s.cached_bytes), (0, 3 << 20), "all cached within the limit");
        // Idle chunks are freed to make room for other classes.
        let big = pool.alloc(2 << 20).unwrap();
        assert_eq!(big.addr() % CHUNK, 0);
        assert!(pool.stats().in_use_bytes + pool.stats().cached_bytes <= 3 << 20);
    }

    #[test]
    fn refused_chunk_pins_fall_back_to_plain_buffers() {
        let reg = Arc::new(Counting { refuse_pins: true, ..Default::default() });
        let pool = BufPool::with_registrar(64 << 20, 64 << 20, reg.clone());
        let a = pool.alloc(1 << 20).unwrap();
        assert_eq!(pool.stats().chunks, 0);
        assert_eq!(pool.stats().in_use_bytes + pool.stats().cached_bytes, 1 << 20);
        assert_eq!(reg.regs.lock().unwrap().len(), 1);
        drop(a);
        drop(pool);
        assert!(reg.regs.lock().unwrap().is_empty(), "deregistered when the pool goes");
    }

    #[test]
    fn scatter_gather_copies_cross_segment_boundaries() {
        let s = SendBuf::List(vec![Bytes::from_static(b"abc"), Bytes::new(), Bytes::from_static(b"defgh")]);
        assert_eq!(s.len(), 8);
        let mut out = [0u8; 4];
        assert_eq!(s.copy_out(2, &mut out), 4);
        assert_eq!(&out, b"cdef");
        let mut r = RecvBuf::List(vec![BytesMut::zeroed(2), BytesMut::zeroed(3), BytesMut::zeroed(4)]);
        assert_eq!(r.copy_in(1, b"0123456789"), 8);
        assert_eq!(&r.to_bytes(9)[..], b"\x0001234567");
    }

    #[test]
    fn receive_lists_are_walked_piecewise_across_segments() {
        let r =
            RecvBuf::List(vec![BytesMut::from(&b"ab"[..]), BytesMut::new(), BytesMut::from(&b"cdef"[..])]);
        let mut pieces = Vec::new();
        r.for_each_slice(1, 4, |p| pieces.push(p.to_vec()));
        assert_eq!(pieces, [b"b".to_vec(), b"cde".to_vec()]);
    }

    #[test]
    fn writable_pieces_cover_the_window_and_stop_when_told() {
        let mut r = RecvBuf::List(vec![
            BytesMut::zeroed(2),
            BytesMut::new(),
            BytesMut::zeroed(4),
            BytesMut::zeroed(3),
        ]);
        let mut lens = Vec::new();
        r.for_each_slice_mut(1, 6, |p| {
            p.fill(b'x');
            lens.push(p.len());
            true
        });
        assert_eq!(lens, [1, 4, 1], "[1, 7) across segments of 2, 0, 4 and 3");
        assert_eq!(&r.to_bytes(9)[..], b"\0xxxxxx\0\0");
        let mut seen = 0;
        r.for_each_slice_mut(0, 9, |_| {
            seen += 1;
            seen < 2
        });
        assert_eq!(seen, 2, "no piece after the callback says stop");
    }

    #[test]
    fn set_len_is_bounded_by_capacity() {
        let mut b = RegisteredBuf::unpooled(10);
        assert!(b.set_len(b.capacity() + 1).is_err());
        b.set_len(3).unwrap();
        assert_eq!(b.len(), 3);
    }
}
