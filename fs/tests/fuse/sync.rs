//! What reaches the io servers and the meta server's disk, and when: synchronous writes,
//! `fsync`, and files' times.

use super::*;

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
