//! `IbConfig::cache_foreign` set explicitly: `false` deregisters memory the application lends
//! as soon as its operation ends; `true` keeps it registered without the memory monitor
//! (MPI's `leave_pinned`), and `Endpoint::invalidate_registrations` drops it before the memory
//! goes away. (The default, kept while watched, is in `ib_memory_monitor.rs`.)

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ionet::*;

const T: Duration = Duration::from_secs(20);
const LEN: usize = 1 << 20;

fn pair(cache_foreign: bool) -> (Endpoint, Endpoint, PeerId, PeerId) {
    let srv = Endpoint::bind("softib://127.0.0.1:0", Config::default().progress_thread(true)).unwrap();
    let cfg = Config::default().progress_thread(true).ib(IbConfig::default().cache_foreign(cache_foreign));
    let cli = Endpoint::client(cfg).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    let hello = cli.send_unexpected(p, 0, Bytes::from_static(b"hi"), ServiceLevel::Normal).unwrap();
    cli.wait_timeout(hello, T).unwrap().expect("hello sent").result.unwrap();
    let sp = srv.recv_unexpected(Some(T)).unwrap().expect("hello").peer;
    (srv, cli, p, sp)
}

/// Sends `data` (plain memory, server-based RDMA: the server reads it from the client's
/// registered memory) and checks it arrived.
fn send(srv: &Endpoint, cli: &Endpoint, p: PeerId, sp: PeerId, data: &Bytes) {
    let r = srv.recv(sp, 7, BytesMut::zeroed(LEN)).unwrap();
    let s = cli.send(p, 7, data.clone(), ServiceLevel::Normal).unwrap();
    let sc = cli.wait_timeout(s, T).unwrap().expect("send completes");
    assert_eq!(sc.mechanism, Some(Mechanism::ServerRdma));
    sc.result.unwrap();
    let rc = srv.wait_timeout(r, T).unwrap().expect("receive completes");
    assert!(rc.data().unwrap()[..] == data[..]);
}

fn misses(ep: &Endpoint) -> (u64, u64) {
    let r = ep.info().regcache.expect("IB endpoints report their cache");
    (r.misses, r.hits)
}

#[test]
fn lent_memory_is_registered_per_operation_when_not_kept() {
    let (srv, cli, p, sp) = pair(false);
    let data = Bytes::from((0..LEN).map(|i| i as u8).collect::<Vec<u8>>());
    let (m0, _) = misses(&cli);
    for _ in 0..3 {
        send(&srv, &cli, p, sp, &data);
    }
    assert_eq!(misses(&cli).0 - m0, 3, "registered once per send");
    assert_eq!(cli.invalidate_registrations(&data), 0, "nothing of it is left cached");
}

#[test]
fn opted_in_lent_memory_stays_registered_until_invalidated() {
    let (srv, cli, p, sp) = pair(true);
    let data = Bytes::from((0..LEN).map(|i| (i * 3) as u8).collect::<Vec<u8>>());
    let (m0, h0) = misses(&cli);
    for _ in 0..3 {
        send(&srv, &cli, p, sp, &data);
    }
    let (m1, h1) = misses(&cli);
    assert_eq!(m1 - m0, 1, "registered by the first send only");
    assert!(h1 - h0 >= 2, "later sends hit the cache");
    // Invalidating any byte of it drops the registration; the next send registers afresh.
    assert_eq!(cli.invalidate_registrations(&data[LEN / 2..LEN / 2 + 1]), 1);
    assert_eq!(cli.invalidate_registrations(&data), 0, "already gone");
    send(&srv, &cli, p, sp, &data);
    assert_eq!(misses(&cli).0 - m1, 1, "registered again after the invalidation");
    // Over TCP the call is a harmless no-op.
    let tcp = Endpoint::client(Config::default()).unwrap();
    assert_eq!(tcp.invalidate_registrations(&data), 0);
}
