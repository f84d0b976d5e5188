//! The FUSE mount, used through ordinary tools: `cp` a file in, `cmp` it back, `ls`, `ln -s`,
//! `rm`, unmount; hard links, FIFOs, sockets and device nodes; the permissions of users other
//! than root (through `setpriv`). Needs /dev/fuse, and root for the users, so the tests are
//! ignored unless asked for (`cargo test -- --ignored`, as CI does as root), and then fail
//! where they cannot mount.
#![cfg(feature = "fuse")]

mod common;

use common::{TestCluster, no_flushes, no_objects_ahead, output_within, pattern, requests_during};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Mount {
    child: Child,
    dir: std::path::PathBuf,
}

impl Drop for Mount {
    fn drop(&mut self) {
        if mounted(&self.dir) {
            let _ = Command::new("umount").arg(&self.dir).status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Mount {
    /// The mount's server.
    fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id() as i32)
    }
}

fn mounted(dir: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mounts")
        .map(|m| m.lines().any(|l| l.split(' ').nth(1) == Some(dir.to_str().unwrap_or("?"))))
        .unwrap_or(false)
}

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().expect("command runs");
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// `stripefs mount` of `tc`'s cluster on `<tc.dir>/mnt`, once the mount is there.
fn mount(tc: &TestCluster) -> Mount {
    mount_with(tc, &[])
}

/// As [`mount`], with extra arguments to `stripefs mount` (`-o allow_other`).
fn mount_with(tc: &TestCluster, args: &[&str]) -> Mount {
    mount_at(tc, "mnt", args)
}

/// As [`mount_with`], on `<tc.dir>/<name>` (another mount of the same cluster: another client).
fn mount_at(tc: &TestCluster, name: &str, args: &[&str]) -> Mount {
    start_mount(tc, name, args, &[], None)
}

/// `stripefs mount` of `tc`'s cluster on `<tc.dir>/mnt`, with `env` set for the mount's server
/// (`RUST_LOG`), its log in the file returned, once the mount is there.
fn mount_logging(tc: &TestCluster, env: &[(&str, &str)]) -> (Mount, std::path::PathBuf) {
    let log = tc.dir.path().join("mount.log");
    (start_mount(tc, "mnt", &[], env, Some(&log)), log)
}

/// `stripefs mount` with `args` on a new directory `<tc.dir>/<name>`, `env` set for its server
/// and its standard error in `log` if given, once the mount is there.
fn start_mount(
    tc: &TestCluster,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
    log: Option<&Path>,
) -> Mount {
    assert!(Path::new("/dev/fuse").exists(), "/dev/fuse is missing");
    let mnt = tc.dir.path().join(name);
    std::fs::create_dir(&mnt).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stripefs"));
    cmd.envs(env.iter().copied())
        .arg("--cluster")
        .arg(tc.cluster.config_path())
        .arg("mount")
        .args(args)
        .arg(&mnt)
        .stdin(Stdio::null());
    if let Some(log) = log {
        cmd.stderr(std::fs::File::create(log).unwrap());
    }
    let mut m = Mount { child: cmd.spawn().unwrap(), dir: mnt.clone() };
    let t = Instant::now();
    while !mounted(&mnt) {
        assert!(t.elapsed() < Duration::from_secs(20), "mount did not appear");
        if let Ok(Some(s)) = m.child.try_wait() {
            let logged = log.and_then(|l| std::fs::read_to_string(l).ok()).unwrap_or_default();
            panic!("stripefs mount exited: {s}: {logged}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    m
}

#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn mount_cp_cmp_ls_rm_umount() {
    cp_cmp_ls_rm_umount(&[]);
}

/// The same through the kernel-cached mode.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn cached_mount_cp_cmp_ls_rm_umount() {
    cp_cmp_ls_rm_umount(&["--cache"]);
}

fn cp_cmp_ls_rm_umount(args: &[&str]) {
    let tc = TestCluster::start("tcp", 3);
    let mut m = mount_with(&tc, args);
    let mnt = m.dir.clone();
    // A file of several stripes and a partial last stripe.
    let src = tc.dir.path().join("src.bin");
    std::fs::write(&src, pattern(3 * 1024 * 1024 + 4321, 9)).unwrap();
    let inside = mnt.join("copy.bin");
    let c = tc.client();
    let before = io_requests(&c);
    run(Command::new("cp").arg(&src).arg(&inside));
    let copied_in = io_requests(&c);
    run(Command::new("cmp").arg(&src).arg(&inside));
    // The mount names 1 MiB, the largest request the kernel sends by default, as the size to
    // do I/O in (st_blksize), and tools such as cp and cat size their buffers by it.
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&inside).unwrap().blksize(), 1 << 20);
    // A small file names less: a tool reading it needs no large buffer.
    std::fs::write(mnt.join("small.bin"), b"small").unwrap();
    assert_eq!(std::fs::metadata(mnt.join("small.bin")).unwrap().blksize(), 64 << 10);
    std::fs::remove_file(mnt.join("small.bin")).unwrap();
    if args.is_empty() {
        // Direct mode: each read or write the tool makes is one request to each io server it
        // touches, 3 servers at most for 1 MiB, and 5 reads for 3 MiB and a bit (the last
        // finds the end); in 128 KiB pieces cp and cat send 2 each for 25.
        let before_cat = io_requests(&c);
        let cat = run(Command::new("cat").arg(&inside));
        assert_eq!(cat.stdout.len(), 3 * 1024 * 1024 + 4321);
        let after_cat = io_requests(&c);
        assert!(copied_in.1 - before.1 <= 4 * 3, "writes of cp: {before:?} -> {copied_in:?}");
        assert!(after_cat.0 - before_cat.0 <= 5 * 3, "reads of cat: {before_cat:?} -> {after_cat:?}");
    }
    // A copy within the mount (cp asks the kernel to copy_file_range) is one read and one
    // write for each server of the file, not the kernel's copy in 64 KiB pieces through a pipe
    // (50 reads and 50 writes here).
    let second = mnt.join("second.bin");
    let before = io_requests(&c);
    run(Command::new("cp").arg(&inside).arg(&second));
    let copied = io_requests(&c);
    run(Command::new("cmp").arg(&inside).arg(&second));
    if args.is_empty() {
        // The read that finds the end asks every server once more.
        assert!(copied.0 - before.0 <= 2 * 3, "reads of a copy within: {before:?} -> {copied:?}");
        assert!(copied.1 - before.1 <= 3, "writes of a copy within: {before:?} -> {copied:?}");
    }
    std::fs::remove_file(&second).unwrap();
    let ls = run(Command::new("ls").arg("-l").arg(&mnt));
    let listing = String::from_utf8_lossy(&ls.stdout);
    assert!(
        listing.contains("copy.bin") && listing.contains(&(3 * 1024 * 1024 + 4321).to_string()),
        "{listing}"
    );
    // A removal that came before the kernel's word that the copy had closed the file (it does
    // not wait for the mount to take that in) gave it a hidden name, which goes once the mount
    // has: only the directory of hidden names stays.
    let hidden = mnt.join(".stripefs-open");
    let t = Instant::now();
    while hidden.exists() && std::fs::read_dir(&hidden).unwrap().next().is_some() {
        assert!(t.elapsed() < Duration::from_secs(20), "a hidden name outlived the last close");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The library sees what the mount wrote.
    // statfs (df) reports the io servers' file systems added up, the files and directories.
    let vfs = nix::sys::statvfs::statvfs(&mnt).unwrap();
    let space = c.disk_space().unwrap().space;
    assert_eq!(vfs.blocks() * vfs.fragment_size(), space.total / 4096 * 4096);
    assert!(vfs.blocks() > 0 && vfs.blocks_available() <= vfs.blocks_free(), "{vfs:?}");
    assert!(vfs.files_free() > 1 << 32 && vfs.files() > vfs.files_free(), "{vfs:?}");
    assert_eq!(
        vfs.files() - vfs.files_free(),
        2 + hidden.exists() as u64,
        "in use: the root and copy.bin (and the hidden names' directory)"
    );
    assert_eq!(c.stat("/copy.bin").unwrap().attr.size, 3 * 1024 * 1024 + 4321);
    // Modification times: set by touch -d, kept by cp -p, and a write through the mount is
    // recorded when the file is closed.
    let year = |p: &Path| {
        let m = std::fs::metadata(p).unwrap().modified().unwrap();
        1970 + m.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 31_556_952
    };
    run(Command::new("touch").arg("-d").arg("2001-02-03 04:05:06").arg(&inside));
    assert_eq!(year(&inside), 2001);
    run(Command::new("sh").arg("-c").arg(format!("echo more >> '{}'", inside.display())));
    assert!(year(&inside) >= 2026, "an append is a modification");
    run(Command::new("touch").arg("-d").arg("2002-02-03 04:05:06").arg(&src));
    run(Command::new("cp").arg("-p").arg(&src).arg(mnt.join("kept.bin")));
    // As the servers have it: the kernel would show the time it was told for a second.
    let kept = c.stat("/kept.bin").unwrap().attr.mtime.secs as u64;
    assert_eq!(1970 + kept / 31_556_952, 2002);
    run(Command::new("rm").arg(mnt.join("kept.bin")));
    // A directory larger than a meta server page and a kernel readdir buffer lists whole.
    c.mkdir("/many", 0o755).unwrap();
    let want: Vec<String> = (0..600).map(|i| format!("entry-with-a-longer-name-{i:04}")).collect();
    for n in &want {
        c.mkdir(&format!("/many/{n}"), 0o755).unwrap();
    }
    let ls = run(Command::new("ls").arg("-f").arg(mnt.join("many")));
    let mut got: Vec<String> = String::from_utf8_lossy(&ls.stdout).lines().map(str::to_owned).collect();
    got.sort();
    assert_eq!(got[..2], [".", ".."]);
    assert_eq!(got[2..], want[..]);
    run(Command::new("rm").arg("-r").arg(mnt.join("many")));
    // Directories, rename and truncate through the kernel.
    run(Command::new("mkdir").arg(mnt.join("d")));
    run(Command::new("mv").arg(&inside).arg(mnt.join("d/moved.bin")));
    run(Command::new("truncate").arg("-s").arg("1000").arg(mnt.join("d/moved.bin")));
    assert_eq!(std::fs::metadata(mnt.join("d/moved.bin")).unwrap().len(), 1000);
    // Symbolic links: made with ln -s, read back by the kernel and the library, followed by
    // cat (relative and through a linked directory), removed with rm.
    run(Command::new("ln").arg("-s").arg("moved.bin").arg(mnt.join("d/link")));
    run(Command::new("ln").arg("-s").arg("d").arg(mnt.join("dl")));
    assert_eq!(std::fs::read_link(mnt.join("d/link")).unwrap(), Path::new("moved.bin"));
    assert!(std::fs::symlink_metadata(mnt.join("dl")).unwrap().file_type().is_symlink());
    assert_eq!(c.readlink("/d/link").unwrap(), "moved.bin");
    let cat = run(Command::new("cat").arg(mnt.join("dl/link")));
    assert_eq!(cat.stdout, &pattern(3 * 1024 * 1024 + 4321, 9)[..1000]);
    let ls = run(Command::new("ls").arg("-l").arg(mnt.join("d")));
    assert!(String::from_utf8_lossy(&ls.stdout).contains("link -> moved.bin"), "{ls:?}");
    run(Command::new("rm").arg(mnt.join("dl")).arg(mnt.join("d/link")));
    run(Command::new("rm").arg(mnt.join("d/moved.bin")));
    run(Command::new("rmdir").arg(mnt.join("d")));
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
    assert!(c.readdir("/").unwrap().is_empty());
    run(Command::new("umount").arg(&mnt));
    let t = Instant::now();
    loop {
        if let Ok(Some(s)) = m.child.try_wait() {
            assert!(s.success(), "stripefs mount exits cleanly after umount: {s}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "stripefs mount did not exit after umount");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!mounted(&mnt));
}

/// Read and write requests the io servers have served so far, all together.
fn io_requests(c: &stripefs::Client) -> (u64, u64) {
    c.server_stats()
        .into_iter()
        .map(|s| s.expect("io server answers"))
        .fold((0, 0), |(r, w), s| (r + s.reads, w + s.writes))
}

/// Syncs each io server has served so far (by absolute server number).
fn syncs(c: &stripefs::Client) -> Vec<u64> {
    c.server_stats().into_iter().map(|s| s.expect("io server answers").syncs).collect()
}

/// Writes `len`-byte blocks one after another through `f`, checking after each that the io
/// server holding it synced since the write began: the write was acknowledged only after its
/// data was made durable.
fn each_write_is_synced(
    c: &stripefs::Client,
    path: &str,
    f: &std::fs::File,
    blocks: u64,
    len: usize,
    how: &str,
) {
    use std::os::unix::fs::FileExt;
    let layout = c.open(path, stripefs::capability::Rights::READ).unwrap().layout();
    let n = c.io_servers();
    for i in 0..blocks {
        let off = i * len as u64;
        let before = syncs(c);
        f.write_all_at(&pattern(len, i)[..], off).unwrap();
        let after = syncs(c);
        let (server, _) = layout.locate(off, n);
        assert!(
            after[server as usize] > before[server as usize],
            "{how}: write {i} (at {off}, on io server {server}) was acknowledged without a sync there: \
             {before:?} -> {after:?}"
        );
    }
}

/// Writes `data` at 0 through `f` (opened without sync flags) with `RWF_DSYNC`, checking that
/// the io server holding it synced before the write returned. Returns the file's layout.
fn rwf_dsync_write_is_synced(
    c: &stripefs::Client,
    path: &str,
    f: &std::fs::File,
    data: &[u8],
) -> stripefs::layout::Layout {
    use std::os::fd::AsRawFd;
    let iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    let before = syncs(c);
    // SAFETY: one iovec over `data`, which outlives the call; `f` is an open descriptor.
    let n = unsafe { libc::pwritev2(f.as_raw_fd(), &iov, 1, 0, libc::RWF_DSYNC) };
    assert_eq!(n, data.len() as isize, "pwritev2: {}", std::io::Error::last_os_error());
    let layout = c.open(path, stripefs::capability::Rights::READ).unwrap().layout();
    let (server, _) = layout.locate(0, c.io_servers());
    assert!(syncs(c)[server as usize] > before[server as usize], "RWF_DSYNC write was not synced");
    layout
}

/// `fsync`, then `fdatasync`, through `f`, each after `dirty(how)` wrote to it: each syncs every
/// io server of the file before it returns; `after(how)` checks more once it has.
fn fsync_and_fdatasync_sync_every_server(
    c: &stripefs::Client,
    f: &std::fs::File,
    layout: &stripefs::layout::Layout,
    mut dirty: impl FnMut(&str),
    mut after: impl FnMut(&str),
) {
    for how in ["fsync", "fdatasync"] {
        dirty(how);
        let before = syncs(c);
        if how == "fsync" {
            f.sync_all().unwrap()
        } else {
            f.sync_data().unwrap()
        }
        let now = syncs(c);
        for s in layout.servers(c.io_servers()) {
            assert!(now[s as usize] > before[s as usize], "{how} did not sync io server {s}");
        }
        after(how);
    }
}

/// `O_SYNC` and `O_DSYNC` opens, writes carrying `RWF_DSYNC`, `fsync` and `fdatasync` through
/// the mount reach the io servers as syncs before they return; plain writes do not sync.
/// Observed through the io servers' sync counters (each counts an `fsync` of an object that
/// succeeded), not through timing.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn synchronous_writes_and_fsync_reach_the_io_servers() {
    use std::os::unix::fs::OpenOptionsExt;
    let tc = TestCluster::start("tcp", 3);
    let m = mount(&tc);
    let c = tc.client();
    let open = |name: &str, flags: i32| {
        std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .custom_flags(flags)
            .open(m.dir.join(name))
            .unwrap()
    };
    // Small writes, as `dd oflag=sync bs=4k` makes: every one is synced where it landed.
    let f = open("osync.bin", libc::O_SYNC);
    each_write_is_synced(&c, "/osync.bin", &f, 24, 4096, "O_SYNC");
    drop(f);
    // The flags also hold on a file opened again (FUSE open, not create).
    let f = open("osync.bin", libc::O_DSYNC);
    each_write_is_synced(&c, "/osync.bin", &f, 24, 4096, "O_DSYNC reopened");
    drop(f);
    let f = open("odsync.bin", libc::O_DSYNC | libc::O_DIRECT);
    each_write_is_synced(&c, "/odsync.bin", &f, 8, 65536 + 4096, "O_DSYNC|O_DIRECT");
    drop(f);

    // Plain writes are not synced (the counters tell synced writes apart), ...
    let f = open("plain.bin", 0);
    let before = syncs(&c);
    use std::os::unix::fs::FileExt;
    for i in 0..8u64 {
        f.write_all_at(&pattern(4096, i)[..], i * 65536).unwrap();
    }
    assert_eq!(syncs(&c), before, "plain writes do not sync");
    // ... one carrying RWF_DSYNC is, ...
    let layout = rwf_dsync_write_is_synced(&c, "/plain.bin", &f, &pattern(4096, 99));
    // ... and fsync and fdatasync sync every io server of the file.
    let dirty = |_: &str| f.write_all_at(b"more", 4).unwrap();
    fsync_and_fdatasync_sync_every_server(&c, &f, &layout, dirty, |_| {});
    // What was written reads back (the syncs did not disturb the data).
    let back = std::fs::read(m.dir.join("osync.bin")).unwrap();
    assert_eq!(back.len(), 24 * 4096);
    for i in 0..24 {
        assert_eq!(&back[i * 4096..(i + 1) * 4096], &pattern(4096, i as u64)[..], "block {i}");
    }
}

/// Hard links share one file: its link count, its data through either name, its data kept
/// while a name is left; FIFOs, sockets and device nodes are made with their type and device
/// number; `fallocate` grows a file.
/// What `tar -x` and `cp -p` do to each file they make, change its mode through the descriptor
/// that made it, is one request to the meta server, with the file's size asked of its io
/// servers at the same time (the kernel wants the attributes back); not another two meta
/// requests for the attributes and a capability first. A look-up of a file this mount has not
/// opened asks the meta server for the entry and a capability, not for the attributes again.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn attributes_take_one_meta_request_beside_the_sizes() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tc = TestCluster::start_with("tcp", 4, no_objects_ahead);
    let m = mount(&tc);
    let c = tc.client();
    // The meta and io requests of `f`. The kernel may ask for the attributes again if it held
    // them past their lifetime on a slow machine: the fewest of three tries counts.
    let fewest =
        |f: &dyn Fn(u64)| -> (u64, u64) { (0..3).map(|i| requests_during(&c, || f(i)).0).min().unwrap() };
    // The files are made before the count starts; only the changes are counted.
    let made = |i: u64| {
        let f = std::fs::File::create(m.dir.join(format!("g{i}"))).unwrap();
        std::io::Write::write_all(&mut &f, &pattern(300_000, i)).unwrap();
        f
    };
    let files: Vec<_> = (0..3).map(made).collect();
    // Past the time-to-live of the sizes the mount told the kernel, which it would answer with.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(
        fewest(&|i| files[i as usize].set_permissions(std::fs::Permissions::from_mode(0o640)).unwrap()),
        (1, 4),
        "the change, and each io server's size"
    );
    for f in &files {
        let md = f.metadata().unwrap();
        assert_eq!((md.mode() & 0o7777, md.len()), (0o640, 300_000));
    }
    for i in 0..3 {
        let f = c.create(&format!("/lib{i}"), Default::default()).unwrap();
        f.write_all_at(0, &pattern(1000 + i, i as u64)).unwrap();
    }
    assert_eq!(
        fewest(&|i| assert_eq!(std::fs::metadata(m.dir.join(format!("lib{i}"))).unwrap().len(), 1000 + i)),
        (2, 4),
        "the entry, a capability, and each io server's size"
    );
}

/// A change that leaves the size alone right after this mount wrote the file (`tar -x` sets the
/// times, owner and mode of each file it writes) takes the size the mount told the kernel, as
/// the kernel would within the attributes' time-to-live: one meta request, no io server. A size
/// changed through the mount other than by a write is asked for again.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_change_right_after_a_write_asks_no_io_server() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tc = TestCluster::start_with("tcp", 4, no_objects_ahead);
    let m = mount(&tc);
    let c = tc.client();
    let mode = |m: u32| std::fs::Permissions::from_mode(m);
    // The fewest of three files' (a stall past the time-to-live asks the sizes): a `stat` after
    // the write (which the kernel asks the mount for), then the change.
    let counts: Vec<[(u64, u64); 2]> = (0..3)
        .map(|i| {
            let f = std::fs::File::create(m.dir.join(format!("t{i}"))).unwrap();
            std::io::Write::write_all(&mut &f, &pattern(300_000, i)).unwrap();
            let (stat, md) = requests_during(&c, || f.metadata().unwrap());
            assert_eq!(md.len(), 300_000);
            [stat, requests_during(&c, || f.set_permissions(mode(0o600)).unwrap()).0]
        })
        .collect();
    assert_eq!(counts.iter().min(), Some(&[(1, 0), (1, 0)]), "{counts:?}");
    for i in 0..3 {
        let md = std::fs::metadata(m.dir.join(format!("t{i}"))).unwrap();
        assert_eq!((md.mode() & 0o7777, md.len()), (0o600, 300_000));
    }
    // What the kernel shows after each change (its attributes are the change's reply).
    let changed_len = |f: &std::fs::File, m: u32| {
        f.set_permissions(mode(m)).unwrap();
        f.metadata().unwrap().len()
    };
    let opts = std::fs::OpenOptions::new().read(true).write(true).create(true).clone();
    let f = opts.open(m.dir.join("other")).unwrap();
    std::io::Write::write_all(&mut &f, &pattern(1000, 9)).unwrap();
    assert_eq!(changed_len(&f, 0o600), 1000);
    std::fs::write(m.dir.join("src"), pattern(5000, 3)).unwrap();
    let src = std::fs::File::open(m.dir.join("src")).unwrap();
    let (mut off_in, mut off_out) = (0i64, 1000i64);
    // SAFETY: both descriptors are open and the offsets are live locals.
    let n =
        unsafe { libc::copy_file_range(src.as_raw_fd(), &mut off_in, f.as_raw_fd(), &mut off_out, 5000, 0) };
    assert_eq!(n, 5000, "{}", std::io::Error::last_os_error());
    assert_eq!(changed_len(&f, 0o640), 6000, "after a copy into it");
    // SAFETY: a plain call on an open descriptor.
    assert_eq!(unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 10_000) }, 0);
    assert_eq!(changed_len(&f, 0o600), 10_000, "after an allocation past its end");
    f.set_len(100).unwrap();
    assert_eq!(changed_len(&f, 0o640), 100, "after a truncate");
    assert_eq!(c.stat("/other").unwrap().attr.size, 100);
}

