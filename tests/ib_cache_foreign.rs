//! Registrations of memory the application lends (`IbConfig::cache_foreign`).
//!
//! - Set to `false`, lent memory is deregistered as soon as its operation ends.
//! - Set to `true`, it stays registered without the memory monitor (MPI's `leave_pinned`), and
//!   `Endpoint::invalidate_registrations` drops it before the memory goes away.
//! - By default it stays while the memory monitor watches it, and an unmapped, remapped or
//!   discarded buffer is never served from its old registration. softib reads a peer's memory
//!   through its current mapping, so a stale registration would still move the right bytes
//!   here; what these tests check is the cache's bookkeeping — the lookup after an unmap
//!   registers afresh — which on a real HCA is what keeps the old pages from being used. The
//!   monitor needs userfaultfd, which needs root (or `vm.unprivileged_userfaultfd = 1`): those
//!   tests are ignored in a plain run, and CI runs them as root.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ionet::*;

const T: Duration = Duration::from_secs(20);
const LEN: usize = 1 << 20;

/// A softib server and a client whose `IbConfig::cache_foreign` is `cache_foreign` (the
/// default when `None`), connected.
fn pair(cache_foreign: Option<bool>) -> (Endpoint, Endpoint, PeerId, PeerId) {
    let srv = Endpoint::bind("softib://127.0.0.1:0", Config::default().progress_thread(true)).unwrap();
    let mut ib = IbConfig::default();
    if let Some(on) = cache_foreign {
        ib = ib.cache_foreign(on);
    }
    let cli = Endpoint::client(Config::default().progress_thread(true).ib(ib)).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    let hello = cli.send_unexpected(p, 0, Bytes::from_static(b"hi"), ServiceLevel::Normal).unwrap();
    cli.wait_timeout(hello, T).unwrap().expect("hello sent").result.unwrap();
    let sp = srv.recv_unexpected(Some(T)).unwrap().expect("hello").peer;
    (srv, cli, p, sp)
}

/// Sends `data` (plain memory, server-based RDMA: the server reads it from the client's
/// registered memory) into `into`, checks it arrived, and gives the receive buffer back.
fn send(srv: &Endpoint, cli: &Endpoint, p: PeerId, sp: PeerId, data: Bytes, into: BytesMut) -> BytesMut {
    let r = srv.recv(sp, 7, into).unwrap();
    let s = cli.send(p, 7, data.clone(), ServiceLevel::Normal).unwrap();
    let sc = cli.wait_timeout(s, T).unwrap().expect("send completes");
    assert_eq!(sc.mechanism, Some(Mechanism::ServerRdma));
    sc.result.unwrap();
    let rc = srv.wait_timeout(r, T).unwrap().expect("receive completes");
    assert_eq!(rc.result.as_ref().ok(), Some(&LEN));
    let back = rc.into_data().expect("the receive buffer comes back");
    assert!(back[..] == data[..], "the bytes sent arrive");
    back.try_into_mut().expect("the same allocation, unshared")
}

/// (misses, hits) of `ep`'s registration cache.
fn lookups(ep: &Endpoint) -> (u64, u64) {
    let r = ep.info().regcache.expect("IB endpoints report their cache");
    (r.misses, r.hits)
}

#[test]
fn lent_memory_is_registered_per_operation_when_not_kept() {
    let (srv, cli, p, sp) = pair(Some(false));
    let data = Bytes::from((0..LEN).map(|i| i as u8).collect::<Vec<u8>>());
    let (m0, _) = lookups(&cli);
    for _ in 0..3 {
        send(&srv, &cli, p, sp, data.clone(), BytesMut::zeroed(LEN));
    }
    assert_eq!(lookups(&cli).0 - m0, 3, "registered once per send");
    assert_eq!(cli.invalidate_registrations(&data), 0, "nothing of it is left cached");
}

