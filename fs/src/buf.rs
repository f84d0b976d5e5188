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

#[cfg(test)]
const PAGE: usize = 4096;

/// `len` zero bytes starting on a page boundary (on an [`ionet::BUF_ALIGN`] boundary when
/// shorter than a page; on a 2 MiB boundary, in huge pages where the kernel allows, from
/// 2 MiB), every page touched (first touch in the middle of a transfer costs ~2.5 s/GiB on the
/// reference VM).
pub fn aligned_zeroed(len: usize) -> BytesMut {
    ionet::buf::bulk_zeroed(len)
}

#[cfg(test)]
mod tests {
    use super::*;

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
