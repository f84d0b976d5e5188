//! The io servers' data paths: mapped and copying, their counters, congestion control, disk space.

use super::*;

/// A cluster of `io` servers that copy (`--copy-io`) when `copy`, else map their objects,
/// writes included wherever the test's data directory is.
fn cluster_copying(scheme: &str, io: u32, copy: bool) -> TestCluster {
    TestCluster::start_with(scheme, io, |o| {
        o.io_args = vec![if copy { "--copy-io" } else { "--map-disk-writes" }.into()];
    })
}

/// io servers that stage and pread/pwrite (`--copy-io`) and ones that map their objects (the
/// default) leave the same bytes in the objects, holes included.
pub fn copying_and_mapped_io_servers_agree(scheme: &str) {
    let mut objects = Vec::new();
    for copy in [true, false] {
        let tc = cluster_copying(scheme, 2, copy);
        let c = tc.client();
        let f = c.create("/same", CreateOptions { mode: 0o644, layout: spec(2, 65536) }).unwrap();
        let data = pattern(3 << 20, 11);
        f.write_at(0, &data).unwrap();
        // A hole, then a strided overwrite, then a write past the end.
        f.write_at(5 << 20, &data.slice(..70_000)).unwrap();
        f.set_view(4096, 1000, 3000).unwrap();
        f.write_view(0, &data.slice(..100_000)).unwrap();
        f.clear_view();
        let size = f.size().unwrap();
        assert_eq!(size, (5 << 20) + 70_000);
        let (back, n) = read_all(&f, 0, size as usize);
        assert_eq!(n as u64, size);
        assert!(back[3 << 20..5 << 20].iter().all(|&b| b == 0), "the hole reads as zeros");
        let object =
            |i| stripefs::store::ObjectStore::object_path(&tc.cluster.config().io_data_dir(i), f.handle());
        let on_disk: Vec<Vec<u8>> = (0..2).map(|i| std::fs::read(object(i)).unwrap()).collect();
        objects.push((back, on_disk));
    }
    assert!(objects[0] == objects[1], "both data paths store and return the same bytes");
}

/// Every read and write request is counted by the data path that moved it: the mapped path on
/// a default io server (never the copying one), the copying path on a `--copy-io` server
/// (never the mapped one), and no fallbacks for contiguous, in-order, strided or list I/O.
pub fn io_requests_count_the_data_path_they_took(scheme: &str) {
    for copy in [false, true] {
        let tc = cluster_copying(scheme, 1, copy);
        let c = tc.client();
        let f = c.create("/paths", CreateOptions { mode: 0o644, layout: spec(1, 65536) }).unwrap();
        let data = pattern(1 << 20, 21);
        let s0 = io_stats(&c);
        assert_eq!((s0.mapped, s0.copied, s0.fallbacks), Default::default());
        // One request each: a contiguous write, an in-order list write, a strided write.
        f.write_at(0, &data).unwrap();
        let file = [Extent::new(2 << 20, 5000), Extent::new(3 << 20, 7000)];
        f.write_list(&[Extent::new(0, 12_000)], &file, &data).unwrap();
        f.set_view(4 << 20, 1000, 3000).unwrap();
        f.write_view(0, &data.slice(..100_000)).unwrap();
        f.clear_view();
        let s1 = io_stats(&c);
        let written = (1 << 20) + 12_000 + 100_000;
        assert_eq!((s1.writes, s1.bytes_written), (3, written));
        // Reads: the whole file (holes and all), over tcp in requests of at most the client's
        // read limit, and one list.
        let size = f.size().unwrap();
        let whole =
            if scheme == "tcp" { size.div_ceil(stripefs::client::DEFAULT_READ_REQUEST_BYTES) } else { 1 };
        let (back, n) = read_all(&f, 0, size as usize);
        assert_eq!((n as u64, &back[..data.len()]), (size, &data[..]));
        let got = f.read_list(&[Extent::new(0, 12_000)], &file, BytesMut::zeroed(12_000)).unwrap();
        assert_eq!(&got[..], &data[..12_000]);
        let s2 = io_stats(&c);
        assert_eq!((s2.reads, s2.bytes_read), (whole + 1, size + 12_000));
        let (took, idle) = if copy { (s2.copied, s2.mapped) } else { (s2.mapped, s2.copied) };
        let path = if copy { "copying" } else { "mapped" };
        assert_eq!((took.writes, took.reads), (3, whole + 1), "every request on the {path} path");
        assert_eq!(took.bytes, written + size + 12_000, "{path} path bytes");
        assert_eq!(idle, Default::default(), "nothing on the other path");
        assert_eq!(s2.fallbacks, Default::default(), "no fallbacks");
    }
}