#[test]
fn opted_in_lent_memory_stays_registered_until_invalidated() {
    let (srv, cli, p, sp) = pair(Some(true));
    let data = Bytes::from((0..LEN).map(|i| (i * 3) as u8).collect::<Vec<u8>>());
    let (m0, h0) = lookups(&cli);
    for _ in 0..3 {
        send(&srv, &cli, p, sp, data.clone(), BytesMut::zeroed(LEN));
    }
    let (m1, h1) = lookups(&cli);
    assert_eq!(m1 - m0, 1, "registered by the first send only");
    assert!(h1 - h0 >= 2, "later sends hit the cache");
    // Invalidating any byte of it drops the registration; the next send registers afresh.
    assert_eq!(cli.invalidate_registrations(&data[LEN / 2..LEN / 2 + 1]), 1);
    assert_eq!(cli.invalidate_registrations(&data), 0, "already gone");
    send(&srv, &cli, p, sp, data.clone(), BytesMut::zeroed(LEN));
    assert_eq!(lookups(&cli).0 - m1, 1, "registered again after the invalidation");
    // Over TCP the call is a harmless no-op.
    let tcp = Endpoint::client(Config::default()).unwrap();
    assert_eq!(tcp.invalidate_registrations(&data), 0);
}

/// An anonymous private mapping of `LEN` bytes at `at` (anywhere when null) filled with
/// `byte`.
fn map(at: *mut libc::c_void, byte: u8) -> *mut u8 {
    let p = map_untouched(at);
    // SAFETY: the mapping is LEN writable bytes, ours alone.
    unsafe { std::ptr::write_bytes(p, byte, LEN) };
    p
}

