//! Mounting and unmounting: what is refused and named, the mount helper, background mounts,
//! signals, and a mount whose process died.

use super::*;

/// Where the mounting user may not open the FUSE device (some containers keep it to root), the
/// refusal names the device rather than reading as if it were the mount point's. Checked only
/// on such a host, as root.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_fuse_device_the_user_may_not_open_is_named() {
    use std::os::unix::fs::PermissionsExt;
    let as_user = |args: &[&std::ffi::OsStr]| {
        Command::new("setpriv")
            .args(["--reuid=4001", "--regid=4001", "--clear-groups"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let probe = as_user(&["test", "-r", "/dev/fuse", "-a", "-w", "/dev/fuse"].map(std::ffi::OsStr::new));
    if !nix::unistd::geteuid().is_root() || probe.status.success() {
        return; // Nothing to see here: the device is open to every user.
    }
    let tc = TestCluster::start("tcp", 1);
    // The user's own copy of the cluster file and key, and a mount point of theirs.
    let home = tc.dir.path().join("user");
    std::fs::create_dir_all(home.join("mnt")).unwrap();
    let cluster = tc.copy_cluster_file(&home, "user.key");
    std::fs::set_permissions(tc.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for p in [home.clone(), home.join("mnt"), cluster.clone(), home.join("user.key")] {
        std::os::unix::fs::chown(&p, Some(4001), Some(4001)).unwrap();
    }
    let exe = std::ffi::OsStr::new(env!("CARGO_BIN_EXE_stripefs"));
    let mnt = home.join("mnt");
    let out = as_user(&[exe, "--cluster".as_ref(), cluster.as_os_str(), "mount".as_ref(), mnt.as_os_str()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("/dev/fuse"), "{err}");
    assert!(!mounted(&mnt));
}

/// A mount point must be a directory, as the mount's root is one.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_mount_on_a_file_is_refused() {
    let tc = TestCluster::start("tcp", 1);
    let file = tc.dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    for args in [&[][..], &["--background"][..]] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stripefs"));
        cmd.arg("--cluster").arg(tc.cluster.config_path()).arg("mount").args(args).arg(&file);
        // A mount in the foreground that went ahead would serve until unmounted.
        let (out, ended) = output_within(&mut cmd, Duration::from_secs(20));
        if mounted(&file) {
            let _ = Command::new("umount").arg("-l").arg(&file).status();
            panic!("{args:?}: mounted on a file");
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(ended && !out.status.success() && err.contains("not a directory"), "{args:?}: {err}");
    }
}

/// A mount whose process was killed leaves a mount the kernel answers only with "transport
/// endpoint is not connected"; mounting again on that path takes it away and serves there.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_mount_takes_the_place_of_one_whose_process_was_killed() {
    let tc = TestCluster::start("tcp", 1);
    let mut m = mount(&tc);
    std::fs::write(m.dir.join("f"), b"kept").unwrap();
    let kill = |m: &mut Mount| {
        m.child.kill().unwrap();
        m.child.wait().unwrap();
        let dead = nix::sys::statfs::statfs(&m.dir).unwrap_err();
        assert_eq!(dead, nix::errno::Errno::ENOTCONN);
    };
    let mount_cmd = |args: &[&str], at: &Path| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stripefs"));
        cmd.arg("--cluster").arg(tc.cluster.config_path()).arg("mount").args(args).arg(at);
        cmd.stdin(Stdio::null()).stderr(Stdio::null());
        cmd
    };
    let dir = m.dir.clone();
    let on_path = || {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        info.lines().filter(|l| l.split(' ').nth(4) == dir.to_str()).count()
    };
    kill(&mut m);
    // In the foreground, named through a link (the kernel lists the path resolved).
    let link = tc.dir.path().join("link");
    std::os::unix::fs::symlink(tc.dir.path(), &link).unwrap();
    m.child = mount_cmd(&[], &link.join("mnt")).spawn().unwrap();
    let t = Instant::now();
    while std::fs::read(m.dir.join("f")).ok().as_deref() != Some(b"kept") {
        assert!(m.child.try_wait().unwrap().is_none(), "the mount exited");
        assert!(t.elapsed() < Duration::from_secs(20), "the file is not served");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(on_path(), 1, "the dead mount is still there beneath the new one");
    kill(&mut m);
    // In the background.
    run(&mut mount_cmd(&["--background"], &m.dir));
    assert_eq!(std::fs::read(m.dir.join("f")).unwrap(), b"kept");
    assert_eq!(on_path(), 1, "the dead mount is still there beneath the new one");
}

/// mount(8) mounts stripefs through `/sbin/mount.stripefs`, a link to the binary, for `mount -t
/// stripefs` and `/etc/fstab`: the helper takes mount's arguments, and fstab's options, and
/// returns once the mount is live, served in the background. The mount is listed with the
/// cluster file as its source, which is how `mount -a` finds an fstab entry mounted already.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn mount_8_mounts_through_the_helper() {
    let tc = TestCluster::start("tcp", 2);
    let helper = tc.dir.path().join("mount.stripefs");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_stripefs"), &helper).unwrap();
    let mnt = tc.dir.path().canonicalize().unwrap().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let cluster = tc.cluster.config_path().canonicalize().unwrap();
    let helper_cmd = |options: &str| {
        let mut cmd = Command::new(&helper);
        cmd.arg(&cluster).arg(&mnt).args(["-o", options]).stdin(Stdio::null());
        cmd
    };
    // As mount(8) passes an fstab entry's options: with `_netdev` and `nofail`, which are
    // mount's, and an `x-` option (which mount drops itself, but other callers may not).
    let options = "rw,noexec,noatime,_netdev,nofail,x-systemd.automount,cache,threads=2";
    let out = run(&mut helper_cmd(options));
    let said = String::from_utf8_lossy(&out.stdout);
    let pid = said.split("(pid ").nth(1).and_then(|p| p.trim().trim_end_matches(')').parse::<i32>().ok());
    let pid = pid.unwrap_or_else(|| panic!("no pid in {said:?}"));
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            if mounted(self.0) {
                let _ = Command::new("umount").arg(self.0).status();
            }
        }
    }
    let _unmount = Unmount(&mnt);
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info.lines().find(|l| l.split(' ').nth(4) == mnt.to_str()).expect("listed");
    let (mount_part, fs_part) = line.split_once(" - ").unwrap();
    let flags: Vec<&str> = mount_part.split(' ').nth(5).unwrap().split(',').collect();
    for f in ["rw", "noexec", "noatime", "nosuid", "nodev"] {
        assert!(flags.contains(&f), "{f} missing from {line}");
    }
    let fs: Vec<&str> = fs_part.split(' ').collect();
    assert_eq!((fs[0], fs[1]), ("fuse.stripefs", cluster.to_str().unwrap()), "{line}");
    // fstab's stripefs options reached the mount's server.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<String> =
        cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    assert!(args.contains(&"--cache".into()) && args.windows(2).any(|w| w == ["--threads", "2"]), "{args:?}");
    std::fs::write(mnt.join("f"), b"through fstab").unwrap();
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"through fstab");
    // Options it does not know are refused by name, or left out with mount's -s (sloppy); -f
    // (fake) checks them and mounts nothing.
    let bad = helper_cmd("rw,bogus").arg("-f").output().unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("\"bogus\""));
    run(helper_cmd("rw,bogus").args(["-s", "-f"]));
    // Unmounted by `umount`, the mount's server exits.
    run(Command::new("umount").arg(&mnt));
    let t = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(t.elapsed() < Duration::from_secs(20), "the mount's server is still running");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A second mount of a cluster on the directory where it is mounted is refused, as the kernel
