//! The TCP sockets both drivers open: non-blocking dials and bounded accept rounds. The TCP
//! backend carries its messages on them; the InfiniBand engine its side channels.

use std::io;
use std::net::SocketAddr;

use mio::net::{TcpListener, TcpStream};
use socket2::{Domain, Protocol, Socket, Type};

use crate::admission::ACCEPTS_PER_ROUND;
use crate::error::{Error, Result};
use crate::types::PeerId;

/// Starts a non-blocking connect to `sa` for `peer`; `tune` sets socket options before the
/// connect (those that shape the handshake, such as buffer sizes, must be set first). The
/// connection completes (or fails) later, reported by the poller as writable.
pub(crate) fn dial(peer: PeerId, sa: SocketAddr, tune: impl FnOnce(&Socket)) -> Result<TcpStream> {
    let sock = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP))?;
    tune(&sock);
    sock.set_nonblocking(true)?;
    match sock.connect(&sa.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) || e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) => return Err(Error::PeerLost { peer, reason: format!("connect to {sa}: {e}") }),
    }
    Ok(TcpStream::from_std(sock.into()))
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
