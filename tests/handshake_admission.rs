//! Unauthenticated connections cannot lock clients out of a listener: every connection in its
//! handshake has one short deadline, one IP address holds a bounded number of handshake slots,
//! and when slots run out the oldest silent connection is shed instead of the new one being
//! refused. A client that is refused during the handshake says so, naming the server.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ionet::internals::wire::{HEADER_LEN, Header, Kind};
use ionet::*;
use socket2::{Domain, Socket, Type};

const T: Duration = Duration::from_secs(30);

fn server(scheme: &str, cfg: Config) -> Endpoint {
    Endpoint::bind(format!("{scheme}://127.0.0.1:0"), cfg.progress_thread(true)).unwrap()
}

fn sockaddr(ep: &Endpoint) -> SocketAddr {
    ep.local_addr().unwrap().resolve().unwrap()[0]
}

/// A TCP connection to `to` from the loopback address `from` (any of 127.0.0.0/8).
fn connect_from(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::new(IpAddr::V4(from), 0).into()).unwrap();
    s.connect(&to.into()).unwrap();
    s.into()
}

/// Whether the server closed (or reset) the connection; waits up to `wait` for it to.
fn closed_within(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut b = [0u8; 256];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue, // a refusal frame before the close
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return false,
            Err(_) => return true,
        }
    }
}

fn still_open(s: &mut TcpStream) -> bool {
    !closed_within(s, Duration::from_millis(1))
}