/// refuses a device mounted twice on one directory: FUSE would stack it over the first, which
/// then serves only who holds it open (a service started twice, `mount` run again by hand).
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_second_mount_of_a_cluster_on_its_mount_point_is_refused() {
    let tc = TestCluster::start("tcp", 1);
    let m = mount(&tc);
    std::fs::write(m.dir.join("f"), b"first").unwrap();
    for args in [&[][..], &["--background"][..]] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stripefs"));
        cmd.arg("--cluster").arg(tc.cluster.config_path()).arg("mount").args(args).arg(&m.dir);
        let (out, ended) = output_within(&mut cmd, Duration::from_secs(20));
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let on_path = info.lines().filter(|l| l.split(' ').nth(4) == m.dir.to_str()).count();
        if on_path > 1 {
            let _ = Command::new("umount").arg(&m.dir).status();
            panic!("{args:?}: mounted a second time");
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(ended && !out.status.success() && err.contains("mounted there already"), "{args:?}: {err}");
    }
    assert_eq!(std::fs::read(m.dir.join("f")).unwrap(), b"first");
}

/// A mount unmounted by someone else ends without unmounting anything more: not another file
/// system mounted on the same path meanwhile (as a restart of the mount would), and it does
/// not log a failed unmount. The mount's server is stopped until the other file system is
/// there, so that it cannot end before.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn an_unmounted_mount_leaves_the_next_mount_on_its_path_alone() {
    let tc = TestCluster::start("tcp", 2);
    let (mut m, log) = mount_logging(&tc, &[]);
    let (mnt, pid) = (m.dir.clone(), m.pid());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // Not canonicalized: a look at the mount point would wait for the stopped server.
    run(Command::new("umount").arg("--no-canonicalize").arg(&mnt));
    run(Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "stripefs-next"]).arg(&mnt));
    std::fs::write(mnt.join("mark"), b"next").unwrap();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let status = exit_within(&mut m.child, Duration::from_secs(20)).expect("the mount's server ends");
    let next_there = std::fs::read(mnt.join("mark")).ok();
    // The guard unmounts the next file system once done.
    assert_eq!(
        next_there.as_deref(),
        Some(&b"next"[..]),
        "the next file system on the path is still mounted"
    );
    assert!(status.success(), "the mount's server ended with {status}");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(!logged.contains("umount") && !logged.contains("nmount failed"), "{logged}");
}

