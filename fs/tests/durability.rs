//! Crash durability of the io servers: an io server killed with SIGKILL while clients write
//! and read fails those clients with an error within a bound (no hang), and after a restart
//! every write whose `sync` was acknowledged reads back intact — including on the server that
//! died. (`e2e/faults.rs` covers the error alone and a restart after an idle kill.)
//!
//! SIGKILL loses nothing the kernel already has, so what this proves is that an
//! acknowledged `sync` means the bytes left the server process (no acknowledgement of data
//! still in a user-space buffer). Power loss is out of its reach.

mod common;

use bytes::{Bytes, BytesMut};
use common::{TestCluster, make_image, on_private_mount, pattern, with_image_mounted};
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
    // Every acknowledged sync was an fsync on every server (each region spans all four), plus
    // the one of /readme: a sync that skipped the servers would still read back after a SIGKILL,
    // which loses nothing the kernel holds.
    for (i, st) in c.server_stats().into_iter().enumerate() {
        let syncs = st.expect("every server answers before the kill").syncs;
        assert!(syncs > acked.len() as u64, "io server {i}: {syncs} syncs for {} acknowledged", acked.len());
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
    // The cluster serves new writes on the restarted server once the meta server has seen it
    // answer: a server whose failure it noticed only late (a loaded host) counts as silent, and
    // creates on it fail at once until its hold-off ends and a check finds it back.
    let t = Instant::now();
    let g = loop {
        match c.create("/after", CreateOptions { mode: 0o644, layout }) {
            Ok(g) => break g,
            Err(e) if e.errno() == Errno::ETIMEDOUT && t.elapsed() < BOUND => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => panic!("a create on the restarted server: {e}"),
        }
    };
    let d = pattern(REGION, 5);
    g.write_at(0, &d).unwrap();
    g.sync().unwrap();
    assert!(g.read_at(0, BytesMut::zeroed(REGION)).unwrap().0[..] == d[..]);
}

/// Size of the file system image of [`acknowledged_sync_survives_a_power_cut`].
const IMAGE: u64 = 64 << 20;

