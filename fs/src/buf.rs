//! Data buffers for callers of the client: zeroed and page-aligned.
//!
//! The copies that move file data (`recvmsg`, `process_vm_readv`/`writev` on softib, the io
//! servers' mapped pages) run `rep movsb`, which on AMD Zen slows to ~2.3 GB/s (from ~10–11)
//! when the destination starts 1–31 bytes after the source modulo 4 KiB, and copies page by page
//! fastest when both sides share their page offset. Servers' buffers and mapped pages are
//! page-aligned, and a large `Vec` or `BytesMut` from malloc starts 16 bytes into a page — the
//! slow case; buffers from here start on a page (small ones on an [`ionet::BUF_ALIGN`] boundary).
//!
//! From 2 MiB they also start on a 2 MiB boundary in transparent huge pages
//! ([`ionet::buf::bulk_zeroed`]): copies through 4 KiB pages miss the TLB every page, which
//! under virtualisation costs two page-table walks, and a softib or InfiniBand registration
//! then pins a few pages instead of thousands.

use bytes::BytesMut;
use std::sync::Mutex;

#[cfg(test)]
const PAGE: usize = 4096;

/// `len` zero bytes starting on a page boundary (on an [`ionet::BUF_ALIGN`] boundary when
/// shorter than a page; on a 2 MiB boundary, in huge pages where the kernel allows, from
/// 2 MiB), every page touched (first touch in the middle of a transfer costs ~2.5 s/GiB on the
/// reference VM).
pub fn aligned_zeroed(len: usize) -> BytesMut {
    ionet::buf::bulk_zeroed(len)
}

/// Buffers kept for reads that land in a temporary first ([`crate::File::read_into`]): a
/// fresh multi-MiB buffer per call costs more than the read (the allocator hands large blocks
/// back to the kernel, so each call faults in and zeroes new pages: an 8 MiB `read_into` took
/// 5.2–6.7 ms against `read_at`'s 2.5–2.8 ms on the reference VM, `benchmarks/journal/huge-pages-for-client-buffers.md`). Bounded
/// in count and bytes; a buffer larger than the bound is not kept. With `cache_foreign`, kept
/// buffers also keep their registrations cached, which is that option's point.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    free: Mutex<Vec<BytesMut>>,
}

impl Scratch {
    /// Most bytes kept.
    pub(crate) const MAX_BYTES: usize = 64 << 20;
    /// Most buffers kept (one per thread reading at once is the common case).
    pub(crate) const MAX_BUFFERS: usize = 4;
    /// A new buffer for a read of at least this many bytes is made at least a huge page long,
    /// so that it sits on one (see [`aligned_zeroed`]): the copies into it and out of it (the
    /// sockets', and the kernel's into a FUSE reader's pages, which first looks up each page of
    /// it) then walk one page table entry instead of hundreds. Smaller reads gain little.
    const HUGE_FROM: usize = 256 << 10;
    const HUGE_PAGE: usize = 2 << 20;