/// SIGTERM unmounts the mount and ends its server; while the mount is in use it stays, served,
/// and a later SIGTERM, once it is not, unmounts it.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn sigterm_unmounts_a_mount_once_it_is_not_in_use() {
    use nix::sys::signal::{Signal, kill};
    let tc = TestCluster::start("tcp", 2);
    let (mut m, log) = mount_logging(&tc, &[]);
    let (mnt, pid) = (m.dir.clone(), m.pid());
    std::fs::write(mnt.join("f"), b"kept").unwrap();
    let open = std::fs::File::open(mnt.join("f")).unwrap();
    kill(pid, Signal::SIGTERM).unwrap();
    let t = Instant::now();
    while !std::fs::read_to_string(&log).unwrap().contains("unmount failed") {
        assert!(t.elapsed() < Duration::from_secs(20), "no unmount tried");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(mounted(&mnt), "a mount in use stays");
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"kept", "and is served");
    drop(open);
    // Not in use now, as far as this test goes; but a process another test starts meanwhile
    // holds a copy of every descriptor open then until it has started its program, and the
    // kernel counts it as a use. Each SIGTERM tries again.
    let failures = || std::fs::read_to_string(&log).unwrap().matches("unmount failed").count();
    let mut status = None;
    let t = Instant::now();
    while status.is_none() && t.elapsed() < Duration::from_secs(20) {
        let failed = failures();
        kill(pid, Signal::SIGTERM).unwrap();
        while status.is_none() && failures() == failed && t.elapsed() < Duration::from_secs(20) {
            status = m.child.try_wait().unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    let status =
        status.unwrap_or_else(|| panic!("a SIGTERM unmounts once not in use; the mount logged:\n{logged}"));
    assert!(status.success(), "the mount's server ended with {status}");
    assert!(!mounted(&mnt), "unmounted");
}

/// `mount --background -o ro`: the command returns only once the mount is live (it is there
/// the moment the command exits, without waiting), reads work, every kind of change fails
/// with `EROFS`, and the library's view of the cluster is unchanged by the attempts.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_read_only_background_mount_serves_reads_and_refuses_changes() {
    let (tc, data, mnt) = cluster_with_a_file(300_000, 4);
    let c = tc.client();
    c.mkdir("/d", 0o755).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_stripefs"))
        .arg("--cluster")
        .arg(tc.cluster.config_path())
        .args(["mount", "--background", "-o", "ro", "--threads", "2"])
        .arg(&mnt)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _guard = Unmount(mnt.clone());
    assert!(out.status.success(), "mount --background: {}", String::from_utf8_lossy(&out.stderr));
    assert!(mounted(&mnt), "the mount is live when the command returns");
    let opts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let line = opts.lines().find(|l| l.split(' ').nth(1) == mnt.to_str()).unwrap().to_owned();
    assert!(line.split(' ').nth(3).unwrap().split(',').any(|o| o == "ro"), "{line}");
    // Reads.
    assert_eq!(std::fs::read(mnt.join("f.bin")).unwrap(), &data[..]);
    let names: Vec<String> =
        std::fs::read_dir(&mnt).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    // Changes.
    let erofs = |what: &str, r: std::io::Result<()>| {
        let e = r.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {e}");
    };
    let open_rw = |p: &Path| std::fs::OpenOptions::new().write(true).open(p).map(drop);
    erofs("write", open_rw(&mnt.join("f.bin")));
    erofs("create", std::fs::write(mnt.join("new.bin"), b"x"));
    erofs("mkdir", std::fs::create_dir(mnt.join("e")));
    erofs("unlink", std::fs::remove_file(mnt.join("f.bin")));
    erofs("rmdir", std::fs::remove_dir(mnt.join("d")));
    erofs("rename", std::fs::rename(mnt.join("f.bin"), mnt.join("g.bin")));
    erofs("symlink", std::os::unix::fs::symlink("f.bin", mnt.join("l")));
    erofs(
        "chmod",
        std::fs::set_permissions(mnt.join("f.bin"), std::os::unix::fs::PermissionsExt::from_mode(0o600)),
    );
    erofs(
        "truncate",
        std::fs::File::open(mnt.join("f.bin")).and_then(|f| f.set_len(0)).map_err(|e| {
            // ftruncate on a descriptor opened read-only is EINVAL whatever the mount; go by path.
            if e.raw_os_error() == Some(libc::EINVAL) {
                nix::unistd::truncate(&mnt.join("f.bin"), 0).map_err(std::io::Error::from).unwrap_err()
            } else {
                e
            }
        }),
    );
    // Nothing changed behind the mount.
    let st = c.stat("/f.bin").unwrap();
    assert_eq!((st.attr.size, st.attr.mode & 0o7777), (data.len() as u64, 0o644));
    assert_eq!(c.readdir("/").unwrap().len(), 2);
    run(Command::new("umount").arg(&mnt));
    assert!(!mounted(&mnt));
    // A background mount that fails before it is live (here: no cluster file to load) fails
    // the command with its reason, instead of returning as if it were mounted.
    let out = Command::new(env!("CARGO_BIN_EXE_stripefs"))
        .arg("--cluster")
        .arg(tc.dir.path().join("missing.toml"))
        .args(["mount", "-b"])
        .arg(&mnt)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("before it was live") && err.contains("missing.toml"), "{err}");
    assert!(!mounted(&mnt));
}

