//! Servers that die, restart or fail a disk, and requests that fail part-way.

use super::*;

pub fn io_server_killed_mid_write_is_an_error(scheme: &str) {
    let mut tc = TestCluster::start(scheme, 4);
    let c = tc.client();
    let f = c.create("/victim", CreateOptions { mode: 0o644, layout: spec(4, 65536) }).unwrap();
    let data = pattern(8 << 20, 5);
    let writer = std::thread::spawn(move || {
        for i in 0..10_000u64 {
            if let Err(e) = f.write_at((i % 8) * data.len() as u64, &data) {
                return Some(e);
            }
        }
        None
    });
    std::thread::sleep(Duration::from_millis(300));
    tc.cluster.kill_io(2);
    let err = writer.join().unwrap().expect("the write fails once a server is gone");
    let code = err.errno();
    assert!(
        [Errno::ENOTCONN, Errno::EIO, Errno::ETIMEDOUT].contains(&code),
        "a clear error, got {code:?}: {err}"
    );
    // The namespace still answers, and files on the surviving servers still work.
    let g = c
        .create(
            "/survivor",
            CreateOptions {
                mode: 0o644,
                layout: Some(LayoutSpec { base: Some(0), pcount: Some(2), ssize: None }),
            },
        )
        .unwrap();
    g.write_all_at(0, b"still here").unwrap();
    assert_eq!(&read_all(&g, 0, 10).0, b"still here");
    // A file on the dead server fails cleanly too.
    let v = c.open("/victim", Rights::READ).unwrap();
    assert!(v.read_at(0, BytesMut::zeroed(1 << 20)).is_err());
}

pub fn restart_serves_synced_files_and_namespace(scheme: &str) {
    let mut tc = TestCluster::start(scheme, 3);
    let c = tc.client();
    c.mkdir("/x", 0o755).unwrap();
    c.mkdir("/x/y", 0o700).unwrap();
    let mut files = Vec::new();
    for (i, path) in ["/top", "/x/a", "/x/y/b", "/x/y/c"].iter().enumerate() {
        let f =
            c.create(path, CreateOptions { mode: 0o600, layout: spec(1 + (i as u32 % 3), 8192) }).unwrap();
        let d = pattern(30_000 * (i + 1), 10 + i as u64);
        f.write_at(0, &d).unwrap();
        f.sync().unwrap();
        files.push((path.to_string(), d, f.handle()));
    }
    c.setstripe("/x", spec(2, 16384)).unwrap();
    drop(c);
    tc.cluster.kill_meta();
    for i in 0..3 {
        tc.cluster.kill_io(i);
    }
    tc.cluster.restart_meta().unwrap();
    for i in 0..3 {
        tc.cluster.restart_io(i).unwrap();
    }
    let c = tc.client();
    let names =
        |p: &str| -> Vec<String> { c.readdir(p).unwrap().into_iter().map(|e| e.name.to_string()).collect() };
    assert_eq!(names("/"), ["top", "x"]);
    assert_eq!(names("/x"), ["a", "y"]);
    assert_eq!(names("/x/y"), ["b", "c"]);
    assert_eq!(c.stat("/x/y").unwrap().attr.mode, 0o700);
    assert_eq!(c.getstripe("/x").unwrap().1, spec(2, 16384));
    let mut max_handle = Handle(0);
    for (path, d, h) in &files {
        let f = c.open(path, Rights::READ).unwrap();
        assert_eq!(f.handle(), *h);
        assert_eq!(f.size().unwrap(), d.len() as u64, "{path}");
        assert_eq!(read_all(&f, 0, d.len()).0, &d[..], "{path}");
        max_handle = max_handle.max(*h);
    }
    let n = c.create("/new", CreateOptions::default()).unwrap();
    assert!(n.handle() > max_handle, "handles are never reused");
}

pub fn disk_error_does_not_desynchronise_the_connection(scheme: &str) {
    let tc = TestCluster::start_with(scheme, 1, |o| {
        o.io_args = vec!["--max-open".into(), "0".into(), "--map-disk-writes".into()]
    });
    let c = tc.client();
    let bad = c.create("/full", CreateOptions::default()).unwrap();
    let good = c.create("/fine", CreateOptions::default()).unwrap();
    // Swap the object for /dev/full: every write to it fails with ENOSPC.
    let path = stripefs::store::ObjectStore::object_path(&tc.cluster.config().io_data_dir(0), bad.handle());
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink("/dev/full", &path).unwrap();
    let data = pattern(1 << 20, 6);
    let s0 = io_stats(&c);
    assert_eq!(code(bad.write_at(0, &data)), Errno::ENOSPC);
    // A character device has no fallocate: the mapping server copies instead, and the copy's
    // pwrite meets the full "disk".
    let s1 = io_stats(&c);
    assert_eq!(s1.fallbacks.no_fallocate - s0.fallbacks.no_fallocate, 1);
    assert_eq!((s1.copied.writes - s0.copied.writes, s1.copied.bytes - s0.copied.bytes), (1, 0));
    assert_eq!(s1.mapped, s0.mapped);
    assert_eq!(s1.errors - s0.errors, 1);
    // The same connection carries the next request and its data correctly.
    good.write_at(0, &data).unwrap();
    assert_eq!(read_all(&good, 0, data.len()).0, &data[..]);
    assert_eq!(code(bad.write_at(4096, &data.slice(..100_000))), Errno::ENOSPC);
    good.write_at(7, &data.slice(..100)).unwrap();
    assert_eq!(&read_all(&good, 7, 100).0, &data[..100]);
    let s2 = io_stats(&c);
    assert_eq!(s2.fallbacks.no_fallocate - s1.fallbacks.no_fallocate, 1, "only the /dev/full write");
    assert_eq!((s2.mapped.writes - s1.mapped.writes, s2.mapped.reads - s1.mapped.reads), (2, 2));
}

