//! Helpers shared by the integration tests.

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

/// This process's resident memory (`VmRSS`), in KiB. Process-wide, as [`vm_locked_kib`].
pub fn vm_rss_kib() -> u64 {
    status_kib("VmRSS:")
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

/// Whether transparent huge pages are in `madvise` mode, the mode the huge-page advice tests
/// need; prints why the calling test is skipped when not.
pub fn thp_in_madvise_mode() -> bool {
    let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let ok = mode.contains("[madvise]");
    if !ok {
        println!("skipped: transparent huge pages are not in madvise mode here ({})", mode.trim());
    }
    ok
}

/// The `smaps` fields of this process's mapping that contains `addr`: its `AnonHugePages` in
/// KiB and its `VmFlags` (`hg`: advised for huge pages).
pub fn smaps_of(addr: usize) -> Option<(u64, String)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let (mut inside, mut huge) = (false, 0);
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((a, b)) = range.split_once('-')
            && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
        {
            inside = a <= addr && addr < b;
            continue;
        }
        if !inside {
            continue;
        }
        if let Some(v) = line.strip_prefix("AnonHugePages:") {
            huge = v.trim().trim_end_matches("kB").trim().parse().ok()?;
        } else if let Some(flags) = line.strip_prefix("VmFlags:") {
            return Some((huge, flags.trim().to_string()));
        }
    }
    None
}

/// Makes malloc serve large blocks from the heap and keep freed memory mapped, as a
/// long-running process's malloc ends up doing once its mmap threshold has grown. Changes the
/// whole process: only for a test binary whose tests all expect it.
pub fn heap_serves_large_blocks() {
    // SAFETY: mallopt only changes allocator tuning; other threads' allocations stay valid
    // under either setting.
    unsafe {
        assert_eq!(libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20), 1);
        assert_eq!(libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20), 1);
    }
}

/// A raw TCP connection to `addr` whose receive buffer is `recv_buffer` bytes, so that its
/// kernel takes little of what the server sends while the test reads nothing.
pub fn raw_connect_small_window(addr: std::net::SocketAddr, recv_buffer: usize) -> std::net::TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(recv_buffer).unwrap();
    sock.connect(&addr.into()).unwrap();
    std::net::TcpStream::from(sock)
}

/// Plays a keyless client's side of the TCP handshake on a raw socket: HELLO, then AUTH once
/// the server's HELLO_ACK is in, then the server's READY.
pub fn raw_hello(sock: &mut std::net::TcpStream) {
    raw_hello_as(sock, 42)
}

/// [`raw_hello`] as the endpoint with id `eid`.
pub fn raw_hello_as(sock: &mut std::net::TcpStream, eid: u64) {
    use ionet::ServiceLevel;
    use ionet::internals::wire::{Header, Kind};
    use std::io::{Read, Write};
    let mut h = Header::new(Kind::Hello, ServiceLevel::Normal);
    h.a = eid;
    h.len = 46;
    sock.write_all(&h.encode()).unwrap();
    sock.write_all(&[0u8; 46]).unwrap();
    let mut ack = [0u8; 40];
    sock.read_exact(&mut ack).unwrap();
    let ack = Header::decode(&ack).unwrap();
    assert_eq!(ack.kind, Kind::HelloAck);
    let mut body = vec![0u8; ack.len as usize];
    sock.read_exact(&mut body).unwrap();
    let mut auth = Header::new(Kind::Auth, ServiceLevel::Normal);
    auth.a = eid;
    sock.write_all(&auth.encode()).unwrap();
    let mut ready = [0u8; 40];
    sock.read_exact(&mut ready).unwrap();
    assert_eq!(Header::decode(&ready).unwrap().kind, Kind::Ready);
}

/// Reads from a raw connection until the server closes it (EOF or reset); panics, naming
/// `what`, if it still sends after the test's patience (`patience`) ran out.
pub fn read_until_closed(sock: &mut std::net::TcpStream, patience: std::time::Duration, what: &str) {
    use std::io::Read;
    let mut sink = [0u8; 64];
    let start = std::time::Instant::now();
    loop {
        match sock.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => assert!(start.elapsed() < patience, "{what}: the server kept the connection"),
        }
    }
}
