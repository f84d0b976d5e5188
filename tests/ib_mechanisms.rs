//! Each mechanism forced in turn over sizes 0 … 16 MiB — every threshold ± 1 — on `softib://`:
//! tagged send/receive, request writes (the server pulls) and request reads (the server
//! pushes), from plain user memory and from registered pool buffers, every byte checked, and
//! the counters of both endpoints proving the path each transfer took:
//!
//! - the mechanism each side reports, and the per-mechanism counters;
//! - host copies (`host_copies` / `host_copy_bytes`): inline copies once on each side; fast RDMA
//!   copies once on the sender from user memory and never from a pool buffer, once on the
//!   receiver (out of the ring slot); server-based RDMA never copies on the side that owns the
//!   memory (it is registered in place) nor on the side doing the RDMA when its buffer is a
//!   pool buffer — into or out of plain user memory, that side stages through zone buffers,
//!   exactly one copy of each byte;
//! - the provider's byte counters: RDMA_READ / RDMA_WRITE bytes only on the server-based path,
//!   ring writes of exactly header + payload on the fast path.
//!
//! A forced mechanism applies where it can carry the transfer (inline: a receive buffer; fast
//! RDMA: a ring slot); beyond that the next one up moves it, and an empty payload goes inline.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ionet::internals::ib::verbs::VerbsCounters;
use ionet::*;

mod common;
use common::pattern;

const T: Duration = Duration::from_secs(30);
const MAX: usize = 16 << 20;
const RECV_SIZE: u32 = 8192;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mem {
    /// `Bytes` / `BytesMut`: memory the engine must register in place or copy.
    User,
    /// `Endpoint::alloc`: registered once, up front.
    Pool,
}

fn config(force: Option<Mechanism>) -> Config {
    let mut p = Policy::for_scheme(Scheme::SoftIb);
    p.force(force);
    // Lent memory deregistered after each transfer: every user buffer is new to the engine,
    // so the staged path (zone buffers) is what is checked for it. Kept registrations of lent
    // memory, which go direct, are checked in `ib_cache_foreign.rs`.
    let ib = IbConfig::default().recv_size(RECV_SIZE).cache_foreign(false);
    Config::default().max_message(MAX).policy(p).ib(ib)
}

fn send_buf(ep: &Endpoint, mem: Mem, data: &[u8]) -> SendBuf {
    match mem {
        Mem::User => SendBuf::Bytes(Bytes::copy_from_slice(data)),
        Mem::Pool => {
            let mut b = ep.alloc(data.len()).unwrap();
            b.copy_from_slice(data);
            SendBuf::Registered(b)
        }
    }
}

fn recv_buf(ep: &Endpoint, mem: Mem, len: usize) -> RecvBuf {
    match mem {
        Mem::User => RecvBuf::Mut(BytesMut::zeroed(len)),
        Mem::Pool => RecvBuf::Registered(ep.alloc(len).unwrap()),
    }
}

fn received(c: &Completion) -> Bytes {
    match &c.buf {
        OpBuf::Recv(r) => r.to_bytes(c.len()),
        other => panic!("no receive buffer: {other:?}"),
    }
}

fn wait_ok(ep: &Endpoint, op: OpId) -> Completion {
    let c = ep.wait_timeout(op, T).unwrap().unwrap_or_else(|| panic!("{op} did not complete"));
    if let Err(e) = &c.result {
        panic!("{op} failed: {e}");
    }
    c
}

/// What one endpoint did during a transfer.
#[derive(Debug)]
struct Delta {
    copies: u64,
    copy_bytes: u64,
    mech: [u64; 3],
    provider: VerbsCounters,
}

fn snapshot(ep: &Endpoint) -> (CounterSnapshot, VerbsCounters) {
    let i = ep.info();
    (i.counters, i.rdma.expect("IB engine state").provider)
}

fn delta(ep: &Endpoint, before: &(CounterSnapshot, VerbsCounters)) -> Delta {
    let (c, p) = snapshot(ep);
    let (b, bp) = before;
    Delta {
        copies: c.host_copies - b.host_copies,
        copy_bytes: c.host_copy_bytes - b.host_copy_bytes,
        mech: [
            c.mech_inline - b.mech_inline,
            c.mech_fast_rdma - b.mech_fast_rdma,
            c.mech_server_rdma - b.mech_server_rdma,
        ],
        provider: VerbsCounters {
            rdma_read_bytes: p.rdma_read_bytes - bp.rdma_read_bytes,
            rdma_write_bytes: p.rdma_write_bytes - bp.rdma_write_bytes,
            send_bytes: p.send_bytes - bp.send_bytes,
            ..Default::default()
        },
    }
}

