//! Credits keep receivers ready: 32 clients, each busy with every kind of traffic at once, never
//! make a `softib://` queue pair retry for a missing receive (RNR), and every byte checks.
//!
//! Receive buffers and ring slots are made scarce (4 credits, 2 slots per connection) so flow
//! control is exercised all the time, and the server answers every kind of message: request
//! writes (it pulls) and reads (it pushes) of mixed sizes across all three mechanisms,
//! unexpected messages it echoes back as tagged sends, and announced rendezvous sends it
//! receives. The RNR count is the provider's (it sees every retry of every queue pair); the
//! fault-injection tests show the same counter going up when a receive really is missing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ionet::*;

mod common;
use common::pattern;

const T: Duration = Duration::from_secs(60);
const CLIENTS: usize = 32;
const ROUNDS: usize = 12;
/// Sizes around the inline and fast-RDMA limits, and server-based ones.
const SIZES: [usize; 8] = [100, 4096, 4097, 20_000, 65_536, 65_537, 300_000, 1 << 20];
/// Unexpected messages are at most the eager limit (a ring slot).
const ECHO: [usize; 5] = [16, 200, 4097, 30_000, 60_000];

const ECHO_MSG: u8 = 1;
const BIG_MSG: u8 = 2;

fn config() -> Config {
    Config::default().wait_mode(WaitMode::Block).ib(IbConfig::default().recv_buffers(4).ring_slots(2))
}

fn ok(ep: &Endpoint, op: OpId) -> Completion {
    let c = ep.wait_timeout(op, T).unwrap().unwrap_or_else(|| panic!("{op} did not complete"));
    if let Err(e) = &c.result {
        panic!("{op} failed: {e}");
    }
    c
}

fn data_of(c: &Completion) -> Bytes {
    c.data().expect("receive buffer")
}

/// Serves requests: tag 1 = write (pull, check against the pattern named by the header's seed,
/// reply "ok"/"bad"), tag 2 = read (push the pattern for the header's seed).
fn request_worker(srv: Endpoint, left: Arc<AtomicUsize>) {
    loop {
        if left.load(Ordering::SeqCst) == 0 {
            return;
        }
        let Some(req) = srv.next_request(Some(Duration::from_millis(100))).unwrap() else { continue };
        left.fetch_sub(1, Ordering::SeqCst);
        let seed = u64::from_le_bytes(req.header()[..8].try_into().unwrap());
        let len = req.payload_len() as usize;
        match req.tag() {
            1 => {
                // Two pulls, so the server pipelines pieces of one payload.
                let half = len / 2;
                let a = req.pull_into(BytesMut::zeroed(half), 0).unwrap();
                let b = req.pull_into(BytesMut::zeroed(len - half), half as u64).unwrap();
                let mut got = data_of(&ok(&srv, a)).to_vec();
                got.extend_from_slice(&data_of(&ok(&srv, b)));
                let verdict: &[u8] = if got == pattern(len, seed) { b"ok" } else { b"bad" };
                ok(&srv, req.reply(Bytes::from_static(verdict)).unwrap());
            }
            2 => {
                let op = req.push_from(Bytes::from(pattern(len, seed)), 0).unwrap();
                ok(&srv, op);
                ok(&srv, req.reply(Bytes::from_static(b"ok")).unwrap());
            }
            t => panic!("tag {t}"),
        }
    }
}

/// Serves unexpected messages: ECHO (send the body back on the given tag), BIG (receive the
/// announced rendezvous send on the given tag, check it, acknowledge on tag + 1).
fn message_worker(srv: Endpoint, expected: usize) {
    for _ in 0..expected {
        let u = srv.recv_unexpected(Some(T)).unwrap().expect("an unexpected message");
        let kind = u.data[0];
        let tag = u64::from_le_bytes(u.data[1..9].try_into().unwrap());
        match kind {
            ECHO_MSG => {
                let op = srv.send(u.peer, tag, u.data.slice(9..), ServiceLevel::Normal).unwrap();
                ok(&srv, op);
            }
            BIG_MSG => {
                let len = u64::from_le_bytes(u.data[9..17].try_into().unwrap()) as usize;
                let seed = u64::from_le_bytes(u.data[17..25].try_into().unwrap());
                let r = srv.recv(u.peer, tag, BytesMut::zeroed(len)).unwrap();
                let good = data_of(&ok(&srv, r))[..] == pattern(len, seed)[..];
                let ack: &'static [u8] = if good { b"ok" } else { b"bad" };
                ok(&srv, srv.send(u.peer, tag + 1, Bytes::from_static(ack), ServiceLevel::Normal).unwrap());
            }
            k => panic!("kind {k}"),
        }
    }
}