/// A mapping io server copies what it cannot map, and counts why: a list write whose pieces
/// run backwards, and an object past the 1 TiB mapping limit (both ways). Each fallback is one
/// request's: the next plain request is mapped again.
pub fn mapping_io_servers_count_their_fallbacks(scheme: &str) {
    let tc = TestCluster::start_with(scheme, 1, |o| o.io_args = vec!["--map-disk-writes".into()]);
    let c = tc.client();
    let f = c.create("/backwards", CreateOptions { mode: 0o644, layout: spec(1, 65536) }).unwrap();
    let data = pattern(200_000, 22);
    // Out of order: the stream fills 300 KiB.. first, then 100 KiB...
    let file = [Extent::new(300 << 10, 100_000), Extent::new(100 << 10, 100_000)];
    let mem = [Extent::new(0, 200_000)];
    let s0 = io_stats(&c);
    f.write_list(&mem, &file, &data).unwrap();
    let s1 = io_stats(&c);
    assert_eq!(s1.fallbacks.unordered - s0.fallbacks.unordered, 1);
    assert_eq!((s1.copied.writes - s0.copied.writes, s1.copied.bytes - s0.copied.bytes), (1, 200_000));
    assert_eq!(s1.mapped.writes, s0.mapped.writes);
    // Reads need no order: the same list comes back through the mapping.
    let back = f.read_list(&mem, &file, BytesMut::zeroed(200_000)).unwrap();
    assert_eq!(&back[..], &data[..]);
    assert_eq!(read_all(&f, 300 << 10, 100_000).0, &data[..100_000]);
    let s2 = io_stats(&c);
    assert_eq!(s2.mapped.reads - s1.mapped.reads, 2);
    assert_eq!((s2.copied, s2.fallbacks), (s1.copied, s1.fallbacks));
    // Past the mapping limit (the whole stripe on one server: local offset = file offset).
    let far = c.create("/far", CreateOptions { mode: 0o644, layout: spec(1, 65536) }).unwrap();
    let at = 2 * stripefs::store::MAX_MAPPED;
    far.write_at(at, &data.slice(..5000)).unwrap();
    assert_eq!(read_all(&far, at, 5000).0, &data[..5000]);
    let s3 = io_stats(&c);
    assert_eq!(s3.fallbacks.beyond_map - s2.fallbacks.beyond_map, 2, "the write and the read");
    assert_eq!((s3.copied.writes - s2.copied.writes, s3.copied.reads - s2.copied.reads), (1, 1));
    assert_eq!(s3.mapped, s2.mapped);
    // An ordinary request after them takes the mapped path again.
    f.write_at(0, &data.slice(..4096)).unwrap();
    let s4 = io_stats(&c);
    assert_eq!(s4.mapped.writes - s3.mapped.writes, 1);
    assert_eq!((s4.copied, s4.fallbacks), (s3.copied, s3.fallbacks));
}

