//! Data buffers for callers of the client: zeroed and page-aligned.
//!
//! The copies that move file data (`recvmsg`, `process_vm_readv`/`writev` on softib, the io
//! servers' mapped pages) run `rep movsb`, which on AMD Zen slows to ~2.3 GB/s (from ~10–11)
//! when the destination starts 1–31 bytes after the source modulo 4 KiB, and copies page by page
//! fastest when both sides share their page offset. Servers' buffers and mapped pages are
//! page-aligned, and a large `Vec` or `BytesMut` from malloc starts 16 bytes into a page — the
//! slow case; buffers from here start on a page (small ones on an [`ionet::BUF_ALIGN`] boundary).

use bytes::BytesMut;

const PAGE: usize = 4096;

/// `len` zero bytes starting on a page boundary (on an [`ionet::BUF_ALIGN`] boundary when
/// shorter than a page), every page touched (first touch in the middle of a transfer costs
/// ~2.5 s/GiB on the reference VM).
pub fn aligned_zeroed(len: usize) -> BytesMut {
    let align = if len >= PAGE { PAGE } else { ionet::BUF_ALIGN };
    let mut b = BytesMut::zeroed(len + align - 1);
    let head = (align - b.as_ptr() as usize % align) % align;
    drop(b.split_to(head));
    b.truncate(len);
    for i in (0..len).step_by(4096) {
        b[i] = 0;
    }
    std::hint::black_box(&mut b);
    b
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
