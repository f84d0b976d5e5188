//! Helpers shared by the InfiniBand integration tests.

// Each test binary uses only some of them.
#![allow(dead_code)]

/// This process's locked memory (`VmLck`), in KiB. Process-wide: a test reading it must be the
/// only test in its binary.
pub fn vm_locked_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmLck")
}

/// `len` deterministic pseudo-random bytes for `seed` (xorshift64), so a test can check every
/// byte a transfer delivered.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}