/// What a power cut leaves: the io server's data directory is an ext4 image on a loop device,
/// and right after `sync` is acknowledged the test copies the image — the bytes the "disk" holds,
/// without whatever sits dirty in the server's page cache — mounts the copy (replaying its
/// journal, as after a crash) and reads the object back. Unsynced data would still be in the
/// page cache (writeback starts after 30 s), so a `sync` that did not `fsync` fails this. Needs
/// root (mount namespaces, loop devices) and `mkfs.ext4`; fails, saying which is missing,
/// otherwise.
fn acknowledged_sync_survives_a_power_cut(scheme: &str) {
    let probe = tempfile::tempdir().unwrap();
    let probe_img = probe.path().join("probe.img");
    if let Err(why) = make_image("ext4", &probe_img, 16 << 20, &["-q", "-F"])
        .and_then(|()| with_image_mounted("ext4", &probe_img, "true", &[]))
    {
        panic!("{why}");
    }
    let mut image = std::path::PathBuf::new();
    let tc = TestCluster::start_with(scheme, 1, |o| {
        image = o.data_dir.join("io0.img");
        make_image("ext4", &image, IMAGE, &["-q", "-F"]).unwrap();
        let dir = o.data_dir.join("io0");
        o.io_prefix = Some(vec![on_private_mount("ext4", "loop", &image.display().to_string(), &dir)]);
    });
    let c = tc.client();
    let one = Some(LayoutSpec { base: Some(0), pcount: Some(1), ssize: Some(65536) });
    let f = c.create("/precious", CreateOptions { mode: 0o644, layout: one }).unwrap();
    // Written in three calls, the last one extending the file past a transfer unit.
    let data = pattern(3 << 20, 7);
    f.write_at(0, &data.slice(..1 << 20)).unwrap();
    f.write_at(2 << 20, &data.slice(2 << 20..)).unwrap();
    f.write_at(1 << 20, &data.slice(1 << 20..2 << 20)).unwrap();
    f.sync().unwrap();
    let cut = tc.dir.path().join("after-the-cut.img");
    std::fs::copy(&image, &cut).unwrap();

    let rel =
        stripefs::store::ObjectStore::object_path(std::path::Path::new(""), f.handle()).display().to_string();
    let got = with_image_mounted("ext4", &cut, r#"cat "$0/$1""#, &[&rel]).unwrap();
    assert_eq!(got.len(), data.len(), "the object's size after the power cut");
    let bad = got.iter().zip(&data[..]).position(|(a, b)| a != b);
    assert_eq!(bad, None, "the synced object differs after the power cut from byte {bad:?} on");
}

/// Size of the file [`killed_client_mid_write_leaves_only_landed_bytes`] copies: four of
/// `stripefs cp`'s 16 MiB chunks.
const COPIED: usize = 64 << 20;

/// `stripefs cp` of a new file, SIGKILLed as soon as the file has a size (so, most likely, in
/// the middle of a write request): afterwards no io server's object may hold a byte that did not
/// come from the source. Each object must be a prefix of that server's share of the source
/// (objects read straight from the servers' data directories), the logical size at most the
/// source's, and every byte of the file below it the source's or, where a server fell behind
/// the others, a hole past that server's end. With one server the file is a prefix of the
/// source outright.
fn killed_client_mid_write_leaves_only_landed_bytes(scheme: &str, pcount: u32) {
    let tc = TestCluster::start(scheme, 4);
    let src = tc.dir.path().join("src.bin");
    let data = pattern(COPIED, 11);
    std::fs::write(&src, &data).unwrap();
    let c = tc.client();
    let mut cp = std::process::Command::new(env!("CARGO_BIN_EXE_stripefs"))
        .arg("--cluster")
        .arg(tc.cluster.config_path())
        .args(["cp", "--stripe-count", &pcount.to_string(), "--stripe-size", "65536"])
        .arg(&src)
        .arg("sfs:/copy")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let errors =
        |c: &stripefs::Client| -> u64 { c.server_stats().into_iter().map(|s| s.unwrap().errors).sum() };
    let errors0 = errors(&c);
    let t = Instant::now();
    let live = |cp: &mut std::process::Child| {
        assert!(t.elapsed() < BOUND, "the copy never started");
        assert!(cp.try_wait().unwrap().is_none(), "cp finished before it could be killed");
    };
    let f = loop {
        if let Ok(f) = c.open("/copy", Rights::READ) {
            break f;
        }
        live(&mut cp);
    };
    // Only the io servers' sizes from here: the kill should come while data is on the wire.
    let seen = loop {
        match f.size() {
            Ok(n) if n > 0 => break n,
            _ => live(&mut cp),
        }
    };
    cp.kill().unwrap();
    cp.wait().unwrap();
    // The servers serving the killed client's requests fail them; wait for that (bounded: a kill
    // that fell between two requests leaves nothing to fail).
    let t = Instant::now();
    while errors(&c) == errors0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let failed = errors(&c) - errors0;
    // The killed client's requests under way at other servers end after that first failure:
    // their data lands, or their mapped write cuts its file back to what landed. Wait (bounded)
    // until the servers have settled: the size they report and their objects' lengths the same
    // at two looks in a row.
    let layout = f.layout();
    let object = |pnum: u32| {
        let dir = tc.cluster.config().io_data_dir(layout.server(pnum, 4));
        stripefs::store::ObjectStore::object_path(&dir, f.handle())
    };
    let look = || {
        let lengths: Vec<u64> =
            (0..layout.pcount).map(|p| std::fs::metadata(object(p)).map_or(0, |m| m.len())).collect();
        (f.size().unwrap(), lengths)
    };
    let t = Instant::now();
    let mut last = look();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = look();
        let settled = now == last && layout.logical_size(&now.1) == now.0;
        last = now;
        if settled || t.elapsed() > Duration::from_secs(10) {
            break;
        }
    }
    let size = last.0;
    eprintln!(
        "{scheme}, {pcount} server(s): killed at {seen} bytes; size {size}; {failed} request(s) failed"
    );
    assert!(size as usize <= data.len(), "size {size} past the source's {}", data.len());
    let mut local_sizes = Vec::new();
    for pnum in 0..layout.pcount {
        let server = layout.server(pnum, 4);
        let object = std::fs::read(object(pnum)).unwrap();
        for (local, got) in object.iter().enumerate() {
            let at = layout.logical_offset(pnum, local as u64).unwrap() as usize;
            assert!(
                data.get(at) == Some(got),
                "io server {server}: local byte {local} of {} (file offset {at}) is not the source's",
                object.len()
            );
        }
        local_sizes.push(object.len() as u64);
    }
    assert_eq!(layout.logical_size(&local_sizes), size, "the size is what the objects hold");
    let (back, n) = f.read_at(0, BytesMut::zeroed(size as usize)).unwrap();
    assert_eq!(n, size as usize);
    for (at, (&got, &want)) in back.iter().zip(&data[..]).enumerate() {
        if got != want {
            let (pnum, local) = (layout.map(at as u64).pnum, layout.map(at as u64).local_off);
            assert!(
                got == 0 && local >= local_sizes[pnum as usize],
                "file byte {at} is neither the source's nor a hole past its server's end"
            );
        }
    }
    if pcount == 1 {
        assert!(back[..] == data[..back.len()], "one server: the file is a prefix of the source");
    }
}

macro_rules! transports {
    ($($scheme:ident),*) => {$(
        mod $scheme {
            #[test]
            fn killed_io_server_mid_write_keeps_every_synced_write() {
                super::killed_io_server_mid_write_keeps_every_synced_write(stringify!($scheme))
            }
            #[test]
            fn killed_client_mid_write_on_one_server_leaves_only_landed_bytes() {
                super::killed_client_mid_write_leaves_only_landed_bytes(stringify!($scheme), 1)
            }
            #[test]
            fn killed_client_mid_striped_write_leaves_only_landed_bytes() {
                super::killed_client_mid_write_leaves_only_landed_bytes(stringify!($scheme), 4)
            }
            #[test]
            #[ignore = "needs root, loop devices and mkfs.ext4: mounts an ext4 image"]
            fn acknowledged_sync_survives_a_power_cut() {
                super::acknowledged_sync_survives_a_power_cut(stringify!($scheme))
            }
        }
    )*};
}

transports!(tcp, softib);