/// A written file's time recorded at its close waits for the meta server's next durable commit,
/// as a local file system's waits for `fsync`; an `fsync` (here through another descriptor of
/// the same open file) makes it durable: it survives the meta server's crash.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn an_fsync_after_a_close_makes_the_recorded_time_durable() {
    let mut tc = TestCluster::start_with("tcp", 2, no_flushes);
    let m = mount(&tc);
    let opts = std::fs::OpenOptions::new().create(true).read(true).write(true).clone();
    let f = opts.open(m.dir.join("f")).unwrap();
    let mtime = |tc: &TestCluster| tc.client().stat("/f").unwrap().attr.mtime;
    let created = mtime(&tc);
    std::io::Write::write_all(&mut &f, b"data").unwrap();
    // Closing a duplicate flushes the open file: the write's time is recorded.
    drop(f.try_clone().unwrap());
    assert_ne!(mtime(&tc), created);
    f.sync_all().unwrap();
    let synced = mtime(&tc);
    drop(f);
    tc.cluster.kill_meta();
    tc.cluster.restart_meta().unwrap();
    assert_eq!(mtime(&tc), synced, "the synced modification time was lost");
}

/// An `fsync` of a file makes its metadata durable whoever changed it: here the time a write
/// recorded at another open's close, which the meta server commits without a flush.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn an_fsync_through_a_later_open_makes_an_earlier_close_s_time_durable() {
    let mut tc = TestCluster::start_with("tcp", 2, no_flushes);
    let m = mount(&tc);
    let mtime = |tc: &TestCluster| tc.client().stat("/f").unwrap().attr.mtime;
    std::fs::write(m.dir.join("f"), b"created").unwrap();
    let created = mtime(&tc);
    let opts = std::fs::OpenOptions::new().write(true).clone();
    let f = opts.open(m.dir.join("f")).unwrap();
    std::io::Write::write_all(&mut &f, b"data").unwrap();
    drop(f);
    let written = mtime(&tc);
    assert_ne!(written, created);
    std::fs::File::open(m.dir.join("f")).unwrap().sync_all().unwrap();
    tc.cluster.kill_meta();
    tc.cluster.restart_meta().unwrap();
    assert_eq!(mtime(&tc), written, "the time was lost though the file was synced");
}

