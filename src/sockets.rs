//! The TCP sockets both drivers open (listeners, non-blocking dials, bounded accept rounds)
//! and the poller wait they share. The TCP backend carries its messages on these sockets; the
//! InfiniBand engine its side channels.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Poll};
use socket2::{Domain, Protocol, SockRef, Socket, Type};

use crate::config::Config;

use crate::admission::ACCEPTS_PER_ROUND;

/// Starts a non-blocking connect to `sa`; `tune` sets socket options before the connect
/// (those that shape the handshake, such as buffer sizes, must be set first). The connection
/// completes (or fails) later, reported by the poller as writable.
pub(crate) fn dial(sa: SocketAddr, tune: impl FnOnce(&Socket)) -> io::Result<TcpStream> {
    let sock = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP))?;
    tune(&sock);
    sock.set_nonblocking(true)?;
    match sock.connect(&sa.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) || e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) => return Err(e),
    }
    Ok(TcpStream::from_std(sock.into()))
}

/// A non-blocking listening socket on `sa`. Accepted connections start with the listener's
/// congestion control: set only on each accepted socket, they would start under the kernel's
/// and switch at the handshake. A socket that started under BBR here stayed slow after
/// switching to reno (likely the kernel's internal pacing, which BBR turns on and nothing turns
/// off): stripefs's E1 reads gained 16 % from reno set per accepted socket, 1.4× from reno
/// set on the listener (`benchmarks/journal/e1-io-servers-on-reno-and-listeners-that-set-it.md`).
///
/// Connections are handed to `accept` only once their first bytes arrived
/// (`TCP_DEFER_ACCEPT`): a client sends its hello at once, while a socket that stays silent
/// waits in the kernel and reaches us later than every client that talks. Handshake admission
/// then sheds silent connections first, so a flood of them cannot crowd out a client whose
/// hello has not been read yet. The TCP transport and the InfiniBand side
/// channel listen on it.
pub(crate) fn listener_socket(sa: SocketAddr, cfg: &Config) -> io::Result<Socket> {
    let sock = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    sock.set_nonblocking(true)?;
    sock.bind(&sa.into())?;
    crate::util::defer_accept(&sock, 1);
    if let Some(cc) = &cfg.tcp_congestion
        && let Err(e) = crate::util::set_congestion(&SockRef::from(&sock), cc)
    {
        tracing::warn!(congestion = %cc, error = %e, "TCP congestion control refused; keeping the kernel's");
    }
    sock.listen(1024)?;
    Ok(sock)
}

/// Accepts what the listener holds, at most [`ACCEPTS_PER_ROUND`] connections: an unbounded
/// accept loop under a connection flood would starve every established peer. Returns the
/// connections (with `TCP_NODELAY` set) and whether more may be waiting — the poller reports
/// no new edge for those, so the caller must come back next round.
pub(crate) fn accept_round(listener: &TcpListener) -> (Vec<(TcpStream, SocketAddr)>, bool) {
    let mut got = Vec::new();
    for _ in 0..ACCEPTS_PER_ROUND {
        match listener.accept() {
            Ok((sock, remote)) => {
                let _ = sock.set_nodelay(true);
                got.push((sock, remote));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return (got, false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                return (got, false);
            }
        }
    }
    (got, true)
}

/// A duplicate of `poll`'s descriptor (an epoll instance on Linux, a kqueue elsewhere): the
/// same instance, owned apart from the `Poll` so an event loop can wait on it while the driver
/// keeps using the `Poll`.
pub(crate) fn epoll_fd(poll: &Poll) -> io::Result<OwnedFd> {
    // SAFETY: `poll` owns this descriptor and outlives the borrow, which ends in this call.
    let fd = unsafe { BorrowedFd::borrow_raw(poll.as_raw_fd()) };
    fd.try_clone_to_owned()
}

/// One wait in the poller, at most `timeout`. While it may block, `blocked` is up, so that a
/// thread posting meanwhile writes its frames itself rather than leave them to a driver asleep
/// here; `pending` is asked once the flag is up, for work posted just before it, and then the
/// wait does not block. An interrupted wait is an early return, not an error.
pub(crate) fn wait(
    poll: &mut Poll,
    events: &mut Events,
    mut timeout: Duration,
    blocked: &AtomicBool,
    pending: impl FnOnce() -> bool,
) -> io::Result<()> {
    let blocking = !timeout.is_zero();
    if blocking {
        blocked.store(true, Ordering::Release);
        if pending() {
            timeout = Duration::ZERO;
        }
    }
    let r = poll.poll(events, Some(timeout));
    if blocking {
        blocked.store(false, Ordering::Release);
    }
    match r {
        Err(e) if e.kind() != io::ErrorKind::Interrupted => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_accept_round_takes_at_most_its_share_and_says_when_more_wait() {
        let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        // A blocking connect returns once the handshake is done: on loopback the connection
        // is then in the listener's queue.
        let n = ACCEPTS_PER_ROUND + 3;
        let _clients: Vec<_> = (0..n).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        let (first, more) = accept_round(&l);
        assert_eq!((first.len(), more), (ACCEPTS_PER_ROUND, true));
        let (rest, more) = accept_round(&l);
        assert_eq!((rest.len(), more), (3, false));
    }
}