pub fn failed_fan_outs_are_cleaned_up(scheme: &str) {
    let mut tc = TestCluster::start_with(scheme, 3, no_objects_ahead);
    let c = tc.client();
    let cfg = tc.cluster.config().clone();
    let on = |i: u32, h| stripefs::store::ObjectStore::object_path(&cfg.io_data_dir(i), h).exists();
    let f = c.create("/doomed", CreateOptions { mode: 0o644, layout: spec(3, 4096) }).unwrap();
    f.write_at(0, &pattern(50_000, 7)).unwrap();
    let h = f.handle();
    assert!((0..3).all(|i| on(i, h)));
    tc.cluster.kill_io(1);
    // Unlink succeeds in the namespace; the objects go after its answer, but the one on the
    // dead server is left as an orphan…
    c.unlink("/doomed").unwrap();
    assert_eq!(code(c.stat("/doomed")), Errno::ENOENT);
    let t = std::time::Instant::now();
    while on(0, h) || on(2, h) {
        assert!(t.elapsed() < Duration::from_secs(30), "the live servers' objects never removed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(on(1, h), "the dead server's object is still there");
    // …and a create that cannot reach every server fails and leaves nothing behind.
    let e = c.create("/half", CreateOptions { mode: 0o644, layout: spec(3, 4096) }).unwrap_err();
    assert!([Errno::ENOTCONN, Errno::EIO, Errno::ETIMEDOUT].contains(&e.errno()), "{e}");
    assert_eq!(code(c.stat("/half")), Errno::ENOENT);
    // Once the server is back, the meta server's janitor removes the orphan.
    tc.cluster.restart_io(1).unwrap();
    let t = std::time::Instant::now();
    while on(1, h) {
        assert!(t.elapsed() < Duration::from_secs(30), "orphan never removed");
        std::thread::sleep(Duration::from_millis(100));
    }
    let g = c.create("/half", CreateOptions { mode: 0o644, layout: spec(3, 4096) }).unwrap();
    g.write_all_at(0, b"whole again").unwrap();
    assert_eq!(&read_all(&g, 0, 11).0, b"whole again");
    let objects = |i: u32| walk(&cfg.io_data_dir(i));
    assert_eq!((0..3).map(objects).sum::<usize>(), 3, "exactly the new file's three objects remain");
}

/// With `cache_foreign`, a read that fails (an io server gone) frees the caller's buffer, so
/// the registrations its segments left in the cache on the live servers' behalf must go first:
/// a cached registration of freed memory would steer a later transfer into stale pages.
#[test]
fn a_failed_read_leaves_no_cached_registration_of_its_buffer() {
    let mut tc = TestCluster::start("softib", 3);
    let opts = stripefs::ClientOptions {
        timeout: Duration::from_secs(10),
        ib: Some(stripefs::client::default_ib_config().cache_foreign(true)),
        ..Default::default()
    };
    let c = stripefs::Client::connect_with(tc.cluster.config(), opts).unwrap();
    let f = c.create("/cached", CreateOptions { mode: 0o644, layout: spec(3, 65536) }).unwrap();
    let data = pattern(3 << 20, 12);
    f.write_at(0, &data).unwrap();
    let entries = || c.endpoint().info().regcache.expect("softib has a registration cache").entries;
    // A read that succeeds keeps its registrations cached: what the option is for.
    let base = entries();
    let (buf, n) = f.read_at(0, BytesMut::zeroed(data.len())).unwrap();
    assert_eq!((n, &buf[..]), (data.len(), &data[..]));
    assert!(entries() > base, "a successful read's registrations stay cached");
    c.endpoint().invalidate_registrations(&buf);
    drop(buf);
    assert_eq!(entries(), base);
    tc.cluster.kill_io(1);
    assert!(f.read_at(0, BytesMut::zeroed(data.len())).is_err(), "a server is gone");
    assert_eq!(entries(), base, "the failed read's buffer left registrations behind");
}
