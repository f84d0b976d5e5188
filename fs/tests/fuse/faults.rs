//! Servers the mount cannot reach: what fails, with which code, and what goes on.

use super::*;

/// A server the mount cannot reach: calls that need it fail with `EHOSTDOWN` ("Host is down"),
/// not `ENOTCONN`, which is what a mount whose own process died answers (and what tools test
/// for to unmount it); the mount's log names the server and the cause once, not once per
/// call; once the server is back the mount serves again, from its first call.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_server_the_mount_cannot_reach_is_host_down_and_named_once_in_its_log() {
    let mut tc = TestCluster::start("tcp", 2);
    let (m, log) = mount_logging(&tc, &[]);
    std::fs::write(m.dir.join("f"), b"data").unwrap();
    let meta = tc.cluster.config().meta.to_string();
    tc.cluster.kill_meta();
    for i in 0..20 {
        // A name never looked up: the kernel has nothing of it and asks the meta server.
        let e = std::fs::metadata(m.dir.join(format!("missing{i}"))).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EHOSTDOWN), "{e}");
    }
    assert!(mounted(&m.dir), "the mount lives on");
    let logged = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = logged.lines().filter(|l| l.contains("cannot be reached")).collect();
    assert_eq!(lines.len(), 1, "{logged}");
    assert!(lines[0].contains(&format!("server=meta server ({meta}) cause=")), "{logged}");
    tc.cluster.restart_meta().unwrap();
    assert_eq!(std::fs::read(m.dir.join("f")).unwrap(), b"data");
}

/// A mount of a cluster whose meta server does not answer (down, or a wrong address in the
/// cluster file) or refuses the client (another cluster's key) fails, naming the server and
/// the cause, in the foreground and in the background; it does not mount a file system on
/// which every call fails.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_mount_of_a_cluster_whose_meta_server_does_not_answer_fails_naming_it() {
    let tc = TestCluster::start("tcp", 1);
    let dir = tc.dir.path().join("elsewhere");
    std::fs::create_dir(&dir).unwrap();
    let cluster = tc.copy_cluster_file(&dir, "cluster.key");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let meta = tc.cluster.config().meta.to_string();
    let text = std::fs::read_to_string(&cluster).unwrap().replace(&meta, &format!("tcp://{closed}"));
    std::fs::write(&cluster, text).unwrap();
    let mnt = tc.dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    for args in [&[][..], &["--background"][..]] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stripefs"));
        cmd.arg("--cluster").arg(&cluster).arg("mount").args(args).arg(&mnt);
        let (out, ended) = output_within(&mut cmd, Duration::from_secs(30));
        let was_mounted = mounted(&mnt);
        if was_mounted {
            let _ = Command::new("umount").arg("-l").arg(&mnt).status();
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(ended && !out.status.success() && !was_mounted, "{args:?}: mounted: {was_mounted}: {err}");
        assert!(err.contains("meta server") && err.contains(&closed.to_string()), "{args:?}: {err}");
    }
    // Nor one that refuses this client: another cluster's key.
    let other = tc.dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let cluster = tc.copy_cluster_file(&other, "cluster.key");
    std::fs::write(other.join("cluster.key"), "ab".repeat(32)).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stripefs"));
    let (out, ended) =
        output_within(cmd.arg("--cluster").arg(&cluster).arg("mount").arg(&mnt), Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(ended && !out.status.success() && !mounted(&mnt), "another key: {err}");
    assert!(err.contains("meta server") && err.contains("cluster key"), "another key: {err}");
}

/// `df` on the mount with an io server down shows the space of those up (the dead one is
/// logged) rather than failing, as the mount goes on serving the files on them.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn df_through_the_mount_leaves_out_a_dead_io_server() {
    let mut tc = TestCluster::start("tcp", 2);
    let m = mount(&tc);
    let before = nix::sys::statvfs::statvfs(&m.dir).unwrap();
    tc.cluster.kill_io(1);
    let after = nix::sys::statvfs::statvfs(&m.dir).expect("statfs with an io server down");
    // Both servers keep their data on one file system, which the one left reports whole.
    assert_eq!(after.blocks(), before.blocks());
    assert_eq!(after.files() - after.files_free(), before.files() - before.files_free());
}

