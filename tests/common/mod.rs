//! Helpers shared by the InfiniBand integration tests.

// Each test binary uses only some of them.
#![allow(dead_code)]

/// This process's locked memory (`VmLck`), in KiB. Process-wide: a test reading it must be the
/// only test in its binary.
pub fn vm_locked_kib() -> u64 {
    status_kib("VmLck:")
}

/// This process's long-term pinned memory (`VmPin`: io_uring fixed buffers, RDMA MRs), in
/// KiB. Process-wide, as [`vm_locked_kib`].
pub fn vm_pin_kib() -> u64 {
    status_kib("VmPin:")
}

/// Memory held by software-provider registrations however they pin it (`VmLck` + `VmPin`).
pub fn vm_held_kib() -> u64 {
    vm_locked_kib() + vm_pin_kib()
}

fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("status");
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
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
