//! Bulk byte copies that step around a CPU trap.
//!
//! On AMD Zen (measured on this project's EPYC machines) `rep movsb` — what glibc's `memcpy`
//! runs for copies from ~2 KiB to a few hundred KiB, and what the kernel's user copies run —
//! slows from 25–75 GB/s to ~2.4 GB/s when the destination starts 1–31 bytes after the source
//! modulo 4 KiB (the CPU suspects the stores overlap the loads ahead of them). The engines'
//! rings, zone buffers and pools are page-aligned while a `malloc`ed buffer starts 16 bytes into
//! its page, so copying received bytes out into a user's buffer lands exactly there.
//! [`copy_bytes`] copies such ranges in 64-byte blocks of vector moves instead.

/// Destination-minus-source distances (mod 4 KiB) below this, and above zero, are slow.
pub(crate) const ALIAS_WINDOW: usize = 64;

/// Shorter copies run vector loops in glibc, not `rep movsb`: left alone.
const MIN_LEN: usize = 1024;

/// Whether a `len`-byte copy from `src` to `dst` would hit the slow window.
pub(crate) fn aliases(dst: usize, src: usize, len: usize) -> bool {
    let skew = dst.wrapping_sub(src) & 4095;
    len >= MIN_LEN && skew != 0 && skew < ALIAS_WINDOW
}

/// `dst.copy_from_slice(src)` (same panics), in 64-byte blocks when the distance between the
/// two would make `memcpy` crawl. For applications too: copying out of a page-aligned buffer
/// ([`super::buf::bulk_zeroed`], [`crate::Endpoint::alloc`]) into a `Vec` is the slow case.
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    if !aliases(dst.as_ptr() as usize, src.as_ptr() as usize, dst.len()) || dst.len() != src.len() {
        dst.copy_from_slice(src);
        return;
    }
    let mut d = dst.chunks_exact_mut(64);
    let mut s = src.chunks_exact(64);
    for (d, s) in (&mut d).zip(&mut s) {
        let d: &mut [u8; 64] = d.try_into().expect("64-byte chunk");
        let s: &[u8; 64] = s.try_into().expect("64-byte chunk");
        *d = *s;
        // A compiler barrier: without it LLVM may fuse the loop back into one `memcpy`.
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    }
    d.into_remainder().copy_from_slice(s.remainder());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_long_copies_just_behind_their_destination_alias() {
        assert!(aliases(4096 + 16, 8192, 4096));
        assert!(aliases(4096 + 1, 0, MIN_LEN));
        assert!(!aliases(4096, 8192, 4096), "same page offset");
        assert!(!aliases(8192, 4096 + 16, 4096), "destination behind the source");
        assert!(!aliases(4096 + ALIAS_WINDOW, 0, 4096));
        assert!(!aliases(4096 + 16, 0, MIN_LEN - 1));
    }

    #[test]
    fn blocked_copies_are_exact_at_every_skew_and_length() {
        let src: Vec<u8> = (0..70_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let mut dst = vec![0u8; 80_000];
        let s0 = (4096 - src.as_ptr() as usize % 4096) % 4096;
        let d0 = (4096 - dst.as_ptr() as usize % 4096) % 4096;
        for skew in [0, 1, 16, 31, 63, 64, 100] {
            for len in [0, 1, 63, 64, 1023, 1024, 1025, 4096 + 17, 65_000] {
                if s0 + len > src.len() || d0 + skew + len + 8 > dst.len() {
                    continue;
                }
                dst.fill(0);
                let s = &src[s0..s0 + len];
                copy_bytes(&mut dst[d0 + skew..d0 + skew + len], s);
                assert_eq!(&dst[d0 + skew..d0 + skew + len], s, "skew {skew} len {len}");
                assert!(dst[..d0 + skew].iter().chain(&dst[d0 + skew + len..]).all(|&b| b == 0));
            }
        }
    }
}
