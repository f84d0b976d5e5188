//! Crash durability of the io servers: an io server killed with SIGKILL while clients write
//! and read fails those clients with an error within a bound (no hang), and after a restart
//! every write whose `sync` was acknowledged reads back intact — including on the server that
//! died. (`e2e.rs` covers the error alone and a restart after an idle kill.)
//!
//! SIGKILL loses nothing the kernel already has, so what this proves is that an
//! acknowledged `sync` means the bytes left the server process (no acknowledgement of data
//! still in a user-space buffer). Power loss is out of its reach.

mod common;

use bytes::{Bytes, BytesMut};
use common::{TestCluster, pattern};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use stripefs::capability::Rights;
use stripefs::proto::LayoutSpec;
use stripefs::{CreateOptions, Errno};

/// A client call must end (with a result or an error) within this after the kill.
const BOUND: Duration = Duration::from_secs(60);
/// Each region: three stripes of 64 KiB on four servers, so every region touches the victim.
const REGION: usize = 3 * 65536 + 4321;

fn region(i: u64) -> (u64, Bytes) {
    (i * REGION as u64 * 2, pattern(REGION, 1000 + i))
}

fn killed_io_server_mid_write_keeps_every_synced_write(scheme: &str) {
    let mut tc = TestCluster::start(scheme, 4);
    let c = tc.client();
    let layout = Some(LayoutSpec { base: Some(0), pcount: Some(4), ssize: Some(65536) });
    let f = c.create("/journal", CreateOptions { mode: 0o644, layout }).unwrap();
    let r = c.create("/readme", CreateOptions { mode: 0o644, layout }).unwrap();
    let big = pattern(4 << 20, 77);
    r.write_at(0, &big).unwrap();
    r.sync().unwrap();

    // Writer: region after region, each followed by sync; reports every acknowledged one.
    let (acked_tx, acked_rx) = mpsc::channel::<u64>();
    let (done_tx, done_rx) = mpsc::channel::<(&'static str, Option<stripefs::FsError>)>();
    let wf = f;
    let wdone = done_tx.clone();
    std::thread::spawn(move || {
        for i in 0.. {
            let (off, data) = region(i);
            let r = wf.write_at(off, &data).and_then(|_| wf.sync());
            match r {
                Ok(()) => acked_tx.send(i).unwrap(),
                Err(e) => return wdone.send(("writer", Some(e))).unwrap(),
            }
        }
    });
    // Reader: keeps reading a large file striped over every server.
    let rf = r;
    std::thread::spawn(move || {
        loop {
            match rf.read_at(0, BytesMut::zeroed(4 << 20)) {
                Ok((b, n)) => assert!(n == b.len() && b[..] == big[..], "a read returned wrong data"),
                Err(e) => return done_tx.send(("reader", Some(e))).unwrap(),
            }
        }
    });

    // Let some syncs be acknowledged, then kill a server in the middle of the traffic.
    let mut acked = Vec::new();
    while acked.len() < 5 {
        acked.push(acked_rx.recv_timeout(BOUND).expect("syncs are acknowledged before the kill"));
    }
    tc.cluster.kill_io(1);
    let killed_at = Instant::now();
    let mut failed = Vec::new();
    while failed.len() < 2 {
        let left = BOUND.saturating_sub(killed_at.elapsed());
        let (who, err) =
            done_rx.recv_timeout(left).unwrap_or_else(|_| panic!("a client hung: {failed:?} ended"));
        let err = err.unwrap();
        assert!(
            [Errno::ENOTCONN, Errno::EIO, Errno::ETIMEDOUT].contains(&err.errno()),
            "{who}: a clear error, got {:?}: {err}",
            err.errno()
        );
        failed.push(who);
    }
    acked.extend(acked_rx.try_iter());
    drop(c);

    // Restart; a fresh client sees every acknowledged region intact.
    tc.cluster.restart_io(1).unwrap();
    let c = tc.client();
    let f = c.open("/journal", Rights::READ).unwrap();
    for &i in &acked {
        let (off, data) = region(i);
        let (b, n) = f.read_at(off, BytesMut::zeroed(REGION)).unwrap();
        assert_eq!(n, REGION, "region {i}: short read");
        assert!(b[..] == data[..], "region {i} was acknowledged by sync but is not intact");
    }
    // The cluster serves new writes on the restarted server.
    let g = c.create("/after", CreateOptions { mode: 0o644, layout }).unwrap();
    let d = pattern(REGION, 5);
    g.write_at(0, &d).unwrap();
    g.sync().unwrap();
    assert!(g.read_at(0, BytesMut::zeroed(REGION)).unwrap().0[..] == d[..]);
}

macro_rules! transports {
    ($($scheme:ident),*) => {$(
        mod $scheme {
            #[test]
            fn killed_io_server_mid_write_keeps_every_synced_write() {
                super::killed_io_server_mid_write_keeps_every_synced_write(stringify!($scheme))
            }
        }
    )*};
}

transports!(tcp, softib);