/// `n` connections from 127.0.0.1 that never send a byte, each replaced as soon as the server
/// drops it, until the flood is stopped: how a hostile host holds a listener's handshake slots.
struct Flood {
    stop: Arc<AtomicBool>,
    replaced: Arc<AtomicUsize>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Flood {
    fn start(to: SocketAddr, n: usize) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let replaced = Arc::new(AtomicUsize::new(0));
        let (st, rep) = (stop.clone(), replaced.clone());
        let mut socks: Vec<TcpStream> = (0..n).map(|_| TcpStream::connect(to).unwrap()).collect();
        for s in &socks {
            s.set_nonblocking(true).unwrap();
        }
        let thread = thread::spawn(move || {
            let mut b = [0u8; 64];
            while !st.load(Ordering::Relaxed) {
                for s in socks.iter_mut() {
                    let dead = match s.read(&mut b) {
                        Ok(_) => true,
                        Err(e) => e.kind() != ErrorKind::WouldBlock,
                    };
                    if dead && let Ok(fresh) = TcpStream::connect(to) {
                        fresh.set_nonblocking(true).unwrap();
                        *s = fresh;
                        rep.fetch_add(1, Ordering::Relaxed);
                    }
                }
                thread::sleep(Duration::from_millis(1));
            }
        });
        Flood { stop, replaced, thread: Some(thread) }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One request and its reply from a fresh client endpoint: a new connection and handshake.
fn round_trip(srv_addr: &Address, expect: &[u8]) -> Result<()> {
    let cli = Endpoint::client(Config::default()).unwrap();
    let p = cli.connect(srv_addr)?;
    let op = cli.request(p, 1, Bytes::copy_from_slice(expect), Payload::None, ServiceLevel::Normal)?;
    let c = cli.wait_timeout(op, T)?.expect("an answer within the test's bound");
    let reply = c.ok()?.reply.unwrap_or_default();
    assert_eq!(&reply[..], expect);
    Ok(())
}

/// 200 idle sockets, refilled as the server drops them, do not keep clients out: fresh
/// clients connect and are served throughout, with the listener's default limits.
fn idle_sockets_do_not_lock_clients_out(scheme: &str) {
    let srv = server(scheme, Config::default());
    let addr = srv.local_addr().unwrap();
    let flood = Flood::start(sockaddr(&srv), 200);
    // The flood holds every slot one address may (the kernel hands silent sockets over late).
    let start = Instant::now();
    while srv.info().gauges.handshakes < 32 {
        assert!(start.elapsed() < T, "the flood never reached the per-source limit");
        thread::sleep(Duration::from_millis(10));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let echo = {
        let (srv, stop) = (srv.clone(), stop.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(r) = srv.next_request(Some(Duration::from_millis(50))).unwrap() {
                    let h = Bytes::copy_from_slice(r.header());
                    let _ = srv.wait(r.reply(h).unwrap());
                }
            }
        })
    };
    for i in 0..20u8 {
        if let Err(e) = round_trip(&addr, &[i; 16]) {
            panic!("client {i} was locked out by idle sockets: {e}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    echo.join().unwrap();
    assert!(
        flood.replaced.load(Ordering::Relaxed) > 0,
        "the flood never lost a socket: it was not at the limit"
    );
}

/// The handshake deadline is `handshake_timeout` alone: a long `connect_timeout` does not keep
/// an idle accepted socket alive.
fn handshake_timeout_alone_bounds_idle_sockets(scheme: &str) {
    let srv = server(
        scheme,
        Config::default()
            .handshake_timeout(Duration::from_millis(300))
            .connect_timeout(Duration::from_secs(3600)),
    );
    let mut s = TcpStream::connect(sockaddr(&srv)).unwrap();
    assert!(closed_within(&mut s, T), "an idle socket outlived handshake_timeout");
}

/// At the per-source limit the oldest silent connection from that address is shed, and
/// connections from other addresses keep their slots.
fn the_per_source_limit_sheds_that_sources_oldest_connection(scheme: &str) {
    let srv =
        server(scheme, Config::default().handshake_limits(64, 4).handshake_timeout(Duration::from_secs(600)));
    let sa = sockaddr(&srv);
    let wait_handshaking = |n: usize| {
        let start = Instant::now();
        while srv.info().gauges.handshakes != n {
            assert!(
                start.elapsed() < T,
                "{} handshakes in progress, expected {n}",
                srv.info().gauges.handshakes
            );
            thread::sleep(Duration::from_millis(2));
        }
    };
    let mut other = connect_from(Ipv4Addr::new(127, 0, 0, 2), sa);
    wait_handshaking(1);
    let mut mine: Vec<TcpStream> = Vec::new();
    for i in 0..4 {
        mine.push(connect_from(Ipv4Addr::LOCALHOST, sa));
        wait_handshaking(i + 2);
    }
    let mut fifth = connect_from(Ipv4Addr::LOCALHOST, sa);
    assert!(closed_within(&mut mine[0], T), "the oldest connection from 127.0.0.1 was not shed");
    wait_handshaking(5);
    for (i, s) in mine.iter_mut().enumerate().skip(1) {
        assert!(still_open(s), "connection {i} from 127.0.0.1 was shed, not the oldest");
    }
    assert!(still_open(&mut fifth), "the new connection was refused instead of admitted");
    assert!(still_open(&mut other), "a connection from 127.0.0.2 was shed for 127.0.0.1's flood");
}

/// A fake server at `addr` that answers every connection's hello with `reply` (or, with none,
/// closes it once the hello arrived).
fn fake_server(reply: Option<Vec<u8>>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let sa = l.local_addr().unwrap();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut hdr = [0u8; HEADER_LEN];
            if s.read_exact(&mut hdr).is_err() {
                continue;
            }
            if let Some(r) = &reply {
                let _ = s.write_all(r);
            }
            // Read the hello's body too, so the close is a FIN and not a reset.
            let h = Header::decode(&hdr).unwrap();
            let mut body = vec![0u8; h.len as usize];
            let _ = s.read_exact(&mut body);
            drop(s);
        }
    });
    sa
}

fn refusal_error(scheme: &str, reply: Option<Vec<u8>>) -> String {
    let sa = fake_server(reply);
    let cli = Endpoint::client(Config::default()).unwrap();
    let p = cli.connect(format!("{scheme}://{sa}")).unwrap();
    let err = match cli.send_unexpected(p, 1, Bytes::from_static(b"x"), ServiceLevel::Normal) {
        Err(e) => e,
        Ok(op) => cli
            .wait_timeout(op, T)
            .unwrap()
            .expect("completes")
            .result
            .expect_err("a refused connection delivered"),
    };
    assert!(matches!(err, Error::PeerLost { .. }), "not PeerLost: {err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&sa.to_string()), "the error does not name the server {sa}: {msg}");
    msg
}

/// A client whose connection the server closes during the handshake fails with an error that
/// names the server's address and the handshake.
fn a_client_refused_in_its_handshake_names_the_server(scheme: &str) {
    let msg = refusal_error(scheme, None);
    assert!(msg.contains("during the handshake"), "{msg}");
    // A server that sheds the connection for its handshake limits says so first.
    let mut busy = Header::new(Kind::Ready, ServiceLevel::Normal);
    busy.aux = 3;
    let msg = refusal_error(scheme, Some(busy.encode().to_vec()));
    assert!(msg.contains("during the handshake") && msg.contains("connections in their handshake"), "{msg}");
}

macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod tcp { $( #[test] fn $name() { super::$name("tcp") } )* }
        mod softib { $( #[test] fn $name() { super::$name("softib") } )* }
    };
}

both!(
    idle_sockets_do_not_lock_clients_out,
    handshake_timeout_alone_bounds_idle_sockets,
    the_per_source_limit_sheds_that_sources_oldest_connection,
    a_client_refused_in_its_handshake_names_the_server,
);
