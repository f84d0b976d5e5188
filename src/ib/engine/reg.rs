//! Registered memory for the engine: DMA regions it owns, and the registrar the pin-down cache
//! and the buffer pool use. All of the engine's `unsafe` lives here.
//!
//! Memory a device may read or write at any moment (receive buffers, bounce buffers, the
//! fast-RDMA ring, zone buffers) is never accessed through Rust references: [`DmaRegion`]
//! owns it through a raw pointer and copies in and out with bounds-checked `read_at` /
//! `write_at`, like memory shared with another process.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use crate::buffers::buf::{MemKeys, PoolRegistrar, RegisteredBuf};
use crate::error::{Error, Result};
use crate::ib::verbs::{AccessFlags, MemoryRegion, Verbs, VerbsError};
use crate::regcache::{Origin, RegCache, RegError, RegRef, Registrar};
use crate::types::Access;

use super::Dev;

/// Alignment of DMA regions: huge-page sized, so the kernel can back them with transparent huge
/// pages (one-sided copies and registrations are several times cheaper on huge pages).
const REGION_ALIGN: usize = 2 << 20;

/// Zeroed, pre-faulted memory owned by the engine and shared with a device.
#[derive(Debug)]
pub(crate) struct DmaRegion {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the region is plain bytes owned by this value; all access goes through `read_at` /
// `write_at`, which copy through raw pointers, so sharing the pointer between threads creates
// no aliasing references.
unsafe impl Send for DmaRegion {}
// SAFETY: as above; `&self` methods only copy bytes in or out.
unsafe impl Sync for DmaRegion {}

impl DmaRegion {
    /// `len` zeroed bytes (at least one page), pre-faulted.
    pub(crate) fn new(len: usize) -> Result<DmaRegion> {
        let len = len.max(4096).next_multiple_of(4096);
        let align = if len >= REGION_ALIGN { REGION_ALIGN } else { 4096 };
        let layout = Layout::from_size_align(len, align).map_err(|e| Error::misuse(e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr =
            NonNull::new(raw).ok_or_else(|| Error::Exhausted(format!("cannot allocate {len} bytes")))?;
        if len >= REGION_ALIGN {
            crate::util::advise_huge_pages(raw as usize, len);
        }
        let r = DmaRegion { ptr, layout };
        // Touch every page now: first-touch faults cost ~2.5 s/GiB on the reference VM.
        for off in (0..len).step_by(4096) {
            r.write_at(off, &[0]);
        }
        Ok(r)
    }

    /// Address of the first byte.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    fn check(&self, off: usize, n: usize) {
        let end = off.checked_add(n).expect("DMA region offset overflows");
        assert!(end <= self.len(), "DMA region access {off}+{n} beyond {}", self.len());
    }

    /// Copies `src` to `off`. Panics on an out-of-range access (a local bug, never peer data:
    /// callers bound peer-supplied lengths first).
    pub(crate) fn write_at(&self, off: usize, src: &[u8]) {
        self.check(off, src.len());
        // SAFETY: in bounds (checked); the region is owned and live; `src` cannot overlap it
        // because the region is only reachable through this raw pointer.
        unsafe { copy_raw(src.as_ptr(), self.ptr.as_ptr().add(off), src.len()) };
    }

    /// Copies `dst.len()` bytes from `off` into `dst`.
    pub(crate) fn read_at(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len());
        // SAFETY: in bounds (checked); see `write_at`.
        unsafe { copy_raw(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), dst.len()) };
    }
}

/// `ptr::copy_nonoverlapping`, in 64-byte blocks when the distance would trip the CPU trap that
/// [`crate::copy`] describes (DMA memory is page-aligned; callers' buffers often are not).
///
/// # Safety
/// As for `ptr::copy_nonoverlapping`: both ranges valid for `n` bytes and disjoint.
unsafe fn copy_raw(src: *const u8, dst: *mut u8, n: usize) {
    if !crate::buffers::copy::aliases(dst as usize, src as usize, n) {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
        return;
    }
    let blocks = n / 64;
    for i in 0..blocks {
        // SAFETY: block `i` lies inside both ranges (`i * 64 + 64 <= n`); unaligned accesses.
        unsafe {
            let b = src.add(i * 64).cast::<[u8; 64]>().read_unaligned();
            dst.add(i * 64).cast::<[u8; 64]>().write_unaligned(b);
        }
        // Keeps LLVM from fusing the loop back into one `memcpy`.
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    }
    let done = blocks * 64;
    // SAFETY: the tail lies inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), n - done) };
}