/// A file with a stripe on a dead io server keeps its names through the mount: they are
/// listed, renamed, linked and removed (all kept by the meta server), while what needs the
/// file's size or data fails as that server does (`EHOSTDOWN`). A file on the live server is
/// served as before.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_file_on_a_dead_io_server_can_be_renamed_and_removed_through_the_mount() {
    use stripefs::proto::LayoutSpec;
    let mut tc = TestCluster::start("tcp", 2);
    // Made by another client, so that the mount has seen none of them.
    let c = tc.client();
    for (name, base, pcount) in [("/both", 0, 2), ("/on1", 1, 1), ("/on0", 0, 1)] {
        let layout = LayoutSpec { base: Some(base), pcount: Some(pcount), ssize: Some(16384) };
        let f = c.create(name, stripefs::CreateOptions { mode: 0o644, layout: Some(layout) }).unwrap();
        f.write_at(0, &pattern(100_000, 3)).unwrap();
        f.sync().unwrap();
    }
    drop(c);
    let m = mount(&tc);
    tc.cluster.kill_io(1);
    let p = |n: &str| m.dir.join(n);
    let code = |r: std::io::Result<()>| r.map_err(|e| e.raw_os_error());
    assert_eq!(code(std::fs::metadata(p("both")).map(drop)), Err(Some(libc::EHOSTDOWN)), "stat");
    assert_eq!(code(std::fs::read(p("both")).map(drop)), Err(Some(libc::EHOSTDOWN)), "read");
    assert_eq!(code(std::fs::rename(p("both"), p("moved"))), Ok(()), "rename");
    assert_eq!(code(std::fs::hard_link(p("moved"), p("linked"))), Ok(()), "link");
    assert_eq!(code(std::fs::remove_file(p("moved"))), Ok(()), "remove a name");
    assert_eq!(code(std::fs::remove_file(p("linked"))), Ok(()), "remove the last name");
    assert_eq!(code(std::fs::remove_file(p("on1"))), Ok(()), "remove another");
    assert_eq!(std::fs::read(p("on0")).unwrap(), pattern(100_000, 3), "a file on the live server");
    let mut names: Vec<String> =
        std::fs::read_dir(&m.dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["on0"]);
}

/// Through the kernel-cached mode, a write-back that the io servers fail is not lost
/// silently: `fsync` fails, and so does `close` of a file whose dirty pages cannot be written.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn cached_write_back_errors_fail_fsync_and_close() {
    use std::os::unix::fs::FileExt;
    let mut tc = TestCluster::start("tcp", 2);
    let m = mount_with(&tc, &["--cache"]);
    // Two files striped over both io servers, one io server gone, then dirty pages in both
    // (gone first: the kernel may write pages back as soon as they are dirty).
    let f = std::fs::File::create(m.dir.join("a")).unwrap();
    let g = std::fs::File::create(m.dir.join("b")).unwrap();
    tc.cluster.kill_io(1);
    f.write_all_at(&pattern(1 << 20, 1), 0).unwrap();
    g.write_all_at(&pattern(1 << 20, 2), 0).unwrap();
    let e = f.sync_all().expect_err("fsync with an io server gone");
    // The write-back's own error as the mount mapped it, or the kernel's EIO.
    assert!(matches!(e.raw_os_error(), Some(libc::EHOSTDOWN | libc::EIO)), "{e}");
    // close(2)'s own result: std's File ignores it.
    use std::os::fd::IntoRawFd;
    let fd = g.into_raw_fd();
    // SAFETY: `fd` is an open descriptor owned by nothing else now.
    let r = unsafe { libc::close(fd) };
    let err = std::io::Error::last_os_error();
    assert_eq!(r, -1, "close with an io server gone succeeded");
    assert!(matches!(err.raw_os_error(), Some(libc::EHOSTDOWN | libc::EIO)), "{err}");
}
