//! Small helpers: randomness and keyed MACs for handshakes.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// A random 64-bit value from the OS generator (endpoint ids, exposure keys, nonces).
pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    fill_random(&mut b);
    u64::from_le_bytes(b)
}

/// Fills `buf` from the OS generator. The OS generator failing is unrecoverable for a
/// security-relevant value, so this aborts loudly rather than continue with weak keys.
pub(crate) fn fill_random(buf: &mut [u8]) {
    getrandom::fill(buf).expect("OS random number generator unavailable");
}

/// HMAC-SHA256 over the concatenation of `parts`.
pub(crate) fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC accepts any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// Constant-time check of a MAC over `parts`.
pub(crate) fn verify_mac(key: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC accepts any key length");
    for p in parts {
        m.update(p);
    }
    m.verify_slice(tag).is_ok()
}

/// The kernel's transparent-huge-page mode, read once: `always`, `madvise` or `never`.
#[cfg(target_os = "linux")]
fn thp_mode() -> &'static str {
    static MODE: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    MODE.get_or_init(|| {
        let s = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        ["always", "madvise", "never"].into_iter().find(|m| s.contains(&format!("[{m}]"))).unwrap_or("never")
    })
}

/// Asks the kernel to back `[addr, addr + len)` with transparent huge pages (`MADV_HUGEPAGE`),
/// best effort. Call it before the first touch of freshly allocated memory whose start is 2 MiB
/// aligned, and [`unadvise_huge_pages`] before the memory goes back to the allocator.
pub(crate) fn advise_huge_pages(addr: usize, len: usize) {
    #[cfg(target_os = "linux")]
    // SAFETY: MADV_HUGEPAGE changes only which page size may back a range, never its contents
    // or validity, and reads or writes no memory. Failure (no THP support, unaligned start)
    // leaves ordinary pages, which is what we had anyway.
    unsafe {
        libc::madvise(addr as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (addr, len);
}

/// Asks the kernel to move `[addr, addr + len)` onto huge pages now (`MADV_COLLAPSE`, Linux
/// 6.1+), best effort: memory the allocator hands out again was usually faulted in as 4 KiB
/// pages by its last owner, and [`advise_huge_pages`] only shapes faults still to come. Costs a
/// copy of each 2 MiB it collapses; ranges already on huge pages are left as they are.
pub(crate) fn collapse_huge_pages(addr: usize, len: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: MADV_COLLAPSE copies a range's contents into huge pages and remaps them in
    // place, so every byte keeps its address and value; it reads or writes no memory the
    // caller can see changed. Failure (older kernel, no free huge page, VM_NOHUGEPAGE) leaves
    // the pages as they were.
    unsafe {
        libc::madvise(addr as *mut libc::c_void, len, libc::MADV_COLLAPSE);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = (addr, len);
}

/// Takes back [`advise_huge_pages`] on `[addr, addr + len)` before the memory is freed: heap
/// memory keeps its advice after `free`, so the application's later allocations there would
/// get huge pages (and pins that cost nothing) it never asked for. Only in the kernel's
/// `madvise` mode, where `MADV_NOHUGEPAGE` is the default behaviour; under `always` it would
/// switch huge pages off, and under `never` there is nothing to undo.
pub(crate) fn unadvise_huge_pages(addr: usize, len: usize) {
    #[cfg(target_os = "linux")]
    if thp_mode() == "madvise" {
        // SAFETY: madvise with MADV_NOHUGEPAGE changes only which page size may back a range,
        // never its contents or validity, whatever the range holds (an unmapped range is an
        // ENOMEM error, ignored); no memory is read or written.
        unsafe {
            libc::madvise(addr as *mut libc::c_void, len, libc::MADV_NOHUGEPAGE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (addr, len);
}

/// Has a listening socket hand connections to `accept` only once data arrived on them, or
/// `secs` seconds passed (`TCP_DEFER_ACCEPT`; Linux), best effort.
pub(crate) fn defer_accept(sock: &impl std::os::fd::AsRawFd, secs: i32) {
    #[cfg(target_os = "linux")]
    // SAFETY: setsockopt reads exactly `size_of::<c_int>()` bytes from a live local integer
    // and changes only the socket's accept behaviour; an error (not a TCP socket) is ignored.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&secs as *const i32).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (sock, secs);
}

/// Sets the congestion control algorithm of `sock` by name (`TCP_CONGESTION`). Linux and
/// FreeBSD choose it per socket; elsewhere the call fails, so the caller's warning says the
/// configured one is not in force rather than the setting vanishing silently.
pub(crate) fn set_congestion(sock: &socket2::SockRef<'_>, name: &str) -> std::io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "freebsd"))]
    return sock.set_tcp_congestion(name.as_bytes());
    #[cfg(not(any(target_os = "linux", target_os = "freebsd")))]
    {
        let _ = (sock, name);
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this system has no per-socket congestion control",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_verifies_only_with_the_same_key_and_data() {
        let t = mac(b"k1k1k1k1k1k1k1k1", &[b"a", b"b"]);
        assert!(verify_mac(b"k1k1k1k1k1k1k1k1", &[b"ab"], &t));
        assert!(!verify_mac(b"k2k2k2k2k2k2k2k2", &[b"ab"], &t));
        assert!(!verify_mac(b"k1k1k1k1k1k1k1k1", &[b"ac"], &t));
        assert!(!verify_mac(b"k1k1k1k1k1k1k1k1", &[b"ab"], &t[..31]));
        assert_ne!(random_u64(), random_u64());
    }
}