/// A time set through a descriptor that wrote, before it is closed, is the file's time after the
/// close, as on a local file system: `tar -x` and `cp -p` set each file's time so. It supersedes
/// the writes of every open of the file before it, also on a synced file; a write after it is
/// recorded again.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_time_set_after_a_write_outlives_the_close() {
    let tc = TestCluster::start("tcp", 2);
    let m = mount(&tc);
    let mtime = |name: &str| tc.client().stat(&format!("/{name}")).unwrap().attr.mtime.secs;
    let set = std::time::UNIX_EPOCH + Duration::from_secs(981_173_106);
    let opts = std::fs::OpenOptions::new().create(true).write(true).clone();

    let f = opts.open(m.dir.join("tar")).unwrap();
    std::io::Write::write_all(&mut &f, b"data").unwrap();
    f.set_modified(set).unwrap();
    drop(f);
    assert_eq!(mtime("tar"), 981_173_106, "the close recorded its write's time over the one set");

    // Written through one open, the time set through another, both closed after it.
    let (a, b) = (opts.open(m.dir.join("two")).unwrap(), opts.open(m.dir.join("two")).unwrap());
    std::io::Write::write_all(&mut &a, b"data").unwrap();
    b.set_modified(set).unwrap();
    b.sync_all().unwrap();
    drop(a);
    drop(b);
    assert_eq!(mtime("two"), 981_173_106, "another open's close recorded its write's time");

    let f = opts.open(m.dir.join("again")).unwrap();
    f.set_modified(set).unwrap();
    std::io::Write::write_all(&mut &f, b"data").unwrap();
    drop(f);
    assert!(mtime("again") > 981_173_106, "a write after the time set was not recorded");
}

/// Times before 1970 (`touch -d 1960-01-01`, archives of old files) read back as set through
/// the mount, whole seconds and fractions, and as the meta server holds them.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn times_before_1970_read_back_as_set() {
    use std::os::unix::fs::MetadataExt;
    let tc = TestCluster::start("tcp", 1);
    let m = mount(&tc);
    let path = m.dir.join("old");
    let f = std::fs::File::create(&path).unwrap();
    let whole = std::time::UNIX_EPOCH - Duration::from_secs(315_619_200);
    let fraction = std::time::UNIX_EPOCH - Duration::new(86_400, 250_000_000);
    f.set_times(std::fs::FileTimes::new().set_modified(whole).set_accessed(fraction)).unwrap();
    drop(f);
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!((meta.mtime(), meta.mtime_nsec()), (-315_619_200, 0), "modification time");
    assert_eq!((meta.atime(), meta.atime_nsec()), (-86_401, 750_000_000), "access time");
    let held = tc.client().stat("/old").unwrap().attr;
    assert_eq!((held.mtime.secs, held.atime.secs, held.atime.nsecs), (-315_619_200, -86_401, 750_000_000));

    // The ends of a 64-bit `timespec`, which any user may set on a file they own (the kernel
    // drops the nanoseconds there). A mount that failed on one would leave the call waiting
    // for its answer, so it is made on a thread of its own.
    for (secs, nsecs) in [(i64::MIN, 0), (i64::MAX, 0)] {
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let t = [libc::timespec { tv_sec: secs, tv_nsec: nsecs }; 2];
            // SAFETY: a NUL-terminated path and two `timespec`s.
            let r = unsafe { libc::utimensat(libc::AT_FDCWD, c_path.as_ptr(), t.as_ptr(), 0) };
            let _ = tx.send((r, std::io::Error::last_os_error()));
        });
        let (r, e) = rx.recv_timeout(Duration::from_secs(30)).expect("the mount answered utimensat");
        assert_eq!(r, 0, "utimensat {secs}: {e}");
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!((meta.mtime(), meta.mtime_nsec()), (secs, nsecs), "read back");
    }
}