fn client(addr: Address, i: usize) -> Endpoint {
    let cli = Endpoint::client(config()).unwrap();
    let p = cli.connect(&addr).unwrap();
    for r in 0..ROUNDS {
        let seed = (i * 1000 + r) as u64;
        let wlen = SIZES[(i + r) % SIZES.len()];
        let rlen = SIZES[(i + 3 * r + 1) % SIZES.len()];
        let elen = ECHO[(i + r) % ECHO.len()];
        let sl = ServiceLevel::ALL[(i + r) % 3];
        // Everything in flight at once: an echo, a write, a read (and every other round an
        // announced rendezvous send).
        let echo_tag = 10 + r as u64;
        let echo_data = pattern(elen, seed + 1);
        let er = cli.recv(p, echo_tag, BytesMut::zeroed(elen)).unwrap();
        let mut m = vec![ECHO_MSG];
        m.extend_from_slice(&echo_tag.to_le_bytes());
        m.extend_from_slice(&echo_data);
        let es = cli.send_unexpected(p, 0, Bytes::from(m), sl).unwrap();
        let w = cli
            .request(
                p,
                1,
                Bytes::copy_from_slice(&seed.to_le_bytes()),
                Payload::Out(pattern(wlen, seed).into()),
                sl,
            )
            .unwrap();
        let rd = cli
            .request(
                p,
                2,
                Bytes::copy_from_slice(&(seed + 2).to_le_bytes()),
                Payload::In(BytesMut::zeroed(rlen).into()),
                sl,
            )
            .unwrap();
        let big = (r % 2 == 0).then(|| {
            let (tag, len, bseed) = (100 + 2 * r as u64, SIZES[(i + r + 5) % SIZES.len()] * 2, seed + 3);
            let mut m = vec![BIG_MSG];
            m.extend_from_slice(&tag.to_le_bytes());
            m.extend_from_slice(&(len as u64).to_le_bytes());
            m.extend_from_slice(&bseed.to_le_bytes());
            let ack = cli.recv(p, tag + 1, BytesMut::zeroed(8)).unwrap();
            let a = cli.send_unexpected(p, 0, Bytes::from(m), ServiceLevel::Control).unwrap();
            let s = cli.send(p, tag, Bytes::from(pattern(len, bseed)), ServiceLevel::Bulk).unwrap();
            (ack, a, s)
        });
        ok(&cli, es);
        assert_eq!(data_of(&ok(&cli, er))[..], echo_data[..], "client {i} round {r}: echo");
        assert_eq!(ok(&cli, w).reply.as_deref(), Some(&b"ok"[..]), "client {i} round {r}: write of {wlen}");
        let c = ok(&cli, rd);
        assert!(data_of(&c)[..] == pattern(rlen, seed + 2)[..], "client {i} round {r}: read of {rlen}");
        if let Some((ack, a, s)) = big {
            ok(&cli, a);
            ok(&cli, s);
            assert_eq!(&data_of(&ok(&cli, ack))[..], b"ok", "client {i} round {r}: rendezvous send");
        }
    }
    cli
}

#[test]
fn thirty_two_busy_clients_never_meet_rnr() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let srv = Endpoint::bind("softib://127.0.0.1:0", config().progress_thread(true)).unwrap();
    let addr = srv.local_addr().unwrap();
    let messages = CLIENTS * (ROUNDS + ROUNDS.div_ceil(2));
    let requests = Arc::new(AtomicUsize::new(CLIENTS * ROUNDS * 2));
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let (s, left) = (srv.clone(), requests.clone());
            thread::spawn(move || request_worker(s, left))
        })
        .chain(std::iter::once({
            let s = srv.clone();
            thread::spawn(move || message_worker(s, messages))
        }))
        .collect();
    let addr = Arc::new(addr);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let addr = addr.clone();
            thread::spawn(move || client((*addr).clone(), i))
        })
        .collect();
    let clients: Vec<Endpoint> = clients.into_iter().map(|h| h.join().expect("client")).collect();
    for w in workers {
        w.join().expect("server worker");
    }
    let mut total_wrs = 0;
    for (name, ep) in std::iter::once(("server".to_string(), &srv))
        .chain(clients.iter().enumerate().map(|(i, c)| (format!("client {i}"), c)))
    {
        let info = ep.info();
        let provider = info.rdma.expect("IB engine").provider;
        assert_eq!(provider.rnr_retries, Some(0), "{name}: the provider saw RNR retries");
        assert_eq!(info.counters.wc_errors, 0, "{name}: a work request failed");
        assert_eq!(info.counters.peers_lost, 0, "{name}: no connection failed");
        assert_eq!(info.counters.protocol_errors, 0, "{name}");
        total_wrs += provider.send_wrs_posted;
    }
    // The run was busy: flow control was exercised on the scarce credits.
    let s = srv.info();
    assert!(s.counters.credit_msgs > 0 || clients.iter().any(|c| c.info().counters.credit_msgs > 0));
    assert!(total_wrs > (CLIENTS * ROUNDS * 4) as u64, "{total_wrs} work requests");
    for m in [Mechanism::Inline, Mechanism::FastRdma, Mechanism::ServerRdma] {
        let n = s.counters.by_mechanism(m);
        assert!(n > 0, "the server moved nothing by {m:?}");
    }
}