/// io servers send reads' data, so their connections take the same congestion control as the
/// clients': reno by default, `STRIPEFS_TCP_CONGESTION` when set. Checked on the sockets
/// themselves with `ss`, the server side of each connection to the io server's port.
#[test]
fn io_servers_use_the_configured_congestion_control() {
    let available = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control");
    if std::process::Command::new("ss").arg("-V").output().is_err()
        || !available.is_ok_and(|a| a.split_whitespace().any(|c| c == "cubic"))
    {
        eprintln!("skipped: needs ss and the cubic congestion control");
        return;
    }
    let server_side = |tc: &TestCluster| -> String {
        let c = tc.client();
        let f = c.create("/f", CreateOptions::default()).unwrap();
        f.write_at(0, &pattern(1 << 20, 1)).unwrap();
        let port = tc.cluster.config().io_servers[0].to_string().rsplit(':').next().unwrap().to_string();
        let out = std::process::Command::new("ss")
            .args(["-tinH", "state", "established", &format!("( sport = :{port} )")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let cubic = TestCluster::start_with("tcp", 1, |o| {
        o.io_env.push((stripefs::net::TCP_CONGESTION_ENV.into(), "cubic".into()))
    });
    let ss = server_side(&cubic);
    assert!(ss.contains("cubic") && !ss.contains("bbr") && !ss.contains("reno"), "{ss}");
    if std::env::var_os(stripefs::net::TCP_CONGESTION_ENV).is_none() {
        let ss = server_side(&TestCluster::start("tcp", 1));
        assert!(ss.contains(" reno ") || ss.trim_start().starts_with("reno"), "{ss}");
        assert!(!ss.contains("bbr") && !ss.contains("cubic"), "{ss}");
    }
}

/// `disk_space` adds up the file systems the io servers keep their objects on, each once: here
/// all four share the test's, so the sum is its size, not four times it.
#[test]
fn disk_space_adds_up_the_io_servers_file_systems() {
    let tc = TestCluster::start("tcp", 4);
    let c = tc.client();
    let fs = nix::sys::statvfs::statvfs(tc.dir.path()).unwrap();
    let size = fs.blocks() * fs.fragment_size();
    for s in c.server_stats() {
        let d = s.unwrap().disk;
        assert_eq!(d.total, size, "each server reports its data directory's file system");
        assert!(0 < d.avail && d.avail <= d.free && d.free <= d.total, "{d:?}");
    }
    let sum = c.disk_space().unwrap().space;
    assert_eq!(sum.total, size, "one file system under four servers");
    assert!(sum.avail <= sum.free && sum.free <= sum.total, "{sum:?}");
}

/// A default io server maps writes into memory (tmpfs) and copies them to a disk, and writes
/// behind on a disk only: once 8 MiB of an object landed it has started their writeback, and
/// with `--write-behind 0` it never does. Reads are mapped everywhere.
#[test]
fn writes_are_mapped_into_memory_copied_to_disks_and_written_behind() {
    let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let memory = tempfile::tempdir_in("/dev/shm").unwrap();
    for (dir, args) in [(&disk, vec![]), (&disk, vec!["--write-behind", "0"]), (&memory, vec![])] {
        let in_memory = stripefs::store::FileSystem::of(dir.path()).unwrap().in_memory();
        let mut o = common::options("tcp", 1, &dir.path().join(format!("c{}", args.len())));
        o.io_args = args.iter().map(|a| a.to_string()).collect();
        let tc = stripefs::cluster::LocalCluster::start(o).expect("cluster starts");
        let opts = stripefs::ClientOptions { timeout: Duration::from_secs(10), ..Default::default() };
        let c = stripefs::Client::connect_with(tc.config(), opts).unwrap();
        let f = c.create("/f", CreateOptions { mode: 0o644, layout: spec(1, 1 << 20) }).unwrap();
        let data = pattern(24 << 20, 31);
        for (i, chunk) in data.chunks(4 << 20).enumerate() {
            f.write_at((i as u64) << 22, &data.slice_ref(chunk)).unwrap();
        }
        assert_eq!(read_all(&f, 0, data.len()).0, &data[..]);
        let s = io_stats(&c);
        let what = format!("{} with {args:?}: {s:?}", if in_memory { "memory" } else { "disk" });
        let (mapped, copied) = if in_memory { (6, 0) } else { (0, 6) };
        assert_eq!((s.mapped.writes, s.copied.writes), (mapped, copied), "{what}");
        assert_eq!(s.copied.reads, 0, "{what}");
        if in_memory || !args.is_empty() {
            assert_eq!(s.written_behind, 0, "{what}");
        } else {
            // Whole 8 MiB batches of the 24 MiB; the last may still be gathering.
            assert!(s.written_behind >= 16 << 20 && s.written_behind.is_multiple_of(8 << 20), "{what}");
        }
    }
}