/// An anonymous private mapping of `LEN` bytes at `at` (anywhere when null) whose pages have
/// never been touched: none is there until the first access faults it in (reading as zeros),
/// as in a large allocation fresh from the allocator.
fn map_untouched(at: *mut libc::c_void) -> *mut u8 {
    let flags =
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if at.is_null() { 0 } else { libc::MAP_FIXED_NOREPLACE };
    // SAFETY: a new anonymous mapping; MAP_FIXED_NOREPLACE never replaces an existing one.
    let p = unsafe { libc::mmap(at, LEN, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
    assert_ne!(p, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
    assert!(at.is_null() || p == at, "the mapping went elsewhere");
    p.cast()
}

/// The mapping's bytes, lent to one send. The send has completed before the mapping goes.
fn lend(p: *mut u8) -> Bytes {
    // SAFETY: the caller keeps the mapping until the operation using these bytes completed.
    Bytes::from_static(unsafe { std::slice::from_raw_parts(p, LEN) })
}

#[test]
#[ignore = "needs root (userfaultfd): the memory monitor"]
fn a_heap_buffer_sent_again_reuses_its_registration_and_is_received_directly() {
    let (srv, cli, p, sp) = pair(None);
    let data = Bytes::from((0..LEN).map(|i| (i * 7) as u8).collect::<Vec<u8>>());
    let (m0, h0) = lookups(&cli);
    let mut into = BytesMut::zeroed(LEN);
    for _ in 0..4 {
        into = send(&srv, &cli, p, sp, data.clone(), into);
    }
    let (m1, h1) = lookups(&cli);
    assert_eq!(m1 - m0, 1, "registered by the first send only");
    assert!(h1 - h0 >= 3, "later sends hit the cache");
    // The server's receive buffer: staged through zone buffers until it has been seen before,
    // then registered and kept, so the last receives copy nothing.
    let copied = srv.info().counters.host_copy_bytes;
    send(&srv, &cli, p, sp, data.clone(), into);
    assert_eq!(srv.info().counters.host_copy_bytes, copied, "received straight into the heap buffer");
}

#[test]
#[ignore = "needs root (userfaultfd): the memory monitor"]
fn a_discarded_receive_buffer_is_not_served_by_its_old_registration() {
    let (srv, cli, p, sp) = pair(None);
    let data = Bytes::from((0..LEN).map(|i| (i * 5) as u8).collect::<Vec<u8>>());
    let mut into = BytesMut::zeroed(LEN);
    for _ in 0..3 {
        into = send(&srv, &cli, p, sp, data.clone(), into);
    }
    let copied = srv.info().counters.host_copy_bytes;
    into = send(&srv, &cli, p, sp, data.clone(), into);
    assert_eq!(srv.info().counters.host_copy_bytes, copied, "the server keeps the buffer registered");
    // What an allocator does with memory it frees but keeps mapped: the whole pages inside the
    // buffer go back to the kernel.
    let (start, end) = (into.as_ptr() as usize, into.as_ptr() as usize + LEN);
    let (start, end) = (start.next_multiple_of(4096), end / 4096 * 4096);
    // SAFETY: the pages lie inside the buffer, which is ours again (its receive completed);
    // they read as zeros after.
    assert_eq!(unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) }, 0);
    let copied = srv.info().counters.host_copy_bytes;
    send(&srv, &cli, p, sp, data.clone(), into);
    // Its old registration is gone: the buffer is new to the engine again, staged this time.
    assert_eq!(
        srv.info().counters.host_copy_bytes - copied,
        LEN as u64,
        "not served by the old registration"
    );
}

#[test]
#[ignore = "needs root (userfaultfd): the memory monitor"]
fn an_unmapped_buffer_is_never_served_from_its_old_registration() {
    let (srv, cli, p, sp) = pair(None);
    let a = map(std::ptr::null_mut(), 0xA1);
    for _ in 0..2 {
        send(&srv, &cli, p, sp, lend(a), BytesMut::zeroed(LEN));
    }
    let (m0, _) = lookups(&cli);
    // SAFETY: nothing uses the mapping any more: both sends completed.
    assert_eq!(unsafe { libc::munmap(a.cast(), LEN) }, 0);
    let b = map(a.cast(), 0xB2);
    send(&srv, &cli, p, sp, lend(b), BytesMut::zeroed(LEN));
    assert_eq!(lookups(&cli).0 - m0, 1, "the new mapping at the old address is registered afresh");
    // SAFETY: the send completed.
    assert_eq!(unsafe { libc::munmap(b.cast(), LEN) }, 0);
}

#[test]
#[ignore = "needs root (userfaultfd): the memory monitor"]
fn discarded_pages_are_registered_afresh_and_can_be_touched_again() {
    let (srv, cli, p, sp) = pair(None);
    let a = map(std::ptr::null_mut(), 0xC3);
    for _ in 0..2 {
        send(&srv, &cli, p, sp, lend(a), BytesMut::zeroed(LEN));
    }
    let (m0, _) = lookups(&cli);
    // What an allocator does with freed memory it keeps mapped: the pages go back to the
    // kernel, and the next touch gets fresh zeroed ones.
    // SAFETY: nothing uses the mapping: both sends completed.
    assert_eq!(unsafe { libc::madvise(a.cast(), LEN, libc::MADV_DONTNEED) }, 0);
    // SAFETY: the mapping is still there; touching it faults the pages in again (it must not
    // hang on the monitor's watch).
    unsafe { std::ptr::write_bytes(a, 0xD4, LEN) };
    send(&srv, &cli, p, sp, lend(a), BytesMut::zeroed(LEN));
    assert_eq!(lookups(&cli).0 - m0, 1, "the discarded range is registered afresh");
    // SAFETY: the send completed.
    assert_eq!(unsafe { libc::munmap(a.cast(), LEN) }, 0);
}

/// Memory whose pages were never touched is faulted in by its own registration (the pinning),
/// which is no discard: the registration stays cached, and later sends of it hit.
#[test]
#[ignore = "needs root (userfaultfd): the memory monitor"]
fn lent_pages_never_touched_stay_registered_after_their_first_send() {
    let (srv, cli, p, sp) = pair(None);
    let a = map_untouched(std::ptr::null_mut());
    let (m0, h0) = lookups(&cli);
    for _ in 0..3 {
        send(&srv, &cli, p, sp, lend(a), BytesMut::zeroed(LEN));
    }
    let (m1, h1) = lookups(&cli);
    assert_eq!(m1 - m0, 1, "registered by the first send only");
    assert!(h1 - h0 >= 2, "later sends hit the cache");
    // SAFETY: the sends completed.
    assert_eq!(unsafe { libc::munmap(a.cast(), LEN) }, 0);
}
