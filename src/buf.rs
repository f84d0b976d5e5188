//! Owned buffers that operations carry, and the pre-registered buffer pool.
//!
//! Every operation takes ownership of its buffer and gives it back in its completion, so no
//! transfer can outlive the memory it reads or writes (the classic use-after-free of C
//! transports). [`RegisteredBuf`] is memory from the endpoint's pool (BMI's `BMI_memalloc`):
//! on InfiniBand it is registered with the device once, when the pool first creates it, and the
//! registration is reused for the buffer's whole life; the crate owns the memory, so that cached
//! registration can never go stale.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

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
}

/// A buffer from an endpoint's registered pool. Dereferences to its first `len()` bytes;
/// returns to the pool when dropped.
pub struct RegisteredBuf {
    mem: Option<AlignedMem>,
    len: usize,
    keys: MemKeys,
    home: Option<Arc<PoolInner>>,
}

impl RegisteredBuf {
    /// A buffer that belongs to no pool and is registered nowhere (plain heap memory, pre-faulted).
    /// Useful for tests and for transports without registration.
    pub fn unpooled(len: usize) -> Self {
        RegisteredBuf { mem: Some(prefaulted(len.max(1))), len, keys: MemKeys::default(), home: None }
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
    // calloc'd memory is mapped lazily; write one byte per page to fault it in now.
    let mut i = 0;
    while i < raw.len() {
        raw[i] = 0;
        i += PAGE;
    }
    std::hint::black_box(&mut raw);
    let start = (BUF_ALIGN - raw.as_ptr() as usize % BUF_ALIGN) % BUF_ALIGN;
    AlignedMem { raw, start, len }
}

/// Statistics of a [`BufPool`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes currently handed out.
    pub in_use_bytes: u64,
    /// Bytes cached in free lists.
    pub cached_bytes: u64,
    /// Allocations served from a free list.
    pub reused: u64,
    /// Allocations that created (and registered) new memory.
    pub created: u64,
}

struct PoolState {
    free: Vec<Vec<(AlignedMem, MemKeys)>>,
    stats: PoolStats,
}

struct PoolInner {
    state: Mutex<PoolState>,
    max_bytes: u64,
    max_cached_bytes: u64,
    registrar: Option<Arc<dyn PoolRegistrar>>,
}

impl PoolInner {
    fn give_back(&self, mem: AlignedMem, keys: MemKeys) {
        let size = mem.len() as u64;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.stats.in_use_bytes = st.stats.in_use_bytes.saturating_sub(size);
        if st.stats.cached_bytes + size <= self.max_cached_bytes {
            st.stats.cached_bytes += size;
            let class = class_index(mem.len());
            st.free[class].push((mem, keys));
        } else {
            drop(st);
            if let Some(r) = &self.registrar {
                r.deregister(&mem, keys);
            }
        }
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        if let Some(r) = &self.registrar {
            let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
            for list in st.free.drain(..) {
                for (mem, keys) in list {
                    r.deregister(&mem, keys);
                }
            }
        }
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
    /// in its free lists.
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
        {
            let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((mem, keys)) = st.free[class].pop() {
                st.stats.cached_bytes -= size as u64;
                st.stats.in_use_bytes += size as u64;
                st.stats.reused += 1;
                return Ok(RegisteredBuf { mem: Some(mem), len, keys, home: Some(self.inner.clone()) });
            }
            // Make room by releasing cached memory of other classes if needed.
            while st.stats.in_use_bytes + st.stats.cached_bytes + size as u64 > self.inner.max_bytes {
                let Some(list) = st.free.iter_mut().rev().find(|l| !l.is_empty()) else {
                    return Err(Error::Exhausted(format!(
                        "buffer pool limit of {} bytes reached ({} in use)",
                        self.inner.max_bytes, st.stats.in_use_bytes
                    )));
                };
                let Some((mem, keys)) = list.pop() else { break };
                st.stats.cached_bytes -= mem.len() as u64;
                if let Some(r) = &self.inner.registrar {
                    r.deregister(&mem, keys);
                }
            }
            st.stats.in_use_bytes += size as u64;
            st.stats.created += 1;
        }
        let mut mem = prefaulted(size);
        let keys = match &self.inner.registrar {
            Some(r) => match r.register(&mut mem) {
                Ok(k) => k,
                Err(e) => {
                    let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
                    st.stats.in_use_bytes -= size as u64;
                    return Err(e);
                }
            },
            None => MemKeys::default(),
        };
        Ok(RegisteredBuf { mem: Some(mem), len, keys, home: Some(self.inner.clone()) })
    }