/// The engine's limits, read from what the endpoint reports.
#[derive(Debug, Clone, Copy)]
struct Limits {
    msg_hdr: usize,
    inline_cap: usize,
    fast_cap: usize,
}

impl Limits {
    fn of(ep: &Endpoint) -> Limits {
        let i = ep.info();
        let (_, slot) = i.fast_slots.expect("fast-RDMA ring");
        // The eager limit is what a ring slot carries after the message header.
        let msg_hdr = slot - i.eager_limit;
        Limits { msg_hdr, inline_cap: RECV_SIZE as usize - msg_hdr, fast_cap: i.eager_limit }
    }

    /// The mechanism a transfer of `len` bytes must take.
    fn expect(&self, policy: &Policy, len: usize) -> Mechanism {
        let m = policy.choose(len, ServiceLevel::Normal, ionet::comm::Conditions::idle(true));
        match m {
            Mechanism::ServerRdma if len == 0 => Mechanism::Inline,
            Mechanism::Inline if len > self.inline_cap && len <= self.fast_cap => Mechanism::FastRdma,
            Mechanism::Inline | Mechanism::FastRdma if len > self.fast_cap => Mechanism::ServerRdma,
            m => m,
        }
    }

    /// Every size around every limit.
    fn sizes(&self, policy: &Policy) -> Vec<usize> {
        let t = policy.thresholds(ServiceLevel::Normal);
        let device_inline = 256 - self.msg_hdr;
        let mut v = vec![0, 1, MAX];
        for th in [
            device_inline,
            t.inline_max,
            self.inline_cap,
            t.fast_max,
            self.fast_cap,
            128 << 10, // transfer units: total / 2 above 64 KiB…
            2 << 20,   // … up to 2 MiB (also the largest zone buffer)
            4 << 20,
        ] {
            v.extend([th - 1, th, th + 1]);
        }
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// Checks one side's path for a transfer of `len` bytes by `m`.
/// `copies_expected`: payload copies this side must have made (each of `len` bytes), or `None`
/// for "staged through zone buffers": every byte copied exactly once, in units.
fn check(what: &str, d: &Delta, m: Mechanism, len: usize, copies_expected: Option<u64>) {
    let mut want_mech = [0u64; 3];
    want_mech[m.index()] = 1;
    assert_eq!(d.mech, want_mech, "{what}: mechanism counters");
    match copies_expected {
        Some(n) => {
            assert_eq!(d.copies, n, "{what}: host copies");
            assert_eq!(d.copy_bytes, n * len as u64, "{what}: host copy bytes");
        }
        None => {
            assert!(d.copies >= 1, "{what}: staged through zone buffers");
            assert_eq!(d.copy_bytes, len as u64, "{what}: every byte staged exactly once");
        }
    }
}

/// Requests served by a thread: tag 1 = write (pull everything, compare, reply "ok"), tag 2 =
/// read (push the expected bytes), each + 10 when the server's buffer is a pool buffer. Headers
/// are empty, so the request's mechanism and the server's are chosen for the same size.
fn serve(srv: Endpoint, data: Arc<HashMap<usize, Vec<u8>>>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while let Some(req) = srv.next_request(Some(T)).unwrap() {
            let mem = if req.tag() > 10 { Mem::Pool } else { Mem::User };
            let len = req.payload_len() as usize;
            match req.tag() % 10 {
                1 => {
                    let c = wait_ok(&srv, req.pull_into(recv_buf(&srv, mem, len), 0).unwrap());
                    let ok = received(&c)[..] == data[&len][..];
                    let expect = Limits::of(&srv).expect(&srv.info().policy, len);
                    let mech_ok = c.mechanism == Some(expect);
                    let verdict: &[u8] = if ok && mech_ok { b"ok" } else { b"bad" };
                    wait_ok(&srv, req.reply(Bytes::from_static(verdict)).unwrap());
                }
                2 => {
                    if len > 0 {
                        let c = wait_ok(&srv, req.push_from(send_buf(&srv, mem, &data[&len]), 0).unwrap());
                        let expect = Limits::of(&srv).expect(&srv.info().policy, len);
                        assert_eq!(c.mechanism, Some(expect), "server push of {len}");
                    }
                    wait_ok(&srv, req.reply(Bytes::from_static(b"ok")).unwrap());
                }
                3 => return,
                t => panic!("tag {t}"),
            }
        }
    })
}

