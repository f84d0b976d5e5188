//! The TCP driver's sockets: one per link, its readiness as the driver knows it, and the
//! system calls that move bytes, none of which ever blocks (a socket set up for direct waits is
//! in blocking mode, so every other call passes `MSG_DONTWAIT`).

use std::io::{self, IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use mio::net::TcpStream;
use rustix::net::{RecvAncillaryBuffer, RecvFlags, SendAncillaryBuffer, SendFlags};
use socket2::SockRef;

use crate::config::Config;
use crate::core::peers::LastCommand;
use crate::core::stream::IoVec;
use crate::types::ServiceLevel;

/// Flags that keep a write to a connection the peer closed from raising `SIGPIPE`. Apple
/// systems have no `MSG_NOSIGNAL`; there every socket carries `SO_NOSIGPIPE` instead (socket2,
/// mio and std set it on the sockets they open, and accepted ones inherit it from their
/// listener).
#[cfg(not(target_vendor = "apple"))]
const NO_SIGPIPE: SendFlags = SendFlags::NOSIGNAL;
#[cfg(target_vendor = "apple")]
const NO_SIGPIPE: SendFlags = SendFlags::empty();

/// Frames up to this size are written from one stack buffer: `send` takes a plain buffer
/// where `sendmsg` first copies in a message header and an iovec array.
const SMALL_WRITE: usize = 256;

/// A link's socket and what the driver knows of it.
pub(crate) struct Sock {
    /// Shared so a driver can block in `recv` on it without holding the state lock (see
    /// [`super::TcpBackend::direct_wait`]); registered with epoll by fd.
    pub stream: Arc<TcpStream>,
    pub remote: SocketAddr,
    /// Dialled and not connected yet.
    pub connecting: bool,
    pub readable: bool,
    /// The last read was short: the socket had nothing more at that moment.
    pub drained: bool,
    /// `drained` was set by a direct wait for the turn about to run, so it can be trusted.
    pub drained_fresh: bool,
    /// Set up for direct waits (blocking mode, receive timeout): `None` = not tried yet.
    pub direct: Option<bool>,
    /// epoll reported the peer's FIN (or an error): a short read no longer means drained, the
    /// EOF behind it must be read, or no later edge would ever report it.
    pub hup: bool,
    /// When the application last posted a command to go on this connection (or it was
    /// made): see [`crate::core::peers::IDLE_BEFORE_CHECK`].
    pub last_command: LastCommand,
    /// The socket's receive low-water mark (`SO_RCVLOWAT`) as last set: 1, the kernel's
    /// default, except while a large payload is read (see [`payload_wake_mark`]).
    #[cfg(target_os = "linux")]
    pub wake_mark: usize,
}

impl Sock {
    pub(crate) fn new(stream: TcpStream, remote: SocketAddr, connecting: bool) -> Sock {
        Sock {
            stream: Arc::new(stream),
            remote,
            connecting,
            readable: !connecting,
            drained: false,
            drained_fresh: false,
            direct: None,
            hup: false,
            last_command: LastCommand::new(Instant::now()),
            #[cfg(target_os = "linux")]
            wake_mark: 1,
        }
    }

    /// Has the kernel wake this socket's reader only once `bytes` bytes wait to be read
    /// (`SO_RCVLOWAT`); a system call only when that changes. Linux only: its kernel still
    /// wakes the reader when the receive buffer or the advertised window runs short of the
    /// mark, so a mark the peer cannot reach never stalls the connection. Elsewhere the mark
    /// stays at 1.
    pub(crate) fn set_wake_mark(&mut self, bytes: usize) {
        #[cfg(not(target_os = "linux"))]
        let _ = bytes;
        #[cfg(target_os = "linux")]
        if bytes != self.wake_mark {
            use std::os::fd::AsRawFd;
            let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
            // SAFETY: setsockopt reads exactly `size_of::<c_int>()` bytes from a live local
            // integer and changes only when the socket reports readable.
            let r = unsafe {
                libc::setsockopt(
                    self.stream.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVLOWAT,
                    (&v as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if r == 0 {
                self.wake_mark = bytes;
            }
        }
    }
}

/// Whether the peer closed (or reset) `s`'s connection, by a look at what waits to be read
/// that neither blocks nor takes anything: the reason if it did, `None` while it is open (or
/// has bytes to read, which the driver reads as usual). See
/// [`crate::core::peers::IDLE_BEFORE_CHECK`] for when.
pub(crate) fn closed_while_idle(s: &Sock) -> Option<String> {
    let mut byte = [0u8; 1];
    match rustix::net::recv(&*s.stream, &mut byte[..], RecvFlags::PEEK | RecvFlags::DONTWAIT) {
        Ok((0, _)) => Some("connection closed by peer".into()),
        Ok(_) => None,
        Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::INTR => None,
        Err(e) => Some(format!("read: {}", io::Error::from(e))),
    }
}

/// Payload bytes still due from which a reader waits for more than the next segment.
const PAYLOAD_WAKE_MIN: usize = 64 << 10;
/// The most a reader waits for: a larger mark saves few wake-ups, and every byte waited for is
/// a byte not copied while the rest arrives.
const PAYLOAD_WAKE_MAX: usize = 512 << 10;

/// The receive low-water mark for a connection whose payload, read straight into its
/// destination, still has `due` bytes to come: without one, a reader that drained the socket
/// is woken for every few segments of a large payload, and on loopback the waking is done
/// by the sending CPU. Never more than `due`, so the mark is always reached, and back to 1
/// (every arrival) when the payload is in.
pub(crate) fn payload_wake_mark(due: usize) -> usize {
    if due < PAYLOAD_WAKE_MIN { 1 } else { due.min(PAYLOAD_WAKE_MAX) }
}

/// Socket options for a class: no Nagle delay, buffers (when configured; else the kernel's
/// autotuning), the unsent-bytes limit, congestion control (when configured), the user
/// timeout, DSCP and `SO_PRIORITY`.
pub(crate) fn tune(sock: &SockRef<'_>, cfg: &Config, sl: ServiceLevel, v4: bool) {
    let _ = sock.set_tcp_nodelay(true);
    if let Some(n) = cfg.socket_buffer {
        let _ = sock.set_send_buffer_size(n);
        let _ = sock.set_recv_buffer_size(n);
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Some(n) = cfg.tcp_notsent_lowat {
        let _ = sock.set_tcp_notsent_lowat(u32::try_from(n).unwrap_or(u32::MAX));
    }
    if let Some(cc) = &cfg.tcp_congestion
        && let Err(e) = crate::util::set_congestion(sock, cc)
    {
        // The connection still works under the kernel's default; say why it is not the one asked for.
        tracing::warn!(congestion = %cc, error = %e, "TCP congestion control refused; keeping the kernel's");
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Some(t) = cfg.get_tcp_user_timeout() {
        let _ = sock.set_tcp_user_timeout(Some(t));
    }
    let tos = u32::from(cfg.dscp[sl.index()]) << 2;
    let _ = if v4 { sock.set_tos_v4(tos) } else { sock.set_tclass_v6(tos) };
    // `SO_PRIORITY` (the queueing discipline's band) exists on Linux only; elsewhere the DSCP
    // bits above are all that marks the class.
    #[cfg(target_os = "linux")]
    let _ = sock.set_priority(u32::from(cfg.so_priority[sl.index()]));
}

thread_local! {
    /// Bytes this thread moved through sockets. A progress round compares it before and after,
    /// to tell an adaptive waiter whether the round did work.

    static MOVED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

pub(crate) fn note_moved(n: usize) -> usize {
    MOVED.with(|m| m.set(m.get().wrapping_add(n as u64)));
    n
}

pub(crate) fn moved() -> u64 {
    MOVED.with(std::cell::Cell::get)
}

/// Receives what is there now, whatever the socket's blocking mode (a socket used for direct
/// waits is left in blocking mode).
pub(crate) fn recv_now(sock: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    Ok(note_moved(rustix::net::recv(sock, buf, RecvFlags::DONTWAIT)?.0))
}

/// [`recv_now`] into several buffers at once (one `recv` when there is one).
pub(crate) fn recv_vec_now(sock: &TcpStream, iov: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
    if let [one] = iov {
        return recv_now(sock, one);
    }
    let r = rustix::net::recvmsg(sock, iov, &mut RecvAncillaryBuffer::default(), RecvFlags::DONTWAIT)?;
    Ok(note_moved(r.bytes))
}

/// Like [`send_now`] for one contiguous buffer.
pub(crate) fn send_one_now(sock: &TcpStream, buf: &[u8]) -> io::Result<usize> {
    Ok(note_moved(rustix::net::send(sock, buf, SendFlags::DONTWAIT | NO_SIGPIPE)?))
}

/// Writes what fits now, whatever the socket's blocking mode; never raises `SIGPIPE`. A small
/// gather list is copied into one buffer first.
pub(crate) fn send_now(sock: &TcpStream, iov: &IoVec<'_>) -> io::Result<usize> {
    let slices = iov.slices();
    if let [one] = slices {
        return send_one_now(sock, one);
    }
    if iov.bytes() <= SMALL_WRITE {
        let mut one = [0u8; SMALL_WRITE];
        let mut n = 0;
        for s in slices {
            one[n..n + s.len()].copy_from_slice(s);
            n += s.len();
        }
        return send_one_now(sock, &one[..n]);
    }
    send_vec_now(sock, slices)
}

/// [`send_now`] for two pieces (a header and a payload), without building a gather list.
pub(crate) fn send_pair_now(sock: &TcpStream, a: &[u8], b: &[u8]) -> io::Result<usize> {
    let n = a.len() + b.len();
    if n <= SMALL_WRITE {
        let mut one = [0u8; SMALL_WRITE];
        one[..a.len()].copy_from_slice(a);
        one[a.len()..n].copy_from_slice(b);
        return send_one_now(sock, &one[..n]);
    }
    send_vec_now(sock, &[IoSlice::new(a), IoSlice::new(b)])
}

fn send_vec_now(sock: &TcpStream, iov: &[IoSlice<'_>]) -> io::Result<usize> {
    let flags = SendFlags::DONTWAIT | NO_SIGPIPE;
    Ok(note_moved(rustix::net::sendmsg(sock, iov, &mut SendAncillaryBuffer::default(), flags)?))
}

#[cfg(test)]
mod wake_mark_tests {
    use super::*;

    #[test]
    fn a_payload_mark_waits_for_part_of_what_is_due_and_never_more() {
        assert_eq!(payload_wake_mark(0), 1, "nothing due: every arrival");
        assert_eq!(payload_wake_mark(PAYLOAD_WAKE_MIN - 1), 1, "a small rest: every arrival");
        assert_eq!(payload_wake_mark(PAYLOAD_WAKE_MIN), PAYLOAD_WAKE_MIN);
        assert_eq!(payload_wake_mark(300 << 10), 300 << 10, "all of a rest below the cap");
        assert_eq!(payload_wake_mark(64 << 20), PAYLOAD_WAKE_MAX);
        for due in (0..8 << 20).step_by(4093) {
            assert!(payload_wake_mark(due) <= due.max(1), "a mark the payload cannot reach: {due}");
        }
    }
}

#[cfg(test)]
mod tune_tests {
    use super::*;

    /// A connected loopback pair of std sockets.
    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (a, l.accept().unwrap().0)
    }

    #[test]
    fn socket_buffers_are_left_to_the_kernel_unless_configured() {
        let (untouched, _p1) = pair();
        let (auto, _p2) = pair();
        let (fixed, _p3) = pair();
        let sizes = |s: &std::net::TcpStream| {
            let r = SockRef::from(s);
            (r.recv_buffer_size().unwrap(), r.send_buffer_size().unwrap())
        };
        let default = sizes(&untouched);
        tune(&SockRef::from(&auto), &Config::default(), ServiceLevel::Bulk, true);
        // Setting a buffer size at all locks it (no autotuning); the default must not.
        assert_eq!(sizes(&auto), default);
        tune(&SockRef::from(&fixed), &Config::default().socket_buffer(256 << 10), ServiceLevel::Bulk, true);
        let (rcv, snd) = sizes(&fixed);
        assert!(rcv != default.0 && snd != default.1, "fixed {:?}, default {default:?}", (rcv, snd));
    }

    /// Unsent bytes are limited by default; the limit can be set or left to the kernel.
    #[cfg(target_os = "linux")]
    #[test]
    fn unsent_bytes_are_limited_unless_left_to_the_kernel() {
        let lowat = |s: &std::net::TcpStream| SockRef::from(s).tcp_notsent_lowat().unwrap();
        let (untouched, _p1) = pair();
        let kernels = lowat(&untouched);
        let tuned = |cfg: &Config| {
            let (s, p) = pair();
            tune(&SockRef::from(&s), cfg, ServiceLevel::Bulk, true);
            (lowat(&s), p)
        };
        let default = Config::default().get_tcp_notsent_lowat().unwrap();
        assert_eq!(tuned(&Config::default()).0 as usize, default);
        assert_ne!(default as u32, kernels, "the default must differ from the kernel's to be seen");
        assert_eq!(tuned(&Config::default().tcp_notsent_lowat(Some(16 << 10))).0, 16 << 10);
        assert_eq!(tuned(&Config::default().tcp_notsent_lowat(None)).0, kernels);
        assert_eq!(tuned(&Config::default().tcp_notsent_lowat(Some(usize::MAX))).0, u32::MAX);
    }

    /// Connections drop a peer that takes nothing after the stall timeout unless configured
    /// otherwise: the TCP user timeout follows the stall timeout, a configured one, or none.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_user_timeout_is_the_stall_timeout_unless_configured() {
        use std::time::Duration;
        let user_timeout = |cfg: &Config| {
            let (s, _p) = pair();
            tune(&SockRef::from(&s), cfg, ServiceLevel::Bulk, true);
            SockRef::from(&s).tcp_user_timeout().unwrap()
        };
        let (untouched, _p) = pair();
        assert_eq!(SockRef::from(&untouched).tcp_user_timeout().unwrap(), None, "the kernel's: none");
        let stall = Duration::from_secs(7);
        assert_eq!(user_timeout(&Config::default().stall_timeout(stall)), Some(stall));
        let set = Config::default().tcp_user_timeout(Some(Duration::from_secs(3)));
        assert_eq!(user_timeout(&set), Some(Duration::from_secs(3)));
        assert_eq!(user_timeout(&Config::default().tcp_user_timeout(None)), None);
    }

    /// The congestion control is the kernel's unless configured; a configured one is set on the
    /// socket, and one the kernel refuses leaves the kernel's in place.
    #[cfg(target_os = "linux")]
    #[test]
    fn accepted_connections_start_with_the_configured_congestion_control() {
        // Only meaningful with one other than the kernel's default to ask for.
        let read = |f: &str| std::fs::read_to_string(format!("/proc/sys/net/ipv4/{f}")).unwrap_or_default();
        let default = read("tcp_congestion_control").trim().to_string();
        let Some(other) = read("tcp_allowed_congestion_control")
            .split_whitespace()
            .find(|c| *c != default)
            .map(str::to_string)
        else {
            eprintln!("skipped: no congestion control other than the kernel's ({default}) is allowed");
            return;
        };
        let cc = |s: &std::net::TcpStream| {
            let name = SockRef::from(s).tcp_congestion().unwrap();
            String::from_utf8(name).unwrap().trim_end_matches('\0').to_string()
        };
        let sa: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let plain =
            std::net::TcpListener::from(crate::sockets::listener_socket(sa, &Config::default()).unwrap());
        let set = std::net::TcpListener::from(
            crate::sockets::listener_socket(sa, &Config::default().tcp_congestion(&*other)).unwrap(),
        );
        for (l, want) in [(&plain, &default), (&set, &other)] {
            let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let accepted = loop {
                match l.accept() {
                    Ok((a, _)) => break a,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                    Err(e) => panic!("{e}"),
                }
            };
            assert_eq!(&cc(&accepted), want, "as accepted, before any tuning");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn congestion_control_is_the_kernels_unless_configured() {
        let cc =
            |s: &std::net::TcpStream| String::from_utf8(SockRef::from(s).tcp_congestion().unwrap()).unwrap();
        let (untouched, _p1) = pair();
        let kernels = cc(&untouched);
        let (plain, _p2) = pair();
        tune(&SockRef::from(&plain), &Config::default(), ServiceLevel::Bulk, true);
        assert_eq!(cc(&plain), kernels);
        // reno is always built in and always allowed, so it is never refused; pick the one of
        // reno and cubic that is not the kernel's default, so the test sees a change.
        let want = if kernels.trim_end_matches('\0') == "reno" { "cubic" } else { "reno" };
        let (set, _p3) = pair();
        tune(&SockRef::from(&set), &Config::default().tcp_congestion(want), ServiceLevel::Bulk, true);
        let got = cc(&set);
        if want == "reno" || got.trim_end_matches('\0') == want {
            assert_eq!(got.trim_end_matches('\0'), want);
        }
        let (refused, _p4) = pair();
        tune(
            &SockRef::from(&refused),
            &Config::default().tcp_congestion("no-such-cc"),
            ServiceLevel::Bulk,
            true,
        );
        assert_eq!(cc(&refused), kernels, "a refused name keeps the kernel's choice");
    }
}

#[cfg(test)]
mod recv_tests {
    use super::*;
    use crate::core::stream::RecvIov;
    use crate::core::stream::link::tests::list_op;
    use crate::core::stream::link::{Sink, sink_slices};
    use std::io::Write;

    #[test]
    fn a_direct_read_fills_every_segment_of_a_scatter_list_in_one_call() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let rx = TcpStream::from_std(l.accept().unwrap().0);
        let (seg, n, at) = (4096, 4, 1000);
        let data: Vec<u8> = (0..seg * n - at).map(|i| (i % 251) as u8).collect();
        tx.write_all(&data).unwrap();
        let (id, mut ops) = list_op(n, seg);
        let mut sink = Sink::Op { op: id, base: 0 };
        // Everything sent is readable once a blocking peek sees the last byte.
        let mut probe = vec![0u8; data.len()];
        while rustix::net::recv(&rx, &mut probe, RecvFlags::PEEK).unwrap().0 < data.len() {}
        let got = {
            let mut iov = RecvIov::new();
            sink_slices(&mut sink, at, data.len(), &mut ops, &mut iov);
            assert_eq!(iov.len(), n, "one iovec per segment from the one holding the offset");
            recv_vec_now(&rx, &mut iov).unwrap()
        };
        assert_eq!(got, data.len(), "one call read across every segment");
    }
}
