//! Regression tests for bugs the fuzz targets found, each reproduced deterministically.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use ionet::internals::wire::{HEADER_LEN, Header, Kind};
use ionet::*;

const T: Duration = Duration::from_secs(20);

/// A keyless handshake over a raw socket; returns once the server said READY.
fn handshake(s: &mut TcpStream, eid: u64) {
    let mut h = Header::new(Kind::Hello, ServiceLevel::Normal);
    h.a = eid;
    h.len = 46;
    let mut v = h.encode().to_vec();
    v.extend_from_slice(&[0u8; 34]);
    v.extend_from_slice(&16384u32.to_le_bytes());
    v.extend_from_slice(&(64u64 << 20).to_le_bytes());
    s.write_all(&v).unwrap();
    let read_frame = |s: &mut TcpStream| {
        let mut head = [0u8; HEADER_LEN];
        s.read_exact(&mut head).unwrap();
        let h = Header::decode(&head).unwrap();
        let mut body = vec![0u8; h.len as usize];
        s.read_exact(&mut body).unwrap();
        h
    };
    assert_eq!(read_frame(s).kind, Kind::HelloAck);
    let mut auth = Header::new(Kind::Auth, ServiceLevel::Normal);
    auth.a = eid;
    s.write_all(&auth.encode()).unwrap();
    assert_eq!(read_frame(s).kind, Kind::Ready);
}

/// Found by `tcp_session` (every run whose bytes ended mid-frame took 5 s): when a peer's last
/// bytes and its FIN arrived in one epoll edge, the short read that took the bytes was trusted
/// to mean "socket drained", the read that would have returned EOF was skipped, and with
/// edge-triggered polling no second edge ever came. The peer was never noticed gone: its
/// connection, and every operation waiting on it, stayed until the kernel gave up on it.
///
/// The server drives no progress while the client writes and closes, so both land in one
/// edge; then the server must notice the loss.
#[test]
fn tcp_eof_behind_a_partial_frame_is_noticed() {
    // A frame announcing a body of `len` bytes, of which only `sent` follow.
    let partial_body = |len: u32, sent: usize| {
        let mut h = Header::new(Kind::Unexpected, ServiceLevel::Normal);
        h.len = len;
        let mut v = h.encode().to_vec();
        v.resize(HEADER_LEN + sent, 7);
        v
    };
    for (name, tail) in [
        ("partial header", Header::new(Kind::Eager, ServiceLevel::Normal).encode()[..35].to_vec()),
        ("whole frame", Header::new(Kind::Unexpected, ServiceLevel::Normal).encode().to_vec()),
        // The body's staged bytes are consumed and the short read that brought them is taken
        // for "drained": the payload path must not skip the EOF read either.
        ("partial small body", partial_body(100, 10)),
    ] {
        let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default().wait_mode(WaitMode::Block)).unwrap();
        let sa = srv.local_addr().unwrap().resolve().unwrap()[0];
        let mut s = TcpStream::connect(sa).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        // The server must drive for the handshake: do it from a thread while we talk.
        let drive = srv.clone();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let driver = std::thread::spawn(move || {
            while !stop2.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = drive.wait_any(Some(Duration::from_millis(5)));
            }
        });
        handshake(&mut s, 0x5eed);
        // Nobody drives the server while the last bytes and the FIN go out.
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        driver.join().unwrap();
        s.write_all(&tail).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let lost_before = srv.info().counters.peers_lost;
        let start = Instant::now();
        while srv.info().counters.peers_lost == lost_before {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{name}: the server never noticed the peer left"
            );
            let _ = srv.recv_unexpected(Some(Duration::from_millis(50)));
        }
        // And it closed its side.
        let mut sink = [0u8; 64];
        assert!(matches!(s.read(&mut sink), Ok(0) | Err(_)), "{name}");
    }
}

/// The same EOF behind a peer's last bytes, met by a driver in Block mode with one quiet
/// connection: it waits in a blocking `recv` on the socket itself (no epoll edge is consumed),
/// so the bytes and the FIN may come back from that `recv`. Whatever follows the read (the
/// next direct `recv` returning 0, or epoll's pending edge, which reports the FIN), the loss
/// must be noticed, and the whole frame that came before it delivered. (`strace -f` shows both:
/// a blocking `recvfrom` returning the frame and then 0, and one returning the frame with the
/// tail followed by an epoll round with `EPOLLRDHUP`.)
#[test]
fn tcp_eof_behind_data_read_by_a_direct_wait_is_noticed() {
    let mut partial = Header::new(Kind::Unexpected, ServiceLevel::Normal);
    partial.len = 100;
    for (name, tail) in [
        ("nothing", Vec::new()),
        ("partial header", partial.encode()[..20].to_vec()),
        ("partial body", [&partial.encode()[..], &[7u8; 10]].concat()),
    ] {
        let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default().wait_mode(WaitMode::Block)).unwrap();
        let sa = srv.local_addr().unwrap().resolve().unwrap()[0];
        let mut s = TcpStream::connect(sa).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        // One driver, always blocked long enough for direct waits (a lone ready connection).
        let drive = srv.clone();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let driver = std::thread::spawn(move || {
            let mut got = Vec::new();
            while !stop2.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(Some(u)) = drive.recv_unexpected(Some(Duration::from_millis(200))) {
                    got.push(u.data);
                }
            }
            got
        });
        handshake(&mut s, 0x5eed);
        // A whole frame first (it ends any idle spell of the direct waits), then the tail and
        // the FIN straight behind it.
        let mut whole = Header::new(Kind::Unexpected, ServiceLevel::Normal);
        whole.len = 3;
        s.write_all(&[&whole.encode()[..], b"abc"].concat()).unwrap();
        s.write_all(&tail).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let start = Instant::now();
        while srv.info().counters.peers_lost == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{name}: the server never noticed the peer left"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let got = driver.join().unwrap();
        assert_eq!(got, [&b"abc"[..]], "{name}: the whole frame before the EOF is delivered");
        let mut sink = [0u8; 64];
        assert!(matches!(s.read(&mut sink), Ok(0) | Err(_)), "{name}");
    }
}