fn run(force: Option<Mechanism>) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let srv = Endpoint::bind("softib://127.0.0.1:0", config(force).progress_thread(true)).unwrap();
    let cli = Endpoint::client(config(force)).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    let op = cli.send_unexpected(p, 0, Bytes::from_static(b"hi"), ServiceLevel::Normal).unwrap();
    wait_ok(&cli, op);
    let sp = srv.recv_unexpected(Some(T)).unwrap().unwrap().peer;
    let lim = Limits::of(&cli);
    let policy = cli.info().policy;
    let sizes = lim.sizes(&policy);
    let data: Arc<HashMap<usize, Vec<u8>>> =
        Arc::new(sizes.iter().map(|&n| (n, pattern(n, n as u64))).collect());
    let server = serve(srv.clone(), data.clone());
    let ring = |len: usize| (lim.msg_hdr + len) as u64;
    for &len in &sizes {
        let m = lim.expect(&policy, len);
        let d = &data[&len];
        let some = |n: u64| Some(if len == 0 { 0 } else { n });
        for mem in [Mem::User, Mem::Pool] {
            let ctx = format!("{force:?} {mem:?} {len} B by {m:?}");

            // Tagged send into a posted receive.
            let (b_cli, b_srv) = (snapshot(&cli), snapshot(&srv));
            let r = srv.recv(sp, 7, recv_buf(&srv, mem, len)).unwrap();
            let s = cli.send(p, 7, send_buf(&cli, mem, d), ServiceLevel::Normal).unwrap();
            let sc = wait_ok(&cli, s);
            let rc = wait_ok(&srv, r);
            assert!(received(&rc)[..] == d[..], "{ctx}: send payload");
            assert_eq!((sc.mechanism, rc.mechanism), (Some(m), Some(m)), "{ctx}: send mechanism");
            let (dc, ds) = (delta(&cli, &b_cli), delta(&srv, &b_srv));
            let (sender, receiver) = match (m, mem) {
                (Mechanism::Inline, _) => (some(1), some(1)),
                (Mechanism::FastRdma, Mem::User) => (some(1), some(1)),
                (Mechanism::FastRdma, Mem::Pool) => (Some(0), some(1)),
                (Mechanism::ServerRdma, Mem::User) => (Some(0), None),
                (Mechanism::ServerRdma, Mem::Pool) => (Some(0), Some(0)),
                (other, _) => unreachable!("a mechanism this test does not know: {other:?}"),
            };
            check(&format!("{ctx}: sender"), &dc, m, len, sender);
            check(&format!("{ctx}: receiver"), &ds, m, len, receiver);
            match m {
                Mechanism::Inline => {
                    assert_eq!(dc.provider.rdma_write_bytes + ds.provider.rdma_read_bytes, 0, "{ctx}");
                    assert!(dc.provider.send_bytes >= ring(len), "{ctx}: SEND carried the data");
                }
                Mechanism::FastRdma => {
                    assert_eq!(dc.provider.rdma_write_bytes, ring(len), "{ctx}: one ring write");
                    assert_eq!(ds.provider.rdma_read_bytes, 0, "{ctx}");
                }
                Mechanism::ServerRdma => {
                    assert_eq!(ds.provider.rdma_read_bytes, len as u64, "{ctx}: receiver read it all");
                    assert_eq!(dc.provider.rdma_write_bytes, 0, "{ctx}");
                }
                other => unreachable!("a mechanism this test does not know: {other:?}"),
            }

            // Request write: the client offers the data, the server pulls it.
            let pool_tag = if mem == Mem::Pool { 10 } else { 0 };
            let (b_cli, b_srv) = (snapshot(&cli), snapshot(&srv));
            let payload = Payload::Out(send_buf(&cli, mem, d));
            let q = cli.request(p, 1 + pool_tag, Bytes::new(), payload, ServiceLevel::Normal).unwrap();
            let c = wait_ok(&cli, q);
            assert_eq!(c.reply.as_deref(), Some(&b"ok"[..]), "{ctx}: write verified by the server");
            assert_eq!(c.mechanism, Some(m), "{ctx}: write mechanism");
            let (dc, ds) = (delta(&cli, &b_cli), delta(&srv, &b_srv));
            let (client, server) = match (m, mem) {
                // Data with the request: the client copies it into the message (unless it is
                // a ring write from a pool buffer); the server copies it out of the receive
                // buffer, then into the pull's buffer.
                (Mechanism::Inline, _) => (some(1), some(2)),
                (Mechanism::FastRdma, Mem::User) => (some(1), some(2)),
                (Mechanism::FastRdma, Mem::Pool) => (Some(0), some(2)),
                (Mechanism::ServerRdma, Mem::User) => (Some(0), None),
                (Mechanism::ServerRdma, Mem::Pool) => (Some(0), Some(0)),
                (other, _) => unreachable!("a mechanism this test does not know: {other:?}"),
            };
            check(&format!("{ctx}: write client"), &dc, m, len, client);
            check(&format!("{ctx}: write server"), &ds, m, len, server);
            let rdma_read = if m == Mechanism::ServerRdma { len as u64 } else { 0 };
            assert_eq!(ds.provider.rdma_read_bytes, rdma_read, "{ctx}: write RDMA_READ bytes");

            // Request read: the client offers a buffer, the server pushes into it.
            let (b_cli, b_srv) = (snapshot(&cli), snapshot(&srv));
            let payload = Payload::In(recv_buf(&cli, mem, len));
            let q = cli.request(p, 2 + pool_tag, Bytes::new(), payload, ServiceLevel::Normal).unwrap();
            let c = wait_ok(&cli, q);
            assert!(received(&c)[..] == d[..], "{ctx}: read payload");
            assert_eq!(c.mechanism, Some(m), "{ctx}: read mechanism");
            let (dc, ds) = (delta(&cli, &b_cli), delta(&srv, &b_srv));
            let (client, server) = match (m, mem) {
                (Mechanism::Inline, _) => (some(1), some(1)),
                (Mechanism::FastRdma, Mem::User) => (some(1), some(1)),
                (Mechanism::FastRdma, Mem::Pool) => (some(1), Some(0)),
                (Mechanism::ServerRdma, Mem::User) => (Some(0), None),
                (Mechanism::ServerRdma, Mem::Pool) => (Some(0), Some(0)),
                (other, _) => unreachable!("a mechanism this test does not know: {other:?}"),
            };
            // A read moves no data for 0 bytes: the server pushes nothing.
            if len > 0 {
                check(&format!("{ctx}: read server"), &ds, m, len, server);
            }
            check(&format!("{ctx}: read client"), &dc, m, len, client);
            let rdma_write = if m == Mechanism::ServerRdma { len as u64 } else { 0 };
            assert_eq!(
                ds.provider.rdma_write_bytes.min(rdma_write),
                rdma_write,
                "{ctx}: pushed by RDMA_WRITE"
            );
            if m == Mechanism::ServerRdma {
                assert_eq!(ds.provider.rdma_write_bytes, len as u64, "{ctx}: read RDMA_WRITE bytes");
            }
        }
    }
    let q = cli.request(p, 3, Bytes::new(), Payload::None, ServiceLevel::Normal).unwrap();
    let _ = cli.wait_timeout(q, Duration::from_millis(100));
    server.join().unwrap();
}