/// A file another client replaced (written beside it and renamed over it, as editors and
/// deployments save) is found again at once, as on NFS: the mount answers for a file that is
/// gone with `ESTALE`, on which the kernel looks its name up afresh, where `ENOENT` would be
/// passed on for as long as the kernel keeps the name; and so are a directory another client
/// replaced, listed, and a file in it. A descriptor open on a file another client removed
/// reads `ESTALE` too, through the direct mount: no name was looked up for it.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_file_another_client_replaced_is_found_again() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let tc = TestCluster::start("tcp", 2);
    for (mode, args) in [("direct", &[][..]), ("cached", &["--cache"][..])] {
        let (a, b) = (mount_at(&tc, &format!("{mode}-a"), args), mount_at(&tc, &format!("{mode}-b"), args));
        std::fs::write(a.dir.join("cfg"), b"v1").unwrap();
        assert_eq!(std::fs::read(b.dir.join("cfg")).unwrap(), b"v1", "{mode}");
        for v in [b"v2", b"v3"] {
            std::fs::write(a.dir.join("cfg.new"), v).unwrap();
            std::fs::rename(a.dir.join("cfg.new"), a.dir.join("cfg")).unwrap();
            let read = std::fs::read(b.dir.join("cfg")).map_err(|e| e.raw_os_error());
            assert_eq!(read, Ok(v.to_vec()), "{mode}: replaced by another client");
            let ino = |m: &Mount| std::fs::metadata(m.dir.join("cfg")).unwrap().ino();
            assert_eq!(ino(&b), ino(&a), "{mode}");
        }
        // A directory `name` that `b` has seen, replaced through `a` by one holding `file`
        // with `data`.
        let replace_dir = |name: &str, file: &str, data: &[u8]| {
            let new = format!("{name}.new");
            std::fs::create_dir(a.dir.join(name)).unwrap();
            assert!(b.dir.join(name).is_dir(), "{mode}");
            std::fs::create_dir(a.dir.join(&new)).unwrap();
            std::fs::write(a.dir.join(&new).join(file), data).unwrap();
            std::fs::remove_dir(a.dir.join(name)).unwrap();
            std::fs::rename(a.dir.join(&new), a.dir.join(name)).unwrap();
        };
        // So is a file in a directory another client replaced: its name is looked up in the
        // directory's old handle, which is stale.
        let d = format!("{mode}-d");
        replace_dir(&d, "g", b"new");
        let read = std::fs::read(b.dir.join(&d).join("g")).map_err(|e| e.raw_os_error());
        assert_eq!(read, Ok(b"new".to_vec()), "{mode}: in a directory replaced by another client");
        // And listing such a directory lists the new one.
        let e = format!("{mode}-e");
        replace_dir(&e, "h", b"");
        let names = std::fs::read_dir(b.dir.join(&e))
            .map(|rd| rd.map(|n| n.unwrap().file_name().into_string().unwrap()).collect::<Vec<_>>())
            .map_err(|e| e.raw_os_error());
        assert_eq!(
            names,
            Ok(vec!["h".to_string()]),
            "{mode}: a directory replaced by another client, listed"
        );

        let f = std::fs::File::open(b.dir.join("cfg")).unwrap();
        std::fs::remove_file(a.dir.join("cfg")).unwrap();
        let gone = std::fs::File::open(b.dir.join("cfg")).map(drop).map_err(|e| e.raw_os_error());
        assert_eq!(gone, Err(Some(libc::ENOENT)), "{mode}: removed by another client");
        // (The kernel-cached mount reads the kernel's pages of it.)
        if mode == "direct" {
            let read = f.read_at(&mut [0; 4], 0).map_err(|e| e.raw_os_error());
            assert_eq!(read, Err(Some(libc::ESTALE)), "{mode}: read through a descriptor");
        }
    }
}

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

/// Files have no extended attributes, and the mount tells the kernel so once: every ask after
/// that, such as each `chown`'s for `security.capability`, is answered without a request, with
/// `EOPNOTSUPP`, and so are settings and removals.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn extended_attributes_are_not_supported() {
    let tc = TestCluster::start("tcp", 1);
    let m = mount(&tc);
    let path = m.dir.join("f");
    std::fs::write(&path, b"data").unwrap();
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let errno = |r: isize| {
        assert_eq!(r, -1);
        std::io::Error::last_os_error().raw_os_error()
    };
    for name in [c"security.capability", c"user.k", c"security.capability"] {
        let mut buf = [0u8; 64];
        // SAFETY: both strings are NUL-terminated and `buf` is writable for its length.
        let r = unsafe { libc::getxattr(c_path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        assert_eq!(errno(r), Some(libc::EOPNOTSUPP), "getxattr {name:?}");
    }
    // SAFETY: NUL-terminated strings and a readable value of the length given.
    let r = unsafe { libc::setxattr(c_path.as_ptr(), c"user.k".as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    assert_eq!(errno(r as isize), Some(libc::EOPNOTSUPP), "setxattr");
    // SAFETY: NUL-terminated strings.
    let r = unsafe { libc::removexattr(c_path.as_ptr(), c"user.k".as_ptr()) };
    assert_eq!(errno(r as isize), Some(libc::EOPNOTSUPP), "removexattr");
}

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

/// A sparse file's blocks are the space of its data, as `du` shows and as `cp` and `tar` look
/// at to find holes worth looking for; a dense file's are its size. In the mount that wrote
/// it (which counts its own writes) and in another (which asks the io servers).
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_sparse_file_holds_the_space_of_its_data() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let tc = TestCluster::start("tcp", 4);
    let (m, other) = (mount(&tc), mount_at(&tc, "other", &[]));
    let chunk = pattern(64 << 10, 5);
    let f = std::fs::File::create(m.dir.join("sparse")).unwrap();
    f.write_all_at(&chunk, 0).unwrap();
    f.write_all_at(&chunk, 200 << 20).unwrap();
    drop(f);
    std::fs::write(m.dir.join("dense"), pattern(1 << 20, 6)).unwrap();
    for dir in [&m.dir, &other.dir] {
        let sparse = std::fs::metadata(dir.join("sparse")).unwrap();
        assert_eq!(sparse.len(), (200 << 20) + (64 << 10));
        let space = sparse.blocks() * 512;
        assert!((128 << 10..=1 << 20).contains(&space), "{}: {space} bytes", dir.display());
        let dense = std::fs::metadata(dir.join("dense")).unwrap();
        assert!(dense.blocks() * 512 >= 1 << 20, "{}: {} blocks", dir.display(), dense.blocks());
        let du = run(Command::new("du").arg("-k").arg(dir.join("sparse")));
        let kib: u64 =
            String::from_utf8_lossy(&du.stdout).split_whitespace().next().unwrap().parse().unwrap();
        assert!(kib <= 1024, "du: {kib} KiB");
    }
}

/// `lseek`'s `SEEK_DATA` and `SEEK_HOLE` find a sparse file's data and holes through the
/// mount, so `cp` copies the data and leaves the holes out.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn seeks_find_a_sparse_file_s_holes_and_cp_keeps_them() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let tc = TestCluster::start("tcp", 4);
    let m = mount(&tc);
    let path = m.dir.join("sparse");
    let (head, tail) = (pattern(64 << 10, 7), pattern(100_000, 8));
    let far = 100u64 << 20;
    let f = std::fs::File::create(&path).unwrap();
    f.write_all_at(&head, 0).unwrap();
    f.write_all_at(&tail, far).unwrap();
    drop(f);
    let size = far + tail.len() as u64;
    let f = std::fs::File::open(&path).unwrap();
    let seek = |off: u64, whence: i32| {
        use std::os::fd::AsRawFd;
        // SAFETY: a descriptor this test owns; lseek touches no memory.
        let r = unsafe { libc::lseek(f.as_raw_fd(), off as libc::off_t, whence) };
        if r < 0 { Err(std::io::Error::last_os_error().raw_os_error()) } else { Ok(r as u64) }
    };
    assert_eq!(seek(0, libc::SEEK_DATA), Ok(0));
    assert_eq!(seek(0, libc::SEEK_HOLE), Ok(64 << 10));
    assert_eq!(seek(64 << 10, libc::SEEK_DATA), Ok(far));
    assert_eq!(seek(far, libc::SEEK_HOLE), Ok(size), "the end is a hole");
    assert_eq!(seek(size, libc::SEEK_DATA), Err(Some(libc::ENXIO)));
    // Copied out and back in: the data, and no more space than the data's.
    let out = tc.dir.path().join("copy");
    run(Command::new("cp").arg("--sparse=auto").arg(&path).arg(&out));
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&path).unwrap());
    let held = std::fs::metadata(&out).unwrap().blocks() * 512;
    assert!(held <= 1 << 20, "the copy out holds {held} bytes");
    let back = m.dir.join("back");
    run(Command::new("cp").arg("--sparse=auto").arg(&out).arg(&back));
    assert_eq!(std::fs::read(&back).unwrap(), std::fs::read(&out).unwrap());
    let held = std::fs::metadata(&back).unwrap().blocks() * 512;
    assert!(held <= 1 << 20, "the copy back in holds {held} bytes");
}