    /// A buffer of exactly `len` bytes, contents unspecified, and the unused tail of the kept
    /// buffer it was cut from (hand both back to [`Scratch::put`]).
    pub(crate) fn take(&self, len: usize) -> (BytesMut, BytesMut) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let fit = (0..free.len()).filter(|&i| free[i].len() >= len).min_by_key(|&i| free[i].len());
        match fit {
            Some(i) => {
                let mut b = free.swap_remove(i);
                let tail = b.split_off(len);
                (b, tail)
            }
            None => {
                let alloc = if len >= Self::HUGE_FROM { len.max(Self::HUGE_PAGE) } else { len };
                let mut b = aligned_zeroed(alloc);
                let tail = b.split_off(len);
                (b, tail)
            }
        }
    }

    /// Keeps `buf` (rejoined with `tail`) for later calls; returns the buffers no longer kept,
    /// which the caller drops (after forgetting any registrations of them).
    pub(crate) fn put(&self, mut buf: BytesMut, tail: BytesMut) -> Vec<BytesMut> {
        buf.unsplit(tail);
        if buf.len() > Self::MAX_BYTES {
            return vec![buf];
        }
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        free.push(buf);
        let mut evicted = Vec::new();
        // Drop the smallest first: the large ones are the expensive ones to make again.
        while free.len() > Self::MAX_BUFFERS
            || free.iter().map(BytesMut::len).sum::<usize>() > Self::MAX_BYTES
        {
            let i = (0..free.len()).min_by_key(|&i| free[i].len()).expect("not empty");
            evicted.push(free.swap_remove(i));
        }
        evicted
    }

    /// Every kept buffer, leaving none.
    pub(crate) fn drain(&self) -> Vec<BytesMut> {
        std::mem::take(&mut *self.free.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_reuses_a_kept_buffer_for_any_read_that_fits() {
        let s = Scratch::default();
        let (b, t) = s.take(3 << 20);
        let addr = b.as_ptr();
        assert_eq!((b.len(), t.len()), (3 << 20, 0));
        assert!(s.put(b, t).is_empty());
        // A smaller read is cut from the same memory, and the whole buffer comes back.
        let (b, t) = s.take(1 << 20);
        assert_eq!((b.as_ptr(), b.len(), t.len()), (addr, 1 << 20, 2 << 20));
        assert!(s.put(b, t).is_empty());
        // An empty read takes nothing from it, and it comes back whole.
        let (b, t) = s.take(0);
        assert_eq!((b.len(), t.len()), (0, 3 << 20));
        assert!(s.put(b, t).is_empty());
        let (b, t) = s.take(3 << 20);
        assert_eq!((b.as_ptr(), b.len()), (addr, 3 << 20));
        // A larger one needs new memory.
        let (b2, t2) = s.take(4 << 20);
        assert_ne!(b2.as_ptr(), addr);
        assert!(s.put(b, t).is_empty());
        assert!(s.put(b2, t2).is_empty());
        assert_eq!(s.drain().len(), 2);
    }

    #[test]
    fn scratch_makes_large_reads_a_huge_page_and_small_ones_their_size() {
        let s = Scratch::default();
        let (b, t) = s.take(1 << 20);
        assert_eq!((b.len(), t.len(), b.as_ptr() as usize % Scratch::HUGE_PAGE), (1 << 20, 1 << 20, 0));
        let (b2, t2) = s.take(4096);
        assert_eq!((b2.len(), t2.len()), (4096, 0));
        assert!(s.put(b, t).is_empty() && s.put(b2, t2).is_empty());
        // The rest of the huge page serves a later read that fits it.
        let (b, t) = s.take(2 << 20);
        assert_eq!((b.len(), t.len()), (2 << 20, 0));
        assert!(s.put(b, t).is_empty());
    }

    #[test]
    fn scratch_keeps_at_most_its_bounds_and_gives_back_the_rest() {
        let s = Scratch::default();
        // Over the byte bound alone: not kept.
        let big = BytesMut::zeroed(Scratch::MAX_BYTES + 1);
        assert_eq!(s.put(big, BytesMut::new()).len(), 1);
        // Over the count bound: the smallest goes.
        let mut evicted = Vec::new();
        for k in 1..=Scratch::MAX_BUFFERS + 1 {
            evicted.extend(s.put(BytesMut::zeroed(k << 10), BytesMut::new()));
        }
        assert_eq!(evicted.iter().map(BytesMut::len).collect::<Vec<_>>(), vec![1 << 10]);
        // Over the byte bound together: smallest first until it fits.
        let evicted = s.put(BytesMut::zeroed(Scratch::MAX_BYTES - (1 << 10)), BytesMut::new());
        assert_eq!(evicted.len(), Scratch::MAX_BUFFERS);
        let kept = s.drain();
        assert_eq!(kept.len(), 1);
        assert!(kept.iter().map(BytesMut::len).sum::<usize>() <= Scratch::MAX_BYTES);
    }

    #[test]
    fn buffers_are_aligned_zeroed_and_exact() {
        let held: Vec<BytesMut> = [0usize, 1, 100, 4096, 65_537, 1 << 20, (2 << 20) + 3]
            .iter()
            .flat_map(|&len| (0..3).map(move |_| (len, aligned_zeroed(len))))
            .map(|(len, b)| {
                assert_eq!(b.len(), len);
                if len > 0 {
                    let align = if len >= PAGE { PAGE } else { ionet::BUF_ALIGN };
                    assert_eq!(b.as_ptr() as usize % align, 0, "{len}-byte buffer");
                }
                assert!(b.iter().all(|&x| x == 0));
                b
            })
            .collect();
        assert_eq!(held.len(), 21);
    }
}
