//! Data buffers for callers of the client: zeroed and aligned like ionet's pool buffers.
//!
//! The kernel copies that move file data (`recvmsg`, `process_vm_readv`/`writev` on softib,
//! `pread`/`pwrite` on the io servers) run several times slower when source and destination
//! differ in alignment modulo 32 bytes (AMD Zen; 1 MiB at ~2.3 instead of ~11 GB/s on the
//! reference VM). ionet's pool buffers start on a [`ionet::BUF_ALIGN`] boundary, and a large
//! `Vec` or `BytesMut` from malloc usually starts 16 bytes past one; buffers from here match the
//! pool's alignment.

use bytes::BytesMut;

/// `len` zero bytes starting on a [`ionet::BUF_ALIGN`] boundary, every page touched (first
/// touch in the middle of a transfer costs ~2.5 s/GiB on the reference VM).
pub fn aligned_zeroed(len: usize) -> BytesMut {
    let mut b = BytesMut::zeroed(len + ionet::BUF_ALIGN - 1);
    let head = (ionet::BUF_ALIGN - b.as_ptr() as usize % ionet::BUF_ALIGN) % ionet::BUF_ALIGN;
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
                    assert_eq!(b.as_ptr() as usize % ionet::BUF_ALIGN, 0, "{len}-byte buffer");
                }
                assert!(b.iter().all(|&x| x == 0));
                b
            })
            .collect();
        assert_eq!(held.len(), 21);
    }
}