/// `fallocate --punch-hole` through the mount frees a range's space, which then reads as
/// zeros, as `fallocate --dig-holes` does for runs of zeros; both mounts alike (the
/// kernel-cached one writes back and drops its pages of the range first).
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn holes_punched_through_the_mount_free_their_space() {
    use std::os::unix::fs::MetadataExt;
    let tc = TestCluster::start("tcp", 4);
    for args in [&[][..], &["--cache"][..]] {
        let name = if args.is_empty() { "direct" } else { "cached" };
        let m = mount_at(&tc, name, args);
        let path = m.dir.join("f");
        let mut data = pattern(8 << 20, 4).to_vec();
        std::fs::write(&path, &data).unwrap();
        let held = || std::fs::metadata(&path).unwrap().blocks() * 512;
        let before = held();
        run(Command::new("fallocate")
            .args(["--punch-hole", "--offset", "1MiB", "--length", "3MiB"])
            .arg(&path));
        data[1 << 20..4 << 20].fill(0);
        assert!(
            std::fs::read(&path).unwrap() == data,
            "{name}: the hole reads as zeros, the rest as written"
        );
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 8 << 20, "{name}: the size stays");
        // Another mount asks the servers.
        let other = tc.dir.path().join(name).join("f");
        assert!(held() + (3 << 20) <= before, "{name}: {before} then {} bytes held", held());
        assert_eq!(std::fs::metadata(&other).unwrap().len(), 8 << 20);
        // Zeros written as data, dug out.
        let zeros = m.dir.join("zeros");
        std::fs::write(&zeros, vec![0u8; 4 << 20]).unwrap();
        run(Command::new("fallocate").arg("--dig-holes").arg(&zeros));
        let dug = std::fs::metadata(&zeros).unwrap().blocks() * 512;
        assert!(dug <= 1 << 20, "{name}: {dug} bytes held after digging");
        assert_eq!(std::fs::read(&zeros).unwrap(), vec![0u8; 4 << 20]);
    }
}

/// In the kernel-cached mode a file's data may still be only in the kernel's pages, which the
/// io servers cannot see: seeks for data and holes in a file still being written find all of
/// it, not the servers' idea of where its data is, and so does a copy.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn seeks_through_the_cached_mount_see_data_still_in_the_kernel() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let tc = TestCluster::start("tcp", 2);
    let m = mount_with(&tc, &["--cache"]);
    let path = m.dir.join("growing");
    let data = pattern(1 << 20, 9);
    let mut f =
        std::fs::File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    f.write_all(&data).unwrap();
    // Still open, its pages not written back: the servers hold nothing yet.
    // SAFETY: a descriptor this test owns; lseek touches no memory.
    let seek = |whence| unsafe { libc::lseek(f.as_raw_fd(), 0, whence) };
    assert_eq!((seek(libc::SEEK_DATA), seek(libc::SEEK_HOLE)), (0, 1 << 20));
    let out = tc.dir.path().join("copy");
    run(Command::new("cp").arg("--sparse=auto").arg(&path).arg(&out));
    assert!(std::fs::read(&out).unwrap() == data, "the copy lost data still in the kernel's pages");
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

/// `ls -l` of a directory gets its entries' attributes with the listing: a meta request and a
/// request to each io server for a window of entries, not a look-up and a size round per entry
/// (which made 100 files over 100 meta requests and 400 io requests).
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_long_listing_asks_for_attributes_in_batches() {
    let tc = TestCluster::start_with("tcp", 4, no_objects_ahead);
    let m = mount(&tc);
    let c = tc.client();
    c.mkdir("/d", 0o755).unwrap();
    let files = 100;
    for i in 0..files {
        let f = c.create(&format!("/d/f{i:03}"), Default::default()).unwrap();
        f.write_all_at(0, &pattern(i * 7000, i as u64)).unwrap();
    }
    c.mkdir("/d/sub", 0o700).unwrap();
    let ((meta, io), out) = requests_during(&c, || run(Command::new("ls").arg("-ln").arg(m.dir.join("d"))));
    assert!(meta <= 10 && io <= 40, "{meta} meta and {io} io requests for {files} files");
    // Every entry with its size and mode: `-rw-r--r-- 1 uid gid size date name`.
    let listed: Vec<(String, u64)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (format!("{} {}", f[0], f[f.len() - 1]), f[4].parse().unwrap())
        })
        .collect();
    let mut want: Vec<(String, u64)> =
        (0..files).map(|i| (format!("-rw-r--r-- f{i:03}"), i as u64 * 7000)).collect();
    want.push(("drwx------ sub".into(), 0));
    let listed: Vec<_> =
        listed.into_iter().map(|(n, s)| if n.starts_with('d') { (n, 0) } else { (n, s) }).collect();
    assert_eq!(listed, want);
}

/// A directory larger than a meta server's page of entries lists whole, each entry once, on
/// both mounts; and what the mount holds for it while it is open does not grow with its size:
/// many descriptors open on a large directory, each read to its end (as a program walking it
/// in many threads, or one set on growing the mount, keeps them), hold a page each.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_large_directory_lists_whole_and_is_held_a_page_at_a_time() {
    let tc = TestCluster::start("tcp", 1);
    let c = tc.client();
    c.mkdir("/d", 0o755).unwrap();
    let entries = 2000;
    // FIFOs: records on the meta server alone, quick to make.
    for i in 0..entries {
        c.mknod(&format!("/d/p{i:04}"), stripefs::proto::FileKind::Fifo, 0o644).unwrap();
    }
    let want: Vec<String> = (0..entries).map(|i| format!("p{i:04}")).collect();
    let rss = |m: &Mount| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", m.pid())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    };
    for (mode, args) in [("direct", &[][..]), ("cached", &["--cache"][..])] {
        let m = mount_at(&tc, mode, args);
        let dir = m.dir.join("d");
        let mut names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, want, "{mode}: listed");
        let listed = run(Command::new("ls").arg("-ln").arg(&dir)).stdout;
        let long = String::from_utf8(listed).unwrap();
        assert_eq!(long.lines().filter(|l| l.starts_with("prw-r--r--")).count(), entries, "{mode}: ls -l");
        if mode == "cached" {
            // Plain listings (this mount does not send entries' attributes), 500 held open.
            let before = rss(&m);
            let open: Vec<std::fs::ReadDir> = (0..500)
                .map(|_| {
                    let mut rd = std::fs::read_dir(&dir).unwrap();
                    assert_eq!(rd.by_ref().count(), entries, "{mode}: read whole");
                    rd
                })
                .collect();
            let grown = rss(&m).saturating_sub(before);
            // A whole listing a descriptor came to about 170 bytes an entry: 170 MB here.
            assert!(grown < 48 << 20, "the mount grew by {grown} bytes for {} open listings", open.len());
        }
    }
}