    /// Current statistics.
    pub fn stats(&self) -> PoolStats {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner()).stats
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
    pub fn for_each_slice<'a>(&'a self, mut offset: usize, mut len: usize, mut f: impl FnMut(&'a [u8])) {
        for seg in self.segments() {
            if len == 0 {
                break;
            }
            if offset >= seg.len() {
                offset -= seg.len();
                continue;
            }
            let n = (seg.len() - offset).min(len);
            f(&seg[offset..offset + n]);
            len -= n;
            offset = 0;
        }
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

fn copy_out_segments<'a>(segs: impl Iterator<Item = &'a [u8]>, mut offset: usize, dst: &mut [u8]) -> usize {
    let mut done = 0;
    for seg in segs {
        if done == dst.len() {
            break;
        }
        if offset >= seg.len() {
            offset -= seg.len();
            continue;
        }
        let n = (seg.len() - offset).min(dst.len() - done);
        dst[done..done + n].copy_from_slice(&seg[offset..offset + n]);
        done += n;
        offset = 0;
    }
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
}

impl RecvBuf {
    /// Total bytes that can be received.
    pub fn capacity(&self) -> usize {
        match self {
            RecvBuf::Mut(b) => b.len(),
            RecvBuf::List(l) => l.iter().map(|b| b.len()).sum(),
            RecvBuf::Registered(r) => r.len(),
        }
    }

    /// Mutable segments, in order.
    pub fn segments_mut(&mut self) -> Vec<&mut [u8]> {
        match self {
            RecvBuf::Mut(b) => vec![&mut b[..]],
            RecvBuf::List(l) => l.iter_mut().map(|b| &mut b[..]).collect(),
            RecvBuf::Registered(r) => vec![&mut r[..]],
        }
    }

    /// The contiguous writable rest of the segment holding logical `offset`, or `None` past
    /// the end.
    pub fn slice_at_mut(&mut self, mut offset: usize) -> Option<&mut [u8]> {
        match self {
            RecvBuf::Mut(b) => b.get_mut(offset..).filter(|s| !s.is_empty()),
            RecvBuf::Registered(r) => r.get_mut(offset..).filter(|s| !s.is_empty()),
            RecvBuf::List(l) => {
                for seg in l.iter_mut() {
                    if offset < seg.len() {
                        return Some(&mut seg[offset..]);
                    }
                    offset -= seg.len();
                }
                None
            }
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
            seg[offset..offset + n].copy_from_slice(&src[done..done + n]);
            done += n;
            offset = 0;
        };
        match self {
            RecvBuf::Mut(b) => apply(b),
            RecvBuf::List(l) => l.iter_mut().for_each(|b| apply(b)),
            RecvBuf::Registered(r) => apply(r),
        }
        done
    }

    /// Copies bytes starting at logical `offset` into `dst`; returns how many were copied.
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> usize {
        match self {
            RecvBuf::Mut(b) => copy_out_segments(std::iter::once(&b[..]), offset, dst),
            RecvBuf::List(l) => copy_out_segments(l.iter().map(|b| &b[..]), offset, dst),
            RecvBuf::Registered(r) => copy_out_segments(std::iter::once(&r[..]), offset, dst),
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
    fn set_len_is_bounded_by_capacity() {
        let mut b = RegisteredBuf::unpooled(10);
        assert!(b.set_len(b.capacity() + 1).is_err());
        b.set_len(3).unwrap();
        assert_eq!(b.len(), 3);
    }
}