impl Drop for DmaRegion {
    fn drop(&mut self) {
        if self.len() >= REGION_ALIGN {
            crate::util::unadvise_huge_pages(self.ptr.as_ptr() as usize, self.len());
        }
        // SAFETY: allocated in `new` with this layout; registrations of it are dropped first
        // (owners declare their MR before the region).
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Registers a DMA region for the engine's own use.
pub(crate) fn register_region<V: Verbs>(dev: &Dev<V>, r: &DmaRegion, access: AccessFlags) -> Result<V::Mr> {
    // SAFETY: the region is owned by the caller, which keeps it alive and unmoved (it is a heap
    // allocation) until the returned MR is dropped, and never reads or writes it through Rust
    // references, only through `DmaRegion`'s copies.
    unsafe { dev.ctx.reg_mr(&dev.pd, r.ptr.as_ptr(), r.len(), access) }.map_err(Error::from)
}

fn flags(a: Access) -> AccessFlags {
    let mut f = AccessFlags::LOCAL_WRITE;
    if a.contains(Access::READ) {
        f = f | AccessFlags::REMOTE_READ;
    }
    if a.contains(Access::WRITE) {
        f = f | AccessFlags::REMOTE_WRITE;
    }
    f
}

/// The regcache's registrar: registers memory with the device.
pub(crate) struct VerbsRegistrar<V: Verbs> {
    dev: Arc<Dev<V>>,
    mrs: HashMap<u64, V::Mr>,
    next: u64,
}

impl<V: Verbs> VerbsRegistrar<V> {
    pub(crate) fn new(dev: Arc<Dev<V>>) -> Self {
        VerbsRegistrar { dev, mrs: HashMap::new(), next: 1 }
    }
}

impl<V: Verbs> std::fmt::Debug for VerbsRegistrar<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsRegistrar").field("registrations", &self.mrs.len()).finish()
    }
}

impl<V: Verbs> Registrar for VerbsRegistrar<V> {
    type Handle = u64;

    fn register(
        &mut self,
        addr: usize,
        len: usize,
        access: Access,
    ) -> std::result::Result<(u64, MemKeys), RegError> {
        // SAFETY: the cache registers only (a) pool memory the crate owns, alive until the pool
        // invalidates and releases its entry before freeing it, and (b) memory lent by an
        // operation, which owns the buffer until its completion releases the registration;
        // while registered, neither is accessed through Rust references (the operation holds
        // the buffer without touching it; pool buffers are in flight only inside operations).
        let mr = unsafe { self.dev.ctx.reg_mr(&self.dev.pd, addr as *mut u8, len, flags(access)) };
        match mr {
            Ok(mr) => {
                let keys = MemKeys { lkey: mr.lkey(), rkey: mr.rkey() };
                let h = self.next;
                self.next += 1;
                self.mrs.insert(h, mr);
                Ok((h, keys))
            }
            Err(VerbsError::PinLimit { .. }) => Err(RegError::OutOfMemory),
            Err(e) => Err(RegError::Failed(e.into())),
        }
    }

    fn deregister(&mut self, h: u64) {
        if let Some(mr) = self.mrs.remove(&h)
            && let Err(e) = mr.deregister()
        {
            tracing::warn!(error = %e, "deregistration failed");
        }
    }
}

/// The shared pin-down cache.
pub(crate) type Cache<V> = Arc<Mutex<RegCache<VerbsRegistrar<V>>>>;

/// Registers pool buffers through the pin-down cache (origin: owned), keeping one reference per
/// buffer while it exists.
pub(crate) struct PoolReg<V: Verbs> {
    pub(crate) cache: Cache<V>,
    refs: Mutex<HashMap<usize, RegRef>>,
    /// Local-only registrations pinning whole slab chunks, by chunk address.
    chunks: Mutex<HashMap<usize, V::Mr>>,
}

