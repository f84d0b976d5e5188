//! io servers on real small file systems: the server's data directory is a 4 MiB tmpfs (a disk
//! that really fills up), a ramfs (a file system without `fallocate`) or a 40 MiB btrfs image on
//! a loop device (copy-on-write), mounted in a mount namespace of the server's own
//! (`unshare --mount`), so the mount goes away with the server even if the test dies. Mounting
//! needs root, so the tests are ignored unless asked for (`cargo test -- --ignored`, as CI does
//! as root), and then fail where mounting is not permitted.

mod common;

use bytes::BytesMut;
use common::{TestCluster, make_image, on_private_mount, pattern, with_image_mounted};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use stripefs::proto::{LayoutSpec, ServerStats};
use stripefs::{Client, CreateOptions, Errno};

/// Size of the io server's tmpfs.
const DISK: usize = 4 << 20;

/// Why `fstype` cannot be mounted in a private mount namespace here, if it cannot.
fn cannot_mount(fstype: &str) -> Option<String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "mount", "-t", fstype, "stripefs-probe"])
        .arg(dir.path())
        .output();
    match out {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!("cannot mount {fstype}: {}", String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => Some(format!("cannot run unshare: {e}")),
    }
}

/// The `fstype` mounts named `stripefs-test` on `dir` that process `pid` sees.
fn test_mounts(pid: &str, dir: &Path, fstype: &str) -> usize {
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mounts")).expect("mount table");
    let want = format!("stripefs-test {} {fstype} ", dir.display());
    mounts.lines().filter(|l| l.starts_with(&want)).count()
}

/// A one-io-server cluster whose data directory is a fresh `fstype` of the server's own.
fn start_on(scheme: &str, fstype: &str, options: &str, io_args: &[&str]) -> TestCluster {
    let mut data_dir = PathBuf::new();
    let tc = TestCluster::start_with(scheme, 1, |o| {
        data_dir = o.data_dir.join("io0");
        o.io_prefix = Some(vec![on_private_mount(fstype, options, "stripefs-test", &data_dir)]);
        o.io_args = io_args.iter().map(|s| s.to_string()).collect();
    });
    assert_eq!(tc.cluster.config().io_data_dir(0), data_dir);
    // The io server stores on the mount; nobody outside its namespace sees it.
    let io_pid = tc.cluster.pids()[1].to_string();
    assert_eq!(test_mounts(&io_pid, &data_dir, fstype), 1, "the io server's {fstype}");
    assert_eq!(test_mounts("self", &data_dir, fstype), 0, "the mount leaked out of its namespace");
    tc
}

fn io_stats(c: &Client) -> ServerStats {
    c.server_stats().remove(0).expect("the io server answers")
}

fn one_server() -> CreateOptions {
    CreateOptions {
        mode: 0o644,
        layout: Some(LayoutSpec { base: None, pcount: Some(1), ssize: Some(65536) }),
    }
}