#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn hard_links_and_special_files() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let tc = TestCluster::start("tcp", 2);
    let m = mount(&tc);
    let mnt = m.dir.clone();
    let a = mnt.join("a");
    std::fs::write(&a, pattern(200_000, 3)).unwrap();
    std::fs::create_dir(mnt.join("d")).unwrap();
    let b = mnt.join("d/b");
    run(Command::new("ln").arg(&a).arg(&b));
    let (ma, mb) = (std::fs::metadata(&a).unwrap(), std::fs::metadata(&b).unwrap());
    assert_eq!((ma.ino(), ma.nlink()), (mb.ino(), 2));
    // Written through one name, read through the other.
    std::fs::write(&b, b"through b").unwrap();
    assert_eq!(std::fs::read(&a).unwrap(), b"through b");
    // Rename of one name over the other: both stay (POSIX: nothing happens).
    std::fs::rename(&a, &b).unwrap();
    assert!(a.exists() && b.exists());
    // Unlinking one name keeps the data under the other.
    std::fs::remove_file(&a).unwrap();
    assert_eq!(std::fs::metadata(&b).unwrap().nlink(), 1);
    assert_eq!(std::fs::read(&b).unwrap(), b"through b");
    let c = tc.client();
    assert_eq!(c.stat("/d/b").unwrap().attr.nlink, 1);
    // A directory cannot be linked.
    let dir_link = Command::new("ln").arg(mnt.join("d")).arg(mnt.join("e")).output().unwrap();
    assert!(!dir_link.status.success() && !mnt.join("e").exists());
    // Special files.
    run(Command::new("mkfifo").arg("-m").arg("0640").arg(mnt.join("fifo")));
    run(Command::new("mknod").arg(mnt.join("null2")).arg("c").arg("1").arg("3"));
    run(Command::new("mknod").arg(mnt.join("blk")).arg("b").arg("7").arg("200"));
    let sock = std::os::unix::net::UnixListener::bind(mnt.join("sock")).unwrap();
    drop(sock);
    let md = |n: &str| std::fs::symlink_metadata(mnt.join(n)).unwrap();
    assert!(md("fifo").file_type().is_fifo());
    assert_eq!(md("fifo").mode() & 0o7777, 0o640);
    assert!(md("null2").file_type().is_char_device());
    assert_eq!((libc::major(md("null2").rdev()), libc::minor(md("null2").rdev())), (1, 3));
    assert!(md("blk").file_type().is_block_device());
    assert_eq!((libc::major(md("blk").rdev()), libc::minor(md("blk").rdev())), (7, 200));
    assert!(md("sock").file_type().is_socket());
    // A FIFO works as one: the kernel of the machine that opens it provides the pipe.
    let fifo = mnt.join("fifo");
    let writer = std::thread::spawn(move || std::fs::write(fifo, b"piped").unwrap());
    assert_eq!(std::fs::read(mnt.join("fifo")).unwrap(), b"piped");
    writer.join().unwrap();
    // posix_fallocate: the file grows to the range's end; zeroing a range is not offered.
    run(Command::new("fallocate").arg("-o").arg("4096").arg("-l").arg("1M").arg(&b));
    assert_eq!(std::fs::metadata(&b).unwrap().len(), 4096 + 1024 * 1024);
    assert_eq!(&std::fs::read(&b).unwrap()[..9], b"through b");
    let zero = Command::new("fallocate")
        .arg("-z")
        .arg("-o")
        .arg("0")
        .arg("-l")
        .arg("4096")
        .arg(&b)
        .output()
        .unwrap();
    assert!(
        !zero.status.success() && String::from_utf8_lossy(&zero.stderr).contains("not supported"),
        "{zero:?}"
    );
    assert_eq!(&std::fs::read(&b).unwrap()[..9], b"through b", "nothing zeroed");
    for n in ["fifo", "null2", "blk", "sock", "d/b"] {
        std::fs::remove_file(mnt.join(n)).unwrap();
    }
    // The last name gone, the file's objects go through the orphan table (no orphan left).
    let t = Instant::now();
    while c.statfs().unwrap().files != 0 {
        assert!(t.elapsed() < Duration::from_secs(20), "files left: {:?}", c.statfs());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// With `-o allow_other` other users reach the mount, each with their own permissions: what
/// they create is theirs, the mode bits and the sticky bit hold, only root gives files away.
#[test]
#[ignore = "needs root and /dev/fuse: mounts stripefs, runs commands as other users"]
fn permissions_apply_to_each_caller() {
    assert!(nix::unistd::geteuid().is_root(), "switching to another user needs root");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tc = TestCluster::start("tcp", 2);
    // Other users must be able to reach the mount point.
    std::fs::set_permissions(tc.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let m = mount_with(&tc, &["-o", "allow_other"]);
    let mnt = m.dir.clone();
    let as_user = |uid: u32, script: &str| {
        Command::new("setpriv")
            .args([&format!("--reuid={uid}"), "--regid=5000", "--clear-groups", "sh", "-c", script])
            .current_dir(&mnt)
            .output()
            .unwrap()
    };
    let ok = |uid, script: &str| {
        let out = as_user(uid, script);
        assert!(out.status.success(), "{uid}: {script}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let refused = |uid, script: &str, why: &str| {
        let out = as_user(uid, script);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(why), "{uid}: {script}: {err}");
    };
    // The root directory is root's, 0755.
    refused(4001, "touch f", "Permission denied");
    std::fs::create_dir(mnt.join("tmp")).unwrap();
    std::fs::set_permissions(mnt.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    ok(4001, "echo mine > tmp/f && chmod 600 tmp/f && mkdir tmp/d");
    let f = std::fs::metadata(mnt.join("tmp/f")).unwrap();
    assert_eq!((f.uid(), f.gid(), f.mode() & 0o7777), (4001, 5000, 0o600));
    refused(4002, "cat tmp/f", "Permission denied");
    refused(4002, "rm -f tmp/f", "Operation not permitted");
    refused(4002, "mv tmp/f tmp/g", "Operation not permitted");
    refused(4002, "chmod 666 tmp/f", "Operation not permitted");
    refused(4001, "chown 4002 tmp/f", "Operation not permitted");
    refused(4002, "touch tmp/d/x", "Permission denied");
    ok(4002, "ln -s f tmp/l && rm tmp/l");
    // The library sees the same rules: a client acting for another user.
    let other = tc.client().as_caller(stripefs::proto::Cred::new(4002, 5000, vec![]));
    assert_eq!(other.unlink("/tmp/f").unwrap_err().errno(), stripefs::Errno::EPERM);
    assert_eq!(
        other.open("/tmp/f", stripefs::capability::Rights::READ).unwrap_err().errno(),
        stripefs::Errno::EACCES
    );
    // A write by another user than root clears the set-user-ID bit, also when the writer sets
    // the file's time before closing it (as the servers have it, not as the kernel was told).
    ok(4001, "echo x > tmp/s && chmod 4755 tmp/s");
    let write_then_time = r#"open(my $f, "+<", "tmp/s") or die; syswrite($f, "y") or die;
        utime(981173106, 981173106, $f) or die "utime: $!"; close($f) or die"#;
    ok(4001, &format!("perl -e '{write_then_time}'"));
    let s = tc.client().stat("/tmp/s").unwrap().attr;
    assert_eq!((s.mode & 0o7777, s.mtime.secs), (0o755, 981_173_106));
    // Root may do all of it; the owner too.
    run(Command::new("chown").arg("4002").arg(mnt.join("tmp/f")));
    ok(4002, "cat tmp/f && rm tmp/f");
    ok(4001, "rmdir tmp/d");
    drop(m);
}

/// A file whose last name is removed while it is open keeps its data until the last close
/// (also when the name is replaced by a rename), then goes; its link count reads 0 meanwhile.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn an_unlinked_open_file_lives_until_its_last_close() {
    unlinked_open_file_lives_until_its_last_close(&[]);
}

/// The same through the kernel-cached mode, whose write-back may reach the file after its
/// name is gone.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_cached_unlinked_open_file_lives_until_its_last_close() {
    unlinked_open_file_lives_until_its_last_close(&["--cache"]);
}

fn unlinked_open_file_lives_until_its_last_close(args: &[&str]) {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::MetadataExt;
    let tc = TestCluster::start("tcp", 2);
    let m = mount_with(&tc, args);
    let c = tc.client();
    let path = m.dir.join("tmp.bin");
    let mut f = std::fs::OpenOptions::new().create_new(true).read(true).write(true).open(&path).unwrap();
    f.write_all(b"before").unwrap();
    let again = std::fs::File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(!path.exists());
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    f.write_all(b" and after").unwrap();
    let mut back = String::new();
    f.rewind().unwrap();
    f.read_to_string(&mut back).unwrap();
    assert_eq!(back, "before and after");
    drop(f);
    // Still open once: the data is still there.
    let mut back = String::new();
    (&again).read_to_string(&mut back).unwrap();
    assert_eq!(back, "before and after");
    drop(again);
    // Replaced by a rename while open: the same.
    let other = m.dir.join("other");
    std::fs::write(&other, b"new").unwrap();
    std::fs::write(&path, b"old").unwrap();
    let held = std::fs::File::open(&path).unwrap();
    std::fs::rename(&other, &path).unwrap();
    let mut back = String::new();
    (&held).read_to_string(&mut back).unwrap();
    assert_eq!((back.as_str(), std::fs::read(&path).unwrap()), ("old", b"new".to_vec()));
    drop(held);
    std::fs::remove_file(&path).unwrap();
    // After the last close nothing is left: no file, no hidden name.
    let t = Instant::now();
    while c.statfs().unwrap().files != 0 {
        assert!(t.elapsed() < Duration::from_secs(20), "files left: {:?}", c.readdir("/.stripefs-open"));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(c.readdir("/.stripefs-open").unwrap().is_empty());
    // The directory of hidden names removed behind the mount's back is made again.
    c.rmdir("/.stripefs-open").unwrap();
    std::fs::write(&path, b"again").unwrap();
    let held = std::fs::File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let mut back = String::new();
    (&held).read_to_string(&mut back).unwrap();
    assert_eq!(back, "again");
}

/// Unmounts `dir` when dropped if it is still mounted (a background mount has no child to
/// kill: its server exits on the unmount).
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if mounted(&self.0) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
}

/// A cluster of two io servers holding `/f.bin` (`len` bytes of pattern `seed`), and an empty
/// directory `mnt` to mount it on.
fn cluster_with_a_file(len: usize, seed: u64) -> (TestCluster, bytes::Bytes, std::path::PathBuf) {
    let tc = TestCluster::start("tcp", 2);
    let data = pattern(len, seed);
    let f = tc.client().create("/f.bin", stripefs::CreateOptions { mode: 0o644, layout: None }).unwrap();
    f.write_at(0, &data).unwrap();
    let mnt = tc.dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    (tc, data, mnt)
}

/// How `child` exited, if it does within `limit`.
fn exit_within(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if t.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What `seen` counts once it reaches `want`, or after `limit` at the latest.
fn count_within(limit: Duration, want: usize, seen: impl Fn() -> usize) -> usize {
    let t = Instant::now();
    let mut n = seen();
    while t.elapsed() < limit && n < want {
        std::thread::sleep(Duration::from_millis(20));
        n = seen();
    }
    n
}

/// Asynchronous direct reads (one `io_submit` of eight 1 MiB reads) reach the mount together,
/// as many at once as it has threads to serve them, not one after another: the io servers are
/// stopped meanwhile, so no read can finish before the others arrive. All return their bytes
/// once the io servers go on.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn asynchronous_reads_are_served_several_at_once() {
    use nix::sys::signal::{Signal, kill};
    use std::os::unix::fs::OpenOptionsExt;
    const N: usize = 8;
    const LEN: usize = 1 << 20;
    let tc = TestCluster::start("tcp", 2);
    let c = tc.client();
    let data = pattern(N * LEN, 11);
    let f = c.create("/f.bin", stripefs::CreateOptions { mode: 0o644, layout: None }).unwrap();
    f.write_at(0, &data).unwrap();
    drop(f);
    // fuser logs each request it dispatches at the debug level.
    let (m, log) = mount_logging(&tc, &[("RUST_LOG", "warn,fuser=debug")]);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.dir.join("f.bin"))
        .unwrap();
    let io: Vec<_> = (0..2)
        .map(|i| {
            nix::unistd::Pid::from_raw(tc.cluster.pid(stripefs::cluster::ServerId::Io(i)).unwrap() as i32)
        })
        .collect();
    let reads_seen = || std::fs::read_to_string(&log).unwrap().matches(" READ fh ").count();
    let before = reads_seen();
    for &p in &io {
        kill(p, Signal::SIGSTOP).unwrap();
    }
    let reader = std::thread::spawn(move || aio_read_blocks(&file, N, LEN));
    // Stopped for 2 s at most, well before the client gives a silent server up (and the first
    // read fails, letting a serial submitter send the next).
    let at_once = count_within(Duration::from_secs(2), 4, || reads_seen() - before);
    for &p in &io {
        kill(p, Signal::SIGCONT).unwrap();
    }
    let got = reader.join().unwrap();
    assert!(at_once >= 4, "{at_once} of {N} reads reached the mount while none could finish");
    same_bytes(&got, &data, "asynchronous reads");
    drop(m);
}