impl<V: Verbs> PoolReg<V> {
    pub(crate) fn new(cache: Cache<V>) -> Self {
        PoolReg { cache, refs: Mutex::new(HashMap::new()), chunks: Mutex::new(HashMap::new()) }
    }
}

impl<V: Verbs> PoolRegistrar for PoolReg<V> {
    fn register(&self, mem: &mut [u8]) -> Result<MemKeys> {
        let (addr, len) = (mem.as_ptr() as usize, mem.len());
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let r = c.acquire(addr, len, Access::READ_WRITE, Origin::Owned).map_err(Error::from)?;
        let keys = r.keys();
        drop(c);
        self.refs.lock().unwrap_or_else(|p| p.into_inner()).insert(addr, r);
        Ok(keys)
    }

    fn deregister(&self, mem: &[u8], _keys: MemKeys) {
        let (addr, len) = (mem.as_ptr() as usize, mem.len());
        let r = self.refs.lock().unwrap_or_else(|p| p.into_inner()).remove(&addr);
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = r {
            let _ = c.release(r);
        }
        // The memory is about to be freed: no cached registration may outlive it.
        c.invalidate(addr, len);
    }

    fn pin_chunk(&self, mem: &mut [u8]) -> Result<()> {
        let dev = self.cache.lock().unwrap_or_else(|p| p.into_inner()).registrar().dev.clone();
        // SAFETY: the chunk is pool memory the crate owns; the pool keeps it allocated until
        // `unpin_chunk` has dropped this MR (the chunk unpins before its memory can go). The MR
        // grants no remote access and its lkey is never put in a work request: it only keeps
        // the pages pinned, so the device never touches the memory through it.
        let mr = unsafe { dev.ctx.reg_mr(&dev.pd, mem.as_mut_ptr(), mem.len(), AccessFlags::LOCAL_WRITE) }
            .map_err(Error::from)?;
        self.chunks.lock().unwrap_or_else(|p| p.into_inner()).insert(mem.as_ptr() as usize, mr);
        Ok(())
    }

    fn unpin_chunk(&self, addr: usize, _len: usize) {
        let mr = self.chunks.lock().unwrap_or_else(|p| p.into_inner()).remove(&addr);
        if let Some(mr) = mr
            && let Err(e) = mr.deregister()
        {
            tracing::warn!(error = %e, "chunk deregistration failed");
        }
    }
}

/// Registers a pool buffer on its own (an exposure, revoked by dropping the MR).
pub(crate) fn register_buf<V: Verbs>(
    dev: &Dev<V>,
    buf: &RegisteredBuf,
    access: AccessFlags,
) -> Result<V::Mr> {
    if buf.is_empty() {
        return Err(Error::misuse("cannot register an empty buffer"));
    }
    // SAFETY: the buffer is moved into the exposure table right after, which keeps it (a heap
    // allocation that does not move) until the MR is dropped on revoke; while exposed it is
    // only read and written through `read_registered` / `write_registered` copies.
    unsafe { dev.ctx.reg_mr(&dev.pd, buf.addr() as *mut u8, buf.len(), access) }.map_err(Error::from)
}

/// A copy of an exposed buffer's bytes, read without creating a reference to memory peers may
/// be writing.
pub(crate) fn read_registered(buf: &RegisteredBuf) -> Vec<u8> {
    let mut v = vec![0u8; buf.len()];
    // SAFETY: `[addr, addr + len)` is the buffer's live allocation (it is borrowed); the copy
    // goes through raw pointers, so no Rust reference to device-shared memory is formed.
    unsafe { std::ptr::copy_nonoverlapping(buf.addr() as *const u8, v.as_mut_ptr(), v.len()) };
    v
}

/// Writes bytes back into an exposed buffer (see [`read_registered`]).
pub(crate) fn write_registered(buf: &RegisteredBuf, src: &[u8]) {
    let n = src.len().min(buf.len());
    // SAFETY: as in `read_registered`; `n` is within the buffer.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), buf.addr() as *mut u8, n) };
}
