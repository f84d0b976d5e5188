//! While a large payload is read straight into its buffer, the receiving socket wakes its
//! reader only once a good part of the rest has arrived (its receive low-water mark), and once
//! the payload is in, again for every arrival. The byte timing is forced with a raw client.
//! One test in this binary: it inspects the sockets the process holds.
#![cfg(target_os = "linux")]

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::raw_hello_as;
use ionet::internals::wire::{Header, Kind};
use ionet::*;
use socket2::SockRef;

mod common;

const T: Duration = Duration::from_secs(20);

/// `SO_RCVLOWAT` of this process's TCP socket connected to `peer`.
fn wake_mark_of_socket_to(peer: SocketAddr) -> i32 {
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let entry = entry.unwrap();
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<RawFd>() else { continue };
        if !std::fs::read_link(entry.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:")) {
            continue;
        }
        // SAFETY: the descriptor is one of this process's open sockets (just listed); the
        // endpoint that owns it stays alive, and no other test runs in this binary, for as long
        // as the borrow is used, so nothing closes it meanwhile.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        if SockRef::from(&fd).peer_addr().ok().and_then(|a| a.as_socket()) != Some(peer) {
            continue;
        }
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into the live local `v`.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0, "getsockopt(SO_RCVLOWAT)");
        return v;
    }
    panic!("no socket of this process is connected to {peer}");
}

fn frame(kind: Kind, tag: u64, len: usize) -> [u8; 40] {
    let mut h = Header::new(kind, ServiceLevel::Normal);
    h.a = tag;
    h.len = len as u32;
    h.encode()
}

#[test]
fn a_large_body_raises_the_wake_mark_until_it_is_in() {
    // Blocking waits with two connections: reads follow readiness edges only (a busy-polling
    // driver retries reads every round, and with one connection a blocking driver reads the
    // socket directly, taking what is there whatever the mark), so a mark left raised would
    // leave the last frame unread.
    let len = 1 << 20;
    let cfg = Config::default().wait_mode(WaitMode::Block).eager_limit(len);
    let srv = Endpoint::bind("tcp://127.0.0.1:0", cfg).unwrap();
    let sa = srv.local_addr().unwrap().resolve().unwrap()[0];
    let connect = |eid: u64| {
        let mut s = TcpStream::connect(sa).unwrap();
        s.set_nodelay(true).unwrap();
        let hs = std::thread::spawn(move || {
            raw_hello_as(&mut s, eid);
            s
        });
        loop {
            let _ = srv.recv_unexpected(Some(Duration::from_millis(10))).unwrap();
            if hs.is_finished() {
                break hs.join().unwrap();
            }
        }
    };
    let mut s = connect(42);
    let _other = connect(43);
    let raw = s.local_addr().unwrap();
    s.write_all(&frame(Kind::Unexpected, 0, 2)).unwrap();
    s.write_all(b"hi").unwrap();
    let peer = srv.recv_unexpected(Some(T)).unwrap().expect("hello message").peer;
    assert_eq!(wake_mark_of_socket_to(raw), 1, "between frames, every arrival wakes the reader");

    let big = srv.recv(peer, 1, BytesMut::zeroed(len)).unwrap();
    let small = srv.recv(peer, 2, BytesMut::zeroed(4)).unwrap();
    // The header and the first 32 KiB of the body (within the first receive window, so the
    // write does not wait for the server): read, and the socket drained mid-body.
    let first = 32 << 10;
    s.write_all(&frame(Kind::Eager, 1, len)).unwrap();
    s.write_all(&vec![7u8; first]).unwrap();
    let start = Instant::now();
    let mark = loop {
        assert!(srv.wait_timeout(big, Duration::from_millis(10)).unwrap().is_none(), "half a body");
        let m = wake_mark_of_socket_to(raw);
        if m != 1 || start.elapsed() > T {
            break m;
        }
    };
    assert_eq!(mark, 512 << 10, "the reader waits for part of the {} bytes still due", len - first);

    // The rest of the body, written from another thread (it outgrows the receive window).
    let writer = std::thread::spawn(move || {
        s.write_all(&vec![7u8; len - first]).unwrap();
        s
    });
    let c = srv.wait_timeout(big, T).unwrap().expect("the whole body");
    let body = c.data().expect("the body, not an error");
    assert_eq!(body.len(), len);
    assert!(body.iter().all(|&b| b == 7));
    let mut s = writer.join().unwrap();
    assert_eq!(wake_mark_of_socket_to(raw), 1, "with the body in, every arrival wakes the reader again");

    // A frame far smaller than the mark was: it must still be read.
    s.write_all(&frame(Kind::Eager, 2, 4)).unwrap();
    s.write_all(b"next").unwrap();
    let c = srv.wait_timeout(small, T).unwrap().expect("the small frame after the body was left unread");
    assert_eq!(&c.data().unwrap()[..], b"next");
}