/// A background mount outlives the command that started it: it keeps serving when it logs
/// after that command (and the pipes it read the server's output from) is gone, and what it
/// logs from then on goes to `--log-file`.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_background_mount_logs_after_its_launcher_exits() {
    let (tc, data, mnt) = cluster_with_a_file(100_000, 9);
    let c = tc.client();
    let log = tc.dir.path().join("mount.log");
    // Debug logging makes the server write a line for every request it serves.
    let out = Command::new(env!("CARGO_BIN_EXE_stripefs"))
        .current_dir(tc.dir.path())
        .env("RUST_LOG", "debug")
        .arg("--cluster")
        .arg(tc.cluster.config_path())
        .args(["mount", "--background", "--log-file"])
        .arg(&log)
        .arg(&mnt)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _guard = Unmount(mnt.clone());
    assert!(out.status.success(), "mount --background: {}", String::from_utf8_lossy(&out.stderr));
    for round in 0..3 {
        assert_eq!(std::fs::read(mnt.join("f.bin")).unwrap(), &data[..], "read {round}");
        std::fs::write(mnt.join(format!("w{round}")), b"written").unwrap();
    }
    assert!(mounted(&mnt));
    assert_eq!(c.readdir("/").unwrap().len(), 4);
    // A directory's fsync (as SQLite and editors make after a rename) is served, not refused
    // as an operation the mount lacks.
    std::fs::File::open(&mnt).unwrap().sync_all().unwrap();
    // So are extended attributes, which the file system has none of (cp -a sets them), and
    // seeking to data and holes (cp looks for holes), which the whole file is data to.
    let path = std::ffi::CString::new(mnt.join("f.bin").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path and name, and a value of the length given.
    let set = unsafe { libc::setxattr(path.as_ptr(), c"user.k".as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    assert_eq!((set, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::EOPNOTSUPP)));
    // SAFETY: as above.
    let removed = unsafe { libc::removexattr(path.as_ptr(), c"user.k".as_ptr()) };
    assert_eq!(removed, -1);
    {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open(mnt.join("f.bin")).unwrap();
        // SAFETY: a descriptor `f` owns.
        let at = unsafe {
            (libc::lseek(f.as_raw_fd(), 10, libc::SEEK_DATA), libc::lseek(f.as_raw_fd(), 10, libc::SEEK_HOLE))
        };
        assert_eq!(at, (10, data.len() as i64));
        // Asking whether a file is a terminal (Python's `open` does, for its buffering) is
        // answered that it is not, each time, without a warning apiece.
        for _ in 0..3 {
            // SAFETY: a descriptor `f` owns.
            let tty = unsafe { libc::isatty(f.as_raw_fd()) };
            assert_eq!((tty, std::io::Error::last_os_error().raw_os_error()), (0, Some(libc::ENOTTY)));
        }
        // A file is always ready to read and write.
        let mut fds = [libc::pollfd { fd: f.as_raw_fd(), events: libc::POLLIN | libc::POLLOUT, revents: 0 }];
        // SAFETY: one `pollfd`, of a descriptor `f` owns.
        assert_eq!(unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) }, 1);
        assert_eq!(fds[0].revents & (libc::POLLIN | libc::POLLOUT), libc::POLLIN | libc::POLLOUT);
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.lines().count() >= 6, "the server's log after it went live: {logged:?}");
    assert!(!logged.contains("Not Implemented"), "{logged}");
    // Private, as everything stripefs writes: it names files and users.
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&log).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    // It does not keep the directory it was started from (and its file system) busy.
    let said = String::from_utf8_lossy(&out.stdout);
    let pid = said.rsplit("(pid ").next().and_then(|p| p.trim().strip_suffix(')')).expect("pid printed");
    assert_eq!(std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap(), Path::new("/"), "{said}");
    run(Command::new("umount").arg(&mnt));
}