/// Look-ups of several names in one directory reach the mount together, not one after
/// another: the meta server is stopped meanwhile, so none can finish before the others arrive.
/// All find their files once it goes on.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn lookups_in_one_directory_are_served_several_at_once() {
    use nix::sys::signal::{Signal, kill};
    const N: usize = 4;
    let tc = TestCluster::start("tcp", 2);
    let c = tc.client();
    c.mkdir("/d", 0o755).unwrap();
    for i in 0..N {
        c.create(&format!("/d/f{i}"), stripefs::CreateOptions { mode: 0o644, layout: None }).unwrap();
    }
    // fuser logs each request it dispatches at the debug level.
    let (m, log) = mount_logging(&tc, &[("RUST_LOG", "warn,fuser=debug")]);
    // The directory itself is looked up now, so that the look-ups below only want their names.
    assert!(m.dir.join("d").is_dir());
    let meta = nix::unistd::Pid::from_raw(tc.cluster.pid(stripefs::cluster::ServerId::Meta).unwrap() as i32);
    let lookups_seen = || {
        let logged = std::fs::read_to_string(&log).unwrap();
        (0..N).filter(|i| logged.contains(&format!("LOOKUP name \"f{i}\""))).count()
    };
    kill(meta, Signal::SIGSTOP).unwrap();
    let stats: Vec<_> = (0..N)
        .map(|i| {
            let p = m.dir.join("d").join(format!("f{i}"));
            std::thread::spawn(move || std::fs::metadata(p).map(|md| md.len()))
        })
        .collect();
    // Stopped for 2 s at most, well before the client gives a silent server up.
    let at_once = count_within(Duration::from_secs(2), N, lookups_seen);
    kill(meta, Signal::SIGCONT).unwrap();
    for s in stats {
        assert_eq!(s.join().unwrap().unwrap(), 0, "each file is found");
    }
    assert_eq!(at_once, N, "look-ups that reached the mount while none could finish");
    drop(m);
}

/// Reads `n` blocks of `len` bytes from the start of `f` with one `io_submit` of asynchronous
/// reads, waits for every one, and returns the bytes in file order.
fn aio_read_blocks(f: &std::fs::File, n: usize, len: usize) -> Vec<u8> {
    use std::os::fd::AsRawFd;
    /// The kernel's `struct io_event`.
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct IoEvent {
        data: u64,
        obj: u64,
        res: i64,
        res2: i64,
    }
    let mut ctx: libc::c_ulong = 0;
    // SAFETY: io_setup writes the new context into `ctx`, which outlives the call.
    let r = unsafe { libc::syscall(libc::SYS_io_setup, n as libc::c_long, &mut ctx as *mut libc::c_ulong) };
    assert_eq!(r, 0, "io_setup: {}", std::io::Error::last_os_error());
    let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; len]).collect();
    let mut cbs: Vec<libc::iocb> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| {
            // SAFETY: all zeroes is an iocb with no request in it; the fields below make a read.
            let mut cb: libc::iocb = unsafe { std::mem::zeroed() };
            cb.aio_lio_opcode = 0; // IOCB_CMD_PREAD
            cb.aio_fildes = f.as_raw_fd() as u32;
            cb.aio_buf = b.as_mut_ptr() as u64;
            cb.aio_nbytes = len as u64;
            cb.aio_offset = (i * len) as i64;
            cb.aio_data = i as u64;
            cb
        })
        .collect();
    let mut ptrs: Vec<*mut libc::iocb> = cbs.iter_mut().map(|c| c as *mut libc::iocb).collect();
    // SAFETY: the iocbs and the buffers they name are neither moved nor touched until every
    // one's event has been collected below.
    let r = unsafe { libc::syscall(libc::SYS_io_submit, ctx, n as libc::c_long, ptrs.as_mut_ptr()) };
    assert_eq!(r, n as libc::c_long, "io_submit: {}", std::io::Error::last_os_error());
    let mut done = 0;
    while done < n {
        let mut events = vec![IoEvent::default(); n];
        // SAFETY: `events` has room for the `n` events asked for at most.
        let got = unsafe {
            libc::syscall(
                libc::SYS_io_getevents,
                ctx,
                1 as libc::c_long,
                n as libc::c_long,
                events.as_mut_ptr(),
                std::ptr::null_mut::<libc::timespec>(),
            )
        };
        assert!(got > 0, "io_getevents: {}", std::io::Error::last_os_error());
        for e in &events[..got as usize] {
            assert_eq!(e.res, len as i64, "read {} returned {}", e.data, e.res);
        }
        done += got as usize;
    }
    // SAFETY: no request of the context is outstanding.
    unsafe { libc::syscall(libc::SYS_io_destroy, ctx) };
    drop(cbs);
    bufs.concat()
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
    kill(pid, Signal::SIGTERM).unwrap();
    let status = exit_within(&mut m.child, Duration::from_secs(20)).expect("the second SIGTERM unmounts");
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

/// Asserts `got` is `want`, saying where they part instead of printing megabytes.
#[track_caller]
fn same_bytes(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
        panic!("{what}: {} bytes, want {}; first difference at {at}", got.len(), want.len());
    }
}

/// The whole of `path` as the library reads it from the io servers.
fn read_lib(c: &stripefs::Client, path: &str) -> Vec<u8> {
    let f = c.open(path, stripefs::capability::Rights::READ).unwrap();
    let mut v = vec![0; f.size().unwrap() as usize];
    let n = f.read_into(0, &mut v).unwrap();
    assert_eq!(n, v.len());
    v
}

/// Bytes the io servers have read from their files so far, all servers together.
fn bytes_read(c: &stripefs::Client) -> u64 {
    c.server_stats().into_iter().map(|s| s.expect("io server answers").bytes_read).sum()
}

/// Through the kernel-cached mode: what is written in small pieces reads back, through the
/// mount and from the io servers once closed; sizes follow overwrites, truncation (down and
/// up), `O_APPEND` writes, a write far past the end (the hole reads as zeros) and shared
/// `mmap` writes.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_cached_mount_keeps_data_and_sizes() {
    use std::io::Write;
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let tc = TestCluster::start("tcp", 3);
    let m = mount_with(&tc, &["--cache"]);
    let c = tc.client();
    let p = m.dir.join("f.bin");
    let len = |p: &Path| std::fs::metadata(p).unwrap().len();
    // Several stripes and a partial last one, in writes smaller than a page.
    let mut want = pattern(3 * 1024 * 1024 + 4321, 5).to_vec();
    {
        let mut f = std::fs::File::create(&p).unwrap();
        for chunk in want.chunks(1000) {
            f.write_all(chunk).unwrap();
        }
        assert_eq!(f.metadata().unwrap().len(), want.len() as u64, "the size while pages are dirty");
    }
    same_bytes(&read_lib(&c, "/f.bin"), &want, "closed: on the io servers");
    same_bytes(&std::fs::read(&p).unwrap(), &want, "through the mount");
    // An overwrite across a stripe boundary, not page-aligned.
    let patch = pattern(70_000, 6);
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().write_all_at(&patch, 60_001).unwrap();
    want[60_001..130_001].copy_from_slice(&patch);
    same_bytes(&std::fs::read(&p).unwrap(), &want, "through the mount");
    same_bytes(&read_lib(&c, "/f.bin"), &want, "from the io servers");
    // Truncate down (by path) and up again (through a descriptor): the end reads as zeros.
    run(Command::new("truncate").arg("-s").arg("100000").arg(&p));
    want.truncate(100_000);
    assert_eq!((len(&p), c.stat("/f.bin").unwrap().attr.size), (100_000, 100_000));
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
    f.write_all_at(b"dirty", 99_000).unwrap();
    want[99_000..99_005].copy_from_slice(b"dirty");
    f.set_len(250_000).unwrap();
    want.resize(250_000, 0);
    drop(f);
    same_bytes(&std::fs::read(&p).unwrap(), &want, "through the mount");
    same_bytes(&read_lib(&c, "/f.bin"), &want, "from the io servers");
    // O_APPEND: each write lands at the end, also after the size changed.
    for i in 0..3u64 {
        let mut f = std::fs::OpenOptions::new().append(true).custom_flags(libc::O_APPEND).open(&p).unwrap();
        let piece = pattern(5000 + i as usize, 10 + i);
        f.write_all(&piece).unwrap();
        want.extend_from_slice(&piece);
    }
    assert_eq!(len(&p), want.len() as u64);
    same_bytes(&read_lib(&c, "/f.bin"), &want, "from the io servers");
    // Sparse: one byte far past the end.
    let far = 40 * 1024 * 1024 + 7;
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().write_all_at(b"!", far).unwrap();
    want.resize(far as usize, 0);
    want.push(b'!');
    assert_eq!((len(&p), c.stat("/f.bin").unwrap().attr.size), (far + 1, far + 1));
    same_bytes(&std::fs::read(&p).unwrap(), &want, "through the mount");
    same_bytes(&read_lib(&c, "/f.bin"), &want, "from the io servers");
    // Shared mmap writes reach the io servers by msync.
    shared_mapping_reaches_the_io_servers(&m, &c);
}

/// The direct mount maps files shared, as databases do (SQLite's write-ahead log maps its
/// `-shm` file): writes through the mapping reach the io servers by `msync`, and the mapping
/// shows what was written through a descriptor before.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_direct_mount_maps_files_shared() {
    let tc = TestCluster::start("tcp", 3);
    let m = mount(&tc);
    shared_mapping_reaches_the_io_servers(&m, &tc.client());
}

