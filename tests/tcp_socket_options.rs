//! The TCP transport's configured socket options reach the connections it dials and the ones
//! it accepts. One test in this binary: it inspects every socket the process holds.
#![cfg(target_os = "linux")]

use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, RawFd};
use std::time::Duration;

use bytes::Bytes;
use ionet::{Config, Endpoint, Payload, ServiceLevel};
use socket2::SockRef;

const LONG: Duration = Duration::from_secs(10);

/// `(local, peer, unsent-bytes limit)` of every connected TCP socket of this process.
fn tcp_connections() -> Vec<(SocketAddr, SocketAddr, u32)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let entry = entry.unwrap();
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<RawFd>() else { continue };
        let is_socket =
            std::fs::read_link(entry.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        // SAFETY: the descriptor is one of this process's open sockets (just listed), and the
        // endpoints that own it stay alive, and no other test runs in this binary, for as long
        // as the borrow is used: nothing closes it meanwhile.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let s = SockRef::from(&fd);
        let (Ok(local), Ok(peer)) = (s.local_addr(), s.peer_addr()) else { continue };
        let (Some(local), Some(peer)) = (local.as_socket(), peer.as_socket()) else { continue };
        if let Ok(lowat) = s.tcp_notsent_lowat() {
            out.push((local, peer, lowat));
        }
    }
    out
}

#[test]
fn dialled_and_accepted_connections_carry_the_configured_unsent_limit() {
    let limit = 24 << 10;
    let cfg = || Config::default().progress_thread(true).tcp_notsent_lowat(Some(limit));
    let srv = Endpoint::bind("tcp://127.0.0.1:0", cfg()).unwrap();
    let port = srv.local_addr().unwrap().port();
    let cli = Endpoint::client(cfg()).unwrap();
    let peer = cli.connect(srv.local_addr().unwrap()).unwrap();
    // A request and its reply on every service level, so each level's connection exists and
    // the server has classified each one it accepted.
    for sl in [ServiceLevel::Control, ServiceLevel::Normal, ServiceLevel::Bulk] {
        let op = cli.request(peer, 1, Bytes::from_static(b"hi"), Payload::None, sl).unwrap();
        let req = srv.next_request(Some(LONG)).unwrap().expect("a request");
        req.reply(Bytes::new()).unwrap();
        cli.wait_timeout(op, LONG).unwrap().expect("answered").result.unwrap();
    }
    let ours: Vec<_> =
        tcp_connections().into_iter().filter(|(l, p, _)| l.port() == port || p.port() == port).collect();
    let dialled = ours.iter().filter(|(_, p, _)| p.port() == port).count();
    let accepted = ours.iter().filter(|(l, _, _)| l.port() == port).count();
    assert!(dialled >= 1 && accepted >= 1, "both ends of the connections: {ours:?}");
    assert!(ours.iter().all(|&(_, _, l)| l == limit as u32), "every connection carries the limit: {ours:?}");
}