#[test]
fn mechanisms_by_table() {
    run(None);
}

#[test]
fn inline_forced() {
    run(Some(Mechanism::Inline));
}

#[test]
fn fast_rdma_forced() {
    run(Some(Mechanism::FastRdma));
}

#[test]
fn server_rdma_forced() {
    run(Some(Mechanism::ServerRdma));
}

/// Regression: a forced mechanism that cannot carry a message used to be applied anyway —
/// forced inline wrote a 1 MiB payload past its 8 KiB bounce buffer (a panic, or corrupted
/// engine memory), forced fast RDMA dropped a message larger than a ring slot (the send never
/// completed), forced server-based RDMA sent an empty segment list for 0 bytes (the peer
/// called it a protocol violation). Each now goes by the next mechanism that can carry it.
#[test]
fn forced_mechanism_hands_on_what_it_cannot_carry() {
    for (force, len, want) in [
        (Mechanism::Inline, 1 << 20, Mechanism::ServerRdma),
        (Mechanism::Inline, 20_000, Mechanism::FastRdma),
        (Mechanism::FastRdma, 1 << 20, Mechanism::ServerRdma),
        (Mechanism::ServerRdma, 0, Mechanism::Inline),
    ] {
        let srv = Endpoint::bind("softib://127.0.0.1:0", config(Some(force)).progress_thread(true)).unwrap();
        let cli = Endpoint::client(config(Some(force))).unwrap();
        let p = cli.connect(srv.local_addr().unwrap()).unwrap();
        wait_ok(&cli, cli.send_unexpected(p, 0, Bytes::from_static(b"hi"), ServiceLevel::Normal).unwrap());
        let sp = srv.recv_unexpected(Some(T)).unwrap().unwrap().peer;
        let data = pattern(len, 9);
        let r = srv.recv(sp, 1, BytesMut::zeroed(len)).unwrap();
        let s = cli.send(p, 1, Bytes::from(data.clone()), ServiceLevel::Normal).unwrap();
        let sc = wait_ok(&cli, s);
        let rc = wait_ok(&srv, r);
        assert!(received(&rc)[..] == data[..], "{force:?} {len}");
        assert_eq!((sc.mechanism, rc.mechanism), (Some(want), Some(want)), "{force:?} {len}");
        assert_eq!(cli.info().counters.peers_lost + srv.info().counters.peers_lost, 0, "{force:?} {len}");
    }
}