/// Maps a new file on `m` shared: the mapping shows what was written through a descriptor
/// before, and its own writes reach the io servers (read back by `c`) by `msync`.
fn shared_mapping_reaches_the_io_servers(m: &Mount, c: &stripefs::Client) {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let q = m.dir.join("mapped.bin");
    let f = std::fs::OpenOptions::new().create_new(true).read(true).write(true).open(&q).unwrap();
    f.set_len(3 * 65536).unwrap();
    f.write_all_at(b"written", 70_000).unwrap();
    // SAFETY: a fresh shared mapping of a file of that length, unmapped before `f` is closed.
    unsafe {
        let at = libc::mmap(
            std::ptr::null_mut(),
            3 * 65536,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(at, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        let bytes = std::slice::from_raw_parts_mut(at as *mut u8, 3 * 65536);
        assert_eq!(&bytes[70_000..70_007], b"written");
        bytes[65530..65540].copy_from_slice(b"0123456789");
        assert_eq!(libc::msync(at, 3 * 65536, libc::MS_SYNC), 0);
        assert_eq!(libc::munmap(at, 3 * 65536), 0);
    }
    let back = read_lib(c, "/mapped.bin");
    assert_eq!((back.len(), &back[65530..65540]), (3 * 65536, &b"0123456789"[..]));
    assert_eq!(&back[70_000..70_007], b"written");
}

/// Two kernel-cached mounts of one cluster (two clients): what one wrote and closed, the
/// other's next open reads, also after the other read and cached the file before; a file
/// that did not change is read again from the page cache, not the io servers.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn cached_mounts_are_close_to_open_consistent() {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let tc = TestCluster::start("tcp", 3);
    let a = mount_at(&tc, "a", &["--cache"]);
    let b = mount_at(&tc, "b", &["--cache"]);
    let c = tc.client();
    let (pa, pb) = (a.dir.join("f"), b.dir.join("f"));
    // Written and closed through A: B's open reads it.
    let v1 = pattern(300_000, 1);
    std::fs::write(&pa, &v1).unwrap();
    same_bytes(&std::fs::read(&pb).unwrap(), &v1, "B reads what A closed");
    // A reads it again: unchanged, so from A's page cache.
    let before = bytes_read(&c);
    same_bytes(&std::fs::read(&pa).unwrap(), &v1, "A again");
    assert_eq!(bytes_read(&c), before, "an unchanged file is read from the page cache");
    // Rewritten in place through B (same size) and closed: A's next open reads the new bytes,
    // well within the attribute time-to-live.
    let v2 = pattern(300_000, 2);
    std::fs::OpenOptions::new().write(true).open(&pb).unwrap().write_all_at(&v2, 0).unwrap();
    same_bytes(&std::fs::read(&pa).unwrap(), &v2, "A reads B's rewrite");
    // Made longer through B: A's next open reads all of it, and A's size is the new one.
    let tail = pattern(70_000, 3);
    std::fs::OpenOptions::new().append(true).open(&pb).unwrap().write_all(&tail).unwrap();
    let v3 = [&v2[..], &tail[..]].concat();
    same_bytes(&std::fs::read(&pa).unwrap(), &v3, "A reads B's appended bytes");
    assert_eq!(std::fs::metadata(&pa).unwrap().len(), v3.len() as u64);
    // And back: written through A while B has read it, B's next open reads A's bytes.
    same_bytes(&std::fs::read(&pb).unwrap(), &v3, "B reads its own file");
    let v4 = pattern(20_000, 4);
    std::fs::OpenOptions::new().write(true).open(&pa).unwrap().write_all_at(&v4, 100_000).unwrap();
    let mut v5 = v3.clone();
    v5[100_000..120_000].copy_from_slice(&v4);
    same_bytes(&std::fs::read(&pb).unwrap(), &v5, "B reads A's rewrite");
    same_bytes(&read_lib(&c, "/f"), &v5, "from the io servers");
}

/// Through the kernel-cached mode, a file read in order for the first time comes from the io
/// servers in requests of a MiB, as through the direct mode, not in the kernel's default
/// read-ahead of 128 KiB (eight times the round trips); `--read-ahead 0` keeps the kernel's.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_cached_mount_reads_ahead_a_mib_at_a_time() {
    const LEN: usize = 8 << 20;
    let tc = TestCluster::start("tcp", 3);
    let c = tc.client();
    let data = pattern(LEN, 7);
    let f = c.create("/f.bin", stripefs::CreateOptions { mode: 0o644, layout: None }).unwrap();
    f.write_at(0, &data).unwrap();
    drop(f);
    // A read of a MiB asks each of the 3 io servers once at most; one more read finds the end,
    // and the window may start one MiB-request short of a boundary.
    let at_most = 3 * (LEN as u64 / (1 << 20) + 2);
    for (name, args, wide) in
        [("a", &["--cache"][..], true), ("b", &["--cache", "--read-ahead", "0"][..], false)]
    {
        let m = mount_at(&tc, name, args);
        let before = io_requests(&c).0;
        let cat = run(Command::new("cat").arg(m.dir.join("f.bin")));
        same_bytes(&cat.stdout, &data, "read through the cached mount");
        let reads = io_requests(&c).0 - before;
        if wide {
            assert!(reads <= at_most, "{reads} io server reads for 8 MiB read ahead a MiB at a time");
        } else {
            assert!(reads >= 64, "{reads} io server reads for 8 MiB in the kernel's 128 KiB windows");
        }
    }
}

/// Through the kernel-cached mode, `O_SYNC` and `O_DSYNC` writes, `RWF_DSYNC` writes, `fsync`
/// and `fdatasync` reach the io servers as syncs before they return, as in the direct mode
/// (the kernel writes the dirty pages back, then asks the mount to sync); what `fsync` made
/// durable is on the io servers.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn cached_synchronous_writes_and_fsync_reach_the_io_servers() {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let tc = TestCluster::start("tcp", 3);
    let m = mount_with(&tc, &["--cache"]);
    let c = tc.client();
    let open = |name: &str, flags: i32| {
        std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .custom_flags(flags)
            .open(m.dir.join(name))
            .unwrap()
    };
    let f = open("osync.bin", libc::O_SYNC);
    each_write_is_synced(&c, "/osync.bin", &f, 24, 4096, "cached O_SYNC");
    drop(f);
    let f = open("osync.bin", libc::O_DSYNC);
    each_write_is_synced(&c, "/osync.bin", &f, 8, 65536 + 4096, "cached O_DSYNC reopened");
    drop(f);
    // RWF_DSYNC on a descriptor opened without sync flags.
    let f = open("plain.bin", 0);
    f.write_all_at(&pattern(4096, 1), 0).unwrap();
    let data = pattern(4096, 99);
    let layout = rwf_dsync_write_is_synced(&c, "/plain.bin", &f, &data);
    same_bytes(&read_lib(&c, "/plain.bin")[..4096], &data, "RWF_DSYNC data on the io servers");
    // fsync and fdatasync: the dirty pages go to the io servers and every one of the file's
    // servers syncs, before the call returns (the descriptor stays open: no close flushes).
    let data = |how: &str| pattern(400_000, if how == "fsync" { 20 } else { 21 });
    let dirty = |how: &str| f.write_all_at(&data(how), 0).unwrap();
    let on_servers = |how: &str| {
        same_bytes(&read_lib(&c, "/plain.bin"), &data(how), &format!("{how}: data on the io servers"))
    };
    fsync_and_fdatasync_sync_every_server(&c, &f, &layout, dirty, on_servers);
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

/// Through the kernel-cached mode, for users other than root: a writer who does not own a file
/// may set its times to now and truncate it (the kernel sends explicit times for both), but
/// not set a time of its choosing; a file its owner may only write takes a write into part of
/// a page (the kernel reads the rest of the page first).
#[test]
#[ignore = "needs root and /dev/fuse: mounts stripefs, runs commands as other users"]
fn a_cached_mount_serves_writers_who_do_not_own_or_may_not_read() {
    assert!(nix::unistd::geteuid().is_root(), "switching to another user needs root");
    use std::os::unix::fs::PermissionsExt;
    let tc = TestCluster::start("tcp", 2);
    std::fs::set_permissions(tc.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let m = mount_with(&tc, &["--cache", "-o", "allow_other"]);
    let mnt = m.dir.clone();
    let as_user = |script: &str| {
        Command::new("setpriv")
            .args(["--reuid=4001", "--regid=5000", "--clear-groups", "sh", "-c", script])
            .current_dir(&mnt)
            .output()
            .unwrap()
    };
    let mode = |name: &str, m: u32| {
        std::fs::set_permissions(mnt.join(name), std::fs::Permissions::from_mode(m)).unwrap()
    };
    mode(".", 0o1777);
    std::fs::write(mnt.join("shared"), b"root\n").unwrap();
    mode("shared", 0o666);
    let out = as_user("echo other >> shared && touch shared && truncate -s 2 shared");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = as_user("touch -d 2001-01-01 shared");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("Operation not permitted"), "{err}");
    assert_eq!(std::fs::read(mnt.join("shared")).unwrap(), b"ro");
    // Written by another client, so the mount has none of its pages.
    let c = tc.client();
    let f = c.create("/wo", stripefs::CreateOptions { mode: 0o200, layout: None }).unwrap();
    f.write_at(0, &bytes::Bytes::from_static(b"root\n")).unwrap();
    let owner = stripefs::proto::SetAttr { uid: Some(4001), ..Default::default() };
    c.setattr(f.handle(), owner).unwrap();
    let out = as_user("printf ab | dd of=wo bs=1 seek=1 conv=notrunc");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(mnt.join("wo")).unwrap(), b"rabt\n");
    assert_eq!(c.stat("/wo").unwrap().attr.size, 5);
}