/// Waits until the objects of `f`, a file just unlinked, are gone: the meta server removes
/// them right after the unlink's answer, and only then is their space free.
fn wait_removed(f: &stripefs::File) {
    let t = std::time::Instant::now();
    while f.read_at(0, BytesMut::zeroed(1)).is_ok() {
        assert!(t.elapsed() < Duration::from_secs(30), "the unlinked file's objects were never removed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_back(f: &stripefs::File, off: u64, len: usize) -> Vec<u8> {
    let (b, n) = f.read_at(off, BytesMut::zeroed(len)).expect("read");
    assert_eq!(n, len, "short read at {off}");
    b.to_vec()
}

/// A write larger than the disk's free space fails with `ENOSPC` (no hang, no SIGBUS: the io
/// server lives on and answers), and the same connection then carries a smaller write and its
/// read back. The mapped path refuses the write before a byte moves (`fallocate` first), so the
/// file keeps its size; the copying path fills what fits, then drains the rest.
fn write_past_a_full_disk(scheme: &str, copy: bool) {
    if let Some(why) = cannot_mount("tmpfs") {
        panic!("{why}");
    }
    let mut tc = start_on(scheme, "tmpfs", &format!("size={DISK}"), if copy { &["--copy-io"] } else { &[] });
    // (the path this server must use, the other one)
    let paths = |s: &ServerStats| if copy { (s.copied, s.mapped) } else { (s.mapped, s.copied) };
    let c = tc.client();
    let f = c.create("/big", one_server()).unwrap();
    let first = pattern(DISK / 2, 1);
    f.write_at(0, &first).unwrap();
    let s0 = io_stats(&c);
    // Twice the whole disk, after the half already used.
    let too_much = pattern(2 * DISK, 2);
    let e = f.write_at(first.len() as u64, &too_much).unwrap_err();
    if e.errno() != Errno::ENOSPC {
        // Most likely the server died (a SIGBUS from a store into an unreserved page): say so.
        std::thread::sleep(Duration::from_millis(500));
        panic!("{e} instead of ENOSPC; io server: {:?}", tc.cluster.exited());
    }
    assert_eq!(tc.cluster.exited(), None, "the io server survived the full disk");
    let s1 = io_stats(&c);
    assert_eq!((s1.errors - s0.errors, s1.writes - s0.writes), (1, 0), "one failed write");
    assert_eq!(s1.fallbacks, s0.fallbacks, "tmpfs has fallocate: no fallback");
    let ((took0, _), (took1, idle1)) = (paths(&s0), paths(&s1));
    assert_eq!((took1.writes - took0.writes, took1.bytes), (1, took0.bytes), "taken by the right path");
    assert_eq!(idle1, Default::default(), "nothing on the other path");
    if !copy {
        assert_eq!(f.size().unwrap(), first.len() as u64, "refused before a byte moved");
    }
    // Over the same connection: a write that fits, and both writes read back.
    let small = pattern(DISK / 4, 3);
    f.write_at(first.len() as u64, &small).unwrap();
    assert_eq!(read_back(&f, 0, first.len()), &first[..]);
    assert_eq!(read_back(&f, first.len() as u64, small.len()), &small[..]);
    if !copy {
        assert_eq!(f.size().unwrap(), (first.len() + small.len()) as u64);
    }
    // Still full for anything bigger than what is left, and still serving afterwards.
    assert_eq!(f.write_at(0, &too_much).unwrap_err().errno(), Errno::ENOSPC);
    // Removing the file frees the disk: nothing of the failed writes stays reserved.
    c.unlink("/big").unwrap();
    wait_removed(&f);
    let g = c.create("/again", one_server()).unwrap();
    let most = pattern(DISK * 3 / 4, 4);
    g.write_at(0, &most).unwrap();
    assert_eq!(read_back(&g, 0, most.len()), &most[..]);
    assert_eq!(tc.cluster.exited(), None);
    let (took2, idle2) = paths(&io_stats(&c));
    assert_eq!((took2.writes - took1.writes, idle2), (3, Default::default()));
}

/// A file system without `fallocate` (ramfs): a mapping io server copies the writes, still maps
/// the reads, and stores the right bytes. ramfs is not on the list of file systems that
/// rewrite in place, so the server copies every write from the start rather than falling back
/// request by request (the `no_fallocate` fallback is for the odd object without `fallocate`
/// on a listed one; `tests/e2e/faults.rs` makes one from `/dev/full`).
fn objects_without_fallocate_are_written_by_copying(scheme: &str) {
    if let Some(why) = cannot_mount("ramfs") {
        panic!("{why}");
    }
    let tc = start_on(scheme, "ramfs", "mode=0755", &[]);
    let c = tc.client();
    let f = c.create("/ram", one_server()).unwrap();
    let data = pattern(1 << 20, 5);
    f.write_at(0, &data).unwrap();
    f.write_at(3 << 20, &data.slice(..1000)).unwrap();
    let s = io_stats(&c);
    assert_eq!(s.fallbacks.no_fallocate, 0);
    assert_eq!((s.copied.writes, s.copied.bytes, s.mapped.writes), (2, (1 << 20) + 1000, 0));
    assert_eq!(read_back(&f, 0, data.len()), &data[..]);
    assert!(read_back(&f, 1 << 20, 2 << 20).iter().all(|&b| b == 0), "the hole reads as zeros");
    assert_eq!(read_back(&f, 3 << 20, 1000), &data[..1000]);
    let s2 = io_stats(&c);
    // Over tcp the 2 MiB read goes as two requests (the client's 1 MiB read limit).
    let reads = if scheme == "tcp" { 4 } else { 3 };
    assert_eq!((s2.mapped.reads, s2.copied.reads, s2.fallbacks), (reads, 0, s.fallbacks));
}

/// Size of the btrfs image of [`copy_on_write_file_systems_take_the_copying_path`].
const BTRFS_IMAGE: u64 = 40 << 20;

/// A copy-on-write file system (btrfs on a loop device, `mkfs.btrfs --mixed` for a small one):
/// a rewrite needs new space however much `fallocate` reserved, so a store through a mapping
/// into a full btrfs faults. The io server must copy every write there (reads may stay mapped),
/// and writes into the full disk — new data, and rewrites of data already there — must fail
/// with `ENOSPC` while the server lives on. Needs root, loop devices, btrfs in the kernel and
/// `mkfs.btrfs` (btrfs-progs); fails, saying which is missing, otherwise.
fn copy_on_write_file_systems_take_the_copying_path(scheme: &str) {
    let probe = tempfile::tempdir().unwrap();
    let probe_img = probe.path().join("probe.img");
    if let Err(why) = make_image("btrfs", &probe_img, BTRFS_IMAGE, &["-q", "--mixed"])
        .and_then(|()| with_image_mounted("btrfs", &probe_img, "true", &[]))
    {
        panic!("{why}");
    }
    let mut data_dir = PathBuf::new();
    let mut tc = TestCluster::start_with(scheme, 1, |o| {
        data_dir = o.data_dir.join("io0");
        let image = o.data_dir.join("io0.img");
        make_image("btrfs", &image, BTRFS_IMAGE, &["-q", "--mixed"]).unwrap();
        o.io_prefix = Some(vec![on_private_mount("btrfs", "loop", &image.display().to_string(), &data_dir)]);
    });
    let c = tc.client();
    let s0 = io_stats(&c);
    let f = c.create("/kept", one_server()).unwrap();
    let first = pattern(8 << 20, 1);
    f.write_at(0, &first).unwrap();
    assert_eq!(read_back(&f, 0, first.len()), &first[..]);
    let s1 = io_stats(&c);
    assert_eq!(
        (s1.mapped.writes, s1.copied.writes - s0.copied.writes, s1.copied.bytes),
        (0, 1, first.len() as u64),
        "btrfs: the write was copied, not mapped"
    );
    assert!(s1.mapped.reads > 0, "reads stay mapped");
    assert_eq!(s1.fallbacks, s0.fallbacks, "not a per-request fallback");
    // Fill the disk to the last few KiB, in ever smaller writes, each refused with ENOSPC in
    // the end.
    let g = c.create("/filler", one_server()).unwrap();
    let filler = pattern(1 << 20, 2);
    let mut off = 0u64;
    for chunk in [1 << 20, 64 << 10, 4 << 10] {
        for _ in 0..=BTRFS_IMAGE / chunk {
            match g.write_at(off, &filler.slice(..chunk as usize)) {
                Ok(_) => off += chunk,
                Err(e) if e.errno() == Errno::ENOSPC => break,
                Err(e) => {
                    std::thread::sleep(Duration::from_millis(500));
                    panic!("{e} instead of ENOSPC at {off}; io server: {:?}", tc.cluster.exited());
                }
            }
        }
        assert_eq!(tc.cluster.exited(), None, "the io server survived the full disk");
    }
    assert!(off < BTRFS_IMAGE, "the disk filled up after {off} bytes");
    // Rewriting what is there needs new space on a copy-on-write file system: ENOSPC or done,
    // never a dead server, on every offset of the file.
    let second = pattern(first.len(), 3);
    for (i, r) in [(0, 1 << 20), (3 << 20, 4096), (5 << 20, 3 << 20)].into_iter().enumerate() {
        match f.write_at(r.0, &second.slice(r.0 as usize..(r.0 + r.1) as usize)) {
            Ok(_) => {}
            Err(e) => assert_eq!(e.errno(), Errno::ENOSPC, "rewrite {i} into the full disk: {e}"),
        }
        assert_eq!(tc.cluster.exited(), None, "the io server survived rewrite {i} into the full disk");
    }
    // Freeing space makes rewrites work again, and they read back.
    c.unlink("/filler").unwrap();
    wait_removed(&g);
    f.write_at(0, &second).unwrap();
    assert_eq!(read_back(&f, 0, second.len()), &second[..]);
    let s2 = io_stats(&c);
    assert_eq!(s2.mapped.writes, 0, "no write was ever mapped on btrfs");
    assert_eq!(tc.cluster.exited(), None);
}

macro_rules! transports {
    ($($scheme:ident),*) => {$(
        mod $scheme {
            const S: &str = stringify!($scheme);
            #[test] #[ignore = "needs root: mounts a tmpfs"]
            fn mapped_write_past_a_full_disk() { super::write_past_a_full_disk(S, false) }
            #[test] #[ignore = "needs root: mounts a tmpfs"]
            fn copying_write_past_a_full_disk() { super::write_past_a_full_disk(S, true) }
            #[test] #[ignore = "needs root: mounts a ramfs"]
            fn objects_without_fallocate_are_written_by_copying() { super::objects_without_fallocate_are_written_by_copying(S) }
            #[test] #[ignore = "needs root, loop devices and mkfs.btrfs: mounts a btrfs image"]
            fn copy_on_write_file_systems_take_the_copying_path() { super::copy_on_write_file_systems_take_the_copying_path(S) }
        }
    )*};
}

transports!(tcp, softib);