/// A read into a scatter list too fragmented to register is staged through a pool buffer: the
/// engine copies only what the server pushed back into it, never the whole list (a stage filled
/// from the caller's buffer first cost a second copy of every byte of every such read).
#[test]
fn a_staged_read_copies_only_what_was_pushed() {
    let srv = Endpoint::bind("softib://127.0.0.1:0", Config::default().progress_thread(true)).unwrap();
    let cli = Endpoint::client(Config::default()).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    const PIECES: usize = 256;
    const PIECE: usize = 4096;
    const PUSHED: usize = 100_000;
    let data = pattern(PUSHED, 3);
    let d2 = data.clone();
    let server = std::thread::spawn(move || {
        let req = srv.next_request(Some(T)).unwrap().expect("a request");
        srv.wait(req.push_from(Bytes::from(d2), 0).unwrap()).unwrap().ok().unwrap();
        srv.wait(req.reply(Bytes::new()).unwrap()).unwrap().ok().unwrap();
    });
    let list = RecvBuf::List((0..PIECES).map(|_| BytesMut::zeroed(PIECE)).collect());
    let before = cli.info().counters.host_copy_bytes;
    let c = wait_ok(&cli, cli.request(p, 1, Bytes::new(), Payload::In(list), ServiceLevel::Normal).unwrap());
    let copied = cli.info().counters.host_copy_bytes - before;
    server.join().unwrap();
    assert_eq!(c.len(), PUSHED);
    assert!(c.data().unwrap()[..] == data[..], "the pushed bytes arrived");
    assert!(
        copied <= PUSHED as u64,
        "the client copied {copied} bytes for a {PUSHED}-byte read into a {} B list",
        PIECES * PIECE
    );
}

/// On `softib://` the host's CPU moves the data as each work request is posted, so nothing
/// overlaps two units of one transfer: a transfer up to the transfer unit goes as one
/// RDMA_READ. Counted as the work requests the receiver posts: one read and at most one
/// message back per 1 MiB message (two units would make it three).
#[test]
fn a_transfer_up_to_the_unit_is_one_read_where_the_cpu_moves_the_data() {
    const N: u64 = 8;
    const LEN: usize = 1 << 20;
    let srv = Endpoint::bind("softib://127.0.0.1:0", Config::default()).unwrap();
    let cli = Endpoint::client(Config::default().progress_thread(true)).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    // Connected, and the server's first receives posted, before counting.
    let hello = cli.send_unexpected(p, 0, Bytes::from_static(b"hi"), ServiceLevel::Normal).unwrap();
    let peer = srv.recv_unexpected(Some(T)).unwrap().expect("hello").peer;
    wait_ok(&cli, hello);
    let before = snapshot(&srv);
    for i in 0..N {
        let data = pattern(LEN, i);
        let send = cli.send(p, 1, send_buf(&cli, Mem::Pool, &data), ServiceLevel::Normal).unwrap();
        let c = wait_ok(&srv, srv.recv(peer, 1, recv_buf(&srv, Mem::Pool, LEN)).unwrap());
        assert!(received(&c)[..] == data[..]);
        wait_ok(&cli, send);
    }
    let (c, provider) = snapshot(&srv);
    assert_eq!(c.mech_server_rdma - before.0.mech_server_rdma, N, "server-based RDMA");
    assert_eq!(provider.rdma_read_bytes - before.1.rdma_read_bytes, N * LEN as u64);
    let wrs = provider.send_wrs_posted - before.1.send_wrs_posted;
    assert!(wrs <= 2 * N, "{wrs} work requests posted for {N} transfers of 1 MiB");
}
